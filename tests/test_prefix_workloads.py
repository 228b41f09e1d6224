"""Shared system prompts and the Requests' block chains: today's arrays kept without a prefix, exactly the
system prompt's blocks shared with one, chains validated and carried through subset/saturated, and the prompt
tokens an unbounded prefix cache would serve (``ideal_hit_tokens``)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from batching.sim.workload.prefixes import ideal_hit_tokens, split_chains
from batching.sim.workload.requests import (
    DEFAULT_CLASSES,
    Requests,
    SyntheticWorkload,
    workload_preset,
)


def _int_digest(r: Requests) -> str:
    h = hashlib.sha256()
    for a in (r.prompt_tokens, r.output_tokens, r.priority):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


# What generate() returned before prefixes and sessions existed (commit b92b471, workload_preset(name, 1.0,
# 3000, seed=7)): a digest of the integer arrays and the sum of the arrivals (to 1e-12: a float sum).
TODAY = {
    "mixed": ("9d8418d35a641397", 4703167.609562415),
    "chat": ("bb0c26c0674dee54", 4703167.609562415),
    "sharegpt": ("49d89ffc2d2829c9", 4703167.609562415),
    "article": ("2962efe0e850084a", 4703167.609562415),
}


@pytest.mark.parametrize("name", sorted(TODAY))
def test_without_a_shared_prefix_generate_returns_todays_arrays(name: str) -> None:
    r = workload_preset(name, 1.0, 3000, 7).generate()
    digest, arrivals = TODAY[name]
    assert _int_digest(r) == digest
    assert float(r.arrival_s.sum()) == pytest.approx(arrivals, rel=1e-12)
    assert r.block_off is None and r.block_ids is None and r.after is None and r.think_s is None
    assert r.num_block_ids == 0
    assert "session" not in r.to_frame().columns


def test_shared_prefix_prepends_the_system_prompt_and_shares_exactly_its_blocks() -> None:
    base = SyntheticWorkload(num_requests=3000, seed=4)
    plain = base.generate()
    r = base.with_shared_prefix(2000).generate()
    r.validate()
    np.testing.assert_array_equal(r.prompt_tokens, plain.prompt_tokens + 2000)
    np.testing.assert_array_equal(r.output_tokens, plain.output_tokens)
    np.testing.assert_array_equal(r.arrival_s, plain.arrival_s)
    np.testing.assert_array_equal(r.priority, plain.priority)
    chains = split_chains(r.block_off, r.block_ids)
    assert all(len(c) == 2000 // 16 for c in chains)  # 125 full blocks; the rest of a prompt is its own
    by_class = {p: {tuple(c) for c, q in zip(chains, r.priority) if q == p} for p in (0, 1)}
    assert all(len(s) == 1 for s in by_class.values())  # one system prompt per class
    a, b = (set(next(iter(by_class[p]))) for p in (0, 1))
    assert not a & b  # classes share nothing
    assert r.num_block_ids == 250 and set(r.block_ids.tolist()) == set(range(250))  # dense from 0


def test_shared_prefix_per_class_and_partial_blocks() -> None:
    chat, batch = DEFAULT_CLASSES
    w = SyntheticWorkload(classes=(replace(chat, shared_prefix_tokens=100), batch), num_requests=2000, seed=1)
    r = w.generate()
    r.validate()
    lengths = np.diff(r.block_off)
    np.testing.assert_array_equal(lengths, np.where(r.priority == 0, 100 // 16, 0))  # 6 blocks, none
    assert r.num_block_ids == 6
    plain = replace(w, classes=DEFAULT_CLASSES).generate()
    np.testing.assert_array_equal(r.prompt_tokens - plain.prompt_tokens, np.where(r.priority == 0, 100, 0))


def test_shared_prefix_is_deterministic_and_rate_independent() -> None:
    w = workload_preset("chat", 2.0, 1000, 3).with_shared_prefix(512)
    a, b, c = w.generate(), w.generate(), w.with_rate(7.0).generate()
    for x in (b, c):
        np.testing.assert_array_equal(a.block_off, x.block_off)
        np.testing.assert_array_equal(a.block_ids, x.block_ids)
        np.testing.assert_array_equal(a.prompt_tokens, x.prompt_tokens)


def test_shared_prefix_validation() -> None:
    chat = DEFAULT_CLASSES[0]
    with pytest.raises(ValueError, match=r"shared_prefix_tokens=-1 is out of range; allowed 0 to 1000000"):
        replace(chat, shared_prefix_tokens=-1).validate()
    with pytest.raises(ValueError, match=r"shared_prefix_tokens=2.5 is not an integer"):
        replace(chat, shared_prefix_tokens=2.5).validate()
    with pytest.raises(ValueError, match=r"prompts of up to 1,000,192 tokens; allowed up to 1,000,000"):
        replace(chat, shared_prefix_tokens=992_000).validate()
    with pytest.raises(ValueError, match=r"shared_prefix_tokens=-5"):
        workload_preset("chat").with_shared_prefix(-5)


def test_ideal_hits_of_a_shared_system_prompt() -> None:
    r = workload_preset("mixed", 1.0, 2000, 0).with_shared_prefix(2000).generate()
    hits = ideal_hit_tokens(r)
    first = {int(np.argmax(r.priority == p)) for p in (0, 1)}
    expected = np.full(len(r), 2000)
    expected[list(first)] = 0  # the first request of each class computes the system prompt
    np.testing.assert_array_equal(hits, expected)
    assert hits.sum() / r.prompt_tokens.sum() == pytest.approx(2000 * 1998 / r.prompt_tokens.sum())


def _chained(prompts: list[int], outputs: list[int], chains: list[list[int]]) -> Requests:
    off = np.concatenate(([0], np.cumsum([len(c) for c in chains])))
    ids = np.array([i for c in chains for i in c], dtype=np.int64)
    n = len(prompts)
    return Requests(np.arange(n, dtype=float), prompts, outputs, [0] * n, ("a",), off, ids)


def test_ideal_hits_count_leading_blocks_registered_anywhere_capped_below_the_prompt() -> None:
    r = _chained(
        [64, 64, 64, 33, 64, 50],
        [32, 1, 1, 1, 1, 20],
        [[0, 1, 2, 3, 4, 5], [0, 1, 9], [7, 1], [0, 1], [4, 5, 0, 1], [0, 1, 2, 3]],
    )
    r.validate()
    # r0: nothing before it. r1: 0, 1 cached, 9 new. r2: 7 new first (1 is cached but not leading).
    # r3: 0, 1 cached, but 33 prompt tokens: at most (33 - 1) // 16 = 2 blocks. r4: 4, 5 are r0's output
    # blocks (any position counts), then 0, 1: 4 blocks, capped at (64 - 1) // 16 = 3. r5: (50 - 1) // 16 = 3.
    np.testing.assert_array_equal(ideal_hit_tokens(r), [0, 32, 0, 32, 48, 48])


def test_ideal_hits_without_chains_are_zero() -> None:
    r = workload_preset("chat", 1.0, 10, 0).generate()
    np.testing.assert_array_equal(ideal_hit_tokens(r), np.zeros(10))


def _base(**kw: object) -> Requests:
    fields = dict(arrival_s=[0.0, 1.0, 2.0], prompt_tokens=[40, 40, 40], output_tokens=[8, 8, 8],
                  priority=[0, 0, 0], class_names=("a",))
    fields.update(kw)
    return Requests(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(block_off=[0, 1, 2, 3]), r"block_off is set but block_ids is None; allowed both or neither"),
        (dict(block_ids=[0, 1]), r"block_ids is set but block_off is None"),
        (dict(block_off=[0, 1, 2], block_ids=[0, 1]), r"block_off has shape \(3,\); expected \(4,\)"),
        (dict(block_off=[0, 1, 2, 4], block_ids=[0, 1]),
         r"block_off runs from 0 to 4; allowed 0 to len\(block_ids\) = 2"),
        (dict(block_off=[1, 1, 2, 2], block_ids=[0, 1]), r"block_off runs from 1 to 2"),
        (dict(block_off=[0, 2, 1, 2], block_ids=[0, 1]), r"block_off decreases at request 1 \(2 then 1\)"),
        (dict(block_off=[0, 1, 2, 2], block_ids=[0, -3]), r"block_ids holds -3; allowed ids >= 0"),
        (dict(block_off=[0, 4, 4, 4], block_ids=[0, 1, 2, 3]), r"request 0 has 4 block ids; allowed 0 to 3"),
        (dict(after=[-1, 0, 1]), r"after is set but think_s is None"),
        (dict(think_s=[0.0, 0.0, 0.0]), r"think_s is set but after is None"),
        (dict(after=[-1, 0], think_s=[0.0, 1.0]), r"after has shape \(2,\); expected \(3,\)"),
        (dict(after=[-1, 1, 0], think_s=[0.0, 1.0, 1.0]),
         r"after\[1\]=1 is out of range; allowed -1 or an earlier request, 0 to 0"),
        (dict(after=[-1, -2, 0], think_s=[0.0, 1.0, 1.0]), r"after\[1\]=-2 is out of range"),
        (dict(after=[-1, 0, 1], think_s=[0.0, -1.0, 1.0]),
         r"think_s\[1\]=-1 is out of range; allowed finite seconds >= 0"),
        (dict(after=[-1, 0, 1], think_s=[0.0, 1.0, np.inf]), r"think_s\[2\]=inf is out of range"),
    ],
)
def test_requests_validate_chains_and_sessions(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _base(**kw).validate()


def test_subset_keeps_chains_and_remaps_sessions() -> None:
    r = _base(block_off=[0, 2, 2, 3], block_ids=[5, 6, 7], after=[-1, 0, 1], think_s=[0.0, 1.5, 2.5])
    r.validate()
    s = r.subset([0, 2])
    s.validate()
    np.testing.assert_array_equal(s.block_off, [0, 2, 3])
    np.testing.assert_array_equal(s.block_ids, [5, 6, 7])
    np.testing.assert_array_equal(s.after, [-1, -1])  # request 2's predecessor (1) is gone
    np.testing.assert_array_equal(s.think_s, [0.0, 0.0])
    t = r.subset(slice(1, None))
    np.testing.assert_array_equal(t.after, [-1, 0])
    np.testing.assert_array_equal(t.think_s, [0.0, 2.5])
    np.testing.assert_array_equal(t.block_off, [0, 0, 1])
    sat = r.saturated()
    sat.validate()
    np.testing.assert_array_equal(sat.arrival_s, 0.0)
    np.testing.assert_array_equal(sat.think_s, 0.0)
    np.testing.assert_array_equal(sat.after, r.after)
    assert sat.block_ids is r.block_ids and r.num_block_ids == 8
