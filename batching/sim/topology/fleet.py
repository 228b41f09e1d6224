"""A fleet: replicas on one or more nodes behind a router that reads their state at each arrival (DESIGN §2).

Round-robin needs no state, so simulate.py deals the requests first and runs each replica alone. The other
routers decide at the arrival time from what the replicas report, as a gateway in front of vLLM or SGLang does
(llm-d's scorers, NVIDIA Dynamo's router, the SGLang router), so the replicas run in one simulation here: at
each request's arrival every replica first runs the steps that start before it (engine.advance_nb), then the
router picks one and the request joins its waiting queue.

What a router reads of a replica: its requests running, waiting and swapped, and its KV blocks held, as of its
last scheduling pass (a step in flight still counts the requests it will finish: replicas report at step
boundaries), plus what the router itself sent it since then (one request, and its prompt's KV blocks).

- ``least-outstanding``: the fewest requests outstanding (running + waiting + swapped).
- ``least-kv``: the fewest KV blocks held (vLLM's gpu_cache_usage_perc, which llm-d's KV scorer reads).
- ``prefix-affinity``: the replica whose past requests share the longest leading run of this request's KV block
  chain (the router's approximate radix tree per replica, never evicted, like SGLang's cache-aware router), when
  the match covers at least half the chain and that replica has at most ``AFFINITY_BALANCE`` more outstanding
  requests than the least loaded; otherwise least-outstanding. Without shared prefixes it is least-outstanding.

Ties go to the first replica in round-robin order from a pointer that moves on with every request, so equal
replicas share the load evenly. A session's later turns stay on its first turn's replica (sticky, as the
gateways keep a conversation where its KV cache is); only first turns and independent requests are routed.
Only the continuous modes run in a fleet with these routers (request-level batching runs with round-robin).
"""
from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
from numba import njit

from batching.sim.engine import first_use
from batching.sim.engine import kernel as eng
from batching.sim.engine.state import (B_WAITING, S_WAITING, C_RELEASED, C_STEP, DEADLOCK, NUM_RF, NUM_SF, NUM_SI, NUM_SPF,
                                       NUM_SPI, NUM_V, OK, OUT_OF_STEPS, R_ARRIVAL, R_MAX_ITL, V_KV, V_OUTSTANDING,
                                       ITL_BINS, Later, Outputs, Prefix, Run, Spec, prefix_tables)
from batching.sim.engine.stages import blocks_for_nb, chain_id_nb, q_push_back_nb

ROUTERS = ("round-robin", "least-outstanding", "least-kv", "prefix-affinity")
ROUTER_HELP = {
    "round-robin": "each request to the next replica in turn (a session's later turns stay with its first)",
    "least-outstanding": "to the replica with the fewest requests running, waiting or swapped",
    "least-kv": "to the replica with the fewest KV cache blocks in use",
    "prefix-affinity": "to the replica that served the longest shared prefix, unless it is overloaded",
}
MAX_NODES = 64
AFFINITY_BALANCE = 32  # requests: prefix-affinity gives way to load when the best match is this far above the least
AFFINITY_MIN_MATCH = 0.5  # share of the request's chain the best match must cover
_CODE = {name: i for i, name in enumerate(ROUTERS)}


def check_fleet(nodes, router: str, mode: str) -> None:
    """Clear errors for the fleet's fields, naming the field, the value and what is allowed."""
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes={nodes!r} is out of range; allowed a whole number from 1 to {MAX_NODES}")
    if router not in ROUTERS:
        raise ValueError(f"router={router!r} is not allowed; allowed: {', '.join(ROUTERS)}")
    if router != "round-robin" and mode != "continuous":
        raise ValueError(f"router={router!r} reads each replica's state at every arrival and is built for the "
                         f"continuous modes; with mode={mode!r} use router='round-robin'")


@njit(cache=True, nogil=True, inline="always")
def _out_of(out, i):
    """Replica i's outputs: the shared per-request tables and histogram, its own step tables."""
    return Outputs(out.req_f, out.req_pre, out.req_cached, out.steps_i[i], out.steps_f[i], out.hist)


