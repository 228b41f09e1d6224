"""Command line: ``python -m batching run|compare ...``."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from batching.cli import calibrate as cli_calibrate

from batching.cli import report as cli_report
from batching.studies.sweeps import KNOBS, sweep
from batching.studies.capacity import SLO, capacity
from batching.studies.compare import compare
from batching.studies.knee import sweep_knee
from batching.sim.policy import MODES, PREEMPTION_MODES, PRESETS, preset, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.specs import GPUS, MODELS, PRECISIONS
from batching.sim.workload import WORKLOAD_PRESETS, LengthDist, TraceWorkload, workload_preset, DEFAULT_RATE_REQ_S
from dataclasses import replace

SUMMARY_KEYS = ("num_requests", "num_steps", "throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "gpu_util", "busy", "mfu", "mbu", "batch_efficiency",
                "preemptions")


class CliError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line on stderr, exit code 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not an integer") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name}={v} is out of range; allowed >= 1")
        return v
    return parse


def _float(name, low=0.0):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not a number") from None
        if not math.isfinite(v) or v < low:
            raise argparse.ArgumentTypeError(f"{name}={text} is out of range; allowed >= {low} and finite")
        return v
    return parse


def _add_scenario(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario")
    g.add_argument("--gpu", default="h100-sxm", choices=list(GPUS))
    g.add_argument("--num-gpus", type=_positive_int("num-gpus"), default=8, help="GPUs in the node (1-8)")
    g.add_argument("--model", default="qwen2.5-72b", choices=list(MODELS))
    g.add_argument("--tp", type=int, default=8, choices=[1, 2, 4, 8], help="tensor parallel degree")
    g.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    g.add_argument("--workload", default="mixed", choices=list(WORKLOAD_PRESETS))
    g.add_argument("--rate", type=_float("rate", 1e-9), default=None, help="requests per second")
    g.add_argument("--requests", type=_positive_int("requests"), default=None, help="number of requests")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trace", type=Path, default=None, help="replay a trace file (native, Azure, BurstGPT, Vidur)")
    g.add_argument("--prompt-tokens", type=_positive_int("prompt-tokens"), default=None, help="fixed prompt length")
    g.add_argument("--output-tokens", type=_positive_int("output-tokens"), default=None, help="fixed output length")
    g.add_argument("--kv-cache-tokens", type=_positive_int("kv-cache-tokens"), default=None,
                   help="shrink the KV cache to this many tokens")
    cli_calibrate.add_spec_arguments(g)  # --model-json, --gpu-json, --kv-dtype, --allreduce


def _add_policy(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy")
    g.add_argument("--preset", default="continuous", choices=list(PRESETS))
    g.add_argument("--mode", choices=list(MODES), default=None)
    g.add_argument("--max-batch-size", type=_positive_int("max-batch-size"), default=None)
    g.add_argument("--max-wait-ms", type=_float("max-wait-ms"), default=None)
    g.add_argument("--max-num-seqs", type=_positive_int("max-num-seqs"), default=None)
    g.add_argument("--max-num-batched-tokens", type=_positive_int("max-num-batched-tokens"), default=None)
    g.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--priority", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--preemption", choices=list(PREEMPTION_MODES), default=None)


def build_scenario(args) -> Scenario:
    dep = cli_calibrate.deployment_from_args(args)
    if args.trace is not None:
        if not args.trace.is_file():
            raise CliError(f"--trace {args.trace}: no such file")
        wl = TraceWorkload.from_path(args.trace, max_requests=args.requests)
        if args.rate is not None:
            wl = wl.with_rate(args.rate)
    else:
        wl = workload_preset(args.workload, args.rate if args.rate is not None else DEFAULT_RATE_REQ_S,
                             args.requests or 2000, args.seed)
        if args.prompt_tokens or args.output_tokens:
            classes = []
            for c in wl.classes:
                if args.prompt_tokens:
                    c = replace(c, prompt=LengthDist("fixed", mean=args.prompt_tokens, low=1, high=args.prompt_tokens))
                if args.output_tokens:
                    c = replace(c, output=LengthDist("fixed", mean=args.output_tokens, low=1, high=args.output_tokens))
                classes.append(c)
            wl = replace(wl, classes=tuple(classes))
    base = preset(args.preset)
    pol = with_knobs(base, mode=args.mode, max_batch_size=args.max_batch_size,
                     max_wait_s=None if args.max_wait_ms is None else args.max_wait_ms / 1e3,
                     max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     chunked_prefill=args.chunked_prefill, priority=args.priority, preemption=args.preemption)
    sc = Scenario(dep, wl, pol, args.allreduce)
    sc.validate()
    return sc


def _pick(s: dict) -> dict:
    out = {k: s[k] for k in SUMMARY_KEYS}
    out["by_priority"] = {lvl: {k: v[k] for k in SUMMARY_KEYS if k in v} | {"class_name": v["class_name"]}
                          for lvl, v in s["by_priority"].items()}
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def cmd_run(args) -> int:
    sc = build_scenario(args)
    res = simulate(sc)
    s = _pick(res.summary())
    print(f"# {sc.policy.describe()}")
    for k in SUMMARY_KEYS:
        print(f"{k:26s} {_fmt(s[k])}")
    for lvl, v in s["by_priority"].items():
        print(f"class {lvl} ({v['class_name']}): TTFT P99 {v['ttft_p99_s']:.3f} s, TPOT P99 "
              f"{v['tpot_p99_s'] * 1e3:.1f} ms, {v['num_requests']} requests")
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=2))
    if args.csv:
        from batching.report import requests_csv, steps_csv  # formula-looking text cells get a leading '

        d = Path(args.csv)
        d.mkdir(parents=True, exist_ok=True)
        (d / "requests.csv").write_bytes(requests_csv(res))
        (d / "steps.csv").write_bytes(steps_csv(res))
    return 0


def cmd_compare(args) -> int:
    sc = build_scenario(args)

    def progress(done, total, msg):
        print(f"[{done}/{total}] {msg}", file=sys.stderr)

    cmp = compare(sc, progress=progress)
    sums = cmp.summaries()
    table = cmp.table()
    print(table.to_string(float_format=lambda v: _fmt(float(v))))
    if args.json:
        Path(args.json).write_text(json.dumps({k: _pick(v) | {"capacity_output_tok_s": v["capacity_output_tok_s"]}
                                               for k, v in sums.items()}, indent=2))
    return 0


def _progress(done, total, msg):
    print(f"[{done}/{total}] {msg}", file=sys.stderr)


def _values(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"values={text!r} must be numbers separated by commas") from None
    if not vals:
        raise argparse.ArgumentTypeError("values is empty; give numbers separated by commas, e.g. 16,32,64")
    return vals


def cmd_sweep(args) -> int:
    sc = build_scenario(args)
    df = sweep(sc, args.knob, args.values, progress=_progress)
    knee = sweep_knee(df, args.knob, args.knee_share)
    cols = [args.knob, "throughput_output_tok_s", "capacity_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_p99_s", "gpu_util", "batch_efficiency", "preemptions"]
    print(df[cols].to_string(index=False, float_format=lambda v: _fmt(float(v))))
    print(f"knee: {args.knob} = {knee:g}" if knee is not None else "knee: none (throughput still growing or latency flat)")
    if args.json:
        Path(args.json).write_text(json.dumps({"knob": args.knob, "knee": knee,
                                               "points": df.to_dict(orient="records")}, indent=2))
    return 0


def cmd_capacity(args) -> int:
    sc = build_scenario(args)
    slo = SLO(None if args.slo_ttft_ms is None else args.slo_ttft_ms / 1e3,
              None if args.slo_tpot_ms is None else args.slo_tpot_ms / 1e3, args.slo_e2e_s, args.attainment)
    res = capacity(sc, slo, target_rate_req_s=args.target_rate, gpu_hour_usd=args.gpu_hour_usd, progress=_progress)
    d = res.to_dict()
    for k, v in d.items():
        print(f"{k:32s} {_fmt(v) if v is not None else '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps(d | {"points": res.points.to_dict(orient="records")}, indent=2))
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m batching", description="Simulate LLM serving under batching policies.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="simulate one policy on one scenario")
    _add_scenario(run)
    _add_policy(run)
    run.add_argument("--json", type=Path, help="write the summary as JSON")
    run.add_argument("--csv", type=Path, help="write requests.csv and steps.csv into this folder")
    run.set_defaults(func=cmd_run)
    cmp = sub.add_parser("compare", help="the five presets on one scenario")
    _add_scenario(cmp)
    cmp.add_argument("--json", type=Path, help="write {preset: summary} as JSON")
    cmp.set_defaults(func=cmd_compare, preset="continuous", mode=None, max_batch_size=None, max_wait_ms=None,
                     max_num_seqs=None, max_num_batched_tokens=None, chunked_prefill=None, priority=None,
                     preemption=None)
    sw = sub.add_parser("sweep", help="one simulation per value of a knob, with the knee marked")
    _add_scenario(sw)
    _add_policy(sw)
    sw.add_argument("--knob", required=True, choices=list(KNOBS))
    sw.add_argument("--values", required=True, type=_values, help="comma-separated, e.g. 16,32,64,128")
    sw.add_argument("--knee-share", type=_float("knee-share", 0.0), default=0.05,
                    help="throughput growth below which the knee is reached (default 0.05)")
    sw.add_argument("--json", type=Path, help="write the points and the knee as JSON")
    sw.set_defaults(func=cmd_sweep)
    cap = sub.add_parser("capacity", help="highest request rate per node that meets the SLOs")
    _add_scenario(cap)
    _add_policy(cap)
    cap.add_argument("--slo-ttft-ms", type=_float("slo-ttft-ms", 1e-9), default=None)
    cap.add_argument("--slo-tpot-ms", type=_float("slo-tpot-ms", 1e-9), default=None)
    cap.add_argument("--slo-e2e-s", type=_float("slo-e2e-s", 1e-9), default=None)
    cap.add_argument("--attainment", type=_float("attainment", 1e-9), default=0.99,
                     help="share of requests that must meet every SLO (default 0.99)")
    cap.add_argument("--target-rate", type=_float("target-rate", 1e-9), default=None,
                     help="traffic to plan for, req/s: reports the nodes needed")
    cap.add_argument("--gpu-hour-usd", type=_float("gpu-hour-usd", 1e-9), default=None,
                     help="price of one GPU-hour: reports $ per million output tokens")
    cap.add_argument("--json", type=Path, help="write the result as JSON")
    cap.set_defaults(func=cmd_capacity)
    cli_calibrate.add_parser(sub)
    cli_report.add_parser(sub)
    return p


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, CliError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
