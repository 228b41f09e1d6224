"""The planning pages' studies (Tune a knob, Capacity planning): cached sweeps and capacity searches that
take the simulation slots like every other cached call, and the readings of a sweep (default ranges, the
three guided cards, the knee sentence), which are plain functions of the sweep's own numbers."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from batching.studies.sweeps import KNOBS, apply_knob, sweep

from batching.studies.capacity import SLO, CapacityResult, capacity, plan_costs
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario
from batching.sim.specs import KV_BLOCK_TOKENS
from batching.sim.workload import SyntheticWorkload
from batching.ui import cache, state

_HASH = {Scenario: cache.scenario_token}
# a sweep is a small frame (one row per value); a capacity result holds the rates it tried
SWEEP_ENTRIES = 4 * cache.CACHE_ENTRIES
CAPACITY_ENTRIES = 2 * cache.CACHE_ENTRIES
MAX_POINTS = 24
INT_KNOBS = frozenset({"max_batch_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens"})
CAP_KNOBS = ("max_batch_size", "max_num_seqs", "max_num_batched_tokens")  # what "batch cap" means here
CONTINUOUS_KNOBS = ("max_num_seqs", "max_num_batched_tokens")
# knob -> (lowest, highest) value a range may hold
KNOB_BOUNDS: dict[str, tuple[float, float]] = {
    "max_batch_size": (1, 4096),
    "max_num_seqs": (1, 4096),
    "max_wait_s": (0.0, 3600.0),
    "max_num_batched_tokens": (16, 1_048_576),
    "high_share": (0.0, 1.0),
    "rate_req_s": (0.01, 10_000.0),
    "kv_cache_tokens": (KV_BLOCK_TOKENS, 10**9),  # the top is the deployment's whole cache
}

# thresholds of the guided cards (module constants, so the cards and the docs cannot drift apart)
FULL_BATCH = 0.85  # card 2: batch efficiency at or above this is a full batch
AT_CAPACITY = 0.95  # offered output tok/s at or above this share of capacity: the node cannot keep up
TAIL_RATIO = 10.0  # card 2: TTFT P99 at least this many times TTFT P50 is a queue
SWEEP_TAIL_RATIO = 5.0  # card 2: TTFT P99 at least this many times the sweep's lowest is a queue
ROOM_GPU_UTIL = 0.90  # card 2: gpu_util below this leaves room for more work
ROOM_CAPACITY_GAIN = 0.10  # card 2 (cap sweeps): a larger value must add this much capacity
KV_RISE = 0.02  # card 1: KV use rising by this share of the cache (2 percentage points) counts
LOW_EFFICIENCY = 0.50  # card 3


# ---------------------------------------------------------------- cached studies


def _extra_slots(wanted: int) -> int:
    """Take up to ``wanted`` more simulation slots without waiting (the caller already holds one)."""
    took = 0
    while took < wanted and cache.SLOTS.try_take():
        took += 1
    return took


def offered_load(scenario: Scenario) -> tuple[float, float]:
    """(requests/s, output tokens/s) the workload offers: its realised mean rate and mean output length."""
    reqs = scenario.workload.generate()
    rate = reqs.mean_rate_req_s
    if not math.isfinite(rate) or len(reqs) == 0:
        return float("nan"), float("nan")
    return float(rate), float(rate * reqs.output_tokens.mean())


@st.cache_data(max_entries=SWEEP_ENTRIES, show_spinner=False, hash_funcs=_HASH)
def _sweep(scenario: Scenario, knob: str, values: tuple[float, ...]) -> pd.DataFrame:
    def run() -> pd.DataFrame:
        # one slot is held; the kernel releases the GIL, so a sweep also uses any other slot that is free
        extra = _extra_slots(min(len(values), cache.MAX_CONCURRENT) - 1)
        try:
            return sweep(scenario, knob, list(values), workers=1 + extra)
        finally:
            for _ in range(extra):
                cache.SLOTS.release()

    df = cache._run_in_slot(run)
    loads = {}
    for v in df[knob]:
        sc = apply_knob(scenario, knob, v) if knob in ("rate_req_s", "high_share") else scenario
        loads[v] = offered_load(sc)
    df["offered_req_s"] = [loads[v][0] for v in df[knob]]
    df["offered_output_tok_s"] = [loads[v][1] for v in df[knob]]
    df["kv_pressure"] = df["max_kv_blocks"] * KV_BLOCK_TOKENS / df["kv_capacity_tokens"]
    return df


def sweep_cached(scenario: Scenario, knob: str, values) -> pd.DataFrame:
    """``studies.sweeps.sweep`` (with capacity runs) through a bounded cache, plus the offered load per value
    (``offered_req_s``, ``offered_output_tok_s``) and KV use at its peak (``kv_pressure``, 0-1)."""
    vals = tuple(float(v) for v in values)
    return cache._with_slot(lambda: _sweep(scenario, knob, vals))


@st.cache_data(max_entries=CAPACITY_ENTRIES, show_spinner=False, hash_funcs=_HASH)
def _capacity(scenario: Scenario, slo: SLO) -> CapacityResult:
    return cache._run_in_slot(lambda: capacity(scenario, slo))


def capacity_cached(scenario: Scenario, slo: SLO) -> CapacityResult:
    """``studies.capacity.capacity`` for the scenario's policy through a bounded cache. The search does not
    depend on the target traffic or the price: ``plan`` adds those, so changing them runs nothing."""
    slo.validate()
    return cache._with_slot(lambda: _capacity(scenario, slo))


def plan(result: CapacityResult, scenario: Scenario, target_rate_req_s: float | None,
         gpu_hour_usd: float | None) -> dict:
    """``result.to_dict()`` with nodes needed and $ per million output tokens for this target and price,
    computed as ``studies.capacity.capacity`` does."""
    out = result.to_dict()
    nodes, usd = plan_costs(result.max_rate_req_s, result.throughput_output_tok_s,
                            scenario.deployment.node.num_gpus, target_rate_req_s, gpu_hour_usd)
    out["nodes_needed"] = nodes
    out["usd_per_million_output_tokens"] = usd
    out["rates_tried"] = len(result.points)
    return out


# ---------------------------------------------------------------- knobs and ranges


def knob_applies(knob: str, policy: BatchingPolicy, scenario: Scenario) -> bool:
    """Whether sweeping the knob changes anything for this policy and workload."""
    if knob == "max_batch_size":
        return policy.mode in ("static", "dynamic")
    if knob == "max_wait_s":
        return policy.mode == "dynamic"
    if knob in CONTINUOUS_KNOBS:
        return policy.mode == "continuous"
    if knob == "high_share":
        wl = scenario.workload
        return isinstance(wl, SyntheticWorkload) and len(wl.classes) >= 2
    return knob in KNOBS


def knobs_for(policy: BatchingPolicy, scenario: Scenario) -> list[str]:
    return [k for k in KNOBS if knob_applies(k, policy, scenario)]


def default_knob(policy: BatchingPolicy) -> str:
    return "max_num_seqs" if policy.mode == "continuous" else "max_batch_size"


def current_value(scenario: Scenario, knob: str) -> float | None:
    """The knob's value in the scenario as it stands (before the sweep moves it)."""
    pol = scenario.policy
    if hasattr(pol, knob):
        return float(getattr(pol, knob))
    if knob == "rate_req_s":
        rate = scenario.workload.rate_req_s
        return float(rate) if rate is not None and math.isfinite(rate) else None
    if knob == "kv_cache_tokens":
        return float(scenario.deployment.kv_capacity_tokens)
    if knob == "high_share":
        wl = scenario.workload
        if isinstance(wl, SyntheticWorkload):
            return float(sum(c.share for c in wl.classes if c.priority == 0))
    return None


