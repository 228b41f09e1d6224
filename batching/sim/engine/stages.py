"""Stage helpers of the token-step engine (DESIGN §2), ``*_nb`` functions on the NamedTuples of
engine.state, changed in place: waiting queues, recording a step, the stages of one
continuous-batching step in the order vLLM's scheduler runs them (running decodes, prefill chunks
under way, swapped sequences coming back, waiting requests), preemption, and applying a step once
its tokens exist.

The running list keeps the sequences past their prefill first and the prefills under way after
them, each group in admission order: prefill chunks are handed out in list order, so prefills
complete in that order. A sequence swapped back in goes to the front of the list if it decodes,
before the prefills under way if it does not (schedule_swapped_nb).

Speed: every array handed to a function is reference-counted (two atomic operations), which
would cost more than a step's work; LLVM's pruning pass removes those counts only over simple
control flow. So the per-step stages are inlined into the engine loop (``inline="always"``) and
written for that pass: loops with one exit (a ``going`` flag, no ``break``/``continue``/``return``
inside them), no call that can raise (no integer ``%``; preemption is not called from a stage:
the stage stops and returns, the engine loop calls ``make_room_nb`` or ``evict_for_nb`` and
resumes it). The preemption helpers run rarely and are ordinary functions. Optional features come in as
arguments that are a NamedTuple or None (``pc`` the prefix cache, ``lat`` session turns, ``spec`` speculative
decoding): numba prunes ``if x is not None`` branches when x is None, so a run without them compiles without
their code, loads included (even reading one more step column in every stage cost plain runs ~3 %).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from batching.sim.engine.state import (
    B_EVICTABLE, B_FREE, B_LATER, B_RUNNING, B_SWAP_USED, B_SWAPPED, B_WAITING, F_ATTN_WORK, F_DECODE_CTX,
    F_DURATION, F_START, ITL_BINS, ITL_BINS_PER_LOG, ITL_LO_S, ITL_LOG_LO, PREEMPT_OFF, PREEMPT_SWAP, R_ARRIVAL,
    R_FINISH, R_FIRST_SCHED, R_FIRST_TOKEN, R_MAX_ITL, R_RELEASE, S_ADMITTED, S_CACHE_BLOCKS, S_CACHED_TOKENS,
    S_DECODE, S_KV_BLOCKS, S_LM, S_PADDED, S_PREEMPTED, S_PREFILL, S_RUNNING, S_STALLED, S_SWAP_TOKENS, S_SWAPPED,
    S_WAITING, SP_ACCEPTED, SP_PROPOSED, SP_SEQS, SPF_CTX,
)
from batching.sim.hardware.specs import KV_BLOCK_TOKENS


@njit(cache=True, nogil=True, inline="always")
def blocks_for_nb(tokens):
    return (tokens + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS


@njit(cache=True, nogil=True, inline="always")
def itl_record_nb(hist, cls, gap):
    if gap <= ITL_LO_S:
        b = 0
    else:
        b = int((np.log(gap) - ITL_LOG_LO) * ITL_BINS_PER_LOG)
        if b >= ITL_BINS:
            b = ITL_BINS - 1
    hist[cls, b] += 1


# --- recording a step: row ``step`` of out.steps_i / out.steps_f ---------------------------
@njit(cache=True, nogil=True, inline="always")
def begin_step_nb(out, step, t):
    """Start step ``step`` at ``t``: zero the columns that its stages add to (``end_step_nb``
    writes the others)."""
    si, sf = out.steps_i, out.steps_f
    si[step, S_PREFILL] = 0
    si[step, S_DECODE] = 0
    si[step, S_PADDED] = 0
    si[step, S_LM] = 0
    si[step, S_SWAP_TOKENS] = 0
    si[step, S_PREEMPTED] = 0
    si[step, S_ADMITTED] = 0
    si[step, S_STALLED] = 0
    si[step, S_CACHED_TOKENS] = 0
    sf[step, F_START] = t
    sf[step, F_ATTN_WORK] = 0.0
    sf[step, F_DECODE_CTX] = 0.0


@njit(cache=True, nogil=True, inline="always")
def end_step_nb(out, step, duration, running, waiting, kv_blocks, swapped, cache_blocks):
    """Complete a step's rows: its duration, the sequences it ran, the queue and cache after it."""
    si = out.steps_i
    si[step, S_CACHE_BLOCKS] = cache_blocks
    out.steps_f[step, F_DURATION] = duration
    si[step, S_RUNNING] = running
    si[step, S_WAITING] = waiting
    si[step, S_KV_BLOCKS] = kv_blocks
    si[step, S_SWAPPED] = swapped


# --- waiting queues: per-class FIFOs in one flat ring buffer (wrapped without %) -----------
@njit(cache=True, nogil=True, inline="always")
def q_push_back_nb(q, k, x):
    j = q.head[k] + q.len[k]
    if j >= q.cap[k]:
        j -= q.cap[k]
    q.buf[q.off[k] + j] = x
    q.len[k] += 1


@njit(cache=True, nogil=True, inline="always")
def q_push_front_nb(q, k, x):
    j = q.head[k] - 1
    if j < 0:
        j += q.cap[k]
    q.head[k] = j
    q.buf[q.off[k] + j] = x
    q.len[k] += 1


@njit(cache=True, nogil=True)
def q_insert_by_arrival_nb(q, k, x, arrival):
    """``x`` into class k's queue in arrival order (vLLM V1's priority queue is a heap on (priority,
    arrival_time): vllm/v1/core/sched/request_queue.py, PriorityRequestQueue.prepend_request adds a preempted
    request as any other, so it waits behind requests of its class that arrived before it). ``arrival``: when each
    request arrived (Outputs.req_f's R_ARRIVAL column: a session turn's is known only once it arrives)."""
    q_push_front_nb(q, k, x)
    p = 0
    while p + 1 < q.len[k]:
        j0 = q.head[k] + p
        if j0 >= q.cap[k]:
            j0 -= q.cap[k]
        j1 = j0 + 1
        if j1 >= q.cap[k]:
            j1 -= q.cap[k]
        y = q.buf[q.off[k] + j1]
        if arrival[y] < arrival[x] or (arrival[y] == arrival[x] and y < x):  # ties: the request id (Request.__lt__)
            q.buf[q.off[k] + j0] = y
            q.buf[q.off[k] + j1] = x
            p += 1
        else:
            p = q.len[k]


@njit(cache=True, nogil=True, inline="always")
def q_first_class_nb(q):
    """The highest class with a waiting request; -1 if none."""
    nq = q.len.shape[0]
    k = 0
    while k < nq and q.len[k] == 0:
        k += 1
    return k if k < nq else -1


@njit(cache=True, nogil=True, inline="always")
def q_peek_nb(q, k):
    return q.buf[q.off[k] + q.head[k]]


@njit(cache=True, nogil=True, inline="always")
def q_pop_front_nb(q, k):
    x = q.buf[q.off[k] + q.head[k]]
    j = q.head[k] + 1
    q.head[k] = 0 if j == q.cap[k] else j
    q.len[k] -= 1
    return x


# --- arrivals: open-loop requests in index order, session turns from a heap once their time is known -------
@njit(cache=True, nogil=True, inline="always")
def heap_push_nb(ht, hr, cnt, k, t, r):
    """(t, r) into a binary min-heap on (time, request) kept in ``ht`` / ``hr``, ``cnt[k]`` entries long (equal
    times leave in request order)."""
    i = cnt[k]
    cnt[k] = i + 1
    going = i > 0
    while going:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hr[p] <= r):
            going = False
        else:
            ht[i] = ht[p]
            hr[i] = hr[p]
            i = p
            going = i > 0
    ht[i] = t
    hr[i] = r


@njit(cache=True, nogil=True, inline="always")
def heap_pop_nb(ht, hr, cnt, k):
    """Remove the earliest entry of ``heap_push_nb``'s heap (the caller read it at index 0)."""
    m = cnt[k] - 1
    cnt[k] = m
    t, r = ht[m], hr[m]
    i = 0
    going = m > 0
    while going:
        c = 2 * i + 1
        if c >= m:
            going = False
        else:
            if c + 1 < m and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hr[c + 1] < hr[c])):
                c += 1
            if ht[c] > t or (ht[c] == t and hr[c] >= r):
                going = False
            else:
                ht[i] = ht[c]
                hr[i] = hr[c]
                i = c
    if m > 0:
        ht[i] = t
        hr[i] = r


