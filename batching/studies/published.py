"""Published measurements the simulator is held against (issue 23 item 9): ``batching/data/published_points.csv``,
one row per measured figure with its source, its setting and whether it set a constant (``calibration``) or was
kept aside (``check``), and ``error_before``: the error the simulator had at 8561f67, before issue 23's engine
profiles, disaggregation and speculation changes (recorded once, by this module run on that commit).
``published_errors()`` simulates every setting once and gives each figure's error; the
speculative-decoding points live in ``batching.studies.spec_check`` (they need a pair of runs per figure).

A setting is the engine (its profile), the policy (``engine``: that engine's scheduler defaults; or a preset, for runs
of older engine versions: the SGLang v0.3 / vLLM v0.6 reference ran vLLM V0's whole-prompt steps), model, GPU, TP, GPUs, precision, traffic (ShareGPT-like
lengths or fixed ones; a request rate, ``inf`` = all at once, or closed-loop clients) and request count. Nothing here
is fitted: the figures only report.
"""
from __future__ import annotations

import math
from dataclasses import replace
from importlib import resources

import pandas as pd

from batching.sim.hardware.specs import deployment
from batching.sim.hardware.engines import engine_profile
from batching.sim.policy import NAMED_POLICIES, with_knobs
from batching.sim.topology.disagg import Disagg
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import LengthDist, workload_preset
from batching.studies import bench_files as bf

POINTS_FILE = "published_points.csv"
SETTING = ("engine", "policy", "model", "gpu", "tp", "num_gpus", "precision", "kv_dtype", "dataset", "prompt_tokens", "output_tokens",
           "requests", "request_rate", "concurrency", "split", "budget", "burstiness")


def points() -> pd.DataFrame:
    """Every published figure (batching/data/published_points.csv)."""
    with resources.files("batching.data").joinpath(POINTS_FILE).open("r", encoding="utf-8") as f:
        return pd.read_csv(f, dtype={"request_rate": str, "split": str})


def groups() -> tuple[str, ...]:
    return tuple(dict.fromkeys(points()["group"]))


def scenario_of(row, seed: int = 0) -> Scenario:
    """The setting of one row as a Scenario: its engine's profile and scheduler defaults."""
    dep = deployment(row.gpu, row.model, int(row.tp), int(row.num_gpus), row.precision, row.kv_dtype)
    rate = float(row.request_rate)
    n = int(row.requests)
    conc = None if pd.isna(row.concurrency) else int(row.concurrency)
    if row.dataset == "sharegpt":
        wl = workload_preset("sharegpt", rate if math.isfinite(rate) else 1.0, n, seed)
        if conc is not None:
            wl = wl.with_concurrency(conc, 0.0)
    else:
        shape = 1.0 if pd.isna(row.burstiness) else float(row.burstiness)  # vLLM's Gamma shape; 1: Poisson
        b = bf.BenchFile("published", row.id, None, n, rate, conc, shape, float(row.prompt_tokens),
                         float(row.output_tokens))
        wl = bf.bench_workload(b, n, seed)
    pol = engine_profile(row.engine).policy if row.policy == "engine" else NAMED_POLICIES[row.policy]
    if not pd.isna(row.budget):
        pol = with_knobs(pol, max_num_batched_tokens=int(row.budget))
    split = None
    if not pd.isna(row.split) and row.split:  # "PxT+DxU": P prefill instances of TP T, D decode instances of TP U
        (p, t), (d, u) = (map(int, side.split("x")) for side in row.split.split("+"))
        split = Disagg(p, t, d, u)
    return Scenario(dep, wl, pol, engine=row.engine, disagg=split)


def published_errors(seed: int = 0, groups: tuple[str, ...] | None = None, progress=None) -> pd.DataFrame:
    """id | group | role | metric | measured | simulated | error per published figure (latencies in s)."""
    pts = points()
    if groups:
        pts = pts[pts["group"].isin(groups)]
    rows = []
    settings = list(pts.groupby(list(SETTING), dropna=False, sort=False))
    for k, (_, grp) in enumerate(settings):
        first = grp.iloc[0]
        sc = scenario_of(first, seed)
        saturated = not math.isfinite(float(first.request_rate)) and pd.isna(first.concurrency)
        sim = bf.simulated_metrics(simulate(sc, saturated=saturated))
        for r in grp.itertuples(index=False):
            v = bf.sim_value(sim, r.metric)
            rows.append({"id": r.id, "group": r.group, "role": r.role, "metric": r.metric, "measured": r.value,
                         "simulated": v, "error": bf.error(r.value, v), "error_before": r.error_before,
                         "source": r.source})
        if progress is not None:
            progress(k + 1, len(settings))
    return pd.DataFrame(rows)


