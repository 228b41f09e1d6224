"""The token-step engine: one jitted loop over forward passes (DESIGN §2).

Plain ``*_nb`` functions, NumPy arrays and scalars in and out, integer enums, no Python
objects; all working memory is allocated before the loop. The enums, table columns and the
NamedTuples that carry the state are in state.py; the stages of a step in
stages.py. ``run_nb`` dispatches on the mode; ``run`` is the Python entry that
allocates outputs, retries with more step room if a run needs it, and trims.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.prefixes import own_block_ids
from batching.sim.hardware.costmodel import C_FIXED, CostModel, rest_time_nb, step_time_nb, token_time_nb, token_time_table_nb
from batching.sim.engine import first_use
from batching.sim.engine.stages import (
    apply_step_nb, arrivals_due_nb, arrive_nb, arrive_sessions_nb, begin_step_nb, finish_nb, blocks_for_nb,
    count_decoding_nb, end_step_nb, evict_for_nb, continue_prefills_nb, itl_record_nb, make_room_nb,
    heap_pop_nb, next_arrival_nb, next_due_nb, pc_name_nb, pc_release_nb, pc_trim_nb, regroup_nb, room_left_nb, schedule_chunks_nb, schedule_decodes_nb, schedule_swapped_nb,
    schedule_waiting_nb, schedule_waiting_pc_nb, session_next_nb,
)
from batching.sim.engine.state import (
    B_EVICTABLE, B_FREE, B_RUNNING, B_SWAPPED, B_WAITING, DEADLOCK, F_ATTN_WORK, F_DECODE_CTX, F_DURATION,
    F_START, ITL_BINS, ITL_HI_S, ITL_LO_S, MODE_CONTINUOUS, MODE_DYNAMIC, MODE_STATIC, NUM_B, NUM_RF, NUM_SF, NUM_SI,
    OK, OUT_OF_STEPS, PREEMPT_OFF, PREEMPT_RECOMPUTE, PREEMPT_SWAP, R_ARRIVAL, R_FINISH, R_FIRST_SCHED,
    R_FIRST_TOKEN, R_MAX_ITL, R_RELEASE, S_ADMITTED, S_CACHE_BLOCKS, S_CACHED_TOKENS, S_DECODE, S_KV_BLOCKS, S_LM,
    S_PADDED, S_PREEMPTED, S_PREFILL, S_RUNNING, S_STALLED, S_SWAP_TOKENS, S_SWAPPED, S_WAITING, NUM_SPF, NUM_SPI,
    SP_ACCEPTED, SP_PROPOSED, SP_SEQS, SPF_CTX, SPF_DRAFT_S, Batch, Cost, Inputs, Knobs, Later, Outputs, Prefix,
    Queues, Run, Seqs, Spec, itl_bin_edges, C_A, C_RELEASED, C_STEP, NUM_C, V_KV, V_OUTSTANDING, prefix_tables,
)

# the engine's public names: its entry points and the enums, columns and types of engine.state
__all__ = [
    "run", "inputs", "kernel_cost", "run_nb", "EngineOutput", "itl_bin_edges", "Inputs", "Knobs", "Cost", "Outputs",
    "MODE_STATIC", "MODE_DYNAMIC", "MODE_CONTINUOUS", "PREEMPT_OFF", "PREEMPT_RECOMPUTE", "PREEMPT_SWAP",
    "OK", "OUT_OF_STEPS", "DEADLOCK", "ITL_BINS", "ITL_LO_S", "ITL_HI_S", "NUM_SI", "NUM_SF", "NUM_RF",
    "S_PREFILL", "S_DECODE", "S_PADDED", "S_RUNNING", "S_WAITING", "S_KV_BLOCKS", "S_SWAPPED", "S_LM",
    "S_SWAP_TOKENS", "S_PREEMPTED", "S_ADMITTED", "S_STALLED", "S_CACHED_TOKENS", "S_CACHE_BLOCKS", "F_START",
    "F_DURATION", "F_ATTN_WORK", "F_DECODE_CTX", "R_FIRST_SCHED", "R_FIRST_TOKEN", "R_FINISH", "R_RELEASE",
    "R_MAX_ITL", "R_ARRIVAL", "SP_SEQS", "SP_PROPOSED", "SP_ACCEPTED", "SPF_CTX", "SPF_DRAFT_S", "NUM_SPI", "NUM_SPF",
    "Spec",
]


def new_later(after: np.ndarray) -> Later | None:
    """The heap of session turns not yet due and each request's next turn; None without sessions (the
    kernels are then compiled without the session code: numba prunes ``lat is not None`` branches)."""
    n = len(after)
    turns = np.flatnonzero(after >= 0)
    if len(turns) == 0:
        return None
    nxt = np.full(n, -1, np.int64)
    nxt[after[turns]] = turns
    return Later(np.empty(n), np.empty(n, np.int64), nxt)


def _new_prefix(inp: Inputs, on: bool, kv_blocks: int) -> Prefix | None:
    """vLLM V1's block pool over the blocks the requests name (Inputs.n_ids: shared chains, then each request's own
    blocks) on a GPU cache of kv_blocks blocks; None when prefix caching is off. It runs whether or not any prompt
    is shared, as V1's does (vllm/v1/core/block_pool.py, BlockPool.free_blocks keeps a freed block's hash until it
    is allocated again): a recompute victim then finds the blocks it computed that were not evicted since."""
    if not on:
        return None
    return prefix_tables(inp.n_ids, kv_blocks)


@njit(cache=True, nogil=True, inline="always")
def _arrive_fifo_nb(inp, lat, cnt, a, t, fifo, tail, req_f):
    """Request-level modes: requests arrived by ``t`` join the FIFO (each enters once); returns (a, tail)."""
    if lat is not None:
        if arrivals_due_nb(inp, lat, cnt, a, t):
            return _arrive_fifo_sessions_nb(inp, lat, cnt, a, t, fifo, tail, req_f)
        return a, tail
    arrival = inp.arrival
    n = arrival.shape[0]
    while a < n and arrival[a] <= t:
        fifo[tail] = a
        tail += 1
        a += 1
    return a, tail


@njit(cache=True, nogil=True)
def _arrive_fifo_sessions_nb(inp, lat, cnt, a, t, fifo, tail, req_f):
    """``_arrive_fifo_nb`` with session turns (stages.next_due_nb: first and later turns in time order)."""
    while True:
        r, a = next_due_nb(inp, lat, cnt, a, t, req_f)
        if r < 0:
            break
        fifo[tail] = r
        tail += 1
    return a, tail


@njit(cache=True, nogil=True)
def _run_request_level_nb(inp, knobs, cost, out, lat):
    arrival, prompt, output = inp.arrival, inp.prompt, inp.output
    coef, ar_x, ar_y = cost.coef, cost.ar_x, cost.ar_y
    req_f, si, sf = out.req_f, out.steps_i, out.steps_f
    n = arrival.shape[0]
    max_steps = out.steps_i.shape[0]
    max_batch = knobs.max_batch
    dynamic = knobs.mode == MODE_DYNAMIC
    batch = np.empty(min(max_batch, n), np.int64)
    cnt = np.zeros(NUM_B, np.int64)
    fifo = np.empty(n, np.int64)  # requests in arrival order; fifo[head:tail] wait
    tail = 0
    t = 0.0
    a = 0  # next open-loop request to arrive
    head = 0  # next request to batch
    step = 0
    while head < n:
        a, tail = _arrive_fifo_nb(inp, lat, cnt, a, t, fifo, tail, req_f)
        nq = tail - head
        nxt = next_arrival_nb(inp, lat, cnt, a) if lat is not None else (arrival[a] if a < n else np.inf)
        if nq == 0:
            if nxt == np.inf:
                return DEADLOCK, step
            t = nxt
            continue
        # launch when full, when nothing more can arrive before this batch is released, or (dynamic) when the
        # oldest has waited max_wait_s
        launch = nq >= max_batch or nxt == np.inf
        deadline = req_f[fifo[head], R_ARRIVAL] + knobs.max_wait_s
        if not launch and dynamic and t >= deadline:
            launch = True
        if not launch:
            if dynamic and deadline < nxt:
                nxt = deadline
            t = nxt
            continue
        # take the batch; shrink it until its padded KV reservation fits the cache
        b = min(nq, max_batch)
        pmax = 0
        omax = 0
        reserve = 0
        for j in range(b):
            r = fifo[head + j]
            pm = max(pmax, prompt[r])
            om = max(omax, output[r])
            need = (j + 1) * blocks_for_nb(pm + om)
            if j > 0 and need > knobs.kv_blocks:
                b = j
                break
            pmax = pm
            omax = om
            reserve = need
        psum = 0
        pq = 0.0
        for j in range(b):
            r = fifo[head + j]
            batch[j] = r
            req_f[r, R_FIRST_SCHED] = t
            psum += prompt[r]
            pq += 0.5 * prompt[r] * prompt[r]
        head += b
        # prefill step over prompts padded to the longest
        if step >= max_steps:
            return OUT_OF_STEPS, step
        begin_step_nb(out, step, t)
        dur = step_time_nb(coef, ar_x, ar_y, float(b * pmax), 0.5 * b * pmax * pmax, 0.0, float(b), 0.0)
        sf[step, F_ATTN_WORK] = pq
        si[step, S_PREFILL] = psum
        si[step, S_PADDED] = b * pmax - psum
        si[step, S_LM] = b
        si[step, S_ADMITTED] = b
        t += dur
        a, tail = _arrive_fifo_nb(inp, lat, cnt, a, t, fifo, tail, req_f)
        end_step_nb(out, step, dur, b, tail - head, reserve, 0, 0)
        step += 1
        for j in range(b):
            req_f[batch[j], R_FIRST_TOKEN] = t
        # decode steps until the longest output is done; finished slots are padding
        base = token_time_nb(coef, ar_x, ar_y, float(b), 0.0)
        for d in range(1, omax):
            if step >= max_steps:
                return OUT_OF_STEPS, step
            begin_step_nb(out, step, t)
            active = 0
            ctx = 0.0
            for j in range(b):
                r = batch[j]
                if output[r] > d:
                    active += 1
                    ctx += prompt[r] + d
            dur = rest_time_nb(coef, base, 0.0, float(b * (pmax + d)), float(b), 0.0)
            sf[step, F_DECODE_CTX] = ctx
            si[step, S_DECODE] = active
            si[step, S_PADDED] = b - active
            si[step, S_LM] = active
            t += dur
            a, tail = _arrive_fifo_nb(inp, lat, cnt, a, t, fifo, tail, req_f)
            end_step_nb(out, step, dur, active, tail - head, reserve, 0, 0)
            step += 1
            for j in range(b):
                r = batch[j]
                if output[r] > d:
                    itl_record_nb(out.hist, inp.prio[r], dur)
                    if dur > req_f[r, R_MAX_ITL]:
                        req_f[r, R_MAX_ITL] = dur
                    if output[r] == d + 1:
                        req_f[r, R_FINISH] = t
        for j in range(b):
            r = batch[j]
            if output[r] == 1:
                req_f[r, R_FINISH] = req_f[r, R_FIRST_TOKEN]
            req_f[r, R_RELEASE] = t  # the whole batch is released together
            if lat is not None:
                session_next_nb(r, t, inp, lat, cnt)  # the session's next turn
    return OK, step


# --- iteration-level (continuous) batching --------------------------------------------
@njit(cache=True, nogil=True)
def _new_state_nb(inp, knobs):
    """Working state of a continuous run: per-request arrays, the waiting queues (one per class
    with priority on, else one FIFO), the running and swapped lists with the cache counters."""
    n = inp.arrival.shape[0]
    cls = inp.prio.copy() if knobs.use_prio else np.zeros(n, np.int64)
    plim = (inp.prompt + inp.output - 1) // KV_BLOCK_TOKENS  # blocks it can fill: the last token's KV is never computed
    seqs = Seqs(cls, np.zeros(n, np.int64), inp.prompt.copy(), np.zeros(n, np.int64), np.zeros(n, np.int64),
                np.zeros(n, np.int64), plim, np.zeros(n, np.int64), np.zeros(n))
    nq = knobs.n_classes if knobs.use_prio else 1
    qcap = np.ones(nq, np.int64)
    for i in range(n):
        qcap[cls[i]] += 1
    qoff = np.zeros(nq, np.int64)
    for k in range(1, nq):
        qoff[k] = qoff[k - 1] + qcap[k - 1]
    q = Queues(np.empty(n + nq, np.int64), qoff, qcap, np.zeros(nq, np.int64), np.zeros(nq, np.int64))
    b = Batch(np.empty(min(knobs.max_seqs, n) + 1, np.int64), np.empty(n, np.int64), np.zeros(NUM_B, np.int64),
              np.empty(min(knobs.max_seqs, n) + 1, np.int64))
    b.n[B_FREE] = knobs.kv_blocks
    return seqs, q, b


@njit(cache=True, nogil=True)
def new_run_nb(inp, knobs, cost, open_loop):
    """A continuous run's state at t = 0. ``open_loop``: the run takes its requests from ``inp`` by arrival time;
    otherwise (a replica in a fleet) the router hands them over (fleet.py) and the run only sees those."""
    n = inp.arrival.shape[0]
    seqs, q, b = _new_state_nb(inp, knobs)
    # step time by token count, looked up in the loop (steps hold at most max(budget, longest prompt) tokens)
    tab_size = knobs.budget + 1
    for i in range(n):
        if inp.prompt[i] + inp.output[i] + 1 > tab_size:
            tab_size = inp.prompt[i] + inp.output[i] + 1
    tab = token_time_table_nb(cost.coef, cost.ar_x, cost.ar_y, min(tab_size, 1 << 17))
    c = np.zeros(NUM_C, np.int64)
    if not open_loop:
        c[C_A] = n
    return Run(seqs, q, b, tab, c, np.zeros(1))


@njit(cache=True, nogil=True)
def _run_continuous_nb(inp, knobs, cost, out, pc, lat, spec):
    """A whole continuous run on one replica (see ``advance_nb``)."""
    st = new_run_nb(inp, knobs, cost, True)
    if spec is not None:
        np.random.seed(spec.seed)  # numba's own generator (per thread): sampled acceptance repeats for a seed
    status = advance_nb(inp, knobs, cost, out, pc, lat, spec, st, np.inf, None, None)
    return status, st.c[C_STEP]


@njit(cache=True, nogil=True)
def end_holds_nb(t, hand, inp, seqs, b, pc, req_pre):
    """A prefill instance of a split (``hand``, engine.state.Handoff): the requests it released whose hold has
    ended by ``t`` (their decode instance took them in) give their blocks back (to the free count, or to the
    prefix cache's queue)."""
    row = hand.i[0]
    ht, hr = hand.ht[row], hand.hr[row]
    if pc is None:
        while hand.hn[row] > 0 and ht[0] <= t:
            r = hr[0]
            heap_pop_nb(ht, hr, hand.hn, row)
            b.n[B_FREE] += seqs.blocks[r]
            seqs.blocks[r] = 0
    else:
        while hand.hn[row] > 0 and ht[0] <= t:
            r = hr[0]
            heap_pop_nb(ht, hr, hand.hn, row)
            pc_release_nb(r, inp, seqs, pc, b.n, req_pre[r] == 0, True)
        if b.n[B_EVICTABLE] + pc.ends[5] > b.n[B_FREE]:
            pc_trim_nb(pc, b.n)


@njit(cache=True, nogil=True)
def advance_nb(inp, knobs, cost, out, pc, lat, spec, st, t_stop, view, hand):
    """One scheduler pass and one forward pass per step, in vLLM's order: the running sequences
    (decodes, then prefill chunks under way), the swapped ones, then the waiting queue. Without
    chunked prefill vLLM V1 admits whole prompts only, each into what the step's budget has left beside the
    decodes; under the prefill-only rule (``Knobs.prefill_only``: vLLM V0, SGLang) waiting prompts go first and a step that admits them is
    prefill-only. A step that preempted brings nobody back from host memory and admits nobody.
    ``spec``: speculative decoding (engine.state.Spec), or None (off; its code is then compiled out).

    ``st`` (engine.state.Run) holds the state between calls. ``view`` None: run until every request is
    released. Otherwise this is a replica of a fleet (fleet.py): it steps while a step would start before
    ``t_stop`` and it has work (its session turns due before ``t_stop`` included), then returns; ``view`` gets
    what a router reads of it (V_*): its state at the scheduling pass of the step in flight at ``t_stop``, or
    its state now if no step is in flight then. ``hand`` (engine.state.Handoff, or None): every request released
    is logged there with its time (an instance of a disaggregated deployment, disagg.py), and with room in
    ``hand.ht`` (a prefill instance's) keeps its blocks until the time its caller pushes into ``hand``'s heap of hold ends."""
    coef, ar_x, ar_y = cost.coef, cost.ar_x, cost.ar_y
    n = inp.arrival.shape[0]
    max_steps = out.steps_i.shape[0]
    seqs, q, b, tab = st.seqs, st.q, st.b, st.tab
    si = out.steps_i
    t = st.t[0]
    a = st.c[C_A]
    released = st.c[C_RELEASED]
    step = st.c[C_STEP]
    status = OK
    while view is not None or released < n:
        if hand is not None:
            end_holds_nb(t, hand, inp, seqs, b, pc, out.req_pre)
        if lat is not None:
            if arrivals_due_nb(inp, lat, b.n, a, t):
                a = arrive_sessions_nb(inp, seqs, q, b, lat, a, t, out.req_f)
        else:
            a = arrive_nb(inp, seqs, q, b, a, t)
        if b.n[B_RUNNING] == 0 and b.n[B_WAITING] == 0 and b.n[B_SWAPPED] == 0:
            if lat is not None:
                nt = next_arrival_nb(inp, lat, b.n, a)
            elif a < n:
                nt = inp.arrival[a]
            else:
                nt = np.inf
            if view is not None and nt >= t_stop:
                break  # idle until the router hands it a request
            if nt == np.inf:
                status = DEADLOCK
                break
            t = nt
            continue
        if view is not None and t >= t_stop:
            break
        if step >= max_steps:
            status = OUT_OF_STEPS
            break
        begin_step_nb(out, step, t)
        if spec is not None:
            spec.steps_i[step, SP_SEQS] = 0
            spec.steps_i[step, SP_PROPOSED] = 0
            spec.steps_i[step, SP_ACCEPTED] = 0
            spec.steps_f[step, SPF_CTX] = 0.0
            spec.steps_f[step, SPF_DRAFT_S] = 0.0
        prefills = False  # whether this step is prefill-only (vLLM V0 without chunked prefill)
        if knobs.prefill_only and not knobs.chunked:
            # vLLM V0: whole waiting prompts first; a step that prefills is prefill-only. A sequence longer than the
            # budget (a recompute victim's prompt + generated tokens) is prefilled in pieces: its next piece first
            # (prefills under way end the running list, so the last one tells; see continue_prefills_nb)
            nr0 = b.n[B_RUNNING]
            if nr0 > 0:
                last = b.run[nr0 - 1]
                if seqs.kv[last] < seqs.target[last]:
                    continue_prefills_nb(inp, seqs, q, b, pc, knobs, out, step, spec)
            if b.n[B_WAITING] > 0 and si[step, S_PREEMPTED] == 0:
                if pc is None:
                    h, need = schedule_waiting_nb(t, True, inp, seqs, q, b, pc, knobs, out, step, spec)
                else:
                    h, need = schedule_waiting_pc_nb(t, True, inp, seqs, q, b, pc, knobs, out, step, spec)
                if h >= 0:
                    evict_for_nb(h, need, inp, seqs, q, b, pc, knobs, out, step, spec)
            prefills = si[step, S_ADMITTED] > 0 or si[step, S_PREFILL] > 0
            if prefills:
                si[step, S_STALLED] = count_decoding_nb(b, seqs, min(nr0, b.n[B_RUNNING]))
        if not prefills:
            # (1) decodes of the running sequences; when KV runs out, preempt and go on
            nd, short = 0, 1
            spec_on = False
            if spec is not None:
                # vLLM's speculative_disable_by_batch_size (its V0 spec decode worker, vllm/spec_decode/
                # spec_decode_worker.py, SpecDecodeWorker._should_disable_all_speculation): no speculation in a
                # step when ``running_queue_size >= disable_by_batch_size``, the running queue's length
                # (len(scheduler.running)); its --help says "larger than", the code compares >=. vLLM reads the
                # queue after its scheduler pass; here it is read as the pass begins, as each sequence's draft
                # tokens count in the token budget when its decode is scheduled (vLLM V1), so the two differ only
                # in a step that also admits, swaps in or preempts.
                spec_on = b.n[B_RUNNING] < spec.disable_at
            halted = False  # a running request preempted itself: V1 schedules no further running one
            while short != 0:
                nd, short = schedule_decodes_nb(nd, inp, seqs, b, pc, knobs, out, step, spec, spec_on)
                if short > 0:
                    nd = make_room_nb(nd, short, inp, seqs, q, b, pc, knobs, out, step, spec)
                    if nd < 0:
                        halted = True
                        short = 0
                elif pc is not None:
                    if short < 0:  # it scheduled r, which has blocks to name
                        r = -1 - short
                        pc_name_nb(r, (seqs.kv[r] + 1) // KV_BLOCK_TOKENS, inp, seqs, pc, b.n, out.req_pre[r] == 0)
            # the prefill-only rule admitted and prefilled in its own steps above: here only decodes and swap-ins
            v0 = knobs.prefill_only and not knobs.chunked
            if not halted:
                # (2) the next chunk of the prefills under way (without chunked prefill only a sequence longer
                # than the budget is ever under way: schedule_waiting_nb); when KV runs out, preempt and go on
                i, short, cap = nd, 1 if not v0 else 0, -1
                while short != 0:
                    i, short = schedule_chunks_nb(i, inp, seqs, b, pc, knobs, out, step, spec, cap)
                    cap = -1
                    if short > 0:
                        cap = room_left_nb(knobs, out, step, spec)  # what run[i] saw before the preemption
                        i = make_room_nb(i, short, inp, seqs, q, b, pc, knobs, out, step, spec)
                        if i < 0:
                            short = 0
                    elif pc is not None:
                        if short < 0:
                            r = -1 - short
                            pc_name_nb(r, (seqs.kv[r] + seqs.sched[r]) // KV_BLOCK_TOKENS, inp, seqs, pc, b.n,
                                       out.req_pre[r] == 0)
                # (2b) swapped sequences back in with the budget left (vLLM V0's order), unless this step preempted
                if si[step, S_PREEMPTED] == 0 and b.n[B_SWAPPED] > 0:
                    schedule_swapped_nb(nd, inp, seqs, q, b, knobs, out, step, spec)
                # (3) new requests, unless this step preempted
                if si[step, S_PREEMPTED] == 0 and b.n[B_WAITING] > 0 and not v0:
                    if pc is not None:
                        if b.n[B_EVICTABLE] + pc.ends[5] > b.n[B_FREE]:
                            pc_trim_nb(pc, b.n)  # the new blocks above came from the free queue's head
                    whole = not knobs.chunked
                    if pc is None:
                        h, need = schedule_waiting_nb(t, whole, inp, seqs, q, b, pc, knobs, out, step, spec)
                    else:
                        h, need = schedule_waiting_pc_nb(t, whole, inp, seqs, q, b, pc, knobs, out, step, spec)
                    if h >= 0:
                        evict_for_nb(h, need, inp, seqs, q, b, pc, knobs, out, step, spec)
        # tokens computed: prompt chunks, decodes, and with speculation the rejected draft tokens (S_PADDED)
        tokens = si[step, S_PREFILL] + si[step, S_DECODE]
        n_lm = si[step, S_LM]
        if spec is not None:
            tokens += si[step, S_PADDED]
            n_lm += si[step, S_PADDED]  # the LM head scores every verified position, the rejected ones included
        swap_tok = si[step, S_SWAP_TOKENS]
        if 0 < tokens < tab.shape[0]:
            base = tab[tokens]
        elif tokens > 0 or swap_tok > 0:
            base = token_time_nb(coef, ar_x, ar_y, float(tokens), float(swap_tok))
        elif si[step, S_PREEMPTED] > 0:
            base = coef[C_FIXED]  # a scheduler pass that only preempted (recompute): its fixed overhead
        else:
            # nothing runnable until more requests arrive
            nt = np.inf
            if b.n[B_RUNNING] == 0:
                if lat is not None:
                    nt = next_arrival_nb(inp, lat, b.n, a)
                elif a < n:
                    nt = inp.arrival[a]
            held = False  # whether a hold's end frees blocks first (a prefill instance of a split)
            if hand is not None:
                row = hand.i[0]
                if hand.hn[row] > 0 and hand.ht[row, 0] < nt:
                    nt = hand.ht[row, 0]
                    held = True
            if view is not None and ((b.n[B_RUNNING] == 0 or held) and nt >= t_stop):
                break  # the router may hand it a request before then
            if nt == np.inf:
                status = DEADLOCK
                break
            t = nt
            continue
        dur = rest_time_nb(coef, base, out.steps_f[step, F_ATTN_WORK], out.steps_f[step, F_DECODE_CTX],
                           float(n_lm), float(swap_tok))
        if spec is not None:
            ns = spec.steps_i[step, SP_SEQS]
            n_pre = si[step, S_PREFILL]
            if spec.drafts and (ns > 0 or n_pre > 0):
                # the proposer (vLLM V1's EAGLE proposer, SGLang's EAGLE worker): a first pass over every prompt
                # token of the step and, per speculating sequence, its tokens accepted last step plus one (the
                # catch-up), then k - 1 passes over the ns sequences (k = proposed / ns, K unless the budget
                # cuts it); each pass its fixed cost, linear layers, element-wise ops, all-reduces
                # (draft_tab by token count), a read of its own KV and its LM head
                tab_d = spec.draft_tab
                n_first = ns + n_pre + spec.steps_i[step, SP_ACCEPTED]
                last = tab_d.shape[0] - 1
                first = tab_d[n_first] if n_first <= last else tab_d[last] * n_first / last
                draft = first + spec.draft_attn_s * out.steps_f[step, F_ATTN_WORK]
                if ns > 0:
                    lm = ns * spec.draft_lm_flops_s
                    if lm < spec.draft_lm_bytes_s:
                        lm = spec.draft_lm_bytes_s
                    reads = spec.draft_ctx_s * spec.steps_f[step, SPF_CTX] + lm
                    draft += reads + (tab_d[ns] + reads) * (spec.steps_i[step, SP_PROPOSED] / ns - 1.0)
                spec.steps_f[step, SPF_DRAFT_S] = draft
                dur += draft
        running = b.n[B_RUNNING]
        if view is not None:  # what a router sees while this step runs
            view[V_OUTSTANDING] = running + b.n[B_WAITING] + b.n[B_SWAPPED]
            view[V_KV] = knobs.kv_blocks - b.n[B_FREE]
        t += dur
        holding = False
        if hand is not None:
            holding = hand.ht.shape[1] > 0
        nd = apply_step_nb(t, inp, seqs, b, pc, lat, out, spec, holding)
        if knobs.preempt == PREEMPT_SWAP:
            regroup_nb(b, seqs)  # decodes ahead of prefills again (a swapped-in prefill may have finished first)
        released += nd
        if hand is not None:
            # an instance of a split logs its releases; a prefill instance's keep their blocks until the loop
            # says when they go back (disagg.run_disagg_nb: once the decode instance has taken the request in)
            k = hand.n[0]
            for j in range(nd):
                hand.r[k + j] = b.done[j]
                hand.t[k + j] = t
            hand.n[0] = k + nd
        if nd > 0 and not holding:
            # (a call passes every array of its tuples, two atomic reference counts each: only when needed)
            if pc is not None:
                finish_nb(nd, t, inp, seqs, b, pc, lat, out.req_pre)
            elif lat is not None:
                finish_nb(nd, t, inp, seqs, b, pc, lat, out.req_pre)
        if lat is not None:
            if arrivals_due_nb(inp, lat, b.n, a, t):
                a = arrive_sessions_nb(inp, seqs, q, b, lat, a, t, out.req_f)
        else:
            a = arrive_nb(inp, seqs, q, b, a, t)
        if pc is not None:
            if b.n[B_EVICTABLE] + pc.ends[5] > b.n[B_FREE]:
                pc_trim_nb(pc, b.n)
        end_step_nb(out, step, dur, running, b.n[B_WAITING], knobs.kv_blocks - b.n[B_FREE], b.n[B_SWAPPED],
                    b.n[B_EVICTABLE])
        step += 1
    st.t[0] = t
    st.c[C_A] = a
    st.c[C_RELEASED] = released
    st.c[C_STEP] = step
    if view is not None and t <= t_stop:  # no step in flight at t_stop: the state now
        view[V_OUTSTANDING] = b.n[B_RUNNING] + b.n[B_WAITING] + b.n[B_SWAPPED]
        view[V_KV] = knobs.kv_blocks - b.n[B_FREE]
    return status


@njit(cache=True, nogil=True)
def run_nb(inp, knobs, cost, out, pc, lat, spec):
    """Simulate every request; returns (status, number of steps written). ``pc``: the prefix cache, or None
    (off); ``lat``: the session-turn heap, or None (open loop); ``spec``: speculative decoding, or None (off)."""
    if knobs.mode == MODE_CONTINUOUS:
        return _run_continuous_nb(inp, knobs, cost, out, pc, lat, spec)
    return _run_request_level_nb(inp, knobs, cost, out, lat)


@dataclass(frozen=True, eq=False)
class EngineOutput:
    req_f: np.ndarray  # (n, NUM_RF) seconds
    req_preemptions: np.ndarray  # (n,)
    req_cached: np.ndarray  # (n,) prompt tokens served from the prefix cache at the first admission
    steps_i: np.ndarray  # (steps, NUM_SI)
    steps_f: np.ndarray  # (steps, NUM_SF)
    itl_hist: np.ndarray  # (classes, ITL_BINS) counts
    req_spec_accepted: np.ndarray | None = None  # (n,) accepted draft tokens per request (speculative decoding)
    spec_steps_i: np.ndarray | None = None  # (steps, NUM_SPI) SP_* columns (speculative decoding)
    spec_steps_f: np.ndarray | None = None  # (steps, NUM_SPF) SPF_* columns


# the step tables' ceiling, summed over a run's replicas or instances: ~(NUM_SI + NUM_SF) * 8 bytes per step here
# and again in the step DataFrame, so 25 million steps stay under ~11 GiB, within the documented 24 GiB host
MAX_STEPS = 25_000_000


def inputs(arrival, prompt, output, prio, *, chain_off=None, chain_ids=None, after=None, think_s=None,
           ready=None, chain_len=None, chain_shift: int = 0) -> Inputs:
    """The kernel's per-request Inputs (contiguous arrays of its dtypes). Optional: block chains (``chain_off``,
    ``chain_ids``: workload Requests' block_off and block_ids; grouped ones with ``chain_len``, its block_len, and
    ``chain_shift``, log2 of its block_group; read when the run caches prefixes), closed-loop session turns
    (``after``, ``think_s``), and ``ready``: prompt tokens whose KV comes with each request (a disaggregated decode
    instance's)."""
    n = len(arrival)
    if chain_off is None:
        chain_off, chain_ids, chain_len, chain_shift = np.zeros(n + 1, np.int64), np.zeros(0, np.int64), None, 0
    if chain_len is None:  # one id per block
        chain_len, chain_shift = np.diff(chain_off), 0
    if after is None:
        after, think_s = np.full(n, -1, np.int64), np.zeros(n)
    own_base, n_ids = own_block_ids(np.asarray(prompt, np.int64) + np.asarray(output, np.int64), chain_ids,
                                    np.asarray(chain_len, np.int64), int(chain_shift))
    return Inputs(_arr(arrival, np.float64), _arr(prompt, np.int64), _arr(output, np.int64), _arr(prio, np.int64),
                  _arr(after, np.int64), _arr(think_s, np.float64), _arr(chain_off, np.int64),
                  _arr(chain_ids, np.int64), np.zeros(n, np.int64) if ready is None else _arr(ready, np.int64),
                  _arr(chain_len, np.int64), int(chain_shift), own_base, n_ids)


def _arr(a, dtype) -> np.ndarray:
    """``a`` contiguous, of ``dtype`` and writable: Numba compiles another version of the engine for read-only
    arrays (a cached trace's are), which would be a first-use compile of its own (engine.first_use)."""
    a = np.ascontiguousarray(a, dtype)
    return a if a.flags.writeable else a.copy()


# Knobs' field types, in order (numba compiles one version per combination of argument types)
KNOB_KINDS = (int, int, int, float, int, int, bool, bool, int, int, int, int, bool, bool)


def kernel_cost(cm: CostModel) -> Cost:
    """The cost model's coefficients and all-reduce table as the kernel reads them."""
    return Cost(np.ascontiguousarray(cm.coef, np.float64), np.ascontiguousarray(cm.ar_log_bytes, np.float64),
                np.ascontiguousarray(cm.ar_s, np.float64))


def room_for(inp: Inputs, budget: int, room: int | None = None, replicas: int = 1, cap: int = MAX_STEPS) -> int:
    """Rows to allocate for the step tables (per replica): a bound (each step makes progress on some request's
    tokens) would be far too large to allocate for big runs, so start from a typical count; ``grow_room``
    doubles it when a run needs more, and the run starts over. 128 steps per request: every workload preset's
    continuous runs at their default rates take 76-84 (23 for ``code``), so 64, the count before, made each of
    them run twice; np.empty leaves the rows a run does not reach untouched, so they cost no memory. ``cap``: the
    most rows (per replica) the run may have, MAX_STEPS over all its replicas or instances."""
    if room is not None:
        return min(room, cap)
    n = len(inp.arrival)
    bound = int(inp.output.sum() + np.ceil(inp.prompt / max(1, min(budget, 512))).sum() + 2 * n + 64)
    return max(1, min(bound, (128 * n) // replicas + 4096, cap))


class TooManySteps(ValueError):
    """A run passed MAX_STEPS steps (summed over its replicas or instances)."""


def grow_room(room: int, inp: Inputs, cap: int = MAX_STEPS, engines: str = "") -> int:
    """Twice the room, or a clear error past ``cap`` (MAX_STEPS, or what is left of it over ``engines``, e.g.
    "its 512 replicas")."""
    if room >= cap:
        n = len(inp.arrival)
        span = float(inp.arrival[-1] - inp.arrival[0]) if n else 0.0
        over = f" summed over {engines}" if engines else ""
        raise TooManySteps(
            f"the run needs more than {MAX_STEPS:,} steps{over} ({n:,} requests arriving over {span:,.0f} s); "
            f"the step tables would not fit in memory: simulate fewer requests or a higher rate")
    return min(2 * room, cap)


def run(inp: Inputs, knobs: Knobs, cost: Cost, step_room: int | None = None, *, prefix_caching: bool = False,
        spec: Spec | None = None, max_steps: int = MAX_STEPS, engines: str = "") -> EngineOutput:
    """Run the engine on ``inp`` (``inputs`` builds it) under ``knobs`` (``BatchingPolicy.knobs``) and ``cost``
    (``kernel_cost``). ``prefix_caching`` reads the inputs' block chains (continuous mode only); ``spec``:
    speculative decoding (speculative.spec_for builds it; its per-request arrays are reset here; continuous only).
    ``max_steps``: the steps this run may take (what a fleet's earlier replicas left of MAX_STEPS; ``engines``
    names them)."""
    n = len(inp.arrival)
    knobs = Knobs(*(kind(v) for kind, v in zip(KNOB_KINDS, knobs)))  # one compiled signature, whatever the caller
    cost = Cost(*(np.ascontiguousarray(a, np.float64) for a in cost))
    n_classes, mode, max_seqs = knobs.n_classes, knobs.mode, knobs.max_seqs
    est = room_for(inp, knobs.budget, step_room, 1, max_steps)
    while True:
        req_f = np.full((n, NUM_RF), -1.0)
        req_f[:, R_MAX_ITL] = 0.0
        req_f[:, R_ARRIVAL] = inp.arrival  # session turns' are set when they arrive
        # np.empty: each step's rows are zeroed when it begins; untouched pages cost nothing
        req_pre = np.zeros(n, np.int64)
        req_cached = np.zeros(n, np.int64)
        hist = np.zeros((max(1, n_classes), ITL_BINS), np.int64)
        out = Outputs(req_f, req_pre, req_cached, np.empty((est, NUM_SI), np.int64), np.empty((est, NUM_SF)), hist)
        pc = _new_prefix(inp, prefix_caching and int(mode) == MODE_CONTINUOUS, knobs.kv_blocks)
        sp = None
        if spec is not None and int(mode) == MODE_CONTINUOUS:
            if spec.draft_tab.shape[0] <= min(int(max_seqs), n):
                raise ValueError(f"spec.draft_tab has {spec.draft_tab.shape[0]} rows; the engine needs one per running "
                                 f"sequence count up to max_seqs={max_seqs} (speculative.spec_for sizes it)")
            sp = spec._replace(emit=np.ones(n, np.int64), req_acc=np.zeros(n, np.int64),
                               steps_i=np.empty((est, NUM_SPI), np.int64), steps_f=np.empty((est, NUM_SPF)))
        lat = new_later(inp.after)
        args = (inp, knobs, cost, out, pc, lat, sp)
        with first_use.first_use(first_use.variant("engine", args, pc, lat, sp)):
            status, nsteps = run_nb(*args)
        if status == OUT_OF_STEPS:
            est = grow_room(est, inp, max_steps, engines)
            continue
        if status == DEADLOCK:
            raise RuntimeError(f"the engine could not schedule any work at step {nsteps} (deadlock)")
        steps_i, steps_f = out.steps_i, out.steps_f
        del out  # the tables' only other reference: trim them in place (realloc, no copy)
        steps_i.resize((nsteps, NUM_SI), refcheck=False)
        steps_f.resize((nsteps, NUM_SF), refcheck=False)
        if sp is None:
            return EngineOutput(req_f, req_pre, req_cached, steps_i, steps_f, hist)
        return EngineOutput(req_f, req_pre, req_cached, steps_i, steps_f, hist, sp.req_acc,
                            sp.steps_i[:nsteps].copy(), sp.steps_f[:nsteps].copy())
