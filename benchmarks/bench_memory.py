"""Memory of one simulation: peak resident memory per request of ``python -m batching run`` (each case in a
fresh process, after a warm-up run that loads the kernel), and a fit of bytes per request and per simulated
step. Memory follows the step count as much as the request count: a saturated node takes ~2 steps per request,
the default scenario (mixed, 3 req/s on 8xH100, Qwen2.5-72B) ~21, an idle node one step per output token.

The last case runs the request cap (``workload.MAX_NUM_REQUESTS``) at the default scenario and checks that its
peak stays within the documented host's budget (24 GiB, README "Command line").

``--fleets`` measures fleets and splits instead (steps summed over replicas and instances; behind a router that
reads replica state, or in a split, every engine holds every request's state), each against ``sim.topology.sizing``'s
estimate (``simulate.run_size`` with its pilot): the resident memory above what the process held before the run
(VmRSS), so it is at or above what the run itself adds. ``--big`` adds issue 22's 512-replica, 200,000-request
fleet behind least-outstanding (9.5 GB, two minutes).

Run: python benchmarks/bench_memory.py [--quick | --fleets [--big]]   (about a minute; --quick skips the cap run)
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


# (label, CLI flags) of python -m batching run
FLEET_CASES = (
    ("1 node, default load", "--requests 100000 --rate 3"),
    ("1 node, light load", "--requests 20000 --rate 0.2"),
    ("64 replicas, round-robin", "--model llama-3.1-8b --tp 1 --nodes 8 --requests 100000 --rate 3000"),
    ("64 replicas, rr, light", "--model llama-3.1-8b --tp 1 --nodes 8 --requests 20000 --rate 0.5"),
    ("64 replicas, LO", "--model llama-3.1-8b --tp 1 --nodes 8 --requests 50000 --rate 5000 --router least-outstanding"),
    ("128 replicas, LO", "--model llama-3.1-8b --tp 1 --nodes 16 --requests 20000 --rate 5000 --router least-outstanding"),
    ("256 replicas, LO", "--model llama-3.1-8b --tp 1 --nodes 32 --requests 50000 --rate 5000 --router least-outstanding"),
    ("512 replicas, LO", "--model llama-3.1-8b --tp 1 --nodes 64 --requests 20000 --rate 10000 --router least-outstanding"),
    ("split 4 + 4", "--model llama-3.1-8b --tp 1 --prefill-instances 4 --prefill-tp 1 --decode-instances 4 --decode-tp 1 "
                    "--requests 50000 --rate 200"),
    ("split 8 + 8", "--model llama-3.1-8b --tp 1 --nodes 2 --prefill-instances 8 --prefill-tp 1 --decode-instances 8 "
                    "--decode-tp 1 --requests 20000 --rate 400"),
    ("split 32 + 32", "--model llama-3.1-8b --tp 1 --nodes 8 --prefill-instances 32 --prefill-tp 1 "
                      "--decode-instances 32 --decode-tp 1 --requests 50000 --rate 1000"),
)
BIG_CASE = ("512 replicas, LO, 200k", "--model llama-3.1-8b --tp 1 --nodes 64 --requests 200000 --rate 10000 "
                                      "--router least-outstanding")


def fleet_child(flags: str) -> None:
    """In a fresh process: warm up on 200 requests of the scenario, size it, run it; print one JSON line."""
    from dataclasses import replace

    from batching.cli.main import make_parser
    from batching.cli.args import build_scenario
    from batching.sim.simulate import run_size, simulate

    sc = build_scenario(make_parser().parse_args(["run", *flags.split()]))
    simulate(replace(sc, workload=sc.workload.with_num_requests(200)))  # kernels loaded, pandas warmed
    size = run_size(sc, sc.workload.generate(), measure=True)
    with open("/proc/self/status") as f:
        before = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
    t = time.perf_counter()
    res = simulate(sc)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"grew": peak - before, "estimate": size.bytes, "steps": len(res.steps),
                      "estimated_steps": size.steps, "requests": size.requests, "engines": size.engines,
                      "holds_all": size.holds_all, "wall": wall}))


def fleets(big: bool) -> None:
    from batching.sim import sizing

    print(f"{'case':26s} {'requests':>9s} {'engines':>7s} {'steps':>10s} {'estimated':>10s} {'peak above':>11s} "
          f"{'estimate':>9s} {'ratio':>6s} {'wall':>7s}")
    rows = []
    for label, flags in FLEET_CASES + ((BIG_CASE,) if big else ()):
        p = subprocess.run([sys.executable, __file__, "--fleet-child", flags], capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"{label}: child failed ({p.returncode}): {p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append(r)
        engines = f"{r['engines']}{'*' if r['holds_all'] else ''}"
        print(f"{label:26s} {r['requests']:>9,} {engines:>7s} {r['steps']:>10,} {r['estimated_steps']:>10,} "
              f"{r['grew'] / 2**20:>7,.0f} MiB {r['estimate'] / 2**20:>5,.0f} MiB {r['grew'] / r['estimate']:>6.2f} "
              f"{r['wall']:>6.1f}s")
    print(f"(* every engine holds every request's state; estimate = {sizing.BYTES_PER_REQUEST} B a request + "
          f"{sizing.BYTES_PER_STEP} B a step + {sizing.BYTES_PER_REQUEST_ENGINE} B a request per *engine)")
    import numpy as np

    m = np.array([[r["requests"], r["steps"], r["requests"] * r["engines"] * r["holds_all"]] for r in rows], float)
    y = np.array([r["grew"] for r in rows], float)
    (a, b, c), *_ = np.linalg.lstsq(m, y, rcond=None)
    print(f"least squares on the measured steps: {a:.0f} B a request + {b:.0f} B a step + {c:.0f} B a request per "
          f"*engine")


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
    ap.add_argument("--fleets", action="store_true", help="fleets and splits against sim.topology.sizing's estimate")
    ap.add_argument("--big", action="store_true", help="with --fleets: add the 512-replica 200,000-request fleet")
    ap.add_argument("--fleet-child", metavar="FLAGS")
    a = ap.parse_args()
    if a.child:
        child(int(a.child[0]), float(a.child[1]))
        return
    if a.fleet_child:
        fleet_child(a.fleet_child)
        return
    if a.fleets:
        fleets(a.big)
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
