"""Issue 12 on the command line: --prefix-caching, --shared-prefix-tokens and the arrival flags (--burstiness,
--on-off, --rate-profile): what each flag makes of the scenario, and one clear line for each bad value."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from batching.cli import args as cli_args
from batching.cli.main import main, make_parser
from batching.sim.policy import PRESETS
from batching.sim.workload.requests import SyntheticWorkload

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--requests", "40", "--rate", "2"]


def _error_line(argv, capsys) -> str:
    """Run the CLI in this process; it must fail with exit code 2 and one line on stderr, no traceback."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error" in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def _scenario(*argv: str):
    ns = make_parser().parse_args(["run", *argv])
    return cli_args.build_scenario(ns)


@pytest.mark.parametrize("argv, needle", [
    (["--burstiness", "0"], "argument --burstiness: 0 is out of range; allowed > 0 to 20"),
    (["--burstiness", "21"], "argument --burstiness: 21 is out of range; allowed > 0 to 20"),
    (["--burstiness", "nan"], "argument --burstiness: 'nan' is not a finite number"),
    (["--burstiness", "x"], "argument --burstiness: 'x' is not a number; allowed > 0 to 20"),
    (["--on-off", "10"], "argument --on-off: '10' is not ON_S,OFF_S"),
    (["--on-off", "0,5"], "argument --on-off: ON_S 0 is out of range; allowed > 0 to 86400"),
    (["--on-off", "10,-1"], "argument --on-off: OFF_S -1 is out of range; allowed 0 to 86400"),
    (["--on-off", "10,"], "argument --on-off: OFF_S is empty"),
    (["--on-off", "１0,5"], "argument --on-off: ON_S '１0' has characters other than ASCII"),
    (["--rate-profile", "3"], "argument --rate-profile: '3' is not PEAK:TROUGH[:PERIOD_S]"),
    (["--rate-profile", "1:3"], "argument --rate-profile: PEAK:TROUGH 1:3 is a ratio of 0.3333; allowed 1 to 100"),
    (["--rate-profile", "300:1"], "argument --rate-profile: PEAK:TROUGH 300:1 is a ratio of 300; allowed 1 to 100"),
    (["--rate-profile", "3:0"], "argument --rate-profile: TROUGH 0 is out of range"),
    (["--rate-profile", "3:1:0"], "argument --rate-profile: PERIOD_S 0 is out of range; allowed > 0 to 604800"),
    (["--rate-profile", "3:1:inf"], "argument --rate-profile: PERIOD_S 'inf' is not a finite number"),
    (["--burstiness", "2", "--on-off", "1,1"], "argument --on-off: not allowed with argument --burstiness"),
    (["--rate-profile", "3:1", "--burstiness", "2"], "argument --burstiness: not allowed with argument --rate-profile"),
    (["--shared-prefix-tokens", "-1"], "argument --shared-prefix-tokens: -1 is out of range; allowed 0 to 1000000"),
    (["--shared-prefix-tokens", "1.5"], "argument --shared-prefix-tokens: 1.5 is not a whole number"),
    (["--preset", "static", "--prefix-caching"], "--prefix-caching: needs iteration-level batching"),
    (["--preset", "dynamic", "--prefix-caching"], "dynamic batching runs each batch as a whole"),
    (["--trace", str(ROOT / "assets" / "sample_trace.csv"), "--burstiness", "2"],
     "--burstiness: shapes the arrivals of a synthetic workload; a --trace keeps its recorded arrival times"),
    (["--trace", str(ROOT / "assets" / "sample_trace.csv"), "--on-off", "5,5"], "--on-off: shapes the arrivals"),
    (["--trace", str(ROOT / "assets" / "sample_trace.csv"), "--shared-prefix-tokens", "100"],
     "--shared-prefix-tokens: applies to synthetic workloads"),
])
def test_bad_values_are_one_line_naming_flag_value_and_range(argv, needle, capsys):
    assert needle in _error_line(["run", *argv, "--requests", "10"], capsys)


def test_compare_refuses_arrival_flags_together(capsys):
    line = _error_line(["compare", "--on-off", "5,5", "--rate-profile", "2:1", "--requests", "10"], capsys)
    assert "argument --rate-profile: not allowed with argument --on-off" in line


