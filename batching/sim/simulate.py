"""Scenario -> SimResult: run the engine on a scenario's requests and tabulate the outcome."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd

from batching.sim.engine import kernel as eng
from batching.sim.hardware.costmodel import CostModel, cost_model
from batching.sim.hardware.engines import EngineProfile, engine_profile
from batching.sim.hardware.kernel_tables import calibration_status
from batching.sim.topology import disagg as dg
from batching.sim.topology.fleet import check_fleet, run_fleet
from batching.sim.topology import sizing
from batching.sim.frames import StepsTable, steps_frame
from batching.sim.metrics import (latency_summary, node_summary, queue_growth, replica_summary, request_latencies,
                                  spec_summary, split_steady_capacity, steady_rate, summary_columns, wall_time)
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.engine.speculative import check_spec, spec_for, spec_kv_blocks
from batching.sim.hardware.specs import GIB, KV_BLOCK_TOKENS, Deployment, Model
from batching.sim.workload.requests import MAX_NUM_REQUESTS as MAX_REQUESTS, Requests, SyntheticWorkload, TraceWorkload



@dataclass(frozen=True)
class Scenario:
    """Everything one simulation depends on; frozen, so it keys caches."""

    deployment: Deployment = field(default_factory=Deployment)
    workload: SyntheticWorkload | TraceWorkload = field(default_factory=SyntheticWorkload)
    policy: BatchingPolicy = field(default_factory=lambda: PRESETS["continuous"])
    allreduce: str | None = None  # None: the engine profile's default all-reduce
    nodes: int = 1  # identical nodes, each with deployment.node.replicas replicas (num_gpus / tp)
    router: str = "round-robin"  # how a request picks its replica (fleet.ROUTERS)
    disagg: dg.Disagg | None = None  # prefill/decode disaggregation: the GPUs split into prefill and decode instances
    engine: str | EngineProfile = "vllm"  # a name in engines.ENGINES or a profile (a loaded --profile FILE)

    def __post_init__(self) -> None:
        if self.allreduce is None:  # the engine's own all-reduce (an unknown engine is refused by validate)
            try:
                object.__setattr__(self, "allreduce", engine_profile(self.engine).allreduce)
            except ValueError:
                object.__setattr__(self, "allreduce", "vllm_graph")
        # a policy whose step budget follows the context (the continuous preset, as vLLM V0 sizes it) gets this
        # deployment's: max(max_model_len, 2048); every reader of scenario.policy sees the budget that runs
        pol, model = self.policy, getattr(self.deployment, "model", None)
        if isinstance(pol, BatchingPolicy) and model is not None:
            object.__setattr__(self, "policy", pol.sized_for(getattr(model, "max_context_tokens", 0)))

    @property
    def profile(self) -> EngineProfile:
        """The engine profile this scenario runs with."""
        return engine_profile(self.engine)

    @property
    def replicas(self) -> int:
        """Replicas in the fleet: nodes x replicas per node."""
        return self.nodes * self.deployment.node.replicas

    def validate(self) -> None:
        self.deployment.validate()
        self.workload.validate()
        self.policy.validate()
        self.profile.validate()  # an unknown engine name is a ValueError naming the allowed ones
        cost_model(self.deployment, self.allreduce, self.profile)  # checks the all-reduce choice
        check_fleet(self.nodes, self.router, self.policy.mode)
        if self.disagg is not None:
            self.disagg.validate(self.deployment, self.nodes)
            self.disagg.check_policy(self.policy, self.router)
            self.disagg.check_spec(self.policy, self.deployment)  # each role's deployment, as below
        else:
            check_spec(self.policy, self.deployment)  # MTP without MTP modules, a draft of another family...

    def requests(self) -> tuple[Requests, np.ndarray]:
        """The workload's requests the model serves, and how many of each class it rejects (``admitted``)."""
        return admitted(self.workload.generate(), self.deployment.model)

    def with_policy(self, policy: BatchingPolicy) -> "Scenario":
        """The scenario with another policy. A request-level policy (static, dynamic) in a fleet behind a router that
        reads replica state runs round-robin instead (those routers are built for the continuous modes), so studies
        that compare every policy run them all; the summary's ``router`` says which router ran."""
        router = self.router if policy.mode == "continuous" else "round-robin"
        return replace(self, policy=policy, router=router)

    def with_workload(self, workload) -> "Scenario":
        return replace(self, workload=workload)

    def with_deployment(self, deployment: Deployment) -> "Scenario":
        return replace(self, deployment=deployment)

    def with_engine(self, engine: "str | EngineProfile", allreduce: str | None = None) -> "Scenario":
        """The scenario run by another engine (a name or a profile), with that engine's all-reduce unless
        ``allreduce`` is given (a plain ``replace`` would keep the all-reduce the first engine resolved)."""
        return replace(self, engine=engine, allreduce=allreduce)