@njit(cache=True, nogil=True, inline="always")
def later_push_nb(lat, cnt, t, r):
    """Request ``r`` (a session's next turn) arrives at ``t``: into the min-heap."""
    heap_push_nb(lat.t, lat.r, cnt, B_LATER, t, r)


@njit(cache=True, nogil=True, inline="always")
def later_pop_nb(lat, cnt):
    """Remove the heap's earliest entry (the caller read it at index 0)."""
    heap_pop_nb(lat.t, lat.r, cnt, B_LATER)


@njit(cache=True, nogil=True)
def next_arrival_nb(inp, lat, cnt, a):
    """When the next request arrives (inf if none can before something is released)."""
    t = inp.arrival[a] if a < inp.arrival.shape[0] else np.inf
    if cnt[B_LATER] > 0 and lat.t[0] < t:
        t = lat.t[0]
    return t


@njit(cache=True, nogil=True, inline="always")
def arrive_nb(inp, seqs, q, b, a, t):
    """Requests arrived by ``t`` join the back of their class's queue; returns the next to arrive."""
    arrival, cls = inp.arrival, seqs.cls
    n = arrival.shape[0]
    a0 = a
    while a < n and arrival[a] <= t:
        q_push_back_nb(q, cls[a], a)
        a += 1
    b.n[B_WAITING] += a - a0
    return a


@njit(cache=True, nogil=True, inline="always")
def arrivals_due_nb(inp, lat, cnt, a, t):
    """Whether ``arrive_sessions_nb`` has anything to do at ``t`` (checked inline: a call costs reference
    counts on every array it is passed)."""
    if a < inp.arrival.shape[0]:
        if inp.after[a] >= 0 or inp.arrival[a] <= t:
            return True
    return cnt[B_LATER] > 0 and lat.t[0] <= t


@njit(cache=True, nogil=True, inline="always")
def next_due_nb(inp, lat, cnt, a, t, req_f):
    """The next request to join the queue by ``t``, in arrival order, merging first turns (request index ``a`` on;
    a later turn, after >= 0, is skipped in index order) with later turns due from the heap (each arrives once its
    predecessor is released, and gets its arrival time written then; a tie goes to the heap). Returns (r, a): r is
    -1 when nothing more is due. The request-level FIFO and the continuous queue both take arrivals this way."""
    arrival, after = inp.arrival, inp.after
    n = arrival.shape[0]
    while a < n and after[a] >= 0:
        a += 1
    if cnt[B_LATER] > 0 and lat.t[0] <= t and (a >= n or lat.t[0] <= arrival[a]):
        r = lat.r[0]
        req_f[r, R_ARRIVAL] = lat.t[0]
        later_pop_nb(lat, cnt)
        return r, a
    if a < n and arrival[a] <= t:
        return a, a + 1
    return -1, a


@njit(cache=True, nogil=True)
def arrive_sessions_nb(inp, seqs, q, b, lat, a, t, req_f):
    """``arrive_nb`` with session turns (``next_due_nb``: first turns and later turns in time order)."""
    pushed = 0
    while True:
        r, a = next_due_nb(inp, lat, b.n, a, t, req_f)
        if r < 0:
            break
        q_push_back_nb(q, seqs.cls[r], r)
        pushed += 1
    b.n[B_WAITING] += pushed
    return a


@njit(cache=True, nogil=True)
def session_next_nb(r, t, inp, lat, cnt):
    """Request r was released at t: its session's next turn arrives a think time later."""
    nxt = lat.nxt[r]
    if nxt >= 0:
        later_push_nb(lat, cnt, t + inp.think[nxt], nxt)


# --- the prefix cache as vLLM V1's block pool (engine_state.Prefix) ----------------------------------------------
# A sequence holds blocks[r] GPU blocks; its first pb[r] are named (every full block, its chain's id or its own),
# cached and reference-counted per name, the rest (a partial last block, blocks scheduled but not yet full) are its
# own, anonymous. B_FREE counts every block no running sequence uses, the named ones nobody uses (B_EVICTABLE)
# included, so admission and preemption see reclaimable blocks as free. The free blocks form one queue (V1's
# FreeKVCacheBlockQueue): a released sequence appends its blocks last first (anonymous tail, then named blocks from
# its last to its first: a chain's tail is evicted first); an allocation takes the queue's head, dropping a name it
# finds there. Allocations only lower B_FREE; ``pc_trim_nb`` then takes that many entries from the head (the queue
# is never shorter than before them, so taking them late takes the same ones), before any lookup or naming reads
# the cache. A block named when another block already holds its name (two sequences computed it at once, or the
# last prompt block recomputed when the whole prompt is cached) is merged into the cached copy and its own block
# freed: V1 keeps both copies (block_pool.py: it does not de-duplicate, so block tables stay append-only), vLLM
# V0's block manager and SGLang's radix tree merge as here.
# A cached block's state (ref, queue links, gap) sits in a slot: the block id itself when the ids are few enough
# (Prefix.index empty), else a slot taken while the block is cached and found through Prefix.index, a hash table
# (linear probing, deletion by backward shift), so the tables follow the GPU's blocks, not the ids a trace names
# (engine_state.prefix_tables).
# Lazy naming (speed; the same runs): a request's own blocks, past its chain, carry ids no other request names, so
# only the request itself can look them up, and only after a preemption. While it was never preempted they are
# counted named (pb) without entering the tables: held by it alone, nobody could find them. Preempted, it names
# them then, last first into the queue, as a release of named blocks does. Finished, they join the queue as ONE
# entry, a dead run (ref = -its block count), counted evictable like named blocks; an allocation reaching it takes
# its blocks together. Each own block so costs nothing of its own (docs/ARCHITECTURE.md, prefix cache: the speed).
@njit(cache=True, nogil=True, inline="always")
def chain_id_nb(ids, lo, j, shift):
    """The id of block j of the chain whose ids start at ids[lo], each id naming 2^shift blocks (Inputs.chain_len)."""
    return ids[lo + (j >> shift)] + (j & ((1 << shift) - 1))


@njit(cache=True, nogil=True, inline="always")
def block_id_nb(inp, r, j):
    """The name of request r's block j: its chain's id, or past its chain an id of its own (Inputs.own_base)."""
    n = inp.chain_len[r]
    bid = inp.own_base[r] + (j - n)
    if j < n:
        bid = chain_id_nb(inp.chain_ids, inp.chain_off[r], j, inp.chain_shift)
    return bid


@njit(cache=True, nogil=True, inline="always")
def _hashed_nb(pc):
    """Whether pc's tables are hashed: a constant of its type (Prefix.hashed), so each kind of tables compiles
    without the other's code (a call in the hot loops, even one never taken, slows them by half)."""
    return pc.hashed.ndim == 1


@njit(cache=True, nogil=True, inline="always")
def _bucket_nb(bid, shift):
    """Home bucket of block bid in Prefix.index (Fibonacci hashing: the top bits of bid x 2^64 / phi)."""
    return np.int64((np.uint64(bid) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))


@njit(cache=True, nogil=True)
def _pc_find_nb(key, index, shift, bid, guess):
    """The slot of block bid while it is cached, else -1, through the hash index. ``guess``: a slot to try first
    (a chain's blocks are taken in order from the free slots, so its next block is usually in the next slot)."""
    if 0 <= guess < key.shape[0] and key[guess] == bid:
        return guess
    mask = index.shape[0] - 1
    h = _bucket_nb(bid, shift)
    while True:
        s = index[h]
        if s < 0:
            return -1
        if key[s] == bid:
            return s
        h = (h + 1) & mask


