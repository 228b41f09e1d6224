"""Capacity planning in AppTest: default render (per-class SLOs, headroom), the tables equal the library's
capacity() for the same inputs (per class too), a looser SLO (for every class or for one) gives a higher rate, the
headroom moves nodes and cost and nothing else, the URL reproduces the view, the SLOs follow the workload's classes
and carry over to Tune a knob, progress, errors as messages."""
from __future__ import annotations

import math

import pytest
from uihelpers import FAST, assert_clean, chart_titles, drawn_charts, run_page

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies.capacity import SLO, CapacityResult, capacity, default_slo
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies.planning import CapacityPlan
from batching.ui import cache
from batching.ui.safe import unescape

PAGE = "pages/capacity.py"
COLUMNS = ["Rate per node (req/s)", "Steady throughput (output tok/s)", "Goodput (req/s)", "Binding SLO",
           "Binding class", "Nodes needed", "$ per M output tokens at target", "$ per M output tokens at capacity",
           "Margin (% of capacity used)", "Output tok/s per GPU", "Rates simulated"]  # issue 39 item 2: margin, tok/s/GPU


def plans(at) -> dict[str, CapacityResult]:
    plan = at.session_state["capacity_last"]
    assert isinstance(plan, CapacityPlan)
    return plan.results


def table(at):
    return at.dataframe[0].value


def per_class(at):
    return at.dataframe[1].value


def errors(at) -> list[str]:
    return [unescape(e.value) for e in at.error]


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Capacity planning"
    # the default SLOs: chat's first token within 1 s, batch analysis within 30 s, 100 ms per token for both
    assert at.text_input(key="wid:ttft_ms").value == "1000,30000"
    assert at.text_input(key="wid:tpot_ms").value == "100" and at.text_input(key="wid:e2e_s").value == "0"
    assert at.number_input(key="wid:headroom").value == DEFAULT_HEADROOM == 1.25
    # the price follows the sidebar GPU (H100 SXM): its row of the price table, not a fixed $2.50
    assert at.number_input(key="wid:usd").value == 2.69 and at.session_state["capacity_last"].gpu_hour_usd == 2.69
    assert at.session_state["capacity_last"].slo == default_slo(2)
    assert at.multiselect(key="wid:policies").value == list(PRESETS)
    assert chart_titles(at) == ["Capacity per policy within the SLOs", "Goodput and SLO attainment vs request rate"]
    df = table(at)
    assert list(df.index) == list(PRESETS)
    assert list(df.columns) == COLUMNS
    assert list(per_class(at).columns) == ["Policy", "Class", "At rate (req/s)", "SLOs", "Within its SLOs",
                                           "Attainment (%)",
                                           "Goodput (req/s)", "TTFT P50 (s)", "TTFT P99 (s)", "TPOT P50 (ms)",
                                           "TPOT P99 (ms)"]
    assert len(per_class(at)) == 2 * len(PRESETS)
    for c in drawn_charts(at):
        assert '"scale": 2' in c.config and '"filename": "capacity_' in c.config
        # a capacity search varies the rate: the sidebar's (1 req/s) names nothing it found (issue 24 item 12)
        assert "1rps" not in c.config and "_200req_seed0" in c.config
    assert len(at.get("download_button")) == 6  # + every chart as PNG and as SVG (issue 24 item 11)
    assert at.info and "sustains the most traffic" in at.info[0].value and "(1.25× headroom)" in at.info[0].value
    assert unescape(at.subheader[1].value) == ("Per policy: TTFT ≤ 1,000 ms for interactive chat, 30 s for batch "
                                               "analysis; TPOT ≤ 100 ms for 99 % of each class's requests")
    assert any("Headroom 1.25× applies" in c.value and "the stock cost model's known error" in c.value
               for c in at.caption)