def bounds(knob: str, scenario: Scenario) -> tuple[float, float]:
    low, high = KNOB_BOUNDS[knob]
    if knob == "kv_cache_tokens":
        high = scenario.deployment.kv_capacity_tokens_max
    return low, high


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, int(math.ceil(math.log2(max(1.0, x)))))


def _round_sig(x: float, digits: int = 2) -> float:
    if x <= 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def default_range(knob: str, scenario: Scenario, capacity_req_s: float | None = None) -> tuple[float, float, int, str]:
    """(start, stop, points, spacing) that show the knob's interesting region for this policy and scenario.

    ``capacity_req_s`` (requests/s the node serves with the queue full) centres the request-rate range.
    """
    pol = scenario.policy
    if knob == "max_num_seqs":
        return 8, 1024, 8, "log"
    if knob == "max_batch_size":
        return 1, 256, 9, "log"
    if knob == "max_wait_s":
        return 0.01, 1.28, 8, "log"
    if knob == "max_num_batched_tokens":
        if pol.chunked_prefill:
            return 256, 16384, 7, "log"
        longest = int(scenario.workload.generate().prompt_tokens.max())
        start = min(_pow2_at_least(longest), 1 << 20)
        return start, min(8 * start, 1 << 20), 4, "log"
    if knob == "high_share":
        return 0.0, 1.0, 6, "linear"
    if knob == "rate_req_s":
        base = capacity_req_s if capacity_req_s and math.isfinite(capacity_req_s) else (current_value(scenario, knob)
                                                                                         or 1.0)
        low, high = KNOB_BOUNDS[knob]
        return max(low, _round_sig(base / 10)), min(high, _round_sig(1.5 * base)), 10, "linear"
    if knob == "kv_cache_tokens":
        reqs = scenario.workload.generate()
        longest = int((reqs.prompt_tokens + reqs.output_tokens).max())
        top = scenario.deployment.kv_capacity_tokens_max
        start = min(top, int(math.ceil(2 * longest / 1024)) * 1024)
        return start, top, 8, "log"
    raise ValueError(f"knob={knob!r} is unknown; allowed: {', '.join(KNOBS)}")


