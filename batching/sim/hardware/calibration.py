"""Calibration of the cost model against measured H100 data (docs/CALIBRATION.md).

Three jobs, all without Streamlit:

* load the measured tables shipped in ``batching/data`` (derived from the published tables in
  ``batching/data/raw`` by ``tools/extract_calibration.py``);
* fit the linear-layer and element-wise terms (``fit_ops``), whose result ships as
  ``batching/data/linear_fit.json`` and is what ``costmodel`` reads;
* compare the model with every measurement and with the published end-to-end figures
  (``linear_comparison``, ``allreduce_comparison``, ``end_to_end``), and list every constant
  with its source (``constants_table``) for the docs page and the dashboard.

The linear model per layer and GPU is a smooth roofline, a p-norm of the compute and
weight-read times ``(Tc^p + Tm^p)^(1/p)`` whose efficiencies and ``p`` are fitted per
tensor-parallel degree, times a piecewise-constant factor in the token count that carries
what a smooth curve cannot: cuBLAS tile and wave quantization, where one more token can add
an M-tile (e.g. 512 -> 520 tokens costs +77 % at TP 8). The factor's segments are the fewest
for which every measured point is within ``SEGMENT_TOLERANCE`` (the same piecewise-constant-
in-tokens form as Vidur's own random-forest runtime estimator).
"""
from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

import numpy as np
import pandas as pd

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware import kernel_tables as kt
from batching.sim.hardware.specs import BYTES_PER_WEIGHT, GPUS, MODELS, Deployment, Model, Node, deployment

# --- the calibration model: Llama-2-70B as Vidur profiled it ------------------------------
# Llama-2-70B (meta-llama/Llama-2-70b-hf config.json): 64 heads, 8 KV heads, head dim 128,
# hidden 8192, FFN 28672, gated MLP. Its layer shapes are Llama-3.1-70B's exactly and
# Qwen2.5-72B's but for the FFN width (29568, +3 %).
CALIBRATION_MODEL = Model("Llama-2-70B", 80, 8192, 64, 8, 128, 28672, 32000)
CALIBRATION_TPS = (1, 2, 4, 8)
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
# Largest deviation of a measured point from its segment's factor (the fit's own tolerance;
# the tests allow 10 %).
SEGMENT_TOLERANCE = 0.08
P_GRID = np.round(np.arange(1.0, 8.0001, 0.05), 4)  # p-norm exponents tried (1 = sum, large = max)
H100 = GPUS["h100-sxm"]


# --- loading the shipped tables -------------------------------------------------------
def _data(name: str):
    return resources.files("batching.data").joinpath(name)


def load_linear_ops() -> pd.DataFrame:
    """Per-layer, per-GPU medians (ms) of Llama-2-70B's token-parallel ops on H100, per TP."""
    with _data("h100_llama2_70b_linear_ops.csv").open("r") as f:
        return pd.read_csv(f)


def load_allreduce_raw(impl: str) -> pd.DataFrame:
    """Every measured row of the table behind an all-reduce choice (num_gpus, message_bytes, latency_us)."""
    if impl not in cm.ALLREDUCE_IMPLS:
        raise ValueError(f"allreduce={impl!r} is unknown; allowed: {', '.join(cm.ALLREDUCE_IMPLS)}")
    source, label = cm.ALLREDUCE_IMPLS[impl]
    with _data(source).open("r") as f:
        t = pd.read_csv(f)
    if "implementation" in t.columns:
        t = t[t.implementation == label]
    return t[["num_gpus", "message_bytes", "latency_us"]].reset_index(drop=True)


# --- fitting ------------------------------------------------------------------------
def _log_spacing_weights(n: np.ndarray) -> np.ndarray:
    """Weight each token count by the width in log(n) it stands for, so every octave of batch
    sizes counts the same (decode batches of 1-256 tokens are as important as long prefills)."""
    x = np.log(n)
    edges = np.concatenate(([x[0]], (x[1:] + x[:-1]) / 2, [x[-1]]))
    w = np.diff(edges)
    w[w <= 0] = w[w > 0].min() if (w > 0).any() else 1.0
    return w / w.sum()


def fit_pnorm(n: np.ndarray, y: np.ndarray, per_token: np.ndarray | float, fixed: float):
    """Fit ``y ~ ((a*per_token*n)^p + (b*fixed)^p)^(1/p)``; returns (p, a, b, weighted log-RMS).

    For each p on ``P_GRID`` the p-th powers make the model linear in (a^p, b^p), solved by
    weighted least squares on the relative error; the p with the smallest weighted RMS of
    log(model / measured) wins (octave-uniform weights)."""
    n = np.asarray(n, float)
    y = np.asarray(y, float)
    u = np.asarray(per_token, float) * n
    w = _log_spacing_weights(n)
    best = None
    for p in P_GRID:
        X = np.stack([u**p, np.full_like(u, fixed**p)], axis=1)
        scale = np.sqrt(w) / y**p
        coef, *_ = np.linalg.lstsq(X * scale[:, None], y**p * scale, rcond=None)
        if not np.all(coef > 0):
            continue
        model = (X @ coef) ** (1.0 / p)
        rms = float(np.sqrt(np.sum(w * np.log(model / y) ** 2)))
        if best is None or rms < best[3]:
            best = (float(p), float(coef[0] ** (1.0 / p)), float(coef[1] ** (1.0 / p)), rms)
    if best is None:
        raise ValueError("no p-norm fits these times")
    return best


def pnorm(a, b, p: float):
    a = np.asarray(a, float)
    b = np.asarray(b, float)
    m = np.maximum(a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)
    return np.where(m > 0, out, 0.0)


def fit_segments(n: np.ndarray, ratio: np.ndarray, tol: float = SEGMENT_TOLERANCE):
    """Fewest contiguous token ranges whose measured/smooth ratios lie within ±tol of one factor.

    Greedy left to right (optimal for this interval-cover problem). Returns (upper_bounds,
    factors): a token count t takes the factor of the first segment whose bound is >= t (the
    last one beyond the table), so a count between two measured points takes the larger's.
    The factor is the geometric middle of the segment's extreme ratios."""
    span = (1.0 + tol) / (1.0 - tol)
    bounds, factors = [], []
    i = 0
    while i < len(n):
        lo = hi = ratio[i]
        j = i
        while j + 1 < len(n) and max(hi, ratio[j + 1]) / min(lo, ratio[j + 1]) <= span:
            j += 1
            lo, hi = min(lo, ratio[j]), max(hi, ratio[j])
        bounds.append(float(n[j]))
        factors.append(float(np.sqrt(lo * hi)))
        i = j + 1
    return np.array(bounds), np.array(factors)


def segment_factor(bounds: np.ndarray, factors: np.ndarray, n) -> np.ndarray:
    k = np.searchsorted(bounds, np.asarray(n, float), side="left")
    return np.asarray(factors)[np.minimum(k, len(factors) - 1)]


def _linear_units(tp: int):
    """FLOPs per token and BF16 weight bytes per layer per GPU of the calibration model."""
    params = CALIBRATION_MODEL.linear_params_per_layer / tp
    return 2.0 * params, 2.0 * params


def fit_ops(table: pd.DataFrame | None = None, tol: float = SEGMENT_TOLERANCE) -> dict:
    """Fit the linear and element-wise terms per TP degree; the dict ``linear_fit.json`` holds."""
    table = load_linear_ops() if table is None else table
    out = {
        "source": "batching/data/h100_llama2_70b_linear_ops.csv (Vidur, microsoft/vidur "
                  "data/profiling/compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv, MIT), fitted by "
                  "batching.sim.hardware.calibration.fit_ops; regenerate with python tools/extract_calibration.py",
        "calibration_model": {"hidden_size": CALIBRATION_MODEL.hidden_size, "num_heads": CALIBRATION_MODEL.num_heads,
                              "num_kv_heads": CALIBRATION_MODEL.num_kv_heads, "head_dim": CALIBRATION_MODEL.head_dim,
                              "ffn_size": CALIBRATION_MODEL.ffn_size},
        "gpu": {"peak_bf16_flops": H100.peak_bf16_flops, "hbm_bw_Bps": H100.hbm_bw_Bps},
        "segment_tolerance": tol,
        "tp": {},
    }
    for tp in CALIBRATION_TPS:
        t = table[table.tp == tp].sort_values("num_tokens")
        n = t.num_tokens.to_numpy(float)
        flops_tok, wbytes = _linear_units(tp)
        y = t.linear_ms.to_numpy(float) * 1e-3
        p, a, b, rms = fit_pnorm(n, y, flops_tok / H100.peak_bf16_flops, wbytes / H100.hbm_bw_Bps)
        e_c, e_m = 1.0 / a, 1.0 / b
        smooth = pnorm(n * flops_tok / (H100.peak_bf16_flops * e_c), wbytes / (H100.hbm_bw_Bps * e_m), p)
        bounds, factors = fit_segments(n, y / smooth, tol)
        ye = t.elementwise_ms.to_numpy(float) * 1e-3
        pe, slope, floor, rms_e = fit_pnorm(n, ye, 1.0, 1.0)
        smooth_e = pnorm(n * slope, floor, pe)
        ebounds, efactors = fit_segments(n, ye / smooth_e, tol)
        out["tp"][str(tp)] = {
            "linear": {"p": p, "eff_compute": e_c, "eff_memory": e_m, "smooth_log_rms": rms,
                       "params_per_gpu": CALIBRATION_MODEL.linear_params_per_layer / tp,
                       "segment_bounds": bounds.tolist(), "segment_factors": factors.tolist()},
            "elementwise": {"p": pe, "per_token_s": slope, "fixed_s": floor, "smooth_log_rms": rms_e,
                            "segment_bounds": ebounds.tolist(), "segment_factors": efactors.tolist()},
        }
    return out


