"""Knob sweeps: one simulation per value of one knob (plus a saturated run for capacity)."""
from __future__ import annotations

import pandas as pd

from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, simulate
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