@dataclass(frozen=True, eq=False)
class SimResult:
    scenario: Scenario
    requests: pd.DataFrame  # one row per request, latencies included
    steps: pd.DataFrame | None  # one row per forward pass (per replica); None: not built (simulate(steps=False))
    itl_hist: np.ndarray  # (classes, bins) counts of inter-token gaps
    itl_edges: np.ndarray  # bin edges, seconds
    class_names: tuple[str, ...]
    saturated: bool = False
    rejected: tuple[int, ...] = ()  # per class: requests beyond the model's context, rejected and not simulated

    @cached_property
    def _summary(self) -> dict:
        return summarize(self)

    def summary(self) -> dict:
        """Flat dict of the metrics (docs/ARCHITECTURE.md "Metrics"), with ``by_priority`` per class."""
        s = dict(self._summary)
        s["by_priority"] = {k: dict(v) for k, v in s["by_priority"].items()}
        return s


def summarize(res: SimResult) -> dict:
    sc = res.scenario
    dep = sc.deployment
    req = res.requests
    wall = wall_time(req)
    cols = summary_columns(req)
    s = latency_summary(cols, res.itl_hist.sum(axis=0), res.itl_edges, wall)
    out_tok = req["output_tokens"].to_numpy()
    s["steady_output_tok_s"] = steady_rate(req, out_tok)
    s["duration_s"] = wall
    s["engine"], s["engine_label"] = sc.profile.name, sc.profile.label
    rejected = tuple(res.rejected) + (0,) * (len(res.class_names) - len(res.rejected))
    s["rejected_requests"] = int(sum(rejected))
    s["max_context_tokens"] = dep.model.max_context_tokens
    if sc.disagg is not None:
        s.update(dg.summary_parts(res, sc.disagg))
        if res.saturated and res.steps is not None:  # its capacity: the steady state, not N / (fill + drain)
            s.update(split_steady_capacity(req, res.steps))
    else:
        kv_blocks = spec_kv_blocks(sc.policy, dep)
        if res.steps is not None:  # without the step table: no node figures (busy, gpu_util, ...)
            s.update(node_summary(res.steps, wall, sc.replicas, sc.policy.batch_cap,
                                  dep.node.gpu.peak_flops(dep.precision), dep.node.gpu.hbm_bw_Bps, kv_blocks))
            if sc.policy.spec_decode != "off":
                s.update(spec_summary(res.steps))
        s["kv_capacity_tokens"] = kv_blocks * KV_BLOCK_TOKENS
        s["offered_req_s"], s["queue_growth_req_s"] = queue_growth(req)
    if getattr(sc.workload, "concurrency", None) is not None and not res.saturated:  # closed-loop clients
        s["concurrency"], s["think_time_s"] = int(sc.workload.concurrency), float(sc.workload.think_time_s)
    by = {}
    priority = req["priority"].to_numpy()
    for level, name in enumerate(res.class_names):
        mine = priority == level
        if not mine.any():
            continue
        cls = latency_summary({c: v[mine] for c, v in cols.items()}, res.itl_hist[level], res.itl_edges, wall)
        cls["steady_output_tok_s"] = steady_rate(req, out_tok, mine)
        cls["class_name"] = name
        cls["rejected_requests"] = int(rejected[level])
        by[str(level)] = cls
    s["by_priority"] = by
    s["nodes"], s["replicas"], s["router"] = sc.nodes, sc.replicas, sc.router
    if dep.node.cross_node and sc.disagg is None:  # a "node" here is one replica over two 8-GPU servers
        s["physical_nodes"] = sc.nodes * dep.node.physical_nodes
    s["calibrated"], s["calibration_note"] = calibration_status(sc)
    if sc.disagg is not None:
        s["replicas"] = sc.disagg.prefill_instances + sc.disagg.decode_instances
        s["router"] = "disaggregated (prefill: least-outstanding, decode: most free KV)"
    elif sc.replicas > 1 and res.steps is not None:
        s["by_replica"] = replica_summary(req, res.steps, wall, sc.replicas, dep.node.replicas)
    return s


