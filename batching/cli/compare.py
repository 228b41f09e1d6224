"""``python -m batching compare``: the five presets on one scenario, with capacity (every request at t = 0)."""
from __future__ import annotations

from pathlib import Path

from batching.cli.args import (POLICY_DEFAULTS, add_scenario_args, build_scenario, check_output_file, fmt, pick,
                               progress, write_json)
from batching.studies.compare import compare, verdict

# beside the documented summary keys (args.SUMMARY_KEYS): capacity, load, overload and the utilisation figures
COMPARE_JSON_KEYS = ("capacity_output_tok_s", "capacity_req_s", "load", "overloaded", "queue_growth_req_s",
                     "offered_req_s", "busy", "gpu_util", "sol_util", "mfu", "mbu", "kv_util", "batch_efficiency",
                     "mean_running", "batch_cap")


def add_parser(subparsers):
    p = subparsers.add_parser("compare", help="the five presets on one scenario")
    add_scenario_args(p)
    p.add_argument("--json", type=Path, help="write {preset: summary} as JSON")
    p.set_defaults(func=cmd_compare, **POLICY_DEFAULTS)
    return p


def cmd_compare(args) -> int:
    sc = build_scenario(args)
    check_output_file("--json", args.json)
    cmp = compare(sc, progress=progress)
    sums = cmp.summaries()
    print(cmp.table().to_string(float_format=lambda v: fmt(float(v))))
    print(verdict(sums))
    write_json(args.json, {k: pick(v) | {key: v[key] for key in COMPARE_JSON_KEYS} for k, v in sums.items()})
    return 0
