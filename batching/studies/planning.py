"""The planning rules (no Streamlit): which knobs a policy can sweep and over which range, the readings of a
sweep (offered load, KV pressure, the knee sentence, the three guided checks) and the plan a capacity search
makes for a target traffic and a price. The Tune and Capacity pages draw these; ``python -m batching sweep``
prints the same checks after its table.

Every reading is a plain function of the sweep's own numbers; the thresholds are module constants, so the
checks, the pages' explanations and the docs cannot drift apart.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batching.sim.policy import KNOB_LIMITS, BatchingPolicy
from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.requests import MAX_RATE_REQ_S, SyntheticWorkload
from batching.studies.capacity import (SLO, SLO_LABELS, CapacityResult, class_names, default_slo, mean_output_tokens,
                                       rate_unit)
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies.compare import Progress
from batching.studies.knee import DEFAULT_SHARE, check_share, knee_basis, knee_series, knee_words, sweep_knee
from batching.studies.sweeps import INT_KNOBS, KNOBS, apply_knob, sweep

MAX_POINTS = 24  # values one sweep may hold
CAP_KNOBS = ("max_batch_size", "max_num_seqs", "max_num_batched_tokens")  # what "batch cap" means here
CONTINUOUS_KNOBS = ("max_num_seqs", "max_num_batched_tokens")
SPACINGS = ("log", "linear")
MIN_SWEEP_RATE_REQ_S = 0.01
# knob -> (lowest, highest) value a sweep range may hold: the policy's own limits, the share, the rate the
# workload accepts, and the KV cache (its top is the deployment's whole cache, see ``bounds``)
KNOB_BOUNDS: dict[str, tuple[float, float]] = {
    "max_batch_size": KNOB_LIMITS["max_batch_size"],
    "max_num_seqs": KNOB_LIMITS["max_num_seqs"],
    "max_wait_s": KNOB_LIMITS["max_wait_s"],
    "max_num_batched_tokens": KNOB_LIMITS["max_num_batched_tokens"],
    "high_share": (0.0, 1.0),
    "rate_req_s": (MIN_SWEEP_RATE_REQ_S, MAX_RATE_REQ_S),
    "kv_cache_tokens": (KV_BLOCK_TOKENS, 10**9),
}

# thresholds of the guided checks
FULL_BATCH = 0.85  # check 2: batch efficiency at or above this is a full batch
AT_CAPACITY = 0.95  # offered output tok/s at or above this share of capacity: the node cannot keep up
TAIL_RATIO = 10.0  # check 2: TTFT P99 at least this many times TTFT P50 is a queue
SWEEP_TAIL_RATIO = 5.0  # check 2: TTFT P99 at least this many times the sweep's lowest is a queue
ROOM_GPU_UTIL = 0.90  # check 2: sol_util (roofline share of the wall time) below this leaves room for more work
ROOM_CAPACITY_GAIN = 0.10  # check 2 (cap sweeps): a larger value must add this much capacity
KV_RISE = 0.02  # check 1: KV use rising by this share of the cache (2 percentage points) counts
LOW_EFFICIENCY = 0.50  # check 3

# columns ``with_readings`` adds to a sweep frame
READING_COLUMNS = ("offered_req_s", "offered_output_tok_s", "kv_pressure")


# ---------------------------------------------------------------- the load a sweep offers


def offered_load(scenario: Scenario) -> tuple[float, float]:
    """(requests/s, output tokens/s) the workload offers: its realised mean rate and mean output length."""
    reqs, _ = scenario.requests()  # those the model serves
    rate = reqs.mean_rate_req_s
    if not math.isfinite(rate) or len(reqs) == 0:
        return float("nan"), float("nan")
    return float(rate), float(rate * reqs.output_tokens.mean())


def with_readings(df: pd.DataFrame, scenario: Scenario, knob: str) -> pd.DataFrame:
    """A copy of a ``studies.sweeps.sweep`` frame with what the checks read: the offered load per value
    (``offered_req_s``, ``offered_output_tok_s``; only the rate and the traffic mix move it) and KV use at
    its peak (``kv_pressure``, 0-1)."""
    out = df.copy()
    loads: dict[float, tuple[float, float]] = {}
    for v in out[knob]:
        if v not in loads:
            sc = apply_knob(scenario, knob, v) if knob in ("rate_req_s", "high_share") else scenario
            loads[v] = offered_load(sc)
    out["offered_req_s"] = [loads[v][0] for v in out[knob]]
    out["offered_output_tok_s"] = [loads[v][1] for v in out[knob]]
    out["kv_pressure"] = out["max_kv_blocks"] * KV_BLOCK_TOKENS / out["kv_capacity_tokens"]
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


def cap_name(policy: BatchingPolicy) -> str:
    """The policy's batch cap: max_num_seqs for continuous batching, max_batch_size for the others."""
    return "max_num_seqs" if policy.mode == "continuous" else "max_batch_size"


