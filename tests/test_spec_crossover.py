"""The speculation crossover (Tune): the rate swept with speculative decoding on and off, where it stops helping
(batching/studies/spec_crossover.py), and its chart (batching/charts/spec.py). Without Streamlit; the page:
tests/test_spec_ui.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from batching.charts.spec import TITLE, WITH, WITHOUT, crossover_chart
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.engine.speculative import expected_tokens_per_step
from batching.sim.hardware.specs import deployment
from batching.studies import spec_crossover as sx

BASE = Scenario()  # the dashboard's default scenario: 2,000 requests, continuous batching, no speculation


def _speculating(**knobs) -> Scenario:
    return BASE.with_policy(with_knobs(BASE.policy, **knobs))


@pytest.fixture(scope="module")
def eagle() -> sx.SpecCrossover:
    """The default scenario, whose policy does not speculate: EAGLE K = 3, A = 0.8 against no speculation."""
    return sx.spec_crossover(BASE)


@pytest.fixture(scope="module")
def draft() -> sx.SpecCrossover:
    """A draft model with K = 4, A = 0.6: its gain turns into a loss before the capacity without it. Qwen2.5-72B at
    TP 4 (two replicas on the node), so Qwen2.5-7B drafts at TP 4 too: under TP 8 its 28 heads do not split and
    vLLM runs it at TP 1 (draft_deployment), too slow to help at any load."""
    sc = _speculating(spec_decode="draft", spec_tokens=4, spec_acceptance=0.6)
    return sx.spec_crossover(sc.with_deployment(deployment(tp=4)))


# ---------------------------------------------------------------- where a gain crosses 1


def test_crossing_interpolates_between_the_rates_around_the_first_drop_below_one():
    rate, status = sx.crossing([1, 2, 3, 4], [2.0, 1.5, 0.5, 0.4])
    assert status == sx.CROSSES and rate == pytest.approx(2.5)  # 1.5 -> 0.5: 1 is halfway
    rate, status = sx.crossing([4, 1, 3, 2], [0.4, 2.0, 0.5, 1.5])  # any order of rates
    assert status == sx.CROSSES and rate == pytest.approx(2.5)
    rate, status = sx.crossing([1, 2, 3], [1.2, 1.0, 0.8])  # exactly 1 still helps (not worse)
    assert status == sx.CROSSES and rate == pytest.approx(2.0)


def test_crossing_says_when_the_curves_do_not_cross():
    assert sx.crossing([1, 2, 3], [3.0, 2.0, 1.1]) == (None, sx.NO_CROSSING)
    assert sx.crossing([1, 2, 3], [0.9, 1.2, 0.8]) == (None, sx.NEVER_HELPS)
    assert sx.crossing([1, 2], [math.nan, math.nan]) == (None, sx.NO_DATA)
    # a rate without a gain is skipped, not read as a crossing
    rate, status = sx.crossing([1, 2, 3, 4], [2.0, math.nan, 1.0, 0.0])
    assert status == sx.CROSSES and rate == pytest.approx(3.0)


def test_crossing_with_a_tolerance_ignores_a_loss_smaller_than_it():
    assert sx.crossing([1, 2, 3], [1.0, 0.995, 0.992], tolerance=0.01) == (None, sx.NO_CROSSING)
    rate, status = sx.crossing([1, 2, 3], [1.0, 0.995, 0.97], tolerance=0.01)
    assert status == sx.CROSSES and rate == pytest.approx(2 + 0.005 / 0.025)


# ---------------------------------------------------------------- the runs


def test_the_policies_compared():
    on, off, defaulted = sx.spec_policies(PRESETS["continuous"])
    assert defaulted and (on.spec_decode, on.spec_tokens, on.spec_acceptance) == ("eagle", 3, 0.8)
    assert off.spec_decode == "off" and off == PRESETS["continuous"]
    mine = with_knobs(PRESETS["chunked"], spec_decode="ngram", spec_tokens=5, spec_acceptance=0.5)
    on, off, defaulted = sx.spec_policies(mine)
    assert not defaulted and on == mine and off == with_knobs(mine, spec_decode="off") and off.chunked_prefill
    with pytest.raises(ValueError, match="continuous batching"):
        sx.spec_policies(PRESETS["static"])


def test_runs_are_capped_at_2000_requests():
    big = BASE.with_workload(BASE.workload.with_num_requests(5000))
    assert sx.capped(big).workload.num_requests == sx.MAX_REQUESTS == 2000
    small = BASE.with_workload(BASE.workload.with_num_requests(300))
    assert sx.capped(small) == small
    on, off, _ = sx.crossover_scenarios(big)
    assert on.workload.num_requests == off.workload.num_requests == 2000


def test_eagle_at_low_load_cuts_tpot_and_both_curves_come_back(eagle):
    df = eagle.frame
    assert list(df.columns) == list(sx.COLUMNS) and len(df) == sx.POINTS == 7
    assert eagle.defaulted and eagle.method() == "EAGLE, K = 3, A = 0.8"
    assert eagle.num_requests == 2000
    # the rates: 10 % to 100 % of the capacity without speculation, increasing
    rates = df["rate_req_s"].to_numpy()
    assert np.all(np.diff(rates) > 0)
    assert rates[0] == pytest.approx(0.10 * eagle.capacity_off_req_s)
    assert rates[-1] == pytest.approx(1.0 * eagle.capacity_off_req_s)
    assert df["load"].to_numpy() == pytest.approx(np.linspace(0.1, 1.0, 7))
    # both curves, every point measured
    for col in sx.COLUMNS:
        assert np.isfinite(df[col]).all(), col
    # the finding: at low load EAGLE K = 3, A = 0.8 cuts TPOT by at least 1.5x (a verification emits
    # (1 - 0.8^4) / 0.2 = 2.95 tokens on average for little more than a decode step's time)
    gain = df["tpot_gain"].iloc[0]
    assert gain == pytest.approx(df["tpot_p50_s_off"].iloc[0] / df["tpot_p50_s_on"].iloc[0])
    assert 1.5 <= gain < expected_tokens_per_step(3, 0.8)
    # at light load both serve what is offered: throughputs within a few % of each other
    assert df["throughput_ratio"].iloc[0] == pytest.approx(1.0, abs=0.03)
    # each point is the run it says: the rate's run without speculation, simulated again
    sc = eagle.scenario_off.with_workload(eagle.scenario_off.workload.with_rate(rates[0]))
    assert simulate(sc).summary()["tpot_p50_s"] == pytest.approx(df["tpot_p50_s_off"].iloc[0])


def test_eagle_on_the_default_scenario_does_not_cross_within_the_range(eagle):
    # the default scenario (Qwen2.5-72B on 8 H100, chat lengths): EAGLE still wins at the capacity without it,
    # and its own capacity is higher; the sentence says the curves do not cross, with the range
    assert (eagle.status, eagle.crossover_req_s) == (sx.NO_CROSSING, None)
    assert (eagle.frame["tpot_gain"] > 1).all()
    assert eagle.capacity_on_req_s > eagle.capacity_off_req_s
    lo, hi = eagle.rates[0], eagle.rates[-1]
    assert f"do not cross between {lo:,.3g} and {hi:,.3g} req/s" in eagle.sentence()


def test_a_draft_model_stops_helping_before_the_capacity_without_it(draft):
    df = draft.frame
    assert not draft.defaulted and draft.method() == "draft model qwen2.5-7b, K = 4, A = 0.6"
    assert draft.status == sx.CROSSES
    gain = df["tpot_gain"].to_numpy()
    assert gain[0] > 1 and gain[-1] < 1
    # the crossover lies between the last rate where speculation helps and the first where it does not, where the
    # straight line between their gains reaches 1
    i = int(np.flatnonzero(gain < 1)[0])
    r0, r1 = df["rate_req_s"].iloc[i - 1], df["rate_req_s"].iloc[i]
    assert r0 < draft.crossover_req_s < r1
    assert np.interp(draft.crossover_req_s, [r0, r1], [gain[i - 1], gain[i]]) == pytest.approx(1.0)
    assert f"stops helping at about {draft.crossover_req_s:,.3g} req/s" in draft.sentence()
    # flat out the draft model costs capacity: below the run without it
    assert draft.capacity_on_tok_s < draft.capacity_off_tok_s


def test_progress_counts_every_run_and_summarize_sees_each_once():
    calls, ticks = [], []

    def summarize(sc, saturated):
        calls.append((sc, saturated))
        return simulate(sc, saturated=saturated).summary()

    small = BASE.with_workload(BASE.workload.with_num_requests(300))
    study = sx.spec_crossover(small, points=3, summarize=summarize, progress=lambda d, t, _: ticks.append((d, t)))
    assert len(calls) == 2 + 2 * 3 and len(set(calls)) == len(calls)  # no run twice
    assert [saturated for _, saturated in calls].count(True) == 2
    assert {sc.policy.spec_decode for sc, _ in calls} == {"off", "eagle"}
    assert ticks == [(d, 8) for d in range(1, 9)]
    assert len(study.frame) == 3 and study.num_requests == 300


def test_points_outside_the_allowed_range_are_refused():
    with pytest.raises(ValueError, match="points"):
        sx.crossover_rates({"throughput_req_s": 5.0}, points=sx.MAX_POINTS + 1)
    with pytest.raises(ValueError, match="no capacity"):
        sx.crossover_rates({"throughput_req_s": float("nan")})


# ---------------------------------------------------------------- the chart


def _shapes(fig) -> list:
    return [s for s in fig.layout.shapes if s.name == "crossover"]


def test_the_chart_draws_both_curves_in_both_panels_with_units(eagle):
    fig = crossover_chart(eagle)
    assert fig.layout.title.text == TITLE
    assert [t.name for t in fig.data] == [WITH, WITH, WITHOUT, WITHOUT]
    assert [t.showlegend is not False for t in fig.data] == [True, False, True, False]
    df = eagle.frame
    by = {(t.name, t.yaxis): np.asarray(t.y, float) for t in fig.data}
    assert by[(WITH, "y")] == pytest.approx(df["tpot_p50_s_on"].to_numpy() * 1e3)  # ms
    assert by[(WITHOUT, "y")] == pytest.approx(df["tpot_p50_s_off"].to_numpy() * 1e3)
    assert by[(WITH, "y2")] == pytest.approx(df["throughput_output_tok_s_on"].to_numpy())
    assert by[(WITHOUT, "y2")] == pytest.approx(df["throughput_output_tok_s_off"].to_numpy())
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "Offered request rate (req/s)"
    assert fig.layout.yaxis.title.text == "TPOT P50 (ms, log scale)" and fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis2.title.text == "Output throughput (tok/s)"
    # no crossing: no marker, the subtitle says so
    assert not _shapes(fig) and "do not cross" in fig.layout.title.subtitle.text


def test_the_chart_marks_the_crossover_in_both_panels(draft):
    fig = crossover_chart(draft)
    shapes = _shapes(fig)
    assert [(s.xref, s.x0, s.x1) for s in shapes] == [("x", draft.crossover_req_s, draft.crossover_req_s),
                                                       ("x2", draft.crossover_req_s, draft.crossover_req_s)]
    notes = [a for a in fig.layout.annotations if a.name == "crossover"]
    assert len(notes) == 1 and notes[0].text == f"crossover: {draft.crossover_req_s:,.3g} req/s"
    assert "stops helping" in fig.layout.title.subtitle.text


# ---------------------------------------------------------------- capacity within the SLOs (issue 39 item 4)


def _fake_summary(sc, saturated):
    """A summary without simulating: speculation halves TPOT, capacity 10 req/s without it and 12 with."""
    on = sc.policy.spec_decode != "off"
    return {"throughput_req_s": 12.0 if on else 10.0, "tpot_p50_s": 0.02 if on else 0.04,
            "throughput_output_tok_s": 1000.0}


def test_the_crossover_leads_with_capacity_within_the_slos_with_and_without_speculation():
    from batching.studies.capacity import SLO

    slo = SLO(tpot_s=0.05)
    seen, ticks = [], []

    def within(sc):  # the caller's cached search: TPOT-bound, so speculation serves more within it
        seen.append(sc.policy.spec_decode)
        return 7.5 if sc.policy.spec_decode != "off" else 5.0

    study = sx.spec_crossover(BASE, points=2, summarize=_fake_summary, slo=slo, slo_capacity=within,
                              progress=lambda d, t, _: ticks.append((d, t)))
    assert sorted(seen) == ["eagle", "off"]
    assert (study.slo_capacity_on_req_s, study.slo_capacity_off_req_s) == (7.5, 5.0)
    assert study.slo_gain == pytest.approx(1.5)
    assert ticks[-1] == (2 + 2 * 2 + 2, 2 + 2 * 2 + 2)  # both searches count
    text = study.sentence()
    assert text.startswith(f"Capacity within the SLOs ({slo.describe()}): 7.5 req/s with speculation, 5 without; "
                           "speculation (EAGLE, K = 3, A = 0.8) pays: 1.50× the capacity.")
    assert "TPOT P50" in text  # the TPOT view follows as the second reading


def test_speculation_that_costs_capacity_within_the_slos_is_said_so():
    from batching.studies.capacity import SLO

    study = sx.spec_crossover(BASE, points=2, summarize=_fake_summary, slo=SLO(ttft_s=1.0),
                              slo_capacity=lambda sc: 4.0 if sc.policy.spec_decode != "off" else 5.0)
    assert "costs capacity: 0.80× without it" in study.slo_sentence()
    assert study.sentence().startswith("Capacity within the SLOs")


def test_without_an_slo_the_crossover_reads_tpot_only():
    study = sx.spec_crossover(BASE, points=2, summarize=_fake_summary)
    assert study.slo_capacity_on_req_s is None and study.slo_sentence() == ""
    assert study.sentence() == study.tpot_sentence()


def test_the_default_speculation_takes_the_published_acceptance_of_the_model_s_family():
    from batching.sim.engine.speculative import acceptance_from_length

    llama = BASE.with_deployment(deployment(model="llama-3.1-70b"))
    on, _, defaulted = sx.crossover_scenarios(llama, workload="chat")
    assert defaulted and on.policy.spec_acceptance == pytest.approx(acceptance_from_length(3.53, 7))
    study = sx.spec_crossover(llama, points=2, summarize=_fake_summary, workload="chat")
    assert study.method() == "EAGLE, K = 3, A = 0.743"
    assert "#26191" in study.acceptance_text()
    # a family without a row keeps the flat default, and says so
    on, _, _ = sx.crossover_scenarios(BASE, workload="chat")
    assert on.policy.spec_acceptance == 0.8 and "no published row" in on.policy.spec_acceptance_source