@dataclass(frozen=True)
class ClientTimes:
    """What the client sees beyond the engine (DESIGN §4, ttft): a request reaches the engine's queue ``t_in`` after
    it is sent (HTTP + tokenisation, engines.EngineProfile.client_in_s) and each token reaches the client ``t_out``
    after it is computed (detokenise + stream out; the per-layer dispatch before the first token). The front end
    tokenises in arrival order, so a request never reaches the queue before an earlier one. A closed-loop client's
    or a session's next request is sent when the previous answer has reached the client, plus its think time."""

    t_in: np.ndarray  # seconds per request
    t_out: float

    @classmethod
    def of(cls, reqs: Requests, prof: EngineProfile, num_layers: int) -> "ClientTimes | None":
        t_in = np.asarray(prof.client_in_s(reqs.prompt_tokens.astype(np.float64)), np.float64)
        t_out = float(prof.client_out_s(num_layers))
        if t_out == 0.0 and not np.any(t_in):
            return None
        return cls(np.broadcast_to(t_in, reqs.prompt_tokens.shape).copy(), t_out)

    def engine_requests(self, reqs: Requests) -> Requests:
        """The requests as the engine's queue receives them."""
        arrival = np.maximum.accumulate(reqs.arrival_s + self.t_in)
        if reqs.after is None:
            return replace(reqs, arrival_s=arrival)
        succ = reqs.after >= 0
        think = np.where(succ, reqs.think_s + self.t_out + self.t_in, reqs.think_s)
        return replace(reqs, arrival_s=arrival, think_s=think)

    SEEN = ("arrival_s", "first_token_s", "finish_s", "release_s")  # the times the client sees differently

    def seen(self, times: dict[str, np.ndarray], sent: Requests) -> dict[str, np.ndarray]:
        """The engine's per-request ``SEEN`` times (arrays by name) as the client sees them: sent at arrival_s,
        tokens ``t_out`` later."""
        if sent.after is not None:
            succ = sent.after >= 0
            arrival = np.where(succ, times["arrival_s"] - self.t_in, sent.arrival_s)
        else:
            arrival = sent.arrival_s
        return {"arrival_s": arrival, **{c: times[c] + self.t_out for c in self.SEEN[1:]}}

    def as_seen(self, requests: pd.DataFrame, sent: Requests) -> pd.DataFrame:
        """``seen`` on a per-request table (a new table)."""
        return requests.assign(**self.seen({c: requests[c].to_numpy() for c in self.SEEN}, sent))


