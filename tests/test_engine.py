"""Hand-computed tiny scenarios per mode, with a constant 1 s step time."""
import numpy as np
import pytest

from batching.sim.hardware import costmodel as cmod
from batching.sim.engine import kernel as eng


def const_cost(step_s=1.0, swap_tokens_per_s=32.0):
    """Every step with work takes ``step_s``; swapping adds tokens / swap_tokens_per_s."""
    c = np.zeros(cmod.NUM_COEFS)
    c[cmod.C_FIXED] = step_s
    c[cmod.C_LAYERS] = 0.0
    c[cmod.C_LIN_FLOPS_RATE] = 1.0
    c[cmod.C_LIN_BW] = 1.0
    c[cmod.C_LM_FLOPS_RATE] = 1.0
    c[cmod.C_LM_BW] = 1.0
    c[cmod.C_ATTN_RATE] = 1.0
    c[cmod.C_KV_BW] = 1.0
    c[cmod.C_KV_BYTES_TOK] = 1.0
    c[cmod.C_SWAP_BW] = swap_tokens_per_s
    return c, np.array([0.0, 1.0]), np.array([0.0, 0.0])


def run(arrival, prompt, output, prio=None, *, mode=eng.MODE_CONTINUOUS, max_batch=32, max_wait_s=0.0,
        max_seqs=256, budget=8192, chunked=False, use_prio=False, preempt=eng.PREEMPT_RECOMPUTE,
        swap_cap=10**9, watermark=0, kv_blocks=10**6, n_classes=None, prefill_only=False, wait_preempt=False):
    prio = np.zeros(len(arrival), np.int64) if prio is None else np.asarray(prio)
    n_classes = int(prio.max()) + 1 if n_classes is None else n_classes
    coef, x, y = const_cost()
    knobs = eng.Knobs(mode=mode, n_classes=n_classes, max_batch=max_batch, max_wait_s=max_wait_s, max_seqs=max_seqs,
                      budget=budget, chunked=chunked, use_prio=use_prio, preempt=preempt, swap_cap_tokens=swap_cap,
                      watermark_blocks=watermark, kv_blocks=kv_blocks, prefill_only=prefill_only,
                      wait_preempt=wait_preempt)
    return eng.run(eng.inputs(np.asarray(arrival, float), np.asarray(prompt), np.asarray(output), prio), knobs,
                   eng.Cost(coef, x, y))


def col(out, c):
    return out.req_f[:, c].tolist()


def test_static_waits_for_a_full_batch_pads_and_releases_together():
    out = run([0.0, 0.5, 1.0], [4, 8, 2], [3, 1, 2], mode=eng.MODE_STATIC, max_batch=2)
    assert col(out, eng.R_FIRST_SCHED) == [0.5, 0.5, 3.5]
    assert col(out, eng.R_FIRST_TOKEN) == [1.5, 1.5, 4.5]
    assert col(out, eng.R_FINISH) == [3.5, 1.5, 5.5]
    assert col(out, eng.R_RELEASE) == [3.5, 3.5, 5.5]
    si = out.steps_i
    assert out.steps_f[:, eng.F_START].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert si[:, eng.S_PREFILL].tolist() == [12, 0, 0, 2, 0]
    assert si[:, eng.S_PADDED].tolist() == [2 * 8 - 12, 1, 1, 0, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 1, 1, 0, 1]
    assert si[:, eng.S_LM].sum() == 3 + 1 + 2
    assert si[:, eng.S_ADMITTED].tolist() == [2, 0, 0, 1, 0]
    assert si[:, eng.S_RUNNING].tolist() == [2, 1, 1, 1, 1]


def test_dynamic_launches_on_timeout_then_on_full_batch():
    out = run([0.0, 0.5, 1.0], [4, 8, 2], [3, 1, 2], mode=eng.MODE_DYNAMIC, max_batch=2, max_wait_s=0.2)
    assert col(out, eng.R_FIRST_SCHED) == [0.2, 3.2, 3.2]
    assert col(out, eng.R_FIRST_TOKEN) == [1.2, 4.2, 4.2]
    assert col(out, eng.R_RELEASE) == [3.2, 5.2, 5.2]
    assert col(out, eng.R_FINISH) == [3.2, 4.2, 5.2]


