"""SLO-driven capacity: the highest request rate per node that meets the SLOs, and what it costs.

With closed-loop clients (a workload with ``concurrency``: vllm bench serve --max-concurrency) there is no rate to
set: ``capacity`` then searches the highest concurrency within the SLOs instead (``capacity_concurrency``: doubling,
then integer bisection, the same ``meets_slo`` rule), and the rate it reports is the request rate those clients
send.

An SLO gives each latency target (TTFT, TPOT, E2E) either one value for every priority class or one value per
class, class 0 (the highest priority) first; a request meets the targets of its own class. The attainment is
the share of a class's requests that meet its targets, and a rate is within the SLOs only if *every* class
reaches the asked attainment (the overall share can pass while the interactive class fails its own SLO); the
binding class is the one that falls short first. ``by_priority`` reports each class's own share, goodput and P99s.

What it costs is ``studies.pricing.price`` (the one pricing rule): $ per million output tokens at the target
traffic from the fleet's $/h and the workload's mean output tokens per request, and at capacity as a second
figure; the default $/GPU-hour is the scenario's GPU's row of the price table (``default_price``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from batching.sim.metrics import saturated_capacity
from batching.sim.hardware.specs import GPUS
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.traces import MAX_PRIORITY_LEVELS
from batching.sim.workload.requests import INTERACTIVE_CHAT
from batching.studies import pricing
from batching.studies.compare import QUEUE_GROWTH_TOLERANCE, Progress
from batching.studies.pricing import DEFAULT_HEADROOM

SLO_MAX_S = 3600.0  # the longest latency an SLO may set (the CLI's and the dashboard's inputs read it)
ATTAINMENT_DEFAULT = 0.99
SLO_NAMES = ("ttft_s", "tpot_s", "e2e_s")
SLO_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}

# The default SLOs (the Capacity and Tune pages, ``sweep`` without SLO flags): the mixed workload's chat
# targets (workload.INTERACTIVE_CHAT: first token within 1 s, 100 ms per output token) for class 0, and a
# first token within 30 s for every lower class (background work such as batch analysis), 100 ms per token.
DEFAULT_TOP_TTFT_S = float(INTERACTIVE_CHAT.slo_ttft_s)
DEFAULT_LOWER_TTFT_S = 30.0
DEFAULT_TPOT_S = float(INTERACTIVE_CHAT.slo_tpot_s)

# The cost model's known error (docs/CALIBRATION.md, "End to end"; ``calibration.end_to_end()``): the simulated
# median TPOT of Llama-3.1-70B on 4xH100 is 17 % to 27 % below the published vLLM v0.6.0 and SGLang v0.3.0
# runs (-16.6 % / -21.4 % at 4 req/s, -17.3 % / -27.1 % at 8 req/s, since pure-decode steps replay one CUDA graph).
# A real node is that much slower per token, so it sustains about (1 - error) of the simulated rate: plan for
# 1 / (1 - error) the nodes and the cost.
TPOT_UNDERESTIMATE = (0.17, 0.27)
HEADROOM_RANGE = tuple(round(1.0 / (1.0 - e), 2) for e in TPOT_UNDERESTIMATE)  # (1.2, 1.37)
# the one headroom default of every surface is pricing.DEFAULT_HEADROOM (1.25, inside the range)
HEADROOM_LIMITS = (1.0, 3.0)  # 1 = trust the simulator


def headroom_note(headroom: float, own_profile: str | None = None) -> str:
    """One sentence for every plan that uses the headroom: that it applies, its value, and where the default comes
    from. ``own_profile``: the name of an engine profile the user gave (a ``calibrate --fit`` output, an upload): the
    default was sized for the stock profiles' error, which a fit to a measured run has already removed."""
    h = check_headroom(headroom)
    if h == 1:
        return "Headroom 1× (none): nodes are planned for the simulated rate as it stands."
    text = (f"Headroom {h:g}× applies: nodes, and the $ at the target, are planned for {h:g}× the target traffic")
    if h != DEFAULT_HEADROOM:
        return text + "."
    text += (f" (the default, for the stock cost model's known error: its TPOT is {TPOT_UNDERESTIMATE[0] * 100:.0f}-"
             f"{TPOT_UNDERESTIMATE[1] * 100:.0f} % below published vLLM and SGLang runs, docs/CALIBRATION.md)")
    if own_profile:
        text += (f"; the engine profile {own_profile!r} is your own (e.g. fitted by calibrate --fit), so that error "
                 "may already be gone: give the fit's remaining error as the headroom (1 for none)")
    return text + "."


