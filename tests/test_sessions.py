"""Multi-turn sessions: each turn's prompt is the history plus a new message, its chain reuses the previous
turn's blocks, turns are linked and ordered by their lower-bound arrival, the context cap ends sessions, and
rate_req_s stays the mean request rate."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from batching.sim.workload.prefixes import ideal_hit_tokens, split_chains
from batching.sim.workload.sessions import SESSION_CONTEXT_CAP_TOKENS, SessionSpec
from batching.sim.workload.requests import (
    DEFAULT_CLASSES,
    WORKLOAD_PRESETS,
    WORKLOAD_SESSIONS,
    LengthDist,
    PriorityClass,
    Requests,
    SyntheticWorkload,
    workload_preset,
)

N = 20_000


@pytest.fixture(scope="module")
def chat() -> Requests:
    r = workload_preset("chat-sessions", 5.0, N, 0).generate()
    r.validate()
    return r


def _check_sessions(r: Requests, spec: SessionSpec, shared_blocks: dict[int, int] | None = None) -> None:
    """Every invariant a session workload keeps."""
    n = len(r)
    assert r.after is not None and r.think_s is not None and r.block_off is not None
    assert np.all(np.diff(r.arrival_s) >= 0)  # sorted by lower-bound arrival
    chains = split_chains(r.block_off, r.block_ids)
    full = (r.prompt_tokens + r.output_tokens) // 16
    has_next = np.zeros(n, dtype=bool)
    has_next[r.after[r.after >= 0]] = True
    assert np.bincount(r.after[r.after >= 0], minlength=n).max() <= 1  # one next turn at most
    assert np.all(r.prompt_tokens + r.output_tokens <= spec.context_cap_tokens)
    shared_blocks = shared_blocks or {}
    for i in range(n):
        p = r.after[i]
        if p < 0:
            assert r.think_s[i] == 0
        else:
            assert p < i and r.priority[p] == r.priority[i]
            history = r.prompt_tokens[p] + r.output_tokens[p]
            message = r.prompt_tokens[i] - history
            assert spec.message_low <= message <= spec.message_high  # history + a new message
            assert r.arrival_s[i] == pytest.approx(r.arrival_s[p] + r.think_s[i], rel=1e-12, abs=1e-9)
            assert r.think_s[i] > 0
            np.testing.assert_array_equal(chains[i][: history // 16], chains[p])  # the whole history reused
        if has_next[i]:
            assert len(chains[i]) == full[i]  # prompt and answer, all full blocks
        elif p >= 0:
            # a last turn: its own blocks left out, only the previous turn's
            assert len(chains[i]) == (r.prompt_tokens[p] + r.output_tokens[p]) // 16
        else:
            assert len(chains[i]) == shared_blocks.get(int(r.priority[i]), 0)  # a lone turn: the system prompt


def _middle_rate(r: Requests) -> float:
    lo, hi = np.quantile(r.arrival_s, [0.1, 0.9])
    return float(np.count_nonzero((r.arrival_s >= lo) & (r.arrival_s < hi)) / (hi - lo))


def test_chat_sessions_invariants() -> None:
    r = workload_preset("chat-sessions", 5.0, 3000, 0).generate()
    r.validate()
    _check_sessions(r, SessionSpec())


def test_chat_sessions_numbers(chat: Requests) -> None:
    session, turn = chat.sessions()
    sessions = int(session.max()) + 1
    assert len(chat) == N  # num_requests counts turns
    assert N / sessions == pytest.approx(2.0, rel=0.03)  # LMSYS-Chat-1M: 2.0 turns per conversation
    assert np.mean(np.bincount(session) == 1) == pytest.approx(0.5, abs=0.02)  # geometric: P(1 turn) = 1/2
    follow = chat.after >= 0
    assert chat.think_s[follow].mean() == pytest.approx(8.5, rel=0.05)
    assert np.median(chat.think_s[follow]) == pytest.approx(7.2, rel=0.08)  # the trace's p50
    message = chat.prompt_tokens[follow] - (chat.prompt_tokens + chat.output_tokens)[chat.after[follow]]
    assert message.mean() == pytest.approx(70, rel=0.06)
    first = ~follow
    assert chat.prompt_tokens[first].mean() == pytest.approx(70, rel=0.06)
    assert chat.output_tokens.mean() == pytest.approx(215, rel=0.05)
    assert chat.mean_rate_req_s == pytest.approx(5.0, rel=0.03)  # the request rate, not the session rate
    assert chat.to_frame()[["session", "turn"]].to_numpy().tolist() == np.stack([session, turn], 1).tolist()


def test_ideal_hits_of_sessions_are_the_previous_turn(chat: Requests) -> None:
    hits = ideal_hit_tokens(chat)
    follow = chat.after >= 0
    previous = chat.after[follow]
    expected = np.zeros(len(chat), dtype=np.int64)
    expected[follow] = (chat.prompt_tokens + chat.output_tokens)[previous] // 16 * 16
    np.testing.assert_array_equal(hits, expected)
    assert hits.sum() / chat.prompt_tokens.sum() == pytest.approx(0.79, abs=0.02)  # measured 0.795


def test_sessions_are_deterministic_and_rates_rescale_only_the_starts() -> None:
    w = workload_preset("chat-sessions", 2.0, 3000, 9)
    a, b = w.generate(), w.generate()
    for x, y in zip((a.arrival_s, a.prompt_tokens, a.block_ids, a.after, a.think_s),
                    (b.arrival_s, b.prompt_tokens, b.block_ids, b.after, b.think_s), strict=True):
        np.testing.assert_array_equal(x, y)
    c = w.with_rate(20.0).generate()
    # the same sessions and lengths; only the session starts move, so the order may change
    assert sorted(zip(a.prompt_tokens, a.output_tokens)) == sorted(zip(c.prompt_tokens, c.output_tokens))
    # requests per second in the run's middle 80 % (its ends ramp: only first turns at the start, the last
    # sessions' think times at the end)
    assert _middle_rate(c) == pytest.approx(20.0, rel=0.08)
    assert _middle_rate(a) == pytest.approx(2.0, rel=0.08)
    d = w.with_seed(10).generate()
    assert not np.array_equal(a.prompt_tokens, d.prompt_tokens)


def test_sessions_with_a_shared_system_prompt_and_several_classes() -> None:
    spec = SessionSpec(mean_turns=3.0)
    w = SyntheticWorkload(classes=DEFAULT_CLASSES, num_requests=1500, seed=2, sessions=spec)
    w = w.with_shared_prefix(1000)
    r = w.generate()
    r.validate()
    _check_sessions(r, spec, {0: 62, 1: 62})
    chains = split_chains(r.block_off, r.block_ids)
    heads = {p: {tuple(c[:62]) for c, q in zip(chains, r.priority) if q == p} for p in (0, 1)}
    assert all(len(h) == 1 for h in heads.values())  # 1,000 tokens = 62 full blocks, one prompt per class
    assert not set(next(iter(heads[0]))) & set(next(iter(heads[1])))
    assert len(set(r.block_ids.tolist())) == r.num_block_ids  # dense
    assert np.all(r.prompt_tokens[r.after < 0] >= 1001)  # the system prompt starts every first turn


def test_the_context_cap_ends_sessions() -> None:
    spec = SessionSpec(mean_turns=20.0, message_mean_tokens=1000, context_cap_tokens=9000)
    w = replace(workload_preset("chat-sessions", 1.0, 4000, 1), sessions=spec)
    r = w.generate()
    _check_sessions(r, spec)
    session, _ = r.sessions()
    assert len(r) / (session.max() + 1) < 10  # without the cap ~20 turns (~1,300 tokens more per turn)
    assert (r.prompt_tokens + r.output_tokens).max() > 8000
    assert SESSION_CONTEXT_CAP_TOKENS == 32_768 == SessionSpec().context_cap_tokens


def test_a_session_cut_by_num_requests_and_a_single_request() -> None:
    r = workload_preset("chat-sessions", 1.0, 1, 0).generate()
    r.validate()
    assert len(r) == 1 and r.after.tolist() == [-1] and np.diff(r.block_off).tolist() == [0]


def test_subset_and_saturated_keep_sessions_consistent(chat: Requests) -> None:
    part = chat.subset(np.arange(len(chat)) % 3 != 0)
    part.validate()
    sat = chat.saturated()
    sat.validate()
    assert np.all(sat.arrival_s == 0) and np.all(sat.think_s == 0)
    np.testing.assert_array_equal(sat.after, chat.after)


def test_preset_and_validation() -> None:
    assert set(WORKLOAD_SESSIONS) <= set(WORKLOAD_PRESETS)
    w = workload_preset("chat-sessions", 3.0, 100, 4)
    assert w.sessions == SessionSpec() and w.rate_req_s == 3.0 and w.num_requests == 100
    assert workload_preset("chat").sessions is None
    assert workload_preset("chat").with_sessions(SessionSpec()).generate().after is not None
    long = PriorityClass("long", 0, 1.0, LengthDist("fixed", mean=30000, high=30000),
                         LengthDist("fixed", mean=4000, high=4000))
    with pytest.raises(ValueError, match=r"class 'long': .* = 34,000 tokens passes sessions.context_cap_tokens"):
        SyntheticWorkload(classes=(long,), sessions=SessionSpec()).generate()
    with pytest.raises(ValueError, match=r"sessions must be a SessionSpec"):
        SyntheticWorkload(sessions="chat").validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(mean_turns=0.5), r"mean_turns=0.5 is out of range; allowed 1 to 100"),
        (dict(max_turns=0), r"max_turns=0 is out of range; allowed 1 to 1000"),
        (dict(max_turns=2.0), r"max_turns=2\.0 is not an integer; allowed 1 to 1000"),
        (dict(think_mean_s=-1.0), r"think_mean_s=-1 is out of range; allowed 0 to 86400"),
        (dict(think_cv=float("nan")), r"think_cv=nan is out of range"),
        (dict(message_mean_tokens=0), r"message_mean_tokens=0 is out of range; allowed 1 to 1000000"),
        (dict(message_low=10, message_high=5), r"message_high=5 is out of range; allowed 10 to 1000000"),
        (dict(context_cap_tokens=1), r"context_cap_tokens=1 is out of range; allowed 2 to 1000000"),
    ],
)
def test_session_spec_validation(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SessionSpec(**kw).validate()
