"""Step-time model of one forward pass on a tensor-parallel group.

Described in docs/ARCHITECTURE.md ("Cost model"); its errors against the measured data are in
docs/CALIBRATION.md.

``cost_model(deployment)`` turns hardware + model + precision into a float64 coefficient
array and an all-reduce table; ``step_time_nb`` (jitted, called by the engine) and
``step_time`` / ``step_breakdown`` (Python, for charts and tests) price a step's
composition. Each constant below names its source; ``batching.sim.hardware.calibration`` fits and checks
them against the measured tables in ``batching/data``.

Per layer and GPU, for a step of n tokens:

    linear(n)      = (Tc(n)^p + Tm(n)^p)^(1/p) * q(n)     Tc = n * FLOPs/token / (peak * e_c)
                                                          Tm = weight bytes read / (bw * e_m)
    elementwise(n) = ((s * n)^p' + f^p')^(1/p') * q'(n)
    all-reduce(n)  = 2 x the measured all-reduce of n * hidden * 2 bytes (interpolated)

with e_c, e_m, p (per tensor-parallel degree) and q (a piecewise-constant factor that carries
cuBLAS tile and wave quantization) fitted to Vidur's H100 measurements of Llama-2-70B; plus
prompt attention (FLOPs at FlashAttention-2's efficiency), decode attention (KV bytes at the
paged kernels' bandwidth), the LM head, swap over PCIe and a fixed per-step overhead.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
from numba import njit

from batching.sim.hardware.engines import (ATTN_DECODE_BASE, ATTN_PREFILL_BASE, GRAPH_MAX_TOKENS, SERIAL_STEP_S,
                                          EngineProfile, engine_profile)
from batching.sim.hardware.specs import BYTES_PER_WEIGHT, GPUS_PER_NODE, TWO_NODE_GPUS, Deployment

# --- calibrated constants ------------------------------------------------------------
# Linear layers and element-wise ops: fitted per tensor-parallel degree to Vidur's measured
# per-layer times of Llama-2-70B on H100 SXM (batching/data/h100_llama2_70b_linear_ops.csv,
# from batching/data/raw; the fit is batching.sim.hardware.calibration.fit_ops, its result ships as
# batching/data/linear_fit.json; python tools/extract_calibration.py regenerates both).
LINEAR_FIT_FILE = "linear_fit.json"
# The measured tile/wave factors q(n) describe the H100's cuBLAS kernels on the calibration
# model's GEMM shapes; they apply on GPUs of that kernel family to models whose attention
# shapes match (hidden 8192, 64 query / 8 KV heads of 128: Llama-2/3.x-70B, Qwen2.5-72B,
# whose FFN is 3 % wider). Other shapes and GPUs use the smooth fit alone (q = 1).
TILE_FACTOR_ARCHS = ("hopper",)
# Prompt attention: vLLM v0.6.0 and SGLang v0.3.0 run FlashAttention-2-class prefill kernels
# on H100 (vllm-flash-attn 2.6; FlashInfer's FA2 template). The FlashAttention-3 paper (Shah
# et al., 2024, arXiv:2407.08608, abstract and Fig. 5) measures FlashAttention-2 at ~35 % of
# the H100's BF16 peak (FlashAttention-3 reaches 0.5-0.75, for newer engines).
ATTN_PREFILL_EFF = ATTN_PREFILL_BASE  # 0.35, engines.py (the profiles' attention factors are relative to it)
# Decode attention reads the paged KV cache once per step; the FlashInfer kernels and vLLM's
# paged attention run near the bandwidth roofline at long contexts and lower at short ones
# (FlashInfer blog 2024-02-02, "Accelerating Self-Attentions for LLM Serving with FlashInfer",
# batch-decode bandwidth-utilisation figures); 0.7 of peak HBM bandwidth.
ATTN_DECODE_MEMORY_EFF = ATTN_DECODE_BASE  # 0.7, engines.py (the profiles' decode factors are relative to it)
# Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) decodes in the absorbed form (DeepSeek-V2 paper,
# arXiv:2405.04434, section 2.1.3; vLLM's and SGLang's MLA backends): W_UK folds into the query and W_UV into
# the output (kv_b_proj's FLOPs per token, counted with the linear layers), so every head attends over the
# cached latent itself: per (query, key) pair and head 2 * (kv_lora_rank + rope) FLOPs for QK^T and
# 2 * kv_lora_rank for PV, reading the latent once for all heads. With many heads per GPU that is no longer
# memory-bound; FlashMLA (deepseek-ai/FlashMLA README: "up to 3000 GB/s in memory-bound configuration and 580
# TFLOPS in computation-bound configuration on H800 SXM5", i.e. 0.9 of its 3.35 TB/s and 0.59 of its 989
# TFLOP/s BF16 peak) gives the compute side; the memory side keeps ATTN_DECODE_MEMORY_EFF (no MLA kernel time
# was measured here). Prompts use the non-absorbed form: K and V decompressed per head, QK^T over
# qk_nope + qk_rope and PV over v_head_dim, at ATTN_PREFILL_EFF.
MLA_DECODE_COMPUTE_EFF = 0.59
# Per-step fixed time outside the kernels: scheduling, input preparation, sampling hand-off
# and the gaps between CUDA-graph launches, 2.0 ms a step. SGLang's v0.4 release post
# (2024-12-04) gained 1.1x throughput by overlapping v0.3's CPU scheduling with the GPU, i.e.
# ~9 % of a ~20 ms 70B decode step (~1.8 ms); vLLM's v0.6.0 release post ("vLLM v0.6.0: 2.7x
# Throughput Improvement and 5x Latency Reduction", 2024-09-05) measured these CPU overheads at
# up to ~60 % of the step before multi-step scheduling, which (--num-scheduler-steps 10, as in
# the reference benchmark) hides most of them (docs/CALIBRATION.md, "Per-step overhead").
STEP_FIXED_S = SERIAL_STEP_S  # engines.py: the vllm profile's per-step time (sglang, trtllm overlap it)
# All-reduce: measured latencies on H100 SXM, interpolated in log(bytes)-log(time).
# implementation -> (table in batching/data, implementation label in that table)
ALLREDUCE_IMPLS = {
    # vLLM's custom all-reduce captured in CUDA graphs (the default of vLLM's decode steps)
    "vllm_graph": ("h100_allreduce.csv", "vllm_0.19.0_vllm_graph"),
    "vllm_eager": ("h100_allreduce.csv", "vllm_0.19.0_vllm_eager"),  # same kernel, launched eagerly
    "nccl": ("h100_allreduce.csv", "nccl_2.29.2"),  # NVIDIA aiconfigurator, NCCL 2.29.2
    "trtllm": ("h100_allreduce.csv", "trtllm_1.3.0rc20"),  # TensorRT-LLM's custom all-reduce
    # Vidur's NCCL table (8xH100 DGX, eager), binned to half-octave medians
    "vidur_nccl": ("h100_allreduce_vidur.csv", ""),
}
ALLREDUCE_SOURCES = {
    "h100_allreduce.csv": "NVIDIA aiconfigurator collector (Apache-2.0), H100 SXM NVLink, batching/data/raw",
    "h100_allreduce_vidur.csv": "Vidur data/profiling/network/h100_dgx/all_reduce.csv (MIT), batching/data/raw",
}
DEFAULT_ALLREDUCE = "vllm_graph"
# Other GPUs: the latency floor (the smallest message's time) stays, the rest scales with
# H100 NVLink4's 450 GB/s per direction over the GPU's NVLink bandwidth.
H100_NVLINK_BPS = 450e9
ACTIVATION_BYTES = 2  # all-reduce payloads are BF16 activations

# --- coefficient layout (indices into the float64 array the engine receives) ---------
C_FIXED = 0
C_LAYERS = 1
C_LIN_FLOPS_TOK = 2  # linear FLOPs per token per layer per GPU (active parameters for MoE)
C_LIN_BYTES = 3  # weight bytes read every step per layer per GPU (dense: all; MoE: attention + router)
C_LIN_FLOPS_RATE = 4  # achieved FLOP/s of linear layers (peak * e_c)
C_LIN_BW = 5  # achieved weight-read bytes/s (bw * e_m)
C_ELEM_FIXED = 6  # element-wise floor per layer, s
C_ELEM_TOK = 7  # element-wise seconds per token per layer
C_ATTN_FLOPS_COEF = 8  # prompt attention FLOPs per unit of sum(chunk*(ctx+chunk/2)) per layer per GPU
C_ATTN_RATE = 9
C_KV_BYTES_TOK_LAYER = 10  # KV bytes per token per layer per GPU
C_KV_BW = 11
C_LM_FLOPS_SEQ = 12
C_LM_BYTES = 13
C_AR_SCALE = 14  # 0 when tp == 1; else H100 NVLink / this GPU's NVLink (on the part above the floor)
C_AR_BYTES_TOK = 15
C_SWAP_BW = 16
C_KV_BYTES_TOK = 17  # KV bytes per token, all layers, per GPU
C_PEAK_FLOPS = 18
C_PEAK_BW = 19
C_LIN_P = 20  # p-norm exponent of the linear roofline (< 1: plain max)
C_ELEM_P = 21  # p-norm exponent of the element-wise floor/slope
C_MOE_EXPERTS = 22  # experts per layer (0 = dense)
C_MOE_TOPK = 23  # experts each token runs
C_MOE_EXPERT_BYTES = 24  # weight bytes of one expert per layer per GPU
C_LINQ_N = 25  # segments of the linear tile factor (0 = none)
C_ELQ_N = 26  # segments of the element-wise factor (0 = none)
# 27-28: engine profile terms (batching/sim/hardware/engines.py; C_FIXED holds the profile's per-step CPU time;
# the profile's GEMM, attention and KV factors are folded into the rates); 29-34 unused;
# 35-40: measured MoE kernel terms, the LM head's BF16 rates, the CUDA-graph step; 41-47 unused
C_ENG_SEQ_S = 27  # seconds per sequence emitting a token (n_lm) per step: sampling, detokenisation, streaming
C_ENG_PREFILL_S = 28  # seconds added to a step that holds prompt tokens (prefill launches)
# measured MoE kernels (batching/sim/hardware/kernel_tables.py): 0 = none, else the points of the routed-expert table
C_MOE_TAB_N = 35
C_MEAS_LIN_FLOPS_TOK = 36  # with a routed-expert table: linear FLOPs per token per layer per GPU outside the experts
C_LM_FLOPS_RATE = 37  # achieved FLOP/s of the LM head: a BF16 GEMM in every precision (the BF16 peak * e_c)
C_LM_BW = 38  # achieved weight-read bytes/s of the LM head (bw * e_m at the BF16 GEMM factor)
C_GRAPH_SAVING_S = 39  # of C_FIXED, what a pure-decode step of at most C_GRAPH_MAX_TOKENS saves (one full CUDA graph)
C_GRAPH_MAX_TOKENS = 40  # the largest step (tokens) replayed as one CUDA graph
Q_MAX = 48  # room for segments of each factor
C_LINQ_BOUNDS = 48
C_LINQ_VALUES = C_LINQ_BOUNDS + Q_MAX
C_ELQ_BOUNDS = C_LINQ_VALUES + Q_MAX
C_ELQ_VALUES = C_ELQ_BOUNDS + Q_MAX
# the routed-expert table: log(tokens) and log(seconds per layer) at each measured token count
MOE_TAB_MAX = 32
C_MOE_TAB_X = C_ELQ_VALUES + Q_MAX
C_MOE_TAB_Y = C_MOE_TAB_X + MOE_TAB_MAX
NUM_COEFS = C_MOE_TAB_Y + MOE_TAB_MAX


@dataclass(frozen=True, eq=False)
class CostModel:
    coef: np.ndarray
    ar_log_bytes: np.ndarray
    ar_s: np.ndarray
    allreduce: str
    engine: EngineProfile | None = None  # the profile priced in (None: the default engine's)


# --- measured inputs ------------------------------------------------------------------
@lru_cache(maxsize=1)
def linear_fit() -> dict:
    """The fitted linear and element-wise terms per TP degree (batching/data/linear_fit.json)."""
    with resources.files("batching.data").joinpath(LINEAR_FIT_FILE).open("r") as f:
        return json.load(f)


@lru_cache(maxsize=16)
def _allreduce_cached(impl: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    source, label = ALLREDUCE_IMPLS[impl]
    with resources.files("batching.data").joinpath(source).open("r") as f:
        table = pd.read_csv(f)
    sel = table[table.num_gpus == tp]
    if label:
        sel = sel[sel.implementation == label]
    med = sel.groupby("message_bytes").latency_us.median().sort_index()
    x, y = np.log(med.index.to_numpy(np.float64)), med.to_numpy(np.float64) * 1e-6
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def allreduce_table(impl: str, tp: int, nvlink_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Median measured latency (s) per message size for ``tp`` GPUs, as log-bytes/seconds; for TP 16 (two nodes)
    the composed table of ``two_node_allreduce`` (not measured, its NVLink part scaled by ``nvlink_scale``),
    whatever ``impl``: the custom all-reduces run within one node only."""
    if impl not in ALLREDUCE_IMPLS:
        raise ValueError(f"allreduce={impl!r} is unknown; allowed: {', '.join(ALLREDUCE_IMPLS)}")
    if tp == 1:
        return np.array([0.0, 1.0]), np.array([0.0, 0.0])
    if tp == TWO_NODE_GPUS:
        x, y = two_node_allreduce(nvlink_scale)
        return x.copy(), y.copy()
    if tp not in (2, 4, 8):
        raise ValueError(f"tp={tp!r} has no all-reduce table; allowed: 1, 2, 4, 8, {TWO_NODE_GPUS}")
    x, y = _allreduce_cached(impl, tp)
    return x.copy(), y.copy()


