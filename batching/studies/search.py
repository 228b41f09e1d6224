"""Deployment search: the cheapest configuration (GPU, precision, serving: an aggregated node of TP x replicas or a
prefill/decode split P x T + D x U inside a node, batching policy and knob values) that serves a target traffic
within the SLOs, and how many nodes it takes. Stages (each a small function or class below):

1. **grid** (``Grid.configs``): GPUs x precisions x (``serving`` agg: TP degrees, the node's GPUs / TP replicas,
   or TP 16: one replica over two 8-GPU nodes, a copy of two nodes; disagg: every split of the node kept by
   ``splits_of``, a split that leaves GPUs idle beside the same copies per node being dominated by the bigger one;
   both: the two) x policies (a split runs iteration-level policies only)
   x knob values;
2. **fit** (``fitting``): the model must fit the GPU at that precision and TP, the longest request one replica's
   (a split: a decode instance's) KV cache, the longest prompt a prefill instance's and, without chunked prefill,
   the token budget; otherwise *skipped*, with why. Then each one's saturated run (``saturate``);
3. **prune and capacity** (``CapacityStage``): the highest rate per copy (a node, or a split) within the SLOs
   (``studies.capacity``), cheapest estimate first; the nodes and price from ``pricing.price`` (copies for target
   x headroom, in whole nodes); then one run of a copy at the target traffic (target / copies deployed) gives the
   P99 TTFT and TPOT the rows report and rank by. Pruning compares a configuration only with the best of its own
   GPU type and serving mode (``prune_group``), so every GPU type's best (and the best aggregated and
   disaggregated configuration) is found with a cost;
4. **fleet check** (``FleetStage``) of the top of the ranking (``fleet_top``, 3 by default): the configuration as a
   fleet of its estimated nodes behind ``router`` (``sim.fleet``; a request-level policy runs round-robin) at
   target x headroom, read with the capacity search's rule (``meets_slo``); one node more while it fails, at most
   ``FLEET_EXTRA_NODES`` more; still failing: *not verified*, ranked at the lower bound. The nodes found replace the
   estimate and are re-priced; re-ranked, a row rising into the top is checked too (at most 2 x fleet_top). A split
   is not simulated as a fleet (its copies keep the perfect-balance count);
5. **rank** (``ranked``, ``best_per``): by cost, then by the capacity of the fleet deployed (more first: equal costs
   are common with whole nodes), then by P99 TTFT and P99 TPOT at the target traffic (so rank 1 is always on the
   Pareto front of cost, those latencies and capacity); the best row of every GPU type and of each serving mode,
   with why it lost to rank 1; ``rounding_note`` says when whole-node rounding decided (the cheapest at the target is
   not the cheapest at capacity).

Speed-ups that cannot change the answer:

- **pruning**: once a group's best cost is known, a configuration can only tie or beat it with at most ``n_max``
  nodes (its price per node fixed), i.e. with a rate per copy of at least target x headroom / (n_max x copies per
  node). If even one node costs more (n_max = 0) it is pruned without a simulation; otherwise one run at that rate
  decides: if the SLOs fail there, its capacity is below it and it is pruned after that one run. A short run's
  saturated throughput is *not* an upper bound on the rate within the SLOs, so pruning never relies on it.
- **dominated splits** are not enumerated (``splits_of``, listed in ``dominated`` with why).
- **warm starts**: configurations that differ only in knob values form a family; its first in grid order runs
  ``studies.capacity.capacity`` as it is (cold), the others start their bisection from a bracket around their own
  saturated rate times the family's ratio (rate within the SLOs / saturated rate).

Configurations are searched cheapest estimate first (the saturated rate times the ratios found so far), so a good
best is known early and pruning bites; the order changes which configurations are pruned, never the best one.

Configurations run as tasks on a backend (``studies.backends``: a local process pool or Ray), each one capacity
search or one fleet check, results as plain dicts. ``search`` returns a plain dict: ``configs`` (best first),
``best_by_gpu``, ``best_by_serving``, ``searched``, ``skipped`` (with why), ``pruned``, ``dominated``, ``failed``,
``simulations`` (fleet checks and the runs at the target included), ``router``.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from batching.sim.metrics import saturated_capacity
from batching.sim.topology.disagg import Disagg
from batching.sim.topology.fleet import MAX_NODES, ROUTERS
from batching.sim.policy import KNOB_LIMITS, PRESETS, BatchingPolicy, with_knobs
from batching.sim.simulate import MAX_REQUESTS, Scenario, simulate
from batching.sim.hardware.kernel_tables import calibration_status
from batching.sim.hardware.specs import (GPU, GPUS, GPUS_PER_NODE, KV_BLOCK_TOKENS, PRECISIONS, TWO_NODE_GPUS,
                                         Deployment, Node)
from batching.studies.capacity import (CEILING_REACH, MAX_ITER, REL_TOL, SLO, binding_of, bracket_and_bisect, capacity,
                                       check_headroom, headroom_note, meets_slo, own_profile, slo_point, sustained,
                                       tail_label)
from batching.studies.disagg_capacity import SPLIT_TPS as TPS, skip_reason, splits_of
from batching.studies.pricing import DEFAULT_HEADROOM, copies_needed, default_gpu_hour_usd, price

AGG_TPS = (*TPS, TWO_NODE_GPUS)  # an aggregated replica may also span two 8-GPU nodes (TP 16)
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
ROUTER_DEFAULT = "least-outstanding"  # search()'s router for the fleet check
FLEET_TOP = 3  # configurations at the top of the ranking checked as a fleet
FLEET_EXTRA_NODES = 3  # nodes (TP 16: two-node copies) a fleet check adds one at a time before a row is not verified
ROUTER_NOTE = ("Nodes needed: first ⌈target × headroom / rate per node⌉, which assumes perfect load balancing "
               "across nodes; the top configurations (marked fleet ✓) were then simulated as a fleet of that many "
               "nodes behind the router at the target rate (× headroom), adding a node (TP 16: a two-node copy) "
               "while the fleet missed the SLOs (at most 3 more); their nodes and cost are the fleet's. The others "
               "keep the perfect-balance estimate.")


NO_FLEET_NOTE = ("Nodes needed = ⌈target × headroom / rate per node⌉: this assumes perfect load balancing across "
                 "nodes (no fleet was simulated: the fleet check was off).")


def router_note(router: str, fleet_top: int = FLEET_TOP) -> str:
    """ROUTER_NOTE and the router the fleet checks ran behind (NO_FLEET_NOTE when ``fleet_top`` is 0)."""
    if not fleet_top:
        return NO_FLEET_NOTE
    return (f"{ROUTER_NOTE} Router: {router} (a request-level policy, static or dynamic, runs round-robin: the "
            "other routers read replica state built for the continuous modes).")
LATENCY_NOTE = ("P99 TTFT and TPOT are at the target traffic: one copy (a node, or a prefill/decode split) "
                "carrying target / copies deployed for it (perfect balance); rows are ranked by cost, then by the "
                "capacity of the fleet deployed (more first), then by them.")
MARGIN_NOTE = ("Margin = target / the capacity of the fleet deployed (every copy its whole nodes hold at its highest "
               "rate within the SLOs): the share of it the target uses. $/M at capacity: one copy at that rate, no "
               "headroom. Output tok/s per GPU: at that rate.")
COST_NOTE = ("$ per million output tokens = nodes × GPUs per node × $ per GPU-hour / (target req/s × mean output "
             "tokens per request × 3600) × 10⁶: what serving the target costs, whole nodes included.")


# ---------------------------------------------------------------- the grid


SERVING = ("agg", "disagg", "both")  # what a search enumerates: aggregated nodes, prefill/decode splits, or both


@dataclass(frozen=True)
class Config:
    """One deployment to try: GPU (a preset name, or a custom GPU's key), precision, TP, a policy preset and knob
    values that change it (sorted (name, value) pairs). ``split`` (P, T, D, U): a prefill/decode split of P prefill
    instances of TP T and D decode instances of TP U inside one node (``tp`` is then the decode TP); None: an
    aggregated node of GPUs / TP replicas."""

    gpu: str
    precision: str
    tp: int
    policy: str
    knobs: tuple[tuple[str, float], ...] = ()
    split: tuple[int, int, int, int] | None = None

    @property
    def serving(self) -> str:
        return "agg" if self.split is None else "disagg"

    def knob_dict(self) -> dict:
        return {k: (int(v) if k in INT_KNOBS else float(v)) for k, v in self.knobs}

    def family(self) -> tuple:
        """Configurations that differ only in knob values."""
        return (self.gpu, self.precision, self.tp, self.policy, self.split)

    def gpus_per_copy(self, num_gpus: int) -> int:
        """GPUs one copy runs on: the whole node (aggregated; TP 16: its two nodes), or the split's P x T + D x U."""
        if self.split is None:
            return max(num_gpus, self.tp)
        p, t, d, u = self.split
        return p * t + d * u

    def copies_per_node(self, num_gpus: int) -> int:
        """Copies one node holds: 1 (aggregated: a node of replicas), or the splits that fit it side by side."""
        return 1 if self.split is None else num_gpus // self.gpus_per_copy(num_gpus)

    def nodes_per_copy(self, num_gpus: int) -> int:
        """Nodes one copy spans: 2 for a TP 16 replica over two 8-GPU nodes, else 1."""
        return -(-self.gpus_per_copy(num_gpus) // num_gpus) if self.split is None else 1

    def shape(self) -> str:
        if self.split is None:
            return f"tp{self.tp}" + (" over two nodes" if self.tp > GPUS_PER_NODE else "")
        p, t, d, u = self.split
        return f"{p}xTP{t} prefill + {d}xTP{u} decode"

    def label(self) -> str:
        knobs = "".join(f", {k}={v:g}" for k, v in self.knobs)
        return f"{self.gpu} {self.precision} {self.shape()} {self.policy}{knobs}"

    def to_dict(self, num_gpus: int) -> dict:
        split = None
        if self.split is not None:
            split = dict(zip(("prefill_instances", "prefill_tp", "decode_instances", "decode_tp"), self.split))
        return {"gpu": self.gpu, "precision": self.precision, "serving": self.serving,
                "tp": self.tp if self.split is None else None,
                "replicas_per_node": (num_gpus // self.tp if self.tp <= num_gpus else 0) if self.split is None
                else None, "split": split, "gpus_per_copy": self.gpus_per_copy(num_gpus),
                "copies_per_node": self.copies_per_node(num_gpus), "nodes_per_copy": self.nodes_per_copy(num_gpus),
                "policy": self.policy, "knobs": self.knob_dict()}


@dataclass(frozen=True)
class Grid:
    """The values to combine: every GPU × precision × TP × policy × knob values."""

    gpus: tuple[str, ...]
    precisions: tuple[str, ...] = ("bf16",)
    tps: tuple[int, ...] = TPS  # aggregated replicas' TP degrees (AGG_TPS: 16 on 8-GPU nodes only)
    policies: tuple[str, ...] = ("chunked",)
    knobs: tuple[tuple[str, tuple[float, ...]], ...] = ()
    serving: str = "agg"
    num_gpus: int = 8  # GPUs per node: the splits enumerated (serving disagg or both)

    def validate(self, custom_gpus: Mapping[str, GPU] | None = None) -> None:
        if self.serving not in SERVING:
            raise ValueError(f"serving={self.serving!r} is not allowed; allowed: {', '.join(SERVING)}")
        known = set(GPUS) | set(custom_gpus or {})
        for name, values, allowed in (("gpus", self.gpus, known), ("precisions", self.precisions, PRECISIONS),
                                      ("tp", self.tps, AGG_TPS), ("policies", self.policies, PRESETS)):
            if not values:
                raise ValueError(f"{name} is empty; give at least one of {', '.join(map(str, allowed))}")
            for v in values:
                if v not in allowed:
                    raise ValueError(f"{name}: {v!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
        if TWO_NODE_GPUS in self.tps and self.num_gpus != GPUS_PER_NODE:
            raise ValueError(f"tp: {TWO_NODE_GPUS} runs one replica over two {GPUS_PER_NODE}-GPU nodes; these nodes "
                             f"have {self.num_gpus} GPUs (allowed with num_gpus {GPUS_PER_NODE})")
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
        """Every configuration: the aggregated ones (serving agg or both), then each kept split (serving disagg or
        both) of a policy that can run split (iteration-level batching, no speculative decoding)."""
        out = []
        shapes: list[tuple[int, tuple | None]] = []
        if self.serving in ("agg", "both"):
            shapes += [(int(tp), None) for tp in self.tps]
        if self.serving in ("disagg", "both"):
            shapes += [(sp[3], sp) for sp in splits_of(self.num_gpus)[0]]
        for gpu, prec, pol in itertools.product(self.gpus, self.precisions, self.policies):
            mode = PRESETS[pol].mode
            used = [(k, vals) for k, vals in self.knobs if mode in SEARCH_KNOBS[k]]
            for tp, split in shapes:
                if split is not None and split_refusal(PRESETS[pol]):
                    continue
                for combo in itertools.product(*[vals for _, vals in used]):
                    knobs = tuple(sorted((k, float(v)) for (k, _), v in zip(used, combo)))
                    out.append(Config(gpu, prec, tp, pol, knobs, split))
        return list(dict.fromkeys(out))

    def refused(self) -> list[tuple[str, str]]:
        """(what, why) for the parts of the grid not enumerated: policies that cannot run split, dominated
        splits."""
        out = []
        if self.serving in ("disagg", "both"):
            for pol in self.policies:
                why = split_refusal(PRESETS[pol])
                if why:
                    out.append((f"{pol} split", why))
            for sp, why in splits_of(self.num_gpus)[1].items():
                out.append((Config("", "", sp[3], "", (), sp).shape(), why))
        return out

    def size(self) -> int:
        return len(self.configs())


def split_refusal(policy: BatchingPolicy) -> str | None:
    """Why a policy cannot run as a prefill/decode split (``studies.disagg_capacity.skip_reason``), or None."""
    return skip_reason(policy)


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
    gpus = TWO_NODE_GPUS if cfg.split is None and cfg.tp == TWO_NODE_GPUS else min(dep0.node.num_gpus, GPUS_PER_NODE)
    dep = Deployment(Node(gpu_spec(cfg.gpu, custom_gpus), gpus, cfg.tp), dep0.model, cfg.precision,
                     dep0.kv_dtype, dep0.gpu_memory_utilization, dep0.activation_reserve_bytes,
                     dep0.kv_cache_tokens)
    if dep.kv_cache_tokens is not None and dep.kv_cache_tokens > dep.kv_capacity_tokens_max > 0:
        dep = replace(dep, kv_cache_tokens=None)  # the override shrinks a cache; a smaller GPU's is already smaller
    dep.validate()
    pol = PRESETS[cfg.policy]
    if pol.mode == "continuous":
        pol = replace(pol, prefix_caching=base.policy.prefix_caching)
    pol = with_knobs(pol, **cfg.knob_dict())
    split = None
    if cfg.split is not None:
        split = Disagg(*cfg.split)
        split.validate(dep)
        split.check_policy(pol)
    return Scenario(dep, base.workload, pol, base.allreduce, disagg=split, engine=base.engine)


def fit_problem(sc: Scenario, longest_request: int, longest_prompt: int) -> str | None:
    """Why the requests cannot run on this scenario (one replica's KV cache or the token budget; for a split, a
    prefill instance's cache must hold the longest prompt and a decode instance's the longest request), or None."""
    dep, pol = sc.deployment, sc.policy
    roles = [("one replica", dep, longest_request)]
    if sc.disagg is not None:
        roles = [("one prefill instance", sc.disagg.deployment(dep, "prefill"), longest_prompt),
                 ("one decode instance", sc.disagg.deployment(dep, "decode"), longest_request)]
    for who, d, tokens in roles:
        if -(-tokens // KV_BLOCK_TOKENS) > d.kv_capacity_blocks:
            what = "request" if tokens == longest_request else "prompt"
            return (f"the longest {what} needs {tokens:,} tokens of KV cache but {who} holds "
                    f"{d.kv_capacity_tokens:,} ({d.model.name} in {d.precision} on {d.node.gpu.name}, "
                    f"tp={d.node.tp})")
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
    """The capacity search (``studies.capacity.bracket_and_bisect``) started from ``estimate`` (a similar
    configuration's answer) instead of the ceiling's FIRST_GUESS share. ``known``: points already simulated.
    Returns every point tried (``slo_point`` dicts)."""
    points = list(known or [])
    wl = sc.workload

    def probe(rate: float) -> dict:
        at = sc.with_workload(wl.with_rate(rate))
        p = slo_point(at, slo) if run is None else run(at)
        points.append(p)
        return p

    bracket_and_bisect(probe, lambda p: meets_slo(p, slo), ceiling, estimate, list(points), rel_tol, max_iter)
    return points


def copies_at_target(rate_per_copy: float, target_rate_req_s: float, headroom: float, copies_per_node: int,
                     nodes_per_copy: int = 1) -> tuple[int, int]:
    """(nodes, copies deployed) for the target: ⌈target x headroom / rate⌉ copies, in whole nodes of
    ``copies_per_node`` (or, TP 16, ``nodes_per_copy`` nodes per copy); every copy a whole node holds is
    deployed."""
    copies = copies_needed(target_rate_req_s, rate_per_copy, headroom)
    groups = math.ceil(copies / copies_per_node - 1e-9)
    return groups * nodes_per_copy, groups * copies_per_node


def at_target(sc: Scenario, slo: SLO, rate_per_copy: float, payload: dict) -> dict:
    """One copy at the rate it carries when the target traffic (no headroom) is spread evenly over the copies
    deployed for it: its P99 TTFT and TPOT and attainment there (what a user of that fleet sees)."""
    _, copies = copies_at_target(rate_per_copy, float(payload["target_rate_req_s"]), float(payload["headroom"]),
                                 int(payload.get("copies_per_node", 1)), int(payload.get("nodes_per_copy", 1)))
    rate = float(payload["target_rate_req_s"]) / copies
    p = slo_point(sc.with_workload(sc.workload.with_rate(rate)), slo)
    return {"rate_per_copy_req_s": rate, "copies": copies, "ttft_p99_s": float(p["ttft_p99_s"]),
            "tpot_p99_s": float(p["tpot_p99_s"]), "ttft_tail_s": float(p["ttft_tail_s"]),
            "tpot_tail_s": float(p["tpot_tail_s"]), "attainment": float(p["attainment"])}


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
            if not meets_slo(p, slo):  # some class misses its SLOs at the rate it needs (or the queue grows)
                return {"status": "pruned", "simulations": 1, "prune_rate_req_s": float(prune_rate),
                        "attainment_at_prune_rate": p["attainment"], "seconds": time.perf_counter() - started}
        if estimate is None and not known:
            res = capacity(sc, slo, ceiling=ceiling, rel_tol=rel_tol)
            pts = res.points
            best = None
            if res.max_rate_req_s > 0:
                row = pts.iloc[(pts["rate_req_s"] - res.max_rate_req_s).abs().argmin()]
                best = {k: float(row[k]) for k in ("rate_req_s", "steady_output_tok_s", "ttft_p99_s",
                                                   "tpot_p99_s", "goodput_req_s", "attainment")}
            out = {"status": "done", "simulations": res.rates_tried, "warm": False,
                   "max_rate_req_s": float(res.max_rate_req_s), "binding_slo": res.binding_slo,
                   "binding_class": res.binding_class}
        else:
            start = float(estimate) if estimate is not None else float(prune_rate)
            points = warm_capacity(sc, slo, ceiling, start, known, rel_tol=rel_tol)
            b = _best_point(points, slo)
            binding, cls = _binding(points, slo)
            best = None if b is None else {k: float(b[k]) for k in ("rate_req_s", "steady_output_tok_s",
                                                                     "ttft_p99_s", "tpot_p99_s", "goodput_req_s",
                                                                     "attainment")}
            out = {"status": "done", "simulations": len(points), "warm": True,
                   "max_rate_req_s": best["rate_req_s"] if best else 0.0, "binding_slo": binding,
                   "binding_class": cls}
        if out["max_rate_req_s"] > 0 and payload.get("target_rate_req_s"):
            out["at_target"] = at_target(sc, slo, out["max_rate_req_s"], payload)
            out["simulations"] += 1
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
    return {"status": "done", "simulations": 1, "ceiling_req_s": saturated_capacity(s)[0]}


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
    extra, nodes_per_copy (2 for TP 16: the fleet grows a copy, two nodes, at a time). Returns a plain dict:
    ``nodes`` (the first that met the SLOs, or None), ``tried`` (each run read); nodes count 8-GPU nodes."""
    sc: Scenario = payload["scenario"]
    slo: SLO = payload["slo"]
    npc = int(payload.get("nodes_per_copy", 1))
    start = int(payload["nodes"]) // npc  # the scenario's nodes: copies of npc nodes
    last = min(start + int(payload.get("extra", FLEET_EXTRA_NODES)), MAX_NODES)
    router = fleet_router(payload["router"], sc.policy)
    started = time.perf_counter()
    tried: list[dict] = []
    try:
        for n in range(start, last + 1):
            p = slo_point(fleet_scenario(sc, n, router, float(payload["rate_req_s"])), slo)
            ok = meets_slo(p, slo)
            tried.append({"nodes": n * npc, "meets_slo": ok, "attainment": float(p["attainment"]),
                          "sustained": sustained(p), "ttft_p99_s": float(p["ttft_p99_s"]),
                          "tpot_p99_s": float(p["tpot_p99_s"]), "ttft_tail_s": float(p["ttft_tail_s"]),
                          "tpot_tail_s": float(p["tpot_tail_s"])})
            if ok:
                break
    except ValueError as exc:  # e.g. a trace that cannot be sped up to the target: not checked, with why
        return {"status": "skipped", "why": str(exc), "simulations": len(tried), "router": router,
                "tried": tried, "seconds": time.perf_counter() - started}
    ok = bool(tried) and tried[-1]["meets_slo"]
    return {"status": "done", "simulations": len(tried), "router": router, "tried": tried,
            "nodes": tried[-1]["nodes"] if ok else None,
            "last_nodes": tried[-1]["nodes"] if tried else (start - 1) * npc,
            "seconds": time.perf_counter() - started}


# ---------------------------------------------------------------- the search: setup and ledger


def check_prices(configs: Sequence[Config], gpu_hour_usd: Mapping[str, float] | None) -> dict[str, float]:
    """$ per GPU-hour of every GPU searched: the one given, else the default table's (``pricing``); ValueError
    naming the GPU, the value and the allowed range."""
    given = dict(gpu_hour_usd or {})
    out = {}
    for gpu in dict.fromkeys(c.gpu for c in configs):
        if gpu not in given:
            try:
                out[gpu] = default_gpu_hour_usd(gpu)
            except ValueError:
                raise ValueError(f"gpu_hour_usd has no price for {gpu} and no default exists; give one, e.g. "
                                 f"{gpu}=2.5") from None
            continue
        v = given[gpu]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_GPU_HOUR_USD:
            raise ValueError(f"gpu_hour_usd {gpu}={v!r} is out of range; allowed > 0 to {MAX_GPU_HOUR_USD:g}")
        out[gpu] = float(v)
    return out


@dataclass(frozen=True)
class Setup:
    """What every stage reads: the question (scenario, SLOs, target, prices, headroom) and how to search."""

    base: Scenario
    slo: SLO
    target_rate_req_s: float
    prices: dict[str, float]
    headroom: float
    num_gpus: int
    mean_output: float
    longest_request: int
    longest_prompt: int
    custom_gpus: Mapping[str, GPU] | None
    rel_tol: float
    router: str
    fleet_top: int
    prune: bool
    warm: bool

    def nodes(self, cfg: Config, rate_per_copy: float) -> int:
        return copies_at_target(rate_per_copy, self.target_rate_req_s, self.headroom,
                                cfg.copies_per_node(self.num_gpus), cfg.nodes_per_copy(self.num_gpus))[0]

    def price(self, cfg: Config, rate_per_copy: float, nodes: int | None = None):
        """``pricing.price`` of this configuration (nodes: the whole nodes its copies need, or those given)."""
        if nodes is None and rate_per_copy > 0:
            nodes = self.nodes(cfg, rate_per_copy)
        return price(rate_per_copy, cfg.gpus_per_copy(self.num_gpus), self.num_gpus, self.target_rate_req_s,
                     self.prices[cfg.gpu], self.mean_output, self.headroom, nodes=nodes)

    def cost(self, cfg: Config, nodes: int) -> float:
        """$ per million output tokens at the target of ``nodes`` nodes of this configuration's GPU."""
        return nodes * self.num_gpus * self.prices[cfg.gpu] / (self.target_rate_req_s * self.mean_output
                                                              * 3600.0) * 1e6

    def node_usd_per_hour(self, cfg: Config) -> float:
        return self.num_gpus * self.prices[cfg.gpu]


@dataclass
class Ledger:
    """What the stages found besides the rows: skipped (with why), pruned (with why), failed; simulations run;
    progress."""

    num_gpus: int
    progress: Callable[[int, int, str], None] | None = None
    skipped: list[dict] = field(default_factory=list)
    pruned: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    simulations: int = 0
    done: int = 0
    total: int = 0

    def tick(self, text: str, steps: int = 1) -> None:
        self.done += steps
        if self.progress:
            self.progress(min(self.done, self.total), self.total, text)

    def skip(self, cfg: Config, why: str, reason: str = "does not fit") -> None:
        self.skipped.append(cfg.to_dict(self.num_gpus) | {"label": cfg.label(), "reason": reason, "why": why})

    def fail(self, cfg: Config, failure, stage: str | None = None) -> None:
        extra = {"stage": stage, "error": f"{stage}: {failure.error}"} if stage else {"error": failure.error}
        self.failed.append(cfg.to_dict(self.num_gpus) | {"label": cfg.label(), "tries": failure.tries} | extra)


# ---------------------------------------------------------------- stage 1: the grid, what fits


# how a deployment's error names a TP 16 replica over two nodes (specs.Deployment: the run command's flags)
_TWO_NODE_HINT = f"tp={TWO_NODE_GPUS} over two nodes (num_gpus={TWO_NODE_GPUS})"


def search_words(why: str, searched_tps: set[int]) -> str:
    """A deployment's error in the search's words: its hint that the model fits a TP 16 replica over two nodes
    names the run command's --num-gpus; the search tries TP 16 only when 16 is among its TP degrees."""
    if _TWO_NODE_HINT not in why:
        return why
    words = (f"TP {TWO_NODE_GPUS} over two nodes (searched: its own rows)" if TWO_NODE_GPUS in searched_tps else
             f"TP {TWO_NODE_GPUS} over two nodes (not searched: add {TWO_NODE_GPUS} to the TP degrees, e.g. "
             f"--tp {GPUS_PER_NODE},{TWO_NODE_GPUS} or the page's Tensor parallel)")
    return why.replace(_TWO_NODE_HINT, words)


def fitting(setup: Setup, ledger: Ledger, configs: Sequence[Config]) -> dict[Config, Scenario]:
    """Each configuration's scenario, or skipped with why it does not fit (no simulation)."""
    out: dict[Config, Scenario] = {}
    tps = {cfg.tp for cfg in configs}
    for cfg in configs:
        try:
            if cfg.tp > setup.num_gpus and not (cfg.tp == TWO_NODE_GPUS and setup.num_gpus == GPUS_PER_NODE):
                raise ValueError(f"tp={cfg.tp} is more than the {setup.num_gpus} GPUs of a node")
            sc = config_scenario(setup.base, cfg, setup.custom_gpus)
        except ValueError as exc:
            ledger.skip(cfg, search_words(str(exc), tps))
            continue
        why = fit_problem(sc, setup.longest_request, setup.longest_prompt)
        if why:
            ledger.skip(cfg, why)
            continue
        out[cfg] = sc
    return out


def saturate(ledger: Ledger, backend, scenarios: Mapping[Config, Scenario]) -> dict[Config, float]:
    """Every configuration's saturated run (requests/s flat out): orders the search and scales warm starts."""
    from batching.studies.backends import run_tasks

    ceilings: dict[Config, float] = {}
    order = list(scenarios)

    def next_task():
        if not order:
            return None
        cfg = order.pop(0)
        return cfg, cfg.label(), ceiling_task, {"scenario": scenarios[cfg]}

    def got(cfg: Config, out: dict) -> None:
        ledger.simulations += out.get("simulations", 0)
        if out["status"] == "done":
            ceilings[cfg] = out["ceiling_req_s"]
            ledger.tick(f"{cfg.label()}: saturated run")
        else:
            ledger.skip(cfg, out["why"])
            ledger.tick(f"{cfg.label()}: does not fit", 2)

    def failed(cfg: Config, failure) -> None:
        ledger.fail(cfg, failure)
        ledger.tick(f"{cfg.label()}: failed", 2)

    run_tasks(backend, next_task, on_result=got, on_failure=failed)
    return ceilings


# ---------------------------------------------------------------- stages 2 and 3: prune, capacity


def prune_group(cfg: Config) -> tuple:
    """Pruning compares a configuration only with the best of its GPU and serving mode, so the best of every GPU
    type (and of aggregated and disaggregated serving) is found, with a cost, never pruned wholesale."""
    return (cfg.gpu, cfg.serving)


class CapacityStage:
    """The capacity searches, cheapest estimate first, each pruned when it cannot beat its group's best
    (``prune_group``); warm starts from the anchor of its family. Rows are plain dicts (``rows``)."""

    def __init__(self, setup: Setup, ledger: Ledger, scenarios: Mapping[Config, Scenario],
                 ceilings: Mapping[Config, float], configs: Sequence[Config]):
        self.setup, self.ledger, self.scenarios, self.ceilings = setup, ledger, scenarios, ceilings
        self.rows: dict[Config, dict] = {}
        self.ratios: dict[tuple, list[float]] = {}
        self.best: dict[tuple, float] = {}
        # warm starts read one fixed configuration per family (its first in grid order, searched cold), so each
        # answer does not depend on which task happened to finish first (the same on every backend)
        self.anchors: dict[tuple, Config] = {}
        for cfg in configs:
            if cfg in ceilings:
                self.anchors.setdefault(cfg.family(), cfg)
        self.anchor_ratio: dict[tuple, float | None] = {}
        self.pending = list(ceilings)

    def ratio_for(self, cfg: Config) -> float | None:
        for key in (("family",) + cfg.family(), ("policy", cfg.policy, cfg.serving), ("any",)):
            if self.ratios.get(key):
                return float(np.median(self.ratios[key]))
        return None

    def estimate_cost(self, cfg: Config) -> float:
        rate = self.ceilings[cfg] * (self.ratio_for(cfg) or 1.0)
        return self.setup.cost(cfg, self.setup.nodes(cfg, rate))

    def ready(self, cfg: Config) -> bool:
        return not self.setup.warm or self.anchors[cfg.family()] == cfg or cfg.family() in self.anchor_ratio

    def prune_rate(self, cfg: Config) -> tuple[float | None, str | None]:
        """(the least rate per copy at which it could cost at most its group's best, or None; why it is pruned
        without a simulation, or None)."""
        best = self.best.get(prune_group(cfg), math.inf)
        if not self.setup.prune or not math.isfinite(best):
            return None, None
        npc = cfg.nodes_per_copy(self.setup.num_gpus)
        one = self.setup.cost(cfg, npc)
        n_max = math.floor(best / one * (1 + 1e-12))  # copies (TP 16) or nodes it can afford
        if n_max < 1:
            what = "one node" if npc == 1 else f"one copy ({npc} nodes)"
            return None, (f"{what} costs ${one:,.4g} per million output tokens at the target, more than the best "
                          f"{cfg.gpu} {cfg.serving} configuration found (${best:,.4g})")
        rate = self.setup.target_rate_req_s * self.setup.headroom / (n_max * cfg.copies_per_node(self.setup.num_gpus))
        if rate > self.ceilings[cfg] * CEILING_REACH:
            return None, (f"it would need {rate:,.4g} req/s per copy to cost at most the best {cfg.gpu} "
                          f"{cfg.serving} configuration (${best:,.4g}), beyond what the capacity search can find")
        return rate, None

    def next_task(self):
        while True:
            self.pending.sort(key=lambda c: (self.estimate_cost(c), c.label()))
            cfg = next((c for c in self.pending if self.ready(c)), None)
            if cfg is None:
                return None  # the rest wait for their family's anchor (running now)
            self.pending.remove(cfg)
            rate, why = self.prune_rate(cfg)
            if why:
                self.drop(cfg, {"simulations": 0, "why": why})
                continue
            warm = self.setup.warm and self.anchors[cfg.family()] != cfg
            ratio = self.anchor_ratio.get(cfg.family()) if warm else None
            s = self.setup
            payload = {"scenario": self.scenarios[cfg], "slo": s.slo, "ceiling": self.ceilings[cfg],
                       "estimate": None if ratio is None else self.ceilings[cfg] * ratio, "prune_rate": rate,
                       "rel_tol": s.rel_tol, "target_rate_req_s": s.target_rate_req_s, "headroom": s.headroom,
                       "copies_per_node": cfg.copies_per_node(s.num_gpus),
                       "nodes_per_copy": cfg.nodes_per_copy(s.num_gpus)}
            return cfg, cfg.label(), search_task, payload

    def settle(self, cfg: Config, ratio: float | None) -> None:
        """The anchor of a family is done: its members may start (cold when it found no rate)."""
        if self.anchors.get(cfg.family()) == cfg:
            self.anchor_ratio[cfg.family()] = ratio

    def drop(self, cfg: Config, info: dict) -> None:
        self.ledger.pruned.append(cfg.to_dict(self.setup.num_gpus) | {"label": cfg.label()} | info)
        self.settle(cfg, None)
        self.ledger.tick(f"{cfg.label()}: pruned")

    def got(self, cfg: Config, out: dict) -> None:
        self.ledger.simulations += out.get("simulations", 0)
        if out["status"] == "pruned":
            self.drop(cfg, {"simulations": out["simulations"],
                            "why": f"the SLOs fail at {out['prune_rate_req_s']:,.4g} req/s per copy (attainment "
                                   f"{out['attainment_at_prune_rate'] * 100:.1f} %), the least it would need to cost "
                                   f"at most the best {cfg.gpu} {cfg.serving} configuration found"})
            return
        if out["status"] == "skipped":
            self.ledger.skip(cfg, out["why"])
            self.settle(cfg, None)
            self.ledger.tick(f"{cfg.label()}: does not fit")
            return
        rate = out["max_rate_req_s"]
        ceiling = self.ceilings[cfg]
        if rate > 0:
            for key in (("family",) + cfg.family(), ("policy", cfg.policy, cfg.serving), ("any",)):
                self.ratios.setdefault(key, []).append(rate / ceiling)
        row = capacity_row(self.setup, cfg, ceiling, out, self.scenarios[cfg])
        self.rows[cfg] = row
        self.settle(cfg, rate / ceiling if rate > 0 else None)
        if rate > 0:
            g = prune_group(cfg)
            self.best[g] = min(self.best.get(g, math.inf), row["usd_per_million_output_tokens"])
        self.ledger.tick(f"{cfg.label()}: {rate:,.3g} req/s per copy")

    def failed(self, cfg: Config, failure) -> None:
        if self.anchors.get(cfg.family()) == cfg:
            self.anchor_ratio[cfg.family()] = None
        self.ledger.fail(cfg, failure)
        self.ledger.tick(f"{cfg.label()}: failed")

    def run(self, backend) -> dict[Config, dict]:
        from batching.studies.backends import run_tasks

        run_tasks(backend, self.next_task, on_result=self.got, on_failure=self.failed)
        return self.rows


def plan_figures(setup: Setup, cfg: Config, rate_per_copy: float, nodes: int | None) -> dict:
    """What a planner reads beside the cost: the capacity of the fleet deployed for the target (every copy its
    whole nodes hold, each at its highest rate within the SLOs), the margin (the share of that capacity the target
    uses: 1 / margin is how far the traffic can grow before the fleet misses the SLOs, headroom included in the
    nodes) and the output tokens per second per GPU at capacity. None where no rate meets the SLOs."""
    if not rate_per_copy > 0 or nodes is None:
        return {"fleet_capacity_req_s": None, "margin": None, "output_tok_s_per_gpu": None}
    copies = nodes // cfg.nodes_per_copy(setup.num_gpus) * cfg.copies_per_node(setup.num_gpus)
    fleet = copies * rate_per_copy
    return {"fleet_capacity_req_s": fleet, "margin": setup.target_rate_req_s / fleet if fleet > 0 else None,
            "output_tok_s_per_gpu": rate_per_copy * setup.mean_output / cfg.gpus_per_copy(setup.num_gpus)}


def capacity_row(setup: Setup, cfg: Config, ceiling: float, out: dict, sc: Scenario) -> dict:
    """One searched configuration as a row: its capacity per copy, nodes and price (``pricing.price``), its
    P99 TTFT and TPOT at the target traffic (each copy carrying target / copies deployed), and whether every
    term its cost model needs is measured (``calibrated``, ``calibration_note``: why not)."""
    rate = out["max_rate_req_s"]
    calibrated, note = calibration_status(sc)
    b = out["best"] or {}
    t = out.get("at_target") or {}
    p = setup.price(cfg, rate)
    return cfg.to_dict(setup.num_gpus) | {
        "label": cfg.label(), "max_rate_req_s": rate, "nodes_needed": p.nodes,
        "usd_per_million_output_tokens": p.usd_per_million_output_tokens,
        "usd_per_million_output_tokens_at_capacity": p.usd_per_million_output_tokens_at_capacity,
        "usd_per_hour": p.usd_per_hour, "usd_per_node_hour": setup.node_usd_per_hour(cfg),
        "price": p.to_dict(), **plan_figures(setup, cfg, rate, p.nodes),
        "ttft_p99_s": t.get("ttft_p99_s"), "tpot_p99_s": t.get("tpot_p99_s"),
        # at the percentile the attainment target reads (``capacity.tail_label``: P90 for 0.9), at the target
        "ttft_tail_s": t.get("ttft_tail_s"), "tpot_tail_s": t.get("tpot_tail_s"),
        "attainment_at_target": t.get("attainment"), "rate_per_copy_at_target_req_s": t.get("rate_per_copy_req_s"),
        "ttft_p99_at_max_rate_s": b.get("ttft_p99_s"), "tpot_p99_at_max_rate_s": b.get("tpot_p99_s"),
        "steady_output_tok_s": b.get("steady_output_tok_s"),
        "binding_slo": out["binding_slo"], "binding_class": out["binding_class"],
        "meets_slo": rate > 0, "ceiling_req_s": ceiling, "simulations": out["simulations"] + 1,
        "warm_start": bool(out.get("warm")), "calibrated": calibrated, "calibration_note": note}


# ---------------------------------------------------------------- stage 4: the fleet check


class FleetStage:
    """The fleet check of the top of the ranking: the estimate's nodes behind the router at the target x
    headroom, one node more while the SLOs fail; re-ranked after each round, until the top ``fleet_top`` are all
    checked (at most 2 x fleet_top). A prefill/decode split is not simulated as a fleet (its copies keep the
    perfect-balance count)."""

    def __init__(self, setup: Setup, ledger: Ledger, rows: dict[Config, dict], scenarios: Mapping[Config, Scenario]):
        self.setup, self.ledger, self.rows, self.scenarios = setup, ledger, rows, scenarios
        for cfg, r in rows.items():
            r.update(nodes_needed_perfect_balance=r["nodes_needed"], fleet_checked=False, fleet_verified=None,
                     fleet_nodes_needed=None, fleet_ttft_p99_s=None, fleet_tpot_p99_s=None, fleet_ttft_tail_s=None,
                     fleet_tpot_tail_s=None, fleet_attainment=None,
                     fleet_nodes_tried=[], fleet_simulations=0, fleet_note=None,
                     router=fleet_router(setup.router, scenarios[cfg].policy) if cfg.split is None
                     else "disaggregated")

    def round(self, attempted: set[Config]) -> list[Config]:
        """The configurations of the top not yet checked that can be simulated as a fleet (the others noted)."""
        ranked = sorted((r for r in self.rows.values() if r["meets_slo"]), key=rank_key)
        by_label = {cfg.label(): cfg for cfg in self.rows}
        todo = [by_label[r["label"]] for r in ranked[:self.setup.fleet_top] if by_label[r["label"]] not in attempted]
        todo = todo[:max(0, 2 * self.setup.fleet_top - len(attempted))]
        for cfg in todo:
            attempted.add(cfg)
            n0 = self.rows[cfg]["nodes_needed"]
            npc = cfg.nodes_per_copy(self.setup.num_gpus)
            if cfg.split is not None:
                self.rows[cfg]["fleet_note"] = ("not simulated as a fleet: a prefill/decode split's copies are "
                                                "counted with perfect load balancing")
            elif n0 // npc > MAX_NODES:
                self.rows[cfg]["fleet_note"] = (f"not simulated as a fleet: {n0 // npc} copies, more than the "
                                                f"{MAX_NODES} a fleet simulation holds")
        return todo

    def got(self, cfg: Config, out: dict) -> None:
        self.ledger.simulations += out.get("simulations", 0)
        r = self.rows[cfg]
        r.update(fleet_simulations=r["fleet_simulations"] + out.get("simulations", 0),
                 fleet_nodes_tried=out.get("tried", []), router=out.get("router", r["router"]))
        if out["status"] != "done" or not out.get("tried"):
            r["fleet_note"] = f"not simulated as a fleet: {out.get('why', 'no run')}"
            self.ledger.tick(f"{cfg.label()}: fleet not simulated")
            return
        last = out["tried"][-1]
        r.update(fleet_checked=True, fleet_ttft_p99_s=last["ttft_p99_s"], fleet_tpot_p99_s=last["tpot_p99_s"],
                 fleet_ttft_tail_s=last.get("ttft_tail_s"), fleet_tpot_tail_s=last.get("tpot_tail_s"),
                 fleet_attainment=last["attainment"])
        if out["nodes"] is not None:
            n = int(out["nodes"])
            r.update(fleet_verified=True, fleet_nodes_needed=n)
            self.reprice(cfg, n)
            self.ledger.tick(f"{cfg.label()}: {n} node(s) behind {r['router']} meet the SLOs")
        else:
            n = int(out["last_nodes"]) + cfg.nodes_per_copy(self.setup.num_gpus)  # a lower bound: the last missed
            r.update(fleet_verified=False,
                     fleet_note=f"not verified: {out['last_nodes']} nodes behind {r['router']} still miss the SLOs "
                                f"(attainment {last['attainment'] * 100:.1f} %"
                                + ("" if last["sustained"] else ", the queue grows") + f"); {n} or more needed")
            self.reprice(cfg, n)
            self.ledger.tick(f"{cfg.label()}: not verified as a fleet")

    def reprice(self, cfg: Config, nodes: int) -> None:
        r = self.rows[cfg]
        p = self.setup.price(cfg, r["max_rate_req_s"], nodes=nodes)
        r.update(nodes_needed=nodes, usd_per_million_output_tokens=p.usd_per_million_output_tokens,
                 usd_per_hour=p.usd_per_hour, price=p.to_dict(),
                 **plan_figures(self.setup, cfg, r["max_rate_req_s"], nodes))

    def failed(self, cfg: Config, failure) -> None:
        self.rows[cfg]["fleet_note"] = f"the fleet check failed on a worker: {failure.error}"
        self.ledger.fail(cfg, failure, "fleet check")
        self.ledger.tick(f"{cfg.label()}: fleet check failed")

    def run(self, backend) -> None:
        from batching.studies.backends import run_tasks

        attempted: set[Config] = set()
        rate_all = self.setup.target_rate_req_s * self.setup.headroom
        while True:
            batch = self.round(attempted)
            if not batch:
                return
            queue = [c for c in batch if c.split is None and self.rows[c]["fleet_note"] is None]
            self.ledger.total += len(queue)

            def next_task():
                if not queue:
                    return None
                cfg = queue.pop(0)
                payload = {"scenario": self.scenarios[cfg], "slo": self.setup.slo,
                           "nodes": self.rows[cfg]["nodes_needed"], "router": self.setup.router,
                           "rate_req_s": rate_all, "extra": FLEET_EXTRA_NODES,
                           "nodes_per_copy": cfg.nodes_per_copy(self.setup.num_gpus)}
                return cfg, f"{cfg.label()} (fleet)", fleet_task, payload

            run_tasks(backend, next_task, on_result=self.got, on_failure=self.failed)


# ---------------------------------------------------------------- stage 5: the ranking


PARETO_KEYS = ("usd_per_million_output_tokens", "ttft_p99_s", "tpot_p99_s", "fleet_capacity_req_s")
MAXIMISED = ("fleet_capacity_req_s",)  # more is better: compared negated


def pareto(rows: Sequence[dict], keys: Sequence[str] = PARETO_KEYS) -> list[bool]:
    """Whether each row is on the Pareto front: no other row is at least as good in every key and better in one
    (lower cost and latencies, more capacity of the fleet deployed)."""
    def val(r: dict, k: str) -> float:
        v = _num(r.get(k))
        return (-v if math.isfinite(v) else math.inf) if k in MAXIMISED else v

    vals = np.array([[val(r, k) for k in keys] for r in rows], float) if rows else np.zeros((0, len(keys)))
    out = []
    for i in range(len(rows)):
        other = np.delete(vals, i, axis=0)
        dominated = np.any(np.all(other <= vals[i], axis=1) & np.any(other < vals[i], axis=1))
        out.append(not bool(dominated))
    return out


def _num(v) -> float:
    return math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def rank_key(row: dict) -> tuple:
    """Cost at the target; among equal costs (whole nodes make them common) the fleet with more capacity first (the
    target then uses less of it, so it has more room to grow); then the lower P99 TTFT and P99 TPOT at the target
    traffic, then the label: the first row is therefore always on the Pareto front (``pareto``)."""
    cap = _num(row.get("fleet_capacity_req_s"))
    return (row["usd_per_million_output_tokens"], -cap if math.isfinite(cap) else math.inf, _num(row["ttft_p99_s"]),
            _num(row["tpot_p99_s"]), row["label"])


def _share(v) -> str:
    return "-" if v is None else f"{v * 100:,.0f} %"


def _ms(v) -> str:
    return "-" if v is None else (f"{v:,.2f} s" if v >= 10 else f"{v * 1e3:,.0f} ms")


def why_lost(row: dict, top: dict) -> str | None:
    """Why ``row`` is not the answer ``top`` is (None when it is)."""
    if row["label"] == top["label"]:
        return None
    c, t = row["usd_per_million_output_tokens"], top["usd_per_million_output_tokens"]
    if c > t * (1 + 1e-9):
        return (f"costs ${c:,.4g} per million output tokens against ${t:,.4g} ({row['nodes_needed']} node(s) at "
                f"${row['usd_per_node_hour']:,.4g}/h against {top['nodes_needed']} at ${top['usd_per_node_hour']:,.4g}"
                f"/h; {row['max_rate_req_s']:,.3g} against {top['max_rate_req_s']:,.3g} req/s per copy)")
    rc, tc = _num(row.get("fleet_capacity_req_s")), _num(top.get("fleet_capacity_req_s"))
    if rc < tc * (1 - 1e-9):
        return (f"the same cost (${c:,.4g} per million output tokens) with less capacity: its {row['nodes_needed']} "
                f"node(s) carry {rc:,.3g} req/s within the SLOs (the target uses {_share(row.get('margin'))}) "
                f"against {tc:,.3g} ({_share(top.get('margin'))})")
    return (f"the same cost (${c:,.4g} per million output tokens) and capacity with P99 TTFT "
            f"{_ms(row['ttft_p99_s'])} and TPOT {_ms(row['tpot_p99_s'])} at the target, against "
            f"{_ms(top['ttft_p99_s'])} and {_ms(top['tpot_p99_s'])}")


def rounding_note(good: Sequence[dict]) -> str | None:
    """One sentence when whole-node rounding decided the ranking: the cheapest row at the target is not the
    cheapest at capacity (its nodes are emptier than another's would be), or None."""
    if len(good) < 2:
        return None
    top = good[0]
    at_cap = [r for r in good if r.get("usd_per_million_output_tokens_at_capacity") is not None]
    if not at_cap or top.get("usd_per_million_output_tokens_at_capacity") is None:
        return None
    lean = min(at_cap, key=lambda r: (r["usd_per_million_output_tokens_at_capacity"], r["label"]))
    a, b = top["usd_per_million_output_tokens_at_capacity"], lean["usd_per_million_output_tokens_at_capacity"]
    if lean is top or not b < a * (1 - 1e-9):
        return None

    def nodes(r: dict) -> str:
        return f"{r['nodes_needed']} node{'s' if r['nodes_needed'] != 1 else ''}"

    return (f"Whole-node rounding decided the ranking: {top['label']} costs least at the target "
            f"(${top['usd_per_million_output_tokens']:,.3f} per million output tokens on {nodes(top)}, the target "
            f"using {_share(top.get('margin'))} of their capacity), but {lean['label']} costs least at capacity "
            f"(${b:,.3f} against ${a:,.3f}): its {nodes(lean)} for this target "
            f"(${lean['usd_per_million_output_tokens']:,.3f} at the target) would run at {_share(lean.get('margin'))} "
            "of their capacity, so whole nodes, not the hardware, decided; with more traffic the order can turn.")


def _tail(tail: str, name: str) -> str:
    """A row's key of ``name`` at the percentile ``tail`` names: '..._p99_s' for P99, '..._tail_s' otherwise."""
    return f"{name}_p99_s" if tail == "P99" else f"{name}_tail_s"


def _p(x: float | None, scale: float, unit: str, digits: str) -> str:
    return "n/a" if x is None else f"{x * scale:{digits}} {unit}"


def chosen_sentence(c: dict, target_rate_req_s: float, headroom: float, tail: str = "P99") -> str:
    """A row in plain words, each latency said where it was read: the capacity per copy, the nodes and cost for the
    target, the fleet check (the whole fleet at target x headroom) and the P99s of one copy at its share of the
    target (target / copies, perfect balance)."""
    n = c["nodes_needed"]
    text = (f"{c['max_rate_req_s']:,.3g} req/s per copy within the SLOs; {n} node{'s' if n != 1 else ''} for "
            f"{target_rate_req_s:,.4g} req/s, ${c['usd_per_million_output_tokens']:,.3f} per million output tokens")
    if c.get("fleet_checked"):
        rate_all = target_rate_req_s * headroom
        how = "met" if c.get("fleet_verified") else "still missed"
        tried = c.get("fleet_nodes_tried") or []
        text += (f". Fleet check: {tried[-1]['nodes'] if tried else n} nodes behind {c['router']} {how} the SLOs at "
                 f"{rate_all:,.4g} req/s (the target × {headroom:g} headroom), the whole fleet's {tail} TTFT {_p(c.get(_tail(tail, 'fleet_ttft')), 1, 's', ',.3f')} "
                 f"and {tail} TPOT {_p(c.get(_tail(tail, 'fleet_tpot')), 1e3, 'ms', ',.1f')} there")
    else:
        text += " (perfect load balancing assumed: not simulated as a fleet)"
    per_copy = c.get("rate_per_copy_at_target_req_s")
    if per_copy:
        copies = round(target_rate_req_s / per_copy)
        text += (f". At the target without headroom, one copy carrying {per_copy:,.3g} req/s (the target / {copies:,} "
                 f"cop{'y' if copies == 1 else 'ies'}, perfect balance): {tail} TTFT "
                 f"{_p(c.get(_tail(tail, 'ttft')), 1, 's', ',.3f')}, {tail} TPOT "
                 f"{_p(c.get(_tail(tail, 'tpot')), 1e3, 'ms', ',.1f')}")
    return text + "."


def best_per(good: Sequence[dict], key: str, values: Sequence[str], ledger: Ledger) -> list[dict]:
    """The best row of each value of ``key`` (a GPU, or a serving mode) with why it lost to the overall best; a
    value without a row says why (nothing fits, nothing meets the SLOs, or every configuration failed)."""
    out = []
    top = good[0] if good else None
    for v in values:
        row = next((r for r in good if r[key] == v), None)
        if row is not None:
            out.append({key: v, "label": row["label"], "rank": good.index(row) + 1,
                        "usd_per_million_output_tokens": row["usd_per_million_output_tokens"],
                        "nodes_needed": row["nodes_needed"], "max_rate_req_s": row["max_rate_req_s"],
                        "ttft_p99_s": row["ttft_p99_s"], "tpot_p99_s": row["tpot_p99_s"],
                        "why_not_best": why_lost(row, top)})
            continue
        reasons = sorted({s["reason"] for s in ledger.skipped if s.get(key) == v})
        fails = [f for f in ledger.failed if f.get(key) == v]
        why = ("no configuration meets the SLOs" if "no rate meets the SLOs" in reasons else
               "no configuration fits" if reasons else
               "every configuration failed on a worker" if fails else "nothing of it was searched")
        out.append({key: v, "label": None, "rank": None, "usd_per_million_output_tokens": None,
                    "nodes_needed": None, "max_rate_req_s": None, "ttft_p99_s": None, "tpot_p99_s": None,
                    "why_not_best": why})
    return out


def ranked(ledger: Ledger, rows: Mapping[Config, dict]) -> tuple[list[dict], list[dict]]:
    """(the rows that meet the SLOs best first, Pareto front marked; those that do not, also listed as skipped)."""
    good = sorted((r for r in rows.values() if r["meets_slo"]), key=rank_key)
    for r, on in zip(good, pareto(good)):
        r["pareto"] = on
    bad = sorted((r for r in rows.values() if not r["meets_slo"]), key=lambda r: r["label"])
    for r in bad:
        r["pareto"] = False
        ledger.skipped.append({k: r[k] for k in ("gpu", "precision", "serving", "tp", "replicas_per_node", "split",
                                                 "policy", "knobs", "label")}
                              | {"reason": "no rate meets the SLOs",
                                 "why": "no rate tried meets the SLOs, even the lowest (binding: "
                                        f"{r['binding_slo'] or 'none'}" + (f", class {r['binding_class']}"
                                                                           if r["binding_class"] else "") + ")"})
    return good, bad


# ---------------------------------------------------------------- the search


def search(base: Scenario, slo: SLO, target_rate_req_s: float, gpu_hour_usd: Mapping[str, float] | None, grid: Grid, *,
           backend=None, prune: bool = True, warm: bool = True, headroom: float = DEFAULT_HEADROOM,
           custom_gpus: Mapping[str, GPU] | None = None, rel_tol: float = REL_TOL,
           progress: Callable[[int, int, str], None] | None = None, router: str = ROUTER_DEFAULT,
           fleet_top: int = FLEET_TOP) -> dict:
    """Search the grid on ``base``'s model and workload (its rate is what each capacity search varies); see the
    module's docstring. Stages: the grid and what fits (``fitting``), the saturated runs (``saturate``), the
    capacity searches with pruning (``CapacityStage``), the fleet check (``FleetStage``), the ranking
    (``ranked``, ``best_per``). ``gpu_hour_usd``: $ per GPU-hour by GPU; a GPU not given takes the default
    table's (``pricing.default_gpu_hour_usd``). ``backend``: a ``studies.backends`` backend (left open), or a
    function of the number of configurations to run that makes one (called only when some configuration fits;
    closed at the end), default a local process pool. ``router``: the router the fleet checks run behind;
    ``fleet_top``: how many of the top configurations to check as a fleet (0: none). Returns a plain dict."""
    from batching.studies.backends import NothingToRun, make_backend
    from batching.studies.capacity import class_names

    started = time.perf_counter()
    if router not in ROUTERS:
        raise ValueError(f"router={router!r} is not allowed; allowed: {', '.join(ROUTERS)}")
    if isinstance(fleet_top, bool) or not isinstance(fleet_top, int) or not 0 <= fleet_top <= MAX_CONFIGS:
        raise ValueError(f"fleet_top={fleet_top!r} is out of range; allowed a whole number from 0 to {MAX_CONFIGS}")
    num_gpus = min(base.deployment.node.num_gpus, GPUS_PER_NODE)  # a TP 16 scenario's nodes: 8 GPUs each
    if grid.num_gpus != num_gpus:
        grid = replace(grid, num_gpus=num_gpus)
    grid.validate(custom_gpus)
    slo.validate()
    headroom = check_headroom(headroom)
    if isinstance(target_rate_req_s, bool) or not isinstance(target_rate_req_s, (int, float)) \
            or not 0 < target_rate_req_s < math.inf:
        raise ValueError(f"target_rate_req_s={target_rate_req_s!r} is out of range; allowed > 0")
    configs = grid.configs()
    prices = check_prices(configs, gpu_hour_usd)
    base.workload.validate()
    reqs, _ = base.requests()  # the requests the model serves (those beyond its context are rejected, never run)
    slo.validate(len(class_names(base)))
    setup = Setup(base, slo, float(target_rate_req_s), prices, headroom, num_gpus, float(np.mean(reqs.output_tokens)),
                  int(np.max(reqs.prompt_tokens + reqs.output_tokens)), int(np.max(reqs.prompt_tokens)),
                  custom_gpus, rel_tol, router, fleet_top, prune, warm)
    ledger = Ledger(num_gpus, progress)
    dominated = [{"label": what, "why": why} for what, why in grid.refused()]

    scenarios = fitting(setup, ledger, configs)
    own = not hasattr(backend, "submit")  # None or a factory: the backend is made here, for what fits
    if own:
        make = backend or (lambda tasks: make_backend("local", tasks=tasks))
        backend = make(len(scenarios)) if scenarios else NothingToRun()
    ledger.total = 2 * len(scenarios)
    try:
        ceilings = saturate(ledger, backend, scenarios)
        rows = CapacityStage(setup, ledger, scenarios, ceilings, configs).run(backend)
        FleetStage(setup, ledger, rows, scenarios).run(backend)
    finally:
        if own:
            backend.close()

    good, bad = ranked(ledger, rows)
    gpus = list(dict.fromkeys(c.gpu for c in configs))
    servings = list(dict.fromkeys(c.serving for c in configs))
    return {
        "configs": good + bad,
        "best_by_gpu": best_per(good, "gpu", gpus, ledger),
        "best_by_serving": best_per(good, "serving", servings, ledger),
        "serving": grid.serving,
        "searched": len(rows),
        "grid_size": len(configs),
        "skipped": ledger.skipped,
        "pruned": ledger.pruned,
        "dominated": dominated,
        "failed": ledger.failed,
        "simulations": ledger.simulations,
        "seconds": time.perf_counter() - started,
        "backend": backend.describe(),
        "target_rate_req_s": setup.target_rate_req_s,
        "gpu_hour_usd": dict(prices),
        "headroom": headroom,
        "num_gpus_per_node": num_gpus,
        "mean_output_tokens": setup.mean_output,
        "slo": slo.to_dict(),
        "router": router,
        "fleet_top": fleet_top,
        "notes": [router_note(router, fleet_top), COST_NOTE, LATENCY_NOTE, MARGIN_NOTE],
        "rounding_note": rounding_note(good),
        "headroom_note": headroom_note(headroom, own_profile(base)),
        "tail": tail_label(slo.attainment),  # the percentile the tables show: the attainment target's
    }