default_knob = cap_name  # the knob a sweep starts from


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
    """(lowest, highest) value a range of this knob may hold on this scenario."""
    if knob not in KNOB_BOUNDS:
        raise ValueError(f"knob={knob!r} is unknown; allowed: {', '.join(KNOBS)}")
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
        top = int(KNOB_BOUNDS[knob][1])
        if pol.chunked_prefill:
            return 256, 16384, 7, "log"
        longest = int(scenario.requests()[0].prompt_tokens.max())
        start = min(_pow2_at_least(longest), top)
        return start, min(8 * start, top), 4, "log"
    if knob == "high_share":
        return 0.0, 1.0, 6, "linear"
    if knob == "rate_req_s":
        base = capacity_req_s if capacity_req_s and math.isfinite(capacity_req_s) else (current_value(scenario, knob)
                                                                                         or 1.0)
        low, high = KNOB_BOUNDS[knob]
        return max(low, _round_sig(base / 10)), min(high, _round_sig(1.5 * base)), 10, "linear"
    if knob == "kv_cache_tokens":
        reqs, _ = scenario.requests()
        longest = int((reqs.prompt_tokens + reqs.output_tokens).max())
        top = scenario.deployment.kv_capacity_tokens_max
        start = min(top, int(math.ceil(2 * longest / 1024)) * 1024)
        return start, top, 8, "log"
    raise ValueError(f"knob={knob!r} is unknown; allowed: {', '.join(KNOBS)}")


def knob_values(knob: str, start: float, stop: float, points: int, spacing: str, even: int | None = None
                ) -> list[float]:
    """The values to sweep: ``points`` from start to stop, evenly or log-spaced; whole numbers for counts.

    ``even``: how many of them are evenly spaced (None: all). Each point past it halves the widest gap (on the
    spacing's scale), the leftmost of equal ones first, so one more point keeps every point already there: the
    dashboard passes the knob's default count, and "one more point" simulates one value instead of the whole
    sweep; at ``2 * even - 1`` points the grid is even again."""
    if not start < stop:
        raise ValueError(f"start={start:g} must be below stop={stop:g}; raise stop or lower start")
    if not 2 <= points <= MAX_POINTS:
        raise ValueError(f"points={points} is out of range; allowed 2 to {MAX_POINTS}")
    if spacing == "log":
        if not start > 0:
            raise ValueError(f"log spacing needs a start above 0 (start={start:g}); raise start or pick linear "
                             "spacing")
    elif spacing != "linear":
        raise ValueError(f"spacing={spacing!r} is not allowed; allowed: {', '.join(SPACINGS)}")
    raw = _refined(start, stop, points, points if even is None else max(2, min(points, int(even))),
                   spacing == "log")
    if knob in INT_KNOBS:
        vals = sorted({int(round(v)) for v in raw})
    else:
        vals = sorted({float(f"{v:.4g}") for v in raw})
    if len(vals) < 2:
        raise ValueError(f"{start:g} to {stop:g} holds fewer than two distinct whole numbers; widen the range")
    return [float(v) for v in vals]


def _refined(start: float, stop: float, points: int, even: int, log: bool) -> np.ndarray:
    """``even`` evenly spaced positions from start to stop (on a log scale with ``log``), then ``points - even`` more,
    each halving the widest gap, the leftmost of equal ones first."""
    pos = list(np.linspace(math.log(start), math.log(stop), even) if log else np.linspace(start, stop, even))
    for _ in range(points - even):
        gaps = np.diff(pos)
        i = int(np.flatnonzero(gaps >= gaps.max() * (1 - 1e-9))[0])  # equal up to rounding: the leftmost
        pos.insert(i + 1, (pos[i] + pos[i + 1]) / 2)
    out = np.exp(pos) if log else np.array(pos)
    out[0], out[-1] = start, stop  # exactly the ends asked for (exp(log(x)) may differ in the last bit)
    return out


