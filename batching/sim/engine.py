"""The token-step engine: one jitted loop over forward passes (DESIGN §2).

Plain ``*_nb`` functions, NumPy arrays and scalars in and out, integer enums, no Python
objects; all working memory is allocated before the loop. ``run_nb`` dispatches on the
mode; ``run`` is the Python entry that allocates outputs, retries with more step room if
a run needs it, and trims.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from batching.sim.costmodel import rest_time_nb, step_time_nb, token_time_nb, token_time_table_nb
from batching.sim.specs import KV_BLOCK_TOKENS

# modes and preemption kinds (policy.MODE_CODE / PREEMPTION_CODE)
MODE_STATIC = 0
MODE_DYNAMIC = 1
MODE_CONTINUOUS = 2
PREEMPT_OFF = 0
PREEMPT_RECOMPUTE = 1
PREEMPT_SWAP = 2

# request states
ST_PENDING = 0
ST_WAITING = 1
ST_RUNNING = 2
ST_SWAPPED = 3
ST_DONE = 4

# return codes
OK = 0
OUT_OF_STEPS = -1
DEADLOCK = -2

# per-step output columns (int64 table) and float table
S_PREFILL = 0  # useful prompt tokens computed
S_DECODE = 1  # useful decode tokens computed
S_PADDED = 2  # padded / finished slots computed for nothing
S_RUNNING = 3  # sequences in the batch
S_WAITING = 4  # arrived requests not yet admitted (after scheduling)
S_KV_BLOCKS = 5  # KV blocks held (reserved, for request-level modes)
S_SWAPPED = 6  # sequences whose KV sits in host memory
S_LM = 7  # sequences that emitted a useful token
S_SWAP_TOKENS = 8  # KV tokens copied over PCIe in this step
S_PREEMPTED = 9  # sequences preempted in this step
NUM_SI = 10
F_START = 0
F_DURATION = 1
F_ATTN_WORK = 2  # useful sum of chunk * (context + chunk / 2)
F_DECODE_CTX = 3  # useful sum of decode contexts read
NUM_SF = 4

# per-request output columns (float table)
R_FIRST_SCHED = 0
R_FIRST_TOKEN = 1
R_FINISH = 2
R_RELEASE = 3
R_MAX_ITL = 4
NUM_RF = 5

ITL_BINS = 120
ITL_LO_S = 1e-3
ITL_HI_S = 1e2


def itl_bin_edges() -> np.ndarray:
    """Edges of the inter-token-latency histogram (s); gaps outside fall in the end bins."""
    return np.logspace(np.log10(ITL_LO_S), np.log10(ITL_HI_S), ITL_BINS + 1)


# histogram bin of a gap: (log(gap) - _LOG_ITL_LO) * _ITL_BINS_PER_LOG (compile-time constants)
_LOG_ITL_LO = float(np.log(ITL_LO_S))
_ITL_BINS_PER_LOG = float(ITL_BINS / (np.log(ITL_HI_S) - np.log(ITL_LO_S)))


@njit(cache=True, nogil=True)
def _itl_record_nb(hist, cls, gap):
    if gap <= ITL_LO_S:
        b = 0
    else:
        b = int((np.log(gap) - _LOG_ITL_LO) * _ITL_BINS_PER_LOG)
        if b >= ITL_BINS:
            b = ITL_BINS - 1
    hist[cls, b] += 1


@njit(cache=True, nogil=True)
def _blocks_for_nb(tokens):
    return (tokens + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS


# --- per-class FIFO queues in one flat ring buffer -----------------------------------
@njit(cache=True, nogil=True)
def _q_push_back_nb(qbuf, qoff, qcap, qhead, qlen, k, x):
    qbuf[qoff[k] + (qhead[k] + qlen[k]) % qcap[k]] = x
    qlen[k] += 1


@njit(cache=True, nogil=True)
def _q_push_front_nb(qbuf, qoff, qcap, qhead, qlen, k, x):
    qhead[k] = (qhead[k] - 1 + qcap[k]) % qcap[k]
    qbuf[qoff[k] + qhead[k]] = x
    qlen[k] += 1


@njit(cache=True, nogil=True)
def _q_first_class_nb(qlen):
    for k in range(qlen.shape[0]):
        if qlen[k] > 0:
            return k
    return -1


@njit(cache=True, nogil=True)
def _q_pop_front_nb(qbuf, qoff, qcap, qhead, qlen, k):
    x = qbuf[qoff[k] + qhead[k]]
    qhead[k] = (qhead[k] + 1) % qcap[k]
    qlen[k] -= 1
    return x


# --- request-level batching (static, dynamic) ----------------------------------------
@njit(cache=True, nogil=True)
def _run_request_level_nb(arrival, prompt, output, prio, mode, max_batch, max_wait_s, kv_blocks,
                          coef, ar_x, ar_y, req_f, req_pre, steps_i, steps_f, hist):
    n = arrival.shape[0]
    max_steps = steps_i.shape[0]
    batch = np.empty(min(max_batch, n), np.int64)
    t = 0.0
    a = 0  # next request to arrive
    head = 0  # next request to batch (FIFO: requests are sorted by arrival)
    step = 0
    while head < n:
        while a < n and arrival[a] <= t:
            a += 1
        nq = a - head
        if nq == 0:
            t = arrival[a]
            continue
        launch = nq >= max_batch or a >= n
        if not launch and mode == MODE_DYNAMIC and t >= arrival[head] + max_wait_s:
            launch = True
        if not launch:
            nxt = arrival[a]
            if mode == MODE_DYNAMIC and arrival[head] + max_wait_s < nxt:
                nxt = arrival[head] + max_wait_s
            t = nxt
            continue
        # take the batch; shrink it until its padded KV reservation fits the cache
        b = min(nq, max_batch)
        pmax = 0
        omax = 0
        reserve = 0
        for j in range(b):
            r = head + j
            pm = max(pmax, prompt[r])
            om = max(omax, output[r])
            need = (j + 1) * _blocks_for_nb(pm + om)
            if j > 0 and need > kv_blocks:
                b = j
                break
            pmax = pm
            omax = om
            reserve = need
        psum = 0
        pq = 0.0
        for j in range(b):
            r = head + j
            batch[j] = r
            req_f[r, R_FIRST_SCHED] = t
            psum += prompt[r]
            pq += 0.5 * prompt[r] * prompt[r]
        head += b
        # prefill step over prompts padded to the longest
        if step >= max_steps:
            return OUT_OF_STEPS, step
        dur = step_time_nb(coef, ar_x, ar_y, float(b * pmax), 0.5 * b * pmax * pmax, 0.0, float(b), 0.0)
        steps_f[step, F_START] = t
        steps_f[step, F_DURATION] = dur
        steps_f[step, F_ATTN_WORK] = pq
        steps_f[step, F_DECODE_CTX] = 0.0
        steps_i[step, S_PREFILL] = psum
        steps_i[step, S_DECODE] = 0
        steps_i[step, S_PADDED] = b * pmax - psum
        steps_i[step, S_RUNNING] = b
        steps_i[step, S_KV_BLOCKS] = reserve
        steps_i[step, S_SWAPPED] = 0
        steps_i[step, S_LM] = b
        steps_i[step, S_SWAP_TOKENS] = 0
        steps_i[step, S_PREEMPTED] = 0
        t += dur
        while a < n and arrival[a] <= t:
            a += 1
        steps_i[step, S_WAITING] = a - head
        step += 1
        for j in range(b):
            req_f[batch[j], R_FIRST_TOKEN] = t
        # decode steps until the longest output is done; finished slots are padding
        base = token_time_nb(coef, ar_x, ar_y, float(b), 0.0)
        for d in range(1, omax):
            if step >= max_steps:
                return OUT_OF_STEPS, step
            active = 0
            ctx = 0.0
            for j in range(b):
                r = batch[j]
                if output[r] > d:
                    active += 1
                    ctx += prompt[r] + d
            dur = rest_time_nb(coef, base, 0.0, float(b * (pmax + d)), float(b), 0.0)
            steps_f[step, F_START] = t
            steps_f[step, F_DURATION] = dur
            steps_f[step, F_ATTN_WORK] = 0.0
            steps_f[step, F_DECODE_CTX] = ctx
            steps_i[step, S_PREFILL] = 0
            steps_i[step, S_DECODE] = active
            steps_i[step, S_PADDED] = b - active
            steps_i[step, S_RUNNING] = active
            steps_i[step, S_KV_BLOCKS] = reserve
            steps_i[step, S_SWAPPED] = 0
            steps_i[step, S_LM] = active
            steps_i[step, S_SWAP_TOKENS] = 0
            steps_i[step, S_PREEMPTED] = 0
            t += dur
            while a < n and arrival[a] <= t:
                a += 1
            steps_i[step, S_WAITING] = a - head
            step += 1
            for j in range(b):
                r = batch[j]
                if output[r] > d:
                    _itl_record_nb(hist, prio[r], dur)
                    if dur > req_f[r, R_MAX_ITL]:
                        req_f[r, R_MAX_ITL] = dur
                    if output[r] == d + 1:
                        req_f[r, R_FINISH] = t
        for j in range(b):
            r = batch[j]
            if output[r] == 1:
                req_f[r, R_FINISH] = req_f[r, R_FIRST_TOKEN]
            req_f[r, R_RELEASE] = t  # the whole batch is released together
    return OK, step


# --- iteration-level (continuous) batching --------------------------------------------
@njit(cache=True, nogil=True)
def _pick_victim_nb(run, lo, hi, prio, arrival, use_prio, below_class):
    """Index in run[lo:hi] of the lowest-class, latest-arrived request of class > below_class
    (or any class when below_class < 0); -1 if none."""
    best = -1
    for i in range(lo, hi):
        r = run[i]
        c = prio[r] if use_prio else 0
        if below_class >= 0 and c <= below_class:
            continue
        if best < 0:
            best = i
            continue
        rb = run[best]
        cb = prio[rb] if use_prio else 0
        if c > cb or (c == cb and arrival[r] > arrival[rb]):
            best = i
    return best


@njit(cache=True, nogil=True)
def _remove_nb(run, v, nr):
    """Remove run[v], keeping the admission order of the rest; returns the new length."""
    for j in range(v, nr - 1):
        run[j] = run[j + 1]
    return nr - 1


@njit(cache=True, nogil=True)
def _evict_nb(vr, preempt, swap_cap_tokens, use_prio, prio, prompt, gen, kv, target, state, blocks, req_pre,
              swapped, qbuf, qoff, qcap, qhead, qlen, free, swap_tok, swap_used, nsw, nwait):
    """Preempt request ``vr`` (already out of the running list): its GPU blocks are freed and its
    KV either copied to host memory (swap, while host space lasts) or dropped, the request
    rejoining the front of its class to prefill prompt + generated tokens again (recompute).
    Returns the updated (free, swap_tok, swap_used, nsw, nwait)."""
    free += blocks[vr]
    blocks[vr] = 0
    req_pre[vr] += 1
    if preempt == PREEMPT_SWAP and swap_used + kv[vr] <= swap_cap_tokens:
        swap_tok += kv[vr]
        swap_used += kv[vr]
        state[vr] = ST_SWAPPED
        swapped[nsw] = vr
        nsw += 1
    else:
        kv[vr] = 0
        target[vr] = prompt[vr] + gen[vr]
        state[vr] = ST_WAITING
        _q_push_front_nb(qbuf, qoff, qcap, qhead, qlen, prio[vr] if use_prio else 0, vr)
        nwait += 1
    return free, swap_tok, swap_used, nsw, nwait


@njit(cache=True, nogil=True)
def _run_continuous_nb(arrival, prompt, output, prio, n_classes, max_seqs, budget, chunked, use_prio,
                       preempt, swap_cap_tokens, watermark_blocks, kv_blocks, coef, ar_x, ar_y,
                       req_f, req_pre, steps_i, steps_f, hist):
    n = arrival.shape[0]
    max_steps = steps_i.shape[0]
    # working state
    state = np.zeros(n, np.int8)
    kv = np.zeros(n, np.int64)  # tokens whose KV is stored (GPU or host)
    target = prompt.copy()  # tokens to prefill before decoding
    gen = np.zeros(n, np.int64)  # output tokens produced
    blocks = np.zeros(n, np.int64)  # GPU blocks held
    sched = np.zeros(n, np.int64)  # tokens scheduled in the current step
    last_tok = np.zeros(n)
    cap = min(max_seqs, n) + 1
    run = np.empty(cap, np.int64)
    nr = 0
    swapped = np.empty(n, np.int64)
    nsw = 0
    swap_used = 0
    # waiting queues: one per class when priority is on, else one FIFO
    nq = n_classes if use_prio else 1
    qcap = np.ones(nq, np.int64)
    for i in range(n):
        qcap[prio[i] if use_prio else 0] += 1
    qoff = np.zeros(nq, np.int64)
    for k in range(1, nq):
        qoff[k] = qoff[k - 1] + qcap[k - 1]
    qbuf = np.empty(n + nq, np.int64)
    qhead = np.zeros(nq, np.int64)
    qlen = np.zeros(nq, np.int64)
    reserve_all = preempt == PREEMPT_OFF  # no eviction: reserve prompt + output on admission
    # step time by token count, looked up in the loop (steps hold at most max(budget, longest prompt) tokens)
    tab_size = budget + 1
    for i in range(n):
        if prompt[i] + output[i] + 1 > tab_size:
            tab_size = prompt[i] + output[i] + 1
    tab = token_time_table_nb(coef, ar_x, ar_y, min(tab_size, 1 << 17))
    free = kv_blocks
    t = 0.0
    a = 0
    released = 0
    step = 0
    while released < n:
        while a < n and arrival[a] <= t:
            state[a] = ST_WAITING
            _q_push_back_nb(qbuf, qoff, qcap, qhead, qlen, prio[a] if use_prio else 0, a)
            a += 1
        nwait = 0
        for k in range(nq):
            nwait += qlen[k]
        if nr == 0 and nwait == 0 and nsw == 0:
            t = arrival[a]
            continue
        if step >= max_steps:
            return OUT_OF_STEPS, step
        tokens = 0
        n_pre = 0
        n_dec = 0
        n_lm = 0
        attn = 0.0
        dctx = 0.0
        swap_tok = 0
        n_preempted = 0
        prefill_step = False
        # -- vLLM V0 without chunked prefill: admit whole prompts first; such a step is prefill-only
        if not chunked and nsw == 0:
            while nwait > 0:
                k = _q_first_class_nb(qlen)
                h = qbuf[qoff[k] + qhead[k]]
                need_tok = target[h] + (output[h] - gen[h] if reserve_all else 0)
                need = _blocks_for_nb(need_tok)
                fits_budget = tokens + target[h] <= budget or tokens == 0
                if not fits_budget:
                    break
                ok = nr < max_seqs and free - need >= (watermark_blocks if nr > 0 else 0)
                while not ok and use_prio and preempt != PREEMPT_OFF:
                    v = _pick_victim_nb(run, 0, nr, prio, arrival, use_prio, prio[h])
                    if v < 0:
                        break
                    vr = run[v]
                    nr = _remove_nb(run, v, nr)
                    n_preempted += 1
                    free, swap_tok, swap_used, nsw, nwait = _evict_nb(
                        vr, preempt, swap_cap_tokens, use_prio, prio, prompt, gen, kv, target, state, blocks,
                        req_pre, swapped, qbuf, qoff, qcap, qhead, qlen, free, swap_tok, swap_used, nsw, nwait)
                    ok = nr < max_seqs and free - need >= (watermark_blocks if nr > 0 else 0)
                if not ok:
                    break
                _q_pop_front_nb(qbuf, qoff, qcap, qhead, qlen, k)
                nwait -= 1
                state[h] = ST_RUNNING
                if req_f[h, R_FIRST_SCHED] < 0:
                    req_f[h, R_FIRST_SCHED] = t
                run[nr] = h
                nr += 1
                free -= need
                blocks[h] = need
                c = target[h] - kv[h]
                sched[h] = c
                tokens += c
                n_pre += c
                attn += c * (kv[h] + 0.5 * c)
                n_lm += 1
                prefill_step = True
        if not prefill_step:
            # (1) one decode token for each running sequence past its prefill; (2) chunks of
            # prefills under way (chunked prefill only); preempt from the back when KV runs out
            i = 0
            while i < nr:
                r = run[i]
                decoding = kv[r] >= target[r]
                if not decoding and not chunked:
                    i += 1
                    continue
                if decoding:
                    c = 1
                else:
                    c = min(target[r] - kv[r], budget - tokens)
                if c <= 0 or tokens + c > budget:
                    i += 1
                    continue
                need = _blocks_for_nb(kv[r] + c) - blocks[r]
                if need < 0:
                    need = 0
                while need > free:
                    v = _pick_victim_nb(run, i + 1, nr, prio, arrival, use_prio, -1)
                    if v < 0:
                        v = i  # nothing behind it: preempt the sequence itself
                    vr = run[v]
                    nr = _remove_nb(run, v, nr)
                    n_preempted += 1
                    free, swap_tok, swap_used, nsw, nwait = _evict_nb(
                        vr, preempt, swap_cap_tokens, use_prio, prio, prompt, gen, kv, target, state, blocks,
                        req_pre, swapped, qbuf, qoff, qcap, qhead, qlen, free, swap_tok, swap_used, nsw, nwait)
                    if v == i:
                        break
                if i < nr and run[i] == r and state[r] == ST_RUNNING:
                    free -= need
                    blocks[r] += need
                    sched[r] = c
                    tokens += c
                    if decoding:
                        n_dec += 1
                        n_lm += 1
                        dctx += kv[r] + 1
                    else:
                        n_pre += c
                        attn += c * (kv[r] + 0.5 * c)
                        if kv[r] + c == target[r]:
                            n_lm += 1
                    i += 1
            # swapped sequences come back before new ones (their KV copied in this step)
            while nsw > 0 and nr < max_seqs:
                best = 0
                for j in range(1, nsw):
                    s, sb = swapped[j], swapped[best]
                    cs = prio[s] if use_prio else 0
                    cb = prio[sb] if use_prio else 0
                    if cs < cb or (cs == cb and arrival[s] < arrival[sb]):
                        best = j
                s = swapped[best]
                need = _blocks_for_nb(kv[s] + 1)
                if need > free:
                    break
                swapped[best] = swapped[nsw - 1]
                nsw -= 1
                swap_used -= kv[s]
                swap_tok += kv[s]
                free -= need
                blocks[s] = need
                state[s] = ST_RUNNING
                run[nr] = s
                nr += 1
            # (3) new requests, with their first chunk (chunked prefill only)
            while chunked and nsw == 0 and nwait > 0 and tokens < budget:
                k = _q_first_class_nb(qlen)
                h = qbuf[qoff[k] + qhead[k]]
                c = min(target[h] - kv[h], budget - tokens)
                if reserve_all:
                    need = _blocks_for_nb(target[h] + output[h] - gen[h])
                else:
                    need = _blocks_for_nb(kv[h] + c)
                ok = nr < max_seqs and free - need >= (watermark_blocks if nr > 0 else 0)
                while not ok and use_prio and preempt != PREEMPT_OFF:
                    v = _pick_victim_nb(run, 0, nr, prio, arrival, use_prio, prio[h])
                    if v < 0:
                        break
                    vr = run[v]
                    nr = _remove_nb(run, v, nr)
                    n_preempted += 1
                    if sched[vr] > 0:  # it was scheduled in this step: take its work back out
                        cv = sched[vr]
                        tokens -= cv
                        if kv[vr] >= target[vr]:
                            n_dec -= 1
                            n_lm -= 1
                            dctx -= kv[vr] + 1
                        else:
                            n_pre -= cv
                            attn -= cv * (kv[vr] + 0.5 * cv)
                            if kv[vr] + cv == target[vr]:
                                n_lm -= 1
                        sched[vr] = 0
                        c = min(target[h] - kv[h], budget - tokens)
                        if not reserve_all:
                            need = _blocks_for_nb(kv[h] + c)
                    free, swap_tok, swap_used, nsw, nwait = _evict_nb(
                        vr, preempt, swap_cap_tokens, use_prio, prio, prompt, gen, kv, target, state, blocks,
                        req_pre, swapped, qbuf, qoff, qcap, qhead, qlen, free, swap_tok, swap_used, nsw, nwait)
                    ok = nr < max_seqs and free - need >= (watermark_blocks if nr > 0 else 0)
                if not ok:
                    break
                h2 = _q_pop_front_nb(qbuf, qoff, qcap, qhead, qlen, k)
                if h2 != h:  # a victim was pushed in front of it: serve the queue's head next round
                    _q_push_front_nb(qbuf, qoff, qcap, qhead, qlen, k, h2)
                    continue
                nwait -= 1
                state[h] = ST_RUNNING
                if req_f[h, R_FIRST_SCHED] < 0:
                    req_f[h, R_FIRST_SCHED] = t
                run[nr] = h
                nr += 1
                free -= need
                blocks[h] = need
                sched[h] = c
                tokens += c
                n_pre += c
                attn += c * (kv[h] + 0.5 * c)
                if kv[h] + c == target[h]:
                    n_lm += 1
        if tokens == 0 and swap_tok == 0:
            if a < n and nr == 0:
                t = arrival[a]  # nothing runnable until more requests arrive
                continue
            return DEADLOCK, step
        if 0 < tokens < tab.shape[0]:
            base = tab[tokens]
        else:
            base = token_time_nb(coef, ar_x, ar_y, float(tokens), float(swap_tok))
        dur = rest_time_nb(coef, base, attn, dctx, float(n_lm), float(swap_tok))
        steps_f[step, F_START] = t
        steps_f[step, F_DURATION] = dur
        steps_f[step, F_ATTN_WORK] = attn
        steps_f[step, F_DECODE_CTX] = dctx
        steps_i[step, S_PREFILL] = n_pre
        steps_i[step, S_DECODE] = n_dec
        steps_i[step, S_PADDED] = 0
        steps_i[step, S_RUNNING] = nr
        steps_i[step, S_LM] = n_lm
        steps_i[step, S_SWAP_TOKENS] = swap_tok
        steps_i[step, S_PREEMPTED] = n_preempted
        t += dur
        # apply the step: tokens exist at its end
        keep = 0
        for i in range(nr):
            r = run[i]
            c = sched[r]
            done = False
            if c > 0:
                sched[r] = 0
                emits = False
                if kv[r] >= target[r]:
                    emits = True  # decode
                    kv[r] += 1
                else:
                    kv[r] += c
                    emits = kv[r] == target[r]
                if emits:
                    gen[r] += 1
                    if gen[r] == 1:
                        req_f[r, R_FIRST_TOKEN] = t
                    else:
                        gap = t - last_tok[r]
                        _itl_record_nb(hist, prio[r], gap)
                        if gap > req_f[r, R_MAX_ITL]:
                            req_f[r, R_MAX_ITL] = gap
                    last_tok[r] = t
                    if gen[r] == output[r]:
                        done = True
            if done:
                state[r] = ST_DONE
                free += blocks[r]
                blocks[r] = 0
                req_f[r, R_FINISH] = t
                req_f[r, R_RELEASE] = t
                released += 1
            else:
                run[keep] = r
                keep += 1
        nr = keep
        while a < n and arrival[a] <= t:
            state[a] = ST_WAITING
            _q_push_back_nb(qbuf, qoff, qcap, qhead, qlen, prio[a] if use_prio else 0, a)
            a += 1
            nwait += 1
        steps_i[step, S_WAITING] = nwait
        steps_i[step, S_KV_BLOCKS] = kv_blocks - free
        steps_i[step, S_SWAPPED] = nsw
        step += 1
    return OK, step


@njit(cache=True, nogil=True)
def run_nb(arrival, prompt, output, prio, n_classes, mode, max_batch, max_wait_s, max_seqs, budget, chunked,
           use_prio, preempt, swap_cap_tokens, watermark_blocks, kv_blocks, coef, ar_x, ar_y,
           req_f, req_pre, steps_i, steps_f, hist):
    """Simulate every request; returns (status, number of steps written)."""
    if mode == MODE_CONTINUOUS:
        return _run_continuous_nb(arrival, prompt, output, prio, n_classes, max_seqs, budget, chunked, use_prio,
                                  preempt, swap_cap_tokens, watermark_blocks, kv_blocks, coef, ar_x, ar_y,
                                  req_f, req_pre, steps_i, steps_f, hist)
    return _run_request_level_nb(arrival, prompt, output, prio, mode, max_batch, max_wait_s, kv_blocks,
                                 coef, ar_x, ar_y, req_f, req_pre, steps_i, steps_f, hist)


@dataclass(frozen=True, eq=False)
class EngineOutput:
    req_f: np.ndarray  # (n, NUM_RF) seconds
    req_preemptions: np.ndarray  # (n,)
    steps_i: np.ndarray  # (steps, NUM_SI)
    steps_f: np.ndarray  # (steps, NUM_SF)
    itl_hist: np.ndarray  # (classes, ITL_BINS) counts


def run(arrival, prompt, output, prio, n_classes: int, mode: int, max_batch: int, max_wait_s: float,
        max_seqs: int, budget: int, chunked: bool, use_prio: bool, preempt: int, swap_cap_tokens: int,
        watermark_blocks: int, kv_blocks: int, coef, ar_x, ar_y, step_room: int | None = None) -> EngineOutput:
    n = len(arrival)
    arrival = np.ascontiguousarray(arrival, np.float64)
    prompt = np.ascontiguousarray(prompt, np.int64)
    output = np.ascontiguousarray(output, np.int64)
    prio = np.ascontiguousarray(prio, np.int64)
    # room for the steps: a bound (each step makes progress on some request's tokens) would be
    # far too large to allocate for big runs, so start from a typical count and double on demand
    bound = int(output.sum() + np.ceil(prompt / max(1, min(budget, 512))).sum() + 2 * n + 64)
    est = min(bound, 64 * n + 4096) if step_room is None else step_room
    while True:
        req_f = np.full((n, NUM_RF), -1.0)
        req_f[:, R_MAX_ITL] = 0.0
        req_pre = np.zeros(n, np.int64)
        # np.empty: the kernel writes every column of each step it records; untouched pages cost nothing
        steps_i = np.empty((est, NUM_SI), np.int64)
        steps_f = np.empty((est, NUM_SF))
        hist = np.zeros((max(1, n_classes), ITL_BINS), np.int64)
        status, nsteps = run_nb(arrival, prompt, output, prio, n_classes, mode, max_batch, max_wait_s, max_seqs,
                                budget, chunked, use_prio, preempt, swap_cap_tokens, watermark_blocks, kv_blocks,
                                coef, ar_x, ar_y, req_f, req_pre, steps_i, steps_f, hist)
        if status == OUT_OF_STEPS:
            est *= 2
            continue
        if status == DEADLOCK:
            raise RuntimeError(f"the engine could not schedule any work at step {nsteps} (deadlock)")
        return EngineOutput(req_f, req_pre, steps_i[:nsteps].copy(), steps_f[:nsteps].copy(), hist)
