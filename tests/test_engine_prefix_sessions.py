"""The engine's prefix cache and closed-loop session turns: hand-computed cases (constant 1 s steps) and
conservation laws over random scenarios (hypothesis)."""
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.engine import kernel as eng
from batching.sim.hardware.costmodel import cost_model
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.workload.prefixes import offsets
from batching.sim.simulate import run_requests
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, deployment
from batching.sim.workload.requests import workload_preset
from tests.test_engine import const_cost

CM = cost_model(deployment())
EXAMPLES = int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "300"))
B = KV_BLOCK_TOKENS


def chains(lists):
    """CSR offsets and ids of per-request block-id lists."""
    off = np.zeros(len(lists) + 1, np.int64)
    off[1:] = np.cumsum([len(x) for x in lists])
    ids = np.array([i for x in lists for i in x], np.int64)
    return off, ids


def run(arrival, prompt, output, *, chain=None, after=None, think=None, prefix_caching=True, mode=eng.MODE_CONTINUOUS,
        max_batch=32, max_wait_s=0.0, max_seqs=256, budget=8192, chunked=False, preempt=eng.PREEMPT_RECOMPUTE,
        kv_blocks=10**6):
    n = len(arrival)
    coef, x, y = const_cost()
    off, ids = chains(chain) if chain is not None else (None, None)
    inp = eng.inputs(np.asarray(arrival, float), np.asarray(prompt), np.asarray(output), np.zeros(n, np.int64),
                     chain_off=off, chain_ids=ids, after=None if after is None else np.asarray(after),
                     think_s=None if think is None else np.asarray(think, float))
    knobs = eng.Knobs(mode=mode, n_classes=1, max_batch=max_batch, max_wait_s=max_wait_s, max_seqs=max_seqs,
                      budget=budget, chunked=chunked, use_prio=False, preempt=preempt, swap_cap_tokens=10**9,
                      watermark_blocks=0, kv_blocks=kv_blocks)
    return eng.run(inp, knobs, eng.Cost(coef, x, y), prefix_caching=prefix_caching)


# --- prefix caching, by hand ---------------------------------------------------------------
def test_a_later_request_skips_the_cached_prefix_and_reads_it_in_attention():
    # two 100-token prompts sharing their first 64 tokens (4 blocks); the second arrives after the first left
    out = run([0.0, 10.0], [100, 100], [2, 2], chain=[[0, 1, 2, 3], [0, 1, 2, 3]])
    assert out.req_cached.tolist() == [0, 64]
    si, sf = out.steps_i, out.steps_f
    prefill = si[si[:, eng.S_PREFILL] > 0]
    assert prefill[:, eng.S_PREFILL].tolist() == [100, 36]  # only the uncached tokens are computed
    assert prefill[:, eng.S_CACHED_TOKENS].tolist() == [0, 64]
    # attention of the second prompt reads the 64 cached tokens: 36 * (64 + 36 / 2)
    assert sf[si[:, eng.S_PREFILL] == 36, eng.F_ATTN_WORK][0] == pytest.approx(36 * (64 + 18))


def test_at_least_one_prompt_token_is_computed_even_when_all_are_cached():
    # the prompt is exactly 4 cached blocks: vLLM recomputes the last block, so 3 blocks are served
    out = run([0.0, 10.0], [64, 64], [1, 1], chain=[[0, 1, 2, 3], [0, 1, 2, 3]])
    assert out.req_cached.tolist() == [0, 48]


def test_caching_off_or_without_chains_schedules_the_same_without_preemption():
    """Nothing shared and nothing preempted: the block pool (on whenever prefix caching is, as vLLM V1's) finds no
    hit, so every request and step is as with caching off, but for the blocks it keeps cached once freed (a
    request's own, named: S_CACHE_BLOCKS), which caching off has none of."""
    args = ([0.0, 0.5, 3.0], [100, 300, 50], [5, 3, 9])
    base = run(*args, prefix_caching=False)
    sched = [c for c in range(eng.NUM_SI) if c != eng.S_CACHE_BLOCKS]
    assert base.steps_i[:, eng.S_CACHE_BLOCKS].sum() == 0
    for kw in ({"chain": [[0, 1], [0, 1], [0, 1]], "prefix_caching": False}, {"chain": [[], [], []]}, {}):
        other = run(*args, **kw)
        assert np.array_equal(other.req_f, base.req_f)
        assert np.array_equal(other.steps_i[:, sched], base.steps_i[:, sched])
        assert other.steps_i[:, eng.S_CACHED_TOKENS].sum() == 0
    # with caching on, each finished request's full blocks stay cached: 100, 300 and 50 + 9 - 1 tokens of prompt
    # and output KV, 6 + 18 + 3 full blocks, all evictable at the end
    assert run(*args).steps_i[-1, eng.S_CACHE_BLOCKS] == 6 + 18 + 3


