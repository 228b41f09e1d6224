"""Trace import speed: seconds to read each shipped real trace (CSV parse, checks, arrays), best of a few.

    python benchmarks/bench_traces.py [--repeats 3]

The target is under 1 s per trace on the 2-core machine (the dashboard reads a trace on every page that replays it,
through a cache); tests/test_traces.py checks the values read, this prints the time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.workload.traces import load_trace  # noqa: E402

TARGET_S = 1.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="loads per trace; the best is printed (default 3)")
    args = p.parse_args()
    for path in sorted((ROOT / "data" / "traces").glob("*.csv")):
        times = []
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            trace = load_trace(path)
            times.append(time.perf_counter() - start)
        best = min(times)
        print(f"{path.name}: {len(trace):,} requests in {best:.3f} s (best of {len(times)}; target < {TARGET_S:.1f} s: "
              f"{'met' if best < TARGET_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