def own_profile(scenario: Scenario) -> str | None:
    """The name of the scenario's engine profile when the user gave it (``--profile FILE``, an upload), None for a
    stock engine."""
    from batching.sim.hardware.engines import ENGINES

    eng = scenario.engine
    if isinstance(eng, str) or any(eng == p for p in ENGINES.values()):
        return None
    return scenario.profile.name


PerClass = float | tuple[float, ...] | None


def _fmt_latency(name: str, v: float) -> str:
    if name == "e2e_s" or v >= 10:
        return f"{v:,.3g} s"
    return f"{v * 1e3:,.0f} ms"


@dataclass(frozen=True)
class SLO:
    """Latency targets (seconds) and the share of requests that must meet them. Each target is None (no such
    SLO), one value (every class) or a tuple with one value per priority class, class 0 first."""

    ttft_s: PerClass = None
    tpot_s: PerClass = None
    e2e_s: PerClass = None
    attainment: float = ATTAINMENT_DEFAULT  # share of requests that must meet every SLO of their class (> 0 to 1)

    def __post_init__(self) -> None:
        for name in SLO_NAMES:
            v = getattr(self, name)
            if isinstance(v, (list, tuple, np.ndarray)):
                v = tuple(float(x) if isinstance(x, (int, float, np.number)) else x for x in v)
                object.__setattr__(self, name, v[0] if len(v) == 1 else v)

    def validate(self, num_classes: int | None = None) -> None:
        """ValueError naming the target, its value and the allowed range; with ``num_classes``, a per-class
        target must have one value per class."""
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("give at least one SLO: ttft_s, tpot_s or e2e_s")
        for name in SLO_NAMES:
            v = getattr(self, name)
            if v is None:
                continue
            values = v if isinstance(v, tuple) else (v,)
            if not values:
                raise ValueError(f"slo {name} is empty; give one value (every class) or one per class")
            if len(values) > MAX_PRIORITY_LEVELS:
                raise ValueError(f"slo {name} has {len(values)} values; allowed 1 to {MAX_PRIORITY_LEVELS}")
            for i, x in enumerate(values):
                where = f"{name}[{i}]" if isinstance(v, tuple) else name
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 < x <= SLO_MAX_S):
                    raise ValueError(f"slo {where}={x!r} is out of range; allowed > 0 to {SLO_MAX_S:g}")
            if num_classes is not None and isinstance(v, tuple) and len(v) != num_classes:
                want = "one value" if num_classes == 1 else \
                    f"one value (every class) or {num_classes}, class 0 first"
                raise ValueError(f"slo {name} has {len(v)} values for {num_classes} "
                                 f"class{'es' if num_classes != 1 else ''}; give {want}")
        if not (0 < self.attainment <= 1):
            raise ValueError(f"attainment={self.attainment!r} is out of range; allowed > 0 to 1")

    @property
    def per_class(self) -> bool:
        """Whether any target differs by class."""
        return any(isinstance(getattr(self, n), tuple) for n in SLO_NAMES)

    def items(self):
        """(name, value) of the targets given; a value is a float or a tuple per class."""
        return [(k, getattr(self, k)) for k in SLO_NAMES if getattr(self, k) is not None]

    def limits(self, name: str, num_classes: int) -> np.ndarray | None:
        """One threshold per class (seconds), or None when there is no such SLO."""
        v = getattr(self, name)
        if v is None:
            return None
        out = np.asarray(v if isinstance(v, tuple) else (v,) * num_classes, float)
        if len(out) != num_classes:
            self.validate(num_classes)
        return out

    def for_class(self, level: int) -> dict[str, float]:
        """The targets of one class: name -> seconds."""
        return {k: (v[level] if isinstance(v, tuple) else v) for k, v in self.items()}

    def describe(self, class_names: Sequence[str] | None = None) -> str:
        """'TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; TPOT ≤ 100 ms for 99 % of each class's
        requests'."""
        parts = []
        for name, v in self.items():
            if isinstance(v, tuple):
                names = list(class_names) if class_names is not None and len(class_names) == len(v) else \
                    [f"class {i}" for i in range(len(v))]
                each = ", ".join(f"{_fmt_latency(name, x)} for {n}" for x, n in zip(v, names))
                parts.append(f"{SLO_LABELS[name]} ≤ {each}")
            else:
                parts.append(f"{SLO_LABELS[name]} ≤ {_fmt_latency(name, v)}")
        return "; ".join(parts) + f" for {self.attainment * 100:.3g} % of each class's requests"

    def to_dict(self) -> dict:
        """JSON-ready: each target a number, a list per class or None."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in
               ((n, getattr(self, n)) for n in SLO_NAMES)}
        return out | {"attainment": self.attainment}


def default_slo(num_classes: int, attainment: float = ATTAINMENT_DEFAULT) -> SLO:
    """The SLOs the pages and ``sweep`` use unless told otherwise: TTFT ≤ 1 s for class 0 and ≤ 30 s for every
    lower class, TPOT ≤ 100 ms for every class, no E2E target."""
    if not isinstance(num_classes, int) or not 1 <= num_classes <= MAX_PRIORITY_LEVELS:
        raise ValueError(f"num_classes={num_classes!r} is out of range; allowed 1 to {MAX_PRIORITY_LEVELS}")
    ttft = (DEFAULT_TOP_TTFT_S,) + (DEFAULT_LOWER_TTFT_S,) * (num_classes - 1)
    return SLO(ttft_s=ttft, tpot_s=DEFAULT_TPOT_S, attainment=attainment)


def class_names(scenario: Scenario) -> tuple[str, ...]:
    """The scenario's priority classes by level (class 0 first)."""
    wl = scenario.workload
    classes = getattr(wl, "classes", None)
    if classes is not None:
        return tuple(c.name for c in sorted(classes, key=lambda c: c.priority))
    return tuple(wl.generate().class_names)