def test_tables_equal_the_library_for_the_same_inputs():
    at = run_page(PAGE, **FAST, policies="continuous,chunked,static", target="50", usd="3")
    assert_clean(at)
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    slo = SLO(ttft_s=(1.0, 30.0), tpot_s=0.1, attainment=0.99)
    df, cls = table(at), per_class(at)
    assert list(df.index) == ["static", "continuous", "chunked"]  # preset order
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", None: "none (node at capacity)"}
    for name in df.index:
        lib = capacity(sc, slo, policy=PRESETS[name], target_rate_req_s=50.0, gpu_hour_usd=3.0,
                       headroom=DEFAULT_HEADROOM)
        row = df.loc[name]
        assert row["Rate per node (req/s)"] == pytest.approx(lib.max_rate_req_s)
        assert row["Steady throughput (output tok/s)"] == pytest.approx(lib.steady_output_tok_s)
        assert row["Goodput (req/s)"] == pytest.approx(lib.goodput_req_s)
        if lib.nodes_needed is None:
            assert row["Nodes needed"] == "–" and row["$ per M output tokens at target"] == "–"  # never None
        else:
            assert int(row["Nodes needed"]) == lib.nodes_needed == math.ceil(50 * 1.25 / lib.max_rate_req_s - 1e-9)
            assert row["$ per M output tokens at target"] == f"${lib.usd_per_million_output_tokens:.3f}"
            assert row["$ per M output tokens at capacity"] == f"${lib.usd_per_million_output_tokens_at_capacity:.3f}"
        assert row["Binding SLO"] == names[lib.binding_slo]
        assert row["Binding class"] == (lib.binding_class or "none (node at capacity)")
        rows = cls[cls.Policy == name].set_index("Class")
        for level, c in lib.by_priority.items():
            r = rows.loc[c["class_name"]]
            assert r["Attainment (%)"] == pytest.approx(100 * c["attainment"])
            assert r["Goodput (req/s)"] == pytest.approx(c["goodput_req_s"])
            assert r["TTFT P99 (s)"] == pytest.approx(c["ttft_p99_s"])
            assert r["TPOT P99 (ms)"] == pytest.approx(1e3 * c["tpot_p99_s"])
            assert r["Within its SLOs"] == ("yes" if c["meets_slo"] else "no")
            if lib.max_rate_req_s > 0:  # every class within its own SLOs at the rate found
                assert r["Within its SLOs"] == "yes" and r["Attainment (%)"] >= 99.0
        assert rows.loc["interactive chat", "SLOs"] == "TTFT ≤ 1,000 ms, TPOT ≤ 100 ms"
        assert rows.loc["batch analysis", "SLOs"] == "TTFT ≤ 30 s, TPOT ≤ 100 ms"
    assert df.loc["chunked", "Rate per node (req/s)"] > 0


def test_a_looser_slo_gives_a_higher_rate():
    # 200 requests build little queue: tight SLOs, so the search stops below its ceiling
    at = run_page(PAGE, **FAST, policies="chunked,priority", ttft_ms="500", tpot_ms="50")
    assert at.session_state["capacity_last"].slo == SLO(ttft_s=0.5, tpot_s=0.05)
    tight = {n: p.max_rate_req_s for n, p in plans(at).items()}
    assert all(0 < r for r in tight.values())
    # loosen the batch class only: its own 30 s; priority, which makes it wait, gains the most
    at.text_input(key="wid:ttft_ms").set_value("500,30000").run()
    assert_clean(at)
    assert at.session_state["capacity_last"].slo == SLO(ttft_s=(0.5, 30.0), tpot_s=0.05)
    batch_loose = {n: p.max_rate_req_s for n, p in plans(at).items()}
    assert all(batch_loose[n] >= tight[n] for n in tight) and batch_loose["priority"] > tight["priority"]
    at.text_input(key="wid:ttft_ms").set_value("2000,30000").run()
    at.text_input(key="wid:tpot_ms").set_value("100").run()
    assert_clean(at)
    loose = {n: p.max_rate_req_s for n, p in plans(at).items()}
    assert all(loose[n] >= batch_loose[n] for n in tight) and any(loose[n] > batch_loose[n] for n in tight)
    # a lower attainment target is looser too
    at.number_input(key="wid:attain").set_value(90.0).run()
    assert all(p.max_rate_req_s >= loose[n] for n, p in plans(at).items())


def test_price_target_and_headroom_change_the_plan_without_a_new_search(monkeypatch):
    at = run_page(PAGE, **FAST, policies="chunked")
    before = plans(at)["chunked"]
    calls = []
    real = cache._run_in_slot
    # every simulation, the capacity search's included (ui/planning calls the public alias), runs in a slot
    monkeypatch.setattr(cache, "_run_in_slot", lambda fn, **kw: calls.append(1) or real(fn, **kw))
    monkeypatch.setattr(cache, "run_in_slot", lambda fn, **kw: calls.append(1) or real(fn, **kw))
    at.number_input(key="wid:usd").set_value(5.0).run()
    at.number_input(key="wid:target").set_value(200.0).run()
    at.number_input(key="wid:headroom").set_value(1.5).run()
    assert_clean(at)
    after = plans(at)["chunked"]
    assert not calls  # nothing simulated: the search is cached and does not depend on price, target or headroom
    assert after.max_rate_req_s == before.max_rate_req_s and after.points.equals(before.points)
    assert after.headroom == 1.5 and at.query_params["headroom"] == "1.5"
    assert after.nodes_needed == math.ceil(200.0 * 1.5 / after.max_rate_req_s - 1e-9)
    assert after.usd_per_million_output_tokens == pytest.approx(
        after.nodes_needed * 8 * 5.0 / (200.0 * after.mean_output_tokens * 3600) * 1e6)
    assert after.usd_per_million_output_tokens_at_capacity == pytest.approx(
        5.0 / before.gpu_hour_usd * before.usd_per_million_output_tokens_at_capacity)
    at.number_input(key="wid:headroom").set_value(1.0).run()  # the simulator's own figures
    plain = plans(at)["chunked"]
    assert plain.nodes_needed == math.ceil(200.0 / plain.max_rate_req_s - 1e-9)
    assert any("Headroom 1× (none)" in c.value for c in at.caption)


