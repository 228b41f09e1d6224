"""``python -m batching calibrate --bench FILE``: a measured run (vllm bench serve --save-result JSON,
sglang.bench_serving JSONL, genai-perf's profile_export_genai_perf.json) simulated in the same setting, every metric
the file has beside the simulated one (issue 23 item 8; no fitting).

The setting: the model from the file's model id (a preset by its HuggingFace id; ``--model`` overrides), the lengths
from the file (fixed at its means, or its per-request lists resampled), its request count (``--requests`` caps it),
its rate (Poisson, vLLM's burstiness as a Gamma; genai-perf's rate evenly spaced), its clients (closed loop, with
``max_concurrency`` and an infinite rate) or all requests at once (an infinite rate, no cap). GPU, TP, GPUs and
precision from the flags (one server: ``--num-gpus`` defaults to ``--tp``); the policy from ``--preset``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from batching.cli.args import (CliError, _input_file, check_output_file, engine_from_args, int_arg, shown, write_files,
                               write_json)
from batching.sim.hardware.engines import ENGINES
from batching.sim.hardware.specs import GPUS, MODELS, PRECISIONS, deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import simulate
from batching.sim.workload.requests import MAX_NUM_REQUESTS
from batching.studies import bench_files as bf
from batching.studies import profile_fit as pf
from batching.studies.pricing import DEFAULT_HEADROOM

__all__ = ["BENCH_ONLY", "add_bench_args", "cmd_bench", "bench_table"]
BENCH_ONLY = ("--bench-line", "--model", "--gpu", "--tp", "--num-gpus", "--precision", "--preset", "--requests",
              "--json", "--engine", "--profile", "--fit", "--fit-out", "--fit-evals")
DEFAULT_GPU, DEFAULT_TP, DEFAULT_PRECISION = "h100-sxm", 8, "bf16"  # the CLI's; the policy: the engine profile's


def add_bench_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a measured run (--bench)")
    g.add_argument("--bench", type=Path, default=None, metavar="FILE",
                   help="a vllm bench serve --save-result JSON, sglang.bench_serving JSONL or genai-perf "
                        "profile_export_genai_perf.json: simulate its setting and print simulated against measured")
    g.add_argument("--bench-line", type=int_arg(1, 10**6), default=None, metavar="N",
                   help="which run of a JSONL file (1-based; default the last)")
    g.add_argument("--model", choices=list(MODELS), default=None,
                   help="the preset to simulate (default: the file's model id, matched by HuggingFace id)")
    g.add_argument("--gpu", choices=list(GPUS), default=None, help=f"default {DEFAULT_GPU}")
    g.add_argument("--tp", type=int_arg(1, 8, choices=(1, 2, 4, 8)), default=None, help=f"default {DEFAULT_TP}")
    g.add_argument("--num-gpus", type=int_arg(1, 8), default=None,
                   help="GPUs of the server (default --tp: one engine, as a benchmark file measures)")
    g.add_argument("--precision", choices=list(PRECISIONS), default=None, help=f"default {DEFAULT_PRECISION}")
    g.add_argument("--preset", choices=[*PRESETS, "engine"], default=None,
                   help="policy preset; default (and engine): the engine profile's own scheduler defaults")
    g.add_argument("--engine", choices=list(ENGINES), default=None,
                   help="engine profile the file was measured with (default vllm; docs/CALIBRATION.md, 'Engine "
                        "profiles')")
    g.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="an engine profile JSON (overrides --engine)")
    g.add_argument("--requests", type=int_arg(1, MAX_NUM_REQUESTS), default=None,
                   help="simulate this many requests (default the file's count)")
    g.add_argument("--json", type=Path, default=None, help="write the comparison as JSON")
    g.add_argument("--fit", action="store_true", default=None,
                   help="fit the engine profile's kernel speed, per-step CPU time and client time before the queue to "
                        "the file (docs/CALIBRATION.md, 'Your own benchmark'); prints the errors before and after")
    g.add_argument("--fit-out", type=Path, default=None, metavar="FILE",
                   help="with --fit: write the fitted profile as JSON (--profile FILE on every command reads it; "
                        "the dashboard's Model and hardware page uploads it). Default: <file>.profile.json")
    g.add_argument("--fit-evals", type=int_arg(5, 400), default=None, metavar="N",
                   help=f"with --fit: simulations at most (5-400, default {pf.DEFAULT_MAX_EVALS})")
    g.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=0, help=argparse.SUPPRESS)


def _num(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return "–"
    return f"{v:,.2f}" if unit != "req/s" else f"{v:,.3f}"


def bench_table(frame) -> list[str]:
    rows = [("metric", "measured", "simulated", "error %")]
    for r in frame.itertuples(index=False):
        rows.append((r.label, _num(r.measured, r.unit), _num(r.simulated, r.unit),
                     f"{r.error * 100:+.1f} %" if math.isfinite(r.error) else "–"))
    w = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{rows[0][0]:<{w[0]}}  " + "  ".join(f"{c:>{w[i + 1]}}" for i, c in enumerate(rows[0][1:]))]
    lines.append("-" * len(lines[0]))
    for row in rows[1:]:
        lines.append(f"{row[0]:<{w[0]}}  " + "  ".join(f"{c:>{w[i + 1]}}" for i, c in enumerate(row[1:])))
    return lines


def _setting(b: bf.BenchFile, n: int) -> str:
    if bf.saturated(b):
        load = "all requests at once (request_rate inf)"
    elif b.max_concurrency is not None and not math.isfinite(b.request_rate):
        load = f"{b.max_concurrency} closed-loop clients (max_concurrency)"
    else:
        how = {"constant": "evenly spaced"}.get(b.arrivals, "Poisson" if b.burstiness == 1 else
                                                f"Gamma, burstiness {b.burstiness:g}")
        load = f"{b.request_rate:g} req/s ({how})"
    lens = ("per-request lengths resampled" if b.input_lens or b.output_lens else
            f"{round(b.mean_input_tokens)} prompt / {round(b.mean_output_tokens)} output tokens (the file's means)")
    return f"{n} requests, {lens}, {load}"


def _fit(args, b: bf.BenchFile, sc) -> int:
    """``--fit``: the profile fitted to the file, the errors before and after, the profile written."""
    out = args.fit_out or args.bench.with_name(args.bench.name + ".profile.json")
    check_output_file("--fit-out" if args.fit_out else "--fit-out (default: the --bench file + .profile.json)", out)
    evals = args.fit_evals or pf.DEFAULT_MAX_EVALS

    def progress(i: int, loss: float) -> None:
        print(f"\rfitting: simulation {i} of at most {evals}, loss {loss:.4f}", end="", file=sys.stderr, flush=True)

    try:
        r = pf.fit_profile(b, sc, max_evals=evals, progress=progress)
    finally:
        print(file=sys.stderr)
    print(f"# fitted {sc.profile.describe()} to {shown(b.name)} ({r.evaluations} simulations of "
          f"{min(sc.workload.num_requests, pf.FIT_REQUESTS):,} requests; metrics: {', '.join(r.metrics_used)})")
    for key, (base, got) in r.parameters().items():
        unit, scale = {"speed": ("x", 1.0), "step_s": ("ms", 1e3), "in_fixed_s": ("ms", 1e3)}[key]
        print(f"#   {key}: {base * scale:,.4g} -> {got * scale:,.4g} {unit}")
    print("before the fit:")
    for line in bench_table(r.before):
        print(line)
    print("after the fit:")
    for line in bench_table(r.after):
        print(line)
    left = [m for m in b.metrics if m.startswith("e2e_") and m not in r.metrics_used]
    if left and not b.output_lens:
        print("# not fitted: E2E (" + ", ".join(left) + "): the file gives mean output lengths only, so the simulated "
              "E2E is that of equal-length outputs, not the file's mix (docs/CALIBRATION.md, 'Your own benchmark'); "
              "its error above may grow")
    write_files("--fit-out", out.parent, {out.name: (r.profile.to_json() + "\n").encode()})
    print(f"wrote {out} (use it with --profile {out.name}, or upload it on the dashboard's Model and hardware page)")
    print(f"# capacity and search with this profile still plan for {DEFAULT_HEADROOM:g}x the target (the default "
          "--headroom, sized for the stock profiles' error): give --headroom 1, or the error left above, to plan on "
          "the fit")
    write_json(args.json, {"file": b.name, "profile": r.profile.to_dict(), "evaluations": r.evaluations,
                           "parameters": {k: {"base": v[0], "fitted": v[1]} for k, v in r.parameters().items()},
                           "before": r.before.to_dict(orient="records"), "after": r.after.to_dict(orient="records")})
    return 0


def cmd_bench(args) -> int:
    name = args.bench.name
    b = bf.parse_bench(_input_file("--bench", args.bench), name, args.bench_line)
    check_output_file("--json", args.json)
    model = args.model or bf.preset_for(b.model_id, name)
    tp = args.tp or DEFAULT_TP
    dep = deployment(args.gpu or DEFAULT_GPU, model, tp, args.num_gpus or tp, args.precision or DEFAULT_PRECISION)
    engine = engine_from_args(args)
    policy = PRESETS[args.preset] if args.preset not in (None, "engine") else None  # None: the profile's defaults
    sc = bf.bench_scenario(b, dep, policy, args.requests, args.seed, engine=engine)
    n = sc.workload.num_requests
    if args.fit_out is not None and not args.fit:
        raise CliError("--fit-out: writes the profile --fit finds; add --fit")
    if args.fit_evals is not None and not args.fit:
        raise CliError("--fit-evals: caps the simulations of --fit; add --fit")
    if args.fit:
        return _fit(args, b, sc)
    res = simulate(sc, saturated=bf.saturated(b))
    frame = bf.compare(b, res)
    print(f"# {b.fmt} result {shown(name)}: {b.model_id or 'model not named'} -> {dep.model.name}, "
          f"{dep.node.num_gpus}x {dep.node.gpu.name} TP {tp} {dep.precision}, {sc.policy.describe()}")
    print(f"# engine: {sc.profile.describe()}")
    print(f"# {_setting(b, n)}")
    if b.max_concurrency is not None and math.isfinite(b.request_rate):
        print(f"# the file also capped clients at max_concurrency {b.max_concurrency}: the simulation sends at "
              f"{b.request_rate:g} req/s with no cap")
    if not len(frame):
        print("# the file has no metric the simulator gives")
    for line in bench_table(frame):
        print(line)
    print("# error % = (simulated - measured) / measured; nothing fitted (docs/CALIBRATION.md, 'Your own benchmark')")
    write_json(args.json, {"file": name, "format": b.fmt, "model_id": b.model_id, "model": dep.model.name,
                           "gpu": dep.node.gpu.name, "tp": tp, "num_gpus": dep.node.num_gpus,
                           "precision": dep.precision, "policy": sc.policy.describe(), "num_requests": n,
                           "engine": sc.profile.name, "engine_label": sc.profile.label,
                           "request_rate": b.request_rate if math.isfinite(b.request_rate) else "inf",
                           "max_concurrency": b.max_concurrency,
                           "mean_input_tokens": b.mean_input_tokens, "mean_output_tokens": b.mean_output_tokens,
                           "metrics": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                        for k, v in r.items()} for r in frame.to_dict(orient="records")]})
    return 0