def per_class_values(text: str, high: float) -> tuple[float, ...]:
    """A comma list of targets as typed (in the input's own unit: ms or s), class 0 first, each above 0 and at
    most ``high``; ValueError with a one-line reason (the caller names the input)."""
    allowed = f"allowed > 0 to {high:,.10g}"
    text = str(text)
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise ValueError("it is empty; give one value (every class) or one per class, class 0 first, e.g. "
                         "1000,30000")
    if len(parts) > MAX_PRIORITY_LEVELS:
        raise ValueError(f"{len(parts):,} values; allowed 1 to {MAX_PRIORITY_LEVELS} (one per class)")
    out = []
    for p in parts:
        shown = repr(p if len(p) <= 40 else p[:40] + "...")
        if not p:
            raise ValueError(f"an empty value in {text.strip()[:80]!r}; give numbers separated by commas, "
                             "e.g. 1000,30000")
        if not p.isascii():
            raise ValueError(f"{shown} has characters other than ASCII (full-width digits?); write it with 0-9")
        try:
            v = float(p)
        except ValueError:
            raise ValueError(f"{shown} is not a number; {allowed}") from None
        if not math.isfinite(v):
            raise ValueError(f"{shown} is not a finite number; {allowed}")
        if not 0 < v <= high:
            raise ValueError(f"{p} is out of range; {allowed}")
        out.append(v)
    return tuple(out)


# ---------------------------------------------------------------- one rate


def tail_label(attainment: float) -> str:
    """The percentile that matches an attainment target, as tables name it: 0.99 -> 'P99', 0.9 -> 'P90', 0.999 ->
    'P99.9' (a class meets a single SLO exactly when this percentile of its latency is within it)."""
    return f"P{attainment * 100:.4g}"


def tail_key(name: str, attainment: float) -> str:
    """The reading's key of ``name`` ('ttft' or 'tpot') at the attainment's percentile: ``ttft_p99_s`` at the default
    0.99 (the summary's own P99), else ``ttft_tail_s`` (``slo_reading`` computes it at the attainment)."""
    return f"{name}_p99_s" if attainment == ATTAINMENT_DEFAULT else f"{name}_tail_s"


