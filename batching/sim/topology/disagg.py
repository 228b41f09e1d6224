"""Prefill/decode disaggregation (DistServe, Splitwise): prefill instances and decode instances, each with its
own tensor-parallel degree, in one simulation (DESIGN §2), as vLLM's disaggregated serving runs it (a router sends the
prompt to a prefill instance with max_tokens=1, then the whole request to a decode instance, which pulls the KV over
its KV connector and streams every output token to the client).

- A request arrives at the prefill instance with the fewest outstanding requests (fleet.py's reading of state).
  The prefill instance batches prompts under the policy (chunked or whole prompts, its own token budget) and
  computes the prompt's KV and one token (max_tokens=1, not sent to the client); it releases the request then.
- Its prompt's KV then moves to a decode instance: the one with the most free KV blocks at that moment (least
  loaded), over NVLink within a node (the GPU's NVLink bandwidth per direction) or the network across nodes
  (400 Gb/s per GPU, as a node's one NIC per GPU), or ``kv_link_gbps`` per GPU when given: transfer time = a fixed
  time per transfer (``kv_transfer_fixed_s``: posting its descriptors) + prompt tokens x the KV bytes per token the
  busiest GPU moves (``kv_bytes_per_gpu_token``: a dense model's heads split over the smaller TP; an MLA model's
  whole latent on every rank) / the link bandwidth per GPU. The decode instance is picked at the handoff and starts
  the transfer when its scheduler next runs: at its next step's start, or at once when it is idle (vLLM's decode
  engine takes a new request in at a schedule call, allocates its blocks and has its worker start the pull with the
  step it launches then; ``kv_pull_wait_s``). The blocks it allocates before the pull are not held here until the
  transfer ends, and a decode instance without room still pulls first and then waits (vLLM waits, then pulls).
  The prefill instance keeps the request's KV blocks until the decode instance has taken the request in (vLLM's prefill
  frees them when the decode side reports its read done, and the decode side reads only once it has blocks for
  them; SGLang's prefill once its transfer into the decode's preallocated blocks completes): they count against
  its cache through the transfer and any wait for room on the decode side, so decode backpressure reaches it.
- The decode instance runs continuous batching; the request joins its waiting queue when the transfer ends and
  is admitted when its blocks fit (backpressure: it waits, nothing is dropped). Its first step computes the last
  prompt token again and samples the first token the client sees (vLLM's NixlConnector loads all but the last
  prompt token; engine.state.Inputs.ready), then it decodes the rest.

- Speculative decoding (DeepSeek MTP + PD, EAGLE, a draft model, n-gram): the decode instances speculate with the
  Spec an aggregated replica of their deployment gets (speculative.spec_for at the decode TP; their KV cache less
  the proposer's share). Prefill instances do not speculate, but a proposer with GPU passes (draft, EAGLE, MTP)
  runs its first pass over the prompt there: SGLang launches the prefill server with the same
  --speculative-algorithm, its prefill runs the draft's extend over the prompt and the prefill queue sends the
  draft's KV with the target's (sgl-project/sglang python/sglang/srt/disaggregation/prefill.py,
  PrefillBootstrapQueue._init_kv_manager: "We should also transfer draft model kv cache"; issue #6684's MTP + PD
  launch commands; PR #7242 sends the MTP hidden states too). So a prefill instance gets a Spec as well (its cost
  is the proposer's pass over each prompt token: it has no decodes), its KV cache shrinks by the proposer's share,
  and a transfer moves the proposer's KV bytes per token with the target's. The decode instance's first step runs
  the proposer over its one recomputed token, as it runs the target.

TTFT is what the client sees: prefill queue + prefill + transfer + decode queue + the decode instance's first
step; TPOT and E2E come from the decode instance's tokens. ``kv_transfer_s`` and ``decode_queue_s`` report the
transfer and the wait for a decode slot per request. Closed-loop clients and sessions send a request a think
time after the decode instance released the one before (run_disagg_nb orders every instance's steps by time, so
such an arrival is known before any instance passes it). Request-level batching (static, dynamic) is refused.

- With prefix caching every instance keeps its own cache. A decode instance's holds the prompts it took in and the
  outputs it computed (a session's earlier turns, a shared system prompt), and a request moves only what its decode
  instance does not hold: vLLM's decode instance looks the prompt up in its cache before it pulls
  (NixlConnector's get_num_new_matched_tokens asks the prefill for the tokens past its local hits; a full hit pulls
  nothing). So the decode instance is picked when the prefill releases the request (the proxy's choice then: the
  most free KV), its cache is looked up then (``decode_cached_tokens``), and the transfer moves the rest; the
  admission takes the cached blocks shared. Blocks evicted from that cache during the transfer are not pulled again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from numba import njit

from batching.sim.engine import first_use
from batching.sim.engine import kernel as eng
from batching.sim.engine.speculative import DRAFTING_METHODS, check_spec, draft_memory_per_gpu, spec_for, spec_kv_blocks
from batching.sim.engine.stages import heap_push_nb, later_pop_nb, later_push_nb, pc_lookup_nb
from batching.sim.hardware.costmodel import cost_model
from batching.sim.engine.state import (B_LATER, B_RUNNING, B_SWAPPED, B_WAITING, C_RELEASED, C_STEP, DEADLOCK,
                                       NUM_B, NUM_V, OK, OUT_OF_STEPS, R_ARRIVAL, R_FINISH, R_FIRST_SCHED,
                                       R_FIRST_TOKEN, R_MAX_ITL, R_RELEASE, V_KV, V_OUTSTANDING, NUM_SPF, NUM_SPI,
                                       Handoff, Later)
from batching.sim.topology.fleet import (_least_nb, _out_of, _pc_of, _spec_of, join_nb, stacked_outputs,
                                         stacked_prefix)
from batching.sim.frames import steps_frame
from batching.sim.metrics import (node_summary, percentile, queue_growth, replica_summary, request_latencies,
                                  spec_summary, wall_time)
from batching.sim.hardware.specs import GIB, GPUS_PER_NODE, KV_BLOCK_TOKENS, Deployment

CROSS_NODE_GBPS = 400.0  # per GPU across nodes: one 400 Gb/s NIC per GPU (ConnectX-7 on DGX/HGX H100)
# A transfer's fixed time before its bytes move: vLLM's NixlConnector posts one read per KV block and layer, and the
# decode side's KV-transfer metrics measured 6.7 ms of "post duration" per transfer on average (1,785 descriptors,
# 167 MB per transfer; 3 prefill + 1 decode instances, block size 64, 1,000 requests: vllm-project/vllm issue
# #50913, 2026-08-28, baseline column)
KV_TRANSFER_FIXED_S = 6.7e-3
KV_TRANSFER_FIXED_MAX_S = 10.0
MAX_INSTANCES = 64


@dataclass(frozen=True)
class Disagg:
    """A split of the deployment's GPUs into prefill and decode instances."""

    prefill_instances: int = 1
    prefill_tp: int = 4
    decode_instances: int = 1
    decode_tp: int = 4
    kv_link_gbps: float | None = None  # per GPU, Gb/s; None: NVLink within a node, 400 Gb/s across nodes
    kv_transfer_fixed_s: float = KV_TRANSFER_FIXED_S  # per transfer, before its bytes move

    @property
    def gpus(self) -> int:
        return self.prefill_instances * self.prefill_tp + self.decode_instances * self.decode_tp

    def validate(self, dep: Deployment, nodes: int = 1) -> None:
        if dep.node.num_gpus > GPUS_PER_NODE:
            raise ValueError(f"a prefill/decode split places its instances on nodes of {GPUS_PER_NODE} GPUs; "
                             f"num_gpus={dep.node.num_gpus} (tp {dep.node.tp} over two nodes) is not one: use "
                             f"num_gpus {GPUS_PER_NODE} and more nodes")
        for name in ("prefill_instances", "decode_instances"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_INSTANCES:
                raise ValueError(f"{name}={v!r} is out of range; allowed a whole number from 1 to {MAX_INSTANCES}")
        for name in ("prefill_tp", "decode_tp"):
            v = getattr(self, name)
            if v not in (1, 2, 4, 8) or v > dep.node.num_gpus:
                raise ValueError(f"{name}={v!r} is not allowed; allowed: 1, 2, 4, 8, at most the node's "
                                 f"{dep.node.num_gpus} GPUs")
        have = dep.node.num_gpus * nodes
        if self.gpus > have:
            raise ValueError(f"the split needs {self.gpus} GPUs (prefill {self.prefill_instances} x TP "
                             f"{self.prefill_tp} + decode {self.decode_instances} x TP {self.decode_tp}) but "
                             f"{nodes} node{'s' if nodes > 1 else ''} of {dep.node.num_gpus} GPUs have {have}")
        if self.kv_link_gbps is not None and not 1.0 <= self.kv_link_gbps <= 1e5:
            raise ValueError(f"kv_link_gbps={self.kv_link_gbps!r} is out of range; allowed 1 to 100000 Gb/s per GPU")
        v = self.kv_transfer_fixed_s
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0.0 <= v <= KV_TRANSFER_FIXED_MAX_S:
            raise ValueError(f"kv_transfer_fixed_s={v!r} is out of range; allowed 0 to {KV_TRANSFER_FIXED_MAX_S:g} s")
        for role, tp in (("prefill", self.prefill_tp), ("decode", self.decode_tp)):
            try:
                self.deployment(dep, role).validate()
            except ValueError as exc:
                raise ValueError(f"the {role} instances (TP {tp}): {exc}") from None

    def check_policy(self, policy, router: str = "round-robin") -> None:
        """What the split runs with: iteration-level batching, and its own routing."""
        if policy.mode != "continuous":
            raise ValueError(f"disaggregation runs iteration-level batching (mode continuous: the presets continuous, "
                             f"chunked, priority); mode={policy.mode!r} runs each batch as a whole")
        if router != "round-robin":
            raise ValueError(f"router={router!r}: a prefill/decode split routes by itself (prefill: least "
                             "outstanding, decode: most free KV); leave router='round-robin'")

    def check_spec(self, policy, dep: Deployment) -> None:
        """speculative.check_spec for each role's deployment (a proposer with GPU passes lives on both: see the
        module's docstring), the role and its TP named in the error."""
        for role, tp in (("prefill", self.prefill_tp), ("decode", self.decode_tp)):
            try:
                check_spec(policy, self.deployment(dep, role))
            except ValueError as exc:
                raise ValueError(f"the {role} instances (TP {tp}): {exc}") from None

    def kv_blocks(self, dep: Deployment, role: str, policy=None) -> int:
        """KV blocks of one ``role`` instance: its deployment's, less the speculative proposer's share of the memory
        when ``policy`` speculates with one (speculative.spec_kv_blocks)."""
        d = self.deployment(dep, role)
        return d.kv_capacity_blocks if policy is None else spec_kv_blocks(policy, d)

    def deployment(self, dep: Deployment, role: str) -> Deployment:
        """One instance of ``role`` as a Deployment (its TP on the same GPUs)."""
        tp = self.prefill_tp if role == "prefill" else self.decode_tp
        return replace(dep, node=replace(dep.node, tp=tp))

    def link_per_gpu_Bps(self, dep: Deployment) -> float:
        """Bytes/s one GPU sends or receives a transfer at: ``kv_link_gbps``, NVLink within a node, else the network
        (a NIC per GPU)."""
        if self.kv_link_gbps is not None:
            return self.kv_link_gbps * 1e9 / 8
        if self.gpus <= dep.node.num_gpus:
            return dep.node.gpu.nvlink_Bps
        return CROSS_NODE_GBPS * 1e9 / 8

    def kv_bytes_per_gpu_token(self, dep: Deployment, policy=None) -> float:
        """Bytes per prompt token the busiest GPU of a transfer moves: a prefill rank sends what it holds and a
        decode rank receives what it will hold (each side's KV bytes per token per GPU), all ranks in parallel.
        Dense models: the KV heads split over the ranks (the smaller TP bounds it; heads replicated past
        num_kv_heads stay whole). MLA: every rank holds the whole latent, so every decode rank moves all of it
        (DeepSeek-V3, BF16 KV, 4,096 tokens across nodes: 288 MB at 50 GB/s = 5.76 ms, not an eighth of it).
        With a speculative proposer that has its own KV (``policy``: draft model, EAGLE head, MTP module) its KV
        moves too (SGLang's prefill queue registers the draft KV pool with the target's for the transfer)."""
        def side(role: str) -> float:
            d = self.deployment(dep, role)
            extra = draft_memory_per_gpu(policy, d)[1] if policy is not None else 0.0
            return d.kv_bytes_per_token_per_gpu + extra
        return max(side("prefill"), side("decode"))

    def transfer_s(self, dep: Deployment, prompt_tokens: np.ndarray, policy=None) -> np.ndarray:
        """Seconds each prompt's KV takes from its prefill instance to its decode instance: the fixed time per
        transfer, then the bytes (the proposer's KV too under ``policy``'s speculative decoding) at the link's
        speed."""
        return (self.kv_transfer_fixed_s
                + np.asarray(prompt_tokens) * self.kv_bytes_per_gpu_token(dep, policy) / self.link_per_gpu_Bps(dep))

    def describe(self) -> str:
        return (f"disaggregated: {self.prefill_instances} prefill x TP {self.prefill_tp} + {self.decode_instances} "
                f"decode x TP {self.decode_tp}")


@njit(cache=True, nogil=True)
def _next_start_nb(run):
    """When a run's next step starts: its clock while it has work, inf while it is idle (an event wakes it)."""
    b = run.b
    if b.n[B_RUNNING] + b.n[B_WAITING] + b.n[B_SWAPPED] == 0:
        return np.inf
    return run.t[0]


@njit(cache=True, nogil=True)
def run_disagg_nb(inp_p, knobs_p, cost_p, out_p, pcs_p, sp_p, inp_d, knobs_d, cost_d, out_d, pcs_d, sp_d, xfer,
                  s_tok, hand, hand_d, heap, lat, dec_rep, dec_arr, dec_hit, pull_at, pre_rep, n_steps_p, n_steps_d):
    """Every request through a prefill instance and then a decode instance; returns
    (status, role 0 prefill / 1 decode, instance or -1). ``sp_p``, ``sp_d``: each role's stacked Spec (step tables
    per instance; fleet._spec_of gives instance i's), or None: the prefill instances' prices the proposer's pass over
    the prompt, the decode instances' speculates. ``lat`` (engine.state.Later, or None): closed-loop clients or
    sessions, a request after[r] >= 0 arriving think[r] after its predecessor's last token (its decode instance's
    release, logged in ``hand_d``). A prefill release is a handoff event (in ``heap`` as -1 - q) that picks the
    decode instance then and starts the transfer when that instance's scheduler next runs (``pull_at``: its next
    step's start, or the handoff itself when it is idle); with the decode instances' prefix caches (``pcs_d``, or
    None) it looks up the blocks of the prompt the instance holds (``dec_hit``, tokens) and moves the rest
    (``xfer`` less ``s_tok`` seconds per cached token; ``xfer`` is updated to what moved).

    Events in time order: whichever instance's next step starts first runs its steps up to the earliest time
    anything could reach it (one step with clients or sessions), once every arrival and every transfer end due by
    then has been delivered (transfers first at a tie, then arrivals). A prefill instance's releases start transfers (``heap``, by when they end); a
    decode instance's release starts its client's think time. A release comes at the end of a step, so every
    arrival or transfer it causes is known before any instance steps past it."""
    n = inp_p.arrival.shape[0]
    if sp_d is not None:
        np.random.seed(sp_d.seed)  # one generator for the decode instances: sampled acceptance repeats for a seed
    n_p, n_d = n_steps_p.shape[0], n_steps_d.shape[0]
    runs_p = [eng.new_run_nb(inp_p, knobs_p, cost_p, False)]
    for _ in range(1, n_p):  # (not a comprehension: numba's copies the arrays of the tuples it holds)
        runs_p.append(eng.new_run_nb(inp_p, knobs_p, cost_p, False))
    runs_d = [eng.new_run_nb(inp_d, knobs_d, cost_d, False)]
    for _ in range(1, n_d):
        runs_d.append(eng.new_run_nb(inp_d, knobs_d, cost_d, False))
    view_p = np.zeros((n_p, NUM_V))
    view_d = np.zeros((n_d, NUM_V))
    cnt = np.zeros(NUM_B, np.int64)  # cnt[B_LATER]: transfers under way, in the heap by arrival at a decode instance
    cnt_l = np.zeros(NUM_B, np.int64)  # cnt_l[B_LATER]: clients' next requests whose send time is known (lat)
    blocked = np.full(n_p, -np.inf)  # a prefill instance whose prompts wait for held blocks: until the next frees
    seen, seen_d = 0, 0  # handoff log entries read (prefill, decode)
    waiting = np.empty(n, np.int64)  # requests in a decode instance's queue, not taken in yet (their prefill holds)
    n_wait = 0
    rr_p, rr_d = 0, 0
    a = 0  # the next request in index order that is not a later turn
    while True:
        while a < n and inp_p.after[a] >= 0:
            a += 1
        t_a = inp_p.arrival[a] if a < n else np.inf
        turn = False
        if lat is not None:
            if cnt_l[B_LATER] > 0 and lat.t[0] <= t_a:
                t_a = lat.t[0]
                turn = True
        t_x = heap.t[0] if cnt[B_LATER] > 0 else np.inf
        s, role, k = np.inf, -1, -1
        s_p = np.inf  # the prefill instances' earliest next step
        for i in range(n_p):
            ts = _next_start_nb(runs_p[i])
            if blocked[i] > ts:
                ts = blocked[i]
            if ts < s_p:
                s_p = ts
            if ts < s:
                s, role, k = ts, 0, i
        for i in range(n_d):
            ts = _next_start_nb(runs_d[i])
            if ts < s:
                s, role, k = ts, 1, i
        if t_x <= t_a and t_x <= s and t_x < np.inf:
            # a handoff (the decode instance with the most free KV takes the request: views read now, nothing
            # steps; its transfer is due) or a transfer's end (the request joins that instance's queue)
            td, q = heap.t[0], heap.r[0]
            later_pop_nb(heap, cnt)
            picked = q >= 0  # a transfer's end: its instance was picked at the handoff, only it must be at td
            lo, hi = (dec_rep[q], dec_rep[q] + 1) if picked else (0, n_d)
            for i in range(lo, hi):
                status = eng.advance_nb(inp_d, knobs_d, cost_d, _out_of(out_d, i), _pc_of(pcs_d, i), None,
                                        _spec_of(sp_d, i), runs_d[i], td, view_d[i], hand_d)
                if status != OK:
                    return status, 1, i
            i = lo
            if not picked:
                i = _least_nb(view_d, V_KV, rr_d, n_d)
                rr_d = rr_d + 1 if rr_d + 1 < n_d else 0
            if q < 0:  # the handoff: what this instance's cache holds of the prompt does not move
                q = -1 - q
                dec_rep[q] = i
                if pcs_d is not None:
                    m, _ = pc_lookup_nb(q, (inp_d.prompt[q] - 1) // KV_BLOCK_TOKENS, inp_d, _pc_of(pcs_d, i))
                    dec_hit[q] = m * KV_BLOCK_TOKENS
                    xfer[q] -= dec_hit[q] * s_tok
                # the pull starts when its scheduler next runs: the instance's next step (it is past td), or now
                start = _next_start_nb(runs_d[i])
                pull_at[q] = start if start < np.inf and start > td else td
                later_push_nb(heap, cnt, pull_at[q] + xfer[q], q)
                continue
            dec_arr[q] = td
            out_d.req_f[q, R_ARRIVAL] = td
            join_nb(runs_d[i], out_d, view_d, inp_d, i, q, td)
            waiting[n_wait] = q
            n_wait += 1
            continue
        if t_a <= s and t_a < np.inf:
            # a request is sent: to the prefill instance with the fewest outstanding requests
            if turn:
                r = lat.r[0]
                later_pop_nb(lat, cnt_l)
                out_p.req_f[r, R_ARRIVAL] = t_a
            else:
                r = a
                a += 1
            for i in range(n_p):
                hand.i[0] = i
                status = eng.advance_nb(inp_p, knobs_p, cost_p, _out_of(out_p, i), _pc_of(pcs_p, i), None,
                                        _spec_of(sp_p, i), runs_p[i], t_a, view_p[i], hand)
                if status != OK:
                    return status, 0, i
            i = _least_nb(view_p, V_OUTSTANDING, rr_p, n_p)
            rr_p = rr_p + 1 if rr_p + 1 < n_p else 0
            pre_rep[r] = i
            blocked[i] = -np.inf
            join_nb(runs_p[i], out_p, view_p, inp_p, i, r, t_a)
            continue
        if s == np.inf:
            break
        # the instance whose next step starts first runs every step that starts before anything could reach it: a
        # decode instance until the next transfer ends (or one a prefill release starts: not before the prefill
        # instances' next steps, or the next arrival's, start); a prefill instance one step (a decode instance
        # taking one of its requests in frees its blocks at a time not known before). With clients (``lat``) any
        # release can lead back to any instance (a decode release sends the next request): one step at a time
        t_stop = np.nextafter(s, np.inf)
        if lat is None and role == 1:
            t_stop = min(t_x, t_a, s_p)
            if t_stop <= s:
                t_stop = np.nextafter(s, np.inf)
        if role == 0:
            run = runs_p[k]
            before = run.c[C_STEP]
            hand.i[0] = k
            status = eng.advance_nb(inp_p, knobs_p, cost_p, _out_of(out_p, k), _pc_of(pcs_p, k), None,
                                    _spec_of(sp_p, k), run, t_stop, view_p[k], hand)
            n_steps_p[k] = run.c[C_STEP]
            if status != OK:
                return status, 0, k
            blocked[k] = -np.inf
            if run.c[C_STEP] == before and run.t[0] < t_stop:
                # no step could start: its prompts wait for blocks it holds for requests no decode instance has
                # taken in yet (until the next hold end it knows of, or the next one a decode admission tells)
                blocked[k] = hand.ht[k, 0] if hand.hn[k] > 0 else np.inf
            while seen < hand.n[0]:  # every request: its tokens come from decode
                later_push_nb(heap, cnt, hand.t[seen], -1 - hand.r[seen])
                seen += 1
        else:
            run = runs_d[k]
            before = run.c[C_STEP]
            status = eng.advance_nb(inp_d, knobs_d, cost_d, _out_of(out_d, k), _pc_of(pcs_d, k), None,
                                    _spec_of(sp_d, k), run, t_stop, view_d[k], hand_d)
            n_steps_d[k] = run.c[C_STEP]
            if status != OK:
                return status, 1, k
            if run.c[C_STEP] == before and run.t[0] < t_stop:
                return DEADLOCK, 1, k
            # requests it took in: their prefill instances give their blocks back then
            kept = 0
            for j in range(n_wait):
                q = waiting[j]
                if out_d.req_f[q, R_FIRST_SCHED] >= 0:
                    row, tb = pre_rep[q], out_d.req_f[q, R_FIRST_SCHED]
                    heap_push_nb(hand.ht[row], hand.hr[row], hand.hn, row, tb, q)
                    if blocked[row] > tb:
                        blocked[row] = tb
                else:
                    waiting[kept] = q
                    kept += 1
            n_wait = kept
            while seen_d < hand_d.n[0]:
                if lat is not None:  # the client sends its next request a think time after this one's last token
                    nx = lat.nxt[hand_d.r[seen_d]]
                    if nx >= 0:
                        later_push_nb(lat, cnt_l, hand_d.t[seen_d] + inp_p.think[nx], nx)
                seen_d += 1
    released = 0
    for i in range(n_d):
        released += runs_d[i].c[C_RELEASED]
    if released != n:
        return DEADLOCK, 1, -1
    return OK, 0, -1


# --------------------------------------------------------------------------- the Python side


def check_requests(reqs, dis: Disagg, dep: Deployment, policy) -> None:
    """Clear errors before the run: every prompt fits a prefill instance and (without chunked prefill)
    the token budget, every request a decode instance."""
    beside = " beside the speculative proposer" if policy.spec_decode in DRAFTING_METHODS else ""
    for role, need, what in (("prefill", reqs.prompt_tokens + 1, "prompt + first token"),
                             ("decode", reqs.prompt_tokens + reqs.output_tokens, "prompt + output")):
        d = dis.deployment(dep, role)
        have = dis.kv_blocks(dep, role, policy)
        blocks = -(-need // KV_BLOCK_TOKENS)
        worst = int(np.argmax(blocks))
        if blocks[worst] > have:
            raise ValueError(f"request {worst} needs {int(need[worst]):,} tokens of KV cache ({what}) but a {role} "
                             f"instance (TP {d.node.tp}) holds {have * KV_BLOCK_TOKENS:,}{beside}; use a larger TP "
                             "for it or shorter requests")
    if not policy.chunked_prefill and int(reqs.prompt_tokens.max()) > policy.max_num_batched_tokens:
        raise ValueError(f"max_num_batched_tokens={policy.max_num_batched_tokens} is below the longest prompt "
                         f"({int(reqs.prompt_tokens.max()):,} tokens) without chunked prefill; raise it or turn "
                         "chunked prefill on")


def _stacked_spec(spec, n: int, instances: int, room: int):
    """``spec`` with fresh per-request arrays and step tables for ``instances`` instances (None stays None)."""
    if spec is None:
        return None
    return spec._replace(emit=np.ones(n, np.int64), req_acc=np.zeros(n, np.int64),
                         steps_i=np.empty((instances, room, NUM_SPI), np.int64),
                         steps_f=np.empty((instances, room, NUM_SPF)))


def run_disagg(reqs, dep: Deployment, dis: Disagg, policy, allreduce: str, seed: int = 0,
               engine=None) -> dict:
    """Run ``reqs`` through the split. Returns the two roles' outputs and per-request arrays: ``prefill`` and
    ``decode`` ((Outputs, steps per instance, cost model)), ``pre_rep``, ``dec_rep`` (-1: done at its first
    token), ``kv_transfer_s``, ``decode_arrival_s``, and with speculative decoding ``spec_prefill`` and
    ``spec_decode`` (each role's stacked Spec, or None) and ``spec_accepted`` (accepted draft tokens per request).
    ``seed``: the decode instances sample acceptance from it."""

    dis.check_policy(policy)
    dis.check_spec(policy, dep)
    check_requests(reqs, dis, dep, policy)
    n = len(reqs)
    classes = max(1, len(reqs.class_names))
    dep_p, dep_d = dis.deployment(dep, "prefill"), dis.deployment(dep, "decode")
    cm_p, cm_d = cost_model(dep_p, allreduce, engine), cost_model(dep_d, allreduce, engine)
    kv_p, kv_d = dis.kv_blocks(dep, "prefill", policy), dis.kv_blocks(dep, "decode", policy)
    # the decode instances speculate as a replica of their deployment would; the prefill instances run only the
    # proposer's pass over the prompt (none for n-gram lookup, which has no GPU pass)
    spec_d = spec_for(policy, dep_d, cm_d, seed, allreduce)
    spec_p = spec_for(policy, dep_p, cm_p, seed, allreduce) if policy.spec_decode in DRAFTING_METHODS else None

    def swap(d: Deployment) -> int:
        return int(policy.swap_space_gib * GIB // d.kv_bytes_per_token_per_gpu)

    chains = policy.prefix_caching and reqs.block_off is not None
    ones = np.ones(n, np.int64)
    # the prefill side: the prompt, and one token out (the first, sent with the KV)
    inp_p = eng.inputs(reqs.arrival_s, reqs.prompt_tokens, ones, reqs.priority,
                       chain_off=reqs.block_off if chains else None, chain_ids=reqs.block_ids if chains else None,
                       chain_len=reqs.chain_lengths() if chains else None, chain_shift=reqs.block_shift,
                       after=reqs.after, think_s=reqs.think_s)
    knobs_p, cost_p = policy.knobs(classes, kv_p, swap(dep_p), mode="continuous"), eng.kernel_cost(cm_p)
    # the decode side: the prompt, all but its last token's KV transferred (computed again to sample the first
    # token, as vLLM's decode instance does), and every output token
    # and every output token; with prefix caching its own cache (vLLM's decode instance looks its prompt up before
    # it pulls: NixlConnector's get_num_new_matched_tokens asks for the tokens past its local hits)
    inp_d = eng.inputs(reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens, reqs.priority,
                       chain_off=reqs.block_off if chains else None, chain_ids=reqs.block_ids if chains else None,
                       chain_len=reqs.chain_lengths() if chains else None, chain_shift=reqs.block_shift,
                       ready=reqs.prompt_tokens - 1)
    knobs_d = policy.knobs(classes, kv_d, swap(dep_d), mode="continuous", chunked=True)
    cost_d = eng.kernel_cost(cm_d)
    xfer = dis.transfer_s(dep, reqs.prompt_tokens, policy)
    s_tok = dis.kv_bytes_per_gpu_token(dep, policy) / dis.link_per_gpu_Bps(dep)  # seconds per token moved
    engines = dis.prefill_instances + dis.decode_instances
    cap = max(1, eng.MAX_STEPS // engines)  # the stacked step tables hold MAX_STEPS rows in all
    room = eng.room_for(inp_d, policy.max_num_batched_tokens, None, max(dis.prefill_instances, dis.decode_instances),
                        cap)
    while True:
        out_p = stacked_outputs(n, dis.prefill_instances, room, classes, inp_p.arrival)
        out_d = stacked_outputs(n, dis.decode_instances, room, classes, inp_d.arrival)
        # (the block pool over shared chains only, as in a fleet: fleet.run_fleet says why)
        pcs = stacked_prefix(dis.prefill_instances, inp_p, kv_p) if chains else None
        pcs_d = stacked_prefix(dis.decode_instances, inp_d, kv_d) if chains else None
        xfer_c = np.array(xfer, np.float64)  # less what each decode instance held, once the run has looked
        dec_hit = np.zeros(n, np.int64)
        pull_at = np.full(n, np.nan)  # when each transfer starts (its decode instance's next step after the handoff)
        # a prefill instance holds a request's KV until a decode instance takes it in: at most one held request
        # per block (each holds one of its own at least) without the prefix cache, whose shared blocks lift that
        # bound
        p = dis.prefill_instances
        held = n if chains else min(n, kv_p)
        hand = Handoff(np.empty(n, np.int64), np.empty(n), np.zeros(1, np.int64), np.empty((p, held)),
                       np.empty((p, held), np.int64), np.zeros(p, np.int64), np.zeros(1, np.int64))
        d = dis.decode_instances  # the decode instances' releases: logged, their blocks freed at once
        hand_d = Handoff(np.empty(n, np.int64), np.empty(n), np.zeros(1, np.int64), np.empty((d, 0)),
                         np.empty((d, 0), np.int64), np.zeros(d, np.int64), np.zeros(1, np.int64))
        lat = eng.new_later(inp_p.after)  # closed-loop clients or sessions: each next request's send time
        heap = Later(np.empty(n), np.empty(n, np.int64), np.empty(0, np.int64))
        dec_rep = np.full(n, -1, np.int64)
        dec_arr = np.full(n, np.nan)
        pre_rep = np.full(n, -1, np.int64)
        steps_p = np.zeros(dis.prefill_instances, np.int64)
        steps_d = np.zeros(dis.decode_instances, np.int64)
        sp_p = _stacked_spec(spec_p, n, dis.prefill_instances, room)
        sp_d = _stacked_spec(spec_d, n, dis.decode_instances, room)
        args = (inp_p, knobs_p, cost_p, out_p, pcs, sp_p, inp_d, knobs_d, cost_d, out_d, pcs_d, sp_d,
                xfer_c, s_tok, hand, hand_d, heap, lat, dec_rep, dec_arr, dec_hit, pull_at, pre_rep, steps_p, steps_d)
        with first_use.first_use(first_use.variant("disagg", args, pcs, lat, sp_d)):
            status, role, bad = run_disagg_nb(*args)
        if status == OUT_OF_STEPS:
            room = eng.grow_room(room, inp_d, cap, f"its {engines} instances")
            continue
        if status == DEADLOCK:
            raise RuntimeError(f"the engine could not schedule any work on {('prefill', 'decode')[role]} instance "
                               f"{bad} (deadlock)")
        break
    return {"prefill": (out_p, steps_p, cm_p), "decode": (out_d, steps_d, cm_d), "pre_rep": pre_rep,
            "dec_rep": dec_rep, "kv_transfer_s": xfer_c, "decode_cached_tokens": dec_hit,
            "decode_arrival_s": dec_arr, "pull_at": pull_at, "spec_prefill": sp_p,
            "spec_decode": sp_d, "spec_accepted": None if sp_d is None else sp_d.req_acc}


def frames(reqs, dep: Deployment, dis: Disagg, policy, allreduce: str, seed: int = 0, engine=None):
    """(requests, steps, itl_hist) of a disaggregated run, as simulate.SimResult holds them: a request's first
    scheduling is its prefill instance's, its tokens (first token, finish, release, gaps) its decode instance's; the
    steps of prefill instances are replicas 0..P-1 and of decode instances P..P+D-1, with a ``role`` column. With
    speculative decoding, ``spec_accepted_tokens`` per request (its decode instance's) and the spec step columns
    (frames.steps_frame) on every role's steps that carry a Spec."""
    res = run_disagg(reqs, dep, dis, policy, allreduce, seed, engine)
    out_p, steps_p, cm_p = res["prefill"]
    out_d, steps_d, cm_d = res["decode"]
    fp, fd = out_p.req_f, out_d.req_f
    n = len(reqs)
    hist = out_d.hist  # (a prefill instance produces one token per request: no gaps)
    names = np.asarray(reqs.class_names, dtype=object)
    requests = pd.DataFrame({
        "request_id": np.arange(n),
        "arrival_s": fp[:, R_ARRIVAL],  # when the client sent it (a closed-loop client's: once its last one ended)
        "prompt_tokens": reqs.prompt_tokens,
        "output_tokens": reqs.output_tokens,
        "priority": reqs.priority,
        "class_name": names[reqs.priority],
        "replica": res["pre_rep"],  # its prefill instance
        "node": 0,
        "first_scheduled_s": fp[:, R_FIRST_SCHED],
        "first_token_s": fd[:, R_FIRST_TOKEN],  # from the decode instance: what the client sees
        "finish_s": fd[:, R_FINISH],
        "release_s": fd[:, R_RELEASE],
        "max_itl_s": fd[:, R_MAX_ITL],
        "preemptions": out_p.req_pre + out_d.req_pre,
        "cached_prompt_tokens": out_p.req_cached,
        "prefill_done_s": fp[:, R_FIRST_TOKEN],  # the prefill instance's one token: the KV is ready to move
        "decode_replica": dis.prefill_instances + res["dec_rep"],  # its decode instance
        # from the prefill's release to the decode instance starting the pull (its next step's start)
        "kv_pull_wait_s": res["pull_at"] - fp[:, R_RELEASE],
        "kv_transfer_s": res["kv_transfer_s"],  # prompt KV from the prefill to the decode instance
        "decode_cached_tokens": res["decode_cached_tokens"],  # its prompt's tokens the decode instance held: not moved
        "decode_arrival_s": res["decode_arrival_s"],  # transfer done: joins the decode instance's queue
        "decode_queue_s": fd[:, R_FIRST_SCHED] - res["decode_arrival_s"],  # waiting for KV room
    })
    if res["spec_accepted"] is not None:
        requests["spec_accepted_tokens"] = res["spec_accepted"]  # accepted draft tokens on its decode instance
    parts = []
    for base, (out, counts, cm, role, sp) in ((0, (out_p, steps_p, cm_p, "prefill", res["spec_prefill"])),
                                             (dis.prefill_instances,
                                              (out_d, steps_d, cm_d, "decode", res["spec_decode"]))):
        for i, k in enumerate(counts):
            one = eng.EngineOutput(out.req_f, out.req_pre, out.req_cached, out.steps_i[i, :k], out.steps_f[i, :k],
                                   out.hist, None if sp is None else sp.req_acc,
                                   None if sp is None else sp.steps_i[i, :k], None if sp is None else sp.steps_f[i, :k])
            f = steps_frame(one, base + i, cm)
            f.insert(1, "role", role)
            parts.append(f)
    steps = pd.concat(parts, ignore_index=True)
    if "draft_s" in steps:  # a role without a Spec (n-gram lookup on the prefill side) drafts nothing
        steps[["spec_seqs", "spec_proposed", "spec_accepted"]] = (
            steps[["spec_seqs", "spec_proposed", "spec_accepted"]].fillna(0).astype(np.int64))
        steps["draft_s"] = steps["draft_s"].fillna(0.0)
    return request_latencies(requests), steps, hist


SHARE_KEYS = ("busy", "gpu_util", "sol_util", "mfu", "mbu", "kv_util")


def summary_parts(res, dis: Disagg) -> dict:
    """The node figures of a disaggregated run: each role's (metrics.node_summary over its instances, its KV
    capacity), combined weighted by GPUs for the shares; the transfer and decode-queue percentiles."""
    dep = res.scenario.deployment
    req, steps = res.requests, res.steps
    wall = wall_time(req)
    s: dict = {}
    parts = []
    policy = res.scenario.policy
    for role, count, tp in (("prefill", dis.prefill_instances, dis.prefill_tp),
                            ("decode", dis.decode_instances, dis.decode_tp)):
        d = dis.deployment(dep, role)
        ns = node_summary(steps[steps["role"] == role], wall, count, policy.batch_cap,
                          d.node.gpu.peak_flops(d.precision), d.node.gpu.hbm_bw_Bps, dis.kv_blocks(dep, role, policy))
        parts.append((ns, count * tp))
        s[f"{role}_busy"] = ns["busy"]
    gpus = sum(w for _, w in parts)
    for k in SHARE_KEYS:
        s[k] = sum(ns[k] * w for ns, w in parts) / gpus
    dec = parts[1][0]
    s.update(num_steps=parts[0][0]["num_steps"] + dec["num_steps"], batch_efficiency=dec["batch_efficiency"],
             mean_running=dec["mean_running"], batch_cap=dec["batch_cap"], max_kv_blocks=dec["max_kv_blocks"])
    s["kv_capacity_tokens"] = dis.kv_blocks(dep, "decode", policy) * KV_BLOCK_TOKENS
    if policy.spec_decode != "off":  # the decode instances speculate: their steps give the figures
        s.update(spec_summary(steps[steps["role"] == "decode"]))
        pre = steps[steps["role"] == "prefill"]
        dur = float(pre["duration_s"].sum())
        # the proposer's pass over the prompts on the prefill instances, as a share of their forward passes
        s["prefill_draft_time_share"] = float(pre["draft_s"].sum()) / dur if dur > 0 else float("nan")
    s["decode_cached_tokens"] = int(req["decode_cached_tokens"].sum())  # prompt tokens not moved: held there
    for q in (50, 99):
        s[f"kv_pull_wait_p{q}_s"] = percentile(req["kv_pull_wait_s"].dropna(), q)
        s[f"kv_transfer_p{q}_s"] = percentile(req["kv_transfer_s"].dropna(), q)
        s[f"decode_queue_p{q}_s"] = percentile(req["decode_queue_s"].dropna(), q)
    offered, grow_p = queue_growth(req)
    d = req[req["decode_replica"] >= 0]
    # the decode side's queue: requests whose KV has arrived and that wait for room on their decode instance
    grow_d = queue_growth(d.assign(arrival_s=d["decode_arrival_s"],
                                   first_scheduled_s=d["decode_arrival_s"] + d["decode_queue_s"]))[1]
    s["offered_req_s"] = offered
    s["queue_growth_req_s"] = max(grow_p, grow_d) if not np.isnan(grow_d) else grow_p  # either queue growing
    s["disaggregated"] = dis.describe()
    s["gpus"] = dis.gpus
    # per instance: prefill instances count the requests they prefilled, decode instances those they decoded
    both = pd.concat([req, d.assign(replica=d["decode_replica"])], ignore_index=True)
    count = dis.prefill_instances + dis.decode_instances
    by = replica_summary(both, steps, wall, count, count)
    for k, v in by.items():
        v["role"] = "prefill" if int(k) < dis.prefill_instances else "decode"
    s["by_replica"] = by
    return s
