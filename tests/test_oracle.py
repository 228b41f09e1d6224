"""The engine against an oracle written from vLLM V1's own code (issue 36, "An oracle from vLLM, not from the
engine"): tests/oracle/ is a plain-Python scheduler, KV-cache manager and block pool, each rule citing the vLLM file
and function it restates. On 125 random small scenarios per scheduling class (1,000 in all: 3-30 requests, KV caches
small enough to preempt, small budgets and max_num_seqs) both run on the engine's clock and must agree at every step
on the tokens prefilled and decoded, the requests running, preempted, admitted and swapped, the tokens served from
the prefix cache and the KV blocks in use; and per request on its preemptions and its first admission's cache hit.

The rules the engine models on purpose from another engine (vLLM V0, SGLang) are the policy's named fields
(``prefill_only_steps``, ``preempt_for_waiting``, ``watermark``): the oracle reads them and runs them too."""
from __future__ import annotations

import pytest

from batching.sim.policy import BatchingPolicy
from tests.oracle import harness
from tests.oracle.kv_manager import KVCacheManager
from tests.oracle.scheduler import Request, Rules, Scheduler

SCENARIOS_PER_CLASS = 125


@pytest.mark.parametrize("cls", list(harness.CLASSES))
def test_the_engine_schedules_as_vllm_v1_step_by_step(cls):
    if not harness.available(cls):
        pytest.skip(f"BatchingPolicy has no {', '.join(harness.V0_FIELDS)} yet: the class {cls!r} sets them")
    failed = []
    for seed in range(SCENARIOS_PER_CLASS):
        sc = harness.scenario(cls, seed)
        o = harness.compare(sc)
        if o.mismatch:
            failed.append((len(sc.prompt), o.steps, seed, o.mismatch))
    if failed:
        n, steps, seed, text = min(failed)
        pytest.fail(f"{len(failed)} of {SCENARIOS_PER_CLASS} {cls!r} scenarios disagree with the oracle; the "
                    f"smallest (seed {seed}, {n} requests, {steps} engine steps):\n{text}", pytrace=False)


def test_the_scenarios_preempt_hit_swap_and_speculate():
    """The comparison is not vacuous: run alone, the oracle preempts in every class, recompute victims find blocks
    they computed themselves with and without shared prompts, swap classes swap, speculative ones verify drafts."""
    seen = {}
    for cls in ("chunked", "whole", "priority", "swap", "prefix_shared", "prefix_own", "sessions", "spec"):
        pre = victim = swaps = drafts = 0
        for seed in range(30):
            steps, _ = harness.run_alone(harness.scenario(cls, seed))
            pre += sum(s.preempted for s in steps)
            victim += sum(s.victim_cached for s in steps)
            swaps += sum(s.swap_tokens > 0 for s in steps)
            drafts += sum(s.spec_tokens for s in steps)
        seen[cls] = (pre, victim, swaps, drafts)
    assert all(v[0] > 0 for v in seen.values()), seen
    assert all(seen[c][1] > 0 for c in ("prefix_shared", "prefix_own", "sessions")), seen
    assert seen["swap"][2] > 0 and seen["spec"][3] > 0, seen


# --- the oracle's own rules, by hand -----------------------------------------------------------------
def _sched(kv_blocks, *, priority=False, prefix_caching=False, budget=512):
    return Scheduler(Rules(budget=budget, max_num_seqs=8, chunked=True, priority=priority, preemption="recompute",
                           swap_cap_tokens=0, kv_blocks=kv_blocks, prefix_caching=prefix_caching))


def _req(rid, prompt, output, arrival, prio=0):
    r = Request(rid, prompt, output, prio, [("own", rid, j) for j in range(64)])
    r.arrival_time = arrival
    return r


def test_fcfs_preempts_the_last_of_the_running_list_not_the_latest_arrival():
    # scheduler.py, Scheduler.schedule: self.running.pop(). r0 (arrived at 5) was admitted before r1 (arrived at 1):
    # when r0's decode needs a third block, r1, the last in the list, goes, though it arrived first
    s = _sched(3)
    s.add_request(_req(0, 32, 5, 5.0))
    s.add_request(_req(1, 8, 5, 1.0))
    s.schedule()
    s.update()
    st = s.schedule()
    assert st.events == ["preempt r1"] and st.who == {0: 1}


