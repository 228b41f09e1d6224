"""Fit an engine profile to one measured benchmark run (``calibrate --bench FILE --fit``; issue 23 item 8).

Three numbers of the profile (``batching.sim.hardware.engines.EngineProfile``) move; the rest stay the base
profile's:

- ``speed``: one factor on the kernels' speed (GEMM, FP8 GEMM, prompt attention, KV reads together): what a
  faster or slower GPU, driver or kernel library than the calibrated one does to every step;
- ``step_s``: CPU time per step (scheduling, input preparation, launch gaps): what a faster or slower host, or an
  engine that overlaps its scheduler with the GPU, does to every step whatever its size;
- ``in_fixed_s``: the client-side time before a request reaches the engine's queue (HTTP, request parsing): what
  the client's path adds to TTFT only.

The three are what a serving benchmark can tell apart: TTFT moves with all three, TPOT and ITL with the first two,
and throughput mostly with the first (its kernels at large batch). The fit minimises, over the file's metrics
(mean and median latencies, throughputs; not the tails, which a few requests decide), the mean squared log error
per metric family (TTFT; TPOT and ITL; E2E; throughput), each family weighted alike, plus a small pull towards the
base profile so a metric the file lacks leaves its parameter where it was. Nelder-Mead (scipy) searches
within the ranges below; each evaluation is one simulation of the file's setting.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from batching.sim.hardware.engines import EngineProfile
from batching.sim.simulate import Scenario, simulate
from batching.studies import bench_files as bf

# parameter -> (lowest, highest) the fit searches
SPEED_RANGE = (0.25, 4.0)  # x the base profile's kernel factors
STEP_RANGE_S = (0.0, 0.02)  # per step
IN_FIXED_RANGE_S = (0.0, 2.0)  # per request, before the queue
PULL = 0.01  # weight of the pull towards the base profile (per parameter, on the scale of a squared log error)
DEFAULT_MAX_EVALS = 60
FIT_REQUESTS = 500  # requests per evaluation at most (the comparison after the fit runs the file's count)
_CENTRAL = re.compile(r"^(ttft|tpot|itl|e2e)_(mean|median|p50)_s$")
_FAMILY = {"ttft": "ttft", "tpot": "tpot", "itl": "tpot", "e2e": "e2e"}


@dataclass(frozen=True)
class FitResult:
    profile: EngineProfile  # the fitted profile
    base: EngineProfile
    before: pd.DataFrame  # bench_files.compare of the base profile (the file's request count)
    after: pd.DataFrame  # the same with the fitted profile
    evaluations: int
    metrics_used: tuple[str, ...]

    def parameters(self) -> dict[str, tuple[float, float]]:
        """Each fitted parameter: (base, fitted)."""
        return {"speed": (1.0, speed_of(self.profile, self.base)),
                "step_s": (self.base.step_s, self.profile.step_s),
                "in_fixed_s": (self.base.in_fixed_s, self.profile.in_fixed_s)}


def speed_of(profile: EngineProfile, base: EngineProfile) -> float:
    """The factor on the kernels' speed a fitted profile holds against its base."""
    return profile.gemm_eff / base.gemm_eff


def fit_metrics(b: bf.BenchFile) -> tuple[str, ...]:
    """The file's metrics the fit uses: central latencies (mean, median) and throughputs. E2E only when the file lists
    every request's output length: from mean lengths alone the simulated E2E median is that of fixed-length outputs,
    not the file's mix (a median of ShareGPT's skewed outputs is well below the mean's E2E), and would pull the fit."""
    return tuple(m for m in b.metrics if m in bf.THROUGHPUTS
                 or (_CENTRAL.match(m) and (b.output_lens or not m.startswith("e2e_"))))


def family(metric: str) -> str:
    return "throughput" if metric in bf.THROUGHPUTS else _FAMILY[metric.split("_")[0]]


