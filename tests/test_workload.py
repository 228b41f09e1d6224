"""Synthetic workloads: determinism, distributions, arrival processes, validation."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from batching.sim.workload.requests import (
    DEFAULT_CLASSES,
    WORKLOAD_PRESETS,
    ArrivalProcess,
    LengthDist,
    PriorityClass,
    Requests,
    SyntheticWorkload,
    workload_preset,
)

N = 20_000


def _arrays(r: Requests) -> tuple[np.ndarray, ...]:
    return r.arrival_s, r.prompt_tokens, r.output_tokens, r.priority


def test_same_seed_gives_identical_arrays() -> None:
    a = SyntheticWorkload(num_requests=3000, seed=11).generate()
    b = SyntheticWorkload(num_requests=3000, seed=11).generate()
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.class_names == b.class_names == ("interactive chat", "batch analysis")


def test_different_seeds_differ() -> None:
    a = SyntheticWorkload(num_requests=3000, seed=1).generate()
    b = SyntheticWorkload(num_requests=3000, seed=2).generate()
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        assert not np.array_equal(x, y)


def test_dtypes_and_invariants() -> None:
    r = SyntheticWorkload(num_requests=5000).generate()
    r.validate()
    assert len(r) == 5000
    assert r.arrival_s.dtype == np.float64 and r.prompt_tokens.dtype == np.int64
    assert r.output_tokens.dtype == np.int64 and r.priority.dtype == np.int64
    assert r.arrival_s[0] == 0.0
    assert np.all(np.diff(r.arrival_s) >= 0)
    assert r.prompt_tokens.min() >= 16 and r.prompt_tokens.max() <= 8192
    assert r.output_tokens.min() >= 8 and r.output_tokens.max() <= 2048


def test_changing_rate_keeps_lengths_and_rescales_poisson_arrivals() -> None:
    w = SyntheticWorkload(num_requests=2000, seed=3)
    a, b = w.generate(), w.with_rate(8.0).generate()
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    np.testing.assert_array_equal(a.priority, b.priority)
    np.testing.assert_allclose(b.arrival_s, a.arrival_s * w.rate_req_s / 8.0, rtol=1e-12)


def test_class_shares_within_tolerance() -> None:
    r = SyntheticWorkload(num_requests=N, seed=5).generate()
    shares = np.bincount(r.priority, minlength=2) / N
    # binomial sd = sqrt(0.3 * 0.7 / 20000) = 0.0032; allow 4 sd
    assert shares[0] == pytest.approx(0.3, abs=0.013)
    assert shares[1] == pytest.approx(0.7, abs=0.013)


def test_each_class_gets_its_own_lengths() -> None:
    r = SyntheticWorkload(num_requests=N, seed=5).generate()
    chat, batch = r.priority == 0, r.priority == 1
    assert r.prompt_tokens[batch].min() >= 64
    assert r.prompt_tokens[batch].mean() > 1.5 * r.prompt_tokens[chat].mean()


@pytest.mark.parametrize("mean, cv", [(1000, 1.0), (250, 0.5), (50, 2.0)])
def test_lognormal_mean_and_cv(mean: float, cv: float) -> None:
    d = LengthDist("lognormal", mean=mean, cv=cv, low=1, high=1_000_000)
    x = d.sample(np.random.default_rng(0), 200_000).astype(float)
    assert x.mean() == pytest.approx(mean, rel=0.03)
    assert x.std() / x.mean() == pytest.approx(cv, rel=0.08)


def test_lognormal_is_clipped() -> None:
    d = LengthDist("lognormal", mean=1000, cv=2.0, low=100, high=2000)
    x = d.sample(np.random.default_rng(1), 10_000)
    assert x.min() == 100 and x.max() == 2000


def test_fixed_is_constant() -> None:
    x = LengthDist("fixed", mean=127.6).sample(np.random.default_rng(0), 1000)
    assert x.dtype == np.int64
    assert np.all(x == 128)


def test_uniform_covers_inclusive_bounds() -> None:
    x = LengthDist("uniform", low=5, high=9).sample(np.random.default_rng(0), 5000)
    assert set(np.unique(x).tolist()) == {5, 6, 7, 8, 9}
    assert x.mean() == pytest.approx(7, abs=0.1)


def test_empirical_resamples_given_values_clipped() -> None:
    d = LengthDist("empirical", values=(3, 10, 50), low=5, high=40)
    x = d.sample(np.random.default_rng(0), 3000)
    assert set(np.unique(x).tolist()) == {5, 10, 40}
    assert np.mean(x == 10) == pytest.approx(1 / 3, abs=0.03)


def test_empirical_from_requests() -> None:
    r = Requests(np.arange(4.0), [10, 20, 30, 40], [1, 2, 3, 4], [0, 0, 0, 0], ("a",))
    d = LengthDist.from_trace(r, which="output")
    assert d.kind == "empirical" and d.values == (1, 2, 3, 4)
    assert d.mean == 2.5 and d.high == 4


RATE = 4.0


@pytest.mark.parametrize(
    "process",
    [
        ArrivalProcess("poisson", RATE),
        ArrivalProcess("gamma", RATE, cv=2.0),
        ArrivalProcess("gamma", RATE, cv=0.5),
        ArrivalProcess("constant", RATE),
        ArrivalProcess("onoff", RATE, on_s=10.0, off_s=30.0),
    ],
    ids=lambda p: f"{p.kind}-cv{p.cv}",
)
def test_mean_rate_within_five_percent(process: ArrivalProcess) -> None:
    t = process.times(np.random.default_rng(9), N)
    assert t.shape == (N,) and t[0] == 0.0
    assert np.all(np.diff(t) >= 0)
    assert (N - 1) / t[-1] == pytest.approx(RATE, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 3.0])
def test_gamma_gap_cv(cv: float) -> None:
    gaps = np.diff(ArrivalProcess("gamma", 10.0, cv=cv).times(np.random.default_rng(2), N))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_poisson_gaps_have_cv_one_and_constant_zero() -> None:
    rng = np.random.default_rng(4)
    gaps = np.diff(ArrivalProcess("poisson", 2.0).times(rng, N))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    gaps = np.diff(ArrivalProcess("constant", 2.0).times(rng, 100))
    np.testing.assert_allclose(gaps, 0.5)


def test_onoff_is_silent_during_off_periods() -> None:
    t = ArrivalProcess("onoff", 5.0, on_s=2.0, off_s=3.0).times(np.random.default_rng(0), N)
    phase = np.mod(t, 5.0)
    assert np.all(phase < 2.0 + 1e-9)
    # during on periods the rate is 5 * (2 + 3) / 2 = 12.5 req/s
    assert N / (t[-1] * 2 / 5) == pytest.approx(12.5, rel=0.05)


def test_validate_names_field_value_and_range() -> None:
    with pytest.raises(ValueError, match=r"rate_req_s=-1 is out of range; allowed > 0 to 10000"):
        ArrivalProcess(rate_req_s=-1).validate()
    with pytest.raises(ValueError, match=r"cv=0 is out of range"):
        ArrivalProcess("gamma", cv=0).validate()
    with pytest.raises(ValueError, match=r"kind='weibull'.*poisson"):
        ArrivalProcess("weibull").validate()
    with pytest.raises(ValueError, match=r"high=4 is out of range; allowed 8 to 1000000"):
        LengthDist(low=8, high=4).validate()
    with pytest.raises(ValueError, match=r"mean=0 is out of range"):
        LengthDist("fixed", mean=0).validate()
    with pytest.raises(ValueError, match=r"num_requests=0 is out of range; allowed 1 to 1000000"):
        SyntheticWorkload(num_requests=0).validate()
    with pytest.raises(ValueError, match=r"num_requests=10000000 is out of range; allowed 1 to 1000000"):
        SyntheticWorkload(num_requests=10**7).validate()  # 10^7 needed ~58 GB (benchmarks/bench_memory.py)
    with pytest.raises(ValueError, match=r"num_requests=2.5 is not an integer"):
        SyntheticWorkload(num_requests=2.5).validate()
    with pytest.raises(ValueError, match=r"rate_req_s=nan is out of range"):
        SyntheticWorkload(ArrivalProcess(rate_req_s=math.nan)).generate()


def test_validate_classes() -> None:
    chat, batch = DEFAULT_CLASSES
    with pytest.raises(ValueError, match=r"shares sum to 1.2"):
        SyntheticWorkload(classes=(chat, replace(batch, share=0.9))).validate()
    with pytest.raises(ValueError, match=r"priorities are \[0, 0\]"):
        SyntheticWorkload(classes=(chat, replace(batch, priority=0))).validate()
    with pytest.raises(ValueError, match=r"share=1.5 is out of range; allowed 0 to 1"):
        replace(chat, share=1.5).validate()
    with pytest.raises(ValueError, match=r"slo_ttft_s=0 is out of range"):
        replace(chat, slo_ttft_s=0.0).validate()
    nine = tuple(replace(chat, name=str(i), priority=i, share=1 / 9) for i in range(9))
    with pytest.raises(ValueError, match=r"classes has 9 classes; allowed 1 to 8"):
        SyntheticWorkload(classes=nine).validate()


def test_with_high_share() -> None:
    w = SyntheticWorkload().with_high_share(0.8)
    assert [c.share for c in w.classes] == pytest.approx([0.8, 0.2])
    w.validate()
    three = (
        DEFAULT_CLASSES[0],
        replace(DEFAULT_CLASSES[1], share=0.5),
        PriorityClass("bulk", 2, 0.2, LengthDist(), LengthDist()),
    )
    shares = [c.share for c in SyntheticWorkload(classes=three).with_high_share(0.5).classes]
    assert shares == pytest.approx([0.5, 0.5 * 5 / 7, 0.5 * 2 / 7])
    r = w.with_num_requests(N).generate()
    assert np.mean(r.priority == 0) == pytest.approx(0.8, abs=0.012)
    with pytest.raises(ValueError, match=r"share_high=1.5"):
        w.with_high_share(1.5)
    with pytest.raises(ValueError, match="2 or more classes"):
        workload_preset("chat").with_high_share(0.5)


def test_with_helpers() -> None:
    w = SyntheticWorkload()
    assert w.with_rate(9.0).rate_req_s == 9.0 and w.with_rate(9.0).arrivals.kind == "poisson"
    assert w.with_num_requests(7).generate().__len__() == 7
    assert w.with_seed(4).seed == 4


def test_saturated_and_subset_and_frame() -> None:
    r = SyntheticWorkload(num_requests=100, seed=1).generate()
    s = r.saturated()
    assert np.all(s.arrival_s == 0) and len(s) == 100
    np.testing.assert_array_equal(s.prompt_tokens, r.prompt_tokens)
    assert r.arrival_s[-1] > 0  # the original is untouched
    sub = r.subset(np.array([5, 2, 9]))
    np.testing.assert_array_equal(sub.arrival_s, r.arrival_s[[2, 5, 9]])
    assert len(r.subset(r.priority == 0)) == int(np.sum(r.priority == 0))
    frame = r.to_frame()
    assert list(frame.columns) == [
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "priority",
        "class_name",
    ]
    assert frame["class_name"].iloc[0] == r.class_names[r.priority[0]]
    assert len(frame) == 100


def test_requests_validate() -> None:
    good = Requests([0.0, 1.0], [1, 2], [1, 2], [0, 1], ("a", "b"))
    good.validate()
    with pytest.raises(ValueError, match="not sorted"):
        Requests([1.0, 0.0], [1, 2], [1, 2], [0, 0], ("a",)).validate()
    with pytest.raises(ValueError, match=r"priority holds 0..1; allowed 0 to 0"):
        Requests([0.0, 1.0], [1, 2], [1, 2], [0, 1], ("a",)).validate()
    with pytest.raises(ValueError, match="output_tokens holds 0..2"):
        Requests([0.0, 1.0], [1, 2], [0, 2], [0, 0], ("a",)).validate()


def test_presets() -> None:
    assert set(WORKLOAD_PRESETS) == {"mixed", "chat", "code", "batch", "sharegpt", "article", "chat-sessions",
                                     "reasoning", "long-context"}
    assert WORKLOAD_PRESETS["mixed"] == DEFAULT_CLASSES
    chat, batch = DEFAULT_CLASSES
    assert (chat.name, chat.priority, chat.share, chat.slo_ttft_s, chat.slo_tpot_s) == (
        "interactive chat",
        0,
        0.3,
        1.0,
        0.1,
    )
    assert (batch.name, batch.priority, batch.share, batch.slo_ttft_s) == (
        "batch analysis",
        1,
        0.7,
        None,
    )
    for name in WORKLOAD_PRESETS:
        w = workload_preset(name, rate_req_s=3.0, num_requests=50, seed=2)
        assert w.rate_req_s == 3.0 and w.num_requests == 50 and w.seed == 2
        assert len(w.generate()) == 50
    with pytest.raises(ValueError, match=r"'nope' is unknown; allowed: mixed, chat, code, batch"):
        workload_preset("nope")


def test_preset_means_follow_azure_traces() -> None:
    code = workload_preset("code", num_requests=N).generate()
    assert code.output_tokens.mean() == pytest.approx(28, rel=0.1)
    chat = workload_preset("chat", num_requests=N).generate()
    assert chat.prompt_tokens.mean() == pytest.approx(1155, rel=0.08)
    assert chat.output_tokens.mean() == pytest.approx(211, rel=0.08)


def test_workloads_are_hashable_cache_keys() -> None:
    a, b = workload_preset("mixed", 4.0), workload_preset("mixed", 4.0)
    assert a == b and hash(a) == hash(b)
    assert a != a.with_seed(1)