def test_url_reproduces_the_view():
    query = dict(ttft_ms="1500,20000", tpot_ms="80", e2e_s="60", attain="95", target="50", usd="3", headroom="1.1",
                 policies="continuous,chunked", n="200")
    at = run_page(PAGE, **query)
    assert_clean(at)
    assert at.text_input(key="wid:ttft_ms").value == "1500,20000" and at.text_input(key="wid:e2e_s").value == "60"
    assert at.number_input(key="wid:attain").value == 95.0 and at.number_input(key="wid:headroom").value == 1.1
    assert at.multiselect(key="wid:policies").value == ["continuous", "chunked"]
    res = at.session_state["capacity_last"]
    assert res.slo == SLO(ttft_s=(1.5, 20.0), tpot_s=0.08, e2e_s=60.0, attainment=0.95)
    assert list(res.results) == ["continuous", "chunked"]
    assert (res.target_rate_req_s, res.gpu_hour_usd, res.headroom) == (50.0, 3.0, 1.1)
    for key, value in query.items():
        assert at.query_params[key] == value
    assert unescape(at.subheader[1].value) == ("Per policy: TTFT ≤ 1,500 ms for interactive chat, 20 s for batch "
                                               "analysis; TPOT ≤ 80 ms; E2E ≤ 60 s for 95 % of each class's requests")
    # the defaults are not written to the link
    bare = run_page(PAGE, **FAST, policies="chunked")
    assert not {"ttft_ms", "tpot_ms", "e2e_s", "attain", "headroom"} & set(bare.query_params)
    # unknown policies in a link are left out with a notice
    odd = run_page(PAGE, **FAST, policies="chunked,turbo")
    assert_clean(odd)
    assert list(plans(odd)) == ["chunked"]
    assert any("turbo" in w.value for w in odd.warning)


def test_the_slos_follow_the_workload_and_carry_over_to_tune():
    at = run_page(PAGE, **FAST, policies="chunked")
    assert at.text_input(key="wid:ttft_ms").value == "1000,30000"
    # one class: the default becomes one value
    at.selectbox(key="wid:workload").set_value("chat").run()
    assert_clean(at)
    assert at.text_input(key="wid:ttft_ms").value == "1000"
    assert at.session_state["capacity_last"].slo == default_slo(1)
    assert list(table(at).columns) == [c for c in COLUMNS if c != "Binding class"] and len(at.dataframe) == 1
    # back to two classes, a target set here is what Tune a knob reads its knee on
    at.selectbox(key="wid:workload").set_value("mixed").run()
    assert at.text_input(key="wid:ttft_ms").value == "1000,30000"
    at.text_input(key="wid:ttft_ms").set_value("2000,30000").run()
    at.switch_page("pages/tune.py").run()
    assert_clean(at)
    assert at.text_input(key="wid:ttft_ms").value == "2000,30000"
    study = at.session_state["tune_last"].study
    assert study.slo == SLO(ttft_s=(2.0, 30.0), tpot_s=0.1) and not study.slo_is_default


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


@pytest.mark.parametrize("query, needle", [
    (dict(ttft_ms="0", tpot_ms="0"), "give at least one SLO"),
    (dict(ttft_ms="1000,2000,3000"), "TTFT SLO (ms): 3 values for 2 classes (interactive chat, batch analysis); give "
                                     "1 value (every class) or 2, class 0 first"),
    (dict(tpot_ms="abc"), "TPOT SLO (ms): 'abc' is not a number; allowed > 0 to 3,600,000"),
    (dict(e2e_s="10,5000"), "E2E SLO (s): 5000 is out of range; allowed > 0 to 3,600"),
])
def test_a_bad_slo_is_a_message_not_a_traceback(query, needle):
    at = run_page(PAGE, **FAST, **query)
    assert not at.exception
    assert len(at.error) == 1 and needle in errors(at)[0], errors(at)