def test_unused_cached_blocks_are_reclaimed_least_recently_used_first():
    # 12 blocks of cache, one free queue (vLLM V1's block pool): never-used blocks first, then freed ones in the
    # order they were freed, each request's last block first. Request 0 (chain A, 80 tokens: A's 4 blocks and one of
    # its own) takes blocks from the 12 never used and frees [own, A3, A2, A1, A0]; request 1 (chain B) takes 5 more
    # never-used ones and frees [own, B3 .. B0]. Request 2 (6 blocks of its own) takes the 2 never-used left, then
    # request 0's own block and A3, A2, A1. Request 3 (chain A) then hits A0 only, and its 4 new blocks take request
    # 1's own block and B3, B2, B1: request 4 (chain B) hits B0 only.
    out = run([0.0, 10.0, 20.0, 30.0, 40.0], [80, 80, 96, 80, 80], [1, 1, 1, 1, 1],
              chain=[[0, 1, 2, 3], [10, 11, 12, 13], [], [0, 1, 2, 3], [10, 11, 12, 13]], kv_blocks=12)
    assert out.req_cached.tolist() == [0, 0, 0, 16, 16]
    si = out.steps_i
    assert (si[:, eng.S_KV_BLOCKS] + si[:, eng.S_CACHE_BLOCKS] <= 12).all()
    assert si[-1, eng.S_CACHE_BLOCKS] > 0  # what nobody uses stays cached after the run
    # a cache of 16 blocks keeps A and B whole (request 2 takes the 6 never-used blocks left): requests 3 and 4 hit
    # all they may (one prompt token is always computed: 4 blocks of 5)
    out = run([0.0, 10.0, 20.0, 30.0, 40.0], [80, 80, 96, 80, 80], [1, 1, 1, 1, 1],
              chain=[[0, 1, 2, 3], [10, 11, 12, 13], [], [0, 1, 2, 3], [10, 11, 12, 13]], kv_blocks=16)
    assert out.req_cached.tolist() == [0, 0, 0, 64, 64]


def test_a_block_in_use_is_never_reclaimed():
    # request 0 holds chain [0..3] while decoding for a long time; request 1 needs the rest of the cache, and
    # request 2 (same chain) still hits all 4 blocks because they were in use, never reclaimable
    out = run([0.0, 1.5, 3.5], [65, 96, 65], [40, 1, 1], chain=[[0, 1, 2, 3], [], [0, 1, 2, 3]], kv_blocks=14)
    assert out.req_cached.tolist() == [0, 0, 64]


def test_a_recompute_victim_reuses_its_own_cached_blocks():
    # two decoding sequences outgrow a 9-block cache: the later one is preempted (recompute) and, readmitted,
    # finds its cached prompt blocks: it recomputes fewer tokens than prompt + generated
    out = run([0.0, 0.0], [64, 64], [40, 40], chain=[[0, 1, 2, 3], [4, 5, 6, 7]], kv_blocks=9)
    assert out.req_preemptions.tolist() == [0, 1]
    recompute = out.steps_i[(out.steps_i[:, eng.S_PREFILL] > 0)][1:]  # prefills after the first step
    assert recompute[:, eng.S_CACHED_TOKENS].sum() > 0
    assert out.req_cached.tolist() == [0, 0]  # the hit rate counts first admissions only


