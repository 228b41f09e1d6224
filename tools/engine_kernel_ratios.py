"""Kernel-efficiency factors of the engine profiles (batching/sim/hardware/engines.py) from NVIDIA aiconfigurator's
measured per-op tables on H100 SXM (Apache-2.0; pip install aiconfigurator==0.12.0, package aiconfigurator_core,
systems/data/h100_sxm/<op>/<engine>/<version>/*.parquet), every figure time-weighted (total work / total time over
the shapes, so the shapes that take the time count most):

- GEMM: vLLM 0.24.0's summed kernel time over the engine's at the Llama-3.1-8B/70B shapes of TP 1-8 (QKV, O,
  gate+up, down) and 1-8,192 tokens, BF16 and FP8 (> 1: faster than vLLM's);
- prompt attention: achieved fraction of the H100's BF16 peak (989.4 TFLOP/s), causal FLOPs 4 * heads * 128 *
  isl^2 / 2 per sequence, head dim 128 with 8 KV heads, prompts of 1,024-32,768 tokens, BF16;
- decode attention: achieved fraction of HBM bandwidth (3.35 TB/s) reading the BF16 KV of every context of
  1,024 tokens and more (the median too: the calibrated cost model's 0.7 is a typical, not a weighted, figure).

Run with the aiconfigurator venv: /work/venv-aic/bin/python tools/engine_kernel_ratios.py [DATA_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
SHAPES = ((4096, 32, 8, 14336), (8192, 64, 8, 28672))  # (hidden, q heads, kv heads, ffn): Llama-3.1-8B, -70B
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PEAK_BF16, HBM = 989.4e12, 3.35e12  # H100 SXM


def gemm_nk() -> set[tuple[int, int]]:
    out = set()
    for hidden, heads, kv, ffn in SHAPES:
        for tp in (1, 2, 4, 8):
            out |= {((heads + 2 * kv) * 128 // tp, hidden), (hidden, heads * 128 // tp), (2 * ffn // tp, hidden),
                    (hidden, ffn // tp)}
    return out


def load(root: Path, op: str, engine: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(root / op / engine / VERSIONS[engine] / name)


def gemm_ratio(root: Path, engine: str, dtype: str) -> tuple[float, int]:
    nk = gemm_nk()
    sel = {}
    for e in ("vllm", engine):
        d = load(root, "gemm", e, "gemm_perf.parquet")
        keep = (d.gemm_dtype == dtype) & d.m.isin(TOKENS) & pd.Series(list(zip(d.n, d.k)), index=d.index).isin(nk)
        sel[e] = d[keep].groupby(["m", "n", "k"]).latency.median()
    j = pd.concat(sel, axis=1, keys=["vllm", engine]).dropna()
    return float(j["vllm"].sum() / j[engine].sum()), len(j)


def attention(root: Path, engine: str) -> dict:
    d = load(root, "attention", engine, "context_attention_perf.parquet")
    d = d[(d.head_dim == 128) & (d.num_key_value_heads == 8) & (d.window_size == 0) & (d.attn_dtype == "bfloat16")
          & (d.kv_cache_dtype == "bfloat16") & (d.isl >= 1024) & (d.isl <= 32768)]
    flops = 4 * d.num_heads * 128 * d.isl.astype(float) ** 2 / 2 * d.batch_size
    g = load(root, "attention", engine, "generation_attention_perf.parquet")
    g = g[(g.head_dim == 128) & (g.num_key_value_heads == 8) & (g.window_size == 0) & (g.attn_dtype == "bfloat16")
          & (g.kv_cache_dtype == "bfloat16") & (g.isl + g.step >= 1024)]
    nbytes = g.batch_size * (g.isl + g.step).astype(float) * 8 * 128 * 2 * 2
    return {"prompt_eff": float(flops.sum() / (d.latency.sum() * 1e-3) / PEAK_BF16), "prompt_points": len(d),
            "decode_eff": float(nbytes.sum() / (g.latency.sum() * 1e-3) / HBM),
            "decode_median_eff": float((nbytes / (g.latency * 1e-3) / HBM).median()), "decode_points": len(g)}


def main() -> int:
    default = Path(sys.prefix) / "lib/python3.11/site-packages/aiconfigurator_core/systems/data/h100_sxm"
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    for engine in VERSIONS:
        row = attention(root, engine)
        if engine != "vllm":
            for dtype, key in (("bfloat16", "gemm_vs_vllm"), ("fp8", "gemm_fp8_vs_vllm")):
                row[key], row[f"{key}_points"] = gemm_ratio(root, engine, dtype)
        print(engine, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
