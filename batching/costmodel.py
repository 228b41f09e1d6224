"""Step-time model of one forward pass on a tensor-parallel group (DESIGN §3).

``cost_model(deployment)`` turns hardware + model + precision into a float64 coefficient
array and an all-reduce table; ``step_time_nb`` (jitted, called by the engine) and
``step_time`` / ``step_breakdown`` (Python, for charts and tests) price a step's
composition. Each constant below names its source.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np
from numba import njit

from .specs import Deployment

# --- calibrated constants ------------------------------------------------------------
# Linear layers, fitted to Vidur's measured per-layer times of Llama-2-70B on H100 SXM
# (../shared/calibration/h100_llama2_70b_linear_ops.csv; tools/fit_linear_ops.py):
# compute efficiency = achieved/peak BF16 FLOP/s of QKV+O+gate/up+down at 2048-4096
# tokens; memory efficiency = achieved/peak HBM bandwidth reading the weights at 1-64
# tokens. Both per tensor-parallel degree (smaller shards run less efficiently).
LINEAR_COMPUTE_EFF = {1: 0.707, 2: 0.717, 4: 0.742, 8: 0.734}
LINEAR_MEMORY_EFF = {1: 0.86, 2: 0.85, 4: 0.78, 8: 0.70}
# Element-wise ops per layer (2 RMSNorms, RoPE, SiLU-and-mul, residual add) from the same
# table: a fixed launch-bound time plus a per-token slope, seconds.
ELEMENTWISE_FIXED_S = {1: 32e-6, 2: 25e-6, 4: 20e-6, 8: 17e-6}
ELEMENTWISE_PER_TOKEN_S = {1: 1.86e-7, 2: 1.29e-7, 4: 0.99e-7, 8: 0.857e-7}
# Prompt attention: FlashAttention-3 (Shah et al., 2024, Fig. 5) reaches 500-650 TFLOP/s
# BF16 forward on H100 for head dim 128 at 1k-4k tokens, i.e. ~0.5-0.65 of dense peak;
# 0.5 keeps the shorter chunks of chunked prefill honest.
ATTN_PREFILL_EFF = 0.5
# Decode attention reads the paged KV cache; FlashInfer (Ye et al., 2025) and vLLM's
# paged-attention kernels reach ~70 % of HBM bandwidth on long contexts.
ATTN_DECODE_MEMORY_EFF = 0.7
# Per-step fixed time outside the kernels: scheduling, input preparation, sampling and
# detokenisation hand-off. vLLM's v0.6.0 performance write-up measured these CPU
# overheads at a few milliseconds per step before async scheduling hid part of them.
STEP_FIXED_S = 2.0e-3
# All-reduce: measured latencies on H100 SXM (NVIDIA aiconfigurator, batching/data/
# h100_allreduce.csv), interpolated in log(bytes). Other GPUs scale by NVLink bandwidth.
ALLREDUCE_IMPLS = {
    "vllm_graph": "vllm_0.19.0_vllm_graph",  # vLLM custom all-reduce under CUDA graphs
    "vllm_eager": "vllm_0.19.0_vllm_eager",
    "nccl": "nccl_2.29.2",
    "trtllm": "trtllm_1.3.0rc20",
}
DEFAULT_ALLREDUCE = "vllm_graph"
H100_NVLINK_BPS = 450e9
ACTIVATION_BYTES = 2  # all-reduce payloads are BF16 activations

# --- coefficient layout (indices into the float64 array the engine receives) ---------
C_FIXED = 0
C_LAYERS = 1
C_LIN_FLOPS_TOK = 2  # linear FLOPs per token per layer per GPU
C_LIN_BYTES = 3  # weight bytes per layer per GPU
C_LIN_FLOPS_RATE = 4  # achieved FLOP/s of linear layers
C_LIN_BW = 5  # achieved weight-read bytes/s
C_ELEM_FIXED = 6
C_ELEM_TOK = 7
C_ATTN_FLOPS_COEF = 8  # prompt attention FLOPs per unit of sum(chunk*(ctx+chunk/2)) per layer per GPU
C_ATTN_RATE = 9
C_KV_BYTES_TOK_LAYER = 10  # KV bytes per token per layer per GPU
C_KV_BW = 11
C_LM_FLOPS_SEQ = 12
C_LM_BYTES = 13
C_AR_SCALE = 14  # 0 when tp == 1
C_AR_BYTES_TOK = 15
C_SWAP_BW = 16
C_KV_BYTES_TOK = 17  # KV bytes per token, all layers, per GPU
C_PEAK_FLOPS = 18
C_PEAK_BW = 19
NUM_COEFS = 20


@dataclass(frozen=True, eq=False)
class CostModel:
    coef: np.ndarray
    ar_log_bytes: np.ndarray
    ar_s: np.ndarray
    allreduce: str


def allreduce_table(impl: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Median measured latency (s) per message size for ``tp`` GPUs, as log-bytes/seconds."""
    if impl not in ALLREDUCE_IMPLS:
        raise ValueError(f"allreduce={impl!r} is unknown; allowed: {', '.join(ALLREDUCE_IMPLS)}")
    if tp == 1:
        return np.array([0.0, 1.0]), np.array([0.0, 0.0])
    import pandas as pd

    with resources.files("batching.data").joinpath("h100_allreduce.csv").open("r") as f:
        table = pd.read_csv(f)
    sel = table[(table.implementation == ALLREDUCE_IMPLS[impl]) & (table.num_gpus == tp)]
    med = sel.groupby("message_bytes").latency_us.median().sort_index()
    return np.log(med.index.to_numpy(np.float64)), med.to_numpy(np.float64) * 1e-6


