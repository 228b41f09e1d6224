"""Compare policies in AppTest: CDFs and histograms, the change table, slots from the URL, custom knobs."""
from __future__ import annotations

import math

from uihelpers import FAST, assert_clean, chart, chart_specs, run_page, trace_types, data_traces

PAGE = "pages/compare.py"


def _table(at):
    return [d for d in at.dataframe if "Metric" in d.value.columns][0].value


def _change(cell: str) -> float:
    """A change cell ("+12.3 %", "–") as a number (NaN for "–")."""
    assert isinstance(cell, str) and (cell == "–" or cell.endswith(" %")), cell
    return float("nan") if cell == "–" else float(cell.removesuffix(" %"))


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Compare policies"
    specs = chart_specs(at)
    assert len(specs) == 2  # CDF and histogram of the open tab (TTFT); a hidden tab draws nothing
    # TTFT, TPOT, E2E: each pair one tab click away (the tab reruns the fragment and draws its two charts)
    for tab, name in (("TTFT", "TTFT"), ("TPOT", "TPOT"), ("E2E", "E2E latency")):
        at.session_state["compare_latency_tab"] = tab
        at.run()
        assert_clean(at)
        assert len(chart_specs(at)) == 2
        cdf = chart(at, f"{name} CDF by policy")
        assert trace_types(cdf) == {"scatter"}
        assert [t["name"] for t in data_traces(cdf)] == ["A · dynamic", "B · continuous", "C · chunked"]
        assert chart(at, f"{name} histogram by policy")["layout"]["xaxis"]["type"] == "log"
    table = _table(at)
    assert list(table.columns) == ["Metric", "A · dynamic", "B · continuous", "B · continuous vs A · dynamic",
                                   "C · chunked", "C · chunked vs A · dynamic"]
    metrics = set(table["Metric"])
    assert {"TTFT P99", "TPOT P99", "Load", "GPU util", "Busy", "MFU", "MBU", "KV cache in use"} <= metrics
    # continuous batching cuts P99 TTFT against dynamic batching at this load (dynamic keeps up at the default rate)
    row = table[table["Metric"] == "TTFT P99"].iloc[0]
    if "unbounded" not in row["A · dynamic"]:
        assert _change(row["B · continuous vs A · dynamic"]) < -50
    assert row["B · continuous"].endswith(" ms")
    assert not any("None" in str(c) for c in table.to_numpy().ravel())


def test_overloaded_policy_reads_unbounded_and_gets_no_change():
    """3 req/s: static and dynamic cannot keep up. Their latencies read as unbounded and no change is computed
    against or for them (no -100 % deltas); the utilisation rows still compare."""
    at = run_page(PAGE, rate="3", n="2000")
    assert_clean(at)
    table = _table(at).set_index("Metric")
    assert table.loc["TTFT P99", "A · dynamic"].startswith("unbounded: queue grows (+")
    assert table.loc["TTFT P50", "A · dynamic"].endswith(" req/s)")
    for col in ("B · continuous vs A · dynamic", "C · chunked vs A · dynamic"):
        for metric in ("TTFT P50", "TTFT P99", "TPOT P99", "E2E P99"):
            assert table.loc[metric, col] == "–", (metric, col)  # a dash, never "None" (issue 24 item 12)
        assert math.isfinite(_change(table.loc["GPU util", col]))
    assert table.loc["Batch efficiency", "B · continuous"].endswith(" of 256)")
    assert not any("None" in str(c) for c in table.to_numpy().ravel())
    # every cell the dataframe draws is text: a missing number there reads "None" in the browser
    assert all(isinstance(c, str) for c in table.to_numpy().ravel())
    assert any("Overloaded at this rate: A · dynamic" in c.value for c in at.caption)


def test_slots_from_the_url_and_a_fourth_policy():
    at = run_page(PAGE, a_policy="static", b_policy="priority", c_policy="none", **FAST)
    assert_clean(at)
    assert [at.selectbox(key=f"wid:{s}_policy").value for s in "abcd"] == ["static", "priority", "none", "none"]
    assert [t["name"] for t in data_traces(chart(at, "TTFT CDF"))] == ["A · static", "B · priority"]
    at.selectbox(key="wid:d_policy").set_value("continuous").run()
    assert_clean(at)
    assert [t["name"] for t in data_traces(chart(at, "TTFT CDF"))] == ["A · static", "B · priority", "D · continuous"]
    assert at.query_params["d_policy"] == "continuous"


def test_customised_slot_and_change_column():
    at = run_page(PAGE, a_policy="continuous", b_policy="continuous", c_policy="none", b_seqs="4", **FAST)
    assert_clean(at)
    assert at.slider(key="wid:b_seqs").value == 4
    table = _table(at)
    assert "B · continuous*" in table.columns
    by_metric = table.set_index("Metric")
    change = by_metric["B · continuous* vs A · continuous"]
    # four sequences at a time cannot carry the load 256 carry: its queue grows, its latencies are unbounded and
    # not compared, while its lower throughput still is
    assert by_metric.loc["TTFT P99", "B · continuous*"].startswith("unbounded: queue grows")
    assert change["TTFT P99"] == "–"
    assert _change(change["Throughput"]) < 0
    assert math.isclose(_change(_table(run_page(PAGE, a_policy="continuous", b_policy="continuous", c_policy="none",
                                        **FAST)).set_index("Metric")["B · continuous vs A · continuous"]
                        ["TTFT P99"]), 0.0, abs_tol=1e-9)


def test_invalid_knob_shows_error_and_keeps_the_last_comparison():
    at = run_page(PAGE, **FAST)
    before = len(chart_specs(at))
    at.slider(key="wid:b_budget").set_value(64).run()
    assert not at.exception
    assert any("max_num_batched_tokens=64" in e.value for e in at.error)
    assert len(chart_specs(at)) == before
