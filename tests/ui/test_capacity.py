"""Capacity planning in AppTest: default render, the table equals the library's capacity() for the same
inputs, a looser SLO gives a higher rate, the URL reproduces the view, progress, errors as messages."""
from __future__ import annotations

import math

import pytest
from uihelpers import FAST, assert_clean, chart_titles, run_page

from batching.studies.capacity import SLO, capacity
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.ui import cache
from batching.sim.workload import workload_preset

PAGE = "pages/capacity.py"


def plans(at) -> dict:
    return at.session_state["capacity_last"]["plans"]


def table(at):
    return at.dataframe[0].value


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Capacity planning"
    assert at.number_input(key="wid:ttft_ms").value == 2000 and at.number_input(key="wid:tpot_ms").value == 100
    assert at.multiselect(key="wid:policies").value == list(PRESETS)
    assert chart_titles(at) == ["Capacity per policy within the SLOs", "Goodput and SLO attainment vs request rate"]
    df = table(at)
    assert list(df.index) == list(PRESETS)
    assert list(df.columns) == ["Rate per node (req/s)", "Throughput (output tok/s)", "Goodput (req/s)",
                                "Binding SLO", "Nodes needed", "$ per M output tokens", "Rates simulated"]
    for c in at.get("plotly_chart"):
        assert '"scale": 2' in c.proto.config and '"filename": "capacity_' in c.proto.config
    assert len(at.get("download_button")) == 4
    assert at.info and "sustains the most traffic" in at.info[0].value


def test_table_equals_the_library_for_the_same_inputs():
    at = run_page(PAGE, **FAST, policies="continuous,chunked,static", target="50", usd="3")
    assert_clean(at)
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    slo = SLO(ttft_s=2.0, tpot_s=0.1, attainment=0.99)
    df = table(at)
    assert list(df.index) == ["static", "continuous", "chunked"]  # preset order
    for name in df.index:
        lib = capacity(sc, slo, policy=PRESETS[name], target_rate_req_s=50.0, gpu_hour_usd=3.0).to_dict()
        row = df.loc[name]
        assert row["Rate per node (req/s)"] == pytest.approx(lib["max_rate_req_s"])
        assert row["Throughput (output tok/s)"] == pytest.approx(lib["throughput_output_tok_s"])
        assert row["Goodput (req/s)"] == pytest.approx(lib["goodput_req_s"])
        if lib["nodes_needed"] is None:
            assert math.isnan(row["Nodes needed"]) and math.isnan(row["$ per M output tokens"])
        else:
            assert row["Nodes needed"] == lib["nodes_needed"]
            assert row["$ per M output tokens"] == pytest.approx(lib["usd_per_million_output_tokens"])
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", None: "none (node at capacity)"}
        assert row["Binding SLO"] == names[lib["binding_slo"]]
    assert df.loc["chunked", "Rate per node (req/s)"] > 0


def test_a_looser_slo_gives_a_higher_rate():
    # 200 requests build little queue: tight SLOs, so the search stops below its ceiling
    at = run_page(PAGE, **FAST, policies="chunked,continuous", ttft_ms="500", tpot_ms="50")
    tight = {n: p["max_rate_req_s"] for n, p in plans(at).items()}
    assert all(0 < r for r in tight.values())
    at.number_input(key="wid:ttft_ms").set_value(2000).run()
    at.number_input(key="wid:tpot_ms").set_value(100).run()
    assert_clean(at)
    loose = {n: p["max_rate_req_s"] for n, p in plans(at).items()}
    assert all(loose[n] >= tight[n] for n in tight) and any(loose[n] > tight[n] for n in tight), (tight, loose)
    # a lower attainment target is looser too
    at.number_input(key="wid:attain").set_value(90.0).run()
    assert all(p["max_rate_req_s"] >= loose[n] for n, p in plans(at).items())


def test_price_and_target_change_the_plan_without_a_new_search(monkeypatch):
    at = run_page(PAGE, **FAST, policies="chunked")
    before = plans(at)["chunked"]
    calls = []
    real = cache._run_in_slot
    monkeypatch.setattr(cache, "_run_in_slot", lambda fn: calls.append(1) or real(fn))
    at.number_input(key="wid:usd").set_value(5.0).run()
    at.number_input(key="wid:target").set_value(200.0).run()
    assert_clean(at)
    after = plans(at)["chunked"]
    assert not calls  # nothing simulated: the search is cached and does not depend on price or target
    assert after["max_rate_req_s"] == before["max_rate_req_s"]
    assert after["usd_per_million_output_tokens"] == pytest.approx(2 * before["usd_per_million_output_tokens"])
    assert after["nodes_needed"] == math.ceil(200.0 / after["max_rate_req_s"] - 1e-9)


def test_url_reproduces_the_view():
    query = dict(ttft_ms="1500", tpot_ms="80", e2e_s="60", attain="95", target="50", usd="3",
                 policies="continuous,chunked", n="200")
    at = run_page(PAGE, **query)
    assert_clean(at)
    assert at.number_input(key="wid:ttft_ms").value == 1500 and at.number_input(key="wid:e2e_s").value == 60.0
    assert at.number_input(key="wid:attain").value == 95.0
    assert at.multiselect(key="wid:policies").value == ["continuous", "chunked"]
    res = at.session_state["capacity_last"]
    assert res["slo"] == SLO(ttft_s=1.5, tpot_s=0.08, e2e_s=60.0, attainment=0.95)
    assert list(res["plans"]) == ["continuous", "chunked"]
    for key, value in query.items():
        assert at.query_params[key] == value
    assert "TTFT ≤ 1,500 ms, TPOT ≤ 80 ms, E2E ≤ 60 s for 95 % of requests" in at.subheader[1].value
    # unknown policies in a link are left out with a notice
    odd = run_page(PAGE, **FAST, policies="chunked,turbo")
    assert_clean(odd)
    assert list(plans(odd)) == ["chunked"]
    assert any("turbo" in w.value for w in odd.warning)


def test_progress_goes_through_run_with_progress(monkeypatch):
    seen = []
    real = cache.run_with_progress

    def recording(tasks, text):
        seen.append(([label for label, _ in tasks], text))
        return real(tasks, text)

    monkeypatch.setattr(cache, "run_with_progress", recording)
    at = run_page(PAGE, **FAST, policies="static,priority")
    assert_clean(at)
    assert seen == [(["static", "priority"], "Searching for the highest rate within the SLOs")]


def test_no_slo_or_no_policy_is_a_message_not_a_traceback():
    at = run_page(PAGE, **FAST, ttft_ms="0", tpot_ms="0")
    assert not at.exception
    assert len(at.error) == 1 and "above 0" in at.error[0].value
    at = run_page(PAGE, **FAST)
    at.multiselect(key="wid:policies").set_value([]).run()
    assert not at.exception and not at.error
    assert any("Pick at least one policy" in w.value for w in at.warning)
    assert at.query_params["policies"] == ""


def test_an_unmeetable_slo_names_what_to_relax():
    at = run_page(PAGE, **FAST, ttft_ms="1", tpot_ms="0", policies="chunked")
    assert_clean(at)
    assert plans(at)["chunked"]["max_rate_req_s"] == 0.0
    assert any("relax the TTFT SLO" in w.value for w in at.warning)
