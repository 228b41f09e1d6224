"""Tune a knob in AppTest: default render, the range moves the curves, the knee marker, the three guided
cards on scenarios built to trigger each, the URL, errors as messages. The rules themselves, on synthetic
sweeps and without Streamlit: tests/test_planning.py."""
from __future__ import annotations

import base64
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from uihelpers import FAST, assert_clean, chart, chart_titles, drawn_charts, run_page

from batching.sim.metrics import DEFINITIONS
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import DEFAULT_RATE_REQ_S, workload_preset
from batching.studies import planning as sp
from batching.studies.capacity import SLO, capacity, default_slo
from batching.studies.knee import capacity_knee, sweep_knee
from batching.studies.sweeps import apply_knob, sweep
from batching.ui.planning import TuneView
from batching.ui.safe import unescape

PAGE = "pages/tune.py"
TITLES = ["Throughput and capacity vs", "Frontier: capacity vs P99 TPOT at capacity", "Latency vs",
          "GPU use, batch fill"]


def values(v) -> list[float]:
    """A trace's data array from the chart spec (Plotly sends NumPy arrays base64-encoded)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float).tolist()
    return [float(e) for e in v]


def last(at) -> sp.SweepStudy:
    view = at.session_state["tune_last"]
    assert isinstance(view, TuneView)
    return view.study


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
    assert res.values == (8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
    # the frontier holds the chosen preset plus the other presets that use max_num_seqs
    assert list(res.frames) == ["continuous", "chunked", "priority"] and res.label == "continuous"
    assert at.session_state["tune_last"].log_x and at.session_state["tune_last"].frontier == "tpot_cap"
    frontier = chart(at, "Frontier: capacity vs P99 TPOT at capacity")
    assert {"continuous", "chunked", "priority"} <= {t.get("name") for t in frontier["data"]}
    for c in drawn_charts(at):
        assert '"scale": 2' in c.config and '"filename": "tune_continuous_max_num_seqs' in c.config
    assert len(at.get("download_button")) == 5  # + every chart as PNG and as SVG (issue 24 item 11)
    assert len(at.info) == 1 and at.info[0].value.startswith(("Knee at", "No knee"))
    # every chart has a caption under it
    assert len([c for c in at.caption if c.value.startswith(("Light:", "Each line", "Left:"))]) == 4
    assert not [c for c in at.caption if "points done" in c.value]  # the preview gave way to the results


def test_the_gpu_util_column_is_defined_as_what_it_shows():
    """The sweep's GPU util is the summary's gpu_util (step time x useful share of its token slots / wall time);
    its tooltip and the utilisation chart's caption define that, not sol_util (the roofline time of the useful
    work)."""
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    study = last(at)
    table = [d for d in at.dataframe if "GPU util (%)" in d.value.columns][0]
    np.testing.assert_allclose(table.value["GPU util (%)"], study.frames[study.label]["gpu_util"] * 100)
    helps = {c.get("label"): c.get("help") for c in json.loads(table.proto.columns).values() if isinstance(c, dict)}
    assert helps["GPU util (%)"] == DEFINITIONS["gpu_util"][1] != DEFINITIONS["sol_util"][1]
    caption = [c.value for c in at.caption if c.value.startswith("Left: GPU util")][0]
    assert "useful share of its token slots" in caption and "roofline" not in caption


def test_knee_marker_where_the_sweep_has_a_knee():
    at = run_page(PAGE, **FAST)
    knee = last(at).knees["continuous"]
    assert knee is not None
    for title in ("Throughput and capacity", "Latency vs", "GPU use"):
        shapes, notes = knee_marks(chart(at, title))
        assert shapes and all(s["x0"] == knee for s in shapes)
        assert len(notes) == 1 and notes[0]["text"] == f"knee: {knee:g}"
    assert at.info[0].value.startswith(f"Knee at max_num_seqs = {knee:,.0f}")
    # a range where capacity keeps growing has no knee, and no marker
    at.number_input(key="wid:to").set_value(32).run()
    assert_clean(at)
    assert last(at).knee is None
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
    assert last(at).values == (4.0, 19.0, 34.0, 49.0, 64.0)
    # another knob brings its own range and spacing, and the charts follow it
    at.selectbox(key="wid:knob").set_value("rate_req_s").run()
    assert_clean(at)
    res = last(at)
    assert res.knob == "rate_req_s" and at.radio(key="wid:spacing").value == "linear"
    assert len(res.values) == 10 and "from" not in at.query_params  # back to the knob's defaults
    assert chart(at, "Throughput and capacity vs Request rate")["layout"]["xaxis"]["title"]["text"] == \
        "Request rate (req/s)"
    assert chart_titles(at)[1] == "Frontier: throughput vs P99 TTFT"
    # the rate applies to every preset: all five on the frontier
    assert len(res.frames) == 5


def test_card_2_fires_on_a_tiny_max_num_seqs_at_high_rate():
    # the configured max_num_seqs (4, held fixed) is in the range swept: the check speaks about it
    at = run_page(PAGE, knob="max_num_seqs", t_seqs="4", **{"from": "1", "to": "8"}, points="4", rate="10", n="200")
    assert_clean(at)
    res = last(at)
    cards = {c.number: c for c in res.cards}
    assert cards[2].fired and not cards[3].fired
    texts = card_texts(at)
    assert any(t.startswith("**2 · Batch cap too small") for t in texts)
    text = [t for t in texts if t.startswith("**2")][0]
    assert "The configured max_num_seqs = 4 is too small" in text
    assert "batch efficiency" in text and "requests queue" in text and "sol_util" in text
    # the numbers quoted come from the sweep itself
    df = res.frame
    shown = {f"{e * 100:.0f} %" for e in df["batch_efficiency"]}
    assert any(f"batch efficiency {pct}" in text for pct in shown)
    assert cards[2].suggestion == 8.0 and cards[2].knob == "max_num_seqs"
    # the preset's own 256 lies above the values that are too small: the check does not fire about them
    preset = run_page(PAGE, knob="max_num_seqs", **{"from": "1", "to": "8"}, points="4", rate="10", n="200")
    assert_clean(preset)
    card = {c.number: c for c in last(preset).cards}[2]
    assert not card.fired and "the configured max_num_seqs is 256, above that range" in card.text


def test_card_3_fires_on_static_batching_at_a_low_rate():
    at = run_page(PAGE, t_policy="static", knob="max_batch_size", **{"from": "1", "to": "128"}, points="8",
                  rate="0.3", n="200")
    assert_clean(at)
    assert at.selectbox(key="wid:knob").value == "max_batch_size"
    cards = {c.number: c for c in last(at).cards}
    assert cards[3].fired
    text = [t for t in card_texts(at) if t.startswith("**3")][0]
    assert "arrive too slowly" in text and "Lower max_batch_size" in text and "keeps up" in text
    df = last(at).frames["static"]
    # the suggestion is the largest value swept that still fills half its batches
    assert cards[3].suggestion == max(v for v, e in zip(df["max_batch_size"], df["batch_efficiency"]) if e >= 0.5)


def test_card_1_fires_when_a_larger_cap_only_fills_the_kv_cache():
    at = run_page(PAGE, t_policy="chunked", kv="32768", rate="4", n="200")
    assert_clean(at)
    assert at.slider(key="wid:kv").value == 32768
    res = last(at)
    cards = {c.number: c for c in res.cards}
    assert cards[1].fired and cards[1].suggestion == res.knees["chunked"]
    text = [t for t in card_texts(at) if t.startswith("**1")][0]
    assert "preemptions" in text and "KV cache use" in text and "capacity" in text
    # the suggestion of card 2 does not contradict card 1
    assert cards[2].suggestion is None or cards[2].suggestion <= cards[1].suggestion


def test_no_card_says_so():
    at = run_page(PAGE, knob="rate_req_s", n="200")
    assert_clean(at)
    assert not any(c.fired for c in last(at).cards)
    assert [s.value for s in at.success] == [sp.NONE_FIRED]


def test_url_reproduces_the_view_and_the_library_sweep():
    query = dict(knob="max_num_seqs", points="5", spacing="linear", share="10", others="false", n="200",
                 **{"from": "16", "to": "256"})
    at = run_page(PAGE, **query)
    assert_clean(at)
    assert at.number_input(key="wid:from").value == 16 and at.number_input(key="wid:to").value == 256
    assert at.radio(key="wid:spacing").value == "linear" and at.toggle(key="wid:others").value is False
    res = last(at)
    assert res.values == (16.0, 76.0, 136.0, 196.0, 256.0) and list(res.frames) == ["continuous"]
    assert res.share == pytest.approx(0.10)
    lib = sweep(Scenario(workload=workload_preset("mixed", DEFAULT_RATE_REQ_S, 200, 0)), "max_num_seqs", res.values,
                policy=PRESETS["continuous"], slo=default_slo(2))
    got = res.frame
    for col in ("capacity_output_tok_s", "ttft_p99_s", "batch_efficiency", "preemptions", "max_rate_req_s"):
        assert got[col].tolist() == pytest.approx(lib[col].tolist())
    assert res.knee == sweep_knee(lib, "max_num_seqs", 0.10)
    for key, value in query.items():  # the link keeps every value that is not the default
        if key == "knob":
            assert "knob" not in at.query_params  # max_num_seqs is the default for continuous batching
        else:
            assert at.query_params[key] == value
    # a value out of range is clamped with a notice
    clamped = run_page(PAGE, points="99", n="200")
    assert clamped.number_input(key="wid:points").value == sp.MAX_POINTS
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
    assert res.values[0] == 256.0 and res.values[-1] == 16384.0
    # continuous (no chunked prefill) cannot run budgets below its longest prompt: left off, with the reason
    assert "continuous" in res.skipped and "chunked prefill" in res.skipped["continuous"]
    assert any(c.value.startswith("'continuous' is not on the frontier") for c in at.caption)


# ---------------------------------------------------------------- the knee within the SLOs


def test_the_knee_is_read_on_the_capacity_within_the_slos():
    at = run_page(PAGE, **FAST, others="false")
    assert_clean(at)
    res = last(at)
    assert res.slo == default_slo(2) and res.slo_is_default
    assert at.text_input(key="wid:ttft_ms").value == "1000,30000" and at.text_input(key="wid:tpot_ms").value == "100"
    df = res.frame
    assert res.knee == capacity_knee(df["max_num_seqs"], df["max_rate_req_s"], res.share)
    # each point's figure is the capacity search's for that value (the Capacity page's number)
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0), policy=PRESETS["continuous"])
    for v in (8.0, res.knee):
        lib = capacity(apply_knob(sc, "max_num_seqs", v), default_slo(2))
        assert df.set_index("max_num_seqs").loc[v, "max_rate_req_s"] == pytest.approx(lib.max_rate_req_s)
    table = at.dataframe[0].value
    assert table["Rate within SLOs (req/s)"].tolist() == pytest.approx(df["max_rate_req_s"].tolist())
    assert any(unescape(c.value).startswith("SLOs: TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; "
                                            "TPOT ≤ 100 ms for 99 % of each class's requests (the default SLOs: none were given).")
               for c in at.caption)
    assert at.info[0].value.startswith(f"Knee at max_num_seqs = {res.knee:,.0f}: past it capacity within the SLOs")


def test_widening_the_range_beyond_the_knee_keeps_it():
    narrow = run_page(PAGE, **FAST, others="false", **{"from": "8", "to": "1024"}, points="8")
    wide = run_page(PAGE, **FAST, others="false", **{"from": "8", "to": "4096"}, points="10")
    assert_clean(narrow)
    assert_clean(wide)
    assert last(wide).values == (8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)
    knee = last(narrow).knee
    assert knee is not None and knee < 1024 and last(wide).knee == knee


def test_the_slo_inputs_move_the_knee_and_errors_are_messages():
    at = run_page(PAGE, **FAST, others="false", tpot_ms="30")
    assert_clean(at)
    res = last(at)
    assert res.slo == SLO(ttft_s=(1.0, 30.0), tpot_s=0.03) and not res.slo_is_default
    assert at.query_params["tpot_ms"] == "30"
    lib = sweep(Scenario(workload=workload_preset("mixed", DEFAULT_RATE_REQ_S, 200, 0)), "max_num_seqs", res.values,
                policy=PRESETS["continuous"], slo=res.slo)
    assert res.frame["max_rate_req_s"].tolist() == pytest.approx(lib["max_rate_req_s"].tolist())
    assert res.knee == sweep_knee(lib, "max_num_seqs", res.share)
    at.text_input(key="wid:tpot_ms").set_value("100").run()
    loose, tight = last(at).frame["max_rate_req_s"].to_numpy(), res.frame["max_rate_req_s"].to_numpy()
    assert (loose >= tight).all() and (loose > tight).any()
    # a list that does not fit the classes: an error naming the input, and the last sweep stays on screen
    at.text_input(key="wid:ttft_ms").set_value("1000,2000,3000").run()
    assert not at.exception and len(at.error) == 1
    assert "TTFT SLO (ms): 3 values for 2 classes (interactive chat, batch analysis)" in unescape(at.error[0].value)
    assert any(c.value == "Showing the last sweep that ran." for c in at.caption)


# --- each point cached on its own (issue 11: a move recomputes only what it changes) --------------------------


@pytest.fixture
def sims(monkeypatch):
    """Every simulation the dashboard's caches run, as (scenario, saturated); the caches start empty."""
    from batching.ui import cache

    calls = []
    real = cache.simulate

    def counted(sc, saturated=False, steps=True):
        calls.append((sc, saturated))
        return real(sc, saturated=saturated, steps=steps)

    monkeypatch.setattr(cache, "simulate", counted)
    monkeypatch.setitem(cache._KERNEL, "ready", True)
    cache.clear()
    yield calls
    cache.clear()