def _round_floats(obj, digits: int = 6):
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round_floats(v, digits) for v in obj]
    return obj


def fit_json(fit: dict | None = None) -> str:
    """The text of ``linear_fit.json`` (6 significant digits)."""
    return json.dumps(_round_floats(fit_ops() if fit is None else fit), indent=1) + "\n"


# --- model vs measurement ----------------------------------------------------------------
def calibration_deployment(tp: int, gpu: str = "h100-sxm"):
    """The calibration model on an H100 node at this TP degree (not memory-checked: TP 1 does
    not hold Llama-2-70B, but its per-GPU op times were measured all the same)."""
    from batching.sim.hardware.specs import Deployment, Node

    return Deployment(Node(GPUS[gpu], 8, tp), CALIBRATION_MODEL)


def _smooth(tp: int, key: str, n: np.ndarray) -> np.ndarray:
    f = cm.linear_fit()["tp"][str(tp)][key]
    if key == "linear":
        flops_tok, wbytes = _linear_units(tp)
        return pnorm(n * flops_tok / (H100.peak_bf16_flops * f["eff_compute"]),
                     wbytes / (H100.hbm_bw_Bps * f["eff_memory"]), f["p"])
    return pnorm(n * f["per_token_s"], f["fixed_s"], f["p"])


def op_comparison(tp: int, key: str = "linear") -> pd.DataFrame:
    """Measured vs model per-layer time of the linear ops (``key='linear'``) or the element-wise
    ops (``'elementwise'``) at every measured token count, one TP degree. Columns: num_tokens,
    measured_s, model_s, error (model/measured - 1), smooth_s and smooth_error (without the
    tile factor), holdout_error (segments refitted on every other token count, error at the
    others; NaN at the points used)."""
    if key not in ("linear", "elementwise"):
        raise ValueError(f"key={key!r} is not allowed; allowed: linear, elementwise")
    if tp not in CALIBRATION_TPS:
        raise ValueError(f"tp={tp!r} was not measured; allowed: {', '.join(map(str, CALIBRATION_TPS))}")
    t = load_linear_ops()
    t = t[t.tp == tp].sort_values("num_tokens")
    n = t.num_tokens.to_numpy(float)
    y = t[f"{key}_ms"].to_numpy(float) * 1e-3
    costs = cm.cost_model(calibration_deployment(tp))
    model = cm.linear_layer_s(costs, n) if key == "linear" else cm.elementwise_layer_s(costs, n)
    smooth = _smooth(tp, key, n)
    # hold-out: refit the smooth curve and the segments on even-indexed counts, predict the odd ones
    train = np.arange(len(n)) % 2 == 0
    if key == "linear":
        flops_tok, wbytes = _linear_units(tp)
        p, a, b, _ = fit_pnorm(n[train], y[train], flops_tok / H100.peak_bf16_flops, wbytes / H100.hbm_bw_Bps)
        sm_h = pnorm(n * flops_tok / H100.peak_bf16_flops * a, wbytes / H100.hbm_bw_Bps * b, p)
    else:
        p, a, b, _ = fit_pnorm(n[train], y[train], 1.0, 1.0)
        sm_h = pnorm(n * a, b, p)
    bounds, factors = fit_segments(n[train], y[train] / sm_h[train], cm.linear_fit()["segment_tolerance"])
    pred = sm_h * segment_factor(bounds, factors, n)
    holdout = np.where(train, np.nan, pred / y - 1.0)
    return pd.DataFrame({"num_tokens": n.astype(int), "measured_s": y, "model_s": model, "error": model / y - 1.0,
                         "smooth_s": smooth, "smooth_error": smooth / y - 1.0, "holdout_error": holdout})


def linear_comparison(tp: int) -> pd.DataFrame:
    return op_comparison(tp, "linear")


def op_error_summary(key: str = "linear") -> pd.DataFrame:
    """Per TP degree: max and median |error| of the model, of the smooth part alone, and hold-out."""
    rows = []
    for tp in CALIBRATION_TPS:
        d = op_comparison(tp, key)
        f = cm.linear_fit()["tp"][str(tp)][key]
        rows.append({"tp": tp, "points": len(d), "segments": len(f["segment_bounds"]),
                     "max_abs_error": float(d.error.abs().max()),
                     "median_abs_error": float(d.error.abs().median()),
                     "smooth_max_abs_error": float(d.smooth_error.abs().max()),
                     "smooth_median_abs_error": float(d.smooth_error.abs().median()),
                     "holdout_max_abs_error": float(d.holdout_error.abs().max()),
                     "holdout_median_abs_error": float(d.holdout_error.abs().median())})
    return pd.DataFrame(rows)


def allreduce_comparison(impl: str = cm.DEFAULT_ALLREDUCE) -> pd.DataFrame:
    """Measured (table median) vs model all-reduce time at every measured size, 2/4/8 GPUs on H100.
    ``holdout_error``: the table with every other size removed, interpolated at the removed ones."""
    rows = []
    for tp in (2, 4, 8):
        costs = cm.cost_model(calibration_deployment(tp), impl)
        x, y = costs.ar_log_bytes, costs.ar_s
        sizes = np.exp(x)
        model = cm.allreduce_s(costs, sizes)
        keep = np.arange(len(x)) % 2 == 0
        keep[-1] = True  # the ends stay, so every removed size lies inside the thinned table
        hold = np.full(len(x), np.nan)
        for i in np.flatnonzero(~keep):
            n_tokens = sizes[i] / costs.coef[cm.C_AR_BYTES_TOK]
            hold[i] = cm.allreduce_s_nb(costs.coef, x[keep], y[keep], n_tokens) / y[i] - 1
        rows.append(pd.DataFrame({"num_gpus": tp, "message_bytes": sizes.round().astype(np.int64), "measured_s": y,
                                  "model_s": model, "error": model / y - 1.0, "holdout_error": hold}))
    return pd.concat(rows, ignore_index=True)


def allreduce_error_summary() -> pd.DataFrame:
    rows = []
    for impl in cm.ALLREDUCE_IMPLS:
        d = allreduce_comparison(impl)
        for tp, g in d.groupby("num_gpus"):
            rows.append({"allreduce": impl, "num_gpus": int(tp), "sizes": len(g),
                         "max_abs_error": float(g.error.abs().max()),
                         "holdout_max_abs_error": float(g.holdout_error.abs().max()),
                         "holdout_median_abs_error": float(g.holdout_error.abs().median())})
    return pd.DataFrame(rows)


# --- constants and their sources ------------------------------------------------------------
GPU_SOURCES = {
    "h100-sxm": "NVIDIA H100 Tensor Core GPU datasheet (SXM5); memory as nvidia-smi reports it",
    "h200-sxm": "NVIDIA H200 Tensor Core GPU datasheet (SXM); memory as nvidia-smi reports it",
    "b200": "NVIDIA HGX B200 datasheet, per GPU (dense = half the sparse figures); 183,359 MiB per nvidia-smi",
    "a100-80gb": "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); memory as nvidia-smi reports it",
}