# ---------------------------------------------------------------- readings of a sweep


def fmt_value(knob: str, value: float | None) -> str:
    """A knob value as people write it: 256, 40 ms, 3.5 req/s, 65,536 tokens, 30 %."""
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


def _req(v: float) -> str:
    return f"{v:,.3g} req/s" if math.isfinite(v) else "n/a"


def _rate(v: float) -> str:
    """A sustained rate at the digits a plan can use, never in exponent notation: "4 req/s", "15.8 req/s",
    "0.028 req/s" (two significant digits below 1 req/s), "1,234 req/s"."""
    if not math.isfinite(v):
        return "n/a"
    digits = 2 if abs(v) < 1 else 3
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v)))) if v else 0
    text = f"{round(v, decimals):,.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + " req/s"


# a policy needing this many times the nodes of the best one is named as no practical choice in the verdict
IMPRACTICAL_NODES_RATIO = 4


def capacity_measure(df: pd.DataFrame, knob: str) -> tuple[str, Callable[[float], str], str]:
    """(column, formatter, what it is) of the capacity a sweep's checks and knee read: the capacity within the
    SLOs (``max_rate_req_s``) when the sweep carries it, else the saturated output throughput."""
    if knob != "rate_req_s" and "max_rate_req_s" in df.columns:
        return "max_rate_req_s", _req, "capacity within the SLOs"
    return "capacity_output_tok_s", _tok, "capacity"


def configured_index(df: pd.DataFrame, knob: str, configured: float | None) -> int | None:
    """The row of the swept value nearest the configured one (log distance for positive values), or None when
    the configured value lies outside the range swept (or there is none)."""
    if configured is None or not math.isfinite(configured):
        return None
    x = df[knob].to_numpy(float)
    lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
    slack = 1e-9 * max(abs(lo), abs(hi), 1.0)
    if configured < lo - slack or configured > hi + slack:
        return None
    if configured > 0 and (x > 0).all():
        return int(np.argmin(np.abs(np.log(x / configured))))
    return int(np.argmin(np.abs(x - configured)))


def _at_configured(knob: str, configured: float | None, x: float) -> str:
    """'the configured max_num_seqs = 256' or, when the nearest value swept differs, with that value."""
    text = f"the configured {knob} = {fmt_value(knob, configured)}"
    if configured is None or not math.isclose(x, configured, rel_tol=1e-6):
        text += f" (nearest value swept: {fmt_value(knob, x)})"
    return text


def _outside(knob: str, configured: float | None, x: np.ndarray) -> str:
    if configured is None:
        return f"Not fired: the scenario has no configured {knob} to read (a trace without a rate?)."
    return (f"Not fired: the configured {knob} = {fmt_value(knob, configured)} lies outside the range swept "
            f"({fmt_value(knob, float(np.nanmin(x)))} to {fmt_value(knob, float(np.nanmax(x)))}); the check reads "
            "the configured value: widen the range to include it.")


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

    def to_dict(self) -> dict:
        return {"number": self.number, "title": self.title, "fired": self.fired, "text": self.text,
                "triggers": list(self.triggers), "suggestion": self.suggestion, "knob": self.knob}


TITLES = {1: "Batch cap too large", 2: "Batch cap too small (max_num_seqs / max_batch_size)",
          3: "Batch efficiency below 50 %"}
NONE_FIRED = ("None of the three pitfalls shows at the configured values: the batch cap is not past its knee "
              "filling the KV cache, the batch is not full with a queue and idle GPUs, and no request-level batch "
              "runs under half full while the node keeps up.")


