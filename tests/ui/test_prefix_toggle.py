"""Issue 12 on the dashboard: the sidebar's arrival process and shared system prompt, the Prefix caching toggle on
Explore and Compare, all bound to the URL; the prefix-cache figures in the tables and the KV chart."""
from __future__ import annotations


import pytest
from uihelpers import FAST, assert_clean, chart, data_traces, run_page

from batching.charts import policy as charts
from batching.sim.workload.requests import WORKLOAD_PRESETS
from batching.ui import sidebar

EXPLORE, COMPARE = "pages/explore.py", "pages/compare.py"
SHARED = {"workload": "sharegpt", "prefix_tokens": "2000", "n": "150", "rate": "2"}


def _scenario(at):
    return at.session_state["last_valid_scenario"]


def test_sidebar_arrivals_and_prefix_from_the_link():
    at = run_page(EXPLORE, arrivals="onoff", on_s="5", off_s="20", prefix_tokens="1024", workload="sharegpt", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:arrivals").value == "onoff"
    assert (at.number_input(key="wid:on_s").value, at.number_input(key="wid:off_s").value) == (5.0, 20.0)
    assert at.number_input(key="wid:prefix_tokens").value == 1024
    # only the chosen process's inputs are live
    assert not at.number_input(key="wid:on_s").disabled and at.select_slider(key="wid:cv").disabled
    assert at.number_input(key="wid:peak").disabled and at.number_input(key="wid:period_s").disabled
    wl = _scenario(at).workload
    assert (wl.arrivals.kind, wl.arrivals.on_s, wl.arrivals.off_s) == ("onoff", 5.0, 20.0)
    assert {c.shared_prefix_tokens for c in wl.classes} == {1024}


def test_sidebar_widgets_write_the_link():
    at = run_page(EXPLORE, workload="sharegpt", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:arrivals").value == "poisson" and "arrivals" not in at.query_params
    assert at.select_slider(key="wid:cv").disabled and at.number_input(key="wid:on_s").disabled
    at.selectbox(key="wid:arrivals").set_value("gamma").run()
    at.select_slider(key="wid:cv").set_value(4.0).run()
    at.number_input(key="wid:prefix_tokens").set_value(512).run()
    assert_clean(at)
    assert (at.query_params["arrivals"], at.query_params["cv"], at.query_params["prefix_tokens"]) == \
           ("gamma", "4", "512")
    wl = _scenario(at).workload
    assert (wl.arrivals.kind, wl.arrivals.cv) == ("gamma", 4.0)
    at.selectbox(key="wid:arrivals").set_value("diurnal").run()
    at.number_input(key="wid:peak").set_value(5.0).run()
    assert_clean(at)
    a = _scenario(at).workload.arrivals
    # period 0: the run's length, requests / rate (200 requests at the default 1 req/s)
    assert (a.kind, a.peak_to_trough, a.period_s) == ("diurnal", 5.0, 200.0)
    assert at.query_params["peak"] == "5"
    # every workload preset is a choice, chat sessions included, with a label
    options = at.selectbox(key="wid:workload").options
    assert "chat-sessions" in WORKLOAD_PRESETS and len(options) == len(WORKLOAD_PRESETS) + 1
    assert sidebar.WORKLOAD_LABELS["chat-sessions"] in options


def test_bad_link_values_are_clamped_with_a_notice():
    at = run_page(EXPLORE, arrivals="weibull", cv="30", prefix_tokens="99999", policy="chunked", **FAST)
    assert_clean(at)
    notes = " ".join(w.value for w in at.warning)
    assert "arrivals=weibull" in notes and "not one of the allowed values" in notes
    assert at.selectbox(key="wid:arrivals").value == "poisson"
    assert at.select_slider(key="wid:cv").value == 8.0  # snapped to the slider's top
    assert at.number_input(key="wid:prefix_tokens").value == 16384
    assert "prefix_tokens=99999" in notes and "out of range (allowed 0 to 16,384)" in notes


def test_explore_toggle_is_in_the_link_and_the_policy():
    at = run_page(EXPLORE, cache="false", **FAST)
    assert_clean(at)
    assert at.toggle(key="wid:cache").value is False
    assert at.query_params["cache"] == "false"
    assert "Results: continuous*" in [h.value for h in at.subheader]  # a customised preset
    assert "Prefix caching is off" in " ".join(c.value for c in at.caption)
    labels = [m.label for m in at.metric]
    assert "Prefix cache hit rate" not in labels  # no cache, no card
    at.toggle(key="wid:cache").set_value(True).run()
    assert_clean(at)
    assert "cache" not in at.query_params  # back to the preset's default
    assert "Prefix cache hit rate" in [m.label for m in at.metric]
    # request-level presets have no prefix cache, so no toggle
    at = run_page(EXPLORE, policy="static", **FAST)
    assert_clean(at)
    assert not [t for t in at.toggle if t.key == "wid:cache"]


def test_compare_toggle_per_slot():
    at = run_page(COMPARE, b_cache="false", **FAST)
    assert_clean(at)
    assert at.toggle(key="wid:b_cache").value is False and at.toggle(key="wid:c_cache").value is True
    table = at.dataframe[0].value
    row = table.set_index("Metric").loc["Prefix cache hit rate"]
    # dynamic and continuous without the cache read "–", with one footnote saying why
    assert row["A · dynamic"] == "–" and row["B · continuous*"] == "–"
    notes = " ".join(c.value for c in at.caption)
    assert "no prefix cache in this run" in notes


def test_explore_shows_the_hit_rate_and_what_the_toggle_changes():
    at = run_page(EXPLORE, **SHARED)
    assert_clean(at)
    card = [m for m in at.metric if m.label == "Prefix cache hit rate"][0]
    assert card.value.endswith(" %") and float(card.value[:-2]) > 0
    text = " ".join(c.value for c in at.caption)
    assert "Prefix caching served" in text and "toggle off → on" in text
    kv = chart(at, "KV cache use")
    assert charts.KV_CACHED_NAME in [t.get("name") for t in data_traces(kv)]
    assert kv["layout"]["yaxis"]["title"]["text"] == "KV used (%)"
    assert "KV + prefix cache (of " in kv["layout"]["annotations"][0]["text"]


def test_compare_says_when_the_cache_explains_a_difference():
    at = run_page(COMPARE, b_cache="false", **SHARED)
    assert_clean(at)
    row = at.dataframe[0].value.set_index("Metric").loc["Prefix cache hit rate"]
    assert row["C · chunked"].endswith(" %") and float(row["C · chunked"][:-2]) > 0
    text = " ".join(c.value for c in at.caption)
    assert "Prefix caching differs" in text and "not the batching" in text