def test_continuous_without_chunking_runs_prefill_only_steps():
    """The prefill-only rule (vLLM V0, SGLang without mixed chunks)."""
    out = run([0.0, 0.5, 1.0], [4, 8, 2], [3, 1, 2], prefill_only=True)
    assert col(out, eng.R_FIRST_TOKEN) == [1.0, 2.0, 2.0]
    assert col(out, eng.R_FINISH) == [4.0, 2.0, 3.0]
    assert col(out, eng.R_RELEASE) == [4.0, 2.0, 3.0]
    # request 0 stalled during the prefill-only step of 1 and 2: its gap 1 -> 3
    assert col(out, eng.R_MAX_ITL) == [2.0, 0.0, 1.0]
    si = out.steps_i
    assert si[:, eng.S_PREFILL].tolist() == [4, 10, 0, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 0, 2, 1]


def test_chunked_prefill_mixes_decodes_with_chunks_under_the_budget():
    out = run([0.0, 0.0, 0.0], [6, 3, 2], [2, 2, 1], chunked=True, budget=4)
    si = out.steps_i
    assert si[:, eng.S_PREFILL].tolist() == [4, 4, 3, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 0, 1, 1]
    assert col(out, eng.R_FIRST_TOKEN) == [2.0, 3.0, 3.0]
    assert col(out, eng.R_FINISH) == [3.0, 4.0, 3.0]
    assert col(out, eng.R_FIRST_SCHED) == [0.0, 1.0, 2.0]
    assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]).max() <= 4


def test_priority_preempts_a_lower_class_and_recomputes_it():
    """The waiting-side rule (vLLM V0's _schedule_priority_preemption), on when the policy names it."""
    out = run([0.0, 0.5], [2, 2], [4, 2], prio=[1, 0], use_prio=True, max_seqs=1, wait_preempt=True)
    si = out.steps_i
    # t=1: request 1 (class 0) finds no slot and evicts request 0 (class 1); that pass admits no
    # one (vLLM), so it runs nothing and costs the fixed overhead; request 1 is admitted at t=2
    assert si[:, eng.S_PREEMPTED].tolist() == [0, 1, 0, 0, 0, 0, 0]
    assert si[:, eng.S_ADMITTED].tolist() == [1, 0, 1, 0, 1, 0, 0]
    assert col(out, eng.R_FIRST_TOKEN) == [1.0, 3.0]
    assert col(out, eng.R_FINISH) == [7.0, 4.0]
    assert out.req_preemptions.tolist() == [1, 0]
    assert col(out, eng.R_MAX_ITL)[0] == 4.0  # token 1 at t=1, token 2 after the recompute at t=5
    # the recompute prefills prompt + the generated token again
    assert si[:, eng.S_PREFILL].tolist() == [2, 0, 2, 0, 3, 0, 0]


def test_priority_victim_swapped_out_waits_for_the_higher_class():
    """The evicted class-1 request, in host memory, comes back only after the class-0 request it
    made room for was admitted (else it would be swapped in and out again, forever)."""
    out = run([0.0, 0.5], [2, 2], [4, 2], prio=[1, 0], use_prio=True, max_seqs=1, preempt=eng.PREEMPT_SWAP,
              wait_preempt=True)
    si, f = out.steps_i, out.steps_f
    assert si[:, eng.S_PREEMPTED].tolist() == [0, 1, 0, 0, 0, 0, 0]
    assert si[:, eng.S_ADMITTED].tolist() == [1, 0, 1, 0, 0, 0, 0]
    assert si[:, eng.S_SWAP_TOKENS].tolist() == [0, 2, 0, 0, 2, 0, 0]  # out at t=1, in at t=4.0625
    assert si[:, eng.S_SWAPPED].tolist() == [0, 1, 1, 1, 0, 0, 0]
    # the swap-in step also decodes the swapped-in request: 2 tokens at 32 tokens/s add 1/16 s
    assert f[:, eng.F_DURATION].tolist() == [1.0, 1.0625, 1.0, 1.0, 1.0625, 1.0, 1.0]
    assert si[:, eng.S_DECODE].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert col(out, eng.R_FINISH) == [7.125, 4.0625]


def test_fifo_without_priority_does_not_preempt():
    out = run([0.0, 0.5], [2, 2], [4, 2], prio=[1, 0], use_prio=False, max_seqs=1)
    assert out.req_preemptions.tolist() == [0, 0]
    assert col(out, eng.R_FINISH) == [4.0, 6.0]


def test_kv_exhaustion_preempts_the_latest_by_recompute():
    out = run([0.0, 0.0], [16, 16], [2, 2], kv_blocks=2)
    assert out.req_preemptions.tolist() == [0, 1]
    assert col(out, eng.R_FINISH) == [2.0, 3.0]
    assert out.steps_i[:, eng.S_PREFILL].tolist() == [32, 0, 17]
    assert out.steps_i[:, eng.S_KV_BLOCKS].max() <= 2


