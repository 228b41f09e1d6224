"""Deployment search: the cheapest configuration (GPU, precision, tensor parallelism, batching policy and knob values)
that serves a target traffic within the SLOs, and how many nodes it takes.

For every configuration of the grid:

1. **fit**: the model must fit the GPU at that precision and TP (weights + activations below the usable memory),
   the policy's knobs must be valid, the longest request must fit one replica's KV cache and, without chunked
   prefill, the longest prompt the token budget. Otherwise it is *skipped*, with why;
2. **capacity within the SLOs per node** (``studies.capacity``: the highest request rate at which the attainment
   share of requests meets the SLOs of their class, on a node of ``num_gpus`` GPUs = num_gpus / tp replicas);
   a configuration at which no rate meets the SLOs is skipped, with the binding SLO;
3. **nodes needed** for the target rate, ⌈target × headroom / rate per node⌉: the estimate under perfect load
   balancing across nodes (``nodes_needed_perfect_balance``);
4. **$ per million output tokens** at the target: nodes × GPUs per node × $ per GPU-hour / output tokens per hour
   at the target (target × mean output tokens per request × 3600) × 10⁶.

Ranked by cost (then the higher rate per node, the lower P99 TTFT); the Pareto front of cost against P99 TTFT and
P99 TPOT (each at the configuration's own rate found) is marked.

5. **fleet check** of the top of the ranking (``fleet_top``, 3 by default): the configuration's scenario with
   nodes = its estimate behind ``router`` (``sim.fleet``; a request-level policy runs round-robin, as
   ``Scenario.with_policy`` does), the workload at target × headroom with num_requests × nodes requests (each node
   sees about as many requests as one node's capacity search; a trace replays at most all its requests, at most
   ``MAX_REQUESTS``), read with the capacity search's rule (``meets_slo``: attainment and a queue that keeps up).
   If it fails, one more node and again, at most ``FLEET_EXTRA_NODES`` more (and ``MAX_NODES``); a configuration
   that still fails is *not verified* (``fleet_verified`` false) and ranked at the lower bound (one node more than
   the last tried). The nodes found replace the estimate in ``nodes_needed`` and the cost; the rows are re-ranked,
   and while a row not yet checked rises into the top ``fleet_top`` it is checked too (at most 2 × fleet_top
   configurations in all). The other rows keep the perfect-balance estimate (``fleet_checked`` false). The check
   only adds nodes, so a configuration pruned against the best *estimate* is not revisited when the check raises
   the best's cost (pruning stays exact for the perfect-balance ranking).

Speed-ups that cannot change the answer:

- **pruning**: once a best cost is known, a configuration can only tie or beat it with at most ``n_max`` nodes
  (its price per node fixed), i.e. with a rate per node of at least target × headroom / n_max. If even one node
  costs more than the best (n_max = 0) it is pruned without a simulation; otherwise one run at that rate decides:
  if the SLOs fail there, its capacity is below it (the capacity search itself assumes attainment falls as the
  rate rises) and it is pruned after that one run. A short run's saturated throughput is *not* an upper bound on
  the rate within the SLOs here (a finite run's tail drains with a thin batch, and loose SLOs let a backlog
  pass: measured 0.85x to 5x at 200-2,000 requests with the default SLOs), so pruning never relies on it.
- **warm starts**: configurations that differ only in knob values (same GPU, precision, TP and policy) form a
  family; its first in grid order runs ``studies.capacity.capacity`` as it is (cold), and the others start their
  bisection from a bracket around their own saturated rate times the family's ratio (rate within the SLOs /
  saturated rate), instead of [saturated / 4, 1.05 × saturated]. Reading one fixed configuration per family keeps
  every answer independent of which task happened to finish first, so every backend gives the same ranking.

Configurations are searched cheapest estimate first (the saturated rate times the ratios found so far), so a good
best is known early and pruning bites; the order changes which configurations are pruned, never the best one.

Configurations run as tasks on a backend (``studies.backends``: a local process pool or Ray), each one capacity
search or one fleet check, results as plain dicts. ``search`` returns a plain dict: ``configs`` (best first),
``searched``, ``skipped`` (with why), ``pruned``, ``failed``, ``simulations`` (fleet checks included), ``router``.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from batching.sim.topology.fleet import MAX_NODES, ROUTERS
from batching.sim.policy import KNOB_LIMITS, PRESETS, BatchingPolicy, with_knobs
from batching.sim.simulate import MAX_REQUESTS, Scenario, simulate
from batching.sim.hardware.specs import GPU, GPUS, KV_BLOCK_TOKENS, PRECISIONS, Deployment, Node
from batching.studies.capacity import (SLO, binding_of, capacity, check_headroom, meets_slo, plan_costs, slo_point,
                                       sustained)

TPS = (1, 2, 4, 8)
# the knobs a search may vary, by the mode that uses them (a knob a policy's mode ignores is not varied for it)
SEARCH_KNOBS: dict[str, tuple[str, ...]] = {
    "max_num_seqs": ("continuous",),
    "max_num_batched_tokens": ("continuous",),
    "max_batch_size": ("static", "dynamic"),
    "max_wait_s": ("dynamic",),
}
INT_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "max_batch_size")
MAX_CONFIGS = 4096
MAX_KNOB_VALUES = 64
MAX_GPU_HOUR_USD = 1e6
REL_TOL = 0.01  # the capacity search's default tolerance on the rate
MAX_ITER = 20  # the capacity search's default most rates tried
FLOOR = 64  # the capacity search gives up below ceiling / 64 (a rate that slow decodes every request alone)
CEILING_REACH = 1.05 * 2 ** 8  # the highest rate / ceiling the capacity search can answer (its doubling stops)
BRACKET = 1.15  # a warm start's first bracket: the estimate / and * this factor
ROUTER_DEFAULT = "least-outstanding"  # search()'s router for the fleet check
FLEET_TOP = 3  # configurations at the top of the ranking checked as a fleet
FLEET_EXTRA_NODES = 3  # nodes a fleet check adds, one at a time, before it calls a configuration not verified
ROUTER_NOTE = ("Nodes needed: first ⌈target × headroom / rate per node⌉, which assumes perfect load balancing "
               "across nodes; the top configurations (marked fleet ✓) were then simulated as a fleet of that many "
               "nodes behind the router at the target rate (× headroom), adding a node while the fleet missed the "
               "SLOs (at most 3 more); their nodes and cost are the fleet's. The others keep the perfect-balance "
               "estimate.")


NO_FLEET_NOTE = ("Nodes needed = ⌈target × headroom / rate per node⌉: this assumes perfect load balancing across "
                 "nodes (no fleet was simulated: the fleet check was off).")


def router_note(router: str, fleet_top: int = FLEET_TOP) -> str:
    """ROUTER_NOTE and the router the fleet checks ran behind (NO_FLEET_NOTE when ``fleet_top`` is 0)."""
    if not fleet_top:
        return NO_FLEET_NOTE
    return (f"{ROUTER_NOTE} Router: {router} (a request-level policy, static or dynamic, runs round-robin: the "
            "other routers read replica state built for the continuous modes).")
COST_NOTE = ("$ per million output tokens = nodes × GPUs per node × $ per GPU-hour / (target req/s × mean output "
             "tokens per request × 3600) × 10⁶: what serving the target costs, whole nodes included.")


# ---------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Config:
    """One deployment to try: GPU (a preset name, or a custom GPU's key), precision, TP, a policy preset and knob
    values that change it (sorted (name, value) pairs)."""

    gpu: str
    precision: str
    tp: int
    policy: str
    knobs: tuple[tuple[str, float], ...] = ()

    def knob_dict(self) -> dict:
        return {k: (int(v) if k in INT_KNOBS else float(v)) for k, v in self.knobs}

    def family(self) -> tuple:
        """Configurations that differ only in knob values."""
        return (self.gpu, self.precision, self.tp, self.policy)

    def label(self) -> str:
        knobs = "".join(f", {k}={v:g}" for k, v in self.knobs)
        return f"{self.gpu} {self.precision} tp{self.tp} {self.policy}{knobs}"

    def to_dict(self, num_gpus: int) -> dict:
        return {"gpu": self.gpu, "precision": self.precision, "tp": self.tp,
                "replicas_per_node": num_gpus // self.tp if self.tp <= num_gpus else 0,
                "policy": self.policy, "knobs": self.knob_dict()}


@dataclass(frozen=True)
class Grid:
    """The values to combine: every GPU × precision × TP × policy × knob values."""

    gpus: tuple[str, ...]
    precisions: tuple[str, ...] = ("bf16",)
    tps: tuple[int, ...] = TPS
    policies: tuple[str, ...] = ("chunked",)
    knobs: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def validate(self, custom_gpus: Mapping[str, GPU] | None = None) -> None:
        known = set(GPUS) | set(custom_gpus or {})
        for name, values, allowed in (("gpus", self.gpus, known), ("precisions", self.precisions, PRECISIONS),
                                      ("tp", self.tps, TPS), ("policies", self.policies, PRESETS)):
            if not values:
                raise ValueError(f"{name} is empty; give at least one of {', '.join(map(str, allowed))}")
            for v in values:
                if v not in allowed:
                    raise ValueError(f"{name}: {v!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
        for name, values in self.knobs:
            if name not in SEARCH_KNOBS:
                raise ValueError(f"knob {name!r} is not allowed; allowed: {', '.join(SEARCH_KNOBS)}")
            if not values or len(values) > MAX_KNOB_VALUES:
                raise ValueError(f"knob {name}: {len(values)} values; allowed 1 to {MAX_KNOB_VALUES}")
            low, high = KNOB_LIMITS[name]
            for v in values:
                if not (isinstance(v, (int, float)) and math.isfinite(v) and low <= v <= high):
                    raise ValueError(f"knob {name}={v!r} is out of range; allowed {low:g} to {high:g}")
                if name in INT_KNOBS and v != int(v):
                    raise ValueError(f"knob {name}={v!r} is not a whole number")
        n = self.size()
        if n > MAX_CONFIGS:
            raise ValueError(f"the grid has {n:,} configurations; allowed at most {MAX_CONFIGS:,} (fewer GPUs, "
                             "precisions, TP degrees, policies or knob values)")

    def configs(self) -> list[Config]:
        out = []
        for gpu, prec, tp, pol in itertools.product(self.gpus, self.precisions, self.tps, self.policies):
            mode = PRESETS[pol].mode
            used = [(k, vals) for k, vals in self.knobs if mode in SEARCH_KNOBS[k]]
            for combo in itertools.product(*[vals for _, vals in used]):
                knobs = tuple(sorted((k, float(v)) for (k, _), v in zip(used, combo)))
                out.append(Config(gpu, prec, int(tp), pol, knobs))
        return list(dict.fromkeys(out))

    def size(self) -> int:
        return len(self.configs())


def parse_knobs(items: Sequence[str]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """``["max_num_seqs=128,256", "max_num_batched_tokens=2048"]`` -> (("max_num_seqs", (128.0, 256.0)), ...);
    ValueError naming the item, the value and the allowed range."""
    out: dict[str, tuple[float, ...]] = {}
    for item in items:
        name, eq, text = str(item).partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"{item!r} is not NAME=V1,V2,...; e.g. max_num_seqs=128,256,512")
        if name not in SEARCH_KNOBS:
            raise ValueError(f"knob {name!r} is not allowed; allowed: {', '.join(SEARCH_KNOBS)}")
        if name in out:
            raise ValueError(f"knob {name} is given twice; give its values once, separated by commas")
        low, high = KNOB_LIMITS[name]
        values = []
        for part in text.split(","):
            p = part.strip()
            if not p:
                raise ValueError(f"knob {name}: an empty value in {text!r}; e.g. {name}=128,256")
            if not p.isascii():
                raise ValueError(f"knob {name}: {p!r} has characters other than ASCII; write it with 0-9")
            try:
                v = float(p)
            except ValueError:
                raise ValueError(f"knob {name}: {p!r} is not a number; allowed {low:g} to {high:g}") from None
            if not math.isfinite(v) or not low <= v <= high:
                raise ValueError(f"knob {name}={p} is out of range; allowed {low:g} to {high:g}")
            if name in INT_KNOBS and v != int(v):
                raise ValueError(f"knob {name}={p} is not a whole number; allowed {low:g} to {high:g}")
            values.append(v)
        if len(values) > MAX_KNOB_VALUES:
            raise ValueError(f"knob {name}: {len(values)} values; allowed 1 to {MAX_KNOB_VALUES}")
        out[name] = tuple(dict.fromkeys(values))
    return tuple(out.items())


# ---------------------------------------------------------------- one configuration


def gpu_spec(name: str, custom_gpus: Mapping[str, GPU] | None = None) -> GPU:
    if custom_gpus and name in custom_gpus:
        return custom_gpus[name]
    return GPUS[name]


def config_scenario(base: Scenario, cfg: Config, custom_gpus: Mapping[str, GPU] | None = None) -> Scenario:
    """The base scenario (model, workload, GPUs per node, KV dtype and override, all-reduce, prefix caching) on
    this configuration; ValueError saying why it does not fit or cannot run."""
    dep0 = base.deployment
    dep = Deployment(Node(gpu_spec(cfg.gpu, custom_gpus), dep0.node.num_gpus, cfg.tp), dep0.model, cfg.precision,
                     dep0.kv_dtype, dep0.gpu_memory_utilization, dep0.activation_reserve_bytes,
                     dep0.kv_cache_tokens)
    if dep.kv_cache_tokens is not None and dep.kv_cache_tokens > dep.kv_capacity_tokens_max > 0:
        dep = replace(dep, kv_cache_tokens=None)  # the override shrinks a cache; a smaller GPU's is already smaller
    dep.validate()
    pol = PRESETS[cfg.policy]
    if pol.mode == "continuous":
        pol = replace(pol, prefix_caching=base.policy.prefix_caching)
    pol = with_knobs(pol, **cfg.knob_dict())
    return Scenario(dep, base.workload, pol, base.allreduce)


def fit_problem(sc: Scenario, longest_request: int, longest_prompt: int) -> str | None:
    """Why the requests cannot run on this scenario (one replica's KV cache or the token budget), or None."""
    dep, pol = sc.deployment, sc.policy
    need = -(-longest_request // KV_BLOCK_TOKENS)
    if need > dep.kv_capacity_blocks:
        return (f"the longest request needs {longest_request:,} tokens of KV cache but one replica holds "
                f"{dep.kv_capacity_tokens:,} ({dep.model.name} in {dep.precision} on {dep.node.gpu.name}, "
                f"tp={dep.node.tp})")
    if pol.mode == "continuous" and not pol.chunked_prefill and longest_prompt > pol.max_num_batched_tokens:
        return (f"max_num_batched_tokens={pol.max_num_batched_tokens} is below the longest prompt "
                f"({longest_prompt:,} tokens) without chunked prefill")
    return None


def _best_point(points: list[dict], slo: SLO) -> dict | None:
    ok = [p for p in points if meets_slo(p, slo)]
    return max(ok, key=lambda p: p["rate_req_s"]) if ok else None


def _binding(points: list[dict], slo: SLO) -> tuple[str | None, str | None]:
    """As ``studies.capacity``: the SLO (and class) with the lowest attainment at the lowest rate that fails."""
    return binding_of(points, slo)


def warm_capacity(sc: Scenario, slo: SLO, ceiling: float, estimate: float, known: list[dict] | None = None,
                  rel_tol: float = REL_TOL, max_iter: int = MAX_ITER, run=None) -> list[dict]:
    """The capacity search's bisection (``studies.capacity.capacity``) started from a bracket around ``estimate``
    instead of [ceiling / 4, 1.05 × ceiling]: probe the estimate, widen by 1.15, 1.3, 1.7, 2.9... until the bracket
    holds the boundary (down to ceiling / 64, up to the capacity search's own highest answer), then bisect to
    ``rel_tol``. ``known``: points already simulated. Returns every point tried (``slo_point`` dicts)."""
    points = list(known or [])
    wl = sc.workload

    def probe(rate: float) -> dict:
        at = sc.with_workload(wl.with_rate(rate))
        p = slo_point(at, slo) if run is None else run(at)
        points.append(p)
        return p

    def meets(p: dict) -> bool:
        return meets_slo(p, slo)

    good = [p["rate_req_s"] for p in points if meets(p)]
    bad = [p["rate_req_s"] for p in points if not meets(p)]
    lo = max(good) if good else None
    hi = min([r for r in bad if lo is None or r > lo], default=None)
    floor, top = ceiling / FLOOR, ceiling * CEILING_REACH
    estimate = min(max(estimate, floor), top)
    tries = 0
    if (lo is None or estimate > lo * (1 + rel_tol)) and (hi is None or estimate < hi * (1 - rel_tol)):
        tries += 1  # the estimate first, unless the points already known bracket it closely
        if meets(probe(estimate)):
            lo = estimate
        else:
            hi = estimate
    factor = BRACKET
    while hi is None and tries < max_iter // 2:  # widen upwards
        r = min(lo * factor, top)
        tries += 1
        if meets(probe(r)):
            lo = r
            if r >= top:
                break
        else:
            hi = r
        factor *= factor
    factor = BRACKET
    while lo is None and tries < max_iter // 2:  # widen downwards
        r = max(hi / factor, floor)
        tries += 1
        if meets(probe(r)):
            lo = r
        else:
            hi = r
            if r <= floor:
                break
        factor *= factor
    if lo is None or hi is None:
        return points
    while hi - lo > rel_tol * hi and tries < max_iter:
        mid = math.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
        tries += 1
        if meets(probe(mid)):
            lo = mid
        else:
            hi = mid
    return points


def search_task(payload: dict) -> dict:
    """One configuration's work on a worker: its capacity within the SLOs (pruned after one run when it cannot
    beat ``prune_rate``), as a plain dict. ``payload``: scenario, slo, ceiling, estimate (None: a cold start with
    ``studies.capacity.capacity``), prune_rate (None: no pruning), rel_tol."""
    sc: Scenario = payload["scenario"]
    slo: SLO = payload["slo"]
    ceiling = float(payload["ceiling"])
    rel_tol = float(payload.get("rel_tol", REL_TOL))
    prune_rate = payload.get("prune_rate")
    estimate = payload.get("estimate")
    started = time.perf_counter()
    known: list[dict] = []
    try:
        if prune_rate is not None:
            p = slo_point(sc.with_workload(sc.workload.with_rate(prune_rate)), slo)
            known.append(p)
            if p["attainment"] < slo.attainment:
                return {"status": "pruned", "simulations": 1, "prune_rate_req_s": float(prune_rate),
                        "attainment_at_prune_rate": p["attainment"], "seconds": time.perf_counter() - started}
        if estimate is None and not known:
            res = capacity(sc, slo, ceiling=ceiling, rel_tol=rel_tol)
            pts = res.points
            best = None
            if res.max_rate_req_s > 0:
                row = pts.iloc[(pts["rate_req_s"] - res.max_rate_req_s).abs().argmin()]
                best = {k: float(row[k]) for k in ("rate_req_s", "throughput_output_tok_s", "ttft_p99_s",
                                                   "tpot_p99_s", "goodput_req_s", "attainment")}
            out = {"status": "done", "simulations": res.rates_tried, "warm": False,
                   "max_rate_req_s": float(res.max_rate_req_s), "binding_slo": res.binding_slo,
                   "binding_class": res.binding_class}
        else:
            start = float(estimate) if estimate is not None else float(prune_rate)
            points = warm_capacity(sc, slo, ceiling, start, known, rel_tol=rel_tol)
            b = _best_point(points, slo)
            binding, cls = _binding(points, slo)
            best = None if b is None else {k: float(b[k]) for k in ("rate_req_s", "throughput_output_tok_s",
                                                                     "ttft_p99_s", "tpot_p99_s", "goodput_req_s",
                                                                     "attainment")}
            out = {"status": "done", "simulations": len(points), "warm": True,
                   "max_rate_req_s": best["rate_req_s"] if best else 0.0, "binding_slo": binding,
                   "binding_class": cls}
    except ValueError as exc:  # the scenario cannot run (found only when simulating): skipped, with why
        return {"status": "skipped", "why": str(exc), "simulations": len(known),
                "seconds": time.perf_counter() - started}
    out["best"] = best
    out["seconds"] = time.perf_counter() - started
    return out


def ceiling_task(payload: dict) -> dict:
    """The saturated run (every request at t = 0): requests/s and output tokens/s flat out."""
    sc: Scenario = payload["scenario"]
    try:
        s = simulate(sc, saturated=True).summary()
    except ValueError as exc:
        return {"status": "skipped", "why": str(exc), "simulations": 1}
    return {"status": "done", "simulations": 1, "ceiling_req_s": s["num_requests"] / max(s["duration_s"], 1e-9)}


def fleet_router(router: str, policy: BatchingPolicy) -> str:
    """The router a fleet of this policy runs behind: ``router``, or round-robin for a request-level policy
    (``Scenario.with_policy``'s rule)."""
    return router if policy.mode == "continuous" else "round-robin"


def fleet_scenario(sc: Scenario, nodes: int, router: str, rate_req_s: float) -> Scenario:
    """One configuration's scenario (``config_scenario``) as a fleet of ``nodes`` nodes behind ``router``, its
    workload at ``rate_req_s`` in all with num_requests × nodes requests (each node sees about as many as one node's
    capacity search did; a trace replays at most all its requests; at most ``MAX_REQUESTS``)."""
    wl = sc.workload
    n = min(int(wl.num_requests) * int(nodes), MAX_REQUESTS)
    return replace(sc, nodes=int(nodes), router=fleet_router(router, sc.policy),
                   workload=wl.with_num_requests(n).with_rate(rate_req_s))


def fleet_task(payload: dict) -> dict:
    """One configuration's fleet check on a worker: ``nodes`` nodes behind ``router`` at ``rate_req_s`` (target ×
    headroom) read against the SLOs with the capacity search's rule (``meets_slo``); while it fails, one node more,
    at most ``extra`` more (and ``MAX_NODES``). ``payload``: scenario (one node), slo, nodes, router, rate_req_s,
    extra. Returns a plain dict: ``nodes`` (the first that met the SLOs, or None), ``tried`` (each run read)."""
    sc: Scenario = payload["scenario"]
    slo: SLO = payload["slo"]
    start = int(payload["nodes"])
    last = min(start + int(payload.get("extra", FLEET_EXTRA_NODES)), MAX_NODES)
    router = fleet_router(payload["router"], sc.policy)
    started = time.perf_counter()
    tried: list[dict] = []
    try:
        for n in range(start, last + 1):
            p = slo_point(fleet_scenario(sc, n, router, float(payload["rate_req_s"])), slo)
            ok = meets_slo(p, slo)
            tried.append({"nodes": n, "meets_slo": ok, "attainment": float(p["attainment"]),
                          "sustained": sustained(p), "ttft_p99_s": float(p["ttft_p99_s"]),
                          "tpot_p99_s": float(p["tpot_p99_s"])})
            if ok:
                break
    except ValueError as exc:  # e.g. a trace that cannot be sped up to the target: not checked, with why
        return {"status": "skipped", "why": str(exc), "simulations": len(tried), "router": router,
                "tried": tried, "seconds": time.perf_counter() - started}
    ok = bool(tried) and tried[-1]["meets_slo"]
    return {"status": "done", "simulations": len(tried), "router": router, "tried": tried,
            "nodes": tried[-1]["nodes"] if ok else None, "last_nodes": tried[-1]["nodes"] if tried else start - 1,
            "seconds": time.perf_counter() - started}


# ---------------------------------------------------------------- the search


def check_prices(configs: Sequence[Config], gpu_hour_usd: Mapping[str, float]) -> None:
    for gpu in dict.fromkeys(c.gpu for c in configs):
        if gpu not in gpu_hour_usd:
            raise ValueError(f"gpu_hour_usd has no price for {gpu}; give one per GPU searched, e.g. {gpu}=2.5")
        v = gpu_hour_usd[gpu]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_GPU_HOUR_USD:
            raise ValueError(f"gpu_hour_usd {gpu}={v!r} is out of range; allowed > 0 to {MAX_GPU_HOUR_USD:g}")


def pareto(rows: Sequence[dict], keys: Sequence[str] = ("usd_per_million_output_tokens", "ttft_p99_s",
                                                        "tpot_p99_s")) -> list[bool]:
    """Whether each row is on the Pareto front: no other row is at most as large in every key and smaller in one."""
    vals = np.array([[float(r[k]) for k in keys] for r in rows], float) if rows else np.zeros((0, len(keys)))
    out = []
    for i in range(len(rows)):
        other = np.delete(vals, i, axis=0)
        dominated = np.any(np.all(other <= vals[i], axis=1) & np.any(other < vals[i], axis=1))
        out.append(not bool(dominated))
    return out


def rank_key(row: dict) -> tuple:
    """Cost, then the higher rate per node (more headroom), then the lower P99 TTFT and TPOT, then the label."""
    return (row["usd_per_million_output_tokens"], -row["max_rate_req_s"], row["ttft_p99_s"], row["tpot_p99_s"],
            row["label"])


def search(base: Scenario, slo: SLO, target_rate_req_s: float, gpu_hour_usd: Mapping[str, float], grid: Grid,
           backend=None, prune: bool = True, warm: bool = True, headroom: float = 1.0,
           custom_gpus: Mapping[str, GPU] | None = None, rel_tol: float = REL_TOL,
           progress: Callable[[int, int, str], None] | None = None, router: str = ROUTER_DEFAULT,
           fleet_top: int = FLEET_TOP) -> dict:
    """Search the grid on ``base``'s model and workload (its rate is what each capacity search varies); see the
    module's docstring. ``backend``: a ``studies.backends`` backend (left open), or a function of the number of
    configurations to run that makes one (called only when some configuration fits, so a grid where every one is
    skipped starts nothing; closed at the end), default a local process pool. ``router``: the router the fleet
    checks run behind (``sim.fleet.ROUTERS``); ``fleet_top``: how many of the top configurations to check as a
    fleet (0: none, every row keeps the perfect-balance estimate). ``base``'s own nodes and router are not read.
    Returns a plain dict (JSON-ready)."""
    from batching.studies.backends import NothingToRun, make_backend, run_tasks

    started = time.perf_counter()
    if router not in ROUTERS:
        raise ValueError(f"router={router!r} is not allowed; allowed: {', '.join(ROUTERS)}")
    if isinstance(fleet_top, bool) or not isinstance(fleet_top, int) or not 0 <= fleet_top <= MAX_CONFIGS:
        raise ValueError(f"fleet_top={fleet_top!r} is out of range; allowed a whole number from 0 to {MAX_CONFIGS}")
    grid.validate(custom_gpus)
    slo.validate()
    headroom = check_headroom(headroom)
    plan_costs(1.0, 1.0, 1, target_rate_req_s, None, headroom)  # the target's range
    configs = grid.configs()
    check_prices(configs, gpu_hour_usd)
    num_gpus = base.deployment.node.num_gpus
    base.workload.validate()
    reqs, _ = base.requests()  # the requests the model serves (those beyond its context are rejected, never run)
    from batching.studies.capacity import class_names

    slo.validate(len(class_names(base)))
    mean_output = float(np.mean(reqs.output_tokens))
    longest_request = int(np.max(reqs.prompt_tokens + reqs.output_tokens))
    longest_prompt = int(np.max(reqs.prompt_tokens))
    tokens_per_hour = target_rate_req_s * mean_output * 3600.0

    def node_usd_per_hour(cfg: Config) -> float:
        return num_gpus * float(gpu_hour_usd[cfg.gpu])

    def cost(cfg: Config, nodes: int) -> float:
        return nodes * node_usd_per_hour(cfg) / tokens_per_hour * 1e6

    skipped: list[dict] = []
    pruned: list[dict] = []
    failed: list[dict] = []
    scenarios: dict[Config, Scenario] = {}
    for cfg in configs:
        try:
            if cfg.tp > num_gpus:
                raise ValueError(f"tp={cfg.tp} is more than the {num_gpus} GPUs of a node")
            sc = config_scenario(base, cfg, custom_gpus)
        except ValueError as exc:
            skipped.append(cfg.to_dict(num_gpus) | {"label": cfg.label(), "reason": "does not fit",
                                                    "why": str(exc)})
            continue
        why = fit_problem(sc, longest_request, longest_prompt)
        if why:
            skipped.append(cfg.to_dict(num_gpus) | {"label": cfg.label(), "reason": "does not fit", "why": why})
            continue
        scenarios[cfg] = sc

    own = not hasattr(backend, "submit")  # None or a factory: the backend is made here, for what fits
    if own:
        make = backend or (lambda tasks: make_backend("local", tasks=tasks))
        backend = make(len(scenarios)) if scenarios else NothingToRun()
    simulations = 0
    done_count = [0]
    total = 2 * len(scenarios)

    def tick(text: str) -> None:
        done_count[0] += 1
        if progress:
            progress(min(done_count[0], total), total, text)

    try:
        # 1. the saturated run of every configuration that fits: orders the search (cheapest estimate first) and
        #    scales the warm starts
        ceilings: dict[Config, float] = {}
        locals_box: dict = {}  # the search phase's anchors, for failures to release their family
        order = list(scenarios)

        def next_ceiling():
            while order:
                cfg = order.pop(0)
                return cfg, cfg.label(), ceiling_task, {"scenario": scenarios[cfg]}
            return None

        def got_ceiling(cfg, out):
            nonlocal simulations
            simulations += out.get("simulations", 0)
            if out["status"] == "done":
                ceilings[cfg] = out["ceiling_req_s"]
            else:
                skipped.append(cfg.to_dict(num_gpus) | {"label": cfg.label(), "reason": "does not fit",
                                                        "why": out["why"]})
                tick(f"{cfg.label()}: does not fit")
            tick(f"{cfg.label()}: saturated run")

        def failed_task(cfg, failure):
            if "anchors" in locals_box and locals_box["anchors"].get(cfg.family()) == cfg:
                locals_box["anchor_ratio"][cfg.family()] = None
            failed.append(cfg.to_dict(num_gpus) | {"label": cfg.label(), "error": failure.error,
                                                   "tries": failure.tries})
            tick(f"{cfg.label()}: failed")
            tick(f"{cfg.label()}: failed")

        run_tasks(backend, next_ceiling, on_result=got_ceiling, on_failure=failed_task)

        # 2. the capacity searches, cheapest estimate first; the ratio rate within the SLOs / saturated rate of the
        #    configurations done so far sharpens the estimates
        rows: dict[Config, dict] = {}
        ratios: dict[tuple, list[float]] = {}

        def ratio_for(cfg: Config) -> float | None:
            for key in (("family",) + cfg.family(), ("policy", cfg.policy), ("any",)):
                if ratios.get(key):
                    return float(np.median(ratios[key]))
            return None

        def estimate_cost(cfg: Config) -> float:
            r = ceilings[cfg] * (ratio_for(cfg) or 1.0)
            return cost(cfg, math.ceil(target_rate_req_s * headroom / r - 1e-9))

        pending = sorted(ceilings, key=lambda c: (estimate_cost(c), c.label()))
        best = [math.inf]
        # warm starts read one fixed configuration per family (its first in grid order, searched cold), so each
        # configuration's answer does not depend on which task happened to finish first (same on every backend)
        anchors: dict[tuple, Config] = {}
        for cfg in configs:
            if cfg in ceilings:
                anchors.setdefault(cfg.family(), cfg)
        anchor_ratio: dict[tuple, float | None] = {}  # family -> rate / ceiling of its anchor (None: none found)
        locals_box.update(anchors=anchors, anchor_ratio=anchor_ratio)

        def ready(cfg: Config) -> bool:
            return not warm or anchors[cfg.family()] == cfg or cfg.family() in anchor_ratio

        def next_search():
            while True:
                pending.sort(key=lambda c: (estimate_cost(c), c.label()))
                cfg = next((c for c in pending if ready(c)), None)
                if cfg is None:
                    return None  # the rest wait for their family's anchor (running now)
                pending.remove(cfg)
                prune_rate = None
                if prune and math.isfinite(best[0]):
                    n_max = math.floor(best[0] / cost(cfg, 1) * (1 + 1e-12))
                    if n_max < 1:
                        drop(cfg, {"simulations": 0,
                                   "why": f"one node costs ${cost(cfg, 1):,.4g} per million output tokens at the "
                                          f"target, more than the best found (${best[0]:,.4g})"})
                        continue
                    prune_rate = target_rate_req_s * headroom / n_max
                    if prune_rate > ceilings[cfg] * CEILING_REACH:
                        drop(cfg, {"simulations": 0,
                                   "why": f"it would need {prune_rate:,.4g} req/s per node to cost at most the best "
                                          f"(${best[0]:,.4g}), beyond what the capacity search can find"})
                        continue
                ratio = anchor_ratio.get(cfg.family()) if warm and anchors[cfg.family()] != cfg else None
                estimate = ceilings[cfg] * ratio if ratio is not None else None
                payload = {"scenario": scenarios[cfg], "slo": slo, "ceiling": ceilings[cfg], "estimate": estimate,
                           "prune_rate": prune_rate, "rel_tol": rel_tol}
                return cfg, cfg.label(), search_task, payload

        def settle(cfg: Config, ratio: float | None) -> None:
            """The anchor of a family is done: its members may start (cold when it found no rate)."""
            if anchors.get(cfg.family()) == cfg:
                anchor_ratio[cfg.family()] = ratio

        def drop(cfg: Config, info: dict) -> None:
            pruned.append(cfg.to_dict(num_gpus) | {"label": cfg.label()} | info)
            settle(cfg, None)
            tick(f"{cfg.label()}: pruned")

        def got_search(cfg, out):
            nonlocal simulations
            simulations += out.get("simulations", 0)
            d = cfg.to_dict(num_gpus) | {"label": cfg.label()}
            if out["status"] == "pruned":
                drop(cfg, {"simulations": out["simulations"],
                           "why": f"the SLOs fail at {out['prune_rate_req_s']:,.4g} req/s per node (attainment "
                                  f"{out['attainment_at_prune_rate'] * 100:.1f} %), the least it would need to cost "
                                  "at most the best found"})
                return
            if out["status"] == "skipped":
                skipped.append(d | {"reason": "does not fit", "why": out["why"]})
                settle(cfg, None)
                tick(f"{cfg.label()}: does not fit")
                return
            rate = out["max_rate_req_s"]
            b = out["best"]
            if rate > 0:
                ratios.setdefault(("family",) + cfg.family(), []).append(rate / ceilings[cfg])
                ratios.setdefault(("policy", cfg.policy), []).append(rate / ceilings[cfg])
                ratios.setdefault(("any",), []).append(rate / ceilings[cfg])
            nodes = plan_costs(rate, 1.0, num_gpus, target_rate_req_s, None, headroom)[0] if rate > 0 else None
            row = d | {"max_rate_req_s": rate, "nodes_needed": nodes,
                       "usd_per_million_output_tokens": cost(cfg, nodes) if nodes else None,
                       "usd_per_node_hour": node_usd_per_hour(cfg),
                       "ttft_p99_s": b["ttft_p99_s"] if b else None, "tpot_p99_s": b["tpot_p99_s"] if b else None,
                       "throughput_output_tok_s": b["throughput_output_tok_s"] if b else None,
                       "binding_slo": out["binding_slo"], "binding_class": out["binding_class"],
                       "meets_slo": rate > 0, "ceiling_req_s": ceilings[cfg], "simulations": out["simulations"] + 1,
                       "warm_start": bool(out.get("warm"))}
            rows[cfg] = row
            settle(cfg, rate / ceilings[cfg] if rate > 0 else None)
            if rate > 0:
                best[0] = min(best[0], row["usd_per_million_output_tokens"])
            tick(f"{cfg.label()}: {rate:,.3g} req/s per node")

        run_tasks(backend, next_search, on_result=got_search, on_failure=failed_task)

        # 3. the fleet check of the top of the ranking: the estimate's nodes behind the router at the target, one
        #    node more while the SLOs fail; re-ranked after each round, until the top fleet_top are all checked
        rate_all = target_rate_req_s * headroom
        for cfg, r in rows.items():
            r.update(nodes_needed_perfect_balance=r["nodes_needed"], fleet_checked=False, fleet_verified=None,
                     fleet_nodes_needed=None, fleet_ttft_p99_s=None, fleet_tpot_p99_s=None, fleet_attainment=None,
                     fleet_nodes_tried=[], fleet_simulations=0, fleet_note=None,
                     router=fleet_router(router, scenarios[cfg].policy))
        attempted: set[Config] = set()

        def got_fleet(cfg: Config, out: dict) -> None:
            nonlocal simulations
            simulations += out.get("simulations", 0)
            r = rows[cfg]
            r.update(fleet_simulations=r["fleet_simulations"] + out.get("simulations", 0),
                     fleet_nodes_tried=out.get("tried", []), router=out.get("router", r["router"]))
            if out["status"] != "done" or not out.get("tried"):
                r["fleet_note"] = f"not simulated as a fleet: {out.get('why', 'no run')}"
                tick(f"{cfg.label()}: fleet not simulated")
                return
            last = out["tried"][-1]
            r.update(fleet_checked=True, fleet_ttft_p99_s=last["ttft_p99_s"], fleet_tpot_p99_s=last["tpot_p99_s"],
                     fleet_attainment=last["attainment"])
            if out["nodes"] is not None:
                n = int(out["nodes"])
                r.update(fleet_verified=True, fleet_nodes_needed=n, nodes_needed=n,
                         usd_per_million_output_tokens=cost(cfg, n))
                tick(f"{cfg.label()}: {n} node(s) behind {r['router']} meet the SLOs")
            else:
                n = int(out["last_nodes"]) + 1  # a lower bound: the last tried missed the SLOs
                r.update(fleet_verified=False, nodes_needed=n, usd_per_million_output_tokens=cost(cfg, n),
                         fleet_note=f"not verified: {out['last_nodes']} nodes behind {r['router']} still miss the "
                                    f"SLOs (attainment {last['attainment'] * 100:.1f} %"
                                    + ("" if last["sustained"] else ", the queue grows") + f"); {n} or more needed")
                tick(f"{cfg.label()}: not verified as a fleet")

        def fleet_failed(cfg: Config, failure) -> None:
            rows[cfg]["fleet_note"] = f"the fleet check failed on a worker: {failure.error}"
            failed.append(cfg.to_dict(num_gpus) | {"label": cfg.label(), "stage": "fleet check",
                                                   "error": f"fleet check: {failure.error}",
                                                   "tries": failure.tries})
            tick(f"{cfg.label()}: fleet check failed")

        while True:
            ranked = sorted((r for cfg, r in rows.items() if r["meets_slo"]), key=rank_key)
            by_label = {cfg.label(): cfg for cfg in rows}
            todo = [by_label[r["label"]] for r in ranked[:fleet_top] if by_label[r["label"]] not in attempted]
            todo = todo[:max(0, 2 * fleet_top - len(attempted))]
            if not todo:
                break
            queue = []
            for cfg in todo:
                attempted.add(cfg)
                n0 = rows[cfg]["nodes_needed"]
                if n0 > MAX_NODES:
                    rows[cfg]["fleet_note"] = (f"not simulated as a fleet: {n0} nodes, more than the {MAX_NODES} a "
                                               "fleet simulation holds")
                    continue
                queue.append(cfg)
            total += len(queue)

            def next_fleet():
                if not queue:
                    return None
                cfg = queue.pop(0)
                payload = {"scenario": scenarios[cfg], "slo": slo, "nodes": rows[cfg]["nodes_needed"],
                           "router": router, "rate_req_s": rate_all, "extra": FLEET_EXTRA_NODES}
                return cfg, f"{cfg.label()} (fleet)", fleet_task, payload

            run_tasks(backend, next_fleet, on_result=got_fleet, on_failure=fleet_failed)
    finally:
        if own:
            backend.close()

    good = sorted((r for r in rows.values() if r["meets_slo"]), key=rank_key)
    front = pareto(good)
    for r, on in zip(good, front):
        r["pareto"] = on
    bad = sorted((r for r in rows.values() if not r["meets_slo"]), key=lambda r: r["label"])
    for r in bad:
        r["pareto"] = False
        skipped.append({k: r[k] for k in ("gpu", "precision", "tp", "replicas_per_node", "policy", "knobs", "label")}
                       | {"reason": "no rate meets the SLOs",
                          "why": "no rate tried meets the SLOs, even the lowest (binding: "
                                 f"{r['binding_slo'] or 'none'}" + (f", class {r['binding_class']}"
                                                                    if r["binding_class"] else "") + ")"})
    return {
        "configs": good + bad,
        "searched": len(rows),
        "grid_size": len(configs),
        "skipped": skipped,
        "pruned": pruned,
        "failed": failed,
        "simulations": simulations,
        "seconds": time.perf_counter() - started,
        "backend": backend.describe(),
        "target_rate_req_s": target_rate_req_s,
        "gpu_hour_usd": dict(gpu_hour_usd),
        "headroom": headroom,
        "num_gpus_per_node": num_gpus,
        "mean_output_tokens": mean_output,
        "slo": slo.to_dict(),
        "router": router,
        "fleet_top": fleet_top,
        "notes": [router_note(router, fleet_top), COST_NOTE],
    }
