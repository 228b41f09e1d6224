"""Measured MoE and MLA kernel times (batching/data/aic_*.csv) and what they price.

The tables are NVIDIA aiconfigurator 0.12.0's per-op measurements of vLLM 0.24.0's kernels (Apache-2.0;
tools/extract_moe_tables.py keeps the rows the preset models need; docs/CALIBRATION.md, "MLA and large MoE
models"):

- ``aic_moe_<gpu>.csv`` (vLLM 0.24.0) and ``aic_moe_sglang_<gpu>.csv`` (SGLang 0.5.14): one MoE layer's routed experts (token permutation, the grouped gate/up and down GEMMs,
  the activation and the weighted un-permutation) for n tokens, by expert shape, weight type and expert
  tensor-/expert-parallel degree, routing drawn from aiconfigurator's DeepSeek distribution (power law, 1.01);
- ``aic_mla_decode_<gpu>.csv`` / ``aic_mla_prefill_<gpu>.csv``: vLLM's MLA attention module per layer for a batch
  of sequences at a context (decode: absorbed form, one query token each) or of prompts (prefill).

What the cost model takes from them: the routed experts' seconds per layer at each measured token count
(interpolated log-log in between), the decode module's seconds per cached token read (the slope over context,
fitted), and the prefill module's seconds per causal query-key pair (the quadratic term, fitted). The rest of a
layer (attention projections, shared experts, dense layers' MLPs, router) stays on the fitted roofline.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np

# preset GPU name -> the suffix of its tables
TABLE_GPUS = {"H100 SXM 80GB": "h100", "H200 SXM 141GB": "h200", "B200 180GB": "b200"}
# the simulator's precision -> the MoE table's weight type: DeepSeek-V3's and Kimi-K2's FP8 checkpoints (and Qwen's
# Qwen3-30B-A3B-FP8) are block-scaled (128x128 blocks, quantization_config weight_block_size), as vLLM's fp8
# block MoE kernels run them
MOE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8_block", "nvfp4": "nvfp4"}
# whose kernels price the routed experts: the engine that ran them (aiconfigurator measured vLLM 0.24.0's and
# SGLang 0.5.14's fused MoE); vLLM's by default, the simulator's default engine
KERNEL_FRAMEWORKS = {"vllm": "aic_moe_{gpu}.csv", "sglang": "aic_moe_sglang_{gpu}.csv"}
DEFAULT_KERNELS = "vllm"
# The decode slope is fitted where the context read dominates: a batch reading at least this many cached tokens
DECODE_FIT_MIN_TOKENS = 1 << 16
# The prefill pair term is fitted on prompts of at least this many tokens (where QK^T and PV dominate the module)
PREFILL_FIT_MIN_PROMPT = 1024


@lru_cache(maxsize=16)
def _table(name: str):
    import pandas as pd

    with resources.files("batching.data").joinpath(name).open("r") as f:
        return pd.read_csv(f)


def table_gpu(gpu) -> str | None:
    """The measured tables' GPU for a GPU (presets only: a custom GPU has none)."""
    from batching.sim.hardware.specs import GPUS

    for g in GPUS.values():
        if g == gpu:
            return TABLE_GPUS.get(g.name)
    return None


def moe_table(gpu: str, model, precision: str, moe_tp: int, moe_ep: int = 1,
              kernels: str = DEFAULT_KERNELS) -> tuple[np.ndarray, np.ndarray] | None:
    """(token counts, seconds) of one layer's routed experts with ``kernels``' fused MoE, or None where nothing was
    measured."""
    if kernels not in KERNEL_FRAMEWORKS:
        raise ValueError(f"kernels={kernels!r} is unknown; allowed: {', '.join(KERNEL_FRAMEWORKS)}")
    dtype = MOE_DTYPES.get(precision)
    if dtype is None or not model.is_moe:
        return None
    t = _table(KERNEL_FRAMEWORKS[kernels].format(gpu=gpu))
    sel = t[(t.hidden_size == model.hidden_size) & (t.inter_size == model.ffn_size)
            & (t.num_experts == model.num_experts) & (t.topk == model.experts_per_token) & (t.moe_dtype == dtype)
            & (t.moe_tp_size == moe_tp) & (t.moe_ep_size == moe_ep)].sort_values("num_tokens")
    if len(sel) < 2:
        return None
    return sel.num_tokens.to_numpy(np.float64), sel.latency_ms.to_numpy(np.float64) * 1e-3


def _mla_rows(gpu: str, phase: str, heads: int, kv_dtype: str):
    t = _table(f"aic_mla_{phase}_{gpu}.csv")
    return t[(t.num_heads == heads) & (t.kv_cache_dtype == ("fp8" if kv_dtype == "fp8" else "bfloat16"))]


@lru_cache(maxsize=64)
def mla_decode_fit(gpu: str, heads: int, kv_dtype: str, min_tokens: int = DECODE_FIT_MIN_TOKENS):
    """(a, b, s) of latency = a + b * batch + s * batch * context, seconds, least squares over vLLM's MLA decode
    module rows with ``heads`` heads whose batch reads at least ``min_tokens`` cached tokens (relative errors
    weighted alike); None where not measured."""
    r = _mla_rows(gpu, "decode", heads, kv_dtype)
    r = r[r.batch_size * r.context_tokens >= min_tokens]
    if len(r) < 4:
        return None
    y = r.latency_ms.to_numpy(np.float64) * 1e-3
    a = np.column_stack([np.ones(len(r)), r.batch_size.to_numpy(np.float64),
                         (r.batch_size * r.context_tokens).to_numpy(np.float64)])
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(r)), rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def mla_decode_s_per_token(gpu: str, heads: int, kv_dtype: str) -> float | None:
    """Seconds per cached token read per layer by vLLM's MLA decode module with ``heads`` heads on a GPU: the slope
    over context of ``mla_decode_fit`` (batches reading at least DECODE_FIT_MIN_TOKENS tokens). None where not
    measured."""
    fit = mla_decode_fit(gpu, heads, kv_dtype)
    return fit[2] if fit is not None and fit[2] > 0 else None


