"""``python -m batching compare``: the five presets on one scenario, with capacity (every request at t = 0)."""
from __future__ import annotations

from pathlib import Path

from batching.cli.args import (POLICY_DEFAULTS, add_prefix_caching_arg, add_scenario_args, build_scenario,
                               check_output_file, disagg_line, fmt, pick, presets_with_caching, progress, write_json)
from batching.studies.compare import compare, verdict

# beside the documented summary keys (args.SUMMARY_KEYS): capacity, load, overload and the utilisation figures
COMPARE_JSON_KEYS = ("capacity_output_tok_s", "capacity_req_s", "load", "overloaded", "queue_growth_req_s",
                     "offered_req_s", "busy", "gpu_util", "sol_util", "mfu", "mbu", "kv_util", "batch_efficiency",
                     "mean_running", "batch_cap")
# the overload figures ``run`` prints beside its summary, as ``compare``'s table and JSON carry them
OVERLOAD_KEYS = ("load", "overloaded", "queue_growth_req_s", "offered_req_s", "capacity_req_s",
                 "capacity_output_tok_s")


def compare_fields(summary: dict) -> dict:
    """The figures ``compare`` writes beside the documented summary keys (``COMPARE_JSON_KEYS``): capacity, load,
    overload, utilisation. ``run`` writes the same (one rule, issue 24 item 8)."""
    return {key: summary[key] for key in COMPARE_JSON_KEYS}


def add_parser(subparsers):
    p = subparsers.add_parser("compare", help="the five presets on one scenario")
    add_scenario_args(p)
    add_prefix_caching_arg(p.add_argument_group("policy"), every_preset=True)
    p.add_argument("--json", type=Path, help="write {preset: summary} as JSON")
    p.set_defaults(func=cmd_compare, **(POLICY_DEFAULTS | {"prefix_caching": None}))
    return p


def cmd_compare(args) -> int:
    caching = args.prefix_caching
    args.prefix_caching = None  # build_scenario checks the preset's policy; the flag applies to all five here
    sc = build_scenario(args)
    check_output_file("--json", args.json)
    policies = presets_with_caching(caching)
    if sc.disagg is not None:  # a split runs iteration-level batching only
        policies = {k: p for k, p in policies.items() if p.mode == "continuous"}
    print(f"# engine: {sc.profile.describe()}")
    cmp = compare(sc, policies, progress=progress)
    sums = cmp.summaries()
    if sc.disagg is not None:
        print(f"{disagg_line(next(iter(sums.values())))} (the iteration-level presets {', '.join(policies)}; "
              "static and dynamic batching run each batch as a whole and are not split)")
    if getattr(sc.workload, "concurrency", None) is not None:
        print(f"# load: {sc.workload.load_text}, each policy's latencies measured from each send")
    print(cmp.table().to_string(float_format=lambda v: fmt(float(v))))
    cached = [k for k, p in policies.items() if p.prefix_caching and "prefix_hit_rate" in sums[k]]
    if cached:
        print("prefix cache hit rate (prompt tokens served from the cache): " + ", ".join(
            f"{k} {sums[k]['prefix_hit_rate'] * 100:.1f} % ({int(sums[k].get('cached_prompt_tokens') or 0):,} tokens)"
            for k in cached))
    print(verdict(sums))
    write_json(args.json, {k: pick(v, policies[k].prefix_caching) | compare_fields(v)
                           for k, v in sums.items()})
    return 0