# --- TP 16: one replica over two 8-GPU nodes ----------------------------------------------------------------------
# vLLM and SGLang switch their custom all-reduce off when a group spans nodes (vLLM's custom_all_reduce.py: "disabled
# because this process group spans across nodes"), so NCCL runs it, and TensorRT-LLM's multi-node groups use NCCL too.
# No measured all-reduce over two InfiniBand-connected 8-GPU nodes ships here (aiconfigurator's NCCL tables stop at 8
# GPUs), so the table is composed the way NCCL's own tuning model composes a two-node all-reduce (NVIDIA/nccl,
# src/graph/tuning.cc: Tree/LL latency = base + 2 x ((GPUs per node - 1) x the NVLink hop + log2(nodes) x the NET hop),
# 25.2 us for 2 x 8 H100, which its log prints for such a cluster in NVIDIA/nccl issue #1453):
#   the measured 8-GPU NCCL table (NVLink: the reduce within each node and the broadcast back)
#   + 2 x NET_HOP_S      the two network hops (up and down the tree): NCCL's NET latency for Tree/LL, 5.0 us each
#   + message / 8 / NIC  each GPU's 1/8 share through its own NIC (one 400 Gb/s ConnectX-7 per GPU on HGX H100, H200
#                        and B200 nodes; NCCL reaches 46-48 GB/s per NDR NIC: its maintainers in nccl-tests issue #290)
# A composition, not a measurement: deployments that use it say calibrated: false (kernel_tables.calibration_status_dep).
NET_HOP_S = 5.0e-6
NET_HOPS = 2
NIC_BPS = 47e9
TWO_NODE_BASE = "nccl"  # the measured 8-GPU table composed with the network