def constants_table() -> pd.DataFrame:
    """Every constant of the cost model: group, name, value, unit, source."""
    fit = cm.linear_fit()
    src_fit = "fit to Vidur's H100 Llama-2-70B op times (batching/data/linear_fit.json)"
    rows = [
        ("step", "fixed overhead per step", cm.STEP_FIXED_S * 1e3, "ms",
         "SGLang v0.4 release post (2024-12-04): overlapping v0.3's CPU scheduling with the GPU gained 1.1x "
         "throughput, i.e. ~9 % of a ~20 ms 70B step; vLLM v0.6.0 post: multi-step scheduling hides most of "
         "its larger CPU overhead"),
        ("attention", "prompt attention efficiency (of BF16 peak)", cm.ATTN_PREFILL_EFF, "",
         "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608): FlashAttention-2 reaches ~35 % of H100 "
         "peak; the prefill kernels of vLLM v0.6.0 and SGLang v0.3.0 are FlashAttention-2-class"),
        ("attention", "decode attention bandwidth efficiency", cm.ATTN_DECODE_MEMORY_EFF, "",
         "FlashInfer blog 2024-02-02: paged batch-decode kernels run near the bandwidth roofline at long "
         "contexts, lower at short ones"),
        ("attention", "MLA decode compute efficiency (of BF16 peak)", cm.MLA_DECODE_COMPUTE_EFF, "",
         "deepseek-ai/FlashMLA README: 580 TFLOPS compute-bound on H800 SXM5 (989 TFLOP/s BF16 peak); applies "
         "only where the absorbed MLA decode is compute-bound (many heads per GPU); not measured here"),
        ("all-reduce", "default implementation", cm.DEFAULT_ALLREDUCE, "",
         "vLLM's custom all-reduce under CUDA graphs (decode steps); measured by NVIDIA aiconfigurator"),
        ("all-reduce", "NVLink bandwidth the tables were measured at", cm.H100_NVLINK_BPS / 1e9, "GB/s",
         "H100 SXM NVLink4, 900 GB/s total = 450 per direction; other GPUs scale the part above the floor"),
        ("all-reduce", "payload bytes per token", cm.ACTIVATION_BYTES, "B x hidden", "BF16 activations"),
        ("all-reduce", "TP 16 (two nodes): network hop latency", cm.NET_HOP_S * 1e6, "us",
         "NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc), NET hop for Tree/LL; two per all-reduce over two "
         "nodes (up and down the tree); composed, not measured"),
        ("all-reduce", "TP 16 (two nodes): NIC bandwidth per GPU", cm.NIC_BPS / 1e9, "GB/s",
         "one 400 Gb/s ConnectX-7 per GPU; NCCL reaches 46-48 GB/s per NDR NIC (NVIDIA/nccl-tests issue #290); "
         "each GPU sends its eighth of the message"),
        ("linear", "segment tolerance of the tile factor", fit["segment_tolerance"], "",
         "design choice: the fewest segments with every measured point within this band"),
        ("moe/mla", "measured kernel tables", "aiconfigurator 0.12.0", "",
         "NVIDIA aiconfigurator per-op database (Apache-2.0): vLLM 0.24.0 MoE and MLA module tables, SGLang "
         "0.5.14 MoE, H100/H200/B200 (batching/data/aic_*.csv)"),
        ("moe/mla", "expert routing of the MoE tables", "power_law_1.01", "",
         "aiconfigurator's DeepSeek model (sdk/models/deepseek.py, _power_law_alpha = 1.01)"),
        ("moe/mla", "MLA decode fit: least cached tokens per batch", kt.DECODE_FIT_MIN_TOKENS, "tokens",
         "design choice: batches where the context read dominates the module's time"),
        ("moe/mla", "MLA prefill fit: least prompt", kt.PREFILL_FIT_MIN_PROMPT, "tokens",
         "design choice: prompts where QK^T and PV dominate the module's time"),
        ("moe/mla", "DP attention: all-reduces' bytes per layer", cm.DP_ATTENTION_ALLREDUCES_PER_LAYER, "",
         "SGLang DP attention without DeepEP: an all-gather before the experts and a reduce-scatter after = one "
         "all-reduce's bytes (TP attention: two all-reduces per layer)"),
        ("precision", "NVFP4 bytes per weight", BYTES_PER_WEIGHT["nvfp4"], "B",
         "NVIDIA blog 'Introducing NVFP4 for Efficient and Accurate Low-Precision Inference' (2025-06-24): E2M1 "
         "values with one FP8 E4M3 scale per 16; ModelOpt exports: group_size 16, KV cache FP8"),
    ]
    for impl, (source, label) in cm.ALLREDUCE_IMPLS.items():
        rows.append(("all-reduce", f"table '{impl}'", label or "NCCL (binned)", "", cm.ALLREDUCE_SOURCES[source]))
    for tp, f in fit["tp"].items():
        lin, el = f["linear"], f["elementwise"]
        rows += [
            ("linear", f"TP {tp}: compute efficiency e_c", lin["eff_compute"], "of peak", src_fit),
            ("linear", f"TP {tp}: memory efficiency e_m", lin["eff_memory"], "of HBM bw", src_fit),
            ("linear", f"TP {tp}: p-norm exponent p", lin["p"], "", src_fit),
            ("linear", f"TP {tp}: tile-factor segments", len(lin["segment_bounds"]), "",
             src_fit + "; factors " + ", ".join(f"<={b:.0f}: {q:.3f}" for b, q in
                                                zip(lin["segment_bounds"], lin["segment_factors"]))),
            ("elementwise", f"TP {tp}: floor per layer", el["fixed_s"] * 1e6, "us", src_fit),
            ("elementwise", f"TP {tp}: per token per layer", el["per_token_s"] * 1e9, "ns", src_fit),
            ("elementwise", f"TP {tp}: p-norm exponent", el["p"], "", src_fit),
            ("elementwise", f"TP {tp}: factor segments", len(el["segment_bounds"]), "", src_fit),
        ]
    for key, g in GPUS.items():
        rows += [
            ("gpu", f"{g.name}: memory", g.memory_bytes / 2**30, "GiB", GPU_SOURCES.get(key, "")),
            ("gpu", f"{g.name}: HBM bandwidth", g.hbm_bw_Bps / 1e12, "TB/s", GPU_SOURCES.get(key, "")),
            ("gpu", f"{g.name}: BF16 dense peak", g.peak_bf16_flops / 1e12, "TFLOP/s", GPU_SOURCES.get(key, "")),
            ("gpu", f"{g.name}: FP8 dense peak", g.peak_fp8_flops / 1e12, "TFLOP/s", GPU_SOURCES.get(key, "")),
            ("gpu", f"{g.name}: FP4 dense peak", g.peak_fp4_flops / 1e12, "TFLOP/s",
             "NVIDIA HGX B200 datasheet: FP4 144 PFLOPS with sparsity for 8 GPUs = 9 PF dense per GPU"
             if g.peak_fp4_flops else "no FP4 tensor cores"),
            ("gpu", f"{g.name}: NVLink per direction", g.nvlink_Bps / 1e9, "GB/s", GPU_SOURCES.get(key, "")),
            ("gpu", f"{g.name}: host link (swap)", g.pcie_Bps / 1e9, "GB/s", "usable PCIe x16 throughput"),
        ]
    return pd.DataFrame(rows, columns=["group", "name", "value", "unit", "source"])


def model_table() -> pd.DataFrame:
    """The model presets: shapes and parameter counts (config.json of each release)."""
    rows = []
    for key, m in MODELS.items():
        experts = ""
        if m.is_moe:
            experts = f"{m.experts_per_token} of {m.num_experts}"
            experts += f" + {m.shared_experts} shared" if m.shared_experts else ""
            experts += f", first {m.first_dense_layers} dense" if m.first_dense_layers else ""
        rows.append({"id": key, "name": m.name, "layers": m.num_layers, "hidden": m.hidden_size,
                     "heads": m.num_heads, "kv_heads": f"MLA {m.kv_lora_rank}+{m.qk_rope_head_dim}" if m.is_mla
                     else m.num_kv_heads, "head_dim": m.head_dim, "ffn": m.ffn_size,
                     "vocab": m.vocab_size, "experts": experts,
                     "params_B": m.num_params / 1e9, "active_params_B": m.active_params / 1e9,
                     "kv_KiB_per_token_bf16": m.kv_bytes_per_token() / 1024})
    return pd.DataFrame(rows)


def measured_kernel_rows() -> tuple[list[str], list[str]]:
    """Markdown rows: the MLA fits per GPU (DeepSeek-V3 at TP 8: 16 heads per GPU) and DeepSeek-V3's routed experts
    per layer at TP 8 on H200, measured against the roofline of uniformly touched experts."""
    mla = []
    for gpu in ("h100-sxm", "h200-sxm", "b200"):
        g, key = GPUS[gpu], kt.TABLE_GPUS[GPUS[gpu].name]
        for kv, nbytes in (("auto", 2), ("fp8", 1)):
            d, p = kt.mla_decode_s_per_token(key, 16, kv), kt.mla_prefill_s_per_pair(key, 16, kv)
            bw = 576 * nbytes / d
            rate = 2 * 16 * 320 / p
            mla.append(f"| {g.name} | {'FP8' if kv == 'fp8' else 'BF16'} | {d * 1e12:.1f} ps | {bw / 1e12:.2f} TB/s "
                       f"({bw / g.hbm_bw_Bps:.0%} of HBM) | {p * 1e12:.2f} ps | {rate / 1e12:.0f} TFLOP/s "
                       f"({rate / g.peak_bf16_flops:.0%} of BF16 peak) |")
    v3 = deployment("h200-sxm", "deepseek-v3", 8, precision="fp8")
    meas = cm.cost_model(v3)
    roof = cm.cost_model(Deployment(Node(replace(GPUS["h200-sxm"], name="H200 roofline"), 8, 8), v3.model, "fp8"))
    moe = []
    for n in (1, 8, 64, 512, 4096):
        a, b = cm.linear_layer_s(meas, n)[0], cm.linear_layer_s(roof, n)[0]
        t = cm.moe_table_s_nb(meas.coef, float(n)) * 61 / 58
        moe.append(f"| {n:,} | {t * 1e3:.3f} ms | {a * 1e3:.3f} ms | {b * 1e3:.3f} ms | {a / b - 1:+.0%} |")
    return mla, moe


