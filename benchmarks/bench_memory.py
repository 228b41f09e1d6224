"""Memory of one simulation: peak resident memory per request of ``python -m batching run`` (each case in a
fresh process, after a warm-up run that loads the kernel), and a fit of bytes per request and per simulated
step. Memory follows the step count as much as the request count: a saturated node takes ~2 steps per request,
the default scenario (mixed, 3 req/s on 8xH100, Qwen2.5-72B) ~21, an idle node one step per output token.

The last case runs the request cap (``workload.MAX_NUM_REQUESTS``) at the default scenario and checks that its
peak stays within the documented host's budget (24 GiB, README "Command line").

Run: python benchmarks/bench_memory.py [--quick]   (about a minute; --quick skips the cap run)
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOST_GIB = 24  # the documented host: 2 cores, 24 GiB
BUDGET_GIB = 16  # what the cap's run may take on it, leaving room for the OS, a dashboard or a second run
CASES = (  # (label, requests, rate req/s)
    ("default load", 100_000, 3.0),
    ("saturated", 100_000, 1000.0),
    ("light load", 20_000, 0.2),
)


def child(requests: int, rate: float) -> None:
    """In a fresh process: warm up, then run the CLI once; print one JSON line with the figures."""
    from batching.cli.main import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.json"
        main(["run", "--requests", "50", "--json", str(out)])  # kernel loaded, pandas warmed
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t = time.perf_counter()
        rc = main(["run", "--requests", str(requests), "--rate", repr(rate), "--json", str(out)])
        wall = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        steps = json.loads(out.read_text())["num_steps"] if rc == 0 else None
    print(json.dumps({"rc": rc, "base": base, "peak": peak, "steps": steps, "wall": wall}))


def measure(requests: int, rate: float) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", str(requests), repr(rate)], capture_output=True,
                       text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"child failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("REQUESTS", "RATE"))
    ap.add_argument("--quick", action="store_true", help="skip the run at the request cap")
    a = ap.parse_args()
    if a.child:
        child(int(a.child[0]), float(a.child[1]))
        return
    from batching.sim.workload.requests import MAX_NUM_REQUESTS

    cases = list(CASES) + ([] if a.quick else [("default load, the cap", MAX_NUM_REQUESTS, 3.0)])
    print(f"{'case':24s} {'requests':>10s} {'rate':>7s} {'steps/req':>10s} {'peak RSS':>10s} {'above warm':>11s} "
          f"{'per request':>12s} {'wall':>7s}")
    rows = []
    for label, n, rate in cases:
        r = measure(n, rate)
        if r["rc"] != 0:
            raise SystemExit(f"{label}: python -m batching run exited with {r['rc']}")
        grown = r["peak"] - r["base"]
        rows.append((n, r["steps"], grown, r["peak"]))
        print(f"{label:24s} {n:>10,} {rate:>7g} {r['steps'] / n:>10.1f} {r['peak'] / 2**30:>8.2f} GiB "
              f"{grown / 2**30:>7.2f} GiB {grown / n / 1e3:>9.2f} KB {r['wall']:>6.1f}s")
    # bytes = a * requests + b * steps, least squares over the cases
    import numpy as np

    m = np.array([[n, s] for n, s, _, _ in rows], float)
    y = np.array([g for _, _, g, _ in rows], float)
    (per_req, per_step), *_ = np.linalg.lstsq(m, y, rcond=None)
    print(f"\nfit: {per_req / 1e3:.2f} KB per request + {per_step:.0f} B per simulated step")
    if not a.quick:
        n, _, _, peak = rows[-1]
        total = peak / 2**30
        verdict = "OK" if total <= BUDGET_GIB else "TOO BIG"
        print(f"the cap ({n:,} requests, default load): the process peaks at {total:.1f} GiB: {verdict} "
              f"(budget {BUDGET_GIB} GiB of the {HOST_GIB} GiB host)")
        if total > BUDGET_GIB:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