@njit(cache=True, nogil=True)
def _pc_insert_nb(key, index, free, ends, bid):
    """A free slot for block bid, which is not cached, entered in the hash index; -1 when no slot is free (not
    reached: at most twice the GPU's blocks are cached at once, engine_state.prefix_tables)."""
    top = ends[3]
    if top == 0:
        return -1
    s = free[top - 1]
    ends[3] = top - 1
    key[s] = bid
    mask = index.shape[0] - 1
    h = _bucket_nb(bid, ends[2])
    while index[h] >= 0:
        h = (h + 1) & mask
    index[h] = s
    return s


@njit(cache=True, nogil=True)
def _pc_remove_nb(key, index, free, ends, s):
    """Slot s's block leaves the cache: out of the index (the entries after it shifted back so every entry stays
    reachable from its home bucket), the slot free again."""
    mask = index.shape[0] - 1
    h = _bucket_nb(key[s], ends[2])
    while index[h] != s:
        h = (h + 1) & mask
    j = h
    while True:
        j = (j + 1) & mask
        t = index[j]
        if t < 0:
            break
        k = _bucket_nb(key[t], ends[2])
        if (h < j and (k <= h or k > j)) or (h > j and k <= h and k > j):  # its home is not in (h, j]: fill the hole
            index[h] = t
            h = j
    index[h] = -1
    key[s] = -1
    free[ends[3]] = s
    ends[3] += 1


# Each operation below walks a request's blocks by id when the tables are indexed by id, else calls its hashed twin.
@njit(cache=True, nogil=True, inline="always")
def _bid_nb(ids, lo, n, base, shift, j):
    """block_id_nb from plain values: block j of a request whose chain is ids[lo:] (n blocks, each id naming
    2^shift) and whose own blocks start at id ``base``."""
    bid = base + (j - n)
    if j < n:
        bid = ids[lo + (j >> shift)] + (j & ((1 << shift) - 1))
    return bid


@njit(cache=True, nogil=True, inline="always")
def pc_lookup_nb(h, limit, inp, pc):
    """(m, m0): request h's leading blocks that are cached, at most ``limit``, and how many of those no running
    sequence uses (taking them costs free blocks)."""
    if _hashed_nb(pc):
        return _pc_lookup_hashed_nb(h, limit, inp, pc)
    return _lookup_direct_nb(pc.cached, pc.ref, inp.chain_ids, inp.chain_off[h], inp.chain_len[h], inp.own_base[h],
                             inp.chain_shift, limit)


# The chain walks over tables by id take plain arrays, not the NamedTuples, and are called, not inlined: a tuple's
# field read in a loop of a larger function costs two atomic reference counts per block where LLVM's pruning gives
# up (the admission stage's lookups and hits ran ~10 of them per block: 60 % of the "caching on" case's time).
@njit(cache=True, nogil=True)
def _lookup_direct_nb(cached, ref, ids, lo, n, base, shift, limit):
    m = 0
    m0 = 0
    going = m < limit
    while going:
        bid = _bid_nb(ids, lo, n, base, shift, m)
        if cached[bid]:
            if ref[bid] == 0:
                m0 += 1
            m += 1
            going = m < limit
        else:
            going = False
    return m, m0


@njit(cache=True, nogil=True)
def _pc_lookup_hashed_nb(h, limit, inp, pc):
    m = 0
    m0 = 0
    s = -1
    going = m < limit
    while going:
        s = _pc_find_nb(pc.key, pc.index, pc.ends[2], block_id_nb(inp, h, m), s + 1)
        if s >= 0:
            if pc.ref[s] == 0:
                m0 += 1
            m += 1
            going = m < limit
        else:
            going = False
    return m, m0


@njit(cache=True, nogil=True, inline="always")
def _lru_unlink_nb(pc, s):
    """Named slot s leaves the free queue; the anonymous blocks queued before it stay where they were."""
    _unlink_nb(pc.prev, pc.next, pc.gap, pc.ends, s)


@njit(cache=True, nogil=True, inline="always")
def _unlink_nb(prev, nxt, gap, ends, s):
    p, x = prev[s], nxt[s]
    g = gap[s]
    gap[s] = 0
    if p >= 0:
        nxt[p] = x
    else:
        ends[0] = x
    if x >= 0:
        prev[x] = p
        gap[x] += g
    else:
        ends[1] = p
        ends[4] += g


@njit(cache=True, nogil=True, inline="always")
def _lru_append_nb(pc, s):
    """Named slot s joins the free queue at its tail (the last to be taken)."""
    _append_nb(pc.prev, pc.next, pc.gap, pc.ends, s)


@njit(cache=True, nogil=True, inline="always")
def _append_nb(prev, nxt, gap, ends, s):
    tail = ends[1]
    prev[s] = tail
    nxt[s] = -1
    gap[s] = ends[4]
    ends[4] = 0
    if tail >= 0:
        nxt[tail] = s
    else:
        ends[0] = s
    ends[1] = s


@njit(cache=True, nogil=True, inline="always")
def _touch_nb(pc, s, cnt):
    """A sequence takes named slot s: out of the free queue if nobody held it (V1's BlockPool.touch)."""
    if pc.ref[s] == 0:
        _lru_unlink_nb(pc, s)
        cnt[B_EVICTABLE] -= 1
        cnt[B_FREE] -= 1
    pc.ref[s] += 1


@njit(cache=True, nogil=True, inline="always")
def pc_acquire_nb(h, m, inp, seqs, pc, cnt):
    """Request h takes its first m blocks from the cache (they are cached): pb = blocks = m."""
    if _hashed_nb(pc):
        _pc_acquire_hashed_nb(h, m, inp, pc, cnt)
    else:
        _acquire_direct_nb(pc.ref, pc.prev, pc.next, pc.gap, pc.ends, cnt, inp.chain_ids, inp.chain_off[h],
                           inp.chain_len[h], inp.own_base[h], inp.chain_shift, m)
    seqs.pb[h] = m
    seqs.blocks[h] = m


@njit(cache=True, nogil=True)
def _acquire_direct_nb(ref, prev, nxt, gap, ends, cnt, ids, lo, n, base, shift, m):
    for j in range(m):
        bid = _bid_nb(ids, lo, n, base, shift, j)
        if ref[bid] == 0:  # (_touch_nb)
            _unlink_nb(prev, nxt, gap, ends, bid)
            cnt[B_EVICTABLE] -= 1
            cnt[B_FREE] -= 1
        ref[bid] += 1


@njit(cache=True, nogil=True)
def _pc_acquire_hashed_nb(h, m, inp, pc, cnt):
    s = -1
    for j in range(m):
        s = _pc_find_nb(pc.key, pc.index, pc.ends[2], block_id_nb(inp, h, j), s + 1)
        _touch_nb(pc, s, cnt)


@njit(cache=True, nogil=True, inline="always")
def pc_register_nb(r, full, inp, seqs, pc, cnt, lazy):
    """Sequence r's blocks before ``full`` are (scheduled to be) complete: name them in the cache, as vLLM V1
    caches full blocks when it schedules them (KVCacheManager.allocate_slots, after the allocation). A block whose
    name is cached already is merged into that copy (the section's note): r holds the copy, its own block is free,
    queued as anonymous. ``lazy`` (r was never preempted): its own blocks, past its chain, are counted named
    without entering the tables (the section's note on lazy naming). Inlined into the step stages, written for
    their loops (one exit, no call that is not inlined: the hashed twin is compiled out with tables by id)."""
    end = min(full, seqs.plim[r])
    lim = min(end, inp.chain_len[r]) if lazy else end
    if seqs.pb[r] < lim:
        if _hashed_nb(pc):
            _pc_register_hashed_nb(r, lim, inp, seqs, pc, cnt)
        else:
            _register_direct_nb(r, lim, inp, seqs, pc, cnt)
    if seqs.pb[r] < end:
        seqs.pb[r] = end  # (lazy) its own blocks up to end: named, held by r alone, in no table yet


