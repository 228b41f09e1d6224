"""Tune a knob in AppTest: default render, the range moves the curves, the knee marker, the three guided
cards on scenarios built to trigger each, the URL, errors as messages; the card rules on synthetic sweeps."""
from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pytest
from uihelpers import FAST, assert_clean, chart, chart_titles, run_page

from batching.studies.sweeps import sweep

from batching.studies.knee import sweep_knee
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.ui import planning
from batching.sim.workload import workload_preset

PAGE = "pages/tune.py"
TITLES = ["Throughput and capacity vs", "Frontier: capacity vs P99 TPOT at capacity", "Latency vs",
          "GPU use, batch fill"]


def values(v) -> list[float]:
    """A trace's data array from the chart spec (Plotly sends NumPy arrays base64-encoded)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float).tolist()
    return [float(e) for e in v]


def last(at) -> dict:
    return at.session_state["tune_last"]


def knee_marks(spec: dict) -> tuple[list, list]:
    layout = spec["layout"]
    shapes = [s for s in layout.get("shapes", []) if s.get("name") == "knee"]
    notes = [a for a in layout.get("annotations", []) if a.get("name") == "knee"]
    return shapes, notes


def card_texts(at) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith("**")]


def test_default_render():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    assert at.title[0].value == "Tune a knob"
    assert at.selectbox(key="wid:t_policy").value == "continuous"
    assert at.selectbox(key="wid:knob").value == "max_num_seqs"
    assert (at.number_input(key="wid:from").value, at.number_input(key="wid:to").value) == (8, 1024)
    assert at.radio(key="wid:spacing").value == "log"
    titles = chart_titles(at)
    assert len(titles) == 4 and all(t.startswith(w) for t, w in zip(titles, TITLES)), titles
    res = last(at)
    assert res["values"] == [8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]
    # the frontier holds the chosen preset plus the other presets that use max_num_seqs
    assert list(res["dfs"]) == ["continuous", "chunked", "priority"]
    frontier = chart(at, "Frontier: capacity vs P99 TPOT at capacity")
    assert {"continuous", "chunked", "priority"} <= {t.get("name") for t in frontier["data"]}
    for c in at.get("plotly_chart"):
        assert '"scale": 2' in c.proto.config and '"filename": "tune_continuous_max_num_seqs' in c.proto.config
    assert len(at.get("download_button")) == 3
    assert len(at.info) == 1 and at.info[0].value.startswith(("Knee at", "No knee"))
    # every chart has a caption under it
    assert len([c for c in at.caption if c.value.startswith(("Light:", "Each line", "Left:"))]) == 4


def test_knee_marker_where_the_sweep_has_a_knee():
    at = run_page(PAGE, **FAST)
    knee = last(at)["knees"]["continuous"]
    assert knee is not None
    for title in ("Throughput and capacity", "Latency vs", "GPU use"):
        shapes, notes = knee_marks(chart(at, title))
        assert shapes and all(s["x0"] == knee for s in shapes)
        assert len(notes) == 1 and notes[0]["text"] == f"knee: {knee:g}"
    assert at.info[0].value.startswith(f"Knee at max_num_seqs = {knee:,.0f}")
    # a range where capacity keeps growing has no knee, and no marker
    at.number_input(key="wid:to").set_value(32).run()
    assert_clean(at)
    assert last(at)["knees"]["continuous"] is None
    assert knee_marks(chart(at, "Throughput and capacity")) == ([], [])
    assert at.info[0].value.startswith("No knee in this range")


def test_changing_the_range_and_the_knob_changes_the_curves():
    at = run_page(PAGE, **FAST)
    before = values(chart(at, "Throughput and capacity")["data"][1]["x"])
    at.number_input(key="wid:from").set_value(4).run()
    at.number_input(key="wid:to").set_value(64).run()
    at.number_input(key="wid:points").set_value(5).run()
    assert_clean(at)
    after = values(chart(at, "Throughput and capacity")["data"][1]["x"])
    assert after == [4.0, 8.0, 16.0, 32.0, 64.0] != before
    assert at.query_params["from"] == "4" and at.query_params["to"] == "64" and at.query_params["points"] == "5"
    at.radio(key="wid:spacing").set_value("linear").run()
    assert last(at)["values"] == [4.0, 19.0, 34.0, 49.0, 64.0]
    # another knob brings its own range and spacing, and the charts follow it
    at.selectbox(key="wid:knob").set_value("rate_req_s").run()
    assert_clean(at)
    res = last(at)
    assert res["knob"] == "rate_req_s" and at.radio(key="wid:spacing").value == "linear"
    assert len(res["values"]) == 10 and "from" not in at.query_params  # back to the knob's defaults
    assert chart(at, "Throughput and capacity vs Request rate")["layout"]["xaxis"]["title"]["text"] == \
        "Request rate (req/s)"
    assert chart_titles(at)[1] == "Frontier: throughput vs P99 TTFT"
    # the rate applies to every preset: all five on the frontier
    assert len(res["dfs"]) == 5


def test_card_2_fires_on_a_tiny_max_num_seqs_at_high_rate():
    at = run_page(PAGE, knob="max_num_seqs", **{"from": "1", "to": "8"}, points="4", rate="10", n="200")
    assert_clean(at)
    cards = {c.number: c for c in last(at)["cards"]}
    assert cards[2].fired and not cards[3].fired
    texts = card_texts(at)
    assert any(t.startswith("**2 · Batch cap too small") for t in texts)
    text = [t for t in texts if t.startswith("**2")][0]
    assert "batch efficiency" in text and "requests queue" in text and "gpu_util" in text
    # the numbers quoted come from the sweep itself
    df = last(at)["dfs"]["continuous"]
    shown = {f"{e * 100:.0f} %" for e in df["batch_efficiency"]}
    assert any(f"batch efficiency {pct}" in text for pct in shown)
    assert cards[2].suggestion == 8.0 and cards[2].knob == "max_num_seqs"


def test_card_3_fires_on_static_batching_at_a_low_rate():
    at = run_page(PAGE, t_policy="static", knob="max_batch_size", **{"from": "1", "to": "128"}, points="8",
                  rate="0.3", n="200")
    assert_clean(at)
    assert at.selectbox(key="wid:knob").value == "max_batch_size"
    cards = {c.number: c for c in last(at)["cards"]}
    assert cards[3].fired
    text = [t for t in card_texts(at) if t.startswith("**3")][0]
    assert "arrive too slowly" in text and "Lower max_batch_size" in text and "keeps up" in text
    df = last(at)["dfs"]["static"]
    # the suggestion is the largest value swept that still fills half its batches
    assert cards[3].suggestion == max(v for v, e in zip(df["max_batch_size"], df["batch_efficiency"]) if e >= 0.5)


def test_card_1_fires_when_a_larger_cap_only_fills_the_kv_cache():
    at = run_page(PAGE, t_policy="chunked", kv="65536", rate="4", n="200")
    assert_clean(at)
    assert at.slider(key="wid:kv").value == 65536
    res = last(at)
    cards = {c.number: c for c in res["cards"]}
    assert cards[1].fired and cards[1].suggestion == res["knees"]["chunked"]
    text = [t for t in card_texts(at) if t.startswith("**1")][0]
    assert "preemptions" in text and "KV cache use" in text and "capacity" in text
    # the suggestion of card 2 does not contradict card 1
    assert cards[2].suggestion is None or cards[2].suggestion <= cards[1].suggestion


def test_no_card_says_so():
    at = run_page(PAGE, knob="rate_req_s", n="200")
    assert_clean(at)
    assert not any(c.fired for c in last(at)["cards"])
    assert any(s.value.startswith("None of the three pitfalls") for s in at.success)


def test_url_reproduces_the_view_and_the_library_sweep():
    query = dict(knob="max_num_seqs", points="5", spacing="linear", share="10", others="false", n="200",
                 **{"from": "16", "to": "256"})
    at = run_page(PAGE, **query)
    assert_clean(at)
    assert at.number_input(key="wid:from").value == 16 and at.number_input(key="wid:to").value == 256
    assert at.radio(key="wid:spacing").value == "linear" and at.toggle(key="wid:others").value is False
    res = last(at)
    assert res["values"] == [16.0, 76.0, 136.0, 196.0, 256.0] and list(res["dfs"]) == ["continuous"]
    assert res["share"] == pytest.approx(0.10)
    lib = sweep(Scenario(workload=workload_preset("mixed", 3.0, 200, 0)), "max_num_seqs", res["values"],
                policy=PRESETS["continuous"])
    got = res["dfs"]["continuous"]
    for col in ("capacity_output_tok_s", "ttft_p99_s", "batch_efficiency", "preemptions"):
        assert got[col].tolist() == pytest.approx(lib[col].tolist())
    assert res["knees"]["continuous"] == sweep_knee(lib, "max_num_seqs", 0.10)
    for key, value in query.items():  # the link keeps every value that is not the default
        if key == "knob":
            assert "knob" not in at.query_params  # max_num_seqs is the default for continuous batching
        else:
            assert at.query_params[key] == value
    # a value out of range is clamped with a notice
    clamped = run_page(PAGE, points="99", n="200")
    assert clamped.number_input(key="wid:points").value == planning.MAX_POINTS
    assert any("points=99" in w.value for w in clamped.warning)


def test_a_bad_range_or_knob_is_an_error_not_a_traceback():
    at = run_page(PAGE, **{"from": "512", "to": "64"}, n="200")
    assert not at.exception
    assert len(at.error) == 1 and "must be below" in at.error[0].value
    # the library's own check: without chunked prefill the budget must hold the longest prompt
    at = run_page(PAGE, knob="max_num_batched_tokens", **{"from": "256", "to": "4096"}, n="200")
    assert not at.exception
    assert len(at.error) == 1 and "chunked prefill" in at.error[0].value
    # fixed knobs that cannot run
    at = run_page(PAGE, t_budget="64", n="200")
    assert not at.exception and "max_num_batched_tokens=64" in at.error[0].value


def test_chunked_budget_knob_and_other_presets_skipped_with_a_reason():
    at = run_page(PAGE, t_policy="chunked", knob="max_num_batched_tokens", n="200")
    assert_clean(at)
    res = last(at)
    assert res["values"][0] == 256.0 and res["values"][-1] == 16384.0
    # continuous (no chunked prefill) cannot run budgets below its longest prompt: left off, with the reason
    assert "continuous" in res["skipped"] and "chunked prefill" in res["skipped"]["continuous"]
    assert any(c.value.startswith("'continuous' is not on the frontier") for c in at.caption)


# ---------------------------------------------------------------- the card rules on synthetic sweeps


def frame(x, **cols) -> pd.DataFrame:
    n = len(x)
    base = dict(throughput_output_tok_s=800.0, capacity_output_tok_s=2000.0, offered_output_tok_s=800.0,
                offered_req_s=3.0, ttft_p50_s=0.1, ttft_p99_s=0.5, tpot_p50_s=0.02, tpot_p99_s=0.03,
                capacity_tpot_p99_s=0.05, gpu_util=0.4, batch_efficiency=0.3, preemptions=0, kv_pressure=0.1,
                mean_running=10.0)
    data = {k: np.broadcast_to(np.asarray(cols.get(k, v), float), n).copy() for k, v in base.items()}
    return pd.DataFrame({"x": np.asarray(x, float), **data})


def renamed(df: pd.DataFrame, knob: str) -> pd.DataFrame:
    return df.rename(columns={"x": knob})


def test_card_1_rule():
    x = [16, 32, 64, 128]
    df = renamed(frame(x, capacity_output_tok_s=[1000, 1500, 1600, 1590], kv_pressure=[0.3, 0.5, 0.6, 0.9],
                       preemptions=[0, 0, 0, 40]), "max_num_seqs")
    card = planning.card_cap_too_large(df, "max_num_seqs", 64.0, 0.05, 256.0)
    assert card.fired and card.suggestion == 64.0 and "lower it" in card.text
    assert any("60 %" in t and "90 %" in t for t in card.triggers)
    # same capacity, but nothing rises past the knee: a larger cap costs latency only
    calm = df.assign(kv_pressure=0.6, preemptions=0)
    assert not planning.card_cap_too_large(calm, "max_num_seqs", 64.0, 0.05, 256.0).fired
    # a KV rise under 2 points of the cache does not count; preemptions alone do
    assert not planning.card_cap_too_large(calm.assign(kv_pressure=[0.3, 0.5, 0.6, 0.61]), "max_num_seqs", 64.0,
                                           0.05, None).fired
    assert planning.card_cap_too_large(calm.assign(preemptions=[0, 0, 0, 1]), "max_num_seqs", 64.0, 0.05,
                                       None).fired
    # capacity still growing past the knee value given: not fired; no knee or not a cap: not fired
    grow = df.assign(capacity_output_tok_s=[1000, 1500, 1600, 2000])
    assert not planning.card_cap_too_large(grow, "max_num_seqs", 64.0, 0.05, None).fired
    assert not planning.card_cap_too_large(df, "max_num_seqs", None, 0.05, None).fired
    assert not planning.card_cap_too_large(renamed(frame(x), "rate_req_s"), "rate_req_s", 64.0, 0.05, None).fired


def test_card_2_rule():
    pol = PRESETS["continuous"]
    x = [2, 4, 8, 16]
    df = renamed(frame(x, batch_efficiency=[1.0, 0.99, 0.6, 0.3], capacity_output_tok_s=[300, 550, 900, 1300],
                       offered_output_tok_s=800, ttft_p50_s=[50, 20, 0.1, 0.1], ttft_p99_s=[90, 40, 0.5, 0.5]),
                 "max_num_seqs")
    card = planning.card_cap_too_small(df, "max_num_seqs", pol, 256.0)
    assert card.fired and card.suggestion == 8.0 and "≤ 4" in card.text and "above that range" in card.text
    # the GPU has no room: not fired
    assert not planning.card_cap_too_small(df.assign(gpu_util=0.95), "max_num_seqs", pol, 256.0).fired
    # batches not full: not fired
    assert not planning.card_cap_too_small(df.assign(batch_efficiency=0.5), "max_num_seqs", pol, 256.0).fired
    # full but no queue (offered load well under capacity, flat TTFT): not fired
    quiet = df.assign(offered_output_tok_s=100, ttft_p50_s=0.1, ttft_p99_s=0.5)
    assert not planning.card_cap_too_small(quiet, "max_num_seqs", pol, 256.0).fired
    # a larger cap adds no capacity (another limit binds): not fired for a sweep of the cap
    stuck = df.assign(capacity_output_tok_s=300)
    assert not planning.card_cap_too_small(stuck, "max_num_seqs", pol, 256.0).fired
    # the policy's own value is in the range that is too small
    assert "raise it" in planning.card_cap_too_small(df, "max_num_seqs", pol, 4.0).text
    # every value still queues but capacity peaks inside the range: suggest the peak, not "raise it further"
    over = df.assign(offered_output_tok_s=5000, batch_efficiency=[1.0, 1.0, 1.0, 0.9],
                     capacity_output_tok_s=[300, 550, 900, 850])
    card = planning.card_cap_too_small(over, "max_num_seqs", pol, None)
    assert card.fired and card.suggestion == 8.0 and "more nodes" in card.text


def test_card_3_rule():
    x = [2, 8, 32]
    df = renamed(frame(x, batch_efficiency=[0.8, 0.55, 0.2], capacity_output_tok_s=[200, 300, 400],
                       offered_output_tok_s=90, offered_req_s=0.3, mean_running=[1.6, 4.4, 6.4]), "max_batch_size")
    static = planning.card_efficiency_low(df, "max_batch_size", PRESETS["static"])
    assert static.fired and static.suggestion == 8.0 and "dynamic batching" in static.text
    assert any("106.7 s to arrive" in t for t in static.triggers)  # a batch of 32 at 0.3 req/s
    dynamic = planning.card_efficiency_low(df, "max_batch_size", PRESETS["dynamic"])
    assert dynamic.fired and "raise max_wait_s from 100 ms" in dynamic.text
    # over capacity, low efficiency is not about arrivals
    assert not planning.card_efficiency_low(df.assign(offered_output_tok_s=500), "max_batch_size",
                                            PRESETS["static"]).fired
    # continuous batching: headroom, never fired
    assert not planning.card_efficiency_low(df, "max_batch_size", PRESETS["continuous"]).fired


def test_default_ranges_are_valid_for_every_knob():
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    for name, pol in PRESETS.items():
        run = sc.with_policy(pol)
        for knob in planning.knobs_for(pol, run):
            start, stop, points, spacing = planning.default_range(knob, run, capacity_req_s=8.0)
            low, high = planning.bounds(knob, run)
            assert low <= start < stop <= high, (name, knob)
            values = planning.knob_values(knob, start, stop, points, spacing)
            assert len(values) >= 2
    # without chunked prefill the budget range starts at the longest prompt (rounded up to a power of two)
    longest = int(sc.workload.generate().prompt_tokens.max())
    start = planning.default_range("max_num_batched_tokens", sc.with_policy(PRESETS["continuous"]))[0]
    assert start >= longest and start / 2 < longest
    assert planning.knob_values("max_num_seqs", 8, 1024, 8, "log") == [8, 16, 32, 64, 128, 256, 512, 1024]
    with pytest.raises(ValueError, match="start above 0"):
        planning.knob_values("high_share", 0, 1, 5, "log")
    with pytest.raises(ValueError, match="fewer than two"):
        planning.knob_values("max_num_seqs", 1, 1.4, 5, "linear")
