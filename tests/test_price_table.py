"""A price table that cannot be read (issue 39 item 11): ``BATCHING_GPU_PRICES`` naming a missing file, a folder,
or a table with NaN, a negative or text price, bytes that are not UTF-8, a NUL byte or a 128 KB field crashed every
command, even ``run --help``, and the Capacity and Find a deployment pages. Now a command that needs a price says
what is wrong in one line naming the file and row (before simulating), the others keep working, and the pages say
there is no default price and go on."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from batching.cli.main import main
from batching.studies import pricing

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import assert_clean, run_page  # noqa: E402

HEADER = b"gpu,usd_per_gpu_hour,as_of,source\n"
SMALL = ["--model", "llama-3.1-8b", "--requests", "40", "--rate", "3"]

# file name -> (its bytes, or None: no file; or "folder"), what the one line says after the file's name
BROKEN = {
    "missing.csv": (None, "no such file"),
    "folder.csv": ("folder", "a folder, not a CSV file"),
    "nan.csv": (HEADER + b"h100-sxm,nan,2026-03-10,x\n", "row 2: usd_per_gpu_hour='nan' is not a finite number; "
                                                         "allowed > 0 to 1e+06"),
    "negative.csv": (HEADER + b"a100-80gb,1.39,2026-03-10,x\nh100-sxm,-2.69,2026-03-10,x\n",
                     "row 3: usd_per_gpu_hour='-2.69' is out of range; allowed > 0 to 1e+06"),
    "text.csv": (HEADER + b"h100-sxm,cheap,2026-03-10,x\n", "row 2: usd_per_gpu_hour='cheap' is not a number"),
    "latin1.csv": (HEADER + "h100-sxm,2.69,2026-03-10,Soci\u00e9t\u00e9\n".encode("latin-1"),
                   "row 2: not UTF-8 text (byte 0xe9); save it as UTF-8"),
    "nul.csv": (HEADER + b"h100-sxm,2.69,2026\x00-03-10,x\n", "row 2: a NUL byte"),
    "wide.csv": (HEADER + b"h100-sxm,2.69,2026-03-10," + b"x" * (128 * 1024 + 1) + b"\n",
                 "row 2: not CSV (field larger than field limit (131072))"),
}


def _table(tmp_path: Path, name: str) -> Path:
    data = BROKEN[name][0]
    path = tmp_path / name
    if data == "folder":
        path.mkdir()
    elif data is not None:
        path.write_bytes(data)
    return path


@pytest.fixture(params=list(BROKEN))
def broken(request, tmp_path, monkeypatch) -> tuple[Path, str]:
    path = _table(tmp_path, request.param)
    monkeypatch.setenv(pricing.PRICES_ENV, str(path))
    return path, BROKEN[request.param][1]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_help_and_commands_that_need_no_price_keep_working(broken, capsys):
    for command in ("run", "search", "capacity", "report"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0, command
    assert "search" in capsys.readouterr().out
    assert main(["run", *SMALL]) == 0
    assert main(["capacity", *SMALL, "--slo-ttft-ms", "1000", "--gpu-hour-usd", "2.5"]) == 0
    assert "given (--gpu-hour-usd)" in capsys.readouterr().out


@pytest.mark.parametrize("command", [
    ["capacity", *SMALL, "--slo-ttft-ms", "1000"],
    ["search", *SMALL, "--gpus", "h100-sxm", "--tp", "8", "--policies", "chunked", "--serving", "agg",
     "--slo-ttft-ms", "1000", "--target-rate", "10"],
    ["report", *SMALL, "--page", "capacity", "--no-png", "--out", "OUT"],
], ids=["capacity", "search", "report"])
def test_a_command_that_needs_the_price_says_what_is_wrong_before_simulating(broken, command, capsys, tmp_path,
                                                                            monkeypatch):
    from batching.sim import simulate as sim

    def refuse(*a, **k):
        raise AssertionError("simulated before reading the price table")

    monkeypatch.setattr(sim, "simulate", refuse)
    monkeypatch.setattr("batching.studies.capacity.simulate", refuse)
    path, message = broken
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert f"error: BATCHING_GPU_PRICES {str(path)!r}: {message}" in err, err


# ---------------------------------------------------------------- the pages


PAGE_CASES = {"missing": "missing.csv", "nan": "nan.csv", "no h100 row": None}


def _page_env(tmp_path, monkeypatch, case: str) -> None:
    if PAGE_CASES[case] is None:  # a readable table without the sidebar's GPU
        path = tmp_path / "h200_only.csv"
        path.write_bytes(HEADER + b"h200-sxm,3.59,2026-03-10,x\n")
    else:
        path = _table(tmp_path, PAGE_CASES[case])
    monkeypatch.setenv(pricing.PRICES_ENV, str(path))


def _warnings(at) -> list[str]:
    return [w.value for w in at.warning]


@pytest.mark.parametrize("case", list(PAGE_CASES))
def test_the_capacity_page_says_no_default_price_and_goes_on(case, tmp_path, monkeypatch):
    _page_env(tmp_path, monkeypatch, case)
    at = run_page("pages/capacity.py", n="200", policies="chunked", target="20")
    assert_clean(at)
    assert any("No default price" in w for w in _warnings(at)), _warnings(at)
    shipped = pricing._table(str(pricing.PRICES_FILE))["h100-sxm"].usd_per_gpu_hour
    plan = at.session_state["capacity_last"]
    assert plan.gpu_hour_usd == shipped and plan.results["chunked"].usd_per_million_output_tokens > 0


@pytest.mark.parametrize("case", list(PAGE_CASES))
def test_find_a_deployment_says_no_default_price_and_goes_on(case, tmp_path, monkeypatch):
    _page_env(tmp_path, monkeypatch, case)
    at = run_page("pages/find_a_deployment.py", n="200", s_gpus="h100-sxm", s_precs="bf16", s_tps="8",
                  s_policies="chunked", s_serving="agg", target="20")
    assert_clean(at)
    assert any("No default price" in w for w in _warnings(at)), _warnings(at)
    doc = at.session_state["search_last"][1]
    assert doc["configs"] and doc["gpu_hour_usd"] == {"h100-sxm": 2.69}