def mla_ratios() -> dict:
    """Figures the MLA text quotes: the prefill module's FLOP rate as a share of BF16 peak (lowest, highest over the
    GPUs), an FP8 latent's decode time over a BF16 one's (lowest, highest), and the H200 decode module's fixed part
    per layer at 16 heads (the intercept of the fit over every batch)."""
    prefill, fp8 = [], []
    for gpu in ("h100-sxm", "h200-sxm", "b200"):
        g, key = GPUS[gpu], kt.TABLE_GPUS[GPUS[gpu].name]
        prefill.append(2 * 16 * 320 / kt.mla_prefill_s_per_pair(key, 16, "auto") / g.peak_bf16_flops)
        fp8.append(kt.mla_decode_s_per_token(key, 16, "fp8") / kt.mla_decode_s_per_token(key, 16, "auto"))
    a, b, _ = kt.mla_decode_fit("h200", 16, "auto", 1)
    v3 = deployment("h200-sxm", "deepseek-v3", 8, precision="fp8")
    moe = {k: float(np.interp(64, *kt.moe_table("h200", v3.model, "fp8", 8, 1, k))) for k in kt.KERNEL_FRAMEWORKS}
    step = {k: cm.step_time(cm.cost_model(v3, kernels=k), 64, decode_ctx=64 * 1400.0, n_lm=64)
            for k in kt.KERNEL_FRAMEWORKS}
    return {"prefill_lo": min(prefill), "prefill_hi": max(prefill), "fp8_lo": min(fp8), "fp8_hi": max(fp8),
            "fixed_s": a, "per_seq_s": b, "moe64_vllm": moe["vllm"], "moe64_sglang": moe["sglang"],
            "step64_change": step["sglang"] / step["vllm"] - 1}


def deepseek_parts(frame: pd.DataFrame | None) -> tuple[str, str, str, str]:
    """(source, policy, markdown table, summary sentence) of the DeepSeek serving check, or texts saying it
    was not run (the frame comes from batching.studies.deepseek_check, a study this module does not import)."""
    if frame is None or len(frame) == 0:
        return "not run", "-", "(the check was not run: `python -m batching calibrate --report` runs it)", ""
    lines = ["| clients | published mean TPOT | before (mean) | now (mean) | aiconfigurator | error before | "
             "error now | error aiconfigurator | published output tok/s | now | error before | error now |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        lines.append(f"| {r.clients} | {r.published_tpot_ms:.1f} ms | {r.before_tpot_ms:.2f} ms | {r.tpot_ms:.2f} ms | "
                     f"{r.aiconfigurator_tpot_ms:.2f} ms | {r.tpot_error_before:+.1%} | {r.tpot_error:+.1%} | "
                     f"{r.aiconfigurator_error:+.1%} | {r.published_output_tok_s:,.0f} | {r.output_tok_s:,.0f} | "
                     f"{r.output_error_before:+.1%} | {r.output_error:+.1%} |")
    err = frame.tpot_error.abs()
    summary = (f"Mean TPOT (simulated means over requests against the published means): median |error| "
               f"{err.median():.1%} (worst {err.max():.1%}; before "
               f"{frame.tpot_error_before.abs().median():.1%}, worst {frame.tpot_error_before.abs().max():.1%}); "
               f"output throughput: median |error| {frame.output_error.abs().median():.1%} (before "
               f"{frame.output_error_before.abs().median():.1%}). aiconfigurator: median |error| "
               f"{frame.aiconfigurator_error.abs().median():.1%}.")
    e = frame.set_index("clients")
    lo, hi = e.index.min(), e.index.max()
    med = frame.tpot_error.abs().median()
    holds = "holds" if med <= 0.15 else "does not hold"
    pace = "too fast" if e.tpot_error[hi] < 0 else "too slow"
    trend = "grows" if abs(e.tpot_error[hi]) > abs(e.tpot_error[lo]) else "shrinks"
    same = "the same" if (e.aiconfigurator_error[hi] < 0) == (e.tpot_error[hi] < 0) else "the other"
    by = (f"by a share that {trend} with the batch ({e.tpot_error[lo]:+.0%} at {lo} clients, {e.tpot_error[hi]:+.0%} "
          f"at {hi})") if hi != lo else f"({e.tpot_error[hi]:+.0%} at {hi} clients)"
    why = (f"Why the target (within 15 %) {holds} for the mean TPOT's median |error| over the client counts "
           f"({med:.1%}), and not at {hi} clients nor for throughput: the simulated step is {pace} {by}, and "
           f"aiconfigurator's own estimate misses in {same} direction at {hi} ({e.aiconfigurator_error[hi]:+.0%}).")
    if "output_error_from_tpot" in frame:
        why += " " + _deepseek_throughput_why(frame)
    if "tpot_sglang_ms" in frame:
        sg = ", ".join(f"{r.tpot_sglang_ms:.2f} ms ({r.tpot_error_sglang:+.1%})" for r in frame.itertuples())
        why += (" The check runs the default engine profile (vLLM 0.11: a serial 2.0 ms of CPU time in every step). "
                "The published runs are SGLang's, whose scheduler overlaps the GPU; with the `sglang` profile (no "
                f"serial step time) the simulated TPOT at {', '.join(str(c) for c in frame.clients)} clients is "
                f"{sg}: the GPU step alone is shorter than SGLang's by more than the table shows, and part of the "
                "agreement above is vLLM's CPU time standing in for GPU time the cost model does not price (see "
                "below).")
    return frame.attrs.get("source", ""), frame.attrs.get("policy", ""), "\n".join(lines), summary + "\n\n" + why


def _deepseek_throughput_why(frame: pd.DataFrame) -> str:
    """Why the DeepSeek check's throughput errs more than its TPOT, and where the published TTFT goes."""
    def listed(values, fmt):
        return ", ".join(format(v, fmt) for v in values)

    share = frame.first_wave_share
    # the other requests' published mean, taking the first wave at the published P99 (it holds the P99)
    rest = (frame.published_ttft_ms - share * frame.published_ttft_p99_ms) / (1 - share)
    excess = (frame.published_ttft_p99_ms - frame.ttft_first_wave_max_ms) / 1e3
    clients = listed(frame.clients, "d")
    gap = rest - frame.ttft_rest_mean_ms
    span = f"{gap.min():,.0f}" + (f"-{gap.max():,.0f}" if round(gap.max()) != round(gap.min()) else "")
    return (f"Throughput follows from TPOT: a closed-loop client's rate is its output over TTFT + output x TPOT, so "
            f"a TPOT short by x makes the throughput high by 1/(1 - x) - 1, more than x: at {clients} clients the "
            f"TPOT errors alone make {listed(frame.output_error_from_tpot, '+.1%')} of the "
            f"{listed(frame.output_error, '+.1%')} (median {frame.output_error_from_tpot.abs().median():.1%}). The "
            f"rest is TTFT: the published mean is {listed(frame.published_ttft_ms, ',.0f')} ms, the simulated mean "
            f"{listed(frame.ttft_mean_ms, ',.0f')} ms. Each client sends {1 / share.iloc[0]:.0f} requests, so the "
            f"first wave (every client's first prompt, sent at once) is {share.iloc[0]:.0%} of the requests and holds "
            f"the P99: published {listed(frame.published_ttft_p99_ms, ',.0f')} ms, the simulated first wave's "
            f"slowest {listed(frame.ttft_first_wave_max_ms, ',.0f')} ms. The published first wave took "
            f"{listed(excess, '.2f')} s longer than its simulated prefill, about the same at 8 to 32 clients "
            "whatever the wave's size: likely a one-time cost of the server's first large prefill batches (the client "
            "warms up with one request) that no later request pays, which the simulator does not model. Taking the "
            f"first wave at the published P99, the other requests' published mean TTFT is about "
            f"{listed(rest, ',.0f')} ms against the simulated {listed(frame.ttft_rest_mean_ms, ',.0f')} ms: "
            f"{span} ms per "
            "request that nothing modelled here accounts for (the engine profiles' client-side time is "
            "tokenisation only; SGLang's tokenizer and detokenizer processes and the HTTP stream are not priced).")


