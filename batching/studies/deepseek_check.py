"""DeepSeek-R1/V3 serving on 8xH200 held against published runs it was never fitted to (docs/CALIBRATION.md, "MLA and
large MoE models"): mean TPOT and output throughput at 8 to 64 closed-loop clients, beside the same figures before
the measured MoE/MLA kernels and aiconfigurator's estimate for the same setting."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from batching.sim.hardware.specs import deployment
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import LengthDist, workload_preset

# SemiAnalysis InferenceX issue #870 (github.com/SemiAnalysisAI/InferenceX/issues/870, comment of 2026-03-05):
# DeepSeek-R1-0528, SGLang v0.5.7, FP8, TP 8, EP 1, 8xH200, ISL 1,024 / OSL 1,024, max concurrency 8/16/32/64:
# mean TPOT (ms) and output throughput per GPU (tok/s; x 8 GPUs for the node)
SOURCE = "SemiAnalysis InferenceX issue #870 (SGLang v0.5.7, DeepSeek-R1-0528 FP8, TP 8, 8xH200, 1k/1k)"
PUBLISHED = {8: (12.8e-3, 74.6 * 8), 16: (17.2e-3, 111.9 * 8), 32: (25.6e-3, 151.1 * 8), 64: (34.6e-3, 223.6 * 8)}
PUBLISHED_TTFT = {8: 330.6e-3, 16: 356.0e-3, 32: 426.5e-3, 64: 423.1e-3}  # mean TTFT (s), same runs
PUBLISHED_TTFT_P99 = {8: 1975.4e-3, 16: 2149.4e-3, 32: 2644.1e-3, 64: 2741.1e-3}  # P99 TTFT (s), same runs
# The simulator before the measured kernels (commit 4defdf7, these settings, its summary()): mean TPOT (s), as the
# publication states it, and output tok/s (its median TPOTs were 10.209, 15.105, 21.952 and 30.015 ms)
BEFORE = {8: (10.125e-3, 768.0), 16: (14.930e-3, 1045.1), 32: (21.720e-3, 1445.9), 64: (29.652e-3, 2112.1)}
# The published TPOT is a mean over requests (sglang.bench_serving's "Mean TPOT": per request (E2E - TTFT) /
# (output tokens - 1), averaged), the simulator's tpot_mean_s (batching/sim/metrics.py) the same figure: like with like
SIM_TPOT = "tpot_mean_s"
# aiconfigurator 0.12.0 `cli estimate --model-path deepseek-ai/DeepSeek-V3 --system h200_sxm --backend sglang
# --isl 1024 --osl 1024 --batch-size N --tp-size 8 --moe-tp-size 8 --moe-ep-size 1 --gemm-quant-mode fp8_block
# --moe-quant-mode fp8_block --kvcache-quant-mode bfloat16` (its SGLang 0.5.14 database; a static batch of N): TPOT
AIC_SGLANG_TPOT = {8: 12.103e-3, 16: 18.095e-3, 32: 23.323e-3, 64: 30.186e-3}
# The run's server and client (InferenceX benchmarks/dsr1_fp8_h200.sh, 1k/1k): sglang.launch_server --tp 8
# --max-running-requests 512 --chunked-prefill-size 32768 --max-prefill-tokens 32768, no radix cache; the client
# sends CONC x 10 random prompts at --max-concurrency CONC with the suite's random range ratio 0.8: lengths uniform
# in [0.8 x 1,024, 1,024] (mean 922; the published mean E2E over mean TPOT, (12.22 s - 0.33 s) / 12.8 ms = 929
# output tokens, agrees). SGLang's scheduler runs prefill batches apart from decode batches (mixed chunking off
# by default): whole-prompt prefill steps that pause decodes, the "continuous" preset with SGLang's limits.
POLICY = "continuous"
MAX_RUNNING_REQUESTS = 512
MAX_PREFILL_TOKENS = 32768
LENGTH_TOKENS = 1024
RANGE_RATIO = 0.8
REQUESTS_PER_CLIENT = 10


def scenario(concurrency: int) -> Scenario:
    lengths = LengthDist("uniform", mean=LENGTH_TOKENS * (1 + RANGE_RATIO) / 2, low=int(LENGTH_TOKENS * RANGE_RATIO),
                         high=LENGTH_TOKENS)
    wl = workload_preset("batch", 1.0, concurrency * REQUESTS_PER_CLIENT, 0)
    wl = replace(wl, classes=tuple(replace(c, prompt=lengths, output=lengths) for c in wl.classes))
    pol = with_knobs(PRESETS[POLICY], max_num_seqs=MAX_RUNNING_REQUESTS, max_num_batched_tokens=MAX_PREFILL_TOKENS,
                     prefill_only_steps=True)  # SGLang's prefill batches apart from its decode batches
    return Scenario(deployment("h200-sxm", "deepseek-v3", 8, precision="fp8"), wl.with_concurrency(concurrency), pol)


def deepseek_frame(clients: tuple[int, ...] = tuple(PUBLISHED)) -> pd.DataFrame:
    """One row per client count (of ``PUBLISHED``'s): published, before, now and aiconfigurator's TPOT (ms; the
    simulated ones means over requests, as published), output
    tok/s, errors; the throughput error the TPOT error alone makes; mean and P99 TTFT beside the first wave's and the
    rest's; and the same run with the ``sglang`` engine profile (``tpot_sglang_ms``, its errors)."""
    rows = []
    for n in clients:
        tpot, out = PUBLISHED[n]
        res = simulate(scenario(n))
        s = res.summary()
        req = res.requests
        first = req["arrival_s"].to_numpy() <= 0.0  # the first wave: every client's first prompt, sent at once
        # the runs are SGLang's: its profile overlaps the scheduler with the GPU (no serial CPU time per step)
        sg = simulate(scenario(n).with_engine("sglang")).summary()
        rows.append({"clients": n, "published_tpot_ms": tpot * 1e3, "before_tpot_ms": BEFORE[n][0] * 1e3,
                     "tpot_ms": s[SIM_TPOT] * 1e3, "aiconfigurator_tpot_ms": AIC_SGLANG_TPOT[n] * 1e3,
                     "tpot_error_before": BEFORE[n][0] / tpot - 1, "tpot_error": s[SIM_TPOT] / tpot - 1,
                     "aiconfigurator_error": AIC_SGLANG_TPOT[n] / tpot - 1,
                     "published_output_tok_s": out, "output_tok_s": s["throughput_output_tok_s"],
                     "output_error_before": BEFORE[n][1] / out - 1,
                     "output_error": s["throughput_output_tok_s"] / out - 1,
                     # a closed-loop client's rate is its output over TTFT + output x TPOT: the throughput error
                     # the TPOT error alone makes
                     "output_error_from_tpot": tpot / s[SIM_TPOT] - 1,
                     "published_ttft_ms": PUBLISHED_TTFT[n] * 1e3, "ttft_p50_ms": s["ttft_p50_s"] * 1e3,
                     "ttft_mean_ms": s["ttft_mean_s"] * 1e3, "published_ttft_p99_ms": PUBLISHED_TTFT_P99[n] * 1e3,
                     "ttft_p99_ms": s["ttft_p99_s"] * 1e3, "first_wave_share": float(first.mean()),
                     "ttft_first_wave_max_ms": float(req["ttft_s"][first].max()) * 1e3,
                     "ttft_rest_mean_ms": float(req["ttft_s"][~first].mean()) * 1e3,
                     "tpot_sglang_ms": sg[SIM_TPOT] * 1e3, "tpot_error_sglang": sg[SIM_TPOT] / tpot - 1,
                     "output_error_sglang": sg["throughput_output_tok_s"] / out - 1, "calibrated": s["calibrated"]})
    frame = pd.DataFrame(rows)
    frame.attrs.update(source=SOURCE, policy=POLICY)
    return frame