def admitted(reqs: Requests, model: Model) -> tuple[Requests, np.ndarray]:
    """(the requests ``model`` serves, the rejected count per class). A request whose prompt plus output exceeds the
    model's context (``max_context_tokens``; 0 = no limit) is rejected as vLLM's OpenAI server rejects it ("This
    model's maximum context length is ..."; vllm/entrypoints/openai/serving_engine.py, _validate_input: prompt +
    max_tokens > max_model_len) while it serves the rest; a session's turn after a rejected one is rejected too (its
    prompt holds the rejected turn). Every request rejected is a ValueError naming the context."""
    k = max(1, len(reqs.class_names))
    limit = model.max_context_tokens
    if limit <= 0 or len(reqs) == 0:
        return reqs, np.zeros(k, np.int64)
    over = (reqs.prompt_tokens + reqs.output_tokens) > limit
    if not over.any():
        return reqs, np.zeros(k, np.int64)
    if reqs.after is not None and reqs.clients:  # a closed-loop client sends its next request when one is refused
        after = reqs.after.copy()
        for r in np.flatnonzero(after >= 0):  # after[r] < r: its predecessor is relinked already
            if over[after[r]]:
                after[r] = after[after[r]]
        reqs = replace(reqs, after=after, think_s=np.where(after >= 0, reqs.think_s, 0.0))
    elif reqs.after is not None:
        for r in np.flatnonzero(reqs.after >= 0):  # after[r] < r: its predecessor is decided already
            over[r] |= over[reqs.after[r]]
    if over.all():
        n = len(reqs)
        longest = int((reqs.prompt_tokens + reqs.output_tokens).max())
        who = "the request needs" if n == 1 else f"all {n:,} requests need"
        raise ValueError(f"{who} more than {model.name}'s context of {limit:,} tokens (prompt + output, up to "
                         f"{longest:,}), and an engine rejects such requests; use shorter requests or a model with a "
                         "longer context")
    return reqs.subset(~over), np.bincount(reqs.priority[over], minlength=k).astype(np.int64)


def rejected_line(summary: dict) -> str:
    """"2 requests rejected: prompt + output over Qwen2.5-72B's context of 32,768 tokens" (or "")."""
    n = int(summary.get("rejected_requests", 0))
    if not n:
        return ""
    return (f"{n:,} request{'s' if n != 1 else ''} rejected (not simulated): prompt + output over the model's context "
            f"of {int(summary['max_context_tokens']):,} tokens, as vLLM rejects them")