def slo_reading(res, slo: SLO) -> dict:
    """What a run (``SimResult``) gives against the SLOs: attainment overall, per SLO and per class
    (``by_priority``: each class's attainment, whether it meets ``slo.attainment``, goodput and latency
    percentiles), the lowest class attainment (``class_attainment``, what ``meets_slo`` holds to the target),
    goodput and the steady throughput (both over the arrival window, the drain not counted: ``metrics.steady_rate``)."""
    from batching.sim.metrics import percentile, slo_mask, steady_rate

    req = res.requests
    names = tuple(res.class_names)
    k = len(names)
    slo.validate(k)
    level = req["priority"].to_numpy()
    masks = {name: slo_mask(req, **{f"slo_{name}": slo.limits(name, k)[level]}) for name, _ in slo.items()}
    ok = np.logical_and.reduce(list(masks.values()))
    q = slo.attainment * 100  # the percentile the attainment target reads (``tail_label``)
    ttft_all, tpot_all = req["ttft_s"].to_numpy(float), req["tpot_s"].to_numpy(float)
    s = res.summary()
    by = {}
    for lvl, cls in enumerate(names):
        m = level == lvl
        if not m.any():
            continue
        lat = s["by_priority"].get(str(lvl), {})
        attained = float(ok[m].mean())
        by[str(lvl)] = {"class_name": cls, "num_requests": int(m.sum()), "slo": slo.for_class(lvl),
                        "attainment": attained, "meets_slo": attained >= slo.attainment,
                        "goodput_req_s": steady_rate(req, mask=ok & m),
                        "per_slo": {n: float(mask[m].mean()) for n, mask in masks.items()},
                        **{key: lat.get(key, float("nan")) for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                                                                       "tpot_p99_s")},
                        "ttft_tail_s": percentile(ttft_all[m], q), "tpot_tail_s": percentile(tpot_all[m], q)}
    overall = float(ok.mean())
    return {"rate_req_s": res.scenario.workload.rate_req_s, "attainment": overall,
            "class_attainment": min((c["attainment"] for c in by.values()), default=overall),
            "per_slo": {n: float(mask.mean()) for n, mask in masks.items()},
            "goodput_req_s": steady_rate(req, mask=ok),
            "steady_output_tok_s": s["steady_output_tok_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p99_s": s["tpot_p99_s"], "ttft_tail_s": percentile(ttft_all, q),
            "tpot_tail_s": percentile(tpot_all, q), "offered_req_s": s["offered_req_s"],
            "queue_growth_req_s": s["queue_growth_req_s"], "by_priority": by}


def sustained(p: dict) -> bool:
    """The node keeps up at this rate: its waiting queue does not grow through the run (by more than
    compare.QUEUE_GROWTH_TOLERANCE x the offered rate, the rule that marks a compared run overloaded). A run
    that falls behind can still meet a loose SLO while it is short (a 30 s TTFT target passes every request of
    a 10 s run), so a rate counts only if it is also sustained."""
    growth, offered = p.get("queue_growth_req_s", math.nan), p.get("offered_req_s", math.nan)
    return not (math.isfinite(growth) and math.isfinite(offered) and growth > QUEUE_GROWTH_TOLERANCE * offered)


def classes_meeting(p: dict, slo: SLO) -> bool:
    """Every class of the reading has ``slo.attainment`` of its own requests within its own SLOs (a reading
    without classes: all requests)."""
    by = p.get("by_priority") or {}
    if not by:
        return p["attainment"] >= slo.attainment
    return all(c["attainment"] >= slo.attainment for c in by.values())


def meets_slo(p: dict, slo: SLO) -> bool:
    """A rate passes: in every class, ``slo.attainment`` of its requests meet the class's SLOs, and the node keeps
    up. Counting all requests together would let a large class that meets its loose SLOs hide a small one that
    misses its tight ones."""
    return classes_meeting(p, slo) and sustained(p)


def binding_of(points: Sequence[dict], slo: SLO, key: str = "rate_req_s") -> tuple[str | None, str | None]:
    """(binding SLO, binding class) of a search's points at the lowest rate that fails: the class furthest below
    the attainment target there (None with one class) and, within it, the SLO its requests meet least. (None,
    None) when every rate passed, or when every class met its SLOs at the first that fails but the queue grew:
    the node's capacity binds."""
    failing = [p for p in points if not meets_slo(p, slo)]
    if not failing:
        return None, None
    first = min(failing, key=lambda p: p[key])
    if classes_meeting(first, slo):
        return None, None
    by = first.get("by_priority") or {}
    if not by:
        return min(first["per_slo"], key=first["per_slo"].get), None
    worst = min(by.values(), key=lambda c: c["attainment"])
    binding = min(worst["per_slo"], key=worst["per_slo"].get)
    return binding, (worst["class_name"] if len(by) > 1 else None)


def slo_point(sc: Scenario, slo: SLO) -> dict:
    """Simulate at the scenario's rate and read it against the SLOs (``slo_reading``; no step table)."""
    return slo_reading(simulate(sc, steps=False), slo)


# ---------------------------------------------------------------- cost


def check_headroom(headroom: float) -> float:
    """The headroom factor as a float, or ValueError naming the allowed range."""
    low, high = HEADROOM_LIMITS
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not low <= headroom <= high:
        raise ValueError(f"headroom={headroom!r} is out of range; allowed {low:g} to {high:g}")
    return float(headroom)


def check_target(target_rate_req_s: float | None) -> float | None:
    if target_rate_req_s is None:
        return None
    v = target_rate_req_s
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"target_rate_req_s={v!r} is out of range; allowed > 0")
    return float(v)


def scenario_gpus(scenario: Scenario) -> int:
    """GPUs the scenario's rate is carried by: its nodes' GPUs, or a prefill/decode split's own."""
    if scenario.disagg is not None:
        return scenario.disagg.gpus
    return scenario.nodes * scenario.deployment.node.num_gpus


def rate_unit(scenario: Scenario) -> str:
    """What the capacity's rate is per: 'node', or for a replica over two nodes 'TP 16 replica (two nodes)' (its
    nodes_needed still counts 8-GPU nodes: two per copy)."""
    node = scenario.deployment.node
    if scenario.disagg is None and node.cross_node:
        return f"TP {node.tp} replica ({node.physical_nodes} nodes)"
    return "node"