def test_kv_exhaustion_swaps_out_and_back_in_paying_pcie_time():
    out = run([0.0, 0.0], [16, 16], [2, 2], kv_blocks=2, preempt=eng.PREEMPT_SWAP)
    assert out.req_preemptions.tolist() == [0, 1]
    f = out.steps_f
    # swap-out of 16 tokens at 32 tokens/s adds 0.5 s; the swap-in step (fixed 1 s + 0.5 s) also
    # decodes the swapped-in sequence
    assert f[:, eng.F_DURATION].tolist() == [1.0, 1.5, 1.5]
    assert out.steps_i[:, eng.S_SWAP_TOKENS].tolist() == [0, 16, 16]
    assert out.steps_i[:, eng.S_SWAPPED].tolist() == [0, 1, 0]
    assert out.steps_i[:, eng.S_DECODE].tolist() == [0, 1, 1]
    assert col(out, eng.R_FINISH) == [2.5, 4.0]
    # no recompute: prompt tokens prefilled once
    assert out.steps_i[:, eng.S_PREFILL].sum() == 32


def test_a_prompt_swapped_out_mid_prefill_comes_back_only_with_blocks_for_its_chunk():
    """vLLM V0 swaps back in after the running sequences, with the budget they left, and never swaps a sequence in
    and out in one step (SchedulerOutputs.__post_init__ asserts it): a sequence swapped out mid-prefill comes back
    with the blocks for its KV and its next chunk, or stays in host memory. 7 blocks, budget 32: r1's prompt (100)
    is chunked 16, 31, 31 beside r0's decodes; at t=3 its last 22 tokens need 2 more blocks, none is free, and r1,
    the last of the running list, is swapped out (78 tokens). Its chunk needs all 7 blocks while r0 holds 2, so it
    waits in host memory until r0 finishes (t=8; the old engine swapped it in with 5 blocks and out again in each
    of those steps), then prefills its 22 tokens and decodes 4."""
    out = run([0.0, 0.0], [16, 100], [8, 5], chunked=True, budget=32, kv_blocks=7, preempt=eng.PREEMPT_SWAP)
    si = out.steps_i
    assert out.req_preemptions.tolist() == [0, 1]
    assert si[:, eng.S_PREEMPTED].tolist() == [0, 0, 0, 1] + [0] * 9
    assert si[:, eng.S_SWAP_TOKENS].tolist() == [0, 0, 0, 78, 0, 0, 0, 0, 78, 0, 0, 0, 0]
    assert si[:, eng.S_PREFILL].tolist() == [32, 31, 31, 0, 0, 0, 0, 0, 22, 0, 0, 0, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    assert si[:, eng.S_KV_BLOCKS].max() <= 7


def test_chunked_recompute_victim_is_not_readmitted_in_the_step_that_evicted_it():
    """Request 1 runs out of KV at t=5 and preempts itself; vLLM admits no one in that step, so it
    starts over at t=6 (the old engine readmitted it at once, with the block it had just freed)."""
    out = run([2.0, 3.0], [4, 16], [4, 2], chunked=True, budget=16, kv_blocks=2)
    si = out.steps_i
    assert si[:, eng.S_PREEMPTED].tolist() == [0, 0, 0, 1, 0, 0]
    assert si[:, eng.S_ADMITTED].tolist() == [1, 1, 0, 0, 1, 0]
    assert si[:, eng.S_PREFILL].tolist() == [4, 15, 1, 0, 16, 1]
    assert si[:, eng.S_DECODE].tolist() == [0, 1, 1, 1, 0, 0]
    assert out.req_preemptions.tolist() == [0, 1]
    assert col(out, eng.R_FIRST_TOKEN) == [3.0, 5.0]
    assert col(out, eng.R_FINISH) == [6.0, 8.0]


def test_fcfs_victim_is_the_last_admitted_and_comes_back_first():
    """vLLM V1 first come first served: the request that cannot get a block preempts the running list's last
    (self.running.pop()), here a prompt still being chunked, even when a decoding request arrived with it.
    t=3: request 1 finishes its prompt (2 tokens), 2 (4 tokens) and 3 (first 2 of 40) are admitted, KV 3 of 3
    blocks. t=4: request 1's 17th token needs a second block: request 3 (admitted last) is swapped out (2 tokens
    at 32 tokens/s: +1/16 s); the step preempted, so nobody comes back or is admitted. t=5.0625: request 1 has
    finished, request 3 comes back (its 2 tokens copied in again) and takes the 7 tokens the decode left."""
    out = run([0.0, 1.0, 3.0, 3.0], [4, 16, 4, 40], [3, 2, 4, 2], chunked=True, budget=8, max_seqs=8, kv_blocks=3,
              preempt=eng.PREEMPT_SWAP)
    si = out.steps_i
    assert si[:5, eng.S_PREFILL].tolist() == [4, 7, 7, 8, 0]
    assert si[:5, eng.S_DECODE].tolist() == [0, 1, 1, 0, 2]
    assert si[:6, eng.S_SWAP_TOKENS].tolist() == [0, 0, 0, 0, 2, 2]
    assert si[:6, eng.S_ADMITTED].tolist() == [1, 1, 0, 2, 0, 0]
    assert si[5, eng.S_PREFILL] == 7 and si[5, eng.S_DECODE] == 1
    assert out.req_preemptions.tolist() == [0, 0, 0, 1]
    assert out.steps_f[:6, eng.F_START].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0625]
    assert si[:, eng.S_KV_BLOCKS].max() <= 3
    # every prompt token prefilled once (swap, not recompute) and every output token decoded
    assert si[:, eng.S_PREFILL].sum() == 4 + 16 + 4 + 40
    assert si[:, eng.S_PREFILL].sum() + si[:, eng.S_DECODE].sum() == 64 + (3 + 2 + 4 + 2) - 4