def mla_markdown(deepseek: pd.DataFrame | None = None) -> str:
    """The "MLA and large MoE models" section of docs/CALIBRATION.md: sources, what the cost model assumes for
    multi-head latent attention and DeepSeek's mixture of experts, its check against published DeepSeek serving
    runs (``deepseek``: batching.studies.deepseek_check.deepseek_frame()), and what is not calibrated."""
    rows = []
    for key in ("deepseek-v3", "kimi-k2"):
        m = MODELS[key]
        for gpu in ("h100-sxm", "h200-sxm", "b200"):
            try:
                d = deployment(gpu, m, 8, precision="fp8")
                fit = f"{d.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU, {d.kv_capacity_tokens:,} KV tokens"
            except ValueError:
                need = Deployment(Node(GPUS[gpu], 8, 8), m, "fp8").weight_bytes_per_gpu / 2**30
                fit = f"does not fit ({need:.1f} GiB of weights per GPU)"
            rows.append(f"| {m.name} | 8x {GPUS[gpu].name} | {fit} |")
        try:  # where one 8xH100 node is too small: TP 16 over two ("Two nodes (TP 16)")
            d = deployment("h100-sxm", m, 16, precision="fp8")
            fit = f"{d.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU, {d.kv_capacity_tokens:,} KV tokens (TP 16)"
        except ValueError:
            need = Deployment(Node(GPUS["h100-sxm"], 16, 16), m, "fp8").weight_bytes_per_gpu / 2**30
            fit = f"does not fit ({need:.1f} GiB of weights per GPU at TP 16)"
        rows.append(f"| {m.name} | 2 x 8x {GPUS['h100-sxm'].name} | {fit} |")
    v3, k2 = MODELS["deepseek-v3"], MODELS["kimi-k2"]
    kt_min, kt_pre = kt.DECODE_FIT_MIN_TOKENS, kt.PREFILL_FIT_MIN_PROMPT
    mla_rows, moe_rows = measured_kernel_rows()
    tp_dep = deployment("h200-sxm", v3, 8, precision="fp8")
    dp_dep = deployment("h200-sxm", v3, 8, precision="fp8", dp_attention=True)
    tp_kv, dp_kv = tp_dep.kv_bytes_per_token_per_gpu, dp_dep.kv_bytes_per_token_per_gpu
    tp_cap, dp_cap = tp_dep.kv_capacity_tokens, dp_dep.kv_capacity_tokens
    tp_w, dp_w = tp_dep.weight_bytes_per_gpu / 2**30, dp_dep.weight_bytes_per_gpu / 2**30
    ds_source, ds_policy, ds_table, ds_summary = deepseek_parts(deepseek)
    r = mla_ratios()
    return f"""## MLA and large MoE models

Sources: DeepSeek-V2 paper (arXiv:2405.04434, section 2.1: multi-head latent attention and its absorbed
form), DeepSeek-V3 technical report (arXiv:2412.19437: 671B total, 37B activated, 61 layers, 256 routed
experts of which 8 per token plus 1 shared, FP8 weights), the `config.json` of `deepseek-ai/DeepSeek-V3`
and `moonshotai/Kimi-K2-Instruct` (every shape below; the values are quoted beside the presets in
`batching/sim/hardware/specs.py`), DeepSeek-V3's `README_WEIGHTS.md` (36.6B activated parameters counting the output
head but not the input embedding lookup; the MTP module's 11.5B more), and the FlashMLA README
(deepseek-ai/FlashMLA: 3,000 GB/s memory-bound, 580 TFLOPS compute-bound on H800 SXM5).

- KV cache: one latent of `kv_lora_rank` elements plus one shared RoPE key of `qk_rope_head_dim` per token and
  layer, whatever the number of heads: DeepSeek-V3 and Kimi-K2 in BF16 (512 + 64) × 61 × 2 =
  {v3.kv_bytes_per_token():,.0f} bytes per token (Qwen2.5-72B's GQA: 327,680). Under tensor parallelism every
  rank holds the whole latent (vLLM's and SGLang's MLA backends replicate it; SGLang's DP attention does not),
  so a GPU holds {v3.kv_bytes_per_token():,.0f} bytes per token at any TP degree. An FP8 KV cache halves it.
  For the whole model that is 7.3x less than Llama-3.1-405B's GQA cache (516,096 bytes), but at TP 8 the GQA
  model splits its 8 KV heads over the ranks (64,512 bytes per GPU) while MLA keeps the whole latent on each:
  per GPU the two hold and read about as much per token.
- Parameters: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj per layer; routed experts, the
  shared expert and the router in the layers with experts, a dense MLP of `intermediate_size` in the first
  `first_k_dense_replace` layers. DeepSeek-V3: {v3.num_params / 1e9:.1f}B total (published 671B),
  {v3.active_params / 1e9:.2f}B active with the input embedding, {(v3.active_params - v3.embedding_params) / 1e9:.2f}B
  without it (published 37B; 36.6B in README_WEIGHTS.md). Kimi-K2: {k2.num_params / 1e12:.3f}T total
  (published "1T"), {k2.active_params / 1e9:.2f}B active with the input embedding,
  {(k2.active_params - k2.embedding_params) / 1e9:.2f}B without it (published "32B"). The MTP module is not
  counted (vLLM loads it only for speculative decoding).
- Weights: FP8 as published; embeddings, LM head and norms in BF16. At TP 8 on one node, and TP 16 over two H100 nodes:

| model | node | FP8 weights |
|---|---|---|
{chr(10).join(rows)}

- Measured kernels (issue 23): NVIDIA aiconfigurator 0.12.0's per-op database of vLLM 0.24.0's kernels on H100 SXM,
  H200 SXM and B200 (Apache-2.0; `batching/data/aic_*.csv`, extracted by `tools/extract_moe_tables.py`, sources in
  `batching/data/README.md`). Where it covers the deployment (`kernel_tables.measured_terms`), a step's
  - routed experts per layer are the measured MoE op (permutation, grouped gate/up and down GEMMs of the FP8
    block-scaled or BF16 or NVFP4 experts, activation, un-permutation) at the step's token count, log-log
    interpolated between the measured counts (1 to 16,384 tokens), proportional beyond; routing as
    aiconfigurator's DeepSeek model draws it (power law, alpha 1.01), averaged over the layers (3 of DeepSeek-V3's
    61 are dense); expert TP = tp, or expert parallelism (`--ep`, = tp) with whole experts on each GPU;
  - MLA decode attention is the decode module's seconds per cached token read, the least-squares slope over
    context of its latency (batches reading at least {kt_min:,} tokens), at the GPU's heads per GPU;
  - MLA prefill attention is the prefill module's seconds per causal query-key pair (the quadratic term of a
    least-squares fit over prompts of at least {kt_pre:,} tokens);
  - the rest of the linear layers (MLA projections, shared expert, router, dense layers' MLPs) stays on the
    fitted roofline (FLOPs of those parameters, their weight reads every step): aiconfigurator's GEMM tables time
    FP8 block-scaled GEMMs eagerly (a 57 us floor for the smallest GEMM, quantisation included), which does not
    describe CUDA-graph decode steps, so they are not used.
  Uncovered combinations (Mixtral's experts, FP8 Qwen3-30B-A3B split over 4 or 8 GPUs, custom GPUs, A100, dense
  models in NVFP4) keep the roofline below and say `calibrated: false` with the reason (`calibration_note` in the
  summary and JSON, a `# not calibrated: ...` line on the command line; `kernel_tables.calibration_status`).

MLA fits, DeepSeek-V3 shapes at TP 8 (16 heads per GPU), per layer and GPU:

| GPU | KV cache | decode: per cached token | as bandwidth of the latent | prefill: per query-key pair | as FLOP rate (non-absorbed FLOPs) |
|---|---|---|---|---|---|
{chr(10).join(mla_rows)}

The measured prefill module reaches {r["prefill_lo"]:.0%}-{r["prefill_hi"]:.0%} of the BF16 peak in these units
(FlashAttention-3-class kernels, beyond the {cm.ATTN_PREFILL_EFF:.0%} of FlashAttention-2 the GQA models keep). An FP8
latent takes {r["fp8_lo"]:.0%}-{r["fp8_hi"]:.0%} of a BF16 one's decode time, not always half.

DeepSeek-V3's linear layers per layer at TP 8 on H200 (FP8): the measured routed experts, the whole linear time
with them, and the previous roofline (uniform routing, every touched expert's weights read at the fitted
bandwidth):

| tokens | routed experts of one MoE layer (measured) | linear, measured experts | linear, roofline | change |
|---|---|---|---|---|
{chr(10).join(moe_rows)}

- Roofline (no measured table): FLOPs of the active parameters per token; weight reads of attention, routers, the
  shared expert and the dense layers' MLPs every step, plus the routed experts the step's tokens touch (uniform
  routing), averaged over the layers. Decode attention: per cached token and layer, the latent's bytes at
  {cm.ATTN_DECODE_MEMORY_EFF:.0%} of HBM bandwidth or 2 · (2 · kv_lora_rank + qk_rope_head_dim) FLOPs per head on
  the GPU's heads at {cm.MLA_DECODE_COMPUTE_EFF:.0%} of the BF16 peak (FlashMLA), whichever is slower. Prompt
  attention (non-absorbed form): 2 · heads · (qk_nope + qk_rope + v_head_dim) FLOPs per query-key pair per layer
  at {cm.ATTN_PREFILL_EFF:.0%} of the BF16 peak.
- Layouts: `--ep N` (N = tp) spreads whole experts over the group (same weight bytes per GPU; the measured EP
  table; the all-reduces stay, as vLLM's TP+EP without DeepEP). `--dp-attention` (SGLang's DP attention, dp = tp):
  each GPU runs every head for its own share of the sequences and holds only their KV, so a token costs
  kv_bytes / tp per GPU ({dp_kv:,.0f} B for DeepSeek-V3 instead of {tp_kv:,.0f}) and the group holds
  {dp_cap:,} tokens on 8xH200 in FP8 instead of {tp_cap:,}, while each GPU keeps the whole attention weights
  ({dp_w:.1f} GiB per GPU instead of {tp_w:.1f}); the attention modules run at all heads on 1/tp of the sequences; one
  all-gather + reduce-scatter per layer (the bytes of one all-reduce) replaces TP's two all-reduces.
- NVFP4 (`precision="nvfp4"`, B200 only: others refuse it): 4-bit weights with one FP8 scale per 16 (0.5625 bytes
  per weight; NVIDIA's NVFP4 blog, 2025-06-24), an FP8 KV cache (ModelOpt's NVFP4 exports), linear layers at B200's
  9 PFLOP/s dense FP4 (HGX B200 datasheet: 144 PFLOPS sparse for 8 GPUs); DeepSeek-V3's NVFP4 experts are
  measured on B200, dense models' FP4 GEMMs are not (`calibrated: false`).

Custom models: a Hugging Face `config.json` of `DeepseekV2ForCausalLM` or `DeepseekV3ForCausalLM` (Kimi-K2's
too, `model_type` `kimi_k2`) loads as an MLA model (`--model-json`, the dashboard's form): `kv_lora_rank`,
`q_lora_rank` (null = no query bottleneck), `qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`,
`n_shared_experts`, `first_k_dense_replace` and `intermediate_size` (the dense layers' MLP) besides the usual
keys; experts in only every `moe_layer_freq`-th layer are refused. `python -m batching specs --model M --gpu G
--tp T --precision P [--kv-dtype fp8] [--json]` prints what fits and how much KV cache (the Model and hardware
page shows the same figures).

Checked against published serving runs ({ds_source}; nothing in the cost model was fitted to any DeepSeek serving
figure, so every point is a check): DeepSeek-V3 (R1-0528 has its shapes) in FP8 on 8xH200 at TP 8, 1,024-token
prompts and outputs, N closed-loop clients, policy `{ds_policy}` (SGLang's prefill batches pause decoding). TPOT
is the simulator's median against the published mean; "before" is the roofline of the previous commit;
aiconfigurator's estimate is its static-batch TPOT for the same setting (SGLang 0.5.14 database).

{ds_table}

{ds_summary}

What the simulator leaves out at large batches: (1) the MLA projections
and the shared expert at decode sizes are priced by the roofline of their weight reads, with no kernel floors; the
measured decode module's part that does not grow with context is {r["fixed_s"] * 1e6:.0f} us per layer plus
{r["per_seq_s"] * 1e9:.0f} ns per sequence on H200 ({61 * r["fixed_s"] * 1e3:.1f} ms a step), more than the published
8-client step leaves beside the routed experts, so the tables' fixed part (timed without CUDA graphs) is not used
and nothing replaces it; (2) SGLang's per-step CPU work (scheduling 64 requests, `--stream-interval 10`
detokenisation), which the engine profiles (issue 23 item 2) carry, not these tables; (3) SGLang 0.5.14's fused
MoE kernels, which ran, are mostly slower than vLLM 0.24.0's priced here ({r["moe64_sglang"] * 1e3:.3f} against
{r["moe64_vllm"] * 1e3:.3f} ms per layer at 64 tokens on H200; `cost_model(..., kernels="sglang")` prices them:
{r["step64_change"]:+.0%} on a 64-sequence decode step at 1,400 tokens of context).

Not calibrated: TP/EP 16 across two nodes (a node holds at most 8 GPUs here); the all-to-all of DeepEP (the
aiconfigurator tables have it for EP 8 on H200 only); expert load imbalance beyond the measured power-law
routing; the MTP module's cost; the re-decompression of earlier context during chunked MLA prefill; the
attention projections' and shared expert's FP8 block-scaled GEMMs at decode sizes (roofline, see above).

"""