def test_sweep_points_are_cached_one_by_one_and_equal_the_library_sweep(sims):
    from batching.ui import planning

    base = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    slo = default_slo(2)
    jobs = [(n, base.with_policy(PRESETS[n]), "max_num_seqs", [8.0, 32.0, 128.0], slo) for n in ("continuous",
                                                                                                  "chunked")]
    first = planning.sweeps_cached(jobs, "Sweeping")
    for (_, sc, knob, vals, s), df in zip(jobs, first):
        pd.testing.assert_frame_equal(df, sp.with_readings(sweep(sc, knob, vals, slo=s), sc, knob))
    cold = len(sims)
    assert cold > 2 * 3 * 4  # offered load, capacity run and a capacity search of several rates per point
    # one more value: only that value's runs (two policies, one point each)
    sims.clear()
    wider = [(n, sc, k, [*v, 512.0], s) for n, sc, k, v, s in jobs]
    more = planning.sweeps_cached(wider, "Sweeping")
    assert {sc.policy.max_num_seqs for sc, _ in sims} == {512} and len(sims) < cold / 2
    for old, new in zip(first, more):
        pd.testing.assert_frame_equal(new.iloc[:3], old)
    # the same range again, or only the knee share / frontier axis changed: nothing runs
    sims.clear()
    planning.sweeps_cached(wider, "Sweeping")
    assert sims == []
    # another SLO: the runs at the offered load and at capacity are re-read, and every rate a search already
    # tried; the frames are still the library's
    tight = SLO(ttft_s=(1.2, 30.0), tpot_s=0.1)
    again = planning.sweeps_cached([(n, sc, k, v, tight) for n, sc, k, v, _ in jobs], "Sweeping")
    assert all(sc.workload.rate_req_s != 3.0 and not sat for sc, sat in sims)  # only new search rates
    assert len(sims) < cold / 2
    for (_, sc, knob, vals, _), df in zip(jobs, again):
        pd.testing.assert_frame_equal(df, sp.with_readings(sweep(sc, knob, vals, slo=tight), sc, knob))


