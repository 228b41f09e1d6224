"""Compare policies in AppTest: CDFs and histograms, the change table, slots from the URL, custom knobs."""
from __future__ import annotations

import math

from uihelpers import FAST, assert_clean, chart, chart_specs, run_page, trace_types

PAGE = "pages/compare.py"


def _table(at):
    return [d for d in at.dataframe if "Metric" in d.value.columns][0].value


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Compare policies"
    specs = chart_specs(at)
    assert len(specs) == 6  # CDF and histogram for TTFT, TPOT, E2E
    for name in ("TTFT", "TPOT", "E2E latency"):
        cdf = chart(at, f"{name} CDF by policy")
        assert trace_types(cdf) == {"scatter"}
        assert [t["name"] for t in cdf["data"]] == ["A · dynamic", "B · continuous", "C · chunked"]
        assert chart(at, f"{name} histogram by policy")["layout"]["xaxis"]["type"] == "log"
    table = _table(at)
    assert list(table.columns) == ["Metric", "A · dynamic", "B · continuous", "B · continuous vs A · dynamic",
                                   "C · chunked", "C · chunked vs A · dynamic"]
    assert "TTFT P99 (s)" in set(table["Metric"]) and "TPOT P99 (ms)" in set(table["Metric"])
    # continuous batching cuts P99 TTFT against dynamic batching at this load
    row = table[table["Metric"] == "TTFT P99 (s)"].iloc[0]
    assert row["B · continuous vs A · dynamic"] < -50


def test_slots_from_the_url_and_a_fourth_policy():
    at = run_page(PAGE, a_policy="static", b_policy="priority", c_policy="none", **FAST)
    assert_clean(at)
    assert [at.selectbox(key=f"wid:{s}_policy").value for s in "abcd"] == ["static", "priority", "none", "none"]
    assert [t["name"] for t in chart(at, "TTFT CDF")["data"]] == ["A · static", "B · priority"]
    at.selectbox(key="wid:d_policy").set_value("continuous").run()
    assert_clean(at)
    assert [t["name"] for t in chart(at, "TTFT CDF")["data"]] == ["A · static", "B · priority", "D · continuous"]
    assert at.query_params["d_policy"] == "continuous"


def test_customised_slot_and_change_column():
    at = run_page(PAGE, a_policy="continuous", b_policy="continuous", c_policy="none", b_seqs="4", **FAST)
    assert_clean(at)
    assert at.slider(key="wid:b_seqs").value == 4
    table = _table(at)
    assert "B · continuous*" in table.columns
    change = table.set_index("Metric")["B · continuous* vs A · continuous"]
    # four sequences at a time queue far more than 256
    assert change["TTFT P99 (s)"] > 100
    assert math.isclose(_table(run_page(PAGE, a_policy="continuous", b_policy="continuous", c_policy="none",
                                        **FAST)).set_index("Metric")["B · continuous vs A · continuous"]
                        ["TTFT P99 (s)"], 0.0, abs_tol=1e-9)


def test_invalid_knob_shows_error_and_keeps_the_last_comparison():
    at = run_page(PAGE, **FAST)
    before = len(chart_specs(at))
    at.slider(key="wid:b_budget").set_value(64).run()
    assert not at.exception
    assert any("max_num_batched_tokens=64" in e.value for e in at.error)
    assert len(chart_specs(at)) == before
