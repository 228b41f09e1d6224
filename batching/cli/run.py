"""``python -m batching run``: simulate one policy on one scenario; print the summary, write JSON and CSVs."""
from __future__ import annotations

from pathlib import Path

from batching.cli.args import (add_policy_args, add_scenario_args, arrivals_text, build_scenario, check_output_file,
                               check_output_folder, disagg_line, fleet_lines, fmt, pick, prefix_line, summary_keys,
                               write_files, write_json)
from batching.sim.simulate import rejected_line, simulate


def add_parser(subparsers):
    p = subparsers.add_parser("run", help="simulate one policy on one scenario")
    add_scenario_args(p)
    add_policy_args(p)
    p.add_argument("--json", type=Path, help="write the summary as JSON")
    p.add_argument("--csv", type=Path, help="write requests.csv and steps.csv into this folder")
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args) -> int:
    sc = build_scenario(args)
    check_output_file("--json", args.json)  # before the simulation: a bad path costs nothing
    check_output_folder("--csv", args.csv)
    res = simulate(sc)
    caching = sc.policy.prefix_caching
    spec = sc.policy.spec_decode != "off"
    s = pick(res.summary(), caching, spec)
    split = sc.disagg is not None
    print(f"# {sc.policy.describe()}")
    if split:
        print(disagg_line(s))
    if arrivals_text(sc.workload):
        print(f"# arrivals: {arrivals_text(sc.workload)}, mean {sc.workload.rate_req_s:g} req/s")
    for k in summary_keys(caching, spec, split):
        if k in s:
            print(f"{k:26s} {fmt(s[k])}")
    for lvl, v in s["by_priority"].items():
        print(f"class {lvl} ({v['class_name']}): TTFT P99 {v['ttft_p99_s']:.3f} s, TPOT P99 "
              f"{v['tpot_p99_s'] * 1e3:.1f} ms, {v['num_requests']} requests" + prefix_line(v, ", "))
    for line in fleet_lines(s):
        print(line)
    if rejected_line(s):
        print(f"# {rejected_line(s)}")
    write_json(args.json, s)
    if args.csv:
        from batching.report import requests_csv, steps_csv  # formula-looking text cells get a leading '

        write_files("--csv", Path(args.csv), {"requests.csv": requests_csv(res), "steps.csv": steps_csv(res)})
    return 0
