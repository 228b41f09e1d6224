"""Knob sweeps: one simulation per value of one knob (plus a saturated run for capacity and, with SLOs, a
capacity search within them)."""
from __future__ import annotations

import pandas as pd

from batching.sim.metrics import saturated_capacity
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, simulate
from batching.studies.capacity import SLO, capacity, class_names, classes_meeting, slo_reading
from batching.studies.compare import Progress

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
# knobs that take whole numbers
INT_KNOBS = frozenset({"max_batch_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens"})
SWEEP_METRICS = ("throughput_output_tok_s", "steady_output_tok_s", "capacity_output_tok_s", "ttft_p50_s",
                 "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s", "itl_p99_s", "gpu_util", "sol_util", "busy",
                 "mfu", "mbu", "kv_util", "batch_efficiency",
                 "preemptions", "mean_running", "max_kv_blocks", "kv_capacity_tokens", "capacity_tpot_p99_s")


def apply_knob(scenario: Scenario, knob: str, value) -> Scenario:
    """The scenario with one knob set (policy knobs, traffic mix, rate or KV cache size)."""
    if knob not in KNOBS:
        raise ValueError(f"knob={knob!r} is unknown; allowed: {', '.join(KNOBS)}")
    if knob in INT_KNOBS:
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


# with SLOs, each point also carries: its SLO attainment at the offered load, whether that meets the target
# (``slo_met``) and its goodput there, and its capacity within the SLOs (``studies.capacity.capacity``: the
# highest rate per node at which they hold) with the SLO that binds there
SLO_METRICS = ("slo_attainment", "slo_met", "goodput_req_s", "max_rate_req_s", "binding_slo")


def _simulate(sc: Scenario, saturated: bool = False):
    return simulate(sc, saturated=saturated)


def run_point(sc: Scenario, with_capacity: bool, slo: SLO | None = None, search: bool = True,
              run=None, probe=None) -> dict:
    """One value's row (every summary metric; with ``slo`` also ``SLO_METRICS``, the capacity search when
    ``search``). ``run(scenario, saturated)`` stands in for ``simulate``: anything with ``summary()`` and what
    ``capacity.slo_reading`` reads (the dashboard passes cached, reduced results); the row is the same.
    ``probe(scenario)``: the same for the capacity search's rates (default: ``run`` unsaturated, or, without
    ``run``, a run without its step table)."""
    run = run or _simulate
    res = run(sc, False)
    s = res.summary()
    if slo is not None:
        at = slo_reading(res, slo)
        s["slo_attainment"], s["goodput_req_s"] = at["attainment"], at["goodput_req_s"]
        s["slo_met"] = classes_meeting(at, slo)  # every class within its own SLOs, as the capacity search
    if with_capacity or (slo is not None and search):
        sat = run(sc, True).summary()
        s["capacity_output_tok_s"] = saturated_capacity(sat)[1]  # a split: its steady state
        s["capacity_tpot_p99_s"] = sat["tpot_p99_s"]  # per-token latency with the batch full
        if slo is not None and search:
            cap = capacity(sc, slo, ceiling=saturated_capacity(sat)[0],
                           run=probe or (None if run is _simulate else (lambda x: run(x, False))))
            s["max_rate_req_s"], s["binding_slo"] = cap.max_rate_req_s, cap.binding_slo
    return s



def point_scenarios(scenario: Scenario, knob: str, values, slo: SLO | None = None) -> list[Scenario]:
    """The scenario of each value, every one validated (and the SLOs against the classes) before any runs."""
    values = list(values)
    if not values:
        raise ValueError("values is empty; give at least one value to sweep")
    scenarios = [apply_knob(scenario, knob, v) for v in values]
    for sc in scenarios:
        sc.validate()
    if slo is not None:
        slo.validate(len(class_names(scenario)))
    return scenarios


def searches_per_value(knob: str) -> bool:
    """Whether each value gets its own capacity search within the SLOs: the request rate does not move that
    capacity, so a rate sweep shares one search of the base scenario."""
    return knob != "rate_req_s"


def sweep_frame(knob: str, values, rows, slo: SLO | None = None, shared=None) -> pd.DataFrame:
    """The sweep's frame from one row per value (``run_point``), in the order of ``values``; ``shared``: the one
    capacity search of a rate sweep (a ``CapacityResult``)."""
    rows = [dict(r) for r in rows]
    if shared is not None:
        for r in rows:
            r["max_rate_req_s"], r["binding_slo"] = shared.max_rate_req_s, shared.binding_slo
    metrics = SWEEP_METRICS + (SLO_METRICS if slo is not None else ())
    df = pd.DataFrame([{k: r.get(k, float("nan")) for k in metrics} for r in rows])
    df.insert(0, knob, [float(v) for v in values])
    return df.sort_values(knob, kind="stable").reset_index(drop=True)


def sweep(scenario: Scenario, knob: str, values, policy: BatchingPolicy | None = None,
          progress: Progress | None = None, with_capacity: bool = True, workers: int | None = None,
          slo: SLO | None = None) -> pd.DataFrame:
    """One simulation per knob value (plus a saturated one for capacity), run on threads (the
    kernel releases the GIL). Returns one row per value with every summary metric.

    With ``slo``, each row also holds ``SLO_METRICS``: the attainment and goodput at the offered load and
    ``max_rate_req_s``, the value's capacity within the SLOs (a capacity search, about seven simulations, per
    value; one search for the request rate, which the search itself varies)."""
    import os
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if policy is not None:
        scenario = scenario.with_policy(policy)
    values = list(values)
    scenarios = point_scenarios(scenario, knob, values, slo)  # validate all before running any
    per_value = searches_per_value(knob)
    rows: list[dict | None] = [None] * len(values)
    workers = workers or max(1, min(len(values), os.cpu_count() or 1))
    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_point, sc, with_capacity, slo, per_value): i for i, sc in enumerate(scenarios)}
        shared = pool.submit(capacity, scenario, slo) if slo is not None and not per_value else None
        for fut in as_completed(futures):
            i = futures[fut]
            rows[i] = fut.result()
            done += 1
            if progress:
                shown = f"{int(values[i]):,}" if knob in INT_KNOBS else f"{values[i]:g}"
                progress(done, len(values), f"{knob} = {shown}")
        cap = shared.result() if shared is not None else None
    return sweep_frame(knob, values, rows, slo, cap)
