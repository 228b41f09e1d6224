"""Studies over many simulations: the preset showdown (sweeps and capacity search build on it)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, SimResult, simulate

# progress(done, total, message)
Progress = Callable[[int, int, str], None]

# columns of the classic comparison table: summary key -> header with unit
COMPARE_COLUMNS: dict[str, str] = {
    "throughput_output_tok_s": "Throughput at this load (output tok/s)",
    "capacity_output_tok_s": "Capacity (output tok/s)",
    "ttft_p50_s": "TTFT P50 (s)",
    "ttft_p99_s": "TTFT P99 (s)",
    "tpot_p50_s": "TPOT P50 (s)",
    "tpot_p99_s": "TPOT P99 (s)",
    "e2e_p99_s": "E2E P99 (s)",
    "gpu_util": "GPU util (0-1)",
    "batch_efficiency": "Batch efficiency (0-1)",
    "preemptions": "Preemptions",
}


@dataclass(frozen=True, eq=False)
class Comparison:
    results: dict[str, SimResult]  # at the offered load
    saturated: dict[str, SimResult]  # every request at t = 0

    def summaries(self) -> dict[str, dict]:
        return {name: with_capacity(res.summary(), self.saturated[name].summary())
                for name, res in self.results.items()}

    def table(self) -> pd.DataFrame:
        """One row per policy, the classic columns (raw summary keys as column names)."""
        rows = {name: {k: s[k] for k in COMPARE_COLUMNS} for name, s in self.summaries().items()}
        return pd.DataFrame.from_dict(rows, orient="index")


def with_capacity(summary: dict, saturated_summary: dict) -> dict:
    """A run's summary with ``capacity_output_tok_s`` from its saturated twin."""
    return {**summary, "capacity_output_tok_s": saturated_summary["throughput_output_tok_s"]}


def compare(scenario: Scenario, policies: Mapping[str, BatchingPolicy] | None = None,
            progress: Progress | None = None) -> Comparison:
    """Run each policy on the scenario at its offered load and saturated (for capacity)."""
    policies = dict(PRESETS if policies is None else policies)
    total = 2 * len(policies)
    results, saturated = {}, {}
    done = 0
    for name, pol in policies.items():
        sc = scenario.with_policy(pol)
        for sat, store in ((False, results), (True, saturated)):
            if progress:
                progress(done, total, f"{name}: {'capacity run' if sat else 'offered load'}")
            store[name] = simulate(sc, saturated=sat)
            done += 1
    if progress:
        progress(total, total, "done")
    return Comparison(results, saturated)