def test_priority_victim_is_the_lowest_class_even_when_it_is_the_requester():
    """vLLM V1 with priority: the victim is max(running, key=(priority, arrival)) over the whole running list.
    Request 0 (class 1, 14 tokens) is admitted at t=0, request 1 (class 0, 14 tokens) at t=1: one block each, KV
    full (2 blocks). t=3: request 0's 17th token needs a second block; the victim is request 0 itself (class 1),
    not request 1 behind it (the old rule looked behind the requester first and evicted the class-0 request).
    Having preempted itself, V1 leaves its running loop: request 1 gets no token in that step."""
    out = run([0.0, 0.5], [14, 14], [4, 4], prio=[1, 0], use_prio=True, kv_blocks=2, chunked=True, budget=64)
    si = out.steps_i
    assert si[:4, eng.S_PREFILL].tolist() == [14, 14, 0, 0]
    assert si[:4, eng.S_DECODE].tolist() == [0, 1, 2, 0]
    assert si[:4, eng.S_PREEMPTED].tolist() == [0, 0, 0, 1]
    assert out.req_preemptions.tolist() == [1, 0]
    assert si[:, eng.S_KV_BLOCKS].max() <= 2


def test_priority_victim_ahead_in_the_list_gives_its_token_back():
    """Requests 0 (class 0, 15 tokens), 1 (class 1, 10 tokens) and 2 (class 0, 15 tokens) are admitted at t=0,
    one block each of 4. t=2: 0's 17th token takes the last block, 1 decodes its 12th (no new block), 2's 17th
    needs one: V1 preempts max(running, (priority, arrival)) = request 1, ahead of 2 in the list and already
    scheduled in this step: its token goes back out of the step, and 2 decodes in its block."""
    out = run([0.0, 0.0, 0.0], [15, 10, 15], [4, 4, 4], prio=[0, 1, 0], use_prio=True, kv_blocks=4, chunked=True,
              budget=64)
    si = out.steps_i
    assert si[:3, eng.S_PREFILL].tolist() == [40, 0, 0]
    assert si[:3, eng.S_DECODE].tolist() == [0, 3, 2]
    assert si[:3, eng.S_PREEMPTED].tolist() == [0, 0, 1]
    assert out.req_preemptions.tolist() == [0, 1, 0]
    assert si[:, eng.S_KV_BLOCKS].max() <= 4


def test_prefill_only_steps_stall_the_decodes_without_chunking():
    out = run([0.0, 0.0, 2.0], [4, 4, 8], [4, 4, 2], prefill_only=True)
    si = out.steps_i
    assert si[:, eng.S_PREFILL].tolist() == [8, 0, 8, 0, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 2, 0, 3, 2]
    assert si[:, eng.S_STALLED].tolist() == [0, 0, 2, 0, 0]  # requests 0 and 1 wait out request 2's prefill
    assert si[:, eng.S_ADMITTED].tolist() == [2, 0, 1, 0, 0]


