"""Explore a policy in AppTest: charts, knobs that move the metrics they should, URL knobs, bad knobs."""
from __future__ import annotations

from uihelpers import FAST, assert_clean, chart, chart_specs, drawn_charts, metric_value, run_page, trace_types

from batching.charts import policy as charts
from batching.ui import cache

PAGE = "pages/explore.py"
# low load on short chat requests: a batch waits its full max wait, so TTFT follows the knob
LIGHT = {"policy": "dynamic", "workload": "chat", "rate": "0.2", "n": "100"}


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Explore a policy"
    assert at.selectbox(key="wid:policy").value == "continuous"
    specs = chart_specs(at)
    # timeline, composition, KV/queue, the open tab's latency histogram (TTFT), ITL: a hidden tab draws nothing
    assert len(specs) == 5
    assert trace_types(chart(at, "Request timeline")) == {"scatter"}  # within the point budget: SVG
    assert trace_types(chart(at, "Batch composition")) == {"scatter"}  # filled step areas
    assert trace_types(chart(at, "KV cache use")) == {"scatter"}
    # each of the three latency histograms is one tab click away (the tab reruns the fragment and draws it)
    for tab, name in (("TTFT", "TTFT"), ("TPOT", "TPOT"), ("E2E", "E2E latency")):
        at.session_state["explore_hist_tab"] = tab
        at.run()
        assert_clean(at)
        assert len(chart_specs(at)) == 5
        hist = chart(at, f"{name} distribution")
        assert trace_types(hist) == {"scatter"}
        assert hist["layout"]["xaxis"]["type"] == "log"
    assert "ms" in chart(at, "Inter-token latency")["layout"]["xaxis"]["title"]["text"]
    labels = [m.label for m in at.metric]
    assert {"TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99", "E2E P99", "GPU util", "Preemptions"} <= set(labels)
    # every chart carries the PNG export settings
    for c in drawn_charts(at):
        assert '"scale": 2' in c.config and '"filename": "explore_continuous' in c.config
    assert len(at.get("download_button")) == 6  # + every chart as PNG and as SVG (issue 24 item 11)


def _wire(at) -> list[tuple[str, str, str]]:
    """What the page sends for each chart: its element id, figure JSON and config (PNG file name included)."""
    return [(c.id, c.spec, c.config) for c in drawn_charts(at)]


def test_unchanged_figures_are_byte_identical_across_reruns():
    """A knob step that changes no data leaves every chart's spec, config and element id as they were, so the
    browser keeps the charts instead of re-creating them; the timeline stays within its point budget."""
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    # the first step makes the policy custom (its name in captions and PNG names); 200 requests at 3 req/s
    # never reach 500 or 600 running sequences, so the next step changes nothing in the run
    at.slider(key="wid:seqs").set_value(500).run()
    assert_clean(at)
    first = _wire(at)
    at.slider(key="wid:seqs").set_value(600).run()
    assert_clean(at)
    assert at.query_params["seqs"] == "600"
    assert _wire(at) == first
    at.run()  # a plain rerun too
    assert _wire(at) == first
    timeline = chart(at, "Request timeline")
    points = sum(len(t["x"]) if isinstance(t["x"], list) else len(t["x"]["bdata"]) * 3 // 4 // 4
                 for t in timeline["data"])
    assert points <= charts.TIMELINE_POINT_BUDGET


def test_larger_max_wait_raises_ttft():
    at = run_page(PAGE, **LIGHT)
    assert_clean(at)
    slider = at.slider(key="wid:wait_ms")
    assert slider.value == 100
    before = metric_value(at, "TTFT P50")
    slider.set_value(1000).run()
    assert_clean(at)
    after = metric_value(at, "TTFT P50")
    assert after > before + 0.5, (before, after)
    # the run behind the cards is the customised policy, and the URL carries the knob
    run, label = at.session_state["explore_last"]  # the scenario of the last run, not its result
    assert run.policy.max_wait_s == 1.0 and label == "dynamic*"
    assert at.query_params["wait_ms"] == "1000"
    # deltas against the unchanged preset
    card = [m for m in at.metric if m.label == "TTFT P50"][0]
    assert card.delta.startswith("+")


def test_url_knobs_reproduce_the_view():
    at = run_page(PAGE, **{**LIGHT, "wait_ms": "500", "batch": "16"})
    assert_clean(at)
    assert at.slider(key="wid:wait_ms").value == 500
    assert at.slider(key="wid:batch").value == 16
    policy = at.session_state["explore_last"][0].policy
    assert (policy.mode, policy.max_batch_size, policy.max_wait_s) == ("dynamic", 16, 0.5)
    # out of range knob values are clamped with a notice
    clamped = run_page(PAGE, **{**LIGHT, "wait_ms": "99999"})
    assert clamped.slider(key="wid:wait_ms").value == 2000
    assert any("wait_ms=99999" in w.value for w in clamped.warning)


def test_preset_change_resets_knobs_and_url():
    at = run_page(PAGE, **{**LIGHT, "wait_ms": "700"})
    at.selectbox(key="wid:policy").set_value("chunked").run()
    assert_clean(at)
    assert at.slider(key="wid:budget").value == 2048
    assert at.toggle(key="wid:chunked").value is True
    assert at.query_params["policy"] == "chunked" and "wait_ms" not in at.query_params


def test_kv_cache_and_priority_mix_knobs():
    at = run_page(PAGE, **FAST, rate="3")
    assert metric_value(at, "Preemptions") == 0
    at.slider(key="wid:kv").set_value(16384).run()
    assert_clean(at)
    assert metric_value(at, "Preemptions") > 0
    assert at.session_state["explore_last"][0].deployment.kv_cache_tokens == 16384
    at.slider(key="wid:high").set_value(80).run()
    assert_clean(at)
    req = cache.simulate_cached(at.session_state["explore_last"][0]).requests  # a cache hit
    assert 0.65 < (req["priority"] == 0).mean() < 0.95


def test_impossible_knob_shows_an_error_and_keeps_the_charts():
    at = run_page(PAGE, **FAST)
    before = len(chart_specs(at))
    at.slider(key="wid:budget").set_value(64).run()
    assert not at.exception
    assert len(at.error) == 1 and "max_num_batched_tokens=64" in at.error[0].value
    assert "chunked prefill" in at.error[0].value  # says what to change
    assert len(chart_specs(at)) == before
    assert any("last run that worked" in c.value for c in at.caption)
    # turning chunked prefill on makes the same budget valid
    at.toggle(key="wid:chunked").set_value(True).run()
    assert_clean(at)