def card_cap_too_large(df: pd.DataFrame, knob: str, knee: float | None, share: float,
                       current: float | None) -> Card:
    """Check 1: the configured cap (``current``) is past the knee, where capacity stays flat or falls while KV
    use or preemptions rise."""
    title = TITLES[1]
    if knob not in CAP_KNOBS:
        return Card(1, title, False, f"Reads sweeps of a batch cap ({', '.join(CAP_KNOBS)}); this sweep moves "
                                     f"{KNOBS[knob].split(' (')[0].lower()}.")
    col, unit, what = capacity_measure(df, knob)
    if knee is None:
        return Card(1, title, False, f"No knee: {what} still grows by {share * 100:.0f} % or more past every "
                                     "value" + ("." if col == "max_rate_req_s" else ", or P99 latency stays flat."))
    at = df[df[knob] == knee].iloc[0]
    past = df[df[knob] > knee]
    if past.empty:
        return Card(1, title, False, f"The knee is the largest value swept ({fmt_value(knob, knee)}); extend the "
                                     "range past it to see what a larger cap costs.")
    cap_k, cap_past = float(at[col]), float(past[col].max())
    last = past.iloc[-1]
    flat = cap_past <= cap_k * (1 + share)
    kv_k, kv_past = float(at["kv_pressure"]), float(past["kv_pressure"].max())
    pre_k, pre_past = int(at["preemptions"]), int(past["preemptions"].max())
    kv_rise = kv_past >= kv_k + KV_RISE
    pre_rise = pre_past > pre_k
    triggers = (
        f"{what} {unit(cap_k)} at the knee ({fmt_value(knob, knee)}), at most {unit(cap_past)} past it "
        f"({unit(float(last[col]))} at {fmt_value(knob, float(last[knob]))})",
        f"peak KV cache use {_pct(kv_k)} at the knee, up to {_pct(kv_past)} past it",
        f"preemptions {pre_k:,} at the knee, up to {pre_past:,} past it",
    )
    if not (flat and (kv_rise or pre_rise)):
        why = (f"{what} still grows past the knee" if not flat else
               "KV cache use and preemptions do not rise past the knee, so a larger cap costs only latency "
               "at full load")
        return Card(1, title, False, f"Not fired: {why}.", triggers)
    if current is None or not current > knee:
        where = "not set" if current is None else f"{fmt_value(knob, current)}, at or below the knee"
        return Card(1, title, False, f"Not fired: past {knob} = {fmt_value(knob, knee)} a larger cap only fills the "
                                     f"KV cache, but the configured {knob} is {where}.", triggers)
    rising = " and ".join(part for part, on in (("the KV cache fills", kv_rise), ("requests get preempted", pre_rise))
                          if on)
    cost = " and ".join(part for part, on in (("memory pressure", kv_rise), ("recomputation", pre_rise)) if on)
    text = (f"The configured {knob} = {fmt_value(knob, current)} is past the knee: beyond {knob} = "
            f"{fmt_value(knob, knee)} the node serves no more ({what} flat or falling) while {rising}, so a larger "
            f"cap only adds {cost}. Lower {knob} to {fmt_value(knob, knee)}, the knee.")
    return Card(1, title, True, text, triggers, knee, knob)


