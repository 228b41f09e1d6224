"""Files that crash, overwrite or open (issue 39 items 10, 11, 12): an output path that is an input is refused
before anything is written; a broken price table (BATCHING_GPU_PRICES) is one line naming the file and row, and
commands that need no price keep working; hostile bench and profile files are one-line errors, never tracebacks,
and fail before any simulation."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from batching.cli.main import main
from batching.studies import bench_files as bf

ROOT = Path(__file__).resolve().parents[1]

# a genai-perf export (tests/test_bench_files.py's GENAI_VLLM060_70B_8RPS: SGLang's benchmark/benchmark_vllm_060
# README, vLLM v0.6.0, Llama 3.1 70B on 4 x H100 at 8 req/s) and a vLLM result (vLLM pull request #18566)
GENAI = {
    "time_to_first_token": {"unit": "ms", "p50": 207.12},
    "inter_token_latency": {"unit": "ms", "p50": 29.15},
    "request_latency": {"unit": "ms", "p50": 3752.38},
    "input_sequence_length": {"unit": "tokens", "avg": 229.711},
    "output_sequence_length": {"unit": "tokens", "avg": 3700.64 / 19.04},
    "input_config": {"model": ["meta-llama/Llama-3.1-70B-Instruct"], "request_rate": 8.0, "concurrency": None,
                     "request_count": 2400},
}
VLLM = {
    "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 1000, "request_rate": "inf", "burstiness": 1.0,
    "max_concurrency": None, "completed": 1000, "total_input_tokens": 229711, "total_output_tokens": 203068,
    "request_throughput": 32.42, "output_throughput": 6582.87, "mean_ttft_ms": 9626.13, "median_ttft_ms": 9459.70,
    "p99_ttft_ms": 12666.73, "mean_tpot_ms": 77.86, "median_tpot_ms": 48.84, "p99_tpot_ms": 211.21,
}


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("python -m batching: error: "), err
    return err


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation fails the test: the errors below must come before the first one."""
    from batching.cli import calibrate_bench

    def refuse(*a, **k):
        raise AssertionError("simulated before refusing the file")

    monkeypatch.setattr(calibrate_bench, "simulate", refuse)
    monkeypatch.setattr(calibrate_bench.pf, "fit_profile", refuse)


# ---------------------------------------------------------------- item 12: bench and profile files


@pytest.mark.parametrize("text, message", [
    ("[" * 50_000 + "]" * 50_000, "its JSON nests arrays or objects too deeply"),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "its JSON nests arrays or objects too deeply"),
    ('{"mean_ttft_ms": 1' + "0" * 5000 + "}", "a number has more than 4,300 digits"),
    (json.dumps(dict(GENAI, time_to_first_token={"unit": ["ms"], "p50": 1})),
     "key 'time_to_first_token.unit': expected one of ms, s"),
    (json.dumps(dict(GENAI, time_to_first_token={"unit": {}, "p50": 1})),
     "key 'time_to_first_token.unit': expected one of ms, s"),
    (json.dumps(dict(GENAI, input_config={"model": "meta-llama/Llama-3.1-70B-Instruct",
                                          "perf_analyzer": {"stimulus": "concurrency"}})),
     "key 'input_config.perf_analyzer.stimulus': expected an object"),
    (json.dumps(dict(GENAI, input_config={"perf_analyzer": "fast"})),
     "key 'input_config.perf_analyzer': expected an object"),
    (json.dumps(dict(VLLM, p150_ttft_ms=20000.0)), "'b.json': key 'p150_ttft_ms': expected a percentile from p0 to p100"),
    (json.dumps(dict(GENAI, request_latency={"unit": "ms", "p150": 5000})),
     "'b.json': key 'request_latency.p150': expected a percentile from p0 to p100"),
], ids=["deep-array", "deep-object", "huge-int", "unit-list", "unit-object", "stimulus-text", "analyzer-text",
        "p150-vllm", "p150-genai"])
@pytest.mark.parametrize("fit", [False, True])
def test_hostile_bench_files_are_one_line_errors_before_any_simulation(tmp_path, capsys, no_simulation, text,
                                                                       message, fit):
    path = tmp_path / "b.json"
    path.write_text(text)
    assert main(["calibrate", "--bench", str(path), "--tp", "1", "--requests", "20", *(["--fit"] if fit else [])]) == 2
    assert message in _one_line_error(capsys)


def test_percentiles_up_to_p100_are_still_read():
    b = bf.parse_bench(json.dumps(dict(VLLM, p100_ttft_ms=13000.0, **{"p99.9_ttft_ms": 12900.0})).encode(), "b.json")
    assert b.metrics["ttft_p100_s"] == 13.0 and b.metrics["ttft_p99.9_s"] == 12.9


@pytest.mark.parametrize("data, message", [
    (b"[" * 50_000, "not valid JSON: arrays or objects nested too deeply"),
    (b'{"policy": ' * 50_000 + b"{}" + b"}" * 50_000, "not valid JSON: arrays or objects nested too deeply"),
    (b'{"step_s": 1' + b"0" * 5000 + b"}", "not valid JSON: a number has more than 4,300 digits"),
], ids=["deep-array", "deep-object", "huge-int"])
@pytest.mark.parametrize("command", [["run"], ["calibrate", "--bench", "BENCH"]])
def test_a_hostile_profile_is_a_one_line_error(tmp_path, capsys, no_simulation, data, message, command):
    prof = tmp_path / "p.json"
    prof.write_bytes(data)
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(VLLM))
    argv = [str(bench) if a == "BENCH" else a for a in command]
    assert main([*argv, "--profile", str(prof), "--requests", "20"]) == 2
    err = _one_line_error(capsys)
    assert f"--profile '{prof}': {message}" in err, err