@njit(cache=True, nogil=True, inline="always")
def _pc_of(pcs, i):
    if pcs is None:
        return None
    else:
        return Prefix(pcs.ref[i], pcs.cached[i], pcs.prev[i], pcs.next[i], pcs.ends[i], pcs.key[i], pcs.index[i],
                      pcs.free[i], pcs.hashed[i], pcs.gap[i])


@njit(cache=True, nogil=True, inline="always")
def _lat_of(lats, i):
    if lats is None:
        return None
    else:
        return Later(lats.t[i], lats.r[i], lats.nxt)


@njit(cache=True, nogil=True, inline="always")
def _spec_of(sp, i):
    if sp is None:
        return None
    else:
        return Spec(sp.k, sp.inv_log_a, sp.disable_at, sp.seed, sp.drafts, sp.draft_tab, sp.draft_ctx_s,
                    sp.draft_lm_flops_s, sp.draft_lm_bytes_s, sp.draft_attn_s, sp.emit, sp.req_acc, sp.steps_i[i],
                    sp.steps_f[i])


@njit(cache=True, nogil=True)
def _least_nb(view, col, rr, n_rep):
    """The replica with the least view[:, col], first in round-robin order from ``rr`` on ties."""
    best = rr
    for j in range(1, n_rep):
        i = rr + j
        if i >= n_rep:
            i -= n_rep
        if view[i, col] < view[best, col]:
            best = i
    return best


@njit(cache=True, nogil=True)
def _affinity_nb(r, view, rr, n_rep, off, ids, lens, shift, seen):
    """prefix-affinity (module docstring): the longest leading run of r's chain each replica has seen."""
    least = _least_nb(view, V_OUTSTANDING, rr, n_rep)
    lo, size = off[r], lens[r]
    if size == 0:
        return least
    best, best_m = least, 0
    for j in range(n_rep):
        i = rr + j
        if i >= n_rep:
            i -= n_rep
        m = 0
        while m < size and seen[i, chain_id_nb(ids, lo, m, shift)]:
            m += 1
        if m > best_m:
            best, best_m = i, m
    if best_m < AFFINITY_MIN_MATCH * size or view[best, V_OUTSTANDING] > view[least, V_OUTSTANDING] + AFFINITY_BALANCE:
        best = least
    return best


@njit(cache=True, nogil=True, inline="always")
def join_nb(st, out, view, inp, i, r, t):
    """Request r joins run ``st`` (instance i of ``out``'s stacked step tables) at t: its waiting queue, its clock
    moved to t if it was idle, else the step in flight's waiting count (a run alone counts a request arriving
    during a step as waiting after it); the router's view of i counts it and its prompt's blocks."""
    view[i, V_OUTSTANDING] += 1
    view[i, V_KV] += blocks_for_nb(inp.prompt[r])
    q_push_back_nb(st.q, st.seqs.cls[r], r)
    st.b.n[B_WAITING] += 1
    if st.t[0] < t:
        st.t[0] = t
    elif st.c[C_STEP] > 0:
        out.steps_i[i, st.c[C_STEP] - 1, S_WAITING] += 1