def knob_values(knob: str, start: float, stop: float, points: int, spacing: str) -> list[float]:
    """The values to sweep: ``points`` from start to stop, evenly or log-spaced; whole numbers for counts."""
    if not start < stop:
        raise ValueError(f"start={start:g} must be below stop={stop:g}; raise stop or lower start")
    if not 2 <= points <= MAX_POINTS:
        raise ValueError(f"points={points} is out of range; allowed 2 to {MAX_POINTS}")
    if spacing == "log":
        if not start > 0:
            raise ValueError(f"log spacing needs a start above 0 (start={start:g}); raise start or pick linear "
                             "spacing")
        raw = np.geomspace(start, stop, points)
    elif spacing == "linear":
        raw = np.linspace(start, stop, points)
    else:
        raise ValueError(f"spacing={spacing!r} is not allowed; allowed: linear, log")
    if knob in INT_KNOBS:
        vals = sorted({int(round(v)) for v in raw})
    else:
        vals = sorted({float(f"{v:.4g}") for v in raw})
    if len(vals) < 2:
        raise ValueError(f"{start:g} to {stop:g} holds fewer than two distinct whole numbers; widen the range")
    return [float(v) for v in vals]


# ---------------------------------------------------------------- readings of a sweep


def fmt_value(knob: str, value: float | None) -> str:
    """A knob value as people write it: 256, 0.04 s, 3.5 req/s, 65,536 tokens, 30 %."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if knob in INT_KNOBS:
        text = f"{int(round(value)):,}"
        return text + " tokens" if knob in ("kv_cache_tokens", "max_num_batched_tokens") else text
    if knob == "max_wait_s":
        return f"{value * 1e3:,.0f} ms" if value < 1 else f"{value:,.3g} s"
    if knob == "high_share":
        return f"{value * 100:.0f} %"
    if knob == "rate_req_s":
        return f"{value:,.3g} req/s"
    return f"{value:g}"


def _tok(v: float) -> str:
    return f"{v:,.0f} tok/s" if math.isfinite(v) else "n/a"


def _sec(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{v * 1e3:,.0f} ms" if v < 0.1 else f"{v:,.2f} s"


def _pct(v: float) -> str:
    return f"{v * 100:.0f} %" if math.isfinite(v) else "n/a"


@dataclass(frozen=True)
class Card:
    """One guided check of a sweep: whether it fired, what it says, and the numbers behind it."""

    number: int
    title: str
    fired: bool
    text: str  # fired: what the sweep shows and what to do; not fired: why not
    triggers: tuple[str, ...] = ()
    suggestion: float | None = None
    knob: str | None = None  # the knob the suggestion is for


TITLES = {1: "Batch cap too large", 2: "Batch cap too small (max_num_seqs / max_batch_size)",
          3: "Batch efficiency below 50 %"}


def cap_name(policy: BatchingPolicy) -> str:
    return "max_num_seqs" if policy.mode == "continuous" else "max_batch_size"


def card_cap_too_large(df: pd.DataFrame, knob: str, knee: float | None, share: float,
                       current: float | None) -> Card:
    """Card 1: past the knee capacity stays flat or falls while KV use or preemptions rise."""
    title = TITLES[1]
    if knob not in CAP_KNOBS:
        return Card(1, title, False, f"Reads sweeps of a batch cap ({', '.join(CAP_KNOBS)}); this sweep moves "
                                     f"{KNOBS[knob].split(' (')[0].lower()}.")
    if knee is None:
        return Card(1, title, False, f"No knee: capacity still grows by {share * 100:.0f} % or more past every "
                                     "value, or P99 latency stays flat.")
    at = df[df[knob] == knee].iloc[0]
    past = df[df[knob] > knee]
    if past.empty:
        return Card(1, title, False, f"The knee is the largest value swept ({fmt_value(knob, knee)}); extend the "
                                     "range past it to see what a larger cap costs.")
    cap_k, cap_past = float(at["capacity_output_tok_s"]), float(past["capacity_output_tok_s"].max())
    last = past.iloc[-1]
    flat = cap_past <= cap_k * (1 + share)
    kv_k, kv_past = float(at["kv_pressure"]), float(past["kv_pressure"].max())
    pre_k, pre_past = int(at["preemptions"]), int(past["preemptions"].max())
    kv_rise = kv_past >= kv_k + KV_RISE
    pre_rise = pre_past > pre_k
    triggers = (
        f"capacity {_tok(cap_k)} at the knee ({fmt_value(knob, knee)}), at most {_tok(cap_past)} past it "
        f"({_tok(float(last['capacity_output_tok_s']))} at {fmt_value(knob, float(last[knob]))})",
        f"peak KV cache use {_pct(kv_k)} at the knee, up to {_pct(kv_past)} past it",
        f"preemptions {pre_k:,} at the knee, up to {pre_past:,} past it",
    )
    if not (flat and (kv_rise or pre_rise)):
        why = ("capacity still grows past the knee" if not flat else
               "KV cache use and preemptions do not rise past the knee, so a larger cap costs only latency "
               "at full load")
        return Card(1, title, False, f"Not fired: {why}.", triggers)
    where = ""
    if current is not None and current > knee:
        where = f" The policy's {knob} is {fmt_value(knob, current)}, past the knee: lower it."
    rising = " and ".join(part for part, on in (("the KV cache fills", kv_rise), ("requests get preempted", pre_rise))
                          if on)
    cost = " and ".join(part for part, on in (("memory pressure", kv_rise), ("recomputation", pre_rise)) if on)
    text = (f"Past {knob} = {fmt_value(knob, knee)} the node serves no more (capacity flat or falling) while "
            f"{rising}: a larger cap only adds {cost}. Keep {knob} at or below {fmt_value(knob, knee)}, the knee."
            f"{where}")
    return Card(1, title, True, text, triggers, knee, knob)


def card_cap_too_small(df: pd.DataFrame, knob: str, policy: BatchingPolicy, current: float | None) -> Card:
    """Card 2: the batch is full at the offered load while requests queue and the GPU has room."""
    title = TITLES[2]
    cap = cap_name(policy)
    eff = df["batch_efficiency"].to_numpy(float)
    p50, p99 = df["ttft_p50_s"].to_numpy(float), df["ttft_p99_s"].to_numpy(float)
    offered, capac = df["offered_output_tok_s"].to_numpy(float), df["capacity_output_tok_s"].to_numpy(float)
    gpu = df["gpu_util"].to_numpy(float)
    x = df[knob].to_numpy(float)
    best = float(np.nanmin(p99)) if np.isfinite(p99).any() else float("nan")
    over = offered >= AT_CAPACITY * capac
    tail = p99 >= TAIL_RATIO * p50
    behind = p99 >= SWEEP_TAIL_RATIO * best
    queued = over | tail | behind
    full = eff >= FULL_BATCH
    room = gpu < ROOM_GPU_UTIL
    gain = np.zeros(len(df), bool)
    if knob == cap:  # the sweep itself shows that a larger cap does more work on the same GPUs
        for i in range(len(df)):
            gain[i] = bool((capac[i + 1:] >= (1 + ROOM_CAPACITY_GAIN) * capac[i]).any())
        room &= gain
    bad = full & queued & room
    if not bad.any():
        i = int(np.nanargmax(eff)) if np.isfinite(eff).any() else 0
        return Card(2, title, False, f"Not fired: no value has a full batch (batch efficiency ≥ "
                                     f"{FULL_BATCH * 100:.0f} %) while requests queue and the GPU has room; the "
                                     f"fullest batch is "
                                     f"{_pct(eff[i])} at {knob} = {fmt_value(knob, x[i])}.")
    if knob == cap:
        i = int(np.flatnonzero(bad)[-1])  # the largest value that is still too small
    else:
        i = int(np.flatnonzero(bad)[np.nanargmax(p99[bad])])  # where the queue is worst
    row = df.iloc[i]
    evidence = []
    if over[i]:
        evidence.append(f"offered load {_tok(offered[i])} ≥ {AT_CAPACITY * 100:.0f} % of capacity {_tok(capac[i])}")
    if tail[i]:
        evidence.append(f"TTFT P99 {_sec(p99[i])} vs P50 {_sec(p50[i])}")
    if behind[i]:
        j = int(np.nanargmin(p99))
        evidence.append(f"TTFT P99 {_sec(p99[i])} vs {_sec(best)} at {knob} = {fmt_value(knob, x[j])}")
    triggers = [f"batch efficiency {_pct(eff[i])} at the offered load ({row['mean_running']:.1f} running of "
                f"{fmt_value(cap, x[i] if knob == cap else getattr(policy, cap))})",
                "requests queue: " + "; ".join(evidence),
                f"gpu_util {_pct(gpu[i])}"]
    if knob == cap:
        fine = [j for j in range(i + 1, len(df)) if not queued[j]]
        if fine:
            j = fine[0]
            suggestion = float(x[j])
            triggers[-1] += (f"; capacity {_tok(capac[i])} → {_tok(capac[j])} at {knob} = "
                             f"{fmt_value(knob, x[j])}")
            advice = (f"Use at least {cap} = {fmt_value(cap, suggestion)}, the smallest value swept that stops the "
                      "queue.")
        else:
            j = i + 1 + int(np.nanargmax(capac[i + 1:]))  # the most capacity among the larger values
            suggestion = float(x[j])
            triggers[-1] += f"; capacity {_tok(capac[i])} → {_tok(capac[j])} at {knob} = {fmt_value(knob, x[j])}"
            if j == len(df) - 1:
                advice = (f"Even the largest value swept ({fmt_value(cap, suggestion)}) still queues and adds "
                          f"capacity: raise {cap} above it (extend the range).")
            else:
                advice = (f"Use {cap} = {fmt_value(cap, suggestion)}, the most capacity in the sweep; the queue "
                          "that remains there is traffic beyond what one node serves (more nodes, see Capacity "
                          "planning), not a cap that is too small.")
        where = ""
        if current is not None:
            where = (f" The policy's {cap} is {fmt_value(cap, current)}, "
                     + ("in that range: raise it." if current <= x[i] else "above that range."))
        text = (f"At {cap} ≤ {fmt_value(cap, x[i])} every slot is taken while requests wait and the GPUs could "
                f"do more: the cap, not the hardware, limits the node. {advice}{where}")
        return Card(2, title, True, text, tuple(triggers), suggestion, cap)
    values = ", ".join(fmt_value(knob, v) for v in x[bad])
    text = (f"At {knob} = {values} the batch is full ({cap} = {fmt_value(cap, getattr(policy, cap))}) while "
            f"requests queue and the GPUs could do more. Raise {cap}: sweep it on this page to find the value "
            "that stops the queue.")
    return Card(2, title, True, text, tuple(triggers), None, cap)


def card_efficiency_low(df: pd.DataFrame, knob: str, policy: BatchingPolicy) -> Card:
    """Card 3: request-level batches run under half full while the node keeps up: arrivals are too slow."""
    title = TITLES[3]
    if policy.mode == "continuous":
        return Card(3, title, False, "Reads request-level batching (static, dynamic), where a batch waits for its "
                                     "cap; continuous batching admits requests every step, so a low batch "
                                     "efficiency there is headroom, not waste.")
    eff = df["batch_efficiency"].to_numpy(float)
    offered, capac = df["offered_output_tok_s"].to_numpy(float), df["capacity_output_tok_s"].to_numpy(float)
    x = df[knob].to_numpy(float)
    keeps_up = offered < AT_CAPACITY * capac
    low = eff < LOW_EFFICIENCY
    bad = low & keeps_up
    if not bad.any():
        if low.any():
            return Card(3, title, False, "Not fired: where batches run under half full the node is also at or "
                                         "over capacity, so arrivals are not what limits it.")
        i = int(np.nanargmin(eff)) if np.isfinite(eff).any() else 0
        return Card(3, title, False, f"Not fired: batch efficiency stays at or above {LOW_EFFICIENCY * 100:.0f} % "
                                     f"(lowest {_pct(eff[i])} at {knob} = {fmt_value(knob, x[i])}).")
    i = int(np.flatnonzero(bad)[np.nanargmin(eff[bad])])
    row = df.iloc[i]
    batch = float(x[i]) if knob == "max_batch_size" else float(policy.max_batch_size)
    rate = float(row["offered_req_s"])
    fill_s = batch / rate if rate > 0 else float("inf")
    triggers = (f"batch efficiency {_pct(eff[i])} at {knob} = {fmt_value(knob, x[i])} ({row['mean_running']:.1f} "
                f"requests per step of a cap of {batch:,.0f})",
                f"the node keeps up: offered load {_tok(offered[i])} is under {AT_CAPACITY * 100:.0f} % of capacity "
                f"{_tok(capac[i])}",
                f"at {rate:,.3g} req/s a batch of {batch:,.0f} takes {fill_s:,.1f} s to arrive")
    if knob == "max_batch_size":
        ok = [v for v, e in zip(x, eff) if e >= LOW_EFFICIENCY and v < x[i]]
        suggestion = float(max(ok)) if ok else float(max(1, round(row["mean_running"])))
    else:
        suggestion = float(max(1, round(row["mean_running"])))
    if policy.mode == "dynamic":
        wait = 0.5 * batch / rate if rate > 0 else float("nan")
        now = float(x[i]) if knob == "max_wait_s" else policy.max_wait_s
        longer = (f", or raise max_wait_s from {fmt_value('max_wait_s', now)} toward "
                  f"{fmt_value('max_wait_s', wait)}, the time half a batch takes to arrive (fuller batches, "
                  "but every request waits longer for its first token)")
    else:
        longer = ", or use dynamic batching with a max wait, so a batch launches before it is full"
    text = (f"Batches run under half full while the node keeps up with the traffic: requests arrive too slowly "
            f"for a cap of {batch:,.0f}. Lower max_batch_size to {fmt_value('max_batch_size', suggestion)}"
            f"{longer}.")
    return Card(3, title, True, text, triggers, suggestion, "max_batch_size")


def cards(df: pd.DataFrame, knob: str, scenario: Scenario, knee: float | None, share: float) -> list[Card]:
    """The three guided checks on one policy's sweep (``sweep_cached`` columns), in order."""
    pol = scenario.policy
    cap = cap_name(pol)
    return [card_cap_too_large(df, knob, knee, share, current_value(scenario, knob)),
            card_cap_too_small(df, knob, pol, current_value(scenario, cap)),
            card_efficiency_low(df, knob, pol)]


