"""``python -m batching run``: simulate one policy on one scenario; print the summary, write JSON and CSVs.

Like ``compare``, the run has a saturated twin (every request at t = 0) for its capacity, so it says ``load``,
``overloaded`` and ``queue_growth_req_s`` and marks an overloaded run's latencies unbounded (issue 24 item 8)."""
from __future__ import annotations

from pathlib import Path

from batching.cli.args import (add_policy_args, calibration_line, add_scenario_args, arrivals_text, build_scenario, check_output_file,
                               check_folder_inputs, check_output_folder, disagg_line, fleet_lines, fmt, pick, prefix_line, summary_keys,
                               spec_json, spec_line, write_files, write_json)
from batching.cli.compare import OVERLOAD_KEYS, compare_fields
from batching.sim.simulate import rejected_line, simulate
from batching.studies.compare import is_unbounded, unbounded_text, with_capacity


CSV_FILES = ("requests.csv", "steps.csv", "summary.csv")  # what --csv writes


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
    check_folder_inputs("--csv", args.csv, CSV_FILES)
    res = simulate(sc)
    full = with_capacity(res.summary(), simulate(sc, saturated=True).summary())  # as compare: load and overload
    caching = sc.policy.prefix_caching
    spec = sc.policy.spec_decode != "off"
    s = pick(full, caching, spec) | compare_fields(full)
    split = sc.disagg is not None
    print(f"# {sc.policy.describe()}")
    print(f"# engine: {sc.profile.describe()}")
    if spec_line(sc.policy):
        print(spec_line(sc.policy))
    if split:
        print(disagg_line(s))
    if arrivals_text(sc.workload):
        load = "" if getattr(sc.workload, "concurrency", None) is not None else f", mean {sc.workload.rate_req_s:g} req/s"
        print(f"# arrivals: {arrivals_text(sc.workload)}{load}")
    for k in summary_keys(caching, spec, split):
        if k in s:
            print(f"{k:26s} {fmt(s[k])}" + (" (unbounded: overloaded)" if is_unbounded(k, full) else ""))
    for k in OVERLOAD_KEYS:
        print(f"{k:26s} {fmt(s[k])}")
    if full["overloaded"]:
        print(f"# overloaded at {full['offered_req_s']:g} req/s (capacity {full['capacity_req_s']:,.3g} req/s, load "
              f"{full['load'] * 100:.0f} %): latencies {unbounded_text(full)}; they measure the run's length, "
              "not the policy")
    for lvl, v in s["by_priority"].items():
        print(f"class {lvl} ({v['class_name']}): TTFT P99 {v['ttft_p99_s']:.3f} s, TPOT P99 "
              f"{v['tpot_p99_s'] * 1e3:.1f} ms, {v['num_requests']} requests" + prefix_line(v, ", ")
              + (" (latencies unbounded: overloaded)" if full["overloaded"] else ""))
    for line in fleet_lines(s):
        print(line)
    if rejected_line(s):
        print(f"# {rejected_line(s)}")
    if calibration_line(s):
        print(calibration_line(s))
    write_json(args.json, s | spec_json(sc.policy))
    if args.csv:
        from batching.report import requests_csv, steps_csv, summary_csv  # formula-looking text cells get a leading '

        write_files("--csv", Path(args.csv), dict(zip(CSV_FILES, (requests_csv(res), steps_csv(res), summary_csv(s)))))
    return 0
