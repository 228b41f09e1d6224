"""Engine speed: simulated requests/s and steps/s of wall time (after warm-up), the speed-up of
the jitted kernel over NUMBA_DISABLE_JIT=1, and the time a cold process takes to load the
cached kernel. Run: python benchmarks/bench_engine.py [--requests 10000]"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.engine import kernel as eng  # noqa: E402
from batching.sim.hardware.costmodel import cost_model  # noqa: E402
from batching.sim.policy import PRESETS, with_knobs  # noqa: E402
from batching.sim.simulate import Scenario, simulate  # noqa: E402
from batching.sim.engine.speculative import spec_for, spec_kv_blocks  # noqa: E402
from batching.sim.hardware.specs import GIB  # noqa: E402
from batching.sim.workload.requests import workload_preset  # noqa: E402


def engine_seconds(sc: Scenario, repeats: int = 3) -> tuple[float, int]:
    """Best-of wall time of the kernel alone (requests already generated), and its step count."""
    reqs = sc.workload.generate()
    caching = sc.policy.prefix_caching and reqs.block_off is not None
    inp = eng.inputs(reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens, reqs.priority,
                     chain_off=reqs.block_off if caching else None, chain_ids=reqs.block_ids if caching else None,
                     chain_len=reqs.block_len if caching else None, chain_shift=reqs.block_shift,
                     after=reqs.after, think_s=reqs.think_s)  # session turns (None: open loop)
    dep, pol = sc.deployment, sc.policy
    cm = cost_model(dep)
    kv = spec_kv_blocks(pol, dep)
    knobs = pol.knobs(len(reqs.class_names), kv, int(pol.swap_space_gib * GIB // dep.kv_bytes_per_token_per_gpu))
    spec = spec_for(pol, dep, cm, 0)
    best, steps = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        out = eng.run(inp, knobs, eng.kernel_cost(cm), prefix_caching=caching, spec=spec)
        best = min(best, time.perf_counter() - t)
        steps = len(out.steps_i)
    return best, steps


def _best(fn, repeats: int = 3) -> tuple[float, None]:
    """Best-of wall time of ``fn()`` after one warm-up call (compile or load), and no step count."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), None