def knee_sentence(df: pd.DataFrame, knob: str, knee: float | None, share: float) -> str:
    """One sentence on the knee: where it is, what the rest of the range adds and what it costs."""
    rate = knob == "rate_req_s"
    thr_key = "throughput_output_tok_s" if rate else "capacity_output_tok_s"
    what = "throughput at the offered load" if rate else "capacity"
    if knee is None:
        return (f"No knee in this range: {what} grows by {share * 100:.0f} % or more past every value, or P99 latency "
                "stays flat. Widen the range to find where it stops paying.")
    at = df[df[knob] == knee].iloc[0]
    past = df[df[knob] > knee]
    lats = {"ttft_p99_s": "P99 TTFT", "tpot_p99_s": "P99 TPOT"}
    if not rate:
        lats["capacity_tpot_p99_s"] = "P99 TPOT at capacity"
    rise = {k: float(past[k].max()) / float(at[k]) if float(at[k]) > 0 else 1.0 for k in lats}
    worst = max(rise, key=rise.get)
    return (f"Knee at {knob} = {fmt_value(knob, knee)}: past it {what} grows by less than {share * 100:.0f} % "
            f"({_tok(float(at[thr_key]))} → at most {_tok(float(past[thr_key].max()))}) while {lats[worst]} rises "
            f"from {_sec(float(at[worst]))} to {_sec(float(past[worst].max()))}.")


# ---------------------------------------------------------------- downloads


def download_row(name: str, files: Sequence[tuple[str, Callable[[], bytes | str], str, str, str]],
                 link: str | None = None) -> None:
    """Download buttons (label, deferred data, file suffix, MIME type, tooltip), then the link to this view.

    The files are made only when a button is clicked, so reruns stay fast.
    """
    st.subheader("Downloads", divider="gray")
    cols = st.columns(max(4, len(files)))
    icons = {"text/csv": ":material/table:", "application/json": ":material/data_object:",
             "text/html": ":material/description:"}
    for col, (label, data, suffix, mime, tip) in zip(cols, files):
        col.download_button(label, data, f"{name}_{suffix}", mime, on_click="ignore", width="stretch",
                            icon=icons.get(mime, ":material/download:"), help=tip)
    st.markdown("**Link to this view** (the scenario and settings are in the URL):")
    st.code(link or state.current_link(), language=None, wrap_lines=True)