def test_a_hostile_profile_upload_is_an_st_error_on_model_and_hardware():
    from test_hostile_input import _app

    at = _app("pages/model_and_hardware.py", n="200")
    at.file_uploader(key="profile_file").set_value(("deep.json", b"[" * 60_000, "application/json")).run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert any("deep.json" in e and "nested too deeply" in e for e in errors), errors


# ---------------------------------------------------------------- item 10: an output over an input


TRACE = b"arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,120,12\n1.0,90,8\n"
SMALL = ["--model", "llama-3.1-8b", "--tp", "1", "--num-gpus", "1"]


def _inputs(tmp_path: Path) -> dict[str, Path]:
    files = {"t.csv": TRACE, "requests.csv": TRACE, "explore_t.csv": TRACE, "b.json": json.dumps(VLLM).encode(),
             "p.json": b"{}", "m.json": b"{}", "g.json": b"{}"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "b.json.profile.json").write_bytes(b"{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "t.csv")
    os.link(tmp_path / "t.csv", tmp_path / "hard.json")
    (tmp_path / "sub").mkdir()
    return {p.name: p for p in tmp_path.iterdir() if p.is_file()}


# argv (names relative to the folder), the output flag and the input flag the error names, and the path it shows
OVERWRITES = {
    "calibrate --json": ("calibrate --bench b.json --tp 1 --json b.json", "--json 'b.json'", "--bench"),
    "calibrate --fit-out": ("calibrate --bench b.json --tp 1 --fit --fit-out b.json", "--fit-out 'b.json'", "--bench"),
    "calibrate --fit default": ("calibrate --bench b.json --tp 1 --fit --profile b.json.profile.json",
                                "--fit-out (default: the --bench file + .profile.json) 'b.json.profile.json'",
                                "--profile"),
    "calibrate --profile": ("calibrate --bench b.json --tp 1 --profile p.json --json p.json", "--json 'p.json'",
                            "--profile"),
    "run --trace --json": ("run --trace t.csv --json t.csv", "--json 't.csv'", "--trace"),
    "run symlink": ("run --trace t.csv --json link.json", "--json 'link.json'", "--trace"),
    "run hard link": ("run --trace t.csv --json hard.json", "--json 'hard.json'", "--trace"),
    "run relative": ("run --trace t.csv --json sub/../t.csv", "--json 'sub/../t.csv'", "--trace"),
    "run --csv": ("run --trace requests.csv --csv .", "--csv 'requests.csv'", "--trace"),
    "run --model-json": ("run --model-json m.json --json m.json", "--json 'm.json'", "--model-json"),
    "run --gpu-json": ("run --gpu-json g.json --json g.json", "--json 'g.json'", "--gpu-json"),
    "compare": ("compare --trace t.csv --json t.csv", "--json 't.csv'", "--trace"),
    "sweep": ("sweep --trace t.csv --knob max_num_seqs --values 8 --json t.csv", "--json 't.csv'", "--trace"),
    "capacity": ("capacity --trace t.csv --slo-ttft-ms 1000 --json t.csv", "--json 't.csv'", "--trace"),
    "search": ("search --trace t.csv --target-rate 5 --slo-ttft-ms 1000 --json t.csv", "--json 't.csv'", "--trace"),
    "report --out": ("report --trace explore_t.csv --no-png --out .", "--out 'explore_t.csv'", "--trace"),
    "specs": ("specs --model-json m.json --json m.json", "--json 'm.json'", "--model-json"),
}


@pytest.mark.parametrize("case", list(OVERWRITES))
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(case, tmp_path, capsys, monkeypatch):
    files = _inputs(tmp_path)
    before = {name: p.read_bytes() for name, p in files.items()}
    monkeypatch.chdir(tmp_path)
    argv, output, input_flag = OVERWRITES[case]
    argv = argv.split()
    extra = SMALL if argv[0] not in ("calibrate", "specs", "search") and "--model-json" not in argv else []
    assert main([*argv, *extra]) == 2
    err = _one_line_error(capsys)
    assert f"error: {output}: is the input file of {input_flag}" in err, err
    assert ("the report writes its explore_* files in that folder" if argv[0] == "report" else
            "would replace what the command reads") in err
    assert {name: p.read_bytes() for name, p in files.items()} == before, "an input was written"
    assert not (tmp_path / "steps.csv").exists() and not list(tmp_path.glob("*.part"))


def test_write_files_never_replaces_an_input(tmp_path):
    """The one place every output goes through (write_json, --csv, --out, --fit-out): a name that is an input of
    the command running is refused before any file of the set is written."""
    from argparse import Namespace

    from batching.cli.args import CliError, note_inputs, write_files

    trace = tmp_path / "CALIBRATION.md"
    trace.write_bytes(TRACE)
    note_inputs(Namespace(trace=trace))
    try:
        with pytest.raises(CliError, match=r"^--out '.*CALIBRATION\.md': is the input file of --trace"):
            write_files("--out", tmp_path, {"other.csv": b"x", "CALIBRATION.md": b"new"})
        assert trace.read_bytes() == TRACE and not (tmp_path / "other.csv").exists()
        assert write_files("--out", tmp_path, {"other.csv": b"x"}) == [tmp_path / "other.csv"]
    finally:
        note_inputs(Namespace())