@njit(cache=True, nogil=True)
def _register_direct_nb(r, end, inp, seqs, pc, cnt):
    cached, ref, ends = pc.cached, pc.ref, pc.ends
    ids, lo, n, base, shift = inp.chain_ids, inp.chain_off[r], inp.chain_len[r], inp.own_base[r], inp.chain_shift
    j = seqs.pb[r]
    while j < end:
        bid = _bid_nb(ids, lo, n, base, shift, j)
        if cached[bid]:
            if ref[bid] == 0:
                trim_nb(pc, cnt)  # the allocations before it come first: they may take this very block
        if cached[bid]:
            _touch_nb(pc, bid, cnt)
            cnt[B_FREE] += 1  # its own copy, anonymous, joins the queue's tail
            ends[4] += 1
            ends[5] += 1
        else:
            cached[bid] = True
            ref[bid] = 1
        j += 1
    seqs.pb[r] = end


@njit(cache=True, nogil=True)
def _pc_register_hashed_nb(r, end, inp, seqs, pc, cnt):
    while seqs.pb[r] < end:
        j = seqs.pb[r]
        bid = block_id_nb(inp, r, j)
        s = _pc_slot_nb(pc, bid)
        if s >= 0:
            if pc.ref[s] == 0:
                pc_trim_nb(pc, cnt)
                s = _pc_slot_nb(pc, bid)
        if s < 0:
            s = _pc_insert_nb(pc.key, pc.index, pc.free, pc.ends, bid)
            pc.cached[s] = True
            pc.ref[s] = 1
        else:
            _touch_nb(pc, s, cnt)
            cnt[B_FREE] += 1
            pc.ends[4] += 1
            pc.ends[5] += 1
        seqs.pb[r] = j + 1


@njit(cache=True, nogil=True)
def pc_name_nb(r, full, inp, seqs, pc, cnt, lazy):
    """``pc_register_nb``, called: from the engine loop when a step stage stops for it (schedule_decodes_nb)."""
    pc_register_nb(r, full, inp, seqs, pc, cnt, lazy)


@njit(cache=True, nogil=True, inline="always")
def _pc_slot_nb(pc, bid):
    """The slot of block bid while it is cached, else -1."""
    if _hashed_nb(pc):
        return _pc_find_nb(pc.key, pc.index, pc.ends[2], bid, -1)
    return bid if pc.cached[bid] else -1


@njit(cache=True, nogil=True, inline="always")
def pc_release_nb(r, inp, seqs, pc, cnt, lazy, finished):
    """Sequence r gives back its GPU blocks, last first (V1's KVCacheManager.free: reversed): its anonymous ones
    join the free queue, then its named ones nobody else holds, its last named block first (taken first).
    ``lazy``: r's own named blocks are in no table yet (pc_register_nb); ``finished``: r is done, so nothing can
    look its own blocks up again and they join the queue as one entry, a dead run (the section's note)."""
    pb = seqs.pb[r]
    own = seqs.blocks[r] - pb
    cnt[B_FREE] += own
    pc.ends[4] += own
    pc.ends[5] += own
    j = pb
    n = inp.chain_len[r]
    if lazy and pb > n:
        if finished:
            _pc_dead_run_nb(pc, inp.own_base[r] + (pb - 1 - n), pb - n, cnt)
        else:
            _pc_name_own_nb(r, n, pb, inp, pc, cnt)
        j = n
    if j > 0:
        if _hashed_nb(pc):
            _pc_release_hashed_nb(r, j, inp, pc, cnt)
        else:
            _release_direct_nb(pc.ref, pc.prev, pc.next, pc.gap, pc.ends, cnt, inp.chain_ids, inp.chain_off[r], n,
                               inp.own_base[r], inp.chain_shift, j)
    seqs.blocks[r] = 0
    seqs.pb[r] = 0


@njit(cache=True, nogil=True)
def _release_direct_nb(ref, prev, nxt, gap, ends, cnt, ids, lo, n, base, shift, pb):
    j = pb
    while j > 0:  # (a loop with a negative range step could raise: see the module's note on speed)
        j -= 1
        bid = _bid_nb(ids, lo, n, base, shift, j)
        ref[bid] -= 1
        if ref[bid] == 0:
            _append_nb(prev, nxt, gap, ends, bid)
            cnt[B_EVICTABLE] += 1
            cnt[B_FREE] += 1


@njit(cache=True, nogil=True)
def _pc_release_hashed_nb(r, pb, inp, pc, cnt):
    j = pb
    s = -2
    while j > 0:
        j -= 1
        s = _pc_find_nb(pc.key, pc.index, pc.ends[2], block_id_nb(inp, r, j), s - 1)
        pc.ref[s] -= 1
        if pc.ref[s] == 0:
            _lru_append_nb(pc, s)
            cnt[B_EVICTABLE] += 1
            cnt[B_FREE] += 1


@njit(cache=True, nogil=True)
def _pc_dead_run_nb(pc, bid, d, cnt):
    """A finished sequence's d own named blocks join the queue's tail as one entry: slot ``bid`` (the id of its
    last own block, which nothing else names; with hashed tables a free slot outside the index) holding -d in ref."""
    s = bid
    if _hashed_nb(pc):
        top = pc.ends[3]
        s = pc.free[top - 1]
        pc.ends[3] = top - 1
    pc.ref[s] = -d
    _lru_append_nb(pc, s)
    cnt[B_EVICTABLE] += d
    cnt[B_FREE] += d


@njit(cache=True, nogil=True)
def _pc_name_own_nb(r, n, pb, inp, pc, cnt):
    """A lazy sequence preempted: its own named blocks n .. pb - 1 enter the tables (a recompute can find them) and
    join the queue last first, nobody holding them."""
    j = pb
    while j > n:
        j -= 1
        bid = inp.own_base[r] + (j - n)
        s = bid
        if _hashed_nb(pc):
            s = _pc_insert_nb(pc.key, pc.index, pc.free, pc.ends, bid)
        pc.cached[s] = True
        pc.ref[s] = 0
        _lru_append_nb(pc, s)
        cnt[B_EVICTABLE] += 1
        cnt[B_FREE] += 1


@njit(cache=True, nogil=True)
def pc_trim_nb(pc, cnt):
    """``trim_nb``, called: from the engine loop (an inlined loop there would defeat the pruning of reference
    counts, see the module's note) and from functions that are not inlined."""
    trim_nb(pc, cnt)


@njit(cache=True, nogil=True, inline="always")
def trim_nb(pc, cnt):
    """The allocations since the last call take their blocks from the free queue's head (V1's
    BlockPool.get_new_blocks): anonymous ones as they come, a named one losing its name. The queue holds
    B_EVICTABLE named and ends[5] anonymous blocks; B_FREE of them are still free."""
    over = cnt[B_EVICTABLE] + pc.ends[5] - cnt[B_FREE]
    while over > 0:
        s = pc.ends[0]
        if s < 0:
            pc.ends[4] -= over
            pc.ends[5] -= over
            over = 0
        elif pc.gap[s] > 0:
            k = min(pc.gap[s], over)
            pc.gap[s] -= k
            pc.ends[5] -= k
            over -= k
        elif pc.ref[s] < 0:  # a dead run (pc_release_nb): its blocks taken together
            k = min(-pc.ref[s], over)
            pc.ref[s] += k
            cnt[B_EVICTABLE] -= k
            over -= k
            if pc.ref[s] == 0:
                _lru_unlink_nb(pc, s)
                if _hashed_nb(pc):
                    pc.free[pc.ends[3]] = s
                    pc.ends[3] += 1
        else:
            _lru_unlink_nb(pc, s)
            pc.cached[s] = False
            if _hashed_nb(pc):
                _pc_remove_nb(pc.key, pc.index, pc.free, pc.ends, s)
            cnt[B_EVICTABLE] -= 1
            over -= 1


# --- preemption (rare: called by the engine loop, between stages) -------------------------
@njit(cache=True, nogil=True)
def pick_victim_nb(run, nr, cls, arrival, use_prio):
    """vLLM V1's victim when a running request cannot get blocks (vllm/v1/core/sched/scheduler.py,
    Scheduler.schedule): with priority the running request with the largest (priority, arrival time) in the
    whole running list, already scheduled in this step or not; first come first served pops the running list's
    last (its latest admitted)."""
    if not use_prio:
        return nr - 1
    best = 0
    for i in range(1, nr):
        r = run[i]
        rb = run[best]
        if cls[r] > cls[rb] or (cls[r] == cls[rb] and arrival[r] > arrival[rb]):
            best = i
    return best


