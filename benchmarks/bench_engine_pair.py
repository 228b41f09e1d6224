"""The engine's speed against another checkout, side by side in one run: for each case the best kernel CPU time
of this tree and of ``--against`` (a git worktree of an earlier commit, e.g. ``git worktree add /tmp/before
HEAD~1``), their ratio and step counts. Rounds alternate which tree goes first, and CPU time
(``time.process_time``) stands in for wall time, so other work on a shared machine moves both alike.
Run: python benchmarks/bench_engine_pair.py --against /tmp/before [--requests 10000] [--rounds 6]"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run inside each tree with its own bench_engine.engine_seconds (the workload module moved once: both paths)
CODE = r'''
import json, sys, time
sys.path.insert(0, ".")
import benchmarks.bench_engine as be
from batching.sim.simulate import Scenario
from batching.sim.policy import PRESETS, with_knobs
try:
    from batching.sim.workload.requests import workload_preset
except ImportError:
    from batching.sim.workload import workload_preset
n = int(sys.argv[1])
mixed = workload_preset("mixed", 3.0, n, 0)
shared = workload_preset("chat", 3.0, n, 0).with_shared_prefix(2000)
cases = {name: Scenario(workload=mixed, policy=PRESETS[name]) for name in ("continuous", "chunked", "priority")}
cases["eagle K=3"] = Scenario(workload=mixed, policy=with_knobs(PRESETS["continuous"], spec_decode="eagle",
                                                                spec_tokens=3, spec_acceptance=0.8))
cases["caching on"] = Scenario(workload=shared, policy=with_knobs(PRESETS["continuous"], prefix_caching=True,
                                                                 max_num_batched_tokens=16384))
be.time.perf_counter = time.process_time  # CPU time of this process
be.engine_seconds(cases["continuous"], repeats=1)  # load or compile the kernels
print(json.dumps({k: be.engine_seconds(sc, repeats=5) for k, sc in cases.items()}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, required=True, help="the other checkout's root folder")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    trees = {"before": args.against.resolve(), "this": ROOT}
    best: dict[str, dict[str, float]] = {t: {} for t in trees}
    steps: dict[str, dict[str, int]] = {t: {} for t in trees}
    for r in range(args.rounds):
        order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
        for tree, path in order:
            out = subprocess.run([sys.executable, "-c", CODE, str(args.requests)], cwd=path, capture_output=True,
                                 text=True, check=True)
            for case, (sec, n_steps) in json.loads(out.stdout.strip().splitlines()[-1]).items():
                best[tree][case] = min(best[tree].get(case, float("inf")), sec)
                steps[tree][case] = n_steps
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{args.requests:,} requests per case, best kernel CPU time over {args.rounds} rounds x 5 runs")
    print(f"{'case':12s} {'before (s)':>10s} {'this (s)':>10s} {'this/before':>11s}  steps before / this")
    for case in best["before"]:
        b, m = best["before"][case], best["this"][case]
        print(f"{case:12s} {b:10.4f} {m:10.4f} {m / b:11.3f}  {steps['before'][case]:,} / {steps['this'][case]:,}")


if __name__ == "__main__":
    main()
