"""benchmarks/bench_first_minute.py's pure parts: its options, the table and ratio formatting, the feature list's
commands (each parsed by the CLI's own parser) and the small Mooncake trace it writes (read by the trace reader).
No browser, no server, no compile."""
from __future__ import annotations

import json

import pytest

from batching.cli.main import make_parser
from benchmarks import bench_first_minute as fm


def test_defaults_and_subsets():
    a = fm.parse_args([])
    assert a.rows == (1, 2, 3, 4)
    assert a.features == tuple(f[0] for f in fm.FEATURES)
    assert "router" in a.dash_features and "eagle" in a.dash_features and "disagg" in a.dash_features
    assert a.prepare == "auto" and a.moves == 3 and a.json is None and a.background_prepare == "default"
    assert a.report is None
    a = fm.parse_args(["--rows", "4,2,2", "--features", "router,eagle", "--moves", "5", "--json", "x.json",
                       "--max-minutes", "10"])
    assert a.rows == (2, 4) and a.features == ("router", "eagle") and a.moves == 5 and a.max_minutes == 10


@pytest.mark.parametrize("argv, message", [
    (["--rows", "5"], "subset of 1,2,3,4"),
    (["--rows", "one"], "subset of 1,2,3,4"),
    (["--rows", ""], "subset of 1,2,3,4"),
    (["--features", "router,warp"], "warp: unknown feature"),
    (["--dash-features", "mooncake"], "mooncake: unknown feature"),  # no dashboard link for a Mooncake file
    (["--moves", "0"], "whole number >= 1"),
    (["--prepare", "maybe"], "invalid choice: 'maybe'"),
    (["--background-prepare", "on"], "invalid choice: 'on'"),
    (["--quiet", "0"], "--quiet 0.0: must be > 0"),
    (["--max-minutes", "-1"], "--max-minutes -1.0: must be > 0"),
])
def test_bad_options_name_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        fm.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_every_feature_parses_with_the_cli_parser(tmp_path):
    parser = make_parser()
    trace = str(tmp_path / "t.jsonl")
    seen = {}
    for name, flags, _ in fm.FEATURES:
        cmd = fm.cli_command(flags, trace)
        assert cmd[:3] == ["run", "--requests", "300"]
        seen[name] = parser.parse_args(cmd)
    assert seen["router"].router == "least-kv" and seen["router"].nodes == 2
    assert seen["fleet"].router == "round-robin" and seen["fleet"].nodes == 2
    assert seen["eagle"].spec_decode == "eagle" and seen["draft"].spec_decode == "draft"
    d = seen["disagg"]
    assert (d.prefill_instances, d.decode_instances, d.prefill_tp, d.decode_tp) == (1, 1, 4, 4)
    assert seen["sessions"].workload == "chat-sessions"
    assert seen["prefix"].shared_prefix_tokens == 1000 and seen["prefix"].prefix_caching is True
    assert str(seen["mooncake"].trace) == trace  # the placeholder replaced by the written file's path
    assert seen["clients"].concurrency == 8 and seen["trtllm"].engine == "trtllm"
    assert set(fm.FEATURE_TEXT) == {f[0] for f in fm.FEATURES}


def test_dashboard_links_use_the_sidebar_and_knob_keys():
    from batching.sim.policy import PRESETS
    from batching.ui import knobs, sidebar

    keys = {p.key: p for p in sidebar.params()} | {p.key: p for p in knobs.knob_params("", PRESETS["continuous"])}
    for name, _, query in fm.FEATURES:
        if query is None:
            continue
        for pair in query.split("&"):
            key, value = pair.split("=")
            assert key in keys, (name, key)
            parsed, notice = keys[key].parse(value)
            assert notice is None, (name, notice)  # the link's value is taken as it is, not corrected


def test_mooncake_trace_reads_back(tmp_path):
    from batching.sim.workload.traces import load_trace

    rows = fm.mooncake_rows(n=40, rate_req_s=2.0)
    assert [r["timestamp"] for r in rows[:3]] == [0, 500, 1000]  # ms at 2 req/s
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    assert rows[0]["hash_ids"][:2] == rows[4]["hash_ids"][:2]  # the same group shares its first two blocks
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(str(path))
    assert len(trace.prompt_tokens) == 40
    assert list(trace.prompt_tokens[:2]) == [r["input_length"] for r in rows[:2]]


