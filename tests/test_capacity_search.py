"""The capacity search's rate bracket (``capacity.bracket_and_bisect``) and its runs without a step table."""
import math

import numpy as np
import pandas as pd
import pytest

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset
from batching.studies.capacity import (CEILING_REACH, FIRST_GUESS, FLOOR, MAX_ITER, REL_TOL, bracket_and_bisect,
                                       default_slo, slo_point, slo_reading)

CEILING = 8.0
# capacity within the default SLOs / the saturated run's requests/s on the Tune page's default sweeps (every knob's
# default range, every preset that uses it; measured with the search before this one)
TUNE_RATIOS = (0.529, 0.651, 0.769, 0.865, 0.907, 0.811, 0.756, 0.743, 0.533, 0.651, 0.769, 0.840, 0.743, 0.685,
               0.680, 0.680, 0.916, 0.924, 0.941, 0.983, 1.083, 0.991, 0.983, 0.983, 0.471, 0.571, 0.626, 0.685,
               0.777, 0.798, 0.785, 0.941, 0.907, 0.916, 1.033, 1.058, 1.099, 0.404, 0.504, 0.680, 0.773, 0.848,
               0.815, 0.811, 0.811)


def _search(threshold: float, known=(), estimate: float | None = None):
    """Every rate at or below ``threshold`` passes; returns (points tried, highest passing rate or None)."""
    tried = []

    def probe(rate: float) -> dict:
        p = {"rate_req_s": rate, "ok": rate <= threshold}
        tried.append(p)
        return p

    bracket_and_bisect(probe, lambda p: p["ok"], CEILING, FIRST_GUESS * CEILING if estimate is None else estimate,
                       list(known))
    passing = [p["rate_req_s"] for p in [*known, *tried] if p["ok"]]
    return tried, (max(passing) if passing else None)


@pytest.mark.parametrize("ratio", [0.02, 0.05, 0.2, 0.4, 0.5, 0.75, 0.7501, 0.9, 1.0, 1.05, 1.3, 4.0, 100.0])
def test_the_search_ends_within_its_tolerance_below_the_boundary(ratio):
    threshold = ratio * CEILING
    tried, best = _search(threshold)
    assert best is not None and threshold * (1 - REL_TOL) <= best <= threshold, (ratio, best)
    assert len(tried) <= MAX_ITER
    assert len({p["rate_req_s"] for p in tried}) == len(tried)  # no rate simulated twice


def test_below_the_floor_nothing_passes_and_above_the_reach_the_top_does():
    tried, best = _search(0.5 * CEILING / FLOOR)
    assert best is None and min(p["rate_req_s"] for p in tried) == pytest.approx(CEILING / FLOOR)
    tried, best = _search(10 * CEILING * CEILING_REACH)
    assert best == pytest.approx(CEILING * CEILING_REACH) and len(tried) <= MAX_ITER


def test_it_runs_fewer_rates_than_the_old_bracket_on_the_tune_pages_sweeps():
    """The old search probed ceiling / 4 and 1.05 x ceiling, then bisected: 9.6 rates on average on these
    boundaries (the capacity runs it was measured on); starting at 0.75 x the ceiling: fewer than 7.5."""
    counts = [len(_search(r * CEILING)[0]) for r in TUNE_RATIOS]
    assert np.mean(counts) < 7.5 and max(counts) <= 10, counts


def test_known_points_that_bracket_closely_run_nothing_more():
    known = [{"rate_req_s": 5.0, "ok": True}, {"rate_req_s": 5.04, "ok": False}]
    tried, best = _search(5.02, known=known, estimate=5.01)
    assert tried == [] and best == 5.0
    # a wider known bracket is bisected, not widened
    known = [{"rate_req_s": 4.0, "ok": True}, {"rate_req_s": 6.0, "ok": False}]
    tried, best = _search(5.3, known=known, estimate=5.0)
    assert all(4.0 < p["rate_req_s"] < 6.0 for p in tried) and 5.3 * (1 - REL_TOL) <= best <= 5.3


# --- a search's runs skip the step table ------------------------------------------------------------------


def _scenario(rate: float = 3.0) -> Scenario:
    return Scenario(workload=workload_preset("mixed", rate, 200, 4), policy=PRESETS["chunked"])


def test_a_run_without_its_step_table_has_the_same_requests_and_latencies():
    sc = _scenario()
    full, lean = simulate(sc), simulate(sc, steps=False)
    assert lean.steps is None and len(full.steps) > 0
    pd.testing.assert_frame_equal(full.requests, lean.requests)
    fs, ls = full.summary(), lean.summary()
    assert "gpu_util" in fs and "gpu_util" not in ls and "num_steps" not in ls
    for k, v in ls.items():  # every figure it has is the full run's
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(fs[k]), k
        else:
            assert fs[k] == v, k
    slo = default_slo(len(lean.class_names))
    assert slo_point(sc, slo) == slo_reading(full, slo)


def test_a_probe_reading_reuses_the_pages_reading_and_never_stands_in_for_it(monkeypatch):
    from batching.ui import cache

    calls = []
    real = cache.simulate

    def counted(scenario, saturated=False, steps=True):
        calls.append(steps)
        return real(scenario, saturated=saturated, steps=steps)

    monkeypatch.setattr(cache, "simulate", counted)
    cache.clear()
    try:
        sc = _scenario(2.5)
        probe = cache.probe_reading(sc)
        assert calls == [False] and "gpu_util" not in probe.summary()
        assert cache.probe_reading(sc) is probe and calls == [False]  # kept
        page = cache.reading(sc, False)  # the page's reading is a full run, not the probe's
        assert calls == [False, True] and "gpu_util" in page.summary()
        other = _scenario(3.5)
        full = cache.reading(other, False)
        assert cache.probe_reading(other) is full and calls == [False, True, True]  # a stored reading serves it
    finally:
        cache.clear()