def _race(runs: dict, n: int) -> dict[str, float]:
    """Requests/s of each run (``runs``: label -> () -> (seconds, steps or None)), a line each."""
    rates = {}
    for label, fn in runs.items():
        sec, steps = fn()
        rates[label] = n / sec
        print(f"{label:16s} {sec:9.4f} {n / sec:12,.0f} requests/s" + (f" {steps:9,d} steps" if steps else ""))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=3.0)
    args = ap.parse_args()
    t = time.perf_counter()
    simulate(Scenario(workload=workload_preset("mixed", args.rate, 50, 0)))  # warm-up: load or compile
    print(f"warm-up (kernel load/compile in this process): {time.perf_counter() - t:.2f} s")
    print(f"\n{args.requests:,} requests of the default scenario (mixed, {args.rate} req/s), kernel only:")
    print(f"{'preset':12s} {'wall (s)':>9s} {'requests/s':>12s} {'steps/s':>12s} {'steps':>9s}   simulate() (s)")
    for name, pol in PRESETS.items():
        sc = Scenario(workload=workload_preset("mixed", args.rate, args.requests, 0), policy=pol)
        sec, steps = engine_seconds(sc)
        t = time.perf_counter()
        simulate(sc)
        full = time.perf_counter() - t
        print(f"{name:12s} {sec:9.4f} {args.requests / sec:12,.0f} {steps / sec:12,.0f} {steps:9,d}   {full:.3f}")
    # prefix caching: its cost on a workload that uses it, and that it costs nothing where nothing is shared
    print(f"\nprefix caching, continuous, {args.requests:,} requests of `chat` with a 2,000-token shared system prompt "
          f"({args.rate} req/s), kernel only:")
    shared = workload_preset("chat", args.rate, args.requests, 0).with_shared_prefix(2000)
    base = PRESETS["continuous"]
    off = with_knobs(base, prefix_caching=False, max_num_batched_tokens=16384)
    on = with_knobs(base, prefix_caching=True, max_num_batched_tokens=16384)
    rates = _race({"caching off": lambda: engine_seconds(Scenario(workload=shared, policy=off)),
                   "caching on": lambda: engine_seconds(Scenario(workload=shared, policy=on))}, args.requests)
    print(f"caching on keeps {rates['caching on'] / rates['caching off']:.0%} of the requests/s of caching off "
          f"(target >= 75 %)")
    # speculative decoding: EAGLE, K = 3, A = 0.8, beside plain continuous on the default scenario
    print(f"\nspeculative decoding, continuous, {args.requests:,} requests of the default scenario, kernel only:")
    eagle = with_knobs(PRESETS["continuous"], spec_decode="eagle", spec_tokens=3, spec_acceptance=0.8)
    mixed = workload_preset("mixed", args.rate, args.requests, 0)
    rates = _race({"plain": lambda: engine_seconds(Scenario(workload=mixed, policy=PRESETS["continuous"])),
                   "eagle K=3": lambda: engine_seconds(Scenario(workload=mixed, policy=eagle))}, args.requests)
    print(f"speculation keeps {rates['eagle K=3'] / rates['plain']:.0%} of the requests/s of plain "
          f"continuous (target >= 50 %)")
    # closed-loop clients: the same requests sent by 64 clients, each its next when its previous one ends (the
    # engine holds a client's next request until then: engine.state.Later)
    print(f"\nclosed-loop clients, continuous, {args.requests:,} requests of the default scenario's lengths, "
          "kernel only:")
    clients = mixed.with_concurrency(64)
    rates = _race({"plain": lambda: engine_seconds(Scenario(workload=mixed, policy=PRESETS["continuous"])),
                   "64 clients": lambda: engine_seconds(Scenario(workload=clients, policy=PRESETS["continuous"]))},
                  args.requests)
    print(f"closed loop keeps {rates['64 clients'] / rates['plain']:.0%} of the requests/s of the open loop "
          f"(target >= 50 %)")
    # disaggregation (1 prefill TP 4 + 1 decode TP 4) and a fleet behind a state-reading router, beside plain
    # continuous on the same requests (best of 3, the Python set-up of their runs included)
    print(f"\ndisaggregation and fleets, continuous, {args.requests:,} requests of the default scenario:")
    from batching.sim.hardware.costmodel import cost_model as _cm
    from batching.sim.topology.disagg import Disagg, run_disagg
    from batching.sim.topology.fleet import run_fleet

    reqs = mixed.generate()
    dep = Scenario().deployment
    # the step budget as a Scenario sizes it (vLLM V0: the model's context), which run_disagg does not do itself
    pol = PRESETS["continuous"].sized_for(dep.model.max_context_tokens, int(reqs.prompt_tokens.max()))
    cm0 = _cm(dep)
    kv = spec_kv_blocks(pol, dep)
    swap = int(pol.swap_space_gib * GIB // dep.kv_bytes_per_token_per_gpu)
    rates = _race({"plain": lambda: engine_seconds(Scenario(workload=mixed, policy=pol)),
                   "disagg 1x4+1x4": lambda: _best(lambda: run_disagg(reqs, dep, Disagg(1, 4, 1, 4), pol,
                                                                      cm0.allreduce)),
                   "disagg 1x4+1x4 eagle": lambda: _best(lambda: run_disagg(reqs, dep, Disagg(1, 4, 1, 4),
                                                                            with_knobs(pol, spec_decode="eagle"),
                                                                            cm0.allreduce)),
                   "2 replicas LO": lambda: _best(lambda: run_fleet(reqs, 2, "least-outstanding", pol, swap, kv,
                                                                    cm0))}, args.requests)
    for label in ("disagg 1x4+1x4", "disagg 1x4+1x4 eagle", "2 replicas LO"):
        print(f"{label} keeps {rates[label] / rates['plain']:.0%} of the requests/s of plain continuous "
              f"(target >= 50 %)")
    # speed-up over the interpreted kernel on 500 requests
    code = ("import sys,time; sys.path.insert(0, %r)\n"
            "from benchmarks.bench_engine import engine_seconds\n"
            "from batching.sim.simulate import Scenario; from batching.sim.workload.requests import workload_preset\n"
            "print(engine_seconds(Scenario(workload=workload_preset('mixed', %r, 500, 0)), repeats=1)[0])"
            % (str(ROOT), args.rate))
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    slow = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True, cwd=ROOT).stdout.strip().splitlines()[-1])
    fast, _ = engine_seconds(Scenario(workload=workload_preset("mixed", args.rate, 500, 0)))
    print(f"\n500 requests, continuous: interpreted {slow:.3f} s, jitted {fast:.5f} s, speed-up {slow / fast:,.0f}x")
    # cold process: import + load the cached kernel + first small simulation
    code = ("import time; t=time.perf_counter(); import sys; sys.path.insert(0, %r)\n"
            "from batching.sim.simulate import Scenario, simulate; from batching.sim.workload.requests import workload_preset\n"
            "simulate(Scenario(workload=workload_preset('mixed', 3.0, 50, 0)))\n"
            "print(time.perf_counter()-t)" % str(ROOT))
    cold = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout.strip())
    print(f"cold process, cached kernel: import + first simulation {cold:.2f} s")
    print(json.dumps({"cold_start_s": round(cold, 3), "jit_speedup": round(slow / fast, 1)}))


if __name__ == "__main__":
    main()