def test_swap_falls_back_to_recompute_when_host_space_is_full():
    out = run([0.0, 0.0], [16, 16], [2, 2], kv_blocks=2, preempt=eng.PREEMPT_SWAP, swap_cap=8)
    assert out.steps_i[:, eng.S_SWAP_TOKENS].sum() == 0
    assert out.steps_i[:, eng.S_PREFILL].tolist() == [32, 0, 17]


def test_preemption_off_reserves_prompt_plus_output():
    # each request needs ceil((16+17)/16) = 3 blocks for its whole life: only one fits in 4
    out = run([0.0, 0.0], [16, 16], [17, 2], kv_blocks=4, preempt=eng.PREEMPT_OFF)
    assert out.req_preemptions.tolist() == [0, 0]
    assert col(out, eng.R_FIRST_SCHED) == [0.0, 17.0]
    assert out.steps_i[:, eng.S_KV_BLOCKS].max() <= 4


def test_idle_clock_jumps_to_the_next_arrival():
    out = run([0.0, 100.0], [4, 4], [1, 1])
    assert out.steps_f[:, eng.F_START].tolist() == [0.0, 100.0]
    assert col(out, eng.R_RELEASE) == [1.0, 101.0]


def test_itl_histogram_counts_every_gap():
    out = run([0.0, 0.0], [4, 4], [5, 3])
    assert out.itl_hist.sum() == (5 - 1) + (3 - 1)
    edges = eng.itl_bin_edges()
    assert edges[0] == pytest.approx(eng.ITL_LO_S) and edges[-1] == pytest.approx(eng.ITL_HI_S)
    b = int(np.searchsorted(edges, 1.0, side="right")) - 1
    assert out.itl_hist[0, b] == 6


def test_out_of_step_room_retries_with_more():
    coef, x, y = const_cost()
    one = np.zeros(1, np.int64)
    knobs = eng.Knobs(mode=eng.MODE_CONTINUOUS, n_classes=1, max_batch=1, max_wait_s=0.0, max_seqs=256, budget=8192,
                      chunked=False, use_prio=False, preempt=eng.PREEMPT_RECOMPUTE, swap_cap_tokens=0,
                      watermark_blocks=0, kv_blocks=1000)
    out = eng.run(eng.inputs(np.zeros(1), np.ones(1, np.int64), np.array([5000]), one), knobs, eng.Cost(coef, x, y),
                  step_room=7)
    assert len(out.steps_i) == 5000
    assert col(out, eng.R_FINISH) == [5000.0]


def test_recompute_victim_finds_its_own_surviving_blocks_without_shared_prompts():
    """Prefix caching on, no prompt shared: vLLM V1's block pool still names every full block (a request's own
    too), and a freed block keeps its hash until it is allocated again (block_pool.py, BlockPool.free_blocks /
    get_new_blocks). Two 32-token prompts fill the 4 blocks; at t=1 request 0's 33rd token needs a block and
    request 1 (admitted last) is preempted; its 2 blocks join the free queue last block first, so request 0 takes
    request 1's second block and its first survives. Re-admitted at t=3 (request 0 done), request 1 finds those 16
    tokens and computes the other 17 (prompt + its one generated token), not all 33."""
    def go(pool):
        coef, x, y = const_cost()
        knobs = eng.Knobs(mode=eng.MODE_CONTINUOUS, n_classes=1, max_batch=1, max_wait_s=0.0, max_seqs=8, budget=64,
                          chunked=True, use_prio=False, preempt=eng.PREEMPT_RECOMPUTE, swap_cap_tokens=0,
                          watermark_blocks=0, kv_blocks=4)
        inp = eng.inputs(np.zeros(2), np.array([32, 32]), np.array([3, 3]), np.zeros(2, np.int64))
        return eng.run(inp, knobs, eng.Cost(coef, x, y), prefix_caching=pool)

    with_pool, without = go(True), go(False)
    for out in (with_pool, without):
        assert out.req_preemptions.tolist() == [0, 1]
        assert out.steps_i[:, eng.S_KV_BLOCKS].max() <= 4
    assert with_pool.steps_i[:, eng.S_CACHED_TOKENS].tolist()[3] == 16
    assert with_pool.steps_i[:, eng.S_PREFILL].tolist()[:4] == [64, 0, 0, 17]
    assert without.steps_i[:, eng.S_CACHED_TOKENS].sum() == 0
    assert without.steps_i[:, eng.S_PREFILL].tolist()[:4] == [64, 0, 0, 33]
