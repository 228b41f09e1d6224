"""Arrival processes as bursty as production: every kind keeps the mean rate, ``with_rate`` scales every kind,
the diurnal profile swings between its trough and peak, and ``with_arrivals`` swaps the process."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batching.sim.workload.requests import ARRIVAL_KINDS, ArrivalProcess, SyntheticWorkload, workload_preset

N = 100_000


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _rate(t: np.ndarray) -> float:
    return (t.size - 1) / (t[-1] - t[0])


PROCESSES = [
    ArrivalProcess("poisson", 8.0),
    ArrivalProcess("gamma", 8.0, cv=4.0),
    ArrivalProcess("constant", 8.0),
    ArrivalProcess("onoff", 8.0, on_s=5.0, off_s=15.0),
    ArrivalProcess("diurnal", 8.0, peak_to_trough=3.0, period_s=600.0),  # ~21 whole periods
]


def test_every_kind_is_covered() -> None:
    assert set(ARRIVAL_KINDS) == {p.kind for p in PROCESSES}


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.kind)
def test_same_rate_same_mean_rate(process: ArrivalProcess) -> None:
    t = process.times(_rng(), N)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    assert _rate(t) == pytest.approx(8.0, rel=0.03)


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.kind)
def test_with_rate_scales_every_kind(process: ArrivalProcess) -> None:
    w = SyntheticWorkload(arrivals=process, num_requests=N, seed=5)
    fast = w.with_rate(24.0).generate()
    slow = w.generate()
    assert fast.mean_rate_req_s == pytest.approx(24.0, rel=0.03)
    assert fast.mean_rate_req_s / slow.mean_rate_req_s == pytest.approx(3.0, rel=0.04)
    np.testing.assert_array_equal(fast.prompt_tokens, slow.prompt_tokens)  # lengths are the arrival-free streams
    if process.kind != "onoff":  # a pure change of time unit (on/off periods stay in seconds)
        np.testing.assert_allclose(fast.arrival_s * 3.0, slow.arrival_s, rtol=1e-9, atol=1e-9)


def test_with_rate_rescales_the_diurnal_cycle_with_the_run() -> None:
    w = SyntheticWorkload(arrivals=ArrivalProcess("diurnal", 2.0, peak_to_trough=3.0, period_s=1000.0),
                          num_requests=2000, seed=1)  # one whole cycle: 2,000 requests at 2 req/s
    fast = w.with_rate(8.0)
    assert (fast.arrivals.period_s, fast.arrivals.peak_to_trough, fast.arrivals.rate_req_s) == (250.0, 3.0, 8.0)
    assert fast.generate().mean_rate_req_s == pytest.approx(8.0, rel=0.1)
    assert w.with_rate(2.0) == w
    with pytest.raises(ValueError, match=r"rate_req_s=0.001 stretches the diurnal period_s=1000 \(at 2 req/s\) to "
                                         r"2,000,000 s; allowed up to 604,800 s"):
        w.with_rate(0.001)


def test_diurnal_swings_between_trough_and_peak() -> None:
    period = 1000.0
    t = ArrivalProcess("diurnal", 10.0, peak_to_trough=3.0, period_s=period).times(_rng(1), 400_000)
    phase = (t % period) / period
    whole = t < period * math.floor(t[-1] / period)  # whole periods only
    counts, _ = np.histogram(phase[whole], bins=20, range=(0, 1))
    # rate(t) = mean * (1 - a cos(2 pi t / period)), a = (3 - 1) / (3 + 1): trough at 0, peak at half a period
    trough, peak = counts[[0, -1]].mean(), counts[9:11].mean()
    assert peak / trough == pytest.approx(3.0, rel=0.1)  # bins 1/20 wide: the means there are ~2 % in
    assert _rate(t[whole]) == pytest.approx(10.0, rel=0.01)


def test_diurnal_without_a_swing_is_poisson_and_rescales_its_unit_stream() -> None:
    flat = ArrivalProcess("diurnal", 4.0, peak_to_trough=1.0).times(_rng(2), 1000)
    np.testing.assert_allclose(flat, ArrivalProcess("poisson", 4.0).times(_rng(2), 1000), rtol=1e-12)
    a = ArrivalProcess("diurnal", 4.0, period_s=100.0).times(_rng(3), 5000)
    b = ArrivalProcess("diurnal", 4.0, period_s=100.0).times(_rng(3), 5000)
    np.testing.assert_array_equal(a, b)
    # time rescaling: the cumulative rate at each arrival is the unit stream, whatever the rate
    for rate in (4.0, 40.0):
        t = ArrivalProcess("diurnal", rate, peak_to_trough=5.0, period_s=100.0).times(_rng(3), 5000)
        a_ = (5.0 - 1) / (5.0 + 1)
        w = 2 * math.pi / 100.0
        unit = rate * (t - a_ / w * np.sin(w * t))
        expected = np.concatenate(([0.0], np.cumsum(_rng(3).standard_exponential(4999))))
        np.testing.assert_allclose(unit, expected, rtol=1e-9, atol=1e-6)


def test_burstiness_raises_gap_variation_at_equal_rate() -> None:
    cvs = []
    for cv in (1.0, 2.0, 4.0):
        t = ArrivalProcess("gamma", 5.0, cv=cv).times(_rng(4), N)
        gaps = np.diff(t)
        cvs.append(gaps.std() / gaps.mean())
        assert _rate(t) == pytest.approx(5.0, rel=0.04)
    assert cvs[0] == pytest.approx(1.0, rel=0.05) and cvs[1] < cvs[2] and cvs[2] == pytest.approx(4.0, rel=0.1)


def test_with_arrivals() -> None:
    w = workload_preset("chat", 3.0, 500, 1)
    g = w.with_arrivals("gamma", cv=4.0)
    assert g.arrivals == ArrivalProcess("gamma", 3.0, cv=4.0)
    d = w.with_arrivals("diurnal", peak_to_trough=2.0, period_s=3600.0)
    assert (d.arrivals.kind, d.arrivals.rate_req_s, d.arrivals.peak_to_trough, d.arrivals.period_s) == (
        "diurnal", 3.0, 2.0, 3600.0)
    np.testing.assert_array_equal(d.generate().prompt_tokens, w.generate().prompt_tokens)
    with pytest.raises(ValueError, match=r"with_arrivals got burst; allowed: cv, on_s, off_s, peak_to_trough"):
        w.with_arrivals("gamma", burst=2.0)
    with pytest.raises(ValueError, match=r"kind='weekly' is not allowed; allowed: poisson, gamma, constant, onoff"):
        w.with_arrivals("weekly")
    with pytest.raises(ValueError, match=r"peak_to_trough=0.5 is out of range; allowed 1 to 100"):
        w.with_arrivals("diurnal", peak_to_trough=0.5)
    with pytest.raises(ValueError, match=r"period_s=0 is out of range; allowed > 0 to 604800"):
        w.with_arrivals("diurnal", period_s=0)
    with pytest.raises(ValueError, match=r"cv=0 is out of range"):
        w.with_arrivals("gamma", cv=0)


def test_sessions_start_by_the_arrival_process() -> None:
    w = workload_preset("chat-sessions", 4.0, 20_000, 0)
    bursty = w.with_arrivals("gamma", cv=4.0).generate()
    first = bursty.after < 0
    gaps = np.diff(bursty.arrival_s[first])
    assert gaps.std() / gaps.mean() > 3.0  # the session starts are the gamma process
    smooth = w.generate()
    gaps = np.diff(smooth.arrival_s[smooth.after < 0])
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)