def gpu_name(scenario: Scenario) -> str | None:
    """The preset name of the scenario's GPU ('h100-sxm'), None for a custom GPU."""
    gpu = scenario.deployment.node.gpu
    return next((k for k, g in GPUS.items() if g == gpu), None)


def default_price(scenario: Scenario) -> float | None:
    """The price table's $ per GPU-hour for the scenario's GPU (``pricing.default_gpu_hour_usd``), None when the
    table has none (a custom GPU: give a price); ``pricing.PriceTableError`` (one line naming the file and row) when
    the table cannot be read."""
    name = gpu_name(scenario)
    return pricing.price_table()[name].usd_per_gpu_hour if name in pricing.price_table() else None


def page_price(scenario: Scenario, fallback_gpu: str) -> tuple[float, str | None]:
    """Where a page's price input starts for the scenario's GPU and, when there is no default price for it, why
    (shown on the page; None when the table's row is used): a custom GPU starts at ``fallback_gpu``'s default; a
    table that cannot be read, or has no row for the GPU, at the shipped table's (``pricing.input_start``)."""
    if pricing.table_problem() is None:
        usd = default_price(scenario)
        if usd is not None:
            return usd, None
        if gpu_name(scenario) is None and fallback_gpu in pricing.price_table():
            start = pricing.default_gpu_hour_usd(fallback_gpu)
            return start, f"{default_price_note(scenario)}: the input starts at the {fallback_gpu} default, ${start:g}"
    return pricing.input_start(gpu_name(scenario) or fallback_gpu)


def default_price_note(scenario: Scenario) -> str:
    """Where the default price comes from, or why there is none: for captions and the CLI."""
    problem = pricing.table_problem()
    if problem is not None:
        return f"no default price ({problem})"
    name = gpu_name(scenario)
    if name in pricing.price_table():
        return pricing.price_note(name) + f" ({pricing.price_table()[name].source})"
    gpu = scenario.deployment.node.gpu.name
    return f"no default price for {gpu} (priced: {', '.join(sorted(pricing.price_table()))}); give one"


def mean_output_tokens(scenario: Scenario) -> float:
    """Mean output tokens per request of the requests the scenario's model admits (``Scenario.requests``): the
    tokens a request served at the target brings."""
    reqs, _ = scenario.requests()
    return float(np.mean(reqs.output_tokens)) if len(reqs.output_tokens) else float("nan")


PRICE_FIELDS = ("nodes_needed", "usd_per_hour", "usd_per_million_output_tokens",
                "usd_per_million_output_tokens_at_capacity", "mean_output_tokens", "headroom", "gpu_hour_usd",
                "target_rate_req_s", "fleet_capacity_req_s", "margin", "output_tok_s_per_gpu")