def cost_model(dep: Deployment, allreduce: str = DEFAULT_ALLREDUCE) -> CostModel:
    m, gpu, tp = dep.model, dep.node.gpu, dep.node.tp
    peak = gpu.peak_flops(dep.precision)
    c = np.zeros(NUM_COEFS)
    c[C_FIXED] = STEP_FIXED_S
    c[C_LAYERS] = m.num_layers
    c[C_LIN_FLOPS_TOK] = 2.0 * m.linear_params_per_layer / tp
    c[C_LIN_BYTES] = m.linear_params_per_layer * dep.bytes_per_weight / tp
    c[C_LIN_FLOPS_RATE] = peak * LINEAR_COMPUTE_EFF[tp]
    c[C_LIN_BW] = gpu.hbm_bw_Bps * LINEAR_MEMORY_EFF[tp]
    c[C_ELEM_FIXED] = ELEMENTWISE_FIXED_S[tp]
    c[C_ELEM_TOK] = ELEMENTWISE_PER_TOKEN_S[tp]
    # QK^T and PV: 2 matmuls x 2 FLOPs x head_dim per (query, key) pair per head
    c[C_ATTN_FLOPS_COEF] = 4.0 * m.num_heads * m.head_dim / tp
    c[C_ATTN_RATE] = gpu.peak_bf16_flops * ATTN_PREFILL_EFF
    c[C_KV_BYTES_TOK_LAYER] = dep.kv_bytes_per_token_per_gpu / m.num_layers
    c[C_KV_BW] = gpu.hbm_bw_Bps * ATTN_DECODE_MEMORY_EFF
    c[C_LM_FLOPS_SEQ] = 2.0 * m.vocab_size * m.hidden_size / tp
    c[C_LM_BYTES] = m.vocab_size * m.hidden_size * dep.bytes_per_weight / tp
    c[C_AR_SCALE] = 0.0 if tp == 1 else H100_NVLINK_BPS / gpu.nvlink_Bps
    c[C_AR_BYTES_TOK] = m.hidden_size * ACTIVATION_BYTES
    c[C_SWAP_BW] = gpu.pcie_Bps
    c[C_KV_BYTES_TOK] = dep.kv_bytes_per_token_per_gpu
    c[C_PEAK_FLOPS] = peak
    c[C_PEAK_BW] = gpu.hbm_bw_Bps
    x, y = allreduce_table(allreduce, tp)
    return CostModel(c, x, y, allreduce)