def test_a_move_of_the_fixed_request_rate_reruns_only_each_values_offered_load(sims):
    """The capacity run (every request at t = 0) and the capacity search's rates do not depend on the sidebar's
    rate: moving it re-runs one run per value (before: the capacity runs too, keyed by the rate they ignore)."""
    from batching.ui import planning

    slo = default_slo(2)

    def jobs(rate):
        base = Scenario(workload=workload_preset("mixed", rate, 200, 0))
        return [("chunked", base.with_policy(PRESETS["chunked"]), "max_num_seqs", [16.0, 64.0], slo)]

    first = planning.sweeps_cached(jobs(3.0), "Sweeping")
    sims.clear()
    moved = planning.sweeps_cached(jobs(3.3), "Sweeping")
    assert len(sims) == 2 and not any(sat for _, sat in sims)
    assert {sc.workload.rate_req_s for sc, _ in sims} == {3.3}
    for col in ("capacity_output_tok_s", "max_rate_req_s"):  # the same capacity, read from the cached runs
        assert list(moved[0][col]) == list(first[0][col])
    sc = jobs(3.3)[0][1]
    pd.testing.assert_frame_equal(moved[0], sp.with_readings(sweep(sc, "max_num_seqs", [16.0, 64.0], slo=slo), sc,
                                                             "max_num_seqs"), check_exact=False, rtol=1e-12)


