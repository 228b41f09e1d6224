"""The simulator held against a published end-to-end run it was never fitted to (docs/CALIBRATION.md,
"End to end"): Llama-3.1-70B on 4xH100, median TPOT online and offline throughput, beside SGLang's and vLLM's
published figures. Many simulations, so a study (it used to sit in sim's calibration module)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.specs import deployment
from batching.sim.policy import NAMED_POLICIES
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset

# Published end-to-end reference (sgl-project/sglang benchmark/benchmark_vllm_060/README.md):
# Llama-3.1-70B-Instruct BF16 on 4xH100 TP4, ShareGPT prompts from sglang.bench_serving.
PUBLISHED = {
    "sglang": {"tpot_p50_s@4": 25.03e-3, "tpot_p50_s@8": 33.07e-3, "offline_output_tok_s": 3856.01},
    "vllm": {"tpot_p50_s@4": 23.58e-3, "tpot_p50_s@8": 29.15e-3, "offline_output_tok_s": 3700.64},
}
PUBLISHED_SOURCE = "sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang v0.3.0, vLLM v0.6.0)"
END_TO_END_TOLERANCE = 0.20


E2E_MODEL = "llama-3.1-70b"
E2E_POLICY = "continuous-v0"  # vLLM 0.6 and SGLang 0.3: whole-prompt prefill steps (policy.V0_CONTINUOUS)
E2E_WORKLOAD = "sharegpt"
E2E_RUNS = ((4.0, 1200), (8.0, 2400))  # req/s and prompts of the online runs, as published
E2E_OFFLINE_PROMPTS = 5000


@dataclass(frozen=True)
class EndToEnd:
    metric: str
    model: float
    sglang: float
    vllm: float

    @property
    def error_sglang(self) -> float:
        return self.model / self.sglang - 1.0

    @property
    def error_vllm(self) -> float:
        return self.model / self.vllm - 1.0

    @property
    def within(self) -> bool:
        return min(abs(self.error_sglang), abs(self.error_vllm)) <= END_TO_END_TOLERANCE


def end_to_end(policy: str = E2E_POLICY, seed: int = 0, allreduce: str = cm.DEFAULT_ALLREDUCE) -> list[EndToEnd]:
    """Continuous batching of Llama-3.1-70B BF16 on 4xH100 (TP 4) with ShareGPT-like traffic:
    median TPOT at 4 and 8 req/s (1,200 and 2,400 requests) and offline output throughput
    (5,000 prompts at t = 0), beside the published SGLang v0.3.0 and vLLM v0.6.0 figures."""
    dep = deployment(model=E2E_MODEL, tp=4, num_gpus=4)
    pol = NAMED_POLICIES[policy]
    out = []
    for rate, n in E2E_RUNS:
        s = simulate(Scenario(dep, workload_preset(E2E_WORKLOAD, rate, n, seed), pol, allreduce)).summary()
        key = f"tpot_p50_s@{rate:g}"
        out.append(EndToEnd(f"median TPOT at {rate:g} req/s (s)", s["tpot_p50_s"], PUBLISHED["sglang"][key],
                            PUBLISHED["vllm"][key]))
    s = simulate(Scenario(dep, workload_preset(E2E_WORKLOAD, 1.0, E2E_OFFLINE_PROMPTS, seed), pol, allreduce),
                 saturated=True).summary()
    out.append(EndToEnd("offline output throughput (tok/s)", s["throughput_output_tok_s"],
                        PUBLISHED["sglang"]["offline_output_tok_s"], PUBLISHED["vllm"]["offline_output_tok_s"]))
    return out


def end_to_end_frame(results: list[EndToEnd] | None = None) -> pd.DataFrame:
    results = end_to_end() if results is None else results
    return pd.DataFrame([{"metric": r.metric, "model": r.model, "sglang_v0.3.0": r.sglang, "vllm_v0.6.0": r.vllm,
                          "error_vs_sglang": r.error_sglang, "error_vs_vllm": r.error_vllm,
                          "within_20pct_of_either": r.within} for r in results])
