"""Latency against load: each policy's P99 TTFT and P99 TPOT at a grid of request rates up to its capacity.

A policy's capacity (req/s) is what its saturated run serves flat out (every request queued at t = 0). Its
grid runs from ``low`` to ``high`` of that capacity, so every line stops short of the load it cannot carry
and the chart can mark where it ends. This is the chart serving papers draw (vLLM, Sarathi-Serve, DistServe):
latency stays flat until the knee, then climbs without bound.

``summarize(scenario, saturated) -> summary dict`` runs (or looks up) one simulation; the dashboard passes its
cached one, so a rerun with the same scenario costs nothing. The default simulates; ``workers`` > 1 runs the
grid on threads (the engine releases the GIL).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from batching.sim.metrics import saturated_capacity
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import MAX_RATE_REQ_S, SyntheticWorkload

Summarize = Callable[[Scenario, bool], dict]

POINTS = 8  # rates per policy: enough for a smooth line, few enough to keep the home page quick
LOW, HIGH = 0.10, 0.95  # of capacity: from light load to just short of saturation (at 100 % the queue grows)
COLUMNS = ("policy", "rate_req_s", "load", "ttft_p99_s", "tpot_p99_s", "throughput_output_tok_s",
           "capacity_req_s", "capacity_output_tok_s")


def _simulate_summary(scenario: Scenario, saturated: bool) -> dict:
    return simulate(scenario, saturated=saturated).summary()


def load_grid(capacity_req_s: float, points: int = POINTS, low: float = LOW, high: float = HIGH) -> np.ndarray:
    """``points`` evenly spaced request rates from ``low`` to ``high`` times the capacity (req/s), each kept
    within the workload's allowed rates; empty when the capacity is not a positive number."""
    if not (isinstance(capacity_req_s, (int, float)) and math.isfinite(capacity_req_s) and capacity_req_s > 0):
        return np.zeros(0)
    if not (0 < low <= high) or points < 1:
        raise ValueError(f"low={low}, high={high}, points={points}; allowed 0 < low <= high, points >= 1")
    rates = capacity_req_s * np.linspace(low, high, points)
    return np.unique(np.clip(rates, 1e-3, MAX_RATE_REQ_S))


def capacity_req_s(saturated_summary: Mapping) -> float:
    """Requests per second a saturated run serves flat out."""
    return saturated_capacity(saturated_summary)[0]  # a split: its steady state


def load_curve(scenario: Scenario, policies: Mapping[str, BatchingPolicy] | None = None, *,
               points: int = POINTS, low: float = LOW, high: float = HIGH,
               summarize: Summarize | None = None, workers: int = 1) -> pd.DataFrame:
    """One row per (policy, rate): P99 TTFT and TPOT at that offered rate, with the policy's capacity.

    Rates come from ``load_grid`` over each policy's own capacity. ``load`` is rate / capacity. A policy whose
    capacity cannot be measured (a run with no finished request) gets no rows.
    """
    policies = dict(PRESETS if policies is None else policies)
    summarize = summarize or _simulate_summary
    runs = max(1, int(workers))

    def each(fn, items):
        if runs == 1 or len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=runs) as pool:
            return list(pool.map(fn, items))

    scenarios = {name: scenario.with_policy(pol) for name, pol in policies.items()}
    saturated = dict(zip(scenarios, each(lambda n: summarize(scenarios[n], True), list(scenarios))))
    jobs: list[tuple[str, float]] = []
    for name in scenarios:
        for rate in load_grid(capacity_req_s(saturated[name]), points, low, high):
            jobs.append((name, float(rate)))

    def at_rate(job: tuple[str, float]) -> dict:
        name, rate = job
        return summarize(scenarios[name].with_workload(scenario.workload.with_rate(rate)), False)

    rows = []
    for (name, rate), s in zip(jobs, each(at_rate, jobs)):
        cap = capacity_req_s(saturated[name])
        rows.append({"policy": name, "rate_req_s": rate, "load": rate / cap, "ttft_p99_s": s["ttft_p99_s"],
                     "tpot_p99_s": s["tpot_p99_s"], "throughput_output_tok_s": s["throughput_output_tok_s"],
                     "capacity_req_s": cap,
                     "capacity_output_tok_s": saturated[name]["throughput_output_tok_s"]})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def slo_targets(scenario: Scenario) -> list[dict]:
    """The workload's per-class SLOs: ``{"name", "ttft_s", "tpot_s"}`` for each class. A class that sets none
    When no class sets one (the ``chat``, ``code`` and ``sharegpt`` presets), every class gets the default SLOs
    Capacity and Tune read the workload with (``capacity.default_slo``: TTFT 1 s for class 0, 30 s below, TPOT
    100 ms), named "<class>, default" (short: the label sits inside a half-width panel). A trace sets none."""
    from batching.studies.capacity import default_slo

    wl = scenario.workload
    if not isinstance(wl, SyntheticWorkload):
        return []
    classes = sorted(wl.classes, key=lambda c: c.priority)
    default = default_slo(len(classes))
    out = [{"name": c.name, "ttft_s": c.slo_ttft_s, "tpot_s": c.slo_tpot_s} for c in classes
           if c.slo_ttft_s is not None or c.slo_tpot_s is not None]
    if out:
        return out
    return [{"name": f"{c.name}, default", "ttft_s": default.for_class(level).get("ttft_s"),
             "tpot_s": default.for_class(level).get("tpot_s")} for level, c in enumerate(classes)]