@njit(cache=True, nogil=True)
def allreduce_s_nb(coef, ar_x, ar_y, n_tokens):
    if coef[C_AR_SCALE] == 0.0 or n_tokens <= 0:
        return 0.0
    x = np.log(n_tokens * coef[C_AR_BYTES_TOK])
    last = ar_x.shape[0] - 1
    if x >= ar_x[last]:  # past the table: bandwidth-bound, time grows with the payload
        return coef[C_AR_SCALE] * ar_y[last] * np.exp(x - ar_x[last])
    if x <= ar_x[0]:
        return coef[C_AR_SCALE] * ar_y[0]
    lo, hi = 0, last  # binary search: ar_x[lo] <= x < ar_x[hi]
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if ar_x[mid] <= x:
            lo = mid
        else:
            hi = mid
    w = (x - ar_x[lo]) / (ar_x[hi] - ar_x[lo])
    return coef[C_AR_SCALE] * (ar_y[lo] + w * (ar_y[hi] - ar_y[lo]))


@njit(cache=True, nogil=True)
def step_parts_nb(coef, ar_x, ar_y, n_tokens, attn_work, decode_ctx, n_lm, swap_tokens, out):
    """Fill ``out`` with [linear, elementwise, prompt attention, decode attention,
    all-reduce, lm head, swap, fixed] seconds for one step."""
    layers = coef[C_LAYERS]
    if n_tokens > 0:
        lin = max(n_tokens * coef[C_LIN_FLOPS_TOK] / coef[C_LIN_FLOPS_RATE], coef[C_LIN_BYTES] / coef[C_LIN_BW])
        out[0] = layers * lin
        out[1] = layers * (coef[C_ELEM_FIXED] + n_tokens * coef[C_ELEM_TOK])
        out[4] = 2.0 * layers * allreduce_s_nb(coef, ar_x, ar_y, n_tokens)
    else:
        out[0] = 0.0
        out[1] = 0.0
        out[4] = 0.0
    out[2] = layers * attn_work * coef[C_ATTN_FLOPS_COEF] / coef[C_ATTN_RATE]
    out[3] = layers * decode_ctx * coef[C_KV_BYTES_TOK_LAYER] / coef[C_KV_BW]
    if n_lm > 0:
        out[5] = max(n_lm * coef[C_LM_FLOPS_SEQ] / coef[C_LIN_FLOPS_RATE], coef[C_LM_BYTES] / coef[C_LIN_BW])
    else:
        out[5] = 0.0
    out[6] = swap_tokens * coef[C_KV_BYTES_TOK] / coef[C_SWAP_BW]
    out[7] = coef[C_FIXED] if (n_tokens > 0 or swap_tokens > 0) else 0.0


@njit(cache=True, nogil=True)
def token_time_nb(coef, ar_x, ar_y, n_tokens, swap_tokens):
    """The part of a step's time that depends only on its token count: linear layers,
    element-wise ops, all-reduces and the fixed overhead."""
    if n_tokens > 0:
        layers = coef[C_LAYERS]
        lin = max(n_tokens * coef[C_LIN_FLOPS_TOK] / coef[C_LIN_FLOPS_RATE], coef[C_LIN_BYTES] / coef[C_LIN_BW])
        t = layers * (lin + coef[C_ELEM_FIXED] + n_tokens * coef[C_ELEM_TOK])
        t += 2.0 * layers * allreduce_s_nb(coef, ar_x, ar_y, n_tokens)
        return t + coef[C_FIXED]
    return coef[C_FIXED] if swap_tokens > 0 else 0.0