_EXAMPLE_NOT_RUN = "(the example was not run: `python -m batching calibrate --report` runs it)"


def _faster(off_s: float, on_s: float) -> str:
    """'8.28 → 5.46 ms (1.52×)': a time without and with speculation, and the speed-up."""
    return f"{off_s * 1e3:.2f} → {on_s * 1e3:.2f} ms ({off_s / on_s:.2f}×)"


def _mtp_sentence(mtp: dict | None) -> str:
    """The MTP example's figures (batching.studies.spec_examples.mtp_example), or a note that it was not run."""
    if not mtp:
        return _EXAMPLE_NOT_RUN
    return (f"TPOT P50 {_faster(mtp['split_off_s'], mtp['split_on_s'])} on 1 prefill TP 8 + 1 decode TP 8 (two "
            f"nodes), {_faster(mtp['agg_off_s'], mtp['agg_on_s'])} aggregated on TP 8 (policy continuous, the vllm "
            "engine profile; `batching/studies/spec_examples.py`)")


def spec_markdown(draft_pass_fixed_s: float, checks: str = "", mtp: dict | None = None,
                  base_tok_s: float | None = None) -> str:
    """The "Speculative decoding" section of docs/CALIBRATION.md: where its formulas and costs come from, and
    what the simulator does not model (batching/sim/engine/speculative.py). ``draft_pass_fixed_s``:
    speculative.DRAFT_PASS_FIXED_S; ``checks``: the published points' table (batching/studies/spec_check.py). The
    CLI passes both: the engine layer sits above this module. ``mtp``: the MTP example's figures
    (batching.studies.spec_examples.mtp_example). ``base_tok_s``: the simulated batch-1 throughput without
    speculation at the fit's setting (spec_check.baseline_tok_s)."""
    share = f"{mtp['split_draft_share']:.0%}" if mtp else "a share"
    base = f"{base_tok_s:.0f} tok/s" if base_tok_s else "below SGLang's (not simulated here)"
    return f"""## Speculative decoding

Sources: Leviathan et al., ICML 2023, "Fast Inference from Transformers via Speculative Decoding" (expected
tokens per verification (1 − A^(K+1)) / (1 − A) for a per-token acceptance A and K draft tokens); the vLLM blog
"How Speculative Decoding Boosts vLLM Performance by up to 2.8x" (2024-10-17; Llama-3-70B on 4×H100: at QPS 1 up
to 1.5× faster with a draft model on ShareGPT and 2.8× with n-gram lookup on CNN/DailyMail, at high QPS 1.4× and
1.8× slower; the KV cache manager holds the draft's cache too); EAGLE (Li et al., ICML 2024, arXiv:2401.15077: a
draft head of one decoder layer and a fusion layer on the target's features, reusing its embedding and LM head;
acceptance about 0.8); the DeepSeek-V3 technical report (arXiv:2412.19437, §2.2: an MTP module is one
Transformer block, a 2d→d projection and the shared head; §5.4.3: the second token is accepted 85–90 % of the
time, 1.8× tokens per second); MagicDec (Chen et al., arXiv:2408.11049, ICLR 2025: at large batch and long
context decoding stays memory-bound on KV reads, so speculation keeps paying); vLLM PR #4592
(`speculative_disable_by_batch_size`); EAGLE-3 (Li et al., arXiv:2503.01840v3, Tables 3 and 4); the SGLang
documentation's "Speculative Decoding" page; sgl-project/sglang PR #4247; vllm-project/vllm issue #26191.

- A speculating sequence verifies k + 1 tokens per step (k = K, fewer near the end of its output or of the
  token budget): they are tokens of the step for the linear layers (memory-bound at small batch,
  compute-bound at large), the LM head scores all k + 1, and attention reads the context once for the k + 1
  queries (a multi-query kernel: ~32 FLOP/byte, bandwidth-bound on every GPU here).
- Accepted draft tokens per sequence and step are drawn with P(≥ j) = A^j, capped at k, from the run's seed;
  the sequence emits accepted + 1 tokens. Rejected ones are computed for nothing (`padded_tokens`), so
  `gpu_util` counts them as waste. `--spec-acceptance-length L` gives the acceptance as vLLM ("mean acceptance
  length") and SGLang ("accept length") report it, tokens per verification step with the bonus token: the
  simulator solves (1 − A^(K+1)) / (1 − A) = L for A by bisection (L from 1 to K + 1).
- Proposals: `draft` runs the draft model's own cost model (its TP the target's when it divides the draft's heads,
  else 1); `eagle` and `mtp` run one target layer and a 2·hidden² fusion layer with the target's LM head; `ngram`
  costs nothing. As vLLM V1's EAGLE proposer and SGLang's EAGLE worker run it, a step's proposer makes K passes:
  the first over every prompt token the step computes (a draft model prefills the prompt; a head runs over every
  scheduled token, with its own share of the prompt attention) and, per speculating sequence, the tokens its
  verification accepts plus one (the catch-up: SGLang's draft extend, vLLM's first proposer pass); the other
  K − 1 over one token per sequence. Every pass costs its linear layers, element-wise ops, two all-reduces per
  layer from the measured table at the draft's TP degree, a read of its own KV, its LM head and a fixed
  {draft_pass_fixed_s * 1e3:.2f} ms (launch, top-k sampling and the next pass's inputs). A draft model's weights
  and KV cache (an EAGLE/MTP head's one layer) come out of the target's KV cache.
- The fixed cost per draft pass is fitted (`batching/studies/spec_check.py`, `fit_draft_fixed`: least squared
  log error, 10 µs grid) to SGLang's batch-1 throughput of Llama-3.1-8B-Instruct on one H100 on MT-bench (the
  SGLang docs' 158.34 tok/s without speculation, 244.10 with EAGLE-2 and 373.25 with EAGLE-3, at the acceptance
  lengths 3.76 and 5.39 of the 8-step runs in SGLang PR #4247; that PR's 5-step EAGLE-3 run, 361.70 tok/s at 4.68).
  It is then checked on EAGLE-3 paper Table 3 (SGLang v0.4.4, same model and GPU, a chain of 3 draft tokens,
  batch 2 to 64), never fitted to it. That table gives no acceptance length; the same draft measured 3.53 tokens
  per verification with 7 draft tokens in vLLM (issue #26191), A = 0.743, i.e. 2.71 with 3. Prompt 160 and output
  400 tokens stand for MT-bench (not published with the figures); closed-loop clients stand for the batch size.
- Before this fit (no fixed cost, the same passes) the held-out median error was 32.9 % (worst 46.2 %, batch 32),
  too optimistic everywhere: the issue's "43 % median" group. After it: see the table. The fixed cost absorbs
  what else the engine spends per pass at that version (SGLang v0.4.3-0.4.4 ran EAGLE with top-k 8 trees and
  without overlapped scheduling) and it leans on the target's step: the simulated batch-1 throughput without
  speculation is {base} against SGLang's 158.34 (the default vllm engine profile's per-step CPU time; an
  SGLang engine profile would shorten it and the fit must then be redone: `fit_draft_fixed` reruns it).
- Tree drafting (SGLang's `--speculative-eagle-topk` / `--speculative-num-draft-tokens`) is not modelled: the
  published acceptance lengths already carry the tree's gain, and at batch 1 on an 8B model verifying 64 tree
  tokens instead of K + 1 costs little (the linear layers stay memory-bound below ~300 tokens per step on H100);
  at batch 32 and more the tree's verified tokens would be compute-bound, which is why SGLang and the EAGLE-3
  paper run chains there (Table 3: chain of 3). A run that uses a tree at large batch is priced as a chain here.
- On a prefill/decode split (see "Prefill/decode disaggregation") the decode instances speculate with the Spec
  of their own deployment (their TP; their KV cache less the proposer's share) and the prefill instances run only
  the proposer's pass over the prompt, whose KV moves with the target's. DeepSeek-V3 FP8 on H200, MTP K = 1,
  A = 0.85 (1.85 tokens per verification), chat traffic at 0.5 req/s, 200 requests: {_mtp_sentence(mtp)}. The
  DeepSeek-V3 report's 1.8× tokens per second (§5.4.3) names no batch, parallelism or engine, so it is not held
  against these figures; the gap to 1.85 tokens per verification is the MTP pass ({draft_pass_fixed_s * 1e3:.2f} ms
  fixed + its MoE layer: {share} of the decode steps' time on the split) and the second verified token reading
  more experts.
- Not modelled: vLLM V0's scoring without a multi-query kernel; the draft's catch-up while speculation is
  switched off by `speculative_disable_by_batch_size`.
  The high-load slow-downs of the vLLM blog (draft 1.4×, n-gram 1.8× slower) are not held against the model
  (their acceptance is not published).
{checks}
"""


