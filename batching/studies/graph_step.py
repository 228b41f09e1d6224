"""Batch-1 decode with and without the CUDA-graph step (docs/CALIBRATION.md, "Per-step overhead"): the mean TPOT
of one closed-loop client of Llama-3.1-8B on one H100 with the vllm engine profile, and with the same profile
whose pure-decode steps pay the whole per-step CPU time (graph_step_saving_s 0)."""
from __future__ import annotations

from dataclasses import replace

from batching.sim.hardware.engines import ENGINES
from batching.sim.hardware.specs import deployment
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset

MODEL, GPU = "llama-3.1-8b", "h100-sxm"
REQUESTS = 50  # one client's ShareGPT requests, one after another


def batch_one_tpots(seed: int = 0) -> tuple[float, float]:
    """(mean TPOT with the graph saving, mean TPOT without it), seconds."""
    dep = deployment(GPU, MODEL, 1, 1, "bf16")
    wl = workload_preset("sharegpt", 1.0, REQUESTS, seed).with_concurrency(1)
    vllm = ENGINES["vllm"]
    piecewise = replace(vllm, name="vllm-piecewise", graph_step_saving_s=0.0)
    return tuple(simulate(Scenario(dep, wl, engine=p)).summary()["tpot_mean_s"] for p in (vllm, piecewise))