def test_request_level_modes_ignore_prefix_caching():
    args = ([0.0, 0.0, 5.0], [100, 100, 100], [3, 3, 3])
    chain = [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
    for mode in (eng.MODE_STATIC, eng.MODE_DYNAMIC):
        on = run(*args, chain=chain, mode=mode, max_batch=2)
        off = run(*args, mode=mode, max_batch=2, prefix_caching=False)
        assert np.array_equal(on.req_f, off.req_f) and on.req_cached.sum() == 0


def test_unbounded_cache_in_fifo_order_serves_every_earlier_block():
    rng = np.random.default_rng(5)
    n = 60
    prompt = rng.integers(20, 400, n)
    fam = rng.integers(0, 4, n)
    chain = [[int(f) * 100 + j for j in range(int(rng.integers(0, p // B + 1)))] for f, p in zip(fam, prompt)]
    out = run(np.sort(rng.uniform(0, 30, n)), prompt, rng.integers(1, 30, n), chain=chain)
    seen: set[int] = set()
    ideal = []
    for ids, p in zip(chain, prompt):
        m = 0
        while m < min(len(ids), (p - 1) // B) and ids[m] in seen:
            m += 1
        ideal.append(m * B)
        seen.update(ids)
    assert out.req_cached.tolist() == ideal


# --- sessions, by hand ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", [eng.MODE_STATIC, eng.MODE_DYNAMIC, eng.MODE_CONTINUOUS])
def test_a_turn_arrives_its_think_time_after_the_previous_answer(mode):
    # request 1 is request 0's next turn (think 5 s); request 2 is independent
    out = run([0.0, 5.0, 1.0], [10, 30, 10], [3, 2, 2], after=[-1, 0, -1], think=[0.0, 5.0, 0.0], mode=mode,
              max_batch=1)
    rf = out.req_f
    assert rf[1, eng.R_ARRIVAL] == pytest.approx(rf[0, eng.R_RELEASE] + 5.0)
    assert rf[1, eng.R_FIRST_SCHED] >= rf[1, eng.R_ARRIVAL]
    assert rf[[0, 2], eng.R_ARRIVAL].tolist() == [0.0, 1.0]


def test_a_session_turn_hits_the_history_its_predecessor_cached():
    # turn 1: 40-token prompt, 25 output tokens; the KV of all but the last output token is computed: 64 tokens,
    # 4 full blocks. Turn 2's prompt is the 65-token history plus a 20-token message; its chain starts with turn
    # 1's 4 blocks (prompt and output blocks), all served from the cache
    out = run([0.0, 2.0], [40, 85], [25, 5], chain=[[0, 1, 2, 3], [0, 1, 2, 3]], after=[-1, 0], think=[0.0, 2.0])
    assert out.req_cached.tolist() == [0, 64]
    # one output token fewer: the 4th block is never full (the last token's KV is not computed), 3 blocks hit
    out = run([0.0, 2.0], [40, 84], [24, 5], chain=[[0, 1, 2, 3], [0, 1, 2, 3]], after=[-1, 0], think=[0.0, 2.0])
    assert out.req_cached.tolist() == [0, 48]
    assert out.req_f[1, eng.R_ARRIVAL] == pytest.approx(out.req_f[0, eng.R_RELEASE] + 2.0)


# --- prompts that share nothing: the same run with prefix caching on or off -----------------------------
@pytest.mark.parametrize("wl,rate", [("mixed", 2.0), ("chat", 6.0)])
@pytest.mark.parametrize("name", ["continuous", "chunked", "priority"])
def test_prompts_that_share_nothing_run_the_same_with_prefix_caching_on_or_off(wl, rate, name):
    """Every full prompt block its own id: with caching on the engine looks each chain up, registers its blocks
    and, as the 600 requests need more blocks than the cache holds, reclaims the unused ones; nothing ever hits,
    so every request's times and every step equal those of caching off (PRESETS: prefix caching changes nothing
    without shared prefixes). Only the count of blocks held by the cache alone differs."""
    reqs = workload_preset(wl, rate, 600, 3).generate()
    assert reqs.block_off is None  # these presets share no prefix
    off = offsets(reqs.prompt_tokens // B)
    unique = replace(reqs, block_off=off, block_ids=np.arange(off[-1]))
    # a cache of 10,000 blocks: above the runs' peak use (under 5,000 blocks: nobody is preempted, which under
    # recompute would let a victim find its own blocks) and far below the 42,882 (chat) and 61,902 (mixed)
    # blocks the prompts register, so the cache fills and its unused blocks are reclaimed
    dep = deployment(kv_cache_tokens=10_000 * B)
    assert off[-1] > 4 * dep.kv_capacity_blocks
    on = run_requests(unique, dep, PRESETS[name], CM)
    without = run_requests(unique, dep, with_knobs(PRESETS[name], prefix_caching=False), CM)
    keep = [c for c in range(eng.NUM_SI) if c != eng.S_CACHE_BLOCKS]
    for (_, _, a), (_, _, b) in zip(on, without, strict=True):
        assert a.req_cached.sum() == 0 and a.steps_i[:, eng.S_CACHE_BLOCKS].max() > 0
        np.testing.assert_array_equal(a.req_f, b.req_f)
        assert a.req_preemptions.sum() == b.req_preemptions.sum() == 0
        np.testing.assert_array_equal(a.steps_i[:, keep], b.steps_i[:, keep])
        np.testing.assert_array_equal(a.steps_f, b.steps_f)


# --- conservation over random scenarios ---------------------------------------------------------
@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 30))
    arrival = np.cumsum(draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n)))
    prompt = np.array(draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), np.int64)
    output = np.array(draw(st.lists(st.integers(1, 80), min_size=n, max_size=n)), np.int64)
    fam = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    chain = [[f * 50 + j for j in range(draw(st.integers(0, min(20, (p + o) // B))))]
             for f, p, o in zip(fam, prompt, output)]
    after = np.full(n, -1, np.int64)
    think = np.zeros(n)
    if draw(st.booleans()):
        for i in range(1, n):
            j = draw(st.integers(-1, i - 1))
            if j >= 0 and j not in after:
                after[i] = j
                think[i] = draw(st.floats(0.0, 3.0))
    mode = draw(st.sampled_from([eng.MODE_STATIC, eng.MODE_DYNAMIC, eng.MODE_CONTINUOUS]))
    chunked = draw(st.booleans()) if mode == eng.MODE_CONTINUOUS else False
    need = int(((prompt + output + B - 1) // B).max())
    kw = dict(mode=mode, chunked=chunked, max_batch=draw(st.integers(1, 8)), max_wait_s=draw(st.floats(0.0, 1.0)),
              max_seqs=draw(st.integers(1, 16)),
              budget=draw(st.integers(16, 512)) if chunked else draw(st.integers(int(prompt.max()), 2048)),
              preempt=draw(st.sampled_from([eng.PREEMPT_OFF, eng.PREEMPT_RECOMPUTE, eng.PREEMPT_SWAP])),
              kv_blocks=draw(st.integers(need, need * 4)))
    return arrival, prompt, output, chain, after, think, kw


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_conservation_with_prefix_caching_and_sessions(case):
    arrival, prompt, output, chain, after, think, kw = case
    coef, ar_x, ar_y = CM.coef, CM.ar_log_bytes, CM.ar_s
    off, ids = chains(chain)
    n = len(arrival)
    inp = eng.inputs(arrival, prompt, output, np.zeros(n, np.int64), chain_off=off, chain_ids=ids, after=after,
                     think_s=think)
    knobs = eng.Knobs(mode=kw["mode"], n_classes=1, max_batch=kw["max_batch"], max_wait_s=kw["max_wait_s"],
                      max_seqs=kw["max_seqs"], budget=kw["budget"], chunked=kw["chunked"], use_prio=False,
                      preempt=kw["preempt"], swap_cap_tokens=1000, watermark_blocks=0, kv_blocks=kw["kv_blocks"])
    out = eng.run(inp, knobs, eng.Cost(coef, ar_x, ar_y), prefix_caching=True)
    rf, si = out.req_f, out.steps_i
    # every request arrives (a turn: its predecessor's release + think time) and is released once, in order
    turns = after >= 0
    assert np.allclose(rf[turns, eng.R_ARRIVAL], rf[after[turns], eng.R_RELEASE] + think[turns])
    assert np.array_equal(rf[~turns, eng.R_ARRIVAL], arrival[~turns])
    assert (rf[:, eng.R_FIRST_SCHED] >= rf[:, eng.R_ARRIVAL]).all()
    assert (rf[:, eng.R_FIRST_TOKEN] <= rf[:, eng.R_RELEASE]).all()
    # output tokens conserved: one useful token per emitting sequence and step
    assert si[:, eng.S_LM].sum() == output.sum()
    # blocks referenced plus blocks only cached never exceed the cache; both are counts
    assert (si[:, eng.S_KV_BLOCKS] >= 0).all() and (si[:, eng.S_CACHE_BLOCKS] >= 0).all()
    assert (si[:, eng.S_KV_BLOCKS] + si[:, eng.S_CACHE_BLOCKS] <= kw["kv_blocks"]).all()
    # prompt tokens: computed + served from cache covers each prompt; at least one prompt token computed
    assert (out.req_cached <= np.maximum(prompt - 1, 0)).all()
    assert (out.req_cached % B == 0).all()
    if kw["mode"] != eng.MODE_CONTINUOUS:
        assert out.req_cached.sum() == 0
    # continuous: nothing referenced is left once every request is released (a block freed while referenced,
    # or never freed, would leave the count off zero); request-level modes record the batch's reservation
    if kw["mode"] == eng.MODE_CONTINUOUS:
        assert si[-1, eng.S_KV_BLOCKS] == 0