@lru_cache(maxsize=8)
def two_node_allreduce(nvlink_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The composed all-reduce of 16 GPUs over two nodes (the note above), as log-bytes/seconds at the 8-GPU table's
    message sizes. ``nvlink_scale``: H100 NVLink over this GPU's, applied to the NVLink part above its latency floor
    as for every other all-reduce (the engine's C_AR_SCALE is then 1: the network part does not scale with NVLink)."""
    x, y8 = _allreduce_cached(TWO_NODE_BASE, 8)
    y = y8[0] + nvlink_scale * (y8 - y8[0]) + NET_HOPS * NET_HOP_S + np.exp(x) / 8.0 / NIC_BPS
    x = x.copy()
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def fit_key(tp: int) -> str:
    """The fitted TP degree whose element-wise terms a TP degree uses: itself, or for TP 16 (two nodes; no GEMM or
    element-wise measurement at 16 GPUs ships) TP 8's (calibrated: false). Its linear layers take the smooth roofline
    at the smallest shard measured (``linear_params_for``), without tile factors."""
    return str(min(tp, GPUS_PER_NODE))


def _calibration_shape(model) -> bool:
    cal = linear_fit()["calibration_model"]
    return (model.hidden_size == cal["hidden_size"] and model.num_heads == cal["num_heads"]
            and model.num_kv_heads == cal["num_kv_heads"] and model.head_dim == cal["head_dim"]
            and not model.is_moe)


def tile_factors_apply(dep: Deployment) -> bool:
    """Whether the measured tile/wave factors q(n) apply (the calibration's shapes and kernel family, at a measured
    TP degree: TP 16's per-GPU shards are not the shapes any factor was measured on)."""
    return dep.node.gpu.arch in TILE_FACTOR_ARCHS and _calibration_shape(dep.model) and not dep.node.cross_node


def linear_params_for(dep: Deployment) -> dict:
    """p, e_c, e_m for this deployment: the fit of the calibration TP degree whose per-GPU
    layer shard is the same size, interpolated in log(shard size) between degrees (GEMM
    efficiency follows the per-GPU matrix sizes, not the TP degree itself)."""
    fit = linear_fit()["tp"]
    if _calibration_shape(dep.model) and not dep.node.cross_node:
        f = fit[fit_key(dep.node.tp)]["linear"]
        return {"p": f["p"], "eff_compute": f["eff_compute"], "eff_memory": f["eff_memory"]}
    pts = sorted((math.log(v["linear"]["params_per_gpu"]), v["linear"]) for v in fit.values())
    x = math.log(dep.model.active_linear_params_per_layer / dep.node.tp)
    if x <= pts[0][0]:
        f = pts[0][1]
        return {"p": f["p"], "eff_compute": f["eff_compute"], "eff_memory": f["eff_memory"]}
    if x >= pts[-1][0]:
        f = pts[-1][1]
        return {"p": f["p"], "eff_compute": f["eff_compute"], "eff_memory": f["eff_memory"]}
    for (x0, f0), (x1, f1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            w = (x - x0) / (x1 - x0)
            return {k: f0[k] + w * (f1[k] - f0[k]) for k in ("p", "eff_compute", "eff_memory")}
    raise AssertionError("unreachable")


def moe_experts_touched(num_experts: float, top_k: float, n_tokens):
    """Expected distinct experts n tokens route to (uniform routing): E * (1 - (1 - k/E)^n)."""
    n = np.asarray(n_tokens, float)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** n)


def cost_model(dep: Deployment, allreduce: str | None = None, engine: "str | EngineProfile | None" = None,
               kernels: str | None = None) -> CostModel:
    """The coefficients of ``dep`` run by ``engine`` (a name in engines.ENGINES or a profile; default vLLM) with
    ``allreduce`` (default: the engine's). ``kernels``: whose measured fused-MoE kernels price the routed experts
    (kernel_tables.KERNEL_FRAMEWORKS: "vllm", "sglang"; the MLA modules are vLLM's either way); default the
    engine's own where a table of it ships (SGLang), else vLLM's."""
    prof = engine_profile(engine)
    allreduce = prof.allreduce if allreduce is None else allreduce
    if kernels is None:
        kernels = "sglang" if prof.name.split("-")[0] == "sglang" else "vllm"
    m, gpu, tp = dep.model, dep.node.gpu, dep.node.tp
    peak = gpu.peak_flops(dep.precision)
    fit = linear_fit()
    lin = linear_params_for(dep)
    el = fit["tp"][fit_key(tp)]["elementwise"]
    gpu_ref = fit["gpu"]
    bpw = dep.bytes_per_weight
    c = np.zeros(NUM_COEFS)
    c[C_FIXED] = prof.step_s
    # a pure-decode step at a captured size replays one full CUDA graph: less CPU time (engines.GRAPH_STEP_SAVING_S)
    c[C_GRAPH_SAVING_S] = prof.step_s - prof.decode_graph_step_s()
    c[C_GRAPH_MAX_TOKENS] = GRAPH_MAX_TOKENS
    c[C_ENG_SEQ_S] = prof.seq_s
    c[C_ENG_PREFILL_S] = prof.prefill_step_s
    gemm_eff = prof.gemm_factor(dep.precision)
    # the decode factor was measured on paged GQA/MHA kernels; MLA's latent kernels keep the calibrated efficiency
    kv_eff = 1.0 if m.is_mla else prof.kv_eff
    c[C_LAYERS] = m.num_layers
    # FLOPs and bytes per GPU: the replicated layers (MLA's q_a_proj and kv_a_proj_with_mqa, the MoE router) whole on
    # every rank, the router's weights in BF16, the rest split by TP (specs.Deployment.layer_weight_bytes_per_gpu)
    c[C_LIN_FLOPS_TOK] = 2.0 * dep.layer_params_run_per_gpu(m.active_linear_params_per_layer)
    if m.is_moe:
        # weights every step reads (attention, router; DeepSeek's shared experts and leading dense layers'
        # MLPs, averaged over the layers), then the routed experts the step touches: one expert's bytes
        # scaled by the share of layers that have experts (1 unless some are dense)
        c[C_LIN_BYTES] = dep.layer_weight_bytes_per_gpu(m.step_read_params_per_layer)
        c[C_MOE_EXPERTS] = m.num_experts
        c[C_MOE_TOPK] = m.experts_per_token
        c[C_MOE_EXPERT_BYTES] = m.expert_params * m.moe_layer_fraction * bpw / tp
    else:
        c[C_LIN_BYTES] = dep.layer_weight_bytes_per_gpu(m.linear_params_per_layer)
    c[C_LIN_FLOPS_RATE] = peak * lin["eff_compute"] * gemm_eff
    c[C_LIN_BW] = gpu.hbm_bw_Bps * lin["eff_memory"] * gemm_eff
    c[C_LIN_P] = lin["p"]
    # element-wise: memory-bound per token (scales with the hidden size and the GPU's bandwidth);
    # the launch-bound floor stays
    c[C_ELEM_FIXED] = el["fixed_s"]
    c[C_ELEM_TOK] = el["per_token_s"] * (m.hidden_size / fit["calibration_model"]["hidden_size"]) \
        * (gpu_ref["hbm_bw_Bps"] / gpu.hbm_bw_Bps)
    c[C_ELEM_P] = el["p"]
    # QK^T and PV: 2 matmuls x 2 FLOPs x head_dim per (query, key) pair per head; BF16 kernels
    c[C_ATTN_FLOPS_COEF] = prefill_attn_flops_per_pair(m) / tp
    c[C_ATTN_RATE] = gpu.peak_bf16_flops * ATTN_PREFILL_EFF * prof.attn_eff
    c[C_KV_BYTES_TOK_LAYER] = dep.kv_bytes_per_token_per_gpu / m.num_layers
    c[C_KV_BW] = gpu.hbm_bw_Bps * ATTN_DECODE_MEMORY_EFF * kv_eff
    if m.is_mla:
        # decode attention per cached token: the latent's bytes at the paged kernels' bandwidth or the absorbed
        # form's FLOPs at FlashMLA's efficiency, whichever is slower; both grow with the context read, so the
        # slower one is an effective bandwidth the engine's bytes term already uses
        t_bytes = c[C_KV_BYTES_TOK_LAYER] / c[C_KV_BW]
        t_flops = decode_attn_flops_per_token(m) / tp / (gpu.peak_bf16_flops * MLA_DECODE_COMPUTE_EFF)
        if t_flops > t_bytes:
            c[C_KV_BW] = c[C_KV_BYTES_TOK_LAYER] / t_flops
    # LM head: a BF16 GEMM in every precision (FP8 and NVFP4 checkpoints keep it in BF16: specs.non_linear_params),
    # so it runs at the BF16 peak and the engine's BF16 GEMM factor, whatever the linear layers' precision
    c[C_LM_FLOPS_SEQ] = 2.0 * m.vocab_size * m.hidden_size / tp
    c[C_LM_BYTES] = m.vocab_size * m.hidden_size * BYTES_PER_WEIGHT["bf16"] / tp
    c[C_LM_FLOPS_RATE] = gpu.peak_bf16_flops * lin["eff_compute"] * prof.gemm_factor("bf16")
    c[C_LM_BW] = gpu.hbm_bw_Bps * lin["eff_memory"] * prof.gemm_factor("bf16")
    c[C_AR_SCALE] = 0.0 if tp == 1 else H100_NVLINK_BPS / gpu.nvlink_Bps
    c[C_AR_BYTES_TOK] = m.hidden_size * ACTIVATION_BYTES
    c[C_SWAP_BW] = gpu.pcie_Bps
    c[C_KV_BYTES_TOK] = dep.kv_bytes_per_token_per_gpu
    c[C_PEAK_FLOPS] = peak
    c[C_PEAK_BW] = gpu.hbm_bw_Bps
    if tile_factors_apply(dep):
        for key, c_n, c_b, c_v in (("linear", C_LINQ_N, C_LINQ_BOUNDS, C_LINQ_VALUES),
                                   ("elementwise", C_ELQ_N, C_ELQ_BOUNDS, C_ELQ_VALUES)):
            f = fit["tp"][fit_key(tp)][key]
            k = len(f["segment_bounds"])
            if k > Q_MAX:
                raise ValueError(f"{key} fit has {k} segments; at most {Q_MAX} fit the coefficient array")
            c[c_n] = k
            c[c_b:c_b + k] = f["segment_bounds"]
            c[c_v:c_v + k] = f["segment_factors"]
    _apply_measured_kernels(c, dep, kernels)
    x, y = allreduce_table(allreduce, tp, c[C_AR_SCALE])
    if tp == TWO_NODE_GPUS:  # the GPU's NVLink part is scaled in the table, the network part not at all
        c[C_AR_SCALE] = 1.0
    y = _layout_allreduce(y, dep)
    return CostModel(c, x, y, allreduce, prof)


# --- measured MoE / MLA kernels and parallel layouts (issue 23 item 4) -------------------------------------------
# DP attention exchanges each layer's tokens once (an all-gather of the ranks' tokens before the experts and a
# reduce-scatter after: SGLang's DP attention without DeepEP), the bytes of one all-reduce (= reduce-scatter +
# all-gather), where TP attention all-reduces twice (after attention and after the MLP / experts)
DP_ATTENTION_ALLREDUCES_PER_LAYER = 1.0
TP_ALLREDUCES_PER_LAYER = 2.0


def _layout_allreduce(y: np.ndarray, dep: Deployment) -> np.ndarray:
    """The all-reduce table as the engine charges it (twice per layer): halved under DP attention."""
    if dep.dp_attention:
        return y * (DP_ATTENTION_ALLREDUCES_PER_LAYER / TP_ALLREDUCES_PER_LAYER)
    return y


def _apply_measured_kernels(c: np.ndarray, dep: Deployment, kernels: str = "vllm") -> None:
    """Where aiconfigurator's measured kernels cover this deployment (kernel_tables.measured_terms): the routed
    experts priced from ``kernels``' fused-MoE table (vLLM's or SGLang's) instead of the roofline of touched experts, MLA decode attention at
    the decode module's measured seconds per cached token, MLA prefill attention at the prefill module's measured
    seconds per query-key pair. Dense models and uncovered combinations keep the fitted roofline unchanged."""
    from batching.sim.hardware.kernel_tables import measured_terms

    m = dep.model
    t = measured_terms(dep, kernels)
    if t["moe"] is not None:
        x, y = t["moe"]
        if len(x) > MOE_TAB_MAX:
            raise ValueError(f"the MoE table has {len(x)} token counts; at most {MOE_TAB_MAX} fit the coefficients")
        c[C_MOE_TAB_N] = len(x)
        c[C_MOE_TAB_X:C_MOE_TAB_X + len(x)] = np.log(x)
        c[C_MOE_TAB_Y:C_MOE_TAB_Y + len(x)] = np.log(y)
        routed = m.experts_per_token * m.expert_params * m.moe_layer_fraction
        c[C_MEAS_LIN_FLOPS_TOK] = 2.0 * dep.layer_params_run_per_gpu(m.active_linear_params_per_layer - routed)
    if t["decode_s_per_token"] is not None:
        c[C_KV_BW] = c[C_KV_BYTES_TOK_LAYER] / t["decode_s_per_token"]
    if t["prefill_s_per_pair"] is not None:
        c[C_ATTN_RATE] = c[C_ATTN_FLOPS_COEF] / t["prefill_s_per_pair"]


def prefill_attn_flops_per_pair(model) -> float:
    """Prompt attention FLOPs per (query, key) pair per layer, all heads: 2 for QK^T and 2 for PV per head
    dimension. MLA prefills in the non-absorbed form: QK^T over qk_nope + qk_rope, PV over v_head_dim."""
    if model.is_mla:
        return 2.0 * model.num_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    return 4.0 * model.num_heads * model.head_dim


def decode_attn_flops_per_token(model) -> float:
    """Decode attention FLOPs per cached token read per layer, all heads: 4 * head_dim per head for multi-head
    or grouped-query attention; MLA's absorbed form, 2 * (kv_lora_rank + qk_rope) for QK^T and 2 * kv_lora_rank
    for PV per head (DeepSeek-V3: 2,176 per head, 278,528 for its 128 heads)."""
    if model.is_mla:
        return 2.0 * model.num_heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
    return 4.0 * model.num_heads * model.head_dim


# --- jitted pieces ----------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _pnorm_nb(a, b, p):
    """(a^p + b^p)^(1/p) for a, b >= 0; p < 1 means max(a, b)."""
    if p < 1.0:
        return a if a > b else b
    if p == 1.0:
        return a + b
    m = a if a > b else b
    if m <= 0.0:
        return 0.0
    return m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)


@njit(cache=True, nogil=True)
def _segment_factor_nb(coef, c_n, c_bounds, c_values, n_tokens):
    """The factor of the first segment whose upper bound is >= n_tokens (the last one beyond)."""
    k = int(coef[c_n])
    if k <= 0:
        return 1.0
    lo, hi = 0, k - 1
    if n_tokens > coef[c_bounds + hi]:
        return coef[c_values + hi]
    while lo < hi:  # first index with bound >= n_tokens
        mid = (lo + hi) >> 1
        if coef[c_bounds + mid] >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    return coef[c_values + lo]


@njit(cache=True, nogil=True)
def moe_table_s_nb(coef, n_tokens):
    """Seconds per layer of the routed experts for n tokens from the measured table: log-log interpolation between
    measured token counts, the first point's time below it, proportional to the tokens past the last."""
    k = int(coef[C_MOE_TAB_N])
    if n_tokens <= 0.0 or k <= 0:
        return 0.0
    x = np.log(n_tokens)
    if x <= coef[C_MOE_TAB_X]:
        return np.exp(coef[C_MOE_TAB_Y])
    last = k - 1
    if x >= coef[C_MOE_TAB_X + last]:
        return np.exp(coef[C_MOE_TAB_Y + last] + x - coef[C_MOE_TAB_X + last])
    lo, hi = 0, last
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if coef[C_MOE_TAB_X + mid] <= x:
            lo = mid
        else:
            hi = mid
    x0, x1 = coef[C_MOE_TAB_X + lo], coef[C_MOE_TAB_X + hi]
    y0, y1 = coef[C_MOE_TAB_Y + lo], coef[C_MOE_TAB_Y + hi]
    return np.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@njit(cache=True, nogil=True)
def linear_layer_s_nb(coef, n_tokens):
    """Seconds of one layer's linear ops (QKV, O, MLP or touched experts) per GPU for n tokens."""
    if coef[C_MOE_TAB_N] > 0.0:  # measured routed experts + the roofline of the rest (attention, shared, router)
        t = _pnorm_nb(n_tokens * coef[C_MEAS_LIN_FLOPS_TOK] / coef[C_LIN_FLOPS_RATE], coef[C_LIN_BYTES] / coef[C_LIN_BW],
                      coef[C_LIN_P])
        return t + moe_table_s_nb(coef, n_tokens)
    weight_bytes = coef[C_LIN_BYTES]
    experts = coef[C_MOE_EXPERTS]
    if experts > 0.0:
        weight_bytes += coef[C_MOE_EXPERT_BYTES] * experts * (1.0 - (1.0 - coef[C_MOE_TOPK] / experts) ** n_tokens)
    t = _pnorm_nb(n_tokens * coef[C_LIN_FLOPS_TOK] / coef[C_LIN_FLOPS_RATE], weight_bytes / coef[C_LIN_BW],
                  coef[C_LIN_P])
    return t * _segment_factor_nb(coef, C_LINQ_N, C_LINQ_BOUNDS, C_LINQ_VALUES, n_tokens)


@njit(cache=True, nogil=True)
def elementwise_layer_s_nb(coef, n_tokens):
    """Seconds of one layer's element-wise ops (RMSNorms, RoPE, SiLU-and-mul, residual add) per GPU."""
    t = _pnorm_nb(n_tokens * coef[C_ELEM_TOK], coef[C_ELEM_FIXED], coef[C_ELEM_P])
    return t * _segment_factor_nb(coef, C_ELQ_N, C_ELQ_BOUNDS, C_ELQ_VALUES, n_tokens)


@njit(cache=True, nogil=True)
def allreduce_s_nb(coef, ar_x, ar_y, n_tokens):
    """One all-reduce of n tokens' activations: the measured table interpolated in log-log,
    linear in bytes past its end; on other GPUs the part above the latency floor scales."""
    if coef[C_AR_SCALE] == 0.0 or n_tokens <= 0:
        return 0.0
    x = np.log(n_tokens * coef[C_AR_BYTES_TOK])
    last = ar_x.shape[0] - 1
    if x >= ar_x[last]:  # past the table: bandwidth-bound, time grows with the payload
        t = ar_y[last] * np.exp(x - ar_x[last])
    elif x <= ar_x[0]:
        t = ar_y[0]
    else:
        lo, hi = 0, last  # binary search: ar_x[lo] <= x < ar_x[hi]
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if ar_x[mid] <= x:
                lo = mid
            else:
                hi = mid
        w = (x - ar_x[lo]) / (ar_x[hi] - ar_x[lo])
        t = ar_y[lo] * (ar_y[hi] / ar_y[lo]) ** w
    floor = ar_y[0]
    return floor + coef[C_AR_SCALE] * (t - floor)


@njit(cache=True, nogil=True)
def lm_head_s_nb(coef, n_lm):
    """The LM head GEMM (BF16 in every precision): a plain roofline at the BF16 peak and the linear layers' fitted
    efficiencies (no measurement of it ships; a max keeps this per-step term free of powers in the engine's hot
    loop)."""
    if n_lm <= 0:
        return 0.0
    return max(n_lm * coef[C_LM_FLOPS_SEQ] / coef[C_LM_FLOPS_RATE], coef[C_LM_BYTES] / coef[C_LM_BW])


@njit(cache=True, nogil=True)
def graph_saving_nb(coef, attn_work, n_lm):
    """Seconds of the fixed per-step time a step does not pay because it replays one full CUDA graph: a step without
    prompt tokens (attention work 0) whose tokens, all decodes (one logit position each, n_lm), are at most the
    largest captured size. 0 for every other step (prompt tokens, larger batches, nothing computed)."""
    if attn_work == 0.0 and 0.0 < n_lm <= coef[C_GRAPH_MAX_TOKENS]:
        return coef[C_GRAPH_SAVING_S]
    return 0.0


@njit(cache=True, nogil=True)
def step_parts_nb(coef, ar_x, ar_y, n_tokens, attn_work, decode_ctx, n_lm, swap_tokens, out):
    """Fill ``out`` with [linear, elementwise, prompt attention, decode attention,
    all-reduce, lm head, swap, fixed, per-sequence CPU, prefill launch] seconds for one step."""
    layers = coef[C_LAYERS]
    if n_tokens > 0:
        out[0] = layers * linear_layer_s_nb(coef, n_tokens)
        out[1] = layers * elementwise_layer_s_nb(coef, n_tokens)
        out[4] = 2.0 * layers * allreduce_s_nb(coef, ar_x, ar_y, n_tokens)
    else:
        out[0] = 0.0
        out[1] = 0.0
        out[4] = 0.0
    out[2] = layers * attn_work * coef[C_ATTN_FLOPS_COEF] / coef[C_ATTN_RATE]
    out[3] = layers * decode_ctx * coef[C_KV_BYTES_TOK_LAYER] / coef[C_KV_BW]
    out[5] = lm_head_s_nb(coef, n_lm)
    out[6] = swap_tokens * coef[C_KV_BYTES_TOK] / coef[C_SWAP_BW]
    out[7] = coef[C_FIXED] - graph_saving_nb(coef, attn_work, n_lm) if (n_tokens > 0 or swap_tokens > 0) else 0.0
    out[8] = n_lm * coef[C_ENG_SEQ_S]
    out[9] = coef[C_ENG_PREFILL_S] if attn_work > 0.0 else 0.0


@njit(cache=True, nogil=True)
def token_time_nb(coef, ar_x, ar_y, n_tokens, swap_tokens):
    """The part of a step's time that depends only on its token count: linear layers,
    element-wise ops, all-reduces and the fixed overhead."""
    if n_tokens > 0:
        layers = coef[C_LAYERS]
        t = layers * (linear_layer_s_nb(coef, n_tokens) + elementwise_layer_s_nb(coef, n_tokens))
        t += 2.0 * layers * allreduce_s_nb(coef, ar_x, ar_y, n_tokens)
        return t + coef[C_FIXED]
    return coef[C_FIXED] if swap_tokens > 0 else 0.0


@njit(cache=True, nogil=True)
def rest_time_nb(coef, base, attn_work, decode_ctx, n_lm, swap_tokens):
    """``base`` (token_time_nb, which holds the fixed per-step time) plus attention, LM head, swap and the engine
    profile's per-sequence and prefill-step time (a step holds prompt tokens exactly when its attention work is
    positive), less what a pure-decode step replayed as one CUDA graph saves of the fixed time."""
    t = base + n_lm * coef[C_ENG_SEQ_S] - graph_saving_nb(coef, attn_work, n_lm)
    if attn_work > 0.0:
        t += coef[C_ENG_PREFILL_S]
    t += coef[C_LAYERS] * attn_work * coef[C_ATTN_FLOPS_COEF] / coef[C_ATTN_RATE]
    t += coef[C_LAYERS] * decode_ctx * coef[C_KV_BYTES_TOK_LAYER] / coef[C_KV_BW]
    t += lm_head_s_nb(coef, n_lm)
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


# --- Python helpers -----------------------------------------------------------------------
PART_NAMES = ("linear", "elementwise", "prompt attention", "decode attention", "all-reduce",
              "lm head", "swap", "fixed overhead", "per-sequence CPU", "prefill launch")


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


def linear_layer_s(cm: CostModel, n_tokens) -> np.ndarray:
    """Per-layer linear seconds per GPU for each token count (vectorised over a Python loop)."""
    return np.array([linear_layer_s_nb(cm.coef, float(n)) for n in np.atleast_1d(n_tokens)])


def elementwise_layer_s(cm: CostModel, n_tokens) -> np.ndarray:
    return np.array([elementwise_layer_s_nb(cm.coef, float(n)) for n in np.atleast_1d(n_tokens)])


def allreduce_s(cm: CostModel, message_bytes) -> np.ndarray:
    """One all-reduce's seconds for each payload size in bytes."""
    per_tok = cm.coef[C_AR_BYTES_TOK]
    return np.array([allreduce_s_nb(cm.coef, cm.ar_log_bytes, cm.ar_s, float(b) / per_tok)
                     for b in np.atleast_1d(message_bytes)])


def prompt_attn_work(chunk: float, context_before: float) -> float:
    """Query-key pairs of one causal prompt chunk: chunk * (context_before + chunk / 2)."""
    return chunk * (context_before + chunk / 2.0)


def ridge_tokens(cm: CostModel) -> float:
    """Tokens per step where the linear layers' compute time equals their weight-read time
    (the roofline ridge in batch size; a dense model's, MoE's with every expert touched)."""
    c = cm.coef
    wbytes = c[C_LIN_BYTES] + c[C_MOE_EXPERT_BYTES] * c[C_MOE_EXPERTS]
    return float(wbytes / c[C_LIN_BW] * c[C_LIN_FLOPS_RATE] / c[C_LIN_FLOPS_TOK])


def ridge_intensity(cm: CostModel) -> float:
    """The roofline ridge as arithmetic intensity, FLOP per byte: peak FLOP/s over peak bytes/s."""
    return float(cm.coef[C_PEAK_FLOPS] / cm.coef[C_PEAK_BW])


def useful_flops_bytes(coef: np.ndarray, tokens, attn_work, decode_ctx, n_lm):
    """Useful FLOPs and bytes per GPU of steps (arrays), for MFU, MBU and gpu_util."""
    layers = coef[C_LAYERS]
    tokens = np.asarray(tokens, float)
    has = tokens > 0
    flops = layers * (tokens * coef[C_LIN_FLOPS_TOK] + np.asarray(attn_work) * coef[C_ATTN_FLOPS_COEF])
    flops = flops + np.asarray(n_lm) * coef[C_LM_FLOPS_SEQ]
    wbytes = np.full(tokens.shape, coef[C_LIN_BYTES])
    if coef[C_MOE_EXPERTS] > 0:
        wbytes = wbytes + coef[C_MOE_EXPERT_BYTES] * moe_experts_touched(coef[C_MOE_EXPERTS], coef[C_MOE_TOPK], tokens)
    nbytes = np.where(has, layers * wbytes + coef[C_LM_BYTES], 0.0)
    nbytes = nbytes + layers * np.asarray(decode_ctx) * coef[C_KV_BYTES_TOK_LAYER]
    return flops, nbytes
