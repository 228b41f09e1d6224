"""The engine profiles against TensorRT-LLM's published throughput table (issue 23, Targets: within 15 %).

Source: NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md at commit 00f37686aa854010d68bcbd0f4ab000221541ca6
(the v1.0 "Performance Overview", PyTorch backend, trtllm-bench throughput): "Total Output Throughput (tokens/sec)"
with every request sent at once, fixed ISL/OSL, ModelOpt FP8 checkpoints (FP8 weights and FP8 KV cache:
nvidia/Llama-3.1-8B-Instruct-FP8, nvidia/Llama-3.3-70B-Instruct-FP8; Llama-3.3-70B has Llama-3.1-70B's shapes),
the request counts of its "Preparing a Dataset" table. Nothing is fitted to it: every row is a check. The
simulation runs each row saturated (all requests at 0) with the engine profile and its scheduler defaults.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from batching.sim.hardware.engines import engine_profile
from batching.sim.hardware.specs import deployment
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import DEFAULT_CLASSES, ArrivalProcess, LengthDist, SyntheticWorkload

SOURCE = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ 00f37686 (v1.0), Total Output Throughput "
          "(tokens/sec), trtllm-bench throughput, FP8")
# (model preset, gpu preset, tp) -> {(isl, osl): published output tokens/s}
PUBLISHED: dict[tuple[str, str, int], dict[tuple[int, int], float]] = {
    ("llama-3.1-8b", "h200-sxm", 1): {
        (128, 128): 27911, (128, 2048): 26221, (128, 4096): 18027, (500, 2000): 20770, (1000, 1000): 17744,
        (1000, 2000): 16828, (2048, 128): 3538, (2048, 2048): 12194, (5000, 500): 3902, (20000, 2000): 1804},
    ("llama-3.1-8b", "h100-sxm", 1): {
        (128, 128): 28312, (128, 2048): 22714, (128, 4096): 14325, (500, 2000): 17660, (1000, 1000): 15220,
        (1000, 2000): 13899, (2048, 128): 3450, (2048, 2048): 9305, (5000, 500): 3459, (20000, 2000): 1351},
    ("llama-3.1-70b", "h200-sxm", 1): {
        (128, 128): 3803, (128, 2048): 4336, (128, 4096): 2872, (500, 2000): 3666, (1000, 1000): 2909,
        (1000, 2000): 2994, (2048, 128): 442, (2048, 2048): 2003, (5000, 500): 566, (20000, 2000): 283},
    ("llama-3.1-70b", "h100-sxm", 2): {
        (128, 128): 6378, (128, 2048): 6651, (128, 4096): 4199, (500, 2000): 5222, (1000, 1000): 4205,
        (1000, 2000): 4146, (2048, 128): 762, (2048, 2048): 3082, (5000, 500): 898, (20000, 2000): 437},
}
# the request counts of the doc's dataset table (isl, osl) -> requests
REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500, (2048, 128): 3000,
            (2048, 2048): 1500, (5000, 500): 1500, (1000, 1000): 3000, (500, 2000): 3000, (20000, 2000): 1000}


def fixed_workload(isl: int, osl: int, n: int) -> SyntheticWorkload:
    cls = replace(DEFAULT_CLASSES[0], name="fixed", priority=0, share=1.0,
                  prompt=LengthDist("fixed", mean=isl, low=1, high=isl),
                  output=LengthDist("fixed", mean=osl, low=1, high=osl), slo_ttft_s=None, slo_tpot_s=None)
    return SyntheticWorkload(ArrivalProcess("poisson", 1.0), (cls,), n, 0)


def table_check(engine: str = "trtllm", rows: dict | None = None, max_requests: int | None = None,
                policy=None) -> pd.DataFrame:
    """Simulated against published output throughput, one row per (model, GPU, TP, ISL, OSL); ``policy`` None: the
    engine's own scheduler defaults."""
    prof = engine_profile(engine)
    out = []
    for (model, gpu, tp), points in (rows or PUBLISHED).items():
        dep = deployment(gpu, model, tp, tp, "fp8", kv_dtype="fp8")
        for (isl, osl), published in points.items():
            n = REQUESTS[(isl, osl)] if max_requests is None else min(max_requests, REQUESTS[(isl, osl)])
            sc = Scenario(dep, fixed_workload(isl, osl, n), policy or prof.policy, engine=engine)
            s = simulate(sc, saturated=True).summary()
            sim = s["throughput_output_tok_s"]
            out.append({"model": model, "gpu": gpu, "tp": tp, "isl": isl, "osl": osl, "requests": n,
                        "published_tok_s": published, "simulated_tok_s": sim, "error": sim / published - 1.0})
    return pd.DataFrame(out)