def test_ratio_and_formatting():
    assert fm.ratio(6.0, 2.0) == 3.0
    assert fm.ratio(None, 2.0) is None and fm.ratio(1.0, None) is None and fm.ratio(1.0, 0.0) is None
    assert fm.fmt_s(1.234) == "1.23 s" and fm.fmt_s(None) == "n/a"
    assert fm.fmt_x(3.0, 3.0) == "3.0x ok" and fm.fmt_x(3.05, 3.0) == "3.0x OVER" and fm.fmt_x(None) == "n/a"
    assert fm.fmt_x(12.0) == "12.0x"
    text = fm.table(["feature", "first use", "x"], [["router", "8.60 s", "9.0x OVER"], ["eagle", "12.40 s", "1.5x ok"]])
    lines = text.splitlines()
    assert lines[0].startswith("feature") and set(lines[1]) == {"-"} and len(lines[1]) == len(lines[0])
    assert lines[2].startswith("router ") and lines[2].endswith("9.0x OVER")
    assert lines[3].endswith("  1.5x ok") and "12.40 s" in lines[3]
    assert len({len(line) for line in lines}) == 1  # every column padded to one width


def test_report_from_saved_figures():
    """The summary a --json file holds prints as the tables, with the ratios and the target verdicts."""
    opened = {"first_s": 2.0, "last_s": 4.0, "charts": 7, "kernels_new": 0, "note": "", "progress": []}
    out = {"cpus": 2, "wall_s": 100.0, "rows": [1, 2, 4],
           "row1": {"cold": {**opened, "first_s": 9.0, "last_s": 16.0, "kernels_new": 30,
                             "progress": [(1.5, "stSpinner: Running simulation"),
                          (1.6, "stSpinner: Running simulation (0.1 seconds)"),
                          (61.5, "stSpinner: Running simulation (1 minute, 0.0 seconds)"),
                          (62.0, "stProgress: Simulating (2 of 10)"),
                          (63.0, "stAlertContentInfo: Preparing X: compiling (3 s so far)"),
                          (64.0, "stAlertContentInfo: Preparing X: compiling (4 s so far)")]},
                    "warm": opened, "warm_process": opened},
           "row2_cli": [{"name": "router", "command": "", "first": {"wall_s": 9.0, "rc": 0, "kernels_new": 4,
                                                                   "said": ""},
                         "again": {"wall_s": 1.0, "rc": 0, "kernels_new": 0, "said": ""}}],
           "prepare": None,
           "row3": [{"name": "explore", "control": "slider", "last_s": 1.0, "kernels_new": 0,
                     "moves": [{"last_s": 1.0, "sent_done_s": x} for x in (0.4, 0.5, 0.9)]},
                    {"name": "tune_slo", "control": "text", "last_s": None, "kernels_new": 0,
                     "moves": [{"last_s": None, "sent_done_s": x} for x in (4.0, 3.0, 7.0)]}],
           "row4": [{**opened, "case": "home"}, {**opened, "case": "tune", "last_s": 10.0}], "moves": 3}
    text = fm.report(out)
    assert "home page, first chart" in text and "4.5x OVER" in text  # 9 / 2
    assert "4.0x OVER" in text  # 16 / 4
    assert ("1.5 s 'stSpinner: Running simulation'; 62.0 s 'stProgress: Simulating (2 of 10)'; 63.0 s "
            "'stAlertContentInfo: Preparing X: compiling (N s so far)'\n") in text  # each once, counters taken off
    assert "9.0x OVER" in text and "not measured" in text
    assert "2.5x OVER" in text and "1.0x ok" in text  # tune 10 / 4; home itself
    slo = next(line for line in text.splitlines() if line.startswith("Tune, an SLO move"))
    assert "n/a" in slo and "8.0x OVER" in slo and "0/3" in slo  # no chart changed; median reruns 4 / 0.5 s
    assert "Row 2, first use of a feature, dashboard" not in text  # no dashboard figures in this run
