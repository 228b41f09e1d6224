"""``python -m batching sweep``: one simulation per value of a knob and a capacity search within the SLOs (the
flags', or the default SLOs), the knee marked where that capacity stops growing, the guided checks printed."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from batching.cli.args import (CliError, add_policy_args, add_scenario_args, add_slo_args, arrivals_text,
                               build_scenario, check_output_file, float_arg, fmt, progress, slo_from_args, spec_json,
                               spec_line, values_arg, write_json)
from batching.sim.policy import KNOB_LIMITS
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.requests import MAX_RATE_REQ_S
from batching.studies.capacity import DEFAULT_LOWER_TTFT_S, DEFAULT_TOP_TTFT_S, DEFAULT_TPOT_S
from batching.studies.knee import DEFAULT_SHARE, SHARE_LIMITS, check_share, knee_basis
from batching.studies.planning import read_sweeps, study_slo, with_readings
from batching.studies.sweeps import INT_KNOBS, KNOBS, sweep

# knob -> (lowest, highest, whether the lowest is excluded) for --values
VALUE_LIMITS: dict[str, tuple[float, float, bool]] = {
    **{k: (low, high, False) for k, (low, high) in KNOB_LIMITS.items() if k in KNOBS},
    "high_share": (0.0, 1.0, False),
    "rate_req_s": (0.0, MAX_RATE_REQ_S, True),
    "kv_cache_tokens": (KV_BLOCK_TOKENS, 2**40, False),  # and at most the deployment's cache
}
COLUMNS = ("max_rate_req_s", "slo_attainment", "steady_output_tok_s", "capacity_output_tok_s", "ttft_p50_s",
           "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "gpu_util", "batch_efficiency", "preemptions")


def add_parser(subparsers):
    p = subparsers.add_parser("sweep", help="one simulation per value of a knob, with the knee marked")
    add_scenario_args(p)
    add_policy_args(p)
    p.add_argument("--knob", required=True, choices=list(KNOBS))
    p.add_argument("--values", required=True, type=values_arg, help="comma-separated, e.g. 16,32,64,128")
    add_slo_args(p, f"the knee is where the capacity within them stops growing; default: TTFT "
                    f"{DEFAULT_TOP_TTFT_S:g} s for class 0 and {DEFAULT_LOWER_TTFT_S:g} s for the others, TPOT "
                    f"{DEFAULT_TPOT_S * 1e3:g} ms")
    p.add_argument("--knee-share", type=float_arg(), default=DEFAULT_SHARE,
                   help=f"growth of the capacity within the SLOs below which the knee is reached, {SHARE_LIMITS[0]:g} "
                        f"to {SHARE_LIMITS[1]:g} (default {DEFAULT_SHARE:g})")
    p.add_argument("--json", type=Path, help="write the points and the knee as JSON")
    p.set_defaults(func=cmd_sweep)
    return p


def check_values(knob: str, values: list[float]) -> None:
    """Each value whole for an integer knob and within the knob's range, before any simulation."""
    low, high, low_open = VALUE_LIMITS[knob]
    for v in values:
        if (v <= low if low_open else v < low) or v > high:
            allowed = f"{'> ' if low_open else ''}{low:g} to {high:g}"
            raise CliError(f"--values: {knob}={v:g} is out of range; allowed {allowed}")
        if knob in INT_KNOBS and v != int(v):
            raise CliError(f"--values: {knob}={v:g} is not a whole number; {knob} takes whole numbers")


def cmd_sweep(args) -> int:
    check_share(args.knee_share)  # before any simulation
    check_values(args.knob, args.values)
    sc = build_scenario(args)
    slo, is_default = study_slo(sc, slo_from_args(args, sc))
    if is_default and args.attainment is not None:
        slo = replace(slo, attainment=args.attainment)
    check_output_file("--json", args.json)
    df = sweep(sc, args.knob, args.values, progress=progress, slo=slo)
    study = read_sweeps(sc, args.knob, args.values, {args.preset: with_readings(df, sc, args.knob)}, args.knee_share,
                        slo=slo, slo_is_default=is_default)
    knee = study.knee
    print(f"# engine: {sc.profile.describe()}")
    if spec_line(sc.policy):
        print(spec_line(sc.policy))
    closed = getattr(sc.workload, "concurrency", None) is not None
    if arrivals_text(sc.workload):
        load = "" if closed else f", mean {sc.workload.rate_req_s:g} req/s"
        print(f"# arrivals: {arrivals_text(sc.workload)}{load}")
    print(study.slo_text() + (" Set --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-s to change them." if is_default else ""))
    print(df[[args.knob, *COLUMNS]].to_string(index=False, float_format=lambda v: fmt(float(v))))
    basis = ("goodput within the SLOs" if knee_basis(df, args.knob) == "goodput_req_s" else
             "capacity within the SLOs")
    print(f"knee: {args.knob} = {knee:g} ({basis} grows by less than {args.knee_share * 100:g} % past it)"
          if knee is not None else f"knee: none ({basis} still growing by {args.knee_share * 100:g} % or more)")
    # the Tune page's guided checks, on the same sweep
    print()
    print(study.checks_text())
    write_json(args.json, {"knob": args.knob, "knee": knee, "knee_basis": knee_basis(df, args.knob),
                           "slo": slo.to_dict(), "slo_default": is_default,
                           "engine": sc.profile.name, "engine_label": sc.profile.label} | spec_json(sc.policy)
               | ({"concurrency": int(sc.workload.concurrency), "think_time_s": float(sc.workload.think_time_s)}
                  if closed else {})
               | {"points": df.to_dict(orient="records")})
    return 0
