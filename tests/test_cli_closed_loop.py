"""Issue 23 item 1 on the command line: --concurrency N [--think-time-s S] on run, compare, capacity and report;
--rate and the arrival flags beside it are refused in one line; JSON carries the concurrency."""
from __future__ import annotations

import json
import math

import pytest

from batching.cli import args as cli_args
from batching.cli.main import main, make_parser


def _error_line(argv, capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    return lines[0]


def _scenario(*argv: str):
    return cli_args.build_scenario(make_parser().parse_args(["run", *argv]))


def test_flags_make_closed_loop_clients():
    sc = _scenario("--requests", "40", "--concurrency", "6", "--think-time-s", "0.25")
    assert sc.workload.concurrency == 6 and sc.workload.think_time_s == 0.25
    reqs = sc.workload.generate()
    assert reqs.clients == 6 and list(reqs.after[:8]) == [-1] * 6 + [0, 1]
    assert _scenario("--requests", "40").workload.concurrency is None  # open loop unless asked


@pytest.mark.parametrize("argv, needle", [
    (["--concurrency", "4", "--rate", "2"], "--concurrency 4 and --rate 2 are exclusive"),
    (["--concurrency", "4", "--burstiness", "2"], "--burstiness and --concurrency 4 are exclusive"),
    (["--think-time-s", "1"], "--think-time-s 1: needs --concurrency N"),
    (["--concurrency", "0"], "argument --concurrency: 0 is out of range; allowed 1 to 10000"),
    (["--concurrency", "2.5"], "argument --concurrency: 2.5 is not a whole number; allowed 1 to 10000"),
    (["--concurrency", "41"], "--concurrency 41: concurrency=41 is out of range; allowed 1 to 40 (at most "
                              "num_requests=40"),
    (["--concurrency", "4", "--think-time-s", "-1"], "argument --think-time-s: -1 is out of range; allowed 0 to"),
    (["--concurrency", "4", "--workload", "chat-sessions"], "--workload chat-sessions is multi-turn sessions"),
])
@pytest.mark.parametrize("command", ["run", "compare", "capacity", "report"])
def test_bad_closed_loop_flags_are_one_line(command, argv, needle, capsys, tmp_path):
    extra = {"capacity": ["--slo-ttft-ms", "500"], "report": ["--out", str(tmp_path / "out")]}.get(command, [])
    line = _error_line([command, "--requests", "40", *argv, *extra], capsys)
    assert needle in line


def test_run_json_says_concurrency(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--workload", "sharegpt", "--requests", "80", "--concurrency", "4", "--think-time-s", "0.5",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# arrivals: 4 clients (closed loop, think 0.5 s)" in text and "req/s" not in text.splitlines()[1]
    d = json.loads(out.read_text())
    assert d["concurrency"] == 4 and d["think_time_s"] == 0.5 and d["num_requests"] == 80


def test_capacity_searches_concurrency(tmp_path, capsys):
    out = tmp_path / "cap.json"
    assert main(["capacity", "--workload", "sharegpt", "--requests", "240", "--concurrency", "1", "--slo-ttft-ms",
                 "200", "--slo-tpot-ms", "30", "--target-rate", "10", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    # the capacity is the rate measured at the most clients within the SLOs, and the nodes follow from the target
    # and the default headroom: ceil(10 x 1.25 / rate) (no value re-copied from the model)
    assert d["max_concurrency"] == 13
    at = {p["concurrency"]: p for p in d["points"]}
    assert d["max_rate_req_s"] == pytest.approx(at[13]["rate_req_s"], rel=1e-9)
    assert at[14]["ttft_p99_s"] > 0.2 or at[14]["tpot_p99_s"] > 0.03  # one more client misses an SLO
    assert d["nodes_needed"] == math.ceil(10 * 1.25 / d["max_rate_req_s"])
    assert [p["concurrency"] for p in d["points"]] == [1, 2, 4, 8, 12, 13, 14, 16]
    assert "per class, at 13 clients" in text


def test_compare_says_clients(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["compare", "--workload", "sharegpt", "--requests", "60", "--concurrency", "4", "--json",
                 str(out)]) == 0
    assert "# load: 4 clients (closed loop)" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert {v["concurrency"] for v in d.values()} == {4}
