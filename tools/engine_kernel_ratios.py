"""Kernel-efficiency factors of the engine profiles (batching/sim/hardware/engines.py) from NVIDIA aiconfigurator's
measured per-op tables on H100 SXM (Apache-2.0; pip install aiconfigurator==0.12.0, package aiconfigurator_core,
systems/data/h100_sxm/<op>/<engine>/<version>/*.parquet): the median over shared shapes of vLLM's kernel time over
the engine's, BF16, for the GEMM shapes of Llama-3.1-8B/70B at TP 1/2/4/8 (QKV, O, gate+up, down), prompt attention
(head dim 128, GQA 8 KV heads) and decode attention. > 1: the engine's kernels are faster than vLLM's.

Run with the aiconfigurator venv: /work/venv-aic/bin/python tools/engine_kernel_ratios.py [DATA_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
# (hidden, q heads, kv heads, ffn) of Llama-3.1-8B and -70B; linear shapes per TP rank
SHAPES = ((4096, 32, 8, 14336), (8192, 64, 8, 28672))
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def gemm_nk() -> set[tuple[int, int]]:
    out = set()
    for hidden, heads, kv, ffn in SHAPES:
        for tp in (1, 2, 4, 8):
            out |= {((heads + 2 * kv) * 128 // tp, hidden), (hidden, heads * 128 // tp), (2 * ffn // tp, hidden),
                    (hidden, ffn // tp)}
    return out


def load(root: Path, op: str, engine: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(root / op / engine / VERSIONS[engine] / name)


def ratios(root: Path, engine: str) -> dict[str, float]:
    res = {}
    nk = gemm_nk()
    g = {e: load(root, "gemm", e, "gemm_perf.parquet") for e in ("vllm", engine)}
    keys = ["m", "n", "k"]
    for dtype, key in (("bfloat16", "gemm"), ("fp8", "gemm_fp8")):
        sel = {e: d[(d.gemm_dtype == dtype) & d.m.isin(TOKENS)
                    & pd.Series(list(zip(d.n, d.k)), index=d.index).isin(nk)].groupby(keys).latency.median()
               for e, d in g.items()}
        j = pd.concat(sel, axis=1, keys=["vllm", engine]).dropna()
        res[key] = float((j["vllm"] / j[engine]).median())
        res[f"{key}_points"] = len(j)
    for op, name, cols in (("context", "context_attention_perf.parquet", ["batch_size", "isl", "num_heads"]),
                           ("generation", "generation_attention_perf.parquet",
                            ["batch_size", "isl", "num_heads", "step"])):
        a = {e: load(root, "attention", e, name) for e in ("vllm", engine)}
        sel = {e: d[(d.head_dim == 128) & (d.num_key_value_heads == 8) & (d.kv_cache_dtype == "bfloat16")
                    & (d.attn_dtype == "bfloat16") & (d.window_size == 0)].groupby(cols).latency.median()
               for e, d in a.items()}
        j = pd.concat(sel, axis=1, keys=["vllm", engine]).dropna()
        if op == "generation":  # decode at contexts that read real KV (>= 1k tokens), as the bandwidth term prices
            j = j[j.index.get_level_values("isl") + j.index.get_level_values("step") >= 1024]
        res[op] = float((j["vllm"] / j[engine]).median()) if len(j) else float("nan")
        res[f"{op}_points"] = len(j)
    return res


def main() -> int:
    default = Path(sys.prefix) / "lib/python3.11/site-packages/aiconfigurator_core/systems/data/h100_sxm"
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    for engine in ("sglang", "trtllm"):
        print(engine, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ratios(root, engine).items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