def card_cap_too_small(df: pd.DataFrame, knob: str, policy: BatchingPolicy, current: float | None,
                       configured: float | None = None, knee: float | None = None) -> Card:
    """Check 2: at the configured values the batch is full while requests queue and the GPU has room.

    ``current`` is the policy's batch cap, ``configured`` the swept knob's own value (the cap itself in a
    sweep of the cap), ``knee`` the sweep's knee (a suggestion stays at or below it)."""
    title = TITLES[2]
    cap = cap_name(policy)
    configured = current if knob == cap else configured
    eff = df["batch_efficiency"].to_numpy(float)
    p50, p99 = df["ttft_p50_s"].to_numpy(float), df["ttft_p99_s"].to_numpy(float)
    offered, capac = df["offered_output_tok_s"].to_numpy(float), df["capacity_output_tok_s"].to_numpy(float)
    col, unit, what = capacity_measure(df, knob)
    gains = df[col].to_numpy(float)
    gpu = df["sol_util"].to_numpy(float)
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
            gain[i] = bool((gains[i + 1:] >= (1 + ROOM_CAPACITY_GAIN) * gains[i]).any())
        room &= gain
        if knee is not None:  # at or past the knee a larger cap buys less than the knee share (check 1)
            room &= x < knee
    bad = full & queued & room
    if not bad.any():
        i = int(np.nanargmax(eff)) if np.isfinite(eff).any() else 0
        return Card(2, title, False, f"Not fired: no value has a full batch (batch efficiency ≥ "
                                     f"{FULL_BATCH * 100:.0f} %) while requests queue and the GPU has room; the "
                                     f"fullest batch is "
                                     f"{_pct(eff[i])} at {knob} = {fmt_value(knob, x[i])}.")
    values = ", ".join(fmt_value(knob, v) for v in x[bad])
    if knob == cap:
        i = int(np.flatnonzero(bad)[-1])  # the largest value that is still too small
        if configured is None or configured > x[i]:
            where = "not set" if configured is None else f"{fmt_value(cap, configured)}, above that range"
            return Card(2, title, False, f"Not fired: at {cap} ≤ {fmt_value(cap, x[i])} every slot is taken while "
                                         f"requests wait, but the configured {cap} is {where}.")
    else:
        i = configured_index(df, knob, configured)
        if i is None:
            return Card(2, title, False, _outside(knob, configured, x))
        if not bad[i]:
            return Card(2, title, False, f"Not fired at {_at_configured(knob, configured, x[i])}: batch efficiency "
                                         f"{_pct(eff[i])}, TTFT P99 {_sec(p99[i])}, sol_util {_pct(gpu[i])}. "
                                         f"(The batch is full while requests queue at {knob} = {values}, values "
                                         "the scenario does not run.)")
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
                f"sol_util {_pct(gpu[i])}"]
    if knob == cap:
        fine = [j for j in range(i + 1, len(df)) if not queued[j]]
        if fine:
            j = fine[0]
            advice_kind = "stops"
        else:
            j = i + 1 + int(np.nanargmax(gains[i + 1:]))  # the most capacity among the larger values
            advice_kind = "last" if j == len(df) - 1 else "peak"
        if knee is not None and x[j] > knee > x[i]:  # never past the knee: there a larger cap buys little
            j, advice_kind = int(np.flatnonzero(x == knee)[0]), "knee"
        suggestion = float(x[j])
        triggers[-1] += f"; {what} {unit(gains[i])} → {unit(gains[j])} at {knob} = {fmt_value(knob, x[j])}"
        advice = {
            "stops": f"Use at least {cap} = {fmt_value(cap, suggestion)}, the smallest value swept that stops the "
                     "queue.",
            "last": f"Even the largest value swept ({fmt_value(cap, suggestion)}) still queues and adds capacity: "
                    f"raise {cap} above it (extend the range).",
            "peak": f"Use {cap} = {fmt_value(cap, suggestion)}, the most capacity in the sweep; the queue that "
                    "remains there is traffic beyond what one node serves (more nodes, see Capacity planning), not "
                    "a cap that is too small.",
            "knee": f"Use {cap} = {fmt_value(cap, suggestion)}, the knee: past it {what} grows by less than the "
                    "knee share; the queue that remains is traffic beyond what one node serves (more nodes, see "
                    "Capacity planning).",
        }[advice_kind]
        text = (f"The configured {cap} = {fmt_value(cap, configured)} is too small: at {cap} ≤ "
                f"{fmt_value(cap, x[i])} every slot is taken while requests wait and the GPUs could do more, so the "
                f"cap, not the hardware, limits the node. {advice}")
        return Card(2, title, True, text, tuple(triggers), suggestion, cap)
    text = (f"At {_at_configured(knob, configured, x[i])} the batch is full ({cap} = "
            f"{fmt_value(cap, getattr(policy, cap))}) while requests queue and the GPUs could do more. Raise {cap}: "
            "sweep it to find the value that stops the queue.")
    return Card(2, title, True, text, tuple(triggers), None, cap)


def card_efficiency_low(df: pd.DataFrame, knob: str, policy: BatchingPolicy,
                        configured: float | None = None) -> Card:
    """Check 3: at the configured values request-level batches run under half full while the node keeps up:
    arrivals are too slow. ``configured`` is the swept knob's own value in the scenario."""
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
    i = configured_index(df, knob, configured)
    if i is None and knob == "max_batch_size" and configured is not None and configured > np.nanmax(x):
        i = int(np.nanargmax(x))  # a larger batch than any swept fills no better than the largest
    if i is None:
        return Card(3, title, False, _outside(knob, configured, x))
    if not bad[i]:
        why = (f"batch efficiency {_pct(eff[i])}" if not low[i] else
               f"batches run {_pct(eff[i])} full, but the node is at or over capacity there, so arrivals are not "
               "what limits it")
        elsewhere = ""
        if bad.any():
            elsewhere = (f" (Batches run under half full while the node keeps up at {knob} = "
                         f"{', '.join(fmt_value(knob, v) for v in x[bad])}, values the scenario does not run.)")
        return Card(3, title, False, f"Not fired at {_at_configured(knob, configured, x[i])}: {why}.{elsewhere}")
    row = df.iloc[i]
    batch = float(x[i]) if knob == "max_batch_size" else float(policy.max_batch_size)
    if knob == "max_batch_size" and configured is not None:
        batch = float(configured)
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
    text = (f"At {_at_configured(knob, configured, x[i])} batches run under half full while the node keeps up "
            f"with the traffic: requests arrive too slowly for a cap of {batch:,.0f}. Lower max_batch_size to "
            f"{fmt_value('max_batch_size', suggestion)}{longer}.")
    return Card(3, title, True, text, triggers, suggestion, "max_batch_size")