def test_no_policy_is_a_message_not_a_traceback():
    at = run_page(PAGE, **FAST)
    at.multiselect(key="wid:policies").set_value([]).run()
    assert not at.exception and not at.error
    assert any("Pick at least one policy" in w.value for w in at.warning)
    assert at.query_params["policies"] == ""


def test_an_unmeetable_slo_names_what_to_relax():
    at = run_page(PAGE, **FAST, ttft_ms="1", tpot_ms="0", policies="chunked")
    assert_clean(at)
    assert plans(at)["chunked"].max_rate_req_s == 0.0
    assert any("relax the TTFT SLO" in w.value for w in at.warning)


def test_the_price_follows_the_sidebar_gpu():
    """Issue 24 item 3: the price input starts at the sidebar GPU's row of the price table and a changed GPU gets
    its own default (H200 at $3.59, not the H100's price kept: a 25 % cheaper plan); a link's price holds for the
    link's GPU."""
    at = run_page(PAGE, **FAST, policies="chunked")
    assert_clean(at)
    assert at.number_input(key="wid:usd").value == 2.69
    assert any("h100-sxm default as of 2026-03-10" in unescape(c.value) for c in at.caption)
    at.selectbox(key="wid:gpu").set_value("h200-sxm").run()
    assert_clean(at)
    assert at.number_input(key="wid:usd").value == 3.59
    plan = at.session_state["capacity_last"]
    assert plan.gpu_hour_usd == 3.59 and plan.results["chunked"].gpu_hour_usd == 3.59
    assert any("h200-sxm default as of 2026-03-10" in unescape(c.value) for c in at.caption)
    assert "usd" not in at.query_params  # the default, so not in the link
    linked = run_page(PAGE, **FAST, policies="chunked", gpu="h200-sxm", usd="3")
    assert_clean(linked)
    assert linked.number_input(key="wid:usd").value == 3.0 and plans(linked)["chunked"].gpu_hour_usd == 3.0
    assert any("(the price entered)" in c.value for c in linked.caption)


def test_the_page_prices_speculation_through_the_same_search():
    """Issue 39 item 4: a speculation control like the other pages', feeding the same capacity search; the caption
    says method, K, acceptance and where the acceptance comes from (Llama-3.1: vLLM's measured EAGLE-3)."""
    from batching.sim.engine.speculative import acceptance_from_length
    from batching.sim.policy import with_knobs

    at = run_page(PAGE, **FAST, model="llama-3.1-8b", tp="1", policies="chunked,static", cap_spec="eagle",
                  workload="chat")
    assert_clean(at)
    assert at.query_params["cap_spec"] == "eagle"
    pols = at.session_state["capacity_last_policies"]
    on = pols["chunked"]
    assert (on.spec_decode, on.spec_tokens) == ("eagle", 3)
    assert on.spec_acceptance == pytest.approx(acceptance_from_length(3.53, 7))
    assert pols["static"].spec_decode == "off"  # request-level batching cannot speculate
    # the table is the library's capacity() of the speculating policy on the same scenario
    sc = at.session_state["capacity_last"].scenario
    slo = at.session_state["capacity_last"].slo
    lib = capacity(sc, slo, policy=on)
    assert table(at).loc["chunked", "Rate per node (req/s)"] == pytest.approx(lib.max_rate_req_s)
    off = capacity(sc, slo, policy=PRESETS["chunked"])
    assert lib.max_rate_req_s != pytest.approx(off.max_rate_req_s)  # speculation priced, not ignored
    text = " ".join(unescape(c.value) for c in at.caption)
    assert "Speculation on chunked: EAGLE, K = 3, A = 0.743" in text and "#26191" in text
    assert "static batch whole requests and run without it" in text
    # a given acceptance is the user's, said so
    at = run_page(PAGE, **FAST, model="llama-3.1-8b", tp="1", policies="chunked", cap_spec="eagle", cap_spec_a="0.6")
    assert_clean(at)
    assert at.session_state["capacity_last_policies"]["chunked"] == with_knobs(PRESETS["chunked"], spec_decode="eagle",
                                                                              spec_tokens=3, spec_acceptance=0.6)
    assert any("acceptance given: A = 0.6" in unescape(c.value) for c in at.caption)


def test_speculation_that_cannot_run_is_a_message():
    at = run_page(PAGE, **FAST, policies="chunked", cap_spec="mtp")  # Qwen2.5-72B has no MTP module
    assert any("multi-token-prediction" in e for e in errors(at))
