"""The prefix cache's tables (issue 22, item 6): chains held one id per 512-token trace block run exactly as their
expansion to 16-token blocks, and hash-indexed tables (bounded by the GPU cache, not by the ids a trace names)
give exactly what tables indexed by block id give."""
from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.engine import kernel as eng
from batching.sim.engine import state as engine_state
from batching.sim.engine.state import prefix_tables
from batching.sim.workload.prefixes import expand_chains
from batching.sim.workload.traces import load_trace
from batching.sim.workload.requests import Requests
from tests.test_engine_prefix_sessions import CM, EXAMPLES, chains, scenarios


def _run(arrival, prompt, output, kw, **chain_kw):
    n = len(arrival)
    knobs = eng.Knobs(mode=kw["mode"], n_classes=1, max_batch=kw["max_batch"], max_wait_s=kw["max_wait_s"],
                      max_seqs=kw["max_seqs"], budget=kw["budget"], chunked=kw["chunked"], use_prio=False,
                      preempt=kw["preempt"], swap_cap_tokens=1000, watermark_blocks=0, kv_blocks=kw["kv_blocks"])
    inp = eng.inputs(arrival, prompt, output, np.zeros(n, np.int64), **chain_kw)
    return eng.run(inp, knobs, eng.kernel_cost(CM), prefix_caching=True)


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.req_f, b.req_f)
    np.testing.assert_array_equal(a.req_cached, b.req_cached)
    np.testing.assert_array_equal(a.req_preemptions, b.req_preemptions)
    np.testing.assert_array_equal(a.steps_i, b.steps_i)


def _hashed(fn):
    """fn() with every prefix table hash-indexed."""
    saved = engine_state.DIRECT_IDS_PER_KV_BLOCK, engine_state.DIRECT_IDS
    engine_state.DIRECT_IDS_PER_KV_BLOCK, engine_state.DIRECT_IDS = 0, 0
    try:
        return fn()
    finally:
        engine_state.DIRECT_IDS_PER_KV_BLOCK, engine_state.DIRECT_IDS = saved


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_hash_indexed_tables_give_what_tables_indexed_by_id_give(case):
    # random scenarios with eviction (caches of 1 to 4 times the largest request), preemption and sessions
    arrival, prompt, output, chain, after, think, kw = case
    off, ids = chains(chain)
    kw_chain = dict(chain_off=off, chain_ids=ids, after=after, think_s=think)
    assert prefix_tables(int(ids.max()) + 1 if ids.size else 1, kw["kv_blocks"]).index.size == 0  # by id here
    _same(_hashed(lambda: _run(arrival, prompt, output, kw, **kw_chain)), _run(arrival, prompt, output, kw, **kw_chain))


@st.composite
def mooncake_traces(draw):
    """Small Mooncake traces: prompts of 1 to 4 trace blocks (short last blocks too), the leading ones from one of
    three families' chain hashes; or, for some traces, hashes from {0, 1, 2} at random (hashes that follow
    different ones, which the parser keys on position)."""
    n = draw(st.integers(2, 20))
    chained = draw(st.booleans())
    rows = []
    for i in range(n):
        blocks = draw(st.integers(1, 4))
        if chained:
            family, shared = draw(st.integers(0, 2)), draw(st.integers(0, blocks))
            hashes = [family * 10 + k for k in range(shared)] + [1000 + 10 * i + k for k in range(shared, blocks)]
        else:
            hashes = draw(st.lists(st.integers(0, 2), min_size=blocks, max_size=blocks))
        rows.append({"timestamp": 100 * i, "input_length": 512 * (blocks - 1) + draw(st.integers(1, 512)),
                     "output_length": draw(st.integers(1, 40)), "hash_ids": hashes})
    return "\n".join(json.dumps(r) for r in rows).encode()


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mooncake_traces(), st.integers(140, 700), st.booleans())
def test_chains_held_per_trace_block_run_as_their_expansion(data, kv_blocks, chunked):
    reqs = Requests.from_trace(load_trace(data, filename="t.jsonl"))
    assert reqs.block_group == 32
    off, ids = expand_chains(reqs.block_off, reqs.block_ids, reqs.block_len, reqs.block_group)
    kw = dict(mode=eng.MODE_CONTINUOUS, max_batch=8, max_wait_s=0.0, max_seqs=8, chunked=chunked,
              budget=256 if chunked else int(reqs.prompt_tokens.max()), preempt=eng.PREEMPT_RECOMPUTE,
              kv_blocks=kv_blocks)
    args = (reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens, kw)
    grouped = _run(*args, chain_off=reqs.block_off, chain_ids=reqs.block_ids, chain_len=reqs.block_len,
                   chain_shift=reqs.block_shift)
    _same(grouped, _run(*args, chain_off=off, chain_ids=ids))
    _same(grouped, _hashed(lambda: _run(*args, chain_off=reqs.block_off, chain_ids=reqs.block_ids,
                                        chain_len=reqs.block_len, chain_shift=reqs.block_shift)))


def test_tables_follow_the_gpu_cache_not_the_ids_named():
    kv_blocks = 86_000  # the default node's cache
    small = prefix_tables(1_400_000, kv_blocks)  # the shipped conversation trace's distinct blocks: by id
    assert small.index.size == 0 and small.ref.size == 1_400_000
    assert sum(a.nbytes for a in small) == 17 * 1_400_000 + 48  # ref, prev, next, gap: int32; cached: bool
    big = prefix_tables(62_500_000, kv_blocks)  # a 12 MB file of 1,000 pairs of 1,954 distinct hashes
    assert big.ref.size == 2 * kv_blocks + 64 and big.index.size == 1 << 19  # a power of two >= 2 x slots
    assert sum(a.nbytes for a in big) < 80 * kv_blocks  # not 17 x 62.5 M = 1.06 GB
    stacked = prefix_tables(62_500_000, 1000, instances=3)
    assert stacked.ref.shape == (3, 2064) and stacked.ends[:, 3].tolist() == [2064] * 3
