"""Speculative decoding on the dashboard: its knobs on Explore and Compare, read from and written to the URL;
its segments on Explore's timeline and batch composition (drafting apart from verification, rejected draft tokens
apart from accepted ones); and Tune's speculation crossover view."""
from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))

from uihelpers import FAST, assert_clean, chart, chart_titles, data_traces, run_page  # noqa: E402

from batching.charts import policy as charts  # noqa: E402
from batching.charts.spec import TITLE as CROSSOVER_TITLE  # noqa: E402
from batching.charts.spec import WITH, WITHOUT  # noqa: E402
from batching.sim.policy import with_knobs  # noqa: E402
from batching.sim.simulate import Scenario, simulate  # noqa: E402
from batching.studies import spec_crossover as sx  # noqa: E402

EXPLORE, COMPARE, TUNE = "pages/explore.py", "pages/compare.py", "pages/tune.py"


def test_explore_reads_the_speculation_knobs_from_the_link():
    at = run_page(EXPLORE, spec="eagle", spec_k="4", spec_a="70", spec_off="32", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:spec").value == "eagle"
    assert at.slider(key="wid:spec_k").value == 4 and not at.slider(key="wid:spec_k").disabled
    assert at.slider(key="wid:spec_a").value == 70
    assert at.selectbox(key="wid:spec_model").disabled  # only the draft method reads the draft model
    run, _ = at.session_state["explore_last"]
    p = run.policy
    assert (p.spec_decode, p.spec_tokens, p.spec_acceptance, p.spec_disable_batch_size) == ("eagle", 4, 0.7, 32)


def test_explore_writes_the_speculation_knobs_to_the_link():
    at = run_page(EXPLORE, **FAST)
    assert_clean(at)
    assert at.slider(key="wid:spec_k").disabled  # speculation off: its knobs are greyed out
    at.selectbox(key="wid:spec").set_value("draft").run()
    at.slider(key="wid:spec_a").set_value(60).run()
    assert_clean(at)
    assert (at.query_params["spec"], at.query_params["spec_a"]) == ("draft", "60")
    assert not at.selectbox(key="wid:spec_model").disabled
    run, label = at.session_state["explore_last"]
    assert (run.policy.spec_decode, run.policy.spec_acceptance) == ("draft", 0.6) and label.endswith("*")


def test_explore_takes_the_published_acceptance_until_the_slider_moves():
    """Issue 39 item 4: speculation with the acceptance slider at its default runs at the published acceptance of
    the model's family, and a caption says method, K, acceptance and its source; a moved slider is the user's."""
    from batching.sim.engine.speculative import acceptance_from_length
    from batching.ui.safe import unescape

    at = run_page(EXPLORE, model="llama-3.1-8b", tp="1", workload="chat", spec="eagle", **FAST)
    assert_clean(at)
    run, _ = at.session_state["explore_last"]
    assert run.policy.spec_acceptance == pytest.approx(acceptance_from_length(3.53, 7))
    text = " ".join(unescape(c.value) for c in at.caption)
    assert "Speculation: EAGLE, K = 3, A = 0.743 (2.71 tokens per verification); acceptance published:" in text
    assert "#26191" in text and "stands for this published value" in text
    at = run_page(EXPLORE, model="llama-3.1-8b", tp="1", spec="eagle", spec_a="60", **FAST)
    assert_clean(at)
    run, _ = at.session_state["explore_last"]
    assert run.policy.spec_acceptance == 0.6
    assert any("acceptance given: A = 0.6" in unescape(c.value) for c in at.caption)


def test_compare_slot_speculates():
    at = run_page(COMPARE, b_spec="ngram", b_spec_a="50", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:b_spec").value == "ngram"
    assert at.query_params["b_spec"] == "ngram"
    # slot A runs dynamic batching (request-level): no speculation knob
    assert "wid:a_spec" not in [e.key for e in at.selectbox]


# ---------------------------------------------------------------- Explore's charts: the speculation segments

BASE = Scenario()
SMALL = BASE.with_workload(BASE.workload.with_num_requests(200))


@pytest.fixture(scope="module")
def runs():
    """The same 200 requests without speculation and with EAGLE K = 3, A = 0.8."""
    on = SMALL.with_policy(with_knobs(SMALL.policy, spec_decode="eagle", spec_tokens=3, spec_acceptance=0.8))
    return simulate(SMALL), simulate(on)


def _segments(fig, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, row) of every segment of the trace called ``name`` (x: start, end, NaN per segment)."""
    (trace,) = [t for t in fig.data if t.name == name]
    x, y = np.asarray(trace.x, float), np.asarray(trace.y, float)
    assert np.isnan(x[2::3]).all() and np.isnan(y[2::3]).all()  # NaN breaks, one trace for every segment
    assert (y[0::3] == y[1::3]).all()
    return x[0::3], x[1::3], y[0::3]


def test_timeline_draws_drafting_apart_from_verification(runs):
    _, res = runs
    steps = res.steps
    fig = charts.request_timeline(res.requests, res.class_names, max_points=charts.TIMELINE_POINT_BUDGET,
                                  steps=steps)
    names = [t.name for t in fig.data]
    # one trace per segment kind, after the requests' traces
    assert names[-2:] == [charts.SPEC_DRAFTING, charts.SPEC_VERIFYING] == ["drafting",
                                                                           "verification (target forward pass)"]
    assert names.count("drafting") == 1
    d0, d1, drow = _segments(fig, "drafting")
    v0, v1, vrow = _segments(fig, charts.SPEC_VERIFYING)
    # seconds, like the x axis: the drafting segments add up to the run's drafting time, the verification ones to
    # the rest of the forward passes (more steps than the budget: packed per time bin, float32 coordinates)
    assert len(steps) > charts.SPEC_SEGMENTS_MAX and len(d0) <= charts.SPEC_SEGMENTS_MAX
    assert steps["draft_s"].sum() > 0
    assert (d1 - d0).sum() == pytest.approx(steps["draft_s"].sum(), rel=1e-3)
    assert (v1 - v0).sum() == pytest.approx((steps["duration_s"] - steps["draft_s"]).sum(), rel=1e-3)
    assert set(drow) == set(vrow) == {-2.0}  # one replica: a row below request 0, one row apart
    assert fig.layout.xaxis.title.text == "Simulated time (s)"
    assert "forward passes" in fig.layout.yaxis.title.text
    assert "drafting" in fig.layout.title.text and "bottom row: forward passes" in fig.layout.title.subtitle.text
    assert fig.layout.yaxis.range[0] == pytest.approx(-2.5)  # the opening view shows the row


def test_timeline_draws_each_step_when_few(runs):
    _, res = runs
    steps = res.steps.iloc[:300]
    segments, note = charts.spec_step_segments(steps)
    d0, d1, _ = segments["drafting"]
    v0, v1, _ = segments["verification"]
    spec = steps[steps["draft_s"] > 0]
    # one drafting segment per drafting step, from its start; its verification right after, to its end
    assert d0 == pytest.approx(spec["start_s"].to_numpy()) and d1 - d0 == pytest.approx(spec["draft_s"].to_numpy())
    assert v1 == pytest.approx((steps["start_s"] + steps["duration_s"]).to_numpy())
    assert (d1 - d0).sum() == pytest.approx(steps["draft_s"].sum(), rel=1e-12)
    assert "apart from verification" in note
    fig = charts.request_timeline(res.requests, res.class_names, steps=steps)
    f0, f1, _ = _segments(fig, "drafting")
    assert (f1 - f0).sum() == pytest.approx(steps["draft_s"].sum(), rel=1e-9)  # float64: sub-ms segments exact


def test_no_speculation_no_extra_traces(runs):
    off, _ = runs
    assert not charts.has_spec(off.steps)
    plain = charts.request_timeline(off.requests, off.class_names, max_points=charts.TIMELINE_POINT_BUDGET)
    given = charts.request_timeline(off.requests, off.class_names, max_points=charts.TIMELINE_POINT_BUDGET,
                                    steps=off.steps)
    assert [t.name for t in given.data] == [t.name for t in plain.data]
    assert given.layout.title.text == plain.layout.title.text == "Request timeline: queued, prefill, decode"
    comp = charts.batch_composition(off.steps)
    assert [t.name for t in comp.data] == ["prefill tokens", "padded slots", "decode tokens"]


def test_batch_composition_shows_rejected_draft_tokens_apart_from_accepted(runs):
    _, res = runs
    steps = res.steps.iloc[:1000]  # few steps, one replica: one value per step
    fig = charts.batch_composition(steps)
    by = {t.name: t for t in fig.data}
    assert list(by) == ["prefill tokens", "padded slots", "decode tokens (1 per sequence)", charts.SPEC_ACCEPTED,
                        charts.SPEC_REJECTED]
    assert charts.SPEC_REJECTED == "rejected draft tokens"
    # the lower panel, stacked: the target's own tokens, the accepted drafts, the rejected ones
    assert {by[n].yaxis for n in list(by)[2:]} == {"y2"} and len({by[n].stackgroup for n in list(by)[2:]}) == 1
    assert by[charts.SPEC_REJECTED].fillcolor != by[charts.SPEC_ACCEPTED].fillcolor

    def per_step(name: str) -> np.ndarray:
        # the step outline's value at each step's start (x: the steps' starts, then gap ends)
        x, y = np.asarray(by[name].x, float), np.asarray(by[name].y, float)
        idx = np.searchsorted(x, steps["start_s"].to_numpy(np.float32).astype(float))
        return y[idx]

    rejected = (steps["spec_proposed"] - steps["spec_accepted"]).to_numpy(float)
    assert rejected.sum() > 0
    assert per_step(charts.SPEC_REJECTED) == pytest.approx(rejected)
    assert per_step(charts.SPEC_ACCEPTED) == pytest.approx(steps["spec_accepted"].to_numpy(float))
    own = per_step("decode tokens (1 per sequence)")
    assert own + per_step(charts.SPEC_ACCEPTED) == pytest.approx(steps["decode_tokens"].to_numpy(float))
    # the rejected drafts leave the padded slots (the engine counts them there): nothing else is padded here
    assert per_step("padded slots") == pytest.approx(np.zeros(len(steps)))
    assert fig.layout.yaxis2.title.text == "Tokens per step" and fig.layout.xaxis2.title.text == "Simulated time (s)"


def test_explore_batch_composition_shows_the_rejected_draft_tokens():
    at = run_page(EXPLORE, spec="eagle", **FAST)
    assert_clean(at)
    names = [t.get("name") for t in data_traces(chart(at, "Batch composition"))]
    assert charts.SPEC_ACCEPTED in names and charts.SPEC_REJECTED in names


# ---------------------------------------------------------------- Tune: the speculation crossover view


def _values(v) -> list[float]:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float).tolist()
    return [float(e) for e in v]


def test_tune_crossover_view():
    at = run_page(TUNE, **FAST)
    assert_clean(at)
    assert at.radio(key="wid:view").value == "sweep" and "view" not in at.query_params
    at.radio(key="wid:view").set_value("spec").run()
    assert_clean(at)
    assert at.query_params["view"] == "spec"
    assert chart_titles(at) == [CROSSOVER_TITLE]
    study = at.session_state["tune_spec_last"]
    assert isinstance(study, sx.SpecCrossover) and study.defaulted and study.num_requests == 200
    assert study.method() == "EAGLE, K = 3, A = 0.8" and study.frame["tpot_gain"].iloc[0] > 1
    spec = chart(at, "Speculation crossover")
    traces = data_traces(spec)
    assert [t["name"] for t in traces] == [WITH, WITH, WITHOUT, WITHOUT]
    tpot_on = _values(traces[0]["y"])
    assert tpot_on == pytest.approx((study.frame["tpot_p50_s_on"] * 1e3).tolist())
    assert len(tpot_on) == sx.POINTS
    assert at.info[0].value == study.sentence()
    assert any(c.value.startswith("Each point is one run of 200 requests") for c in at.caption)
    # issue 39 item 4: the verdict is the capacity within the SLOs with and without speculation, TPOT second
    assert study.slo_capacity_on_req_s > 0 and study.slo_capacity_off_req_s > 0
    assert study.sentence().startswith("Capacity within the SLOs (")
    assert [m.label for m in at.metric] == ["Capacity within the SLOs, with (req/s)", "Without (req/s)",
                                            "With / without"]
    # method, K, acceptance and where the acceptance comes from (no row for Qwen2.5: the flat default, said so)
    assert any(c.value.startswith("Speculation: EAGLE, K = 3, A = 0.8") and "no published row" in c.value
               for c in at.caption)


def test_tune_crossover_view_from_the_link_with_the_user_s_speculation():
    at = run_page(TUNE, view="spec", t_spec="ngram", t_spec_k="5", t_spec_a="50", x_points="4", **FAST)
    assert_clean(at)
    study = at.session_state["tune_spec_last"]
    assert not study.defaulted and study.method() == "n-gram, K = 5, A = 0.5" and len(study.frame) == 4
    assert study.scenario_off.policy.spec_decode == "off"
    assert at.number_input(key="wid:x_points").value == 4


def test_timeline_gives_each_replica_its_own_row():
    from dataclasses import replace

    dep = SMALL.deployment
    two = SMALL.with_deployment(replace(dep, node=replace(dep.node, tp=4)))  # 8 GPUs, TP 4: two replicas
    res = simulate(two.with_policy(with_knobs(two.policy, spec_decode="eagle")))
    steps = res.steps
    assert steps["replica"].nunique() == 2
    segments, note = charts.spec_step_segments(steps)
    x0, x1, row = segments["drafting"]
    assert set(row) == {-2.0, -3.0} and "bottom rows: each replica's forward passes" in note
    for r, y in ((0, -2.0), (1, -3.0)):
        mine = row == y
        assert (x1[mine] - x0[mine]).sum() == pytest.approx(steps.loc[steps["replica"] == r, "draft_s"].sum())
    fig = charts.request_timeline(res.requests, res.class_names, max_points=charts.TIMELINE_POINT_BUDGET,
                                  steps=steps)
    if len(res.requests) > charts.TIMELINE_WINDOW:
        assert fig.layout.yaxis.range[0] == pytest.approx(-3.5)