def _eagle_split_sentence(ex: dict | None) -> str:
    """The EAGLE-on-a-split example's figures (batching.studies.spec_examples.eagle_split_example)."""
    if not ex:
        return _EXAMPLE_NOT_RUN
    return (f"TPOT P50 {_faster(ex['tpot_off_s'], ex['tpot_on_s'])}, TTFT P50 {ex['ttft_off_s'] * 1e3:.1f} → "
            f"{ex['ttft_on_s'] * 1e3:.1f} ms (the head's pass over the prompt), KV per instance "
            f"{ex['kv_off_tokens']:,} → {ex['kv_on_tokens']:,} tokens (policy continuous, 200 requests, the vllm "
            "engine profile)")


_PD_CHECKS = {  # the disaggregated published points (batching/data/published_points.csv) the section quotes
    "vllm": ("vllm-pr18242-pd-", (("TTFT mean", "ttft-mean"), ("median", "ttft-median"), ("P95", "ttft-p95"))),
    "dynamo": ("dynamo402-70b-pd-", (("TTFT mean", "ttft-mean"), ("P90", "ttft-p90"), ("P99", "ttft-p99"),
                                     ("ITL", "itl-mean"), ("output throughput", "tput"))),
}


def _pd_checks_text(errors: dict | None) -> tuple[str, str, str]:
    """(vLLM PR #18242's errors, Dynamo #402's errors, the medians sentence) from the published points' errors
    (``errors``: id -> simulated / measured - 1), or texts saying they were not run."""
    if not errors:
        missing = "(not run: `python -m batching calibrate --report` runs them)"
        return missing, missing, "Medians: not run"

    def part(key: str) -> str:
        prefix, items = _PD_CHECKS[key]
        return ", ".join(f"{name} {errors[prefix + i] * 100:+.1f} %" for name, i in items)
    tpot = [v for k, v in errors.items() if k.startswith(_PD_CHECKS["vllm"][0] + "tpot")]
    ttft = [abs(v) for k, v in errors.items() if "-pd-ttft" in k]
    inter = [abs(v) for k, v in errors.items() if "-pd-tpot" in k or "-pd-itl" in k]
    vllm = part("vllm") + f", TPOT {min(tpot) * 100:+.1f} to {max(tpot) * 100:+.1f} %"
    medians = (f"Median |error| over the TTFT figures {np.median(ttft):.0%}, over TPOT/ITL {np.median(inter):.0%}: "
               f"{'within' if max(np.median(ttft), np.median(inter)) <= 0.30 else 'not within'} the issue's 30 % as "
               f"medians{', not every figure' if max(ttft + inter) > 0.30 else ''}")
    return vllm, part("dynamo"), medians


def _drift_text(drift: dict | None) -> str:
    """What fixed output lengths do to Dynamo's P90 TTFT (batching.studies.published.dynamo_drift's figures)."""
    head = ("fixed lengths keep the 32 simulated clients in lockstep (P90 ≈ mean, where real clients drift apart: "
            "see the closed-loop note under \"Published points\")")
    if not drift:
        return head
    return (head + f", though drifting clients (outputs of 0.8-1.2x) only move the simulated P90 from "
            f"{drift['fixed_p90_s'] * 1e3:,.0f} to {drift['drift_p90_s'] * 1e3:,.0f} ms against the published "
            f"{drift['measured_p90_s'] * 1e3:,.0f} ms: most of the P90's gap is not lockstep and is not explained "
            "here")