def group_summary(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and worst absolute error per group and role, now and before."""
    e = errors.assign(abs_error=errors["error"].abs(), abs_before=errors["error_before"].abs())
    g = e.groupby(["group", "role"])
    return pd.DataFrame({"points": g["abs_error"].count(), "median before": g["abs_before"].median(),
                         "median now": g["abs_error"].median(), "worst before": g["abs_before"].max(),
                         "worst now": g["abs_error"].max()}).reset_index()


METRIC_UNITS = {"ttft": ("TTFT", 1e3, "ms"), "tpot": ("TPOT", 1e3, "ms"), "itl": ("ITL", 1e3, "ms"),
                "e2e": ("E2E", 1e3, "ms"), "output": ("output throughput", 1.0, "tok/s")}


def pct(x: float) -> str:
    """An error as a signed percentage; "n/a" where there is none (a figure not simulated before)."""
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def metric_text(metric: str, value: float) -> str:
    name, scale, unit = METRIC_UNITS[metric.split("_")[0]]
    return f"{value * scale:,.4g} {unit}"


def markdown(errors: pd.DataFrame | None = None, jitter: pd.DataFrame | None = None) -> str:
    """The "Published points" section of docs/CALIBRATION.md: every figure, its error before and now, per group;
    ``jitter``: ``jitter_check``'s frame (the closed-loop note's figures)."""
    e = published_errors() if errors is None else errors
    lines = ["## Published points", "",
             "Every published figure the simulator is held against in `batching/data/published_points.csv`",
             "(`python -m batching calibrate --published` prints them; the speculative-decoding speed-ups are in",
             "\"Speculative decoding\" below). `calibration`: the figure set a constant; `check`: kept aside. Error =",
             "simulated / measured − 1; \"before\" is the simulator at 8561f67, before this round's engine profiles",
             "(n/a: a figure added later, not simulated at 8561f67; a closed loop on a prefill/decode split could not",
             "run then).",
             "", "| id | group | role | metric | measured | simulated | error before | error now |",
             "|---|---|---|---|---|---|---|---|"]
    for r in e.itertuples(index=False):
        lines.append(f"| {r.id} | {r.group} | {r.role} | {r.metric} | {metric_text(r.metric, r.measured)} | "
                     f"{metric_text(r.metric, r.simulated)} | {pct(r.error_before)} | {pct(r.error)} |")
    lines += ["", "| group | role | points | median before | median now | worst before | worst now |",
              "|---|---|---|---|---|---|---|"]
    for r in group_summary(e).itertuples(index=False):
        lines.append(f"| {r.group} | {r.role} | {r.points} | {pct(r[3]).lstrip('+')} | {r[4]:.1%} | "
                     f"{pct(r[5]).lstrip('+')} | {r[6]:.1%} |")
    lines += ["", "Sources (each applies to the ids after it until the next):", ""]
    for r in points().itertuples(index=False):
        if not r.source.startswith("the same"):
            lines.append(f"- from `{r.id}`: {r.source}")
    lines += ["", jitter_text(jitter)]
    return "\n".join(lines) + "\n\n"


JITTER_IDS = ("nim-70b-c5-ttft", "nim-70b-c25-ttft", "nim-70b-c50-ttft")  # closed-loop TTFTs of fixed-length runs
JITTER = 0.2  # outputs drawn uniformly within +-20 % of the published length


def drifting(sc: Scenario, out: float) -> Scenario:
    """``sc`` with every output drawn uniformly within JITTER of ``out`` tokens: closed-loop clients drift apart."""
    lengths = LengthDist("uniform", mean=out, low=int(out * (1 - JITTER)), high=int(out * (1 + JITTER)))
    return replace(sc, workload=replace(sc.workload, classes=tuple(replace(c, output=lengths)
                                                                   for c in sc.workload.classes)))


def dynamo_drift(errors: pd.DataFrame, seed: int = 0) -> dict:
    """Dynamo #402's disaggregated run (32 clients) with fixed and with drifting output lengths: P90 TTFT (s) of
    each, and the published one (``errors``: ``published_errors``' frame, whose run is the fixed one)."""
    pid = "dynamo402-70b-pd-ttft-p90"
    row = points().set_index("id", drop=False).loc[pid]
    fixed = errors.set_index("id").loc[pid]
    drift = simulate(drifting(scenario_of(row, seed), float(row.output_tokens)))
    return {"measured_p90_s": float(row.value), "fixed_p90_s": float(fixed.simulated),
            "drift_p90_s": drift.summary()["ttft_p90_s"]}


def jitter_check(errors: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The closed-loop NIM runs' TTFT with every output drawn from 0.8-1.2x the published length (clients drift
    apart as real ones do) beside the published setting's (fixed lengths: clients in lockstep): clients, measured,
    fixed and jittered mean TTFT (s), the jittered run's mean wait for the scheduler (s), and its mean TTFT of the
    first wave (every client's first request, sent at once) and of the rest (s). ``errors``: ``published_errors``'
    frame, whose runs are the fixed-length ones."""
    pts = points().set_index("id", drop=False)
    simulated = errors.set_index("id")["simulated"]
    rows = []
    for pid in JITTER_IDS:
        row = pts.loc[pid]
        drift = simulate(drifting(scenario_of(row, seed), float(row.output_tokens)))
        req = drift.requests
        first = req["arrival_s"].to_numpy() <= 0.0  # every client's first request, sent at once
        rows.append({"clients": int(row.concurrency), "measured_s": float(row.value), "fixed_s": float(simulated[pid]),
                     "jittered_s": drift.summary()["ttft_mean_s"],
                     "jittered_queue_s": float(req["queue_delay_s"].mean()),
                     "first_wave_s": float(req["ttft_s"][first].mean()),
                     "jittered_rest_s": float(req["ttft_s"][~first].mean())})
    return pd.DataFrame(rows)


def jitter_text(jitter: pd.DataFrame | None) -> str:
    """What fixed output lengths do to the closed-loop TTFT, from ``jitter_check``'s frame (None: not run)."""
    off = "" if jitter is None or len(jitter) == 0 else \
        f" by {(jitter.fixed_s / jitter.measured_s).min():.1f}-{(jitter.fixed_s / jitter.measured_s).max():.1f}x"
    head = (f"The closed-loop TTFT at 5 clients and more is off{off} in part because every simulated client's "
            "request has exactly the published output length, so the clients stay in lockstep: each wave's prompts "
            "arrive together and queue behind each other's prefill. Real clients drift apart (network and "
            "tokenisation jitter, end-of-sequence tokens); the model has no client jitter and the table keeps the "
            "published setting.")
    if jitter is None or len(jitter) == 0:
        return head + " (The run with drifting clients was not made: `calibrate --report` makes it.)"
    runs = ", ".join(f"{r.jittered_s:.2f} s at {r.clients} clients (measured {r.measured_s:.2f} s, fixed lengths "
                     f"{r.fixed_s:.2f} s)" for r in jitter.itertuples())
    ratio = jitter.jittered_s / jitter.measured_s
    worst = jitter.iloc[int(ratio.argmax())]
    near = [str(c) for c, r in zip(jitter.clients, ratio) if abs(r - 1) <= 0.15]
    text = (head + f" With outputs drawn from {1 - JITTER:.1f}-{1 + JITTER:.1f}x the published length the same runs "
            f"give a mean TTFT of {runs}. Lockstep explains the gap at "
            f"{' and '.join(near) + ' clients' if near else 'no client count'} (within 15 %).")
    if ratio.max() > 1.15:
        text += (f" Elsewhere the simulated TTFT stays up to {ratio.max():.1f}x the measured ({int(worst.clients)} "
                 f"clients), most of it a wait for the scheduler ({worst.jittered_queue_s:.2f} s mean).")
    if "first_wave_s" in jitter:
        rest = ", ".join(f"{r.jittered_rest_s:.2f} s at {r.clients}" for r in jitter.itertuples())
        text += (" That wait is the start: the simulated mean counts every client's first request, all sent at "
                 f"t = 0, whose prompts queue behind each other (their mean TTFT {worst.first_wave_s:.1f} s at "
                 f"{int(worst.clients)} clients). genai-perf run with a measurement interval (as the NIM guide's "
                 "examples are) reports perf_analyzer's stable measurement windows, which likely leave such a "
                 "start-up burst out (the published table does not say how it was measured); without the first wave "
                 f"the drifting runs give {rest} clients, "
                 f"{', '.join(f'{e:+.0%}' for e in jitter.jittered_rest_s / jitter.measured_s - 1)} against the "
                 "measured. The table keeps every request (the simulator has no measurement window).")
    return text
