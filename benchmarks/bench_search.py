"""Deployment search speed: a 64-configuration search (H100/H200 x BF16/FP8 x TP 4/8 x chunked/priority x
max_num_seqs 128/256 x max_num_batched_tokens 2048/8192) of Qwen2.5-72B on the default (mixed) workload with 2,000
requests per run, on the local backend (a process pool, pruning and warm starts on), against the same capacity
searches run one after another in this process (cold starts, no pruning), both measured in one run. Prints wall
time, configurations/s, simulations and the speed-up; the best configuration of both must agree.

Run: python benchmarks/bench_search.py [--requests 2000] [--workers N] [--json out.json]
On a shared or busy machine the figures are noisy: run it alone, and more than once."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.simulate import Scenario, simulate  # noqa: E402
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node  # noqa: E402
from batching.sim.workload.requests import workload_preset  # noqa: E402
from batching.studies.backends import default_workers, make_backend  # noqa: E402
from batching.studies.capacity import default_slo  # noqa: E402
from batching.studies.search import Grid, parse_knobs, search  # noqa: E402

PRICES = {"h100-sxm": 2.5, "h200-sxm": 3.5}
GRID = Grid(gpus=("h100-sxm", "h200-sxm"), precisions=("bf16", "fp8"), tps=(4, 8), policies=("chunked", "priority"),
            knobs=parse_knobs(["max_num_seqs=128,256", "max_num_batched_tokens=2048,8192"]))
TARGET_REQ_S = 40.0


def best(res: dict) -> str | None:
    ok = [c for c in res["configs"] if c["meets_slo"]]
    return ok[0]["label"] if ok else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--decompose", action="store_true",
                    help="also time the pool without pruning, and without pruning or warm starts")
    a = ap.parse_args()
    base = Scenario(Deployment(Node(GPUS["h100-sxm"], 8, 8), MODELS["qwen2.5-72b"]),
                    workload_preset("mixed", 1.0, a.requests, 0))
    slo = default_slo(2)
    assert GRID.size() == 64, GRID.size()
    simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))  # the kernel loaded (forked workers share it)

    t = time.perf_counter()
    backend = make_backend("local", workers=a.workers)
    try:
        fast = search(base, slo, TARGET_REQ_S, PRICES, GRID, backend=backend)
    finally:
        backend.close()
    fast_s = time.perf_counter() - t

    t = time.perf_counter()
    serial = search(base, slo, TARGET_REQ_S, PRICES, GRID, backend=make_backend("inline"), prune=False, warm=False)
    serial_s = time.perf_counter() - t

    out = {
        "configurations": GRID.size(), "requests_per_run": a.requests, "cores": default_workers(),
        "search": {"backend": fast["backend"], "wall_s": round(fast_s, 2),
                   "configurations_per_s": round(GRID.size() / fast_s, 2), "simulations": fast["simulations"],
                   "searched": fast["searched"], "pruned": len(fast["pruned"]), "skipped": len(fast["skipped"]),
                   "warm_starts": sum(c["warm_start"] for c in fast["configs"]), "best": best(fast)},
        "one_after_another": {"wall_s": round(serial_s, 2), "configurations_per_s": round(GRID.size() / serial_s, 2),
                              "simulations": serial["simulations"], "searched": serial["searched"],
                              "best": best(serial)},
        "speedup": round(serial_s / fast_s, 2),
        "same_best": best(fast) == best(serial),
    }
    if a.decompose:
        out["parts"] = {}
        for name, kw in (("pool + warm starts, no pruning", dict(prune=False)),
                         ("pool only (cold, no pruning)", dict(prune=False, warm=False))):
            t = time.perf_counter()
            backend = make_backend("local", workers=a.workers)
            try:
                r = search(base, slo, TARGET_REQ_S, PRICES, GRID, backend=backend, **kw)
            finally:
                backend.close()
            out["parts"][name] = {"wall_s": round(time.perf_counter() - t, 2), "simulations": r["simulations"],
                                  "best": best(r)}
    print(f"64-configuration search, {a.requests:,} requests per run, {default_workers()} cores")
    print(f"  search ({fast['backend']}, pruning + warm starts): {fast_s:6.1f} s, "
          f"{out['search']['configurations_per_s']:.2f} configurations/s, {fast['simulations']:,} simulations, "
          f"{fast['searched']} searched, {len(fast['pruned'])} pruned, {len(fast['skipped'])} skipped")
    print(f"  one after another (this process, cold, no pruning): {serial_s:6.1f} s, "
          f"{out['one_after_another']['configurations_per_s']:.2f} configurations/s, "
          f"{serial['simulations']:,} simulations")
    print(f"  speed-up {out['speedup']:.2f}x; best: {best(fast)} / {best(serial)} "
          f"({'same' if out['same_best'] else 'DIFFERENT'})")
    for name, part in out.get("parts", {}).items():
        print(f"  {name}: {part['wall_s']:6.1f} s, {part['simulations']:,} simulations, best {part['best']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0 if out["same_best"] else 1


if __name__ == "__main__":
    sys.exit(main())
