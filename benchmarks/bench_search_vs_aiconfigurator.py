"""Our whole aggregated + disaggregated deployment search against NVIDIA's aiconfigurator on the same question,
timed side by side in one run on this machine (issue 24, item "Speed"): Llama-3.1-70B FP8 on one node of 8 x H200,
4,000 prompt / 1,000 output tokens, TTFT <= 2 s and TPOT <= 30 ms.

- aiconfigurator (its own venv, default /work/venv-aic; ``pip install aiconfigurator``):
  ``aiconfigurator cli default --model-path nvidia/Llama-3.1-70B-Instruct-FP8 --system h200_sxm --backend vllm
  --total-gpus 8 --isl 4000 --osl 1000 --ttft 2000 --tpot 30``; if it is not installed the benchmark says so and
  times only ours.
- ours: ``studies.search.search`` with serving both (aggregated TP 1/2/4/8 x replicas and every kept prefill/decode
  split P x T + D x U of the node), the chunked preset, --requests per simulation (default 300), SLO attainment
  99 %, a target of --target-rate req/s (default 100: about 20 nodes, so the cost at the target ranks by throughput
  per GPU as aiconfigurator's tokens/s/gpu does, and whole-node ties do not blur it; at 5 req/s every configuration
  needs 2 nodes and nothing can be pruned), the fleet check off (aiconfigurator has none).

Run: python benchmarks/bench_search_vs_aiconfigurator.py [--requests 300] [--target-rate 100] [--workers N]
On a shared or busy machine the figures are noisy: run it alone, and more than once."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node  # noqa: E402
from batching.sim.simulate import Scenario, simulate  # noqa: E402
from batching.sim.workload.requests import LengthDist, workload_preset  # noqa: E402
from batching.studies.backends import make_backend  # noqa: E402
from batching.studies.capacity import SLO  # noqa: E402
from batching.studies.search import Grid, search  # noqa: E402

AIC_ARGS = ["cli", "default", "--model-path", "nvidia/Llama-3.1-70B-Instruct-FP8", "--system", "h200_sxm",
            "--backend", "vllm", "--total-gpus", "8", "--isl", "4000", "--osl", "1000", "--ttft", "2000",
            "--tpot", "30"]
GRID = Grid(gpus=("h200-sxm",), precisions=("fp8",), tps=(1, 2, 4, 8), policies=("chunked",), serving="both")
SLO_Q = SLO(ttft_s=2.0, tpot_s=0.030)


def question(requests: int) -> Scenario:
    wl = workload_preset("chat", 1.0, requests, 0)
    fixed = lambda n: LengthDist("fixed", mean=n, low=1, high=n)  # noqa: E731
    wl = replace(wl, classes=tuple(replace(c, prompt=fixed(4000), output=fixed(1000)) for c in wl.classes))
    return Scenario(Deployment(Node(GPUS["h200-sxm"], 8, 8), MODELS["llama-3.1-70b"], "fp8"), wl)


def run_aiconfigurator(exe: str | None) -> dict:
    if exe is None:
        return {"installed": False, "note": "aiconfigurator is not installed (pip install aiconfigurator in a venv, "
                                            "then --aiconfigurator PATH); only ours is timed"}
    t = time.perf_counter()
    proc = subprocess.run([exe, *AIC_ARGS], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    lines = (proc.stdout + proc.stderr).splitlines()
    done = [ln.strip() for ln in lines if "completed in" in ln]
    # each table's title and its rank-1 row (its best aggregated and disaggregated configuration)
    best = [ln.strip() for i, ln in enumerate(lines) if "Top Configurations" in ln
            or (ln.startswith("|  1 ") and i > 0)]
    return {"installed": True, "seconds": seconds, "returncode": proc.returncode, "lines": done[-1:],
            "best": best}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--target-rate", type=float, default=100.0)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--aiconfigurator", default=None,
                    help="path of the aiconfigurator executable (default: /work/venv-aic/bin/aiconfigurator, "
                         "else the one on PATH)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    exe = a.aiconfigurator or next((p for p in ("/work/venv-aic/bin/aiconfigurator",) if Path(p).exists()),
                                   shutil.which("aiconfigurator"))
    aic = run_aiconfigurator(exe)

    base = question(a.requests)
    simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))  # the kernel loaded (forked workers share it)
    t = time.perf_counter()
    backend = make_backend("local", workers=a.workers)
    try:
        res = search(base, SLO_Q, a.target_rate, None, GRID, backend=backend, fleet_top=0)
    finally:
        backend.close()
    ours_s = time.perf_counter() - t
    best = {r["serving"]: r for r in res["best_by_serving"]}
    out = {"aiconfigurator": aic,
           "ours": {"seconds": ours_s, "configurations": res["grid_size"], "searched": res["searched"],
                    "pruned": len(res["pruned"]), "dominated_splits": len(res["dominated"]),
                    "simulations": res["simulations"], "requests_per_simulation": a.requests,
                    "target_rate_req_s": a.target_rate, "best": res["configs"][0]["label"] if res["configs"] else None,
                    "best_by_serving": best}}
    if aic.get("installed"):
        print(f"aiconfigurator: {aic['seconds']:,.1f} s wall (exit {aic['returncode']}); " + " | ".join(aic["lines"]))
        for ln in aic["best"]:
            print(f"  {ln}")
    else:
        print(aic["note"])
    print(f"ours: {ours_s:,.1f} s wall for {res['grid_size']} configurations ({res['searched']} searched, "
          f"{len(res['pruned'])} pruned, {len(res['dominated'])} dominated splits not enumerated), "
          f"{res['simulations']:,} simulations of {a.requests} requests; {res['backend']}")
    for s, r in best.items():
        print(f"  best {s}: {r['label']}: {r['max_rate_req_s'] or 0:,.3g} req/s per copy, "
              f"{r['nodes_needed']} node(s), ${r['usd_per_million_output_tokens'] or 0:,.3f} per million output "
              f"tokens" + (f" ({r['why_not_best']})" if r["why_not_best"] else ""))
    if aic.get("installed"):
        print(f"ours / aiconfigurator: {ours_s / aic['seconds']:.2f}x the time")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