@njit(cache=True, nogil=True)
def lowest_below_nb(run, nr, cls, arrival, above):
    """Index in run[:nr] of the lowest-class, latest-arrived sequence of a class below ``above``; -1 if none
    (the waiting-side rule, ``evict_for_nb``)."""
    best = -1
    for i in range(nr):
        r = run[i]
        c = cls[r]
        if c <= above:
            continue
        if best < 0:
            best = i
            continue
        rb = run[best]
        if c > cls[rb] or (c == cls[rb] and arrival[r] > arrival[rb]):
            best = i
    return best


@njit(cache=True, nogil=True)
def preempt_nb(v, inp, seqs, q, b, pc, knobs, out, step, spec):
    """Preempt run[v]: it leaves the running list and frees its GPU blocks; its KV is copied to
    host memory (swap, while host space lasts; the copy is this step's) or dropped, the request
    rejoining the front of its class to prefill prompt + generated tokens again (recompute).
    Work scheduled for it in this step is taken back out first."""
    run, cnt, si = b.run, b.n, out.steps_i
    r = run[v]
    nr = cnt[B_RUNNING]
    for j in range(v, nr - 1):
        run[j] = run[j + 1]
    cnt[B_RUNNING] = nr - 1
    unschedule_nb(r, seqs, out, step, spec)
    if pc is not None:
        pc_release_nb(r, inp, seqs, pc, cnt, out.req_pre[r] == 0, False)
    else:
        cnt[B_FREE] += seqs.blocks[r]
        seqs.blocks[r] = 0
    out.req_pre[r] += 1
    si[step, S_PREEMPTED] += 1
    kv = seqs.kv[r]
    # under the prefill-only rule only a recompute victim longer than the budget is ever preempted mid-prefill (V0's
    # running queue holds decodes only): it is recomputed, as its prefill-only steps could not bring it back
    swap = knobs.preempt == PREEMPT_SWAP and cnt[B_SWAP_USED] + kv <= knobs.swap_cap_tokens
    if swap and knobs.prefill_only and not knobs.chunked and kv < seqs.target[r]:
        swap = False
    if swap:
        si[step, S_SWAP_TOKENS] += kv
        cnt[B_SWAP_USED] += kv
        b.swapped[cnt[B_SWAPPED]] = r
        cnt[B_SWAPPED] += 1
    else:
        seqs.kv[r] = 0
        seqs.target[r] = inp.prompt[r] + seqs.gen[r]
        if knobs.use_prio:
            q_insert_by_arrival_nb(q, seqs.cls[r], r, out.req_f[:, R_ARRIVAL])
        else:
            q_push_front_nb(q, seqs.cls[r], r)  # V1's FCFS queue: prepend_request, the front
        cnt[B_WAITING] += 1


@njit(cache=True, nogil=True)
def unschedule_nb(r, seqs, out, step, spec):
    """Take the work scheduled for ``r`` in this step back out of the step."""
    c = seqs.sched[r]
    if c == 0:
        return
    si, sf = out.steps_i, out.steps_f
    kv = seqs.kv[r]
    if kv >= seqs.target[r]:
        e = 1  # tokens it would have emitted; a decode verifying c > 1 tokens speculated
        if spec is not None:
            if c > 1:
                e = spec.emit[r]
                spec.steps_i[step, SP_SEQS] -= 1
                spec.steps_i[step, SP_PROPOSED] -= c - 1
                spec.steps_i[step, SP_ACCEPTED] -= e - 1
                spec.steps_f[step, SPF_CTX] -= kv + 1
        si[step, S_DECODE] -= e
        si[step, S_PADDED] -= c - e
        si[step, S_LM] -= e
        sf[step, F_DECODE_CTX] -= kv + c
    else:
        si[step, S_PREFILL] -= c
        sf[step, F_ATTN_WORK] -= c * (kv + 0.5 * c)
        if kv + c == seqs.target[r]:
            si[step, S_LM] -= 1
    seqs.sched[r] = 0


@njit(cache=True, nogil=True)
def make_room_nb(i, need, inp, seqs, q, b, pc, knobs, out, step, spec):
    """KV ran out for run[i]'s next tokens: preempt vLLM V1's victims (``pick_victim_nb``) until ``need`` blocks
    are free. Returns the index run[i] has now (a victim before it shifts it), or -1 when run[i] itself was
    preempted: V1 then schedules no further running request in this step (Scheduler.schedule leaves its running
    loop), and, having preempted, admits nobody."""
    while need > b.n[B_FREE]:
        v = pick_victim_nb(b.run, b.n[B_RUNNING], seqs.cls, out.req_f[:, R_ARRIVAL], knobs.use_prio)
        preempt_nb(v, inp, seqs, q, b, pc, knobs, out, step, spec)
        if v == i:
            return -1
        if v < i:
            i -= 1
    return i


@njit(cache=True, nogil=True, inline="always")
def room_left_nb(knobs, out, step, spec):
    """Tokens of the step's budget not yet scheduled (rejected draft tokens count, with speculation)."""
    room = knobs.budget - out.steps_i[step, S_PREFILL] - out.steps_i[step, S_DECODE]
    if spec is not None:
        room -= out.steps_i[step, S_PADDED]
    return room


@njit(cache=True, nogil=True, inline="always")
def fits_nb(need, cnt, knobs):
    """A sequence slot and ``need`` blocks are free, keeping the watermark once something runs."""
    nr = cnt[B_RUNNING]
    return nr < knobs.max_seqs and cnt[B_FREE] - need >= (knobs.watermark_blocks if nr > 0 else 0)


@njit(cache=True, nogil=True)
def evict_for_nb(h, need, inp, seqs, q, b, pc, knobs, out, step, spec):
    """Priority with the waiting-side rule (``Knobs.wait_preempt``; vLLM V0's scheduler, not V1's): preempt running
    sequences of a class below waiting request ``h``'s (lowest class, latest arrival first) until a slot and
    ``need`` blocks would be free for it, or none is left."""
    while not fits_nb(need, b.n, knobs):
        v = lowest_below_nb(b.run, b.n[B_RUNNING], seqs.cls, out.req_f[:, R_ARRIVAL], seqs.cls[h])
        if v < 0:
            return
        preempt_nb(v, inp, seqs, q, b, pc, knobs, out, step, spec)