@njit(cache=True, nogil=True)
def run_fleet_nb(inp, knobs, cost, out, pcs, lats, spec, code, off, ids, lens, shift, seen, rep_of, n_steps):
    """Every request through the router onto ``n_rep`` replicas (rep_of gets each routed request's replica,
    n_steps each replica's step count); returns (status, replica that failed or -1)."""
    n = inp.arrival.shape[0]
    n_rep = n_steps.shape[0]
    runs = [eng.new_run_nb(inp, knobs, cost, False)]
    tab = runs[0].tab  # every replica's step time by token count is the same (read only): one table, not n_rep
    for _ in range(1, n_rep):  # (not a comprehension: numba's copies the arrays of the tuples it holds)
        st = eng.new_run_nb(inp, knobs, cost, False)
        runs.append(Run(st.seqs, st.q, st.b, tab, st.c, st.t))
    view = np.zeros((n_rep, NUM_V))
    if spec is not None:
        np.random.seed(spec.seed)  # one generator for the fleet: sampled acceptance repeats for a seed
    rr = 0
    for r in range(n):
        if inp.after[r] >= 0:
            continue  # a session's later turn: its first turn's replica releases it into its own queue
        t_arr = inp.arrival[r]
        for i in range(n_rep):
            status = eng.advance_nb(inp, knobs, cost, _out_of(out, i), _pc_of(pcs, i), _lat_of(lats, i),
                                    _spec_of(spec, i), runs[i], t_arr, view[i], None)
            if status != OK:
                n_steps[i] = runs[i].c[C_STEP]
                return status, i
        if code == 1:
            i = _least_nb(view, V_OUTSTANDING, rr, n_rep)
        elif code == 2:
            i = _least_nb(view, V_KV, rr, n_rep)
        elif code == 3:
            i = _affinity_nb(r, view, rr, n_rep, off, ids, lens, shift, seen)
            for j in range(lens[r]):
                seen[i, chain_id_nb(ids, off[r], j, shift)] = True
        else:
            i = rr
        rr += 1
        if rr == n_rep:
            rr = 0
        rep_of[r] = i
        join_nb(runs[i], out, view, inp, i, r, t_arr)
    released = 0
    for i in range(n_rep):
        status = eng.advance_nb(inp, knobs, cost, _out_of(out, i), _pc_of(pcs, i), _lat_of(lats, i),
                                _spec_of(spec, i), runs[i], np.inf, view[i], None)
        n_steps[i] = runs[i].c[C_STEP]
        if status != OK:
            return status, i
        released += runs[i].c[C_RELEASED]
    if released != n:
        return DEADLOCK, -1
    return OK, -1


def stacked_outputs(n: int, instances: int, room: int, classes: int, arrival) -> Outputs:
    """Outputs for ``instances`` runs sharing the per-request tables and the histogram, each with its own step
    tables (``room`` rows; _out_of gives instance i's view)."""
    req_f = np.full((n, NUM_RF), -1.0)
    req_f[:, R_MAX_ITL] = 0.0
    req_f[:, R_ARRIVAL] = arrival
    return Outputs(req_f, np.zeros(n, np.int64), np.zeros(n, np.int64),
                   small_pages(np.empty((instances, room, NUM_SI), np.int64)),
                   small_pages(np.empty((instances, room, NUM_SF))), np.zeros((max(1, classes), ITL_BINS), np.int64))


def stacked_prefix(instances: int, inp, kv_blocks: int) -> Prefix | None:
    """One block pool per instance (a GPU cache of kv_blocks blocks each) over the blocks the requests name
    (Inputs.n_ids; _pc_of gives instance i's), as kernel._new_prefix builds one."""
    pc = prefix_tables(inp.n_ids, kv_blocks, instances)
    for a in pc:
        small_pages(a)
    return pc


_MADV_NOHUGEPAGE = 15  # Linux <sys/mman.h>
_PAGE = mmap.PAGESIZE


def small_pages(a: np.ndarray) -> np.ndarray:
    """``a`` (returned) backed by ordinary pages, not 2 MiB huge ones (Linux; elsewhere, or if refused, as it was).
    numpy asks for huge pages on every array of 4 MiB or more (madvise MADV_HUGEPAGE), so a write makes 2 MiB
    resident around it: the stacked tables, where each replica writes its own rows or the few entries its requests
    name, then became resident almost whole (64 nodes x 8 replicas, 2,000 requests: ~1.9 GiB of prefix tables
    indexed by block id, each replica's row 1 MiB a table, for ~5 MiB written)."""
    if a.nbytes < 4 << 20 or _libc is None:
        return a
    start = -(-a.ctypes.data // _PAGE) * _PAGE  # the whole pages inside the array
    end = (a.ctypes.data + a.nbytes) // _PAGE * _PAGE
    if end > start:
        _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_NOHUGEPAGE)
    return a


