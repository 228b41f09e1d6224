"""``python -m batching calibrate --published [--group G] [--json FILE]``: the simulator against every published
figure of batching/data/published_points.csv (batching.studies.published), error now and before this round."""
from __future__ import annotations

import argparse
import sys

from batching.cli.args import check_output_file, write_json
from batching.studies import published as pub

__all__ = ["add_published_args", "cmd_published"]


def add_published_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("published measurements (--published)")
    g.add_argument("--published", action="store_true",
                   help="simulate every published figure in batching/data/published_points.csv and print "
                        "measured | simulated | error, now and before (docs/CALIBRATION.md, 'Published points')")
    g.add_argument("--group", action="append", default=None, metavar="G",
                   help="with --published: only this group (repeatable): " + ", ".join(pub.groups()))


def cmd_published(args) -> int:
    groups = tuple(args.group) if args.group else None
    if groups:
        known = pub.groups()
        bad = [g for g in groups if g not in known]
        if bad:
            from batching.cli.args import CliError

            raise CliError(f"--group {bad[0]}: not a group of the published points; allowed: {', '.join(known)}")
    check_output_file("--json", args.json)

    def progress(i: int, n: int) -> None:
        print(f"\rsimulating setting {i} of {n}", end="" if i < n else "\n", file=sys.stderr, flush=True)

    e = pub.published_errors(groups=groups, progress=progress)
    width = max(22, int(e["id"].str.len().max()) if len(e) else 0)
    print(f"{'id':{width}s} {'role':11s} {'metric':24s} {'measured':>14s} {'simulated':>14s} {'before':>8s} {'now':>8s}")
    for r in e.itertuples(index=False):
        print(f"{r.id:{width}s} {r.role:11s} {r.metric:24s} {pub.metric_text(r.metric, r.measured):>14s} "
              f"{pub.metric_text(r.metric, r.simulated):>14s} {pub.pct(r.error_before):>8s} {pub.pct(r.error):>8s}")
    print("# median |error| per group: " + "; ".join(
        f"{r.group} ({r.role}, {r.points} points) {pub.pct(r[3]).lstrip('+')} before -> {r[4]:.1%} now"
        for r in pub.group_summary(e).itertuples(index=False)))
    print("# error = simulated / measured - 1; sources in docs/CALIBRATION.md ('Published points')")
    write_json(args.json, {"points": [{k: (None if v != v else v) for k, v in row.items()}
                                      for row in e.to_dict(orient="records")],
                           "groups": pub.group_summary(e).to_dict(orient="records")})
    return 0