def fitted_profile(base: EngineProfile, speed: float, step_s: float, in_fixed_s: float,
                   label: str | None = None) -> EngineProfile:
    """``base`` with its kernels ``speed`` times as fast, ``step_s`` per step and ``in_fixed_s`` per request."""
    prof = replace(base, gemm_eff=base.gemm_eff * speed, gemm_fp8_eff=base.gemm_fp8_eff * speed,
                   attn_eff=base.attn_eff * speed, kv_eff=base.kv_eff * speed, step_s=float(step_s),
                   in_fixed_s=float(in_fixed_s), **({"label": label[:80]} if label else {}))
    prof.validate()
    return prof


def loss(errors: dict[str, float]) -> float:
    """Mean over metric families of the mean squared log error (simulated / measured) within each."""
    fams: dict[str, list[float]] = {}
    for metric, ratio in errors.items():
        if ratio > 0 and math.isfinite(ratio):
            fams.setdefault(family(metric), []).append(math.log(ratio) ** 2)
        else:
            fams.setdefault(family(metric), []).append(25.0)  # nothing simulated: as bad as a factor of e^5
    return float(np.mean([np.mean(v) for v in fams.values()])) if fams else 0.0


def _ratios(b: bf.BenchFile, res, metrics: tuple[str, ...]) -> dict[str, float]:
    sim = bf.simulated_metrics(res)
    out = {}
    for m in metrics:
        v = bf.sim_value(sim, m)
        out[m] = (v / b.metrics[m]) if (v is not None and b.metrics[m]) else math.nan
    return out


def fit_profile(b: bf.BenchFile, sc: Scenario, *, max_evals: int = DEFAULT_MAX_EVALS,
                fit_requests: int = FIT_REQUESTS, progress: Callable[[int, float], None] | None = None) -> FitResult:
    """Fit ``sc``'s engine profile to the measured run ``b`` (``sc``: the file's setting, bench_files.bench_scenario).
    ``progress(evaluation, loss)`` after each simulation. ValueError when the file has no metric to fit."""
    from scipy.optimize import minimize  # only the fit needs it

    metrics = fit_metrics(b)
    if not metrics:
        raise ValueError(f"--bench {b.name!r}: the file has no mean or median latency and no throughput to fit to")
    base = sc.profile
    saturated = bf.saturated(b)
    n = sc.workload.num_requests
    fit_wl = replace(sc.workload, num_requests=min(n, fit_requests))
    fit_sc = replace(sc, workload=fit_wl)
    lo = np.array([math.log(SPEED_RANGE[0]), STEP_RANGE_S[0], IN_FIXED_RANGE_S[0]])
    hi = np.array([math.log(SPEED_RANGE[1]), STEP_RANGE_S[1], IN_FIXED_RANGE_S[1]])
    scale = np.array([1.0, 5e-3, 0.1])  # the pull's unit per parameter
    x0 = np.array([0.0, base.step_s, base.in_fixed_s])
    count = [0]
    best = [math.inf, x0]

    def prof_of(x: np.ndarray) -> EngineProfile:
        x = np.clip(x, lo, hi)
        return fitted_profile(base, math.exp(x[0]), x[1], x[2])

    def objective(x: np.ndarray) -> float:
        res = simulate(replace(fit_sc, engine=prof_of(x)), saturated=saturated)
        value = loss(_ratios(b, res, metrics)) + PULL * float(np.sum(((np.clip(x, lo, hi) - x0) / scale) ** 2))
        count[0] += 1
        if value < best[0]:
            best[0], best[1] = value, np.clip(x, lo, hi)
        if progress is not None:
            progress(count[0], value)
        return value

    simplex = np.array([x0, x0 + [0.3, 0, 0], x0 + [0, 2e-3, 0], x0 + [0, 0, 0.05]])
    minimize(objective, x0, method="Nelder-Mead", bounds=list(zip(lo, hi)),
             options={"maxfev": int(max_evals), "initial_simplex": np.clip(simplex, lo, hi), "xatol": 1e-4,
                      "fatol": 1e-5})
    x = best[1]
    label = f"{base.label}, fitted to {b.name}"
    prof = replace(prof_of(x), name=f"{base.name}-fit", label=label[:80])
    before = bf.compare(b, simulate(sc, saturated=saturated))
    after = bf.compare(b, simulate(replace(sc, engine=prof), saturated=saturated))
    return FitResult(prof, base, before, after, count[0], metrics)
