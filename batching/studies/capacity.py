"""SLO-driven capacity: the highest request rate per node that meets the SLOs, and what it costs."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, simulate
from batching.studies.compare import Progress

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