def cards(df: pd.DataFrame, knob: str, scenario: Scenario, knee: float | None, share: float) -> list[Card]:
    """The three guided checks on one policy's sweep (a ``with_readings`` frame), in order. They speak about
    the scenario's configured values: a knob the policy does not use fires none."""
    pol = scenario.policy
    cap = cap_name(pol)
    if not knob_applies(knob, pol, scenario):
        why = (f"Not fired: the policy ({pol.mode} batching) does not use {knob}, so every value swept runs the "
               "same; sweep a knob it uses.")
        return [Card(n, TITLES[n], False, why) for n in (1, 2, 3)]
    configured = current_value(scenario, knob)
    return [card_cap_too_large(df, knob, knee, share, configured),
            card_cap_too_small(df, knob, pol, current_value(scenario, cap), configured, knee),
            card_efficiency_low(df, knob, pol, configured)]


def knee_sentence(df: pd.DataFrame, knob: str, knee: float | None, share: float, unit: str = "node") -> str:
    """One sentence on the knee: where it is, what the rest of the range adds and what it costs (a capacity's rate
    per ``unit``: ``capacity.rate_unit``)."""
    basis = knee_basis(df, knob)
    if basis is not None:
        return _slo_knee_sentence(df, knob, knee, share, basis, unit)
    rate = knob == "rate_req_s"
    thr_key = "steady_output_tok_s" if rate else "capacity_output_tok_s"
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
    name, change = knee_words(float(at[thr_key]), float(past[thr_key].max()), share)
    return (f"{name} at {knob} = {fmt_value(knob, knee)}: past it {what} {change} "
            f"({_tok(float(at[thr_key]))} → at most {_tok(float(past[thr_key].max()))}) while {lats[worst]} rises "
            f"from {_sec(float(at[worst]))} to {_sec(float(past[worst].max()))}.")


def _slo_knee_sentence(df: pd.DataFrame, knob: str, knee: float | None, share: float, basis: str,
                       unit: str = "node") -> str:
    rate = knob == "rate_req_s"
    what = "goodput within the SLOs" if rate else "capacity within the SLOs"
    y = knee_series(df, knob)
    if knee is None:
        if not (y > 0).any():
            return ("No knee: no value swept meets the SLOs" + (" at its offered load" if rate else " at any rate")
                    + ". Relax the SLOs or change the scenario.")
        return (f"No knee in this range: {what} grows by {share * 100:.0f} % or more past every value. Widen the "
                "range to find where it stops paying.")
    x = df[knob].to_numpy(float)
    i = int(np.flatnonzero(x == knee)[0])
    past = y[i + 1:]
    if rate and (past <= 0).all():
        return (f"Knee at {knob} = {fmt_value(knob, knee)}: the highest rate swept at which the SLOs hold (goodput "
                f"{_req(float(y[i]))}); past it they fail for more requests than the attainment target allows.")
    name, change = knee_words(float(y[i]), float(np.nanmax(past)), share)
    text = (f"{name} at {knob} = {fmt_value(knob, knee)}: past it {what} {change} "
            f"({_req(float(y[i]))} → at most {_req(float(np.nanmax(past)))}")
    if rate:
        return text + ")."
    binding = df["binding_slo"].iloc[i] if "binding_slo" in df.columns else None
    limit = f", bound by {SLO_LABELS.get(binding, binding)}" if isinstance(binding, str) else ""
    return text + f" per {unit}{limit})."


# ---------------------------------------------------------------- a sweep study, read