# --- the scheduling stages of a continuous-batching step ------------------------------------
@njit(cache=True, nogil=True, inline="always")
def schedule_decodes_nb(i, inp, seqs, b, pc, knobs, out, step, spec, spec_on):
    """(1) Running: one decode token for each sequence past its prefill (they lead the running
    list), from run[i] on, while the token budget lasts.

    Speculative decoding (``spec``, while ``spec_on``): a sequence verifies k + 1 tokens, k = min(K, budget left - 1)
    proposed ones and the one the target adds (each counts in the budget), as vLLM V1 schedules them
    (vllm/v1/core/sched/scheduler.py, Scheduler.schedule: num_tokens_with_spec - num_computed_tokens, capped by the
    budget only; update_draft_token_ids sets K drafts whatever the request still owes). Its KV blocks cover all
    k + 1 and, with a proposer that keeps KV of its own (a draft model, an EAGLE head, MTP: ``spec.drafts``), K
    more: V1 passes num_lookahead_tokens = K to KVCacheManager.allocate_slots for every running request. How many
    of the k are accepted is sampled here (geometric, P(>= j accepted) = A^j, closed form: no loop in this loop);
    it emits accepted + 1 tokens, at most the tokens it still owes (S_DECODE): V1 drops what follows max_tokens
    (Scheduler._update_request_with_output trims the sampled tokens at check_stop). The rest of the k + 1, rejected
    or accepted past the output, is computed for nothing (S_PADDED); SP_ACCEPTED counts the accepted ones emitted.
    V1 bounds a request's positions by max_model_len (num_new_tokens at most max_model_len - 1 - num_computed_tokens,
    slots at most max_model_len), which a server's KV cache must hold (V1 refuses to start otherwise): here the
    cache's capacity, so a request that fits the cache alone is never refused its drafts' or lookahead's blocks.

    Returns (index where the prefills under way begin, 0), or, when run[i] needs more KV blocks
    than are free, (i, blocks it needs): the caller makes room (``make_room_nb``) and resumes; or, when the
    sequence just scheduled, r, has blocks to name in the cache's tables, (i, -1 - r): the caller names them
    (``pc_name_nb``) and resumes. Naming is a call with loops, which in this loop would cost every iteration
    its reference counts (see the module's note): only a lazy sequence's own blocks are named here, by a count."""
    run, cnt = b.run, b.n
    kv, target, blocks, sched = seqs.kv, seqs.target, seqs.blocks, seqs.sched
    si = out.steps_i
    room = knobs.budget - si[step, S_PREFILL] - si[step, S_DECODE]
    if spec is not None:
        room -= si[step, S_PADDED]  # rejected draft tokens count in the budget too (a load only with speculation)
    free = cnt[B_FREE]
    nr = cnt[B_RUNNING]
    n_dec = 0  # tokens computed (k + 1 per speculating sequence)
    rej = 0  # of those, rejected draft tokens (speculation only)
    n_spec = 0
    proposed = 0
    sctx = 0.0
    stalled = 0
    ctx = 0.0
    short = 0
    going = True
    while going and i < nr:
        r = run[i]
        if kv[r] < target[r]:
            going = False  # the prefills under way begin here
        elif n_dec >= room:
            stalled += 1  # the budget is spent: no token for it in this step
            i += 1
        else:
            kr = 0
            slots = kv[r] + 1
            if spec is not None:
                cap = knobs.kv_blocks * KV_BLOCK_TOKENS  # max_model_len (the docstring)
                if spec_on:
                    kr = min(spec.k, room - n_dec - 1, cap - kv[r] - 2)
                    if kr < 0:
                        kr = 0
                slots = kv[r] + 1 + kr
                if spec.drafts:
                    slots = min(slots + spec.k, cap)  # lookahead slots (V1's num_lookahead_tokens)
            need = blocks_for_nb(slots) - blocks[r]
            if need > free:
                short = need  # KV ran out: the caller makes room
                going = False
            else:
                if need > 0:
                    free -= need
                    blocks[r] += need
                if pc is not None:
                    # (the cheap test first: a sequence whose blocks are all named skips the division). Written out
                    # here and in schedule_chunks_nb: one shared inlined helper made the kernel 3.3x slower
                    # (benchmarks/bench_engine_pair.py, continuous, 10,000 requests: 0.064 -> 0.213 s CPU)
                    if seqs.pb[r] < seqs.plim[r]:
                        if seqs.pb[r] < (kv[r] + 1) // KV_BLOCK_TOKENS:
                            if seqs.pb[r] >= inp.chain_len[r] and out.req_pre[r] == 0:
                                seqs.pb[r] = min((kv[r] + 1) // KV_BLOCK_TOKENS, seqs.plim[r])  # lazy naming
                            else:
                                short = -1 - r  # the caller names its blocks (pc_name_nb) before the next one's
                                going = False
                sched[r] = 1 + kr
                n_dec += 1 + kr
                ctx += kv[r] + 1 + kr  # a multi-query kernel reads the context once for its k + 1 queries
                if spec is not None:
                    if kr > 0:
                        x = np.log(1.0 - np.random.random()) * spec.inv_log_a
                        acc = kr if not (x < kr) else int(x)  # (x is inf or nan when A is 1)
                        e = min(acc + 1, inp.output[r] - seqs.gen[r])  # past max_tokens: dropped
                        spec.emit[r] = e
                        rej += kr + 1 - e
                        n_spec += 1
                        proposed += kr
                        sctx += kv[r] + 1
                i += 1
    cnt[B_FREE] = free
    si[step, S_DECODE] += n_dec - rej
    si[step, S_LM] += n_dec - rej
    si[step, S_STALLED] += stalled
    out.steps_f[step, F_DECODE_CTX] += ctx
    if spec is not None:
        si[step, S_PADDED] += rej
        spec.steps_i[step, SP_SEQS] += n_spec
        spec.steps_i[step, SP_PROPOSED] += proposed
        spec.steps_i[step, SP_ACCEPTED] += proposed - rej
        spec.steps_f[step, SPF_CTX] += sctx
    return i, short


@njit(cache=True, nogil=True, inline="always")
def best_swapped_nb(b, cls, arrival):
    """Index in the swapped list of the first to come back: highest class, then earliest arrival."""
    sw = b.swapped
    best = 0
    for j in range(1, b.n[B_SWAPPED]):
        s, sb = sw[j], sw[best]
        if cls[s] < cls[sb] or (cls[s] == cls[sb] and arrival[s] < arrival[sb]):
            best = j
    return best


@njit(cache=True, nogil=True, inline="always")
def schedule_swapped_nb(nd, inp, seqs, q, b, knobs, out, step, spec):
    """(2b) Swapped sequences come back (highest class, then earliest first) with what the running sequences'
    decodes and chunks left of the budget, as vLLM V0 orders its step (vllm/core/scheduler.py,
    Scheduler._schedule_chunked_prefill: _schedule_running, then _schedule_swapped with the budget left, then
    _schedule_prefills), while sequence slots, the budget and free blocks allow, the first that does not fit
    stopping it; their KV is copied in over PCIe in this step. One past its prefill decodes one token (blocks for
    its KV + 1; speculation waits for the next step); one swapped out mid-prefill takes its next chunk, the budget
    left (all of its prompt without chunked prefill, or it waits), with blocks for its KV + the chunk: nothing later
    in the step can take them back, so no sequence is swapped in and out in one step (V0's
    SchedulerOutputs.__post_init__ asserts as much). A swapped sequence of a class below the waiting queue's head
    waits for it. Not run in a step that preempted.

    Where they go in the running list: V0 rebuilds its running queue as swapped-in decodes, swapped-in prefills,
    then the running decodes and prefills; here swapped-in decodes lead the list likewise (in the order they came
    back), and swapped-in prefills go before the running prefills but after every decode (the engine's invariant,
    read by schedule_decodes_nb: decodes lead, as V0's chunked prefill prioritizes decodes). ``nd``: where the
    prefills begin in the running list."""
    cnt, swapped, cls = b.n, b.swapped, seqs.cls
    kv, target = seqs.kv, seqs.target
    si = out.steps_i
    room = knobs.budget - si[step, S_PREFILL] - si[step, S_DECODE]
    if spec is not None:
        room -= si[step, S_PADDED]
    front = 0  # decodes swapped in so far: the next goes at this index
    pre = nd  # where the next swapped-in prefill goes
    going = True
    while going and cnt[B_SWAPPED] > 0 and cnt[B_RUNNING] < knobs.max_seqs and room > 0:
        j = best_swapped_nb(b, cls, out.req_f[:, R_ARRIVAL])
        s = swapped[j]
        left = target[s] - kv[s]
        decoding = left <= 0
        c = 1 if decoding else min(left, room)
        need = blocks_for_nb(kv[s] + c)
        if cnt[B_WAITING] > 0 and cls[s] > q_first_class_nb(q):
            going = False  # a waiting request of a higher class goes first
        elif c < left and not knobs.chunked:
            going = False  # a whole prompt or nothing
        elif need > cnt[B_FREE]:
            going = False
        else:
            if decoding:
                _swap_in_nb(s, j, front, c, need, seqs, b, out, step)
                front += 1
                pre += 1
            else:
                _swap_in_nb(s, j, pre, c, need, seqs, b, out, step)
                pre += 1
            room -= c


@njit(cache=True, nogil=True, inline="always")
def _swap_in_nb(s, j, at, c, need, seqs, b, out, step):
    """Swapped[j] = ``s`` back into the running list at index ``at``, its KV copied in, ``c`` tokens scheduled:
    one decode token past its prefill, else its next chunk."""
    run, cnt, swapped = b.run, b.n, b.swapped
    kv = seqs.kv
    si = out.steps_i
    nsw = cnt[B_SWAPPED] - 1
    swapped[j] = swapped[nsw]
    cnt[B_SWAPPED] = nsw
    cnt[B_SWAP_USED] -= kv[s]
    si[step, S_SWAP_TOKENS] += kv[s]
    cnt[B_FREE] -= need
    seqs.blocks[s] = need  # its own blocks: pc_register_nb names them again when it is next scheduled
    nr = cnt[B_RUNNING]
    for i in range(nr, at, -1):
        run[i] = run[i - 1]
    run[at] = s
    cnt[B_RUNNING] = nr + 1
    seqs.sched[s] = c
    if kv[s] >= seqs.target[s]:
        si[step, S_DECODE] += 1
        si[step, S_LM] += 1
        out.steps_f[step, F_DECODE_CTX] += kv[s] + 1
    else:
        si[step, S_PREFILL] += c
        out.steps_f[step, F_ATTN_WORK] += c * (kv[s] + 0.5 * c)
        if kv[s] + c == seqs.target[s]:
            si[step, S_LM] += 1


@njit(cache=True, nogil=True, inline="always")
def schedule_chunks_nb(i, inp, seqs, b, pc, knobs, out, step, spec, cap):
    """(2) Prefills under way, from run[i] on: the next chunk of each, in order, from what the
    decodes left of the budget. A sequence past its prefill found here (none should be) counts
    as stalled.

    Returns 0, or, when run[i] needs more KV blocks than are free, (i, blocks it needs): the
    caller makes room (``make_room_nb``) and resumes; (i, -1 - r) when r has blocks to name (as
    ``schedule_decodes_nb``). ``cap`` (>= 0, on resuming after ``make_room_nb``): run[i]'s chunk is at most the
    budget it saw before the preemption: vLLM V1 sizes a request's num_new_tokens before it allocates, so tokens a
    victim gives back serve only the requests after it (Scheduler.schedule); -1: no cap."""
    run, cnt = b.run, b.n
    kv, target, blocks, sched = seqs.kv, seqs.target, seqs.blocks, seqs.sched
    si = out.steps_i
    room = knobs.budget - si[step, S_PREFILL] - si[step, S_DECODE]
    if spec is not None:
        room -= si[step, S_PADDED]
    free = cnt[B_FREE]
    nr = cnt[B_RUNNING]
    n_pre = 0
    n_lm = 0
    stalled = 0
    attn = 0.0
    short = 0
    first = i
    going = True
    while going and i < nr:
        r = run[i]
        left = target[r] - kv[r]
        c = min(left, room - n_pre)
        if cap >= 0:
            if i == first:
                c = min(c, cap)
        if left <= 0:
            stalled += 1
            i += 1
        elif c <= 0:
            i += 1  # the budget is spent
        else:
            need = blocks_for_nb(kv[r] + c) - blocks[r]
            if spec is not None:
                if spec.drafts:  # lookahead slots, at most max_model_len (schedule_decodes_nb)
                    need = blocks_for_nb(min(kv[r] + c + spec.k, knobs.kv_blocks * KV_BLOCK_TOKENS)) - blocks[r]
            if need > free:
                short = need  # KV ran out: the caller makes room
                going = False
            else:
                if need > 0:
                    free -= need
                    blocks[r] += need
                if pc is not None:
                    # (the cheap test first; written out as in schedule_decodes_nb, which says why)
                    if seqs.pb[r] < seqs.plim[r]:
                        if seqs.pb[r] < (kv[r] + c) // KV_BLOCK_TOKENS:
                            if seqs.pb[r] >= inp.chain_len[r] and out.req_pre[r] == 0:
                                seqs.pb[r] = min((kv[r] + c) // KV_BLOCK_TOKENS, seqs.plim[r])  # lazy naming
                            else:
                                short = -1 - r  # the caller names its blocks (pc_name_nb) before the next one's
                                going = False
                sched[r] = c
                n_pre += c
                attn += c * (kv[r] + 0.5 * c)
                if c == left:
                    n_lm += 1
                i += 1
    cnt[B_FREE] = free
    si[step, S_PREFILL] += n_pre
    si[step, S_LM] += n_lm
    si[step, S_STALLED] += stalled
    out.steps_f[step, F_ATTN_WORK] += attn
    return i, short


@njit(cache=True, nogil=True, inline="always")
def schedule_waiting_nb(t, whole, inp, seqs, q, b, pc, knobs, out, step, spec):
    """(3) Waiting requests in (class,) arrival order: whole prompts (``whole``: vLLM V0 without
    chunked prefill) or a first chunk of what the budget has left, while sequence slots, the
    budget and free KV blocks (less the watermark once something runs) allow; without preemption
    a request reserves blocks for prompt + output. Swapped sequences of the head's class or a
    higher one come back first: nobody is admitted past them.

    ``whole``: a sequence longer than the budget (a recompute victim's prompt + generated tokens) is admitted
    only as a step's first, with the blocks of all its tokens (V0 allocates a whole prompt's), and prefills
    the budget's worth; ``continue_prefills_nb`` does the rest in the next steps.

    The first request that does not fit ends admission. Returns (-1, 0), or, with priority and
    preemption in a step that has admitted nobody, (that request, the blocks it needs): the caller
    evicts lower classes for it (``evict_for_nb``) and admits nobody in this step, since a step
    that preempted admits no one (vLLM V0 and V1)."""
    run, cnt, cls = b.run, b.n, seqs.cls
    kv, target, blocks, sched = seqs.kv, seqs.target, seqs.blocks, seqs.sched
    si = out.steps_i
    req_f = out.req_f
    sw_cls = q.len.shape[0]  # the highest class in host memory (none: above every class)
    for j in range(cnt[B_SWAPPED]):
        sw_cls = min(sw_cls, cls[b.swapped[j]])
    evict_for = -1
    evict_need = 0
    going = True
    while going and cnt[B_WAITING] > 0:
        k = q_first_class_nb(q)
        h = q_peek_nb(q, k)
        tokens = si[step, S_PREFILL] + si[step, S_DECODE]
        if spec is not None:
            tokens += si[step, S_PADDED]
        m, m0 = 0, 0
        if pc is not None:
            # cached leading blocks, leaving at least one token to compute (vLLM V1's KVCacheManager.
            # get_computed_blocks: max_cache_hit_length = num_tokens - 1; a recompute victim's generated ones count)
            m, m0 = pc_lookup_nb(h, (target[h] - 1) // KV_BLOCK_TOKENS, inp, pc)
        cached = m * KV_BLOCK_TOKENS
        hit = cached
        if inp.ready[h] > 0 and req_f[h, R_FIRST_SCHED] < 0:
            # KV that came with it (disaggregation), in blocks of its own from now on but for the cached ones among
            # it (a decode instance's prefix cache: its transfer moved only the rest)
            hit = max(cached, inp.ready[h])
        left = target[h] - hit
        c = min(left, knobs.budget) if whole else min(left, knobs.budget - tokens)
        if knobs.preempt == PREEMPT_OFF:
            extra = 0
            if spec is not None:
                # its last decode (KV for prompt + output - 2 tokens) verifies K drafts past its output and, with a
                # proposer keeping KV, holds K lookahead slots too (schedule_decodes_nb)
                extra = spec.k - 1
                if spec.drafts:
                    extra += spec.k
            fresh = blocks_for_nb(min(target[h] + inp.output[h] - seqs.gen[h] + extra,
                                      max(target[h] + inp.output[h] - seqs.gen[h], knobs.kv_blocks * KV_BLOCK_TOKENS))) - m
        else:
            fresh = blocks_for_nb(target[h] if whole else hit + c) - m
        need = fresh + m0  # free blocks it takes: new ones, and cached ones nobody was using
        spent = (tokens > 0 and tokens + c > knobs.budget) if whole else c <= 0
        if sw_cls <= k:
            going = False  # swapped sequences of its class or above come back first
        elif spent:
            going = False  # the budget is spent
        elif not fits_nb(need, cnt, knobs):
            going = False
            if knobs.wait_preempt and knobs.use_prio and knobs.preempt != PREEMPT_OFF and si[step, S_ADMITTED] == 0:
                evict_for = h
                evict_need = need
        else:
            q_pop_front_nb(q, k)
            cnt[B_WAITING] -= 1
            first = req_f[h, R_FIRST_SCHED] < 0
            if first:
                req_f[h, R_FIRST_SCHED] = t
            nr = cnt[B_RUNNING]
            run[nr] = h
            cnt[B_RUNNING] = nr + 1
            cnt[B_FREE] -= fresh
            blocks[h] = fresh
            kv[h] += hit - m * KV_BLOCK_TOKENS  # the KV that came with it (0 unless disaggregated)
            if pc is not None:
                if m > 0:
                    pc_acquire_nb(h, m, inp, seqs, pc, cnt)  # blocks[h] = m
                    blocks[h] += fresh
                    kv[h] = hit
                    si[step, S_CACHED_TOKENS] += cached
                    if first:
                        out.req_cached[h] = cached
                pc_trim_nb(pc, cnt)  # its new blocks come from the queue's head, after it took its hits
                pc_register_nb(h, (hit + c) // KV_BLOCK_TOKENS, inp, seqs, pc, cnt, out.req_pre[h] == 0)
            sched[h] = c
            si[step, S_PREFILL] += c
            out.steps_f[step, F_ATTN_WORK] += c * (hit + 0.5 * c)
            if c == left:
                si[step, S_LM] += 1
            si[step, S_ADMITTED] += 1
    return evict_for, evict_need


@njit(cache=True, nogil=True)
def continue_prefills_nb(inp, seqs, q, b, pc, knobs, out, step, spec):
    """Without chunked prefill: the next piece of the prefills under way, the first step stage (the engine loop
    calls this only when one is under way; the step is then prefill-only and its decodes stall).

    Only a sequence longer than the budget is ever under way here: a recompute victim whose prompt + generated
    tokens exceed max_num_batched_tokens (or one swapped out while so). vLLM V0 never meets one: without chunked
    prefill it refuses a budget below max_model_len (vllm/config.py, SchedulerConfig._verify_args; its default
    is max(max_model_len, 2048)), and it would mark a waiting sequence longer than min(max_model_len, budget)
    FINISHED_IGNORED (vllm/core/scheduler.py, _schedule_prefills and _get_prompt_limit), ending the request.
    The simulator lets the budget go down to the longest prompt (refusing less than the longest prompt + output - 1,
    the most a victim prefills again, would refuse the default ``mixed`` workload on the default ``continuous``
    policy: 423 of 20,000 of its requests, seed 0, exceed 8,192), and keeps every step within the budget without
    a deadlock or a dropped
    request: such a sequence is admitted as a step's first with blocks for all its tokens (schedule_waiting_nb)
    and prefilled in consecutive prefill-only steps of at most the budget. Its cost is the same tokens, split.

    A rare path, so not inlined: the engine loop stays as small as it was."""
    i, short, cap = 0, 1, -1  # (from 0: the decodes before the prefills under way count as stalled)
    while short != 0:
        i, short = schedule_chunks_nb(i, inp, seqs, b, pc, knobs, out, step, spec, cap)
        cap = -1
        if short > 0:
            cap = room_left_nb(knobs, out, step, spec)
            i = make_room_nb(i, short, inp, seqs, q, b, pc, knobs, out, step, spec)
            if i < 0:
                short = 0
        elif pc is not None:
            if short < 0:
                r = -1 - short
                pc_name_nb(r, (seqs.kv[r] + seqs.sched[r]) // KV_BLOCK_TOKENS, inp, seqs, pc, b.n, out.req_pre[r] == 0)
    if pc is not None:
        pc_trim_nb(pc, b.n)  # the new blocks above took reclaimable ones: the cache as it is now


@njit(cache=True, nogil=True)
def schedule_waiting_pc_nb(t, whole, inp, seqs, q, b, pc, knobs, out, step, spec):
    """``schedule_waiting_nb`` with the prefix cache, compiled on its own: called from the engine loop, so
    its chain walks (loops in a loop) stay out of the loop whose reference counts LLVM must prune."""
    return schedule_waiting_nb(t, whole, inp, seqs, q, b, pc, knobs, out, step, spec)


@njit(cache=True, nogil=True, inline="always")
def count_decoding_nb(b, seqs, hi):
    """Sequences past their prefill in run[:hi]."""
    run, kv, target = b.run, seqs.kv, seqs.target
    m = 0
    for i in range(hi):
        r = run[i]
        if kv[r] >= target[r]:
            m += 1
    return m


# --- applying a step ----------------------------------------------------------------------
@njit(cache=True, nogil=True)
def regroup_nb(b, seqs):
    """Stable partition of the running list: the sequences past their prefill first, the prefills under way after
    them, each group in its order. Only a sequence swapped back in mid-prefill (placed before the running prefills)
    can finish its prefill ahead of one of them; vLLM V0, whose mechanism swap is, rebuilds its running queue by kind
    every step, decodes first under chunked prefill (vllm/core/scheduler.py, _schedule_chunked_prefill). Called by
    the engine loop after a step only with swap preemption: in the inlined step stages, its call made every run
    1.7x slower (benchmarks/bench_engine_pair.py). In place: rare."""
    run, kv, target = b.run, seqs.kv, seqs.target
    w = 0
    for i in range(b.n[B_RUNNING]):
        r = run[i]
        if kv[r] >= target[r]:
            for j in range(i, w, -1):
                run[j] = run[j - 1]
            run[w] = r
            w += 1


@njit(cache=True, nogil=True)
def finish_nb(nd, t, inp, seqs, b, pc, lat, req_pre):
    """The ``nd`` sequences the step finished (b.done): their blocks go back to the prefix cache's queue, and
    a session's next turn arrives a think time after the release."""
    for j in range(nd):
        r = b.done[j]
        if pc is not None:
            pc_release_nb(r, inp, seqs, pc, b.n, req_pre[r] == 0, True)
        if lat is not None:
            session_next_nb(r, t, inp, lat, b.n)



@njit(cache=True, nogil=True, inline="always")
def apply_step_nb(t, inp, seqs, b, pc, lat, out, spec, hold):
    """The step ended at ``t`` and its tokens exist: chunks advance the prefills, decodes and
    completed prefills emit a token (its gap recorded), finished sequences leave at once and free
    their blocks (with the prefix cache or sessions, ``finish_nb`` does the rest: a chain walk here
    would defeat the pruning of reference counts, see the module's note; with ``hold``, a prefill instance
    of a split, they keep them until a decode instance takes them in: kernel.end_holds_nb). Returns how many finished."""
    run, cnt = b.run, b.n
    kv, target, gen, sched, blocks, last_tok = seqs.kv, seqs.target, seqs.gen, seqs.sched, seqs.blocks, seqs.last_tok
    prio, output = inp.prio, inp.output
    req_f, hist = out.req_f, out.hist
    keep = 0
    done = 0
    for i in range(cnt[B_RUNNING]):
        r = run[i]
        c = sched[r]
        finished = False
        if c > 0:
            sched[r] = 0
            ne = 1  # tokens emitted: accepted + 1 for a speculating decode (its c > 1)
            if kv[r] >= target[r]:
                if spec is not None:
                    if c > 1:
                        ne = spec.emit[r]
                        spec.req_acc[r] += ne - 1
                kv[r] += ne
                emits = True
            else:
                kv[r] += c
                emits = kv[r] == target[r]
            if emits:
                gen[r] += ne
                if gen[r] == 1:
                    req_f[r, R_FIRST_TOKEN] = t
                else:
                    gap = t - last_tok[r]  # one gap per delivery: a verification's tokens arrive together
                    itl_record_nb(hist, prio[r], gap)
                    if gap > req_f[r, R_MAX_ITL]:
                        req_f[r, R_MAX_ITL] = gap
                last_tok[r] = t
                finished = gen[r] == output[r]
        if finished:
            if pc is None and not hold:
                cnt[B_FREE] += blocks[r]
                blocks[r] = 0
                b.done[done] = r  # (finish_nb, and a disaggregated prefill's handoff log, read it)
            else:
                b.done[done] = r  # finish_nb (or end_holds_nb, once a decode instance took it in) gives its blocks back
            req_f[r, R_FINISH] = t
            req_f[r, R_RELEASE] = t
            done += 1
        else:
            run[keep] = r
            keep += 1
    cnt[B_RUNNING] = keep
    return done