def _check_fits(reqs: Requests, policy: BatchingPolicy, dep: Deployment, kv_blocks: int) -> None:
    need = -(-(reqs.prompt_tokens + reqs.output_tokens) // KV_BLOCK_TOKENS)
    worst = int(np.argmax(need))
    if need[worst] > kv_blocks:
        tokens = int(reqs.prompt_tokens[worst] + reqs.output_tokens[worst])
        top = spec_kv_blocks(policy, replace(dep, kv_cache_tokens=None)) * KV_BLOCK_TOKENS  # what memory holds
        beside = " beside the speculative proposer" if policy.spec_decode not in ("off", "ngram") else ""
        if tokens <= top:  # the user's kv_cache_tokens is what keeps it out
            fix = (f"raise kv_cache_tokens to at least {need[worst] * KV_BLOCK_TOKENS:,} (this deployment holds up "
                   f"to {top:,}{beside}) or use shorter requests")
        else:
            fix = (f"{top:,} tokens is the most this deployment's memory holds{beside}, so no kv_cache_tokens "
                   "fits it; use shorter requests, an FP8 KV cache, more GPUs per replica (tp) or a GPU with more "
                   "memory")
        raise ValueError(
            f"request {worst} needs {tokens:,} tokens of KV cache (prompt {int(reqs.prompt_tokens[worst]):,} + output "
            f"{int(reqs.output_tokens[worst]):,}) but the cache holds {kv_blocks * KV_BLOCK_TOKENS:,}; {fix}"
        )
    if policy.mode == "continuous" and not policy.chunked_prefill:
        longest = int(reqs.prompt_tokens.max())
        if longest > policy.max_num_batched_tokens:
            raise ValueError(
                f"max_num_batched_tokens={policy.max_num_batched_tokens} is below the longest prompt "
                f"({longest:,} tokens); allowed {longest} to 1048576 without chunked prefill, or turn chunked prefill on"
            )


def deal_replicas(reqs: Requests, replicas: int) -> np.ndarray:
    """Each request's replica: round-robin over independent requests and sessions' first turns; a session's
    later turns follow its first (session affinity, as a sticky router keeps a conversation's KV cache)."""
    n = len(reqs)
    if reqs.after is None or replicas == 1:
        return np.arange(n) % replicas
    rep = np.empty(n, np.int64)
    first = reqs.after < 0
    rep[first] = np.arange(int(first.sum())) % replicas
    for r in np.flatnonzero(~first):  # after[r] < r, so its replica is already set
        rep[r] = rep[reqs.after[r]]
    return rep


def _chains(reqs: Requests, idx: np.ndarray):
    """The block chains of requests ``idx`` (CSR offsets from 0, ids unchanged) and their lengths in blocks, or
    (None, None, None)."""
    if reqs.block_off is None:
        return None, None, None
    if len(idx) == len(reqs):  # one replica: all of them, as they are
        return reqs.block_off, reqs.block_ids, reqs.chain_lengths()
    lo, hi = reqs.block_off[idx], reqs.block_off[idx + 1]
    lengths = hi - lo
    off = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(lengths, out=off[1:])
    take = np.repeat(lo - off[:-1], lengths) + np.arange(off[-1])
    return off, reqs.block_ids[take], reqs.chain_lengths()[idx]


def _sessions(reqs: Requests, idx: np.ndarray):
    """``after`` renumbered within requests ``idx`` (every predecessor is among them), and think times."""
    if reqs.after is None:
        return None, None
    local = np.full(len(reqs), -1, np.int64)
    local[idx] = np.arange(len(idx))
    prev = reqs.after[idx]
    return np.where(prev >= 0, local[np.maximum(prev, 0)], -1), reqs.think_s[idx]


def run_requests(reqs: Requests, dep: Deployment, policy: BatchingPolicy, cm: CostModel, seed: int = 0,
                 nodes: int = 1, router: str = "round-robin", replicas: int | None = None):
    """Run the engine on each replica of ``nodes`` nodes (or on ``replicas`` replicas); returns (replica, request
    indices, engine output) per replica. Round-robin deals the requests first (``deal_replicas``) and runs each
    replica alone, all of them within engine.MAX_STEPS steps; the other routers read the replicas' state at each
    arrival, so fleet.run_fleet runs them in one simulation. ``seed``: speculative decoding samples acceptance from
    it (replica r uses seed + r; a fleet run uses seed)."""
    replicas = nodes * dep.node.replicas if replicas is None else replicas
    if len(reqs):  # a preset's step budget as vLLM V0 sizes it on this model (BatchingPolicy.sized_for)
        policy = policy.sized_for(dep.model.max_context_tokens, int(reqs.prompt_tokens.max()))
    kv_blocks = spec_kv_blocks(policy, dep)  # the dep's, less a draft model's or head's share with speculation
    _check_fits(reqs, policy, dep, kv_blocks)
    swap_cap = int(policy.swap_space_gib * GIB // dep.kv_bytes_per_token_per_gpu)
    if router != "round-robin" and replicas > 1:
        return run_fleet(reqs, replicas, router, policy, swap_cap, kv_blocks, cm, spec_for(policy, dep, cm, seed))
    rep_of = deal_replicas(reqs, replicas)
    knobs, cost = policy.knobs(len(reqs.class_names), kv_blocks, swap_cap), eng.kernel_cost(cm)
    outs = []
    left = eng.MAX_STEPS  # summed over the replicas
    engines = f"its {replicas} replicas" if replicas > 1 else ""
    for rep in range(replicas):
        idx = np.flatnonzero(rep_of == rep)
        if len(idx) == 0:
            continue
        chain_off, chain_ids, chain_len = _chains(reqs, idx) if policy.prefix_caching else (None, None, None)
        after, think_s = _sessions(reqs, idx)
        spec = spec_for(policy, dep, cm, seed + rep)
        inp = eng.inputs(reqs.arrival_s[idx], reqs.prompt_tokens[idx], reqs.output_tokens[idx], reqs.priority[idx],
                         chain_off=chain_off, chain_ids=chain_ids, after=after, think_s=think_s,
                         chain_len=chain_len, chain_shift=reqs.block_shift)
        out = eng.run(inp, knobs, cost, prefix_caching=policy.prefix_caching, spec=spec, max_steps=left,
                      engines=engines)
        left -= len(out.steps_i)
        outs.append((rep, idx, out))
    return outs


_BEFORE_RUN = threading.local()


@contextmanager
def before_each_run(check: Callable[[], None]) -> Iterator[None]:
    """Call ``check()`` before every ``simulate`` this thread starts inside the block: a cooperative stop for long
    jobs (many runs), e.g. the dashboard's for a page that closed. Whatever ``check`` raises ends the job there; a
    run already started finishes (the kernel cannot be interrupted)."""
    outer = getattr(_BEFORE_RUN, "check", None)
    _BEFORE_RUN.check = check
    try:
        yield
    finally:
        _BEFORE_RUN.check = outer


def run_size(scenario: Scenario, reqs: Requests, measure: bool = False) -> sizing.RunSize:
    """How big the run of ``reqs`` on the scenario is before it runs (``sizing``): its engines, whether each holds
    every request, its steps summed over them (from a pilot when the bound is large, or ``measure``)."""
    dep, policy, dis = scenario.deployment, scenario.policy, scenario.disagg
    bound = sizing.step_bound(reqs.prompt_tokens, reqs.output_tokens, policy.max_num_batched_tokens)
    table = sizing.table_tokens(reqs.prompt_tokens, reqs.output_tokens, policy.max_num_batched_tokens)
    n = len(reqs)
    if dis is not None:
        def pilot_split() -> sizing.Pilot:  # the split on its first requests
            sample = reqs.subset(slice(0, min(n, 4 * sizing.PILOT_REQUESTS)))
            try:
                res = dg.run_disagg(sample, dep, dis, policy, scenario.allreduce, scenario.profile)
            except eng.TooManySteps:
                return sizing.Pilot(eng.MAX_STEPS + 1, 0, len(sample), 1)
            starts = [out.steps_f[i, :k, eng.F_START] for out, counts, _ in (res["prefill"], res["decode"])
                      for i, k in enumerate(counts)]
            done = np.maximum(res["prefill"][0].req_f[:, eng.R_FINISH], res["decode"][0].req_f[:, eng.R_FINISH])
            return _pilot(np.concatenate(starts), res["prefill"][0].req_f[:, eng.R_ARRIVAL], done, 1)

        return sizing.estimate(n, dis.prefill_instances + dis.decode_instances, True, bound, pilot_split, measure,
                               table)
    replicas = scenario.replicas

    def pilot_replica() -> sizing.Pilot:  # one replica's share of the first requests (a router's, on average)
        first = reqs.subset(slice(0, min(n, sizing.PILOT_REQUESTS * replicas)))
        share = first.subset(deal_replicas(first, replicas) == 0)
        try:
            outs = run_requests(share, dep, policy, cost_model(dep, scenario.allreduce, scenario.profile), replicas=1)
        except eng.TooManySteps:  # the share alone passes MAX_STEPS
            return sizing.Pilot(eng.MAX_STEPS + 1, 0, len(share), replicas)
        req_f = np.concatenate([out.req_f for _, _, out in outs])
        return _pilot(np.concatenate([out.steps_f[:, eng.F_START] for _, _, out in outs]), req_f[:, eng.R_ARRIVAL],
                      req_f[:, eng.R_FINISH], replicas)

    holds_all = scenario.router != "round-robin" and replicas > 1
    return sizing.estimate(n, replicas, holds_all, bound, pilot_replica, measure, table, shared_table=holds_all)


def _pilot(starts: np.ndarray, arrival: np.ndarray, finish: np.ndarray, drains: int) -> sizing.Pilot:
    """A sample run's steps (their start times) and requests (arrival and finish times): those up to its last
    arrival scale with the requests, those after it are the drain, paid once per engine. Unless requests queue up
    (more of them unfinished at the last arrival than twice as many as were in flight halfway, plus 10: an
    overloaded or all-at-once run, whose drain is its backlog): then every step scales."""
    order = np.sort(arrival)
    last, mid = order[-1], order[len(order) // 2]
    backlog = int((finish > last).sum())
    in_flight = int(((arrival <= mid) & (finish > mid)).sum())
    arriving = len(starts) if backlog > 2 * in_flight + 10 else int((starts <= last).sum())
    return sizing.Pilot(arriving, len(starts) - arriving, len(arrival), drains)


def _describe(scenario: Scenario, reqs: Requests) -> str:
    """The run in a few words for a sizing error: its nodes or split, its requests and their rate."""
    dep, dis = scenario.deployment, scenario.disagg
    if dis is not None:
        where = (f"a split of {dis.prefill_instances} prefill x tp {dis.prefill_tp} + {dis.decode_instances} decode "
                 f"x tp {dis.decode_tp} instances")
    else:
        per_node = dep.node.replicas
        where = f"nodes {scenario.nodes} x {per_node} replica{'s' * (per_node > 1)} of tp {dep.node.tp}"
        if scenario.router != "round-robin" and scenario.replicas > 1:
            where += f", router {scenario.router}"
    wl = scenario.workload
    rate = wl.rate_req_s if isinstance(wl, SyntheticWorkload) else reqs.mean_rate_req_s  # the rate asked for
    when = f"at {rate:,.6g} req/s" if 0 < rate < float("inf") and reqs.span_s > 0 else "all at once"
    if reqs.clients:
        when = f"from {reqs.clients:,} closed-loop clients"
    return f"{where}, {len(reqs):,} requests {when}"


def check_size(scenario: Scenario, reqs: Requests) -> sizing.RunSize:
    """``run_size``, refused in one line past engine.MAX_STEPS steps or sizing.MAX_RUN_GIB."""
    size = run_size(scenario, reqs)
    split = scenario.disagg is not None
    sizing.check(size, _describe(scenario, reqs), "instances" if split else "replicas",
                 "instances" if split else "nodes")
    return size


def _to_run(scenario: Scenario, saturated: bool) -> tuple[Scenario, Requests, tuple[int, ...]]:
    """The scenario (its budget sized for the longest prompt where the model states no context), the requests it
    runs (all at t = 0 when ``saturated``) and those the model's context rejects, as ``simulate`` runs them."""
    scenario.validate()
    reqs = scenario.workload.generate()
    if len(reqs) == 0:
        raise ValueError("the workload has no requests; num_requests must be at least 1")
    if len(reqs) > MAX_REQUESTS:
        raise ValueError(f"num_requests={len(reqs)} is out of range; allowed 1 to {MAX_REQUESTS}")
    dep = scenario.deployment
    reqs, rejected = admitted(reqs, dep.model)
    rejected = tuple(int(x) for x in rejected)
    if scenario.policy.sizes_budget and len(reqs):  # a model without a stated context: at least the longest prompt
        scenario = replace(scenario, policy=scenario.policy.sized_for(dep.model.max_context_tokens,
                                                                      int(reqs.prompt_tokens.max())))
    if saturated:
        reqs = reqs.saturated()
    return scenario, reqs, rejected


def check_run(scenario: Scenario, saturated: bool = False) -> sizing.RunSize:
    """The size guard ``simulate`` applies before it runs (``check_size``: a one-line ValueError past
    engine.MAX_STEPS steps or sizing.MAX_RUN_GIB), without running: a study that simulates the scenario many
    times (a capacity search) refuses it up front, as ``run`` does, not after minutes of its first rates."""
    scenario, reqs, _ = _to_run(scenario, saturated)
    return check_size(scenario, reqs)


def simulate(scenario: Scenario, saturated: bool = False, steps: bool = True) -> SimResult:
    """Simulate a scenario. ``saturated`` makes every request arrive at t = 0 (capacity runs). ``steps=False``: no
    per-step table (``SimResult.steps`` is None, and the summary has no node figures: busy, gpu_util, KV use,
    speculation's step counts), for runs read only for their requests' latencies and the queue (a capacity
    search's rates: building the table and its figures is ~15 % of such a run); a split's table is always built."""
    check = getattr(_BEFORE_RUN, "check", None)
    if check is not None:
        check()
    scenario, reqs, rejected = _to_run(scenario, saturated)
    check_size(scenario, reqs)
    dep = scenario.deployment
    prof = scenario.profile
    # a capacity run (saturated) has every request in the engine's queue at 0: the client's input time does not apply
    client = ClientTimes.of(reqs, replace(prof, in_fixed_s=0.0, in_per_token_s=0.0) if saturated else prof,
                            dep.model.num_layers)
    sent = reqs
    if client is not None:
        reqs = client.engine_requests(reqs)
    if scenario.disagg is not None:
        requests, table, hist = dg.frames(reqs, dep, scenario.disagg, scenario.policy, scenario.allreduce,
                                          int(getattr(scenario.workload, "seed", 0)), prof)
        if client is not None:
            requests = request_latencies(client.as_seen(requests, sent))
        return SimResult(scenario, requests, table, hist, eng.itl_bin_edges(), tuple(reqs.class_names), saturated,
                         rejected)
    cm = cost_model(dep, scenario.allreduce, prof)
    outs = run_requests(reqs, dep, scenario.policy, cm, int(getattr(scenario.workload, "seed", 0)),
                        scenario.nodes, scenario.router)
    n = len(reqs)
    req_f = np.empty((n, eng.NUM_RF))
    pre = np.empty(n, np.int64)
    cached = np.empty(n, np.int64)
    rep_of = np.empty(n, np.int64)
    spec_acc = np.zeros(n, np.int64)
    table = StepsTable(sum(len(out.steps_i) for _, _, out in outs)) if steps else None
    hist = np.zeros((max(1, len(reqs.class_names)), eng.ITL_BINS), np.int64)
    outs.reverse()
    while outs:  # each replica's engine output released once read (its step tables copied into the table)
        rep, idx, out = outs.pop()
        req_f[idx] = out.req_f
        pre[idx] = out.req_preemptions
        cached[idx] = out.req_cached
        rep_of[idx] = rep
        if out.req_spec_accepted is not None:
            spec_acc[idx] = out.req_spec_accepted
        hist += out.itl_hist
        if table is not None:
            table.add(steps_frame(out, rep, cm))
        del out
    times = {"arrival_s": req_f[:, eng.R_ARRIVAL],  # a session turn's: its predecessor's release + think time
             "first_token_s": req_f[:, eng.R_FIRST_TOKEN], "finish_s": req_f[:, eng.R_FINISH],
             "release_s": req_f[:, eng.R_RELEASE]}
    if client is not None:
        times = client.seen(times, sent)
    requests = pd.DataFrame({
        "request_id": np.arange(n),
        "arrival_s": times["arrival_s"],
        "prompt_tokens": reqs.prompt_tokens,
        "output_tokens": reqs.output_tokens,
        "priority": reqs.priority,
        "class_name": np.asarray(reqs.class_names, dtype=object)[reqs.priority],
        "replica": rep_of,  # in the fleet: node * replicas per node + the replica's index on its node
        "node": rep_of // dep.node.replicas,
        "first_scheduled_s": req_f[:, eng.R_FIRST_SCHED],
        "first_token_s": times["first_token_s"],
        "finish_s": times["finish_s"],
        "release_s": times["release_s"],
        "max_itl_s": req_f[:, eng.R_MAX_ITL],
        "preemptions": pre,
        "cached_prompt_tokens": cached,  # served from the prefix cache at its first admission
    })
    if scenario.policy.spec_decode != "off":
        requests["spec_accepted_tokens"] = spec_acc  # accepted draft tokens (speculative decoding)
    requests = request_latencies(requests)
    table = None if table is None else table.frame()
    return SimResult(scenario, requests, table, hist, eng.itl_bin_edges(), tuple(reqs.class_names), saturated,
                     rejected)
