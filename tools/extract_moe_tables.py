"""Extract the measured MoE and MLA kernel tables the cost model reads (batching/data/aic_*.csv).

Source: NVIDIA aiconfigurator 0.12.0's per-op database (Apache-2.0), the vLLM 0.24.0 collection of each GPU:
aiconfigurator_core/systems/data/<gpu>/{moe,mla}/vllm/0.24.0/*.parquet, and SGLang 0.5.14's MoE op
(moe/sglang/0.5.14) for runs of that engine. Only the rows the preset models need
are kept (DeepSeek-V3, Kimi-K2, Qwen3-30B-A3B shapes; aiconfigurator's DeepSeek routing distribution), one row
per key: where two kernels were measured for the same key, the faster (the one an engine tuned for it runs).

    /work/venv-aic/bin/python tools/extract_moe_tables.py /path/to/aiconfigurator_core/systems/data
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

GPUS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200"}
VERSION = "0.24.0"
SGLANG_VERSION = "0.5.14"  # SGLang's fused MoE kernels, for runs of that engine (aic_moe_sglang_*.csv)
# (hidden_size, moe_intermediate_size, num_experts, top_k) of the preset MoE models
MOE_SHAPES = {(7168, 2048, 256, 8), (7168, 2048, 384, 8), (2048, 768, 128, 8)}
MOE_DTYPES = ("bfloat16", "fp8_block", "nvfp4")
# aiconfigurator's DeepSeek model routes with a power law of alpha 1.01 (sdk/models/deepseek.py, _power_law_alpha)
DISTRIBUTION = "power_law_1.01"
MAX_GPUS = 16  # expert-parallel or tensor-parallel groups up to two 8-GPU nodes
MLA_HEADS = (8, 16, 32, 64, 128)  # DeepSeek-V3's 128 and Kimi-K2's 64 heads over TP 1 to 8
MLA_GEMM = "fp8_block"  # the module tables time the projections too; the FP8 checkpoints' block-scaled GEMMs


def extract(root: Path, out: Path) -> None:
    for folder, gpu in GPUS.items():
        base = root / folder
        for framework, version, prefix in (("vllm", VERSION, ""), ("sglang", SGLANG_VERSION, "sglang_")):
            _extract_moe(base / "moe" / framework / version / "moe_perf.parquet", out / f"aic_moe_{prefix}{gpu}.csv")
        _extract_mla(base, gpu, out)


def _extract_moe(src: Path, dst: Path) -> None:
    moe = pd.read_parquet(src)
    shape = list(zip(moe.hidden_size, moe.inter_size, moe.num_experts, moe.topk))
    moe = moe[pd.Series([s in MOE_SHAPES for s in shape], index=moe.index) & moe.moe_dtype.isin(MOE_DTYPES)
              & (moe.distribution == DISTRIBUTION) & (moe.moe_tp_size * moe.moe_ep_size <= MAX_GPUS)]
    keys = ["hidden_size", "inter_size", "num_experts", "topk", "moe_dtype", "moe_tp_size", "moe_ep_size",
            "num_tokens"]
    moe = moe.sort_values("latency").groupby(keys, as_index=False).first()
    moe = moe[keys + ["latency"]].rename(columns={"latency": "latency_ms"})
    moe.sort_values(keys).to_csv(dst, index=False, float_format="%.6g")


def _extract_mla(base: Path, gpu: str, out: Path) -> None:
    for phase, fname, ctx in (("decode", "mla_generation_module_perf.parquet", "step"),
                              ("prefill", "mla_context_module_perf.parquet", "isl")):
        mla = pd.read_parquet(base / "mla" / "vllm" / VERSION / fname)
        mla = mla[mla.num_heads.isin(MLA_HEADS) & (mla.gemm_type == MLA_GEMM)]
        keys = ["num_heads", "kv_cache_dtype", "batch_size", ctx]
        mla = mla.sort_values("latency").groupby(keys, as_index=False).first()
        mla = mla[keys + ["latency", "kernel_source"]].rename(
            columns={"latency": "latency_ms", ctx: "context_tokens" if phase == "decode" else "prompt_tokens"})
        mla.to_csv(out / f"aic_mla_{phase}_{gpu}.csv", index=False, float_format="%.6g")


if __name__ == "__main__":
    extract(Path(sys.argv[1]), Path(__file__).resolve().parent.parent / "batching" / "data")