def disagg_markdown(eagle: dict | None = None, errors: dict | None = None, drift: dict | None = None) -> str:
    """The "Prefill/decode disaggregation" section of docs/CALIBRATION.md: its sources and link speeds, and what
    the simulator does not model (batching/sim/topology/disagg.py). ``eagle``: the EAGLE-on-a-split example's
    figures (batching.studies.spec_examples.eagle_split_example); ``errors``: the published points' errors by id
    (batching.studies.published.published_errors); ``drift``: batching.studies.published.dynamo_drift's figures."""
    pd_vllm, pd_dynamo, pd_medians = _pd_checks_text(errors)
    return """## Prefill/decode disaggregation

Sources: DistServe (Zhong et al., OSDI 2024, "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized
Large Language Model Serving": prefill and decode interfere when batched together, so separate instances with
their own parallelism meet a tight TPOT SLO at a higher rate); Splitwise (Patel et al., ISCA 2024, "Splitwise:
Efficient Generative LLM Inference Using Phase Splitting": the prompt's KV moves to the token-generation machine
over the node's or cluster's links); NVIDIA's H100 SXM datasheet (NVLink 900 GB/s per GPU, 450 GB/s each way: the
GPU presets' `nvlink_Bps`); the DGX H100 user guide (eight ConnectX-7 400 Gb/s ports, one per GPU, for the compute
network: `CROSS_NODE_GBPS`).

- The client's path is vLLM's disaggregated serving (a router sends the prompt to a prefill instance with
  `max_tokens=1` and `kv_transfer_params.do_remote_decode`, then the whole request to a decode instance, which pulls
  the KV over its NixlConnector and streams every token; vLLM `examples/online_serving/disaggregated_serving`, and
  the P/D proxies that copy it). So TTFT, as the client sees it, is the prefill instance's queue and prefill, the KV
  transfer, the wait for room on a decode instance and the decode instance's first step, which computes the last
  prompt token again (its KV is not transferred) and samples the first token the client gets. The prefill
  instance's own token is not sent. TPOT, ITL and E2E are the decode instance's.
- A transfer takes a fixed 6.7 ms (`KV_TRANSFER_FIXED_S`, `--kv-transfer-fixed-ms`) to post before its bytes
  move: vLLM's NixlConnector posts one read per KV block and layer, and the decode side's KV-transfer metrics of a
  3-prefill + 1-decode deployment measured 6.7 ms of post time per transfer on average (1,785 descriptors and
  167 MB per transfer, block size 64, 1,000 requests; vllm-project/vllm issue #50913, 2026-08-28, baseline
  column). Then prompt tokens × the KV bytes per token the busiest GPU moves (a dense model's KV heads split over
  min(prefill TP, decode TP) ranks; an MLA model's whole latent on every rank, as vLLM's and SGLang's MLA
  backends replicate it under TP) / the link's bandwidth per GPU: NVLink within a node, 400 Gb/s per GPU across
  nodes, or `--kv-link-gbps` per GPU.
- A request goes to the prefill instance with the fewest outstanding requests and, after the transfer, to the
  decode instance with the most free KV blocks; it waits in that instance's queue until its blocks fit
  (backpressure, nothing dropped).
- Effect (Llama-3.1-70B FP8 on 8×H100, 1 prefill TP 4 + 1 decode TP 4, chunked, 3,000 prompt / 150 output tokens,
  2 req/s, 300 requests): TTFT P50 154.5 → 182.1 ms, P99 443.3 → 472.3 ms; TPOT P50 11.4 → 11.3 ms; transfer P50
  0.5 → 7.2 ms. Where TTFT used to end on the prefill instance, it now carries the transfer, the decode queue and
  one decode step, as the client measures it. The same vLLM thread measured the whole handover (prefill's token →
  the client's first token) at ~197 ms P50 on its setup, of which the transfer ~29 ms and the recomputed first
  token ~58 ms including the wait for a step boundary: here the handover is the transfer, the decode queue and one
  decode step (on this example 7.2 + 5.3 ms + a step of ~11 ms); the rest of that 197 ms (the router sending the
  decode request only after the prefill response returns, a second step boundary before the pulled KV is used)
  is engine overhead this model leaves out.
- Speculative decoding (DeepSeek MTP + PD, EAGLE, a draft model, n-gram): the decode instances speculate as a
  replica of their deployment does (speculative.spec_for at the decode TP, a KV cache less the proposer's weights
  and KV). The prefill instances do not speculate (they emit one token), but a proposer with GPU passes runs its
  first pass over the prompt there: SGLang launches the prefill server with the same `--speculative-algorithm`
  (sgl-project/sglang issue #6684's MTP + PD commands), runs the draft's extend after the prefill, and its prefill
  queue registers the draft model's KV pool with the target's for the transfer
  (`python/sglang/srt/disaggregation/prefill.py`, `PrefillBootstrapQueue._init_kv_manager`: "We should also
  transfer draft model kv cache"; PR #7242 sends MTP's hidden states as well). So the prefill instances price the
  proposer over each prompt token (`prefill_draft_time_share`), their KV cache shrinks by its share too, and a
  transfer moves the proposer's KV bytes per token with the target's (DeepSeek-V3's MTP module: 1 +
  `head_layers`/61 of the latent's 70,272 B). The decode instance's first step runs the proposer over its one
  recomputed token. Llama-3.1-8B on H100, 1 prefill TP 1 + 1 decode TP 1, EAGLE K = 3, A = 0.7, chat at
  0.5 req/s: """ + _eagle_split_sentence(eagle) + """. No published PD + speculation measurement with its settings was
  found to hold these against; the decode side's speed-up is the aggregated model's (table above).
- The prefill instance keeps a request's KV blocks from its handoff until a decode instance has taken the
  request in: through the transfer and any wait for room on the decode side (vLLM's decode side reads the KV
  only once it has allocated blocks for it, and the prefill frees its blocks when the read is reported done,
  NixlConnector's delayed free; SGLang's prefill sends into blocks the decode side preallocated and frees its own
  when the transfer succeeds). So slow transfers fill the prefill's cache, and decode backpressure reaches it.
  Llama-3.1-8B on H100, 1 prefill TP 1 + 1 decode TP 1, 30,000 KV tokens per instance: 3,000 / 150 tokens at
  4 req/s over 1 Gb/s per GPU (3.15 s a transfer): the prefill queue's median wait 0 → 12.5 s, TTFT P50
  3.25 → 16.0 s, the prefill KV peak 155 → 1,820 of 1,875 blocks (at 10 Gb/s no wait). 1,000 / 1,000 tokens at
  8 req/s (decode-bound): the decode queue's median wait 42.2 → 19.2 s and the prefill queue's 0 → 28.3 s (P90
  0.02 → 83.7 s), the prefill KV peak 189 → 1,848 blocks, TTFT P50 42.3 → 46.3 s: the queue moves to the prefill
  side, as with vLLM's pull. At NVLink or 400 Gb/s speeds with room on the decode side a hold lasts a transfer
  and one decode step boundary.
- Closed-loop clients and sessions run on a split: a client sends its next request a think time after the decode
  instance streamed its last token (the published disaggregated runs are mostly fixed-concurrency: genai-perf,
  aiperf, `vllm bench serve --max-concurrency`). Held against two published runs kept aside ("Published points",
  group `disaggregation`): vLLM PR #18242's 1P1D Llama-3.1-8B (8,000 / 200 tokens at 3.6 req/s): """ + pd_vllm + """;
  Dynamo issue #402's 4×TP 1 prefill + 1×TP 4 decode Llama-70B FP8 with 32 clients (3,000 / 150 tokens):
  """ + pd_dynamo + """ (32 clients send faster when each request is quicker). """ + pd_medians + """. Where the
  rest goes: the simulated TTFT lacks a handover term the sources measure (the vLLM thread above: ~110 ms of
  its 197 ms handover is orchestration; PR #18242's comment reports ~30 ms of connector overhead for 10,000
  tokens against the model's 9.6 ms; Dynamo's minimum TTFT is 538 ms against the simulated 400 ms), """ + \
        _drift_text(drift) + """, and Dynamo's decode steps ran ~19 ms against the simulated 13 ms
  (its vLLM 0.7 V0 engine; a candidate named by vLLM PR #35264 is the connector posting reads inside the
  decode step). Nothing was fitted to these runs.
- The pull starts when the decode instance's scheduler next runs: vLLM's decode engine takes the request in at a
  schedule call (a step boundary; at once when idle), allocates its blocks and has its worker start the read with
  the step it launches (`start_load_kv`); the finished read is reported at the end of the step it completes in and
  the request runs from the next (`kv_pull_wait_s` per request, `kv_pull_wait_p50_s`). On PR #18242's setting
  above this adds 5.6 ms (P50) before each transfer and leaves 2.3 ms instead of 5.0 ms of decode queue after it
  (a 9.0 ms transfer ends inside the 11.7 ms step it started with): TTFT mean 238.7 -> 241.6 ms (-23.0 % -> -22.0 %).
- Not modelled: the decode-side blocks held through the transfer (allocated before the pull in vLLM; here at the
  admission after it) and the order under decode backpressure (vLLM waits for room, then pulls; here the transfer
  goes first and the wait for room follows, so a full decode instance overlaps the two), contention between
  transfers on one link,
  layer-wise pipelining of the transfer with the prefill, and the MTP/EAGLE hidden states sent with the KV (a few KB
  per request).
- With prefix caching each decode instance keeps its own cache (the prompts it took in, the outputs it computed),
  and a transfer moves only the prompt tokens its decode instance does not hold: vLLM's decode side looks the
  prompt up before it pulls (NixlConnector's `get_num_new_matched_tokens`: the tokens past its local hits; a full
  hit pulls nothing). The decode instance is picked at the prefill's release (the most free KV then) and looked up
  then (`decode_cached_tokens` per request and in the summary). Multi-turn sessions gain most: a later turn's
  prompt holds the earlier turns' outputs, which only the decode side computed. Effect, 600 requests, chunked:
  `chat` with a 2,048-token system prompt on Qwen2.5-72B, 1×TP 4 + 1×TP 4 at 2 req/s: the decode instance's KV
  peak 4,151 → 2,084 blocks (64 % of prompt tokens not moved); `chat-sessions` on Llama-3.1-8B, 2×TP 1 + 2×TP 1
  over 10 Gb/s per GPU at 4 req/s: transfer P50 21.9 → 13.6 ms, TTFT P50 45.1 → 38.3 ms, P99 378 → 266 ms (52 %
  not moved: two decode instances picked by free KV, not by session).

"""