def test_one_more_point_on_the_page_runs_only_the_new_value(sims):
    """Issue 25 item 3: Points + 1 from the knob's default count keeps the points simulated and runs one new value
    per preset on the frontier (before: log spacing moved every interior value and the whole sweep ran again)."""
    at = run_page(PAGE, **FAST)
    before = last(at)
    assert len(before.values) == 8
    sims.clear()
    at.number_input(key="wid:points").set_value(9).run()
    assert_clean(at)
    after = last(at)
    new = sorted(set(after.values) - set(before.values))
    assert set(before.values) <= set(after.values) and new == [11.0]  # the geometric middle of 8 and 16
    assert sims and {sc.policy.max_num_seqs for sc, _ in sims} == {11}
    for name, df in before.frames.items():  # the old points' rows are unchanged
        kept = after.frames[name][after.frames[name]["max_num_seqs"] != 11].reset_index(drop=True)
        pd.testing.assert_frame_equal(kept, df.reset_index(drop=True))


def test_a_rate_sweep_shares_one_cached_search_and_errors_stay_per_policy(sims):
    from batching.ui import planning

    base = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    slo = default_slo(2)
    jobs = [("continuous", base.with_policy(PRESETS["continuous"]), "rate_req_s", [1.0, 4.0], slo),
            ("bad", base.with_policy(PRESETS["continuous"]), "kv_cache_tokens", [1.0, 2.0], slo)]
    df, bad = planning.sweeps_cached(jobs, "Sweeping")
    pd.testing.assert_frame_equal(df, sp.with_readings(sweep(jobs[0][1], "rate_req_s", [1.0, 4.0], slo=slo),
                                                       jobs[0][1], "rate_req_s"))
    assert isinstance(bad, str) and bad
    with pytest.raises(ValueError):  # the first sweep's error is raised (the page shows it)
        planning.sweeps_cached(jobs[::-1], "Sweeping")