def _load_libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def run_fleet(reqs, replicas: int, router: str, policy, swap_cap: int, kv_blocks: int, cm, spec=None):
    """Run ``reqs`` on ``replicas`` replicas behind ``router`` in one simulation; returns (replica, request
    indices, engine.EngineOutput) per replica with work, as simulate.run_requests does."""
    n = len(reqs)
    chains = reqs.block_off is not None
    pc_off = reqs.block_off if chains and policy.prefix_caching else None
    shift = reqs.block_shift
    inp = eng.inputs(reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens, reqs.priority, chain_off=pc_off,
                     chain_ids=reqs.block_ids if pc_off is not None else None, after=reqs.after, think_s=reqs.think_s,
                     chain_len=reqs.chain_lengths() if pc_off is not None else None, chain_shift=shift)
    knobs, cost = policy.knobs(len(reqs.class_names), kv_blocks, swap_cap), eng.kernel_cost(cm)
    off = reqs.block_off if chains else np.zeros(n + 1, np.int64)
    ids = reqs.block_ids if chains else np.zeros(0, np.int64)
    lens = reqs.chain_lengths() if chains else np.zeros(n, np.int64)
    n_ids = reqs.num_block_ids if chains else 1
    seen = np.zeros((replicas, n_ids if router == "prefix-affinity" else 1), np.bool_)
    cap = max(1, eng.MAX_STEPS // replicas)  # the stacked step tables hold MAX_STEPS rows in all
    room = eng.room_for(inp, policy.max_num_batched_tokens, None, replicas, cap)
    while True:
        out = stacked_outputs(n, replicas, room, len(reqs.class_names), inp.arrival)
        req_f = out.req_f
        # the block pool per replica only over shared chains: with every request's own blocks named, its tables would
        # cost each replica ~1 KB per request of the whole run (128 replicas x 5,000 requests: +0.4 GB)
        pcs = stacked_prefix(replicas, inp, kv_blocks) if pc_off is not None else None
        lats = None
        one = eng.new_later(inp.after)
        if one is not None:
            lats = Later(np.empty((replicas, n)), np.empty((replicas, n), np.int64), one.nxt)
        sp = None
        if spec is not None:
            sp = spec._replace(emit=np.ones(n, np.int64), req_acc=np.zeros(n, np.int64),
                               steps_i=np.empty((replicas, room, NUM_SPI), np.int64),
                               steps_f=np.empty((replicas, room, NUM_SPF)))
        rep_of = np.full(n, -1, np.int64)
        n_steps = np.zeros(replicas, np.int64)
        args = (inp, knobs, cost, out, pcs, lats, sp, _CODE[router], off, ids, lens, shift, seen, rep_of, n_steps)
        with first_use.first_use(first_use.variant("fleet", args, pcs, lats, sp)):
            status, bad = run_fleet_nb(*args)
        if status == OUT_OF_STEPS:
            room = eng.grow_room(room, inp, cap, f"its {replicas} replicas")
            seen[:] = False
            continue
        if status == DEADLOCK:
            raise RuntimeError(f"the engine could not schedule any work on replica {bad} (deadlock)")
        break
    for r in np.flatnonzero(rep_of < 0):  # a session's later turns ran where its first turn did (after[r] < r)
        rep_of[r] = rep_of[reqs.after[r]]
    outs = []
    for rep in range(replicas):
        idx = np.flatnonzero(rep_of == rep)
        k = int(n_steps[rep])
        if len(idx) == 0:
            continue
        si, sf = out.steps_i[rep, :k].copy(), out.steps_f[rep, :k].copy()
        hist = out.hist if not outs else np.zeros_like(out.hist)  # the fleet's histogram, counted once
        if sp is None:
            eo = eng.EngineOutput(req_f[idx], out.req_pre[idx], out.req_cached[idx], si, sf, hist)
        else:
            eo = eng.EngineOutput(req_f[idx], out.req_pre[idx], out.req_cached[idx], si, sf, hist, sp.req_acc[idx],
                                  sp.steps_i[rep, :k].copy(), sp.steps_f[rep, :k].copy())
        outs.append((rep, idx, eo))
    return outs