def test_help_lists_mooncake_and_the_new_flags(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Mooncake" in out and "hash_ids" in out
    for flag in ("--prefix-caching, --no-prefix-caching", "--shared-prefix-tokens", "--burstiness CV",
                 "--on-off ON_S,OFF_S", "--rate-profile PEAK:TROUGH[:PERIOD_S]"):
        assert flag in out, flag
    assert "CV = 1/sqrt(B)" in out  # vLLM's --burstiness is the Gamma shape, ours the CV


# ---------------------------------------------------------------- the policy


@pytest.mark.parametrize("name", list(PRESETS))
def test_prefix_caching_defaults_to_the_preset(name):
    assert _scenario("--preset", name, *SMALL).policy.prefix_caching == PRESETS[name].prefix_caching
    assert PRESETS[name].prefix_caching == (PRESETS[name].mode == "continuous")


def test_prefix_caching_flags():
    assert _scenario("--no-prefix-caching", *SMALL).policy.prefix_caching is False
    assert _scenario("--preset", "chunked", "--no-prefix-caching", *SMALL).policy.chunked_prefill is True
    assert _scenario("--preset", "continuous", "--prefix-caching", *SMALL).policy.prefix_caching is True
    # a request-level mode on a caching preset: no cache, as before the toggle existed
    sc = _scenario("--preset", "continuous", "--mode", "dynamic", *SMALL)
    assert sc.policy.mode == "dynamic" and sc.policy.prefix_caching is False


def test_presets_with_caching_leaves_request_level_presets_alone():
    off = cli_args.presets_with_caching(False)
    assert list(off) == list(PRESETS)
    assert not any(p.prefix_caching for p in off.values())
    on = cli_args.presets_with_caching(True)
    assert {k for k, p in on.items() if p.prefix_caching} == {"continuous", "chunked", "priority"}
    assert cli_args.presets_with_caching(None) == dict(PRESETS)
    for k, p in off.items():  # nothing else changes
        assert p == PRESETS[k].__class__(**{**PRESETS[k].__dict__, "prefix_caching": p.prefix_caching})


# ---------------------------------------------------------------- the workload



def test_arrival_flags_make_the_arrival_process():
    assert _scenario(*SMALL).workload.arrivals.kind == "poisson"
    assert _scenario("--burstiness", "1", *SMALL).workload == _scenario(*SMALL).workload  # CV 1 is Poisson
    a = _scenario("--burstiness", "4", *SMALL).workload.arrivals
    assert (a.kind, a.cv, a.rate_req_s) == ("gamma", 4.0, 2.0)
    a = _scenario("--on-off", "5,15", *SMALL).workload.arrivals
    assert (a.kind, a.on_s, a.off_s, a.rate_req_s) == ("onoff", 5.0, 15.0, 2.0)
    a = _scenario("--rate-profile", "6:2:3600", *SMALL).workload.arrivals
    assert (a.kind, a.peak_to_trough, a.period_s, a.rate_req_s) == ("diurnal", 3.0, 3600.0, 2.0)
    # no period: the run's length (requests / rate), one whole cycle
    a = _scenario("--rate-profile", "4:1", "--requests", "300", "--rate", "3").workload.arrivals
    assert (a.peak_to_trough, a.period_s) == (4.0, 100.0)


@pytest.mark.parametrize("flag", [["--burstiness", "4"], ["--on-off", "5,15"], ["--rate-profile", "3:1"]])
def test_with_rate_scales_the_whole_arrival_process(flag):
    """The capacity search rescales the workload with ``with_rate``: every kind keeps its shape (CV, on/off
    periods, peak:trough; a diurnal period is rescaled with the stream, so the same requests cover the same
    part of the cycle) and the requests arrive at the new mean rate."""
    wl = _scenario(*flag, "--requests", "2000", "--rate", "2").workload
    faster = wl.with_rate(8.0)
    assert faster.arrivals.kind == wl.arrivals.kind and faster.arrivals.rate_req_s == 8.0
    rescaled = ("rate_req_s", "period_s")
    assert {k: v for k, v in vars(faster.arrivals).items() if k not in rescaled} == \
           {k: v for k, v in vars(wl.arrivals).items() if k not in rescaled}
    if wl.arrivals.kind == "diurnal":
        assert faster.arrivals.period_s == pytest.approx(wl.arrivals.period_s * 2.0 / 8.0)
    else:
        assert faster.arrivals.period_s == wl.arrivals.period_s
    slow, fast = wl.generate(), faster.generate()
    assert len(fast) == len(slow)
    assert slow.mean_rate_req_s == pytest.approx(2.0, rel=0.1)
    assert fast.mean_rate_req_s == pytest.approx(8.0, rel=0.1)


def test_shared_prefix_tokens_lengthen_every_prompt():
    base = _scenario("--workload", "chat", *SMALL).workload
    wl = _scenario("--workload", "chat", "--shared-prefix-tokens", "2000", *SMALL).workload
    assert all(c.shared_prefix_tokens == 2000 for c in wl.classes)
    assert (wl.generate().prompt_tokens - base.generate().prompt_tokens == 2000).all()
    assert _scenario("--shared-prefix-tokens", "0", *SMALL).workload == _scenario(*SMALL).workload


# ---------------------------------------------------------------- what run and compare print


def test_run_prints_and_writes_the_prefix_cache_figures(tmp_path, capsys):
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    argv = ["run", "--workload", "chat", "--shared-prefix-tokens", "2000", "--requests", "60", "--rate", "2"]
    assert main(argv + ["--json", str(on)]) == 0
    out = capsys.readouterr().out
    s = json.loads(on.read_text())
    assert 0 < s["prefix_hit_rate"] <= 1 and s["cached_prompt_tokens"] > 0
    assert "prefix_hit_rate" in out and "cached_prompt_tokens" in out
    assert "% of prompt tokens from the prefix cache (" in out  # per class
    assert {"prefix_hit_rate", "cached_prompt_tokens"} <= set(s["by_priority"]["0"])
    assert main(argv + ["--no-prefix-caching", "--json", str(off)]) == 0
    out = capsys.readouterr().out
    s_off = json.loads(off.read_text())
    assert "prefix_hit_rate" not in s_off and "prefix_hit_rate" not in out  # the keys documented without caching
    assert s["ttft_p50_s"] < s_off["ttft_p50_s"]