@lru_cache(maxsize=64)
def mla_prefill_s_per_pair(gpu: str, heads: int, kv_dtype: str) -> float | None:
    """Seconds per causal query-key pair per layer of vLLM's MLA prefill module with ``heads`` heads on a GPU: the
    least-squares pair term of latency = a + b * tokens + s * batch * prompt^2 / 2 over prompts of at least
    PREFILL_FIT_MIN_PROMPT tokens (relative errors weighted alike). None where not measured."""
    r = _mla_rows(gpu, "prefill", heads, kv_dtype)
    r = r[r.prompt_tokens >= PREFILL_FIT_MIN_PROMPT]
    if len(r) < 4:
        return None
    y = r.latency_ms.to_numpy(np.float64) * 1e-3
    b, s = r.batch_size.to_numpy(np.float64), r.prompt_tokens.to_numpy(np.float64)
    a = np.column_stack([np.ones(len(r)), b * s, b * s * s / 2.0])
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(r)), rcond=None)
    return float(coef[2]) if coef[2] > 0 else None


def measured_terms(dep, kernels: str = DEFAULT_KERNELS) -> dict:
    """What the measured tables give this deployment: ``moe`` (token counts, seconds per layer of routed experts,
    averaged over the layers) or None, ``decode_s_per_token`` and ``prefill_s_per_pair`` (MLA, per layer) or None,
    and ``missing``: why each term the model needs has no measurement (empty when every one has)."""
    if kernels not in KERNEL_FRAMEWORKS:
        raise ValueError(f"kernels={kernels!r} is unknown; allowed: {', '.join(KERNEL_FRAMEWORKS)}")
    m, node = dep.model, dep.node
    out = {"moe": None, "decode_s_per_token": None, "prefill_s_per_pair": None, "missing": []}
    if not (m.is_moe or m.is_mla):
        return out
    gpu = table_gpu(node.gpu)
    if gpu is None:
        out["missing"].append(f"no measured MoE/MLA kernel tables for {node.gpu.name} (measured: "
                              f"{', '.join(TABLE_GPUS)})")
        return out
    if m.is_moe:
        # experts split by tensor parallelism (ep 1), or whole experts over the group (ep = tp); the table's token
        # count is the group's tokens either way (with DP attention, every rank's tokens gathered)
        moe_tp, moe_ep = (1, dep.ep) if dep.ep > 1 else (node.tp, 1)
        tab = moe_table(gpu, m, dep.precision, moe_tp, moe_ep, kernels)
        if tab is None:
            out["missing"].append(f"no measured grouped-expert table for {m.name}'s experts ({m.num_experts} x "
                                  f"{m.hidden_size}x{m.ffn_size}, top-{m.experts_per_token}) in "
                                  f"{MOE_DTYPES.get(dep.precision, dep.precision)} at expert TP {moe_tp} / EP "
                                  f"{moe_ep} on {node.gpu.name} ({kernels}'s kernels)")
        else:
            x, y = tab
            out["moe"] = (x, y * m.moe_layer_fraction)
    if m.is_mla:
        # TP attention: every GPU runs its share of the heads over every sequence; DP attention: every head over its
        # share of the sequences, so per GPU and token of the group 1/tp of the all-heads module's time
        ranks = dep.attention_ranks
        heads = m.num_heads // node.tp * ranks
        kv = "fp8" if dep.kv_bytes_per_element == 1.0 else "auto"
        dec, pre = mla_decode_s_per_token(gpu, heads, kv), mla_prefill_s_per_pair(gpu, heads, kv)
        out["decode_s_per_token"] = None if dec is None else dec / ranks
        out["prefill_s_per_pair"] = None if pre is None else pre / ranks
        if dec is None or pre is None:
            out["missing"].append(f"no measured MLA attention table for {heads} heads per GPU on {node.gpu.name}")
    return out


def calibration_status_dep(dep) -> tuple[bool, str]:
    """(calibrated, reason): False where a term this deployment needs has no measurement behind it."""
    reasons = []
    if dep.node.cross_node:
        reasons.append(f"TP {dep.node.tp} spans two nodes: its all-reduce is composed from the measured 8-GPU NCCL "
                       f"table and NCCL's tuning model of the network hop, not measured, and its linear and "
                       f"element-wise terms extrapolate the TP 8 fit")
    if dep.precision == "nvfp4" and not (dep.model.is_moe and measured_terms(dep)["moe"] is not None):
        reasons.append("NVFP4 linear layers have no measured GEMM table here (peak FP4 roofline only)")
    if dep.model.is_moe or dep.model.is_mla:
        reasons += measured_terms(dep)["missing"]
    if not reasons:
        return True, ""
    return False, "; ".join(reasons)


def calibration_status(scenario) -> tuple[bool, str]:
    """(calibrated, reason) of a scenario, for the summary's ``calibrated`` / ``calibration_note`` and the UI."""
    ok, why = calibration_status_dep(scenario.deployment)
    dis = getattr(scenario, "disagg", None)
    if dis is not None:  # each role's instances at their own TP (an MLA table per heads per GPU, say)
        for role in ("prefill", "decode"):
            ok2, why2 = calibration_status_dep(dis.deployment(scenario.deployment, role))
            if not ok2:
                ok = False
                why = "; ".join(dict.fromkeys(w for part in (why, why2) for w in part.split("; ") if w))
    return ok, why