def test_priority_preempts_the_lowest_class_anywhere_in_the_list_and_takes_back_its_budget():
    # Scheduler.schedule with SchedulingPolicy.PRIORITY: max(running, key=(priority, arrival_time)) over the whole
    # list. Class-1 r0 runs ahead of class-0 r1; r1's decode needs a block: r0, already scheduled in this step,
    # is preempted and its token given back
    s = _sched(3, priority=True)
    s.add_request(_req(0, 8, 5, 0.0, prio=1))
    s.schedule()
    s.update()
    s.add_request(_req(1, 32, 5, 1.0, prio=0))
    s.schedule()
    s.update()
    st = s.schedule()
    assert st.events == ["preempt r0"] and st.who == {1: 1}
    s.update()
    assert (st.decode, st.running) == (1, 1)


def test_a_hit_leaves_one_token_to_compute_and_freed_blocks_are_evicted_tail_first():
    kv = KVCacheManager(3, enable_caching=True)
    a = Request(0, 48, 1, 0, [1, 2, 3])
    kv.allocate_slots(a, 48)  # 3 full blocks, cached
    kv.free(a)  # back last first: the free queue is [3, 2, 1]
    assert [b.block_hash for b in kv.pool.free_queue.blocks()] == [3, 2, 1]
    # kv_cache_manager.py get_computed_blocks: at most num_tokens - 1 tokens hit
    assert kv.get_computed_blocks(Request(1, 48, 1, 0, [1, 2, 3]))[1] == 32
    assert kv.get_computed_blocks(Request(2, 49, 1, 0, [1, 2, 3, 4]))[1] == 48
    # block_pool.py get_new_blocks: the queue's head (the chain's tail) is evicted first
    kv.allocate_slots(Request(3, 10, 1, 0, [("own", 3, 0)]), 10)
    assert kv.get_computed_blocks(Request(4, 49, 1, 0, [1, 2, 3, 4]))[1] == 32


def test_the_oracle_reads_the_named_non_v1_rules_with_v1_defaults():
    p = BatchingPolicy(mode="continuous", watermark=0.0)
    r = Rules.from_policy(p, 100, 0)
    assert (r.prefill_only_steps, r.preempt_for_waiting, r.watermark_blocks) == (
        getattr(p, "prefill_only_steps", False), getattr(p, "preempt_for_waiting", False), 0)
    assert Rules.from_policy(BatchingPolicy(mode="continuous", watermark=0.1), 100, 0).watermark_blocks == 10


def _recompute_last_prompt_block(merge: bool) -> KVCacheManager:
    """r0's 32-token prompt is cached (hashes 7, 8) and freed; r1 has the same 32 tokens: its hit stops at 16
    (the last token is computed: max_cache_hit_length = num_tokens - 1), so its second block is computed again
    into a new block and named 8 while r0's copy of 8 still sits in the free queue."""
    kv = KVCacheManager(4, enable_caching=True, merge_duplicates=merge)
    r0 = Request(0, 32, 1, 0, [7, 8])
    kv.allocate_slots(r0, 32)  # blocks 0, 1
    kv.free(r0)  # the free queue: 2, 3, then 1, 0 (last first)
    r1 = Request(1, 32, 1, 0, [7, 8])
    hit, tokens = kv.get_computed_blocks(r1)
    assert tokens == 16
    kv.allocate_slots(r1, 16, tokens, hit)  # block 0 touched, block 2 from the queue's head
    return kv


def test_v1_keeps_both_copies_of_a_block_computed_twice():
    # block_pool.py, BlockPool.cache_full_blocks: "We currently don't de-duplicate"; get_cached_block: the first
    kv = _recompute_last_prompt_block(merge=False)
    assert [b.block_id for b in kv.req_to_blocks[1]] == [0, 2]
    assert sorted(kv.pool.cached[8]) == [1, 2] and kv.pool.get_cached_block(8).block_id == 1
    assert [b.block_id for b in kv.pool.free_queue.blocks()] == [3, 1]
    assert (kv.pool.blocks_in_use(), kv.pool.cached_free_blocks()) == (2, 1)


def test_the_engines_rule_merges_a_block_computed_twice_into_the_cached_copy():
    # the engine's named difference (block_pool.py's note; V0's promote_to_immutable_block, SGLang's radix cache):
    # r1 takes r0's copy of 8 from the free queue, its own block 2 goes back to the queue's tail without a name
    kv = _recompute_last_prompt_block(merge=True)
    assert [b.block_id for b in kv.req_to_blocks[1]] == [0, 1]
    assert list(kv.pool.cached[8]) == [1] and kv.pool.blocks[2].block_hash is None
    assert [b.block_id for b in kv.pool.free_queue.blocks()] == [3, 2]
    assert (kv.pool.blocks_in_use(), kv.pool.cached_free_blocks()) == (2, 0)
    kv.free(Request(1, 32, 1, 0, [7, 8]))  # back last first: 1 (named 8), then 0 (named 7)
    assert [b.block_id for b in kv.pool.free_queue.blocks()] == [3, 2, 1, 0]
