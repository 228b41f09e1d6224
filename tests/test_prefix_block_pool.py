"""The engine's prefix cache is vLLM V1's block pool (issue 23, item 6; issue 36): on random traces (shared system
prompts, families, multi-turn sessions whose next turn reuses the previous prompt and answer, caches small enough to
evict and to preempt) it serves the same hit tokens as the oracle written from vLLM V1's own code (tests/oracle/:
block pool, KV-cache manager and scheduler), request by request and step by step."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.engine import kernel as eng
from tests.oracle import harness
from tests.oracle.kv_manager import BLOCK
from tests.test_engine_prefix_sessions import EXAMPLES
from tests.test_prefix_tables import _hashed


def _agree(arrival, prompt, output, chain, hashed=False, **kw):
    """The engine and the oracle on one trace under V1's chunked prefill and recompute preemption: every step's
    hit tokens, evictable cached blocks, blocks in use, tokens and preemptions agree, and every request's first
    hit and preemption count (harness.compare)."""
    sc = harness.chunked_v1(arrival, prompt, output, chain, **kw)
    o = _hashed(lambda: harness.compare(sc)) if hashed else harness.compare(sc)
    assert o.mismatch is None, o.mismatch
    out = o.engine
    assert (out.steps_f[:, eng.F_DURATION] == 1.0).all()  # the clock the oracle reads
    return out, o


@st.composite
def traces(draw):
    """Up to 24 requests: members of 3 families (a shared prefix of up to 12 blocks), or a session's next turn
    (the previous turn's prompt and answer, then a new message), or prompts of their own; caches from the largest
    request's blocks to 3 times that."""
    n = draw(st.integers(1, 24))
    arrival = np.cumsum(draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 5.0]), min_size=n, max_size=n)))
    prompt, output, chain = [], [], []
    next_id = 1000
    for r in range(n):
        kind = "first" if r == 0 else draw(st.sampled_from(["family", "family", "turn", "own"]))
        if kind == "first":  # a chain in every trace: without any the engine runs without the cache
            prompt.append(draw(st.integers(16, 260)))
            output.append(draw(st.integers(1, 60)))
            chain.append([100 * draw(st.integers(0, 2)) + j for j in range(draw(st.integers(1, prompt[0] // BLOCK)))])
            continue
        o = draw(st.integers(1, 60))
        if kind == "turn" and r > 0:
            p = draw(st.integers(0, r - 1))
            before = prompt[p] + output[p]
            full = before // BLOCK  # the previous turn's blocks, prompt and answer, named for both
            while len(chain[p]) < full:
                chain[p].append(next_id)
                next_id += 1
            prompt.append(before + draw(st.integers(1, 80)))
            chain.append(chain[p][:full])
        else:
            p = draw(st.integers(1, 260))
            shared = 0
            if kind == "family":
                shared = min(draw(st.integers(0, 12)), p // BLOCK)
            f = draw(st.integers(0, 2))
            prompt.append(p)
            chain.append([f * 100 + j for j in range(shared)])
        output.append(o)
    prompt_a, output_a = np.array(prompt), np.array(output)
    need = int(((prompt_a + output_a + BLOCK - 1) // BLOCK).max())
    kw = dict(kv_blocks=draw(st.integers(need, 3 * need)), budget=draw(st.integers(16, 300)),
              max_seqs=draw(st.integers(1, 8)))
    return arrival, prompt_a, output_a, chain, kw


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.booleans())
def test_the_engine_serves_what_v1s_block_pool_serves(case, hashed):
    arrival, prompt, output, chain, kw = case
    _agree(arrival, prompt, output, chain, hashed=hashed, **kw)


def test_some_random_traces_hit_evict_and_preempt():
    """The property above is not vacuous: over fixed seeds its traces hit, evict named blocks and preempt, and
    recompute victims find blocks they computed themselves."""
    rng = np.random.default_rng(0)
    hits = victims_hit = preempted = 0
    for _ in range(40):
        n = 16
        prompt = rng.integers(40, 260, n)
        output = rng.integers(1, 60, n)
        chain = [[int(f) * 100 + j for j in range(int(p) // BLOCK)] for f, p in zip(rng.integers(0, 3, n), prompt)]
        need = int(((prompt + output + BLOCK - 1) // BLOCK).max())
        out, o = _agree(np.zeros(n), prompt, output, chain, kv_blocks=need + 4, budget=128, max_seqs=6)
        hits += out.req_cached.sum()
        preempted += out.req_preemptions.sum()
        victims_hit += o.victim_hits
    assert hits > 0 and preempted > 0 and victims_hit > 0


def test_three_families_served_one_at_a_time_on_a_64_block_cache_hit_nothing():
    """The issue's case: 3 families of a 256-token (16-block) prefix + 400 tokens of their own (41 full blocks a
    prompt), served one at a time, A B C A B C, on a 64-block cache. Each request's own blocks go back to the free
    queue after its family's prefix, so the next request's allocation takes the older family's prefix first: by a
    family's next turn its prefix is gone, as in V1: 0 hit tokens. (The engine before, whose cache held shared
    blocks only, served 576 here, 96 tokens to each of the last 6.)"""
    n = 9
    prompt = np.full(n, 656)
    output = np.full(n, 8)
    chain = [[(r % 3) * 100 + j for j in range(16)] for r in range(n)]
    arrival = 100.0 * np.arange(n)  # each one alone: it finishes long before the next arrives
    out, _ = _agree(arrival, prompt, output, chain, kv_blocks=64, budget=2048, max_seqs=256)
    assert out.req_cached.tolist() == [0] * n
    # with room for the three families' blocks the prefixes survive: every later request hits its 16 blocks
    out, _ = _agree(arrival, prompt, output, chain, kv_blocks=3 * 42, budget=2048, max_seqs=256)
    assert out.req_cached.tolist() == [0, 0, 0] + [256] * 6


def test_a_recompute_victim_finds_its_own_prompt_and_output_blocks():
    # two requests (a one-block system prompt each, the rest their own) decode on a 12-block cache; at 97 tokens
    # request 0 needs a 7th block and request 1 (the later one) is preempted with 6 named blocks, 64 prompt and 32
    # generated tokens. They join the free queue last first; request 0 takes the 6th. Readmitted once request 0 is
    # done (target 97 tokens), request 1 finds its first 5 blocks: 80 tokens, 16 of them tokens it generated
    out, o = _agree([0.0, 0.0], [64, 64], [40, 60], [[0], [100]], kv_blocks=12, budget=512, max_seqs=8)
    assert out.req_preemptions.tolist() == [0, 1]
    assert out.req_cached.tolist() == [0, 0]  # first admissions
    assert o.cached == out.steps_i[:, eng.S_CACHED_TOKENS].sum() == o.victim_hits == 80