def test_points_are_previewed_as_they_finish(sims, monkeypatch):
    """Issue 25 item 3: the page is handed each sweep's points as they finish (the first policy's first), every
    preview row the row of the finished sweep, and the runs are the same as without previews."""
    from batching.ui import planning

    monkeypatch.setattr(planning, "PREVIEW_S", 0.0)
    base = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    slo = default_slo(2)
    jobs = [(n, base.with_policy(PRESETS[n]), "max_num_seqs", [8.0, 32.0, 128.0], slo) for n in ("continuous",
                                                                                                  "chunked")]
    seen = []
    out = planning.sweeps_cached(jobs, "Sweeping", lambda frames, done, total: seen.append((done, total, frames)))
    assert [(d, t) for d, t, _ in seen] == [(d, 6) for d in range(1, 6)]  # each point but the last (drawn whole)
    assert list(seen[0][2]) == [0]  # the first policy's points run first
    for done, _, frames in seen:
        assert sum(len(f) for f in frames.values()) == done
        for j, f in frames.items():
            whole = out[j][out[j]["max_num_seqs"].isin(f["max_num_seqs"])].reset_index(drop=True)
            pd.testing.assert_frame_equal(f, whole, check_dtype=False)
    runs = Counter((planning.cache.scenario_token(sc), sat) for sc, sat in sims)
    planning.cache.clear()
    sims.clear()
    again = planning.sweeps_cached(jobs, "Sweeping")
    assert Counter((planning.cache.scenario_token(sc), sat) for sc, sat in sims) == runs
    for a, b in zip(out, again):
        pd.testing.assert_frame_equal(a, b)