@dataclass(frozen=True, eq=False)
class SweepStudy:
    """One knob swept for one policy, read: its frame (with ``READING_COLUMNS``), the knee, the knee sentence
    and the guided checks; plus, for the throughput-latency frontier, the same range swept with other policies
    (``frames``, ``knees``) and the ones that could not run it (``skipped``: name -> why)."""

    knob: str
    values: tuple[float, ...]
    scenario: Scenario  # with the swept policy: the one the checks read
    label: str  # the swept policy's name (first in ``frames``)
    share: float  # the knee share
    frames: dict[str, pd.DataFrame]
    knees: dict[str, float | None]
    policies: dict[str, BatchingPolicy]
    cards: tuple[Card, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    slo: SLO | None = None  # the SLOs the knee is constrained by (None: a sweep read without them)
    slo_is_default: bool = False  # the SLOs are ``default_slo``'s, none were given

    @property
    def frame(self) -> pd.DataFrame:
        return self.frames[self.label]

    @property
    def knee(self) -> float | None:
        return self.knees[self.label]

    @property
    def fired(self) -> list[Card]:
        return [c for c in self.cards if c.fired]

    def knee_sentence(self) -> str:
        return knee_sentence(self.frame, self.knob, self.knee, self.share, rate_unit(self.scenario))

    def points(self) -> pd.DataFrame:
        """Every policy's rows, a ``policy`` column first."""
        out = pd.concat([d.assign(policy=n) for n, d in self.frames.items()], ignore_index=True)
        return out[["policy", *[c for c in out.columns if c != "policy"]]]

    def slo_text(self) -> str:
        """'SLOs: TTFT ≤ ... (the default; ...)', or '' for a sweep read without SLOs."""
        if self.slo is None:
            return ""
        text = f"SLOs: {self.slo.describe(class_names(self.scenario))}"
        if self.slo_is_default:
            text += " (the default SLOs: none were given)"
        return text + "."

    def checks_text(self) -> str:
        """The knee sentence and the guided checks as plain text (what ``python -m batching sweep`` prints after
        its table)."""
        lines = [self.knee_sentence(), "", "Guided checks:"]
        for c in self.cards:
            lines.append(f"{c.number} · {c.title}: {'FIRED' if c.fired else 'not fired'}")
            lines.append(f"  {c.text}")
            if c.fired:
                lines += [f"  - {t}" for t in c.triggers]
        if not self.fired:
            lines.append(NONE_FIRED)
        return "\n".join(lines)


def read_sweeps(scenario: Scenario, knob: str, values: Sequence[float], frames: Mapping[str, pd.DataFrame],
                share: float = DEFAULT_SHARE, label: str | None = None,
                policies: Mapping[str, BatchingPolicy] | None = None,
                skipped: Mapping[str, str] | None = None, slo: SLO | None = None,
                slo_is_default: bool = False) -> SweepStudy:
    """A ``SweepStudy`` from sweeps already run (``with_readings`` frames; the first, or ``label``, is the
    scenario's policy): a knee per frame, the checks on the first. ``slo``: the SLOs the sweeps were run with
    (``sweeps.sweep(..., slo=...)``), whose capacity the knees are read on."""
    share = check_share(share)
    if not frames:
        raise ValueError("frames is empty; give at least the swept policy's sweep")
    label = label if label is not None else next(iter(frames))
    frames = {label: frames[label], **{n: d for n, d in frames.items() if n != label}}
    knees = {n: sweep_knee(d, knob, share) for n, d in frames.items()}
    pols = {label: scenario.policy, **dict(policies or {})}
    return SweepStudy(knob, tuple(float(v) for v in values), scenario, label, share, frames, knees, pols,
                      tuple(cards(frames[label], knob, scenario, knees[label], share)), dict(skipped or {}), slo,
                      slo_is_default)


def study_slo(scenario: Scenario, slo: SLO | None) -> tuple[SLO, bool]:
    """(the SLOs a sweep is read with, whether they are the default): ``slo``, or ``default_slo`` for the
    scenario's classes when none is given."""
    if slo is not None:
        return slo, False
    return default_slo(len(class_names(scenario))), True


def sweep_study(scenario: Scenario, knob: str, values: Sequence[float], share: float = DEFAULT_SHARE,
                label: str = "policy", progress: Progress | None = None, workers: int | None = None,
                slo: SLO | None = None) -> SweepStudy:
    """Sweep the scenario's policy over ``values`` (with capacity runs and, per value, a capacity search within
    the SLOs: ``slo``, or the default SLOs) and read it: the CLI's ``sweep``."""
    check_share(share)
    slo, is_default = study_slo(scenario, slo)
    df = sweep(scenario, knob, list(values), progress=progress, workers=workers, slo=slo)
    return read_sweeps(scenario, knob, values, {label: with_readings(df, scenario, knob)}, share, label, slo=slo,
                       slo_is_default=is_default)


# ---------------------------------------------------------------- a capacity plan


@dataclass(frozen=True, eq=False)
class CapacityPlan:
    """Capacity searches of several policies for the same SLOs, priced for one target traffic: each result
    carries its nodes needed and $ per million output tokens at the target and at capacity
    (``CapacityResult.with_plan``: ``studies.pricing.price``), with the headroom factor for the cost model's known
    error (``studies.capacity.HEADROOM_RANGE``; default ``pricing.DEFAULT_HEADROOM``)."""

    slo: SLO
    target_rate_req_s: float | None
    gpu_hour_usd: float | None
    scenario: Scenario
    results: dict[str, CapacityResult]
    headroom: float = DEFAULT_HEADROOM
    mean_output_tokens: float = float("nan")  # of the scenario's admitted requests: the target's tokens per request

    @property
    def num_gpus(self) -> int:
        return self.scenario.deployment.node.num_gpus

    def points(self) -> dict[str, pd.DataFrame]:
        """Every rate each search tried, per policy."""
        return {n: r.points for n, r in self.results.items()}

    def max_rates(self) -> dict[str, float]:
        return {n: r.max_rate_req_s for n, r in self.results.items()}

    def failed(self) -> list[str]:
        """Policies for which no rate tried met the SLOs, not even the lowest."""
        return [n for n, r in self.results.items() if r.max_rate_req_s <= 0]

    def verdict(self) -> str:
        """One sentence: which policy sustains the most traffic within the SLOs, the nodes and the cost."""
        ok = {n: r for n, r in self.results.items() if r.max_rate_req_s > 0}
        if not ok:
            return ""
        best = max(ok, key=lambda n: ok[n].max_rate_req_s)
        b = ok[best]
        text = (f"'{best}' sustains the most traffic within the SLOs: {_rate(b.max_rate_req_s)} per "
                f"{rate_unit(self.scenario)}")
        if b.nodes_needed is not None and self.target_rate_req_s is not None:
            text += (f", so {b.nodes_needed:,} node{'s' if b.nodes_needed != 1 else ''} serve "
                     f"{self.target_rate_req_s:,.4g} req/s")
        if b.usd_per_million_output_tokens is not None:
            text += f", at ${b.usd_per_million_output_tokens:,.2f} per million output tokens at that traffic"
            if b.usd_per_million_output_tokens_at_capacity is not None:
                text += f" (${b.usd_per_million_output_tokens_at_capacity:,.2f} at capacity)"
        if b.nodes_needed is not None or b.usd_per_million_output_tokens is not None:
            text += f" ({self.headroom:g}× headroom)"
        worst = min(ok, key=lambda n: ok[n].max_rate_req_s)
        if worst != best:
            w = ok[worst]
            text += f". '{worst}' sustains {_rate(w.max_rate_req_s)}"
            if w.nodes_needed is not None:
                text += f" ({w.nodes_needed:,} node{'s' if w.nodes_needed != 1 else ''}"
                if b.nodes_needed and w.nodes_needed >= IMPRACTICAL_NODES_RATIO * b.nodes_needed:
                    text += (f", {w.nodes_needed / b.nodes_needed:,.0f}× the nodes of '{best}': "
                             "not a practical deployment")
                text += ")"
        return text + "."


def plan_capacity(scenario: Scenario, slo: SLO, results: Mapping[str, CapacityResult],
                  target_rate_req_s: float | None = None, gpu_hour_usd: float | None = None,
                  headroom: float = DEFAULT_HEADROOM) -> CapacityPlan:
    """Price capacity searches already run (one per policy, on ``scenario``'s deployment) for a target, a
    price and a headroom factor, as ``studies.capacity.capacity`` does: changing them runs nothing."""
    slo.validate()
    mean_out = mean_output_tokens(scenario)  # the same requests for every policy
    priced = {n: r.with_plan(scenario, target_rate_req_s, gpu_hour_usd, headroom, mean_out)
              for n, r in results.items()}
    return CapacityPlan(slo, target_rate_req_s, gpu_hour_usd, scenario, priced, float(headroom), mean_out)