def verdict(summaries: Mapping[str, dict]) -> str:
    """One plain sentence reading a comparison: who wins, by how much, at what latency."""
    if not summaries:
        return ""
    best = max(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    worst = min(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    b, w = summaries[best], summaries[worst]
    fastest = min(summaries, key=lambda k: summaries[k]["ttft_p99_s"])
    ratio = b["capacity_output_tok_s"] / max(w["capacity_output_tok_s"], 1e-9)
    return (
        f"'{best}' has the highest capacity, {b['capacity_output_tok_s']:,.0f} output tok/s, "
        f"{ratio:.1f}x '{worst}' ({w['capacity_output_tok_s']:,.0f}); at this load it serves "
        f"{b['throughput_output_tok_s']:,.0f} tok/s with P99 TTFT {b['ttft_p99_s']:.2f} s and P99 TPOT "
        f"{b['tpot_p99_s'] * 1e3:.0f} ms. Lowest P99 TTFT: '{fastest}' ({summaries[fastest]['ttft_p99_s']:.2f} s)."
    )


# --- sweeps -----------------------------------------------------------------------------
# knob name -> (label with unit, how to apply a value to a scenario)
KNOBS: dict[str, str] = {
    "max_batch_size": "Max batch size (requests)",
    "max_num_seqs": "Max sequences per step",
    "max_wait_s": "Max wait (s)",
    "max_num_batched_tokens": "Token budget / chunk size (tokens)",
    "high_share": "High-priority share (0-1)",
    "rate_req_s": "Request rate (req/s)",
    "kv_cache_tokens": "KV cache (tokens)",
}
_INT_KNOBS = {"max_batch_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens"}
SWEEP_METRICS = ("throughput_output_tok_s", "capacity_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                 "tpot_p99_s", "e2e_p99_s", "itl_p99_s", "gpu_util", "busy", "mfu", "mbu", "batch_efficiency",
                 "preemptions", "mean_running", "max_kv_blocks", "kv_capacity_tokens", "capacity_tpot_p99_s")


def apply_knob(scenario: Scenario, knob: str, value) -> Scenario:
    """The scenario with one knob set (policy knobs, traffic mix, rate or KV cache size)."""
    if knob not in KNOBS:
        raise ValueError(f"knob={knob!r} is unknown; allowed: {', '.join(KNOBS)}")
    if knob in _INT_KNOBS:
        if float(value) != int(float(value)):
            raise ValueError(f"{knob}={value!r} must be a whole number")
        value = int(float(value))
    else:
        value = float(value)
    if knob == "rate_req_s":
        return scenario.with_workload(scenario.workload.with_rate(value))
    if knob == "high_share":
        if not hasattr(scenario.workload, "with_high_share"):
            raise ValueError("high_share needs a synthetic workload with priority classes, not a trace")
        return scenario.with_workload(scenario.workload.with_high_share(value))
    if knob == "kv_cache_tokens":
        dep = scenario.deployment.with_kv_cache_tokens(value)
        dep.validate()
        return scenario.with_deployment(dep)
    from batching.sim.policy import with_knobs
    return scenario.with_policy(with_knobs(scenario.policy, **{knob: value}))


def _run_point(sc: Scenario, with_capacity: bool) -> dict:
    s = simulate(sc).summary()
    if with_capacity:
        sat = simulate(sc, saturated=True).summary()
        s["capacity_output_tok_s"] = sat["throughput_output_tok_s"]
        s["capacity_tpot_p99_s"] = sat["tpot_p99_s"]  # per-token latency with the batch full
    return s


def sweep(scenario: Scenario, knob: str, values, policy: BatchingPolicy | None = None,
          progress: Progress | None = None, with_capacity: bool = True, workers: int | None = None) -> pd.DataFrame:
    """One simulation per knob value (plus a saturated one for capacity), run on threads (the
    kernel releases the GIL). Returns one row per value with every summary metric."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    if policy is not None:
        scenario = scenario.with_policy(policy)
    values = list(values)
    if not values:
        raise ValueError("values is empty; give at least one value to sweep")
    scenarios = [apply_knob(scenario, knob, v) for v in values]  # validate all before running any
    for sc in scenarios:
        sc.validate()
    rows: list[dict | None] = [None] * len(values)
    workers = workers or max(1, min(len(values), os.cpu_count() or 1))
    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_point, sc, with_capacity): i for i, sc in enumerate(scenarios)}
        from concurrent.futures import as_completed
        for fut in as_completed(futures):
            i = futures[fut]
            rows[i] = fut.result()
            done += 1
            if progress:
                progress(done, len(values), f"{knob} = {values[i]}")
    df = pd.DataFrame([{k: r.get(k, float("nan")) for k in SWEEP_METRICS} for r in rows])
    df.insert(0, knob, [float(v) for v in values])
    return df.sort_values(knob, kind="stable").reset_index(drop=True)


def find_knee(x, throughput, latencies, share: float = 0.05):
    """The smallest x past which throughput grows by less than ``share`` (relative) while some
    latency series still rises; None when throughput keeps growing or latency stays flat."""
    import numpy as np

    x = np.asarray(x, float)
    y = np.asarray(throughput, float)
    lats = [np.asarray(lat, float) for lat in latencies]
    order = np.argsort(x, kind="stable")
    x, y, lats = x[order], y[order], [lat[order] for lat in lats]
    for i in range(len(x) - 1):
        if not np.isfinite(y[i]) or y[i] <= 0:
            continue
        gain = np.nanmax(y[i:]) / y[i] - 1.0
        rising = any(np.nanmax(lat[i + 1:]) > lat[i] * (1 + 1e-9) for lat in lats)
        if gain < share and rising:
            return float(x[i])
    return None


def sweep_knee(df: pd.DataFrame, knob: str, share: float = 0.05):
    """Knee of a sweep. For the request rate: throughput at the offered load against P99 TTFT
    and TPOT. For the other knobs: capacity against P99 TTFT and TPOT at the offered load and
    P99 TPOT at capacity (what a fuller batch costs each token)."""
    if knob == "rate_req_s":
        return find_knee(df[knob], df["throughput_output_tok_s"], [df["ttft_p99_s"], df["tpot_p99_s"]], share)
    lats = [df["ttft_p99_s"], df["tpot_p99_s"], df["capacity_tpot_p99_s"]]
    return find_knee(df[knob], df["capacity_output_tok_s"], lats, share)


# --- SLO-driven capacity ----------------------------------------------------------------
@dataclass(frozen=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    attainment: float = 0.99  # share of requests that must meet every SLO

    def validate(self) -> None:
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("give at least one SLO: ttft_s, tpot_s or e2e_s")
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not (0 < v <= 3600):
                raise ValueError(f"slo {name}={v!r} is out of range; allowed > 0 to 3600")
        if not (0 < self.attainment <= 1):
            raise ValueError(f"attainment={self.attainment!r} is out of range; allowed > 0 to 1")

    def items(self):
        return [(k, getattr(self, k)) for k in ("ttft_s", "tpot_s", "e2e_s") if getattr(self, k) is not None]


def slo_point(sc: Scenario, slo: SLO) -> dict:
    """Simulate at the scenario's rate: attainment overall and per SLO, goodput, throughput."""
    from batching.sim.metrics import slo_mask, wall_time

    res = simulate(sc)
    req = res.requests
    wall = wall_time(req)
    ok = slo_mask(req, slo.ttft_s, slo.tpot_s, slo.e2e_s)
    per = {k: float(slo_mask(req, **{f"slo_{k}": v}).mean()) for k, v in slo.items()}
    s = res.summary()
    return {"rate_req_s": sc.workload.rate_req_s, "attainment": float(ok.mean()), "per_slo": per,
            "goodput_req_s": float(ok.sum()) / wall if wall > 0 else float("nan"),
            "throughput_output_tok_s": s["throughput_output_tok_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p99_s": s["tpot_p99_s"]}


def plan_costs(rate_req_s: float, throughput_output_tok_s: float, num_gpus: int,
               target_rate_req_s: float | None = None, gpu_hour_usd: float | None = None):
    """(nodes needed for the target rate, $ per million output tokens at that throughput);
    None where not asked for or not defined (no sustainable rate)."""
    import math

    nodes = usd = None
    if target_rate_req_s is not None:
        if not target_rate_req_s > 0:
            raise ValueError(f"target_rate_req_s={target_rate_req_s!r} is out of range; allowed > 0")
        nodes = math.ceil(target_rate_req_s / rate_req_s - 1e-9) if rate_req_s > 0 else None
    if gpu_hour_usd is not None:
        if not gpu_hour_usd > 0:
            raise ValueError(f"gpu_hour_usd={gpu_hour_usd!r} is out of range; allowed > 0")
        if throughput_output_tok_s > 0:
            usd = num_gpus * gpu_hour_usd / 3600.0 / throughput_output_tok_s * 1e6
    return nodes, usd


@dataclass(frozen=True, eq=False)
class CapacityResult:
    max_rate_req_s: float
    throughput_output_tok_s: float
    goodput_req_s: float
    binding_slo: str | None
    nodes_needed: int | None
    usd_per_million_output_tokens: float | None
    points: pd.DataFrame  # every rate tried: rate, attainment, goodput, throughput

    def to_dict(self) -> dict:
        return {"max_rate_req_s": self.max_rate_req_s, "throughput_output_tok_s": self.throughput_output_tok_s,
                "goodput_req_s": self.goodput_req_s, "binding_slo": self.binding_slo,
                "nodes_needed": self.nodes_needed,
                "usd_per_million_output_tokens": self.usd_per_million_output_tokens}


def capacity(scenario: Scenario, slo: SLO, policy: BatchingPolicy | None = None, target_rate_req_s: float | None = None,
             gpu_hour_usd: float | None = None, rel_tol: float = 0.01, progress: Progress | None = None,
             max_iter: int = 20) -> CapacityResult:
    """Highest request rate per node at which ``slo.attainment`` of requests meet every SLO,
    by bracketing then bisecting on the rate (the same requests, arrivals rescaled)."""
    import math

    slo.validate()
    if policy is not None:
        scenario = scenario.with_policy(policy)
    plan_costs(1.0, 1.0, 1, target_rate_req_s, gpu_hour_usd)  # validates target and price before searching
    scenario.validate()
    wl = scenario.workload
    # the saturated run bounds the rate: no policy sustains more requests/s than it serves flat out
    sat = simulate(scenario, saturated=True)
    n = sat.summary()["num_requests"]
    ceiling = n / max(sat.summary()["duration_s"], 1e-9)
    points: list[dict] = []
    step = [0]

    def probe(rate: float) -> dict:
        step[0] += 1
        if progress:
            progress(min(step[0], max_iter), max_iter, f"trying {rate:.3g} req/s")
        p = slo_point(scenario.with_workload(wl.with_rate(rate)), slo)
        points.append(p)
        return p

    hi = ceiling * 1.05
    lo = ceiling / 64
    p_lo = probe(lo)
    best = p_lo if p_lo["attainment"] >= slo.attainment else None
    if best is None:
        lo = 0.0
    else:
        p_hi = probe(hi)
        # a short run's saturated throughput understates the node (its tail drains with a thin
        # batch): while the upper rate still meets the SLOs, double it
        while p_hi["attainment"] >= slo.attainment and step[0] < max_iter // 2:
            best, lo = p_hi, hi
            hi *= 2.0
            p_hi = probe(hi)
        if p_hi["attainment"] >= slo.attainment:
            best, lo = p_hi, hi
        else:
            while hi - lo > rel_tol * hi and step[0] < max_iter:
                mid = math.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
                p = probe(mid)
                if p["attainment"] >= slo.attainment:
                    lo, best = mid, p
                else:
                    hi = mid
    if progress:
        progress(max_iter, max_iter, "done")
    # the binding SLO: the one with the lowest attainment at the first rate that fails
    failing = [p for p in points if p["attainment"] < slo.attainment]
    binding = None
    if failing:
        first_fail = min(failing, key=lambda p: p["rate_req_s"])
        binding = min(first_fail["per_slo"], key=first_fail["per_slo"].get)
    rate = lo if best is not None else 0.0
    thr = best["throughput_output_tok_s"] if best else 0.0
    nodes, usd = plan_costs(rate, thr, scenario.deployment.node.num_gpus, target_rate_req_s, gpu_hour_usd)
    df = pd.DataFrame([{k: v for k, v in p.items() if k != "per_slo"} for p in points]).sort_values("rate_req_s")
    return CapacityResult(rate, thr, best["goodput_req_s"] if best else 0.0, binding, nodes, usd,
                          df.reset_index(drop=True))