@njit(cache=True, nogil=True)
def rest_time_nb(coef, base, attn_work, decode_ctx, n_lm, swap_tokens):
    """``base`` (token_time_nb) plus attention, LM head and swap time."""
    t = base
    t += coef[C_LAYERS] * attn_work * coef[C_ATTN_FLOPS_COEF] / coef[C_ATTN_RATE]
    t += coef[C_LAYERS] * decode_ctx * coef[C_KV_BYTES_TOK_LAYER] / coef[C_KV_BW]
    if n_lm > 0:
        t += max(n_lm * coef[C_LM_FLOPS_SEQ] / coef[C_LIN_FLOPS_RATE], coef[C_LM_BYTES] / coef[C_LIN_BW])
    t += swap_tokens * coef[C_KV_BYTES_TOK] / coef[C_SWAP_BW]
    return t


@njit(cache=True, nogil=True)
def step_time_nb(coef, ar_x, ar_y, n_tokens, attn_work, decode_ctx, n_lm, swap_tokens):
    """Seconds for one forward pass over ``n_tokens`` tokens (padding included).

    attn_work = sum over prompt chunks of chunk * (context_before + chunk / 2);
    decode_ctx = sum of the context lengths read by decoding sequences;
    n_lm = sequences whose logits are computed; swap_tokens = KV tokens copied over PCIe.
    """
    base = token_time_nb(coef, ar_x, ar_y, n_tokens, swap_tokens)
    return rest_time_nb(coef, base, attn_work, decode_ctx, n_lm, swap_tokens)


@njit(cache=True, nogil=True)
def token_time_table_nb(coef, ar_x, ar_y, size):
    """token_time_nb for 0..size-1 tokens (no swap), so a hot loop looks it up instead."""
    tab = np.empty(size)
    for n in range(size):
        tab[n] = token_time_nb(coef, ar_x, ar_y, float(n), 0.0)
    return tab


PART_NAMES = ("linear", "elementwise", "prompt attention", "decode attention", "all-reduce",
              "lm head", "swap", "fixed overhead")


def step_breakdown(cm: CostModel, n_tokens: int, attn_work: float = 0.0, decode_ctx: float = 0.0,
                   n_lm: int = 0, swap_tokens: float = 0.0) -> dict[str, float]:
    """Seconds per component of one step (the parts sum to ``step_time``)."""
    out = np.zeros(len(PART_NAMES))
    step_parts_nb(cm.coef, cm.ar_log_bytes, cm.ar_s, float(n_tokens), float(attn_work), float(decode_ctx),
                  float(n_lm), float(swap_tokens), out)
    return dict(zip(PART_NAMES, out.tolist()))


def step_time(cm: CostModel, n_tokens: int, attn_work: float = 0.0, decode_ctx: float = 0.0,
              n_lm: int = 0, swap_tokens: float = 0.0) -> float:
    return float(step_time_nb(cm.coef, cm.ar_log_bytes, cm.ar_s, float(n_tokens), float(attn_work),
                              float(decode_ctx), float(n_lm), float(swap_tokens)))


def prompt_attn_work(chunk: float, context_before: float) -> float:
    """Query-key pairs of one causal prompt chunk: chunk * (context_before + chunk / 2)."""
    return chunk * (context_before + chunk / 2.0)


def useful_flops_bytes(coef: np.ndarray, tokens, attn_work, decode_ctx, n_lm):
    """Useful FLOPs and bytes per GPU of steps (arrays), for MFU, MBU and gpu_util."""
    layers = coef[C_LAYERS]
    has = np.asarray(tokens) > 0
    flops = layers * (np.asarray(tokens) * coef[C_LIN_FLOPS_TOK] + np.asarray(attn_work) * coef[C_ATTN_FLOPS_COEF])
    flops = flops + np.asarray(n_lm) * coef[C_LM_FLOPS_SEQ]
    nbytes = np.where(has, layers * coef[C_LIN_BYTES] + coef[C_LM_BYTES], 0.0)
    nbytes = nbytes + layers * np.asarray(decode_ctx) * coef[C_KV_BYTES_TOK_LAYER]
    return flops, nbytes