def plan_price(scenario: Scenario, rate_req_s: float, target_rate_req_s: float | None, gpu_hour_usd: float | None,
               headroom: float = DEFAULT_HEADROOM, mean_output: float | None = None) -> dict:
    """``PRICE_FIELDS`` for a rate the whole scenario carries (one copy: a node or fleet, or a prefill/decode
    split), through ``pricing.price``: copies for the target counted in whole nodes, $/M at the target and at
    capacity. Without a target: no nodes and no $/M at the target; without a price: no $ figures; with no rate
    within the SLOs: neither."""
    headroom = check_headroom(headroom)
    target = check_target(target_rate_req_s)
    usd = None if gpu_hour_usd is None else pricing.check_price(gpu_hour_usd)
    mean_out = mean_output_tokens(scenario) if mean_output is None else float(mean_output)
    out = dict.fromkeys(PRICE_FIELDS) | {"mean_output_tokens": mean_out, "headroom": headroom,
                                         "gpu_hour_usd": usd, "target_rate_req_s": target}
    if not rate_req_s > 0 or not mean_out > 0:
        return out
    node = scenario.deployment.node
    # whole 8-GPU servers: a TP 16 replica's copy is two of them (the rate stays the replica's)
    gpus, per_node = scenario_gpus(scenario), node.num_gpus // node.physical_nodes
    nodes = None
    if scenario.disagg is not None and gpus <= per_node and target is not None:
        # a split within a node: whole copies per node, as the deployment search counts them (search.copies_at_target:
        # a copy never straddles two nodes, whose KV transfer would cross the network the simulation did not)
        copies = pricing.copies_needed(target, rate_req_s, headroom)
        nodes = math.ceil(copies / (per_node // gpus) - 1e-9)
    if usd is not None:
        p = pricing.price(rate_req_s, gpus, per_node, target if target is not None else rate_req_s, usd, mean_out,
                          headroom, nodes=nodes)
        out["usd_per_million_output_tokens_at_capacity"] = p.usd_per_million_output_tokens_at_capacity
        if target is not None:
            out |= {"nodes_needed": p.nodes, "usd_per_hour": p.usd_per_hour,
                    "usd_per_million_output_tokens": p.usd_per_million_output_tokens}
    elif target is not None:  # nodes without a price: the same count pricing.price makes
        out["nodes_needed"] = nodes if nodes is not None else \
            math.ceil(pricing.copies_needed(target, rate_req_s, headroom) * gpus / per_node - 1e-9)
    out["output_tok_s_per_gpu"] = rate_req_s * mean_out / gpus  # at capacity
    if out["nodes_needed"] is not None:  # every copy the whole nodes hold, each at the rate found
        n = out["nodes_needed"]
        copies = n * (per_node // gpus) if nodes is not None else n * per_node // gpus
        out["fleet_capacity_req_s"] = copies * rate_req_s
        out["margin"] = target / out["fleet_capacity_req_s"]  # the share of it the target uses
    return out


@dataclass(frozen=True, eq=False)
class CapacityResult:
    max_rate_req_s: float
    steady_output_tok_s: float  # at max_rate_req_s, over the arrival window (metrics.steady_rate)
    goodput_req_s: float
    binding_slo: str | None
    nodes_needed: int | None
    usd_per_million_output_tokens: float | None  # at the target traffic (pricing.price)
    points: pd.DataFrame  # every rate tried: rate, attainment, goodput, steady throughput
    # per class at the rate found (or, when none met the SLOs, at the lowest rate tried): class_name, slo,
    # attainment, meets_slo, goodput_req_s, per_slo, TTFT and TPOT P50/P99
    by_priority: dict = field(default_factory=dict)
    binding_class: str | None = None  # the class furthest below the attainment target at the first rate that fails
    headroom: float = DEFAULT_HEADROOM  # the factor nodes_needed and the $ at the target include
    usd_per_million_output_tokens_at_capacity: float | None = None  # one copy at max_rate_req_s, no headroom
    usd_per_hour: float | None = None  # the fleet for the target: nodes x GPUs per node x $ per GPU-hour
    mean_output_tokens: float | None = None  # of the workload's admitted requests
    gpu_hour_usd: float | None = None
    target_rate_req_s: float | None = None
    # closed-loop clients: the highest concurrency within the SLOs (0: not even one client), max_rate_req_s the
    # requests/s those clients send; None for an open loop's rate search
    max_concurrency: int | None = None
    # the fleet for the target (every copy its whole nodes hold at max_rate_req_s), the share of it the target uses,
    # and output tokens/s per GPU at max_rate_req_s (``plan_price``)
    fleet_capacity_req_s: float | None = None
    margin: float | None = None
    output_tok_s_per_gpu: float | None = None

    @property
    def rates_tried(self) -> int:
        """Request rates the search simulated (one run each)."""
        return len(self.points)

    def with_plan(self, scenario: Scenario, target_rate_req_s: float | None,
                  gpu_hour_usd: float | None, headroom: float = DEFAULT_HEADROOM,
                  mean_output: float | None = None) -> CapacityResult:
        """The same search priced for this target, price and headroom (``plan_price`` on the scenario searched):
        changing them runs nothing."""
        return replace(self, **plan_price(scenario, self.max_rate_req_s, target_rate_req_s, gpu_hour_usd, headroom,
                                          mean_output))

    def to_dict(self) -> dict:
        return {"max_rate_req_s": self.max_rate_req_s, "steady_output_tok_s": self.steady_output_tok_s,
                "goodput_req_s": self.goodput_req_s, "binding_slo": self.binding_slo,
                "binding_class": self.binding_class, "target_rate_req_s": self.target_rate_req_s,
                "nodes_needed": self.nodes_needed, "usd_per_hour": self.usd_per_hour,
                "usd_per_million_output_tokens": self.usd_per_million_output_tokens,
                "usd_per_million_output_tokens_at_capacity": self.usd_per_million_output_tokens_at_capacity,
                "fleet_capacity_req_s": self.fleet_capacity_req_s, "margin": self.margin,
                "output_tok_s_per_gpu": self.output_tok_s_per_gpu,
                "mean_output_tokens": self.mean_output_tokens, "headroom": self.headroom,
                "gpu_hour_usd": self.gpu_hour_usd, "by_priority": self.by_priority} | (
                   {} if self.max_concurrency is None else {"max_concurrency": self.max_concurrency})


# The rate search (``bracket_and_bisect``): it starts at FIRST_GUESS x the saturated run's requests/s (the
# ceiling), because the capacity within the SLOs mostly lies at 0.4-1.1x the ceiling (0.75 is the median over the
# Tune page's default sweeps of every knob and preset), widens the bracket by BRACKET, BRACKET^2, BRACKET^4...
# until it holds the boundary, down to ceiling / FLOOR and up to ceiling x CEILING_REACH, then bisects to the
# tolerance. From [ceiling / 4, 1.05 x ceiling], as it did before, it ran 9.6 rates on those sweeps; now 7.2.
FIRST_GUESS = 0.75
BRACKET = 1.15
FLOOR = 64  # no answer below ceiling / 64 (a rate that slow decodes every request nearly alone)
CEILING_REACH = 1.05 * 2 ** 8  # the highest rate / ceiling the search can answer
REL_TOL = 0.01
MAX_ITER = 20


def bracket_and_bisect(probe: Callable[[float], dict], meets: Callable[[dict], bool], ceiling: float,
                       estimate: float, known: Sequence[dict] = (), rel_tol: float = REL_TOL,
                       max_iter: int = MAX_ITER) -> None:
    """Search the rate boundary: ``probe(rate)`` simulates one rate (and keeps the point), ``meets`` says whether a
    point passes. ``known``: points already simulated (their passing and failing rates start the bracket). Probe
    ``estimate`` (held within [ceiling / FLOOR, ceiling x CEILING_REACH]) unless the known points bracket it
    closely, widen the bracket around it by BRACKET, BRACKET^2, ... (at most ``max_iter // 2`` rates), then
    bisect (geometric means while the bracket spans more than 4x, else midpoints) until it is within ``rel_tol``
    or ``max_iter`` rates were tried. The answer is the highest passing point."""
    good = [p["rate_req_s"] for p in known if meets(p)]
    bad = [p["rate_req_s"] for p in known if not meets(p)]
    lo = max(good) if good else None
    hi = min([r for r in bad if lo is None or r > lo], default=None)
    floor, top = ceiling / FLOOR, ceiling * CEILING_REACH
    estimate = min(max(estimate, floor), top)
    tries = 0
    if (lo is None or estimate > lo * (1 + rel_tol)) and (hi is None or estimate < hi * (1 - rel_tol)):
        tries += 1
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
        return
    while hi - lo > rel_tol * hi and tries < max_iter:
        mid = math.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
        tries += 1
        if meets(probe(mid)):
            lo = mid
        else:
            hi = mid


def ceiling_req_s(scenario: Scenario) -> float:
    """Requests/s the node serves flat out: every request at t = 0 (no policy sustains more)."""
    return saturated_capacity(simulate(scenario, saturated=True).summary())[0]


def capacity(scenario: Scenario, slo: SLO, policy: BatchingPolicy | None = None, target_rate_req_s: float | None = None,
             gpu_hour_usd: float | None = None, rel_tol: float = REL_TOL, progress: Progress | None = None,
             max_iter: int = MAX_ITER, headroom: float = DEFAULT_HEADROOM, ceiling: float | None = None,
             run=None) -> CapacityResult:
    """Highest request rate per node at which ``slo.attainment`` of requests meet the SLOs of their class,
    by bracketing then bisecting on the rate (``bracket_and_bisect`` from FIRST_GUESS x the ceiling; the same
    requests, arrivals rescaled). ``ceiling``: the
    requests/s of the saturated run (``ceiling_req_s``) when already known; otherwise it is simulated.
    ``run(scenario)``: stands in for ``simulate`` at each rate tried (anything ``slo_reading`` reads, e.g. a
    cached run, so another SLO re-reads the rates already simulated); the search and its answer are the same.
    Priced by ``plan_price`` (``pricing.price``) for ``target_rate_req_s`` at ``gpu_hour_usd`` (None: no $).
    A closed-loop workload (``concurrency`` set) searches the highest concurrency instead (``capacity_concurrency``;
    ``rel_tol`` and ``ceiling`` do not apply)."""
    wl = (scenario.with_policy(policy) if policy is not None else scenario).workload
    if getattr(wl, "concurrency", None) is not None:
        return capacity_concurrency(scenario, slo, policy, target_rate_req_s, gpu_hour_usd, progress,
                                    headroom=headroom, run=run)
    slo.validate()
    if policy is not None:
        scenario = scenario.with_policy(policy)
    check_headroom(headroom)  # validated before searching
    check_target(target_rate_req_s)
    if gpu_hour_usd is not None:
        pricing.check_price(gpu_hour_usd)
    scenario.validate()
    names = class_names(scenario)
    slo.validate(len(names))
    wl = scenario.workload
    # the saturated run bounds the rate: no policy sustains more requests/s than it serves flat out
    if ceiling is None:
        ceiling = ceiling_req_s(scenario)
    points: list[dict] = []

    def probe(rate: float) -> dict:
        if progress:
            progress(min(len(points) + 1, max_iter), max_iter, f"trying {rate:.3g} req/s")
        at = scenario.with_workload(wl.with_rate(rate))
        p = slo_point(at, slo) if run is None else slo_reading(run(at), slo)
        points.append(p)
        return p

    bracket_and_bisect(probe, lambda p: meets_slo(p, slo), ceiling, FIRST_GUESS * ceiling, [], rel_tol, max_iter)
    best = max((p for p in points if meets_slo(p, slo)), key=lambda p: p["rate_req_s"], default=None)
    if progress:
        progress(max_iter, max_iter, "done")
    binding, binding_class = binding_of(points, slo)
    rate = best["rate_req_s"] if best is not None else 0.0
    thr = best["steady_output_tok_s"] if best else 0.0
    at = best if best is not None else min(points, key=lambda p: p["rate_req_s"])
    df = pd.DataFrame([{k: v for k, v in p.items() if k not in ("per_slo", "by_priority")} for p in points])
    df = df.sort_values("rate_req_s").reset_index(drop=True)
    found = CapacityResult(rate, thr, best["goodput_req_s"] if best else 0.0, binding, None, None, df,
                           at["by_priority"], binding_class, float(headroom))
    return found.with_plan(scenario, target_rate_req_s, gpu_hour_usd, headroom)


def capacity_concurrency(scenario: Scenario, slo: SLO, policy: BatchingPolicy | None = None,
                         target_rate_req_s: float | None = None, gpu_hour_usd: float | None = None,
                         progress: Progress | None = None, headroom: float = DEFAULT_HEADROOM,
                         run=None) -> CapacityResult:
    """The highest number of closed-loop clients (the workload's ``concurrency`` and ``think_time_s``, its
    requests) whose requests meet the SLOs (``meets_slo``): 1, 2, 4, ... until one fails or the most allowed
    (min(MAX_CONCURRENCY, num_requests)), then integer bisection, so the answer N met them and N + 1 was simulated
    and did not. ``max_rate_req_s`` is the rate N clients send (``offered_req_s``), priced as ``capacity``'s rate.
    ``run(scenario)`` as in ``capacity``. 0 when one client already misses."""
    from batching.sim.workload.requests import MAX_CONCURRENCY

    slo.validate()
    if policy is not None:
        scenario = scenario.with_policy(policy)
    check_headroom(headroom)
    check_target(target_rate_req_s)
    if gpu_hour_usd is not None:
        pricing.check_price(gpu_hour_usd)
    scenario.validate()
    slo.validate(len(class_names(scenario)))
    wl = scenario.workload
    most = min(MAX_CONCURRENCY, int(wl.num_requests))
    expected = 2 * max(1, math.ceil(math.log2(most)))  # doublings then halvings, for the progress bar
    points: list[dict] = []

    def probe(n: int) -> dict:
        if progress:
            progress(min(len(points) + 1, expected), expected, f"trying {n:,} clients")
        at = scenario.with_workload(wl.with_concurrency(n))
        p = dict(slo_point(at, slo) if run is None else slo_reading(run(at), slo))
        p["concurrency"], p["rate_req_s"] = n, p["offered_req_s"]  # the rate N clients send
        points.append(p)
        return p

    lo, best = 0, None
    first = probe(1)
    if meets_slo(first, slo):
        lo, best, hi = 1, first, None
        n = 2
        while hi is None:  # double while the SLOs hold
            n = min(n, most)
            p = probe(n)
            if meets_slo(p, slo):
                lo, best = n, p
                if n == most:
                    break
                n *= 2
            else:
                hi = n
        while hi is not None and hi - lo > 1:  # integer bisection: lo met the SLOs, hi did not
            mid = (lo + hi) // 2
            p = probe(mid)
            if meets_slo(p, slo):
                lo, best = mid, p
            else:
                hi = mid
    if progress:
        progress(expected, expected, "done")
    binding, binding_class = binding_of(points, slo, key="concurrency")
    at = best if best is not None else first
    df = pd.DataFrame([{k: v for k, v in p.items() if k not in ("per_slo", "by_priority")} for p in points])
    df = df.sort_values("concurrency").reset_index(drop=True)
    rate = best["rate_req_s"] if best is not None else 0.0
    found = CapacityResult(rate, best["steady_output_tok_s"] if best else 0.0,
                           best["goodput_req_s"] if best else 0.0, binding, None, None, df, at["by_priority"],
                           binding_class, float(headroom), max_concurrency=lo)
    return found.with_plan(scenario, target_rate_req_s, gpu_hour_usd, headroom)
