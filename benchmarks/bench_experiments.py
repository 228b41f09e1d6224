"""Speed of the planning studies on the default scenario (2,000 requests, mixed traffic):
a 12-point sweep (targets <= 1 s) and a five-policy capacity search (target <= 3 s).
Run: python benchmarks/bench_experiments.py"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batching.studies.capacity import SLO, capacity  # noqa: E402

from batching.studies.sweeps import sweep  # noqa: E402

from batching.studies.knee import sweep_knee  # noqa: E402
from batching.sim.policy import PRESETS  # noqa: E402
from batching.sim.simulate import Scenario, simulate  # noqa: E402


def main() -> None:
    sc = Scenario()
    simulate(sc.with_policy(PRESETS["static"]))  # warm-up: kernel load
    values = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024]
    t = time.perf_counter()
    df = sweep(sc.with_policy(PRESETS["continuous"]), "max_num_seqs", values)
    sweep_s = time.perf_counter() - t
    print(f"12-point sweep of max_num_seqs (24 simulations with capacity runs): {sweep_s:.2f} s "
          f"(target <= 1 s); knee at {sweep_knee(df, 'max_num_seqs')}")
    t = time.perf_counter()
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    rows = []
    for name, pol in PRESETS.items():
        r = capacity(sc, slo, policy=pol, target_rate_req_s=20.0, gpu_hour_usd=2.5)
        rows.append((name, r.max_rate_req_s, len(r.points)))
    cap_s = time.perf_counter() - t
    print(f"five-policy capacity search (TTFT <= 2 s, TPOT <= 100 ms, 99 %): {cap_s:.2f} s (target <= 3 s)")
    for name, rate, n in rows:
        print(f"  {name:11s} {rate:7.3f} req/s per node  ({n} rates simulated)")


if __name__ == "__main__":
    main()
