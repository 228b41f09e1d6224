"""A light dashboard session under heavy ones: its first chart's time against its idle time (target: within 3x).

    python benchmarks/bench_light_session.py [--full] [--light-runs 3]

The scenario of tests/load/test_light_session.py (one server, one headless Chromium): the home page at 200 requests
opens alone (idle), then heavy sessions keep the simulation slots busy (Tune, Find a deployment and Explore at
20,000 requests; ``--full``: issue 22's four, with a 64-node fleet) and fresh light sessions open under them. Prints
each light run's time, its ratio to idle against the 3x target, whether it waited for a slot, and how soon a fresh
heavy run got a slot once the heavy pages closed. The test asserts the invariants (no queue, no error, no
starvation); this prints the figure, which on 2 shared cores swings from run to run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from load.test_light_session import HEAVY_FULL, HEAVY_SMOKE, RATIO, run_scenario  # noqa: E402
from load.test_load import CHROMIUM  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="issue 22's four heavy sessions instead of three")
    p.add_argument("--light-runs", type=int, default=3, help="light sessions, one after another (default 3)")
    args = p.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"needs Chromium at {CHROMIUM} (tools/run_tests.sh installs it)", file=sys.stderr)
        return 2
    heavy = HEAVY_FULL if args.full else HEAVY_SMOKE
    f = run_scenario(heavy, max(1, args.light_runs), "bench_light_session")
    for r, ratio in zip(f["loaded"], f["ratios"]):
        print(f"light run {r['url']}: {r['first_chart_s']:.2f} s against {f['idle_s']:.2f} s idle: x{ratio:.2f} "
              f"(target x{RATIO:.0f}: {'met' if ratio <= RATIO else 'NOT met'}); waited for a slot: {r['queued']}; "
              f"errors: {len(r['errors'])}")
    print(f"after the heavy pages closed: Explore at 20,000 requests waited {f['after_close']['queued_s']} s for a "
          f"slot, first chart {f['after_close']['first_chart_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
