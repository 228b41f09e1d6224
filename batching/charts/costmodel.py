"""Plotly figures of the cost model: step-time breakdowns, KV capacity, calibration (no Streamlit).

Every builder returns a ``go.Figure`` in the shared template (``charts.TEMPLATE``), with a
title, a subtitle saying how to read it, and axis titles with units. Times are shown in
milliseconds per step or microseconds per layer.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.sim.hardware import costmodel as cm
from batching.charts.legend import SIDE_LEGEND
from batching.charts.policy import SERIES_COLORS, TEMPLATE, TOP_MARGIN_SUBPLOTS, _title, log_axis
from batching.charts.text import literal
from batching.sim.hardware.specs import GIB, Deployment

# the stacked parts, in drawing order: step_breakdown's names grouped for reading
PART_GROUPS = {
    "linear layers": ("linear",),
    "element-wise": ("elementwise",),
    "attention": ("prompt attention", "decode attention"),
    "all-reduce": ("all-reduce",),
    "LM head": ("lm head",),
    "swap": ("swap",),
    "fixed overhead": ("fixed overhead", "per-sequence CPU", "prefill launch"),  # the engine profile's CPU time
}
PART_COLORS = {"linear layers": "#4C78A8", "element-wise": "#9ECAE9", "attention": "#F58518",
               "all-reduce": "#54A24B", "LM head": "#B279A2", "swap": "#BAB0AC", "fixed overhead": "#E45756"}
GPU_COLORS = {2: "#4C78A8", 4: "#F58518", 8: "#54A24B"}
TP_COLORS = {1: "#B279A2", 2: "#4C78A8", 4: "#F58518", 8: "#54A24B"}


def _grouped(parts: Sequence[dict]) -> dict[str, np.ndarray]:
    return {g: np.array([sum(p[k] for k in keys) for p in parts]) for g, keys in PART_GROUPS.items()}


def _stacked(fig: go.Figure, x, groups: Mapping[str, np.ndarray], xlabel: str, **cell) -> None:
    for name, y in groups.items():
        if not np.any(y > 0):
            continue
        fig.add_trace(go.Scatter(x=x, y=y * 1e3, name=name, mode="lines", stackgroup="one",
                                 line=dict(width=0.5, color=PART_COLORS[name]),
                                 hovertemplate=f"{xlabel} %{{x:,}}<br>{name}: %{{y:.2f}} ms<extra></extra>"), **cell)


def _ridge(fig: go.Figure, x: float, text: str, xmin: float, xmax: float) -> None:
    """A dashed vertical line at the ridge (log x axis), labelled, when it falls in the shown range."""
    fig.update_xaxes(range=[np.log10(xmin), np.log10(xmax)])
    if not (np.isfinite(x) and xmin <= x <= xmax):
        return
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                  line=dict(color="#262730", width=1.5, dash="dash"))
    # a short label (on up to three lines) beside the line, on the side with more room, inside the plot: a one-line
    # label ran over the y tick labels or into the legend in a half-width column
    fig.add_annotation(x=np.log10(x), y=1.0, xref="x", yref="paper", text=text, showarrow=False,
                       xanchor="left" if x < np.sqrt(xmin * xmax) else "right", yanchor="top", align="left",
                       xshift=4 if x < np.sqrt(xmin * xmax) else -4, font=dict(size=11),
                       bgcolor="rgba(255,255,255,0.7)")


def decode_breakdown(costs: cm.CostModel, context_tokens: float, batch_sizes: Sequence[int]) -> pd.DataFrame:
    """Seconds per part of one decode step of b sequences, each reading ``context_tokens`` of KV."""
    rows = []
    for b in batch_sizes:
        parts = cm.step_breakdown(costs, int(b), 0.0, float(b) * context_tokens, int(b))
        rows.append({"batch": int(b), **parts})
    return pd.DataFrame(rows)


def prefill_breakdown(costs: cm.CostModel, prompt_lengths: Sequence[int]) -> pd.DataFrame:
    """Seconds per part of one step that prefills a whole prompt of each length (no other work)."""
    rows = []
    for n in prompt_lengths:
        parts = cm.step_breakdown(costs, int(n), cm.prompt_attn_work(n, 0), 0.0, 1)
        rows.append({"prompt_tokens": int(n), **parts})
    return pd.DataFrame(rows)


def step_vs_batch(costs: cm.CostModel, context_tokens: float, batch_sizes: Sequence[int], label: str = "") -> go.Figure:
    """Decode step time against batch size, stacked by part, with the linear-layer ridge marked."""
    df = decode_breakdown(costs, context_tokens, batch_sizes)
    fig = go.Figure()
    fig.update_layout(template=TEMPLATE, height=430, title=_title(
        "Decode step time vs batch size" + (f" · {literal(label)}" if label else ""),
        f"b sequences decoding (b tokens), each with {context_tokens:,.0f} tokens of context; stacked by part"))
    groups = _grouped(df.to_dict("records"))
    _stacked(fig, df.batch, groups, "batch")
    # a short x title: in a half-width column a longer one was cut at both ends ("atch size")
    fig.update_layout(xaxis_title="Batch size (tokens per step, log scale)", yaxis_title="Step time (ms)",
                      hovermode="x unified")
    log_axis(fig, "x", batch_sizes)
    ridge = cm.ridge_tokens(costs)
    _ridge(fig, ridge, f"ridge ≈ {ridge:,.0f} tokens:<br>linear layers turn<br>compute-bound", min(batch_sizes),
           max(batch_sizes))
    return fig


def step_vs_prompt(costs: cm.CostModel, prompt_lengths: Sequence[int], label: str = "") -> go.Figure:
    """Time of a step that prefills one whole prompt, against its length, stacked by part."""
    df = prefill_breakdown(costs, prompt_lengths)
    fig = go.Figure()
    fig.update_layout(template=TEMPLATE, height=430, title=_title(
        "Prefill step time vs prompt length" + (f" · {literal(label)}" if label else ""),
        "One step prefilling a whole prompt, nothing else in the batch; stacked by part"))
    _stacked(fig, df.prompt_tokens, _grouped(df.to_dict("records")), "prompt tokens")
    fig.update_layout(xaxis_title="Prompt length (tokens, log scale)", yaxis_title="Step time (ms)",
                      hovermode="x unified")
    log_axis(fig, "x", prompt_lengths)
    ridge = cm.ridge_tokens(costs)
    _ridge(fig, ridge, f"ridge ≈ {ridge:,.0f} tokens:<br>compute-bound beyond", min(prompt_lengths),
           max(prompt_lengths))
    return fig


def kv_memory(dep: Deployment, mean_request_tokens: float) -> go.Figure:
    """Per-GPU memory: weights, activation reserve, KV cache, the rest; capacity in tokens and requests."""
    gpu = dep.node.gpu
    total = gpu.memory_bytes / GIB
    usable = total * dep.gpu_memory_utilization
    weights = dep.weight_bytes_per_gpu / GIB
    reserve = dep.activation_reserve_bytes / GIB
    kv = max(0.0, usable - weights - reserve)
    parts = [("weights", weights, "#4C78A8"), ("activation reserve", reserve, "#BAB0AC"), ("KV cache", kv, "#54A24B"),
             (f"kept free ({1 - dep.gpu_memory_utilization:.0%} of HBM)", total - usable, "#ECECEC")]
    cap = dep.kv_capacity_tokens
    reqs = cap / mean_request_tokens if mean_request_tokens > 0 else float("nan")
    fig = go.Figure()
    for name, gib, color in parts:
        fig.add_trace(go.Bar(y=["per GPU"], x=[gib], name=name, orientation="h", marker_color=color,
                             text=[f"{gib:.1f}"], textposition="inside",
                             hovertemplate=f"{name}: %{{x:.1f}} GiB<extra></extra>"))
    fig.update_layout(template=TEMPLATE, barmode="stack", height=300, title=_title(
        f"Memory per GPU and KV capacity: {cap:,} tokens ≈ {reqs:,.0f} concurrent requests",
        f"{literal(dep.model.name)} in {dep.precision.upper()} (KV {'FP8' if dep.kv_dtype == 'fp8' else 'BF16'}) on "
        f"{literal(gpu.name)}, TP {dep.node.tp}; requests of {mean_request_tokens:,.0f} tokens (prompt + output)"),
        xaxis_title="GiB per GPU", yaxis_title="", legend=SIDE_LEGEND)
    return fig


def op_calibration(frames: Mapping[int, pd.DataFrame], what: str = "Linear layers",
                   tolerance: float = 0.10) -> go.Figure:
    """Measured vs model per-layer time against tokens (top) and the model's error (bottom), per TP."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38])
    worst = max(float(d.error.abs().max()) for d in frames.values())
    fig.update_layout(template=TEMPLATE, height=620, hovermode="closest", title=_title(
        f"{what}: measured vs model per layer on H100 (max |error| {worst:.1%})",
        "Dots: Vidur's measured medians for Llama-2-70B; lines: the calibrated model; grey band: ±"
        f"{tolerance:.0%}"))
    for tp, d in frames.items():
        color = TP_COLORS.get(tp, SERIES_COLORS[0])
        fig.add_trace(go.Scatter(x=d.num_tokens, y=d.measured_s * 1e6, mode="markers", name=f"TP {tp} measured",
                                 legendgroup=f"tp{tp}", marker=dict(color=color, size=4, opacity=0.6),
                                 hovertemplate=f"TP {tp}: %{{x}} tokens, measured %{{y:.1f}} µs<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=d.num_tokens, y=d.model_s * 1e6, mode="lines", name=f"TP {tp} model",
                                 legendgroup=f"tp{tp}", line=dict(color=color, width=1.5, shape="hv"),
                                 hovertemplate=f"TP {tp}: %{{x}} tokens, model %{{y:.1f}} µs<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=d.num_tokens, y=d.error * 100, mode="markers", name=f"TP {tp} error",
                                 legendgroup=f"tp{tp}", showlegend=False, marker=dict(color=color, size=4),
                                 hovertemplate=f"TP {tp}: %{{x}} tokens, error %{{y:+.1f}} %<extra></extra>"),
                      row=2, col=1)
    fig.add_hrect(y0=-tolerance * 100, y1=tolerance * 100, fillcolor="#ECECEC", opacity=0.6, line_width=0, row=2, col=1)
    tokens = np.concatenate([d.num_tokens.to_numpy(float) for d in frames.values()])
    times = np.concatenate([np.r_[d.measured_s.to_numpy(float), d.model_s.to_numpy(float)] for d in frames.values()])
    for row in (1, 2):
        log_axis(fig, "x", tokens, row=row, col=1)
    fig.update_xaxes(title_text="Tokens in the forward pass (log scale)", row=2, col=1)
    log_axis(fig, "y", times * 1e6, row=1, col=1)
    fig.update_yaxes(title_text="Time per layer per GPU (µs, log)", row=1, col=1)
    fig.update_yaxes(title_text="Model error (%)", row=2, col=1)
    return fig


def allreduce_calibration(frame: pd.DataFrame, impl: str, tolerance: float = 0.15) -> go.Figure:
    """Measured vs model all-reduce latency against message size (top) and the error (bottom)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38])
    worst = float(frame.error.abs().max())
    held = float(frame.holdout_error.abs().max())
    fig.update_layout(template=TEMPLATE, height=600, title=_title(
        f"All-reduce '{impl}': measured vs model on H100 (max |error| {worst:.1%}, hold-out {held:.1%})",
        "Dots: the measured table; lines: the model's log-log interpolation; open circles: error at a size "
        f"left out of the table; grey band ±{tolerance:.0%}"))
    for tp, d in frame.groupby("num_gpus"):
        color = GPU_COLORS.get(int(tp), SERIES_COLORS[0])
        sizes = np.geomspace(d.message_bytes.min(), d.message_bytes.max(), 200)
        fig.add_trace(go.Scatter(x=d.message_bytes, y=d.measured_s * 1e6, mode="markers", name=f"{tp} GPUs measured",
                                 legendgroup=f"g{tp}", marker=dict(color=color, size=6),
                                 hovertemplate=f"{tp} GPUs: %{{x:,}} B, measured %{{y:.1f}} µs<extra></extra>"),
                      row=1, col=1)
        model = np.interp(np.log(sizes), np.log(d.message_bytes), np.log(d.model_s))
        fig.add_trace(go.Scatter(x=sizes, y=np.exp(model) * 1e6, mode="lines", name=f"{tp} GPUs model",
                                 legendgroup=f"g{tp}", line=dict(color=color, width=1.5),
                                 hovertemplate=f"{tp} GPUs: %{{x:,.0f}} B, model %{{y:.1f}} µs<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=d.message_bytes, y=d.error * 100, mode="markers", showlegend=False,
                                 legendgroup=f"g{tp}", marker=dict(color=color, size=5),
                                 hovertemplate=f"{tp} GPUs: %{{x:,}} B, error %{{y:+.1f}} %<extra></extra>"),
                      row=2, col=1)
        fig.add_trace(go.Scatter(x=d.message_bytes, y=d.holdout_error * 100, mode="markers", showlegend=False,
                                 legendgroup=f"g{tp}", marker=dict(color=color, size=7, symbol="circle-open"),
                                 hovertemplate=f"{tp} GPUs: %{{x:,}} B left out, error %{{y:+.1f}} %<extra></extra>"),
                      row=2, col=1)
    fig.add_hrect(y0=-tolerance * 100, y1=tolerance * 100, fillcolor="#ECECEC", opacity=0.6, line_width=0, row=2, col=1)
    for row in (1, 2):
        log_axis(fig, "x", frame.message_bytes.to_numpy(float), row=row, col=1)
    fig.update_xaxes(title_text="Message size (bytes, log scale)", row=2, col=1)
    log_axis(fig, "y", np.r_[frame.measured_s.to_numpy(float), frame.model_s.to_numpy(float)] * 1e6, row=1, col=1)
    fig.update_yaxes(title_text="All-reduce latency (µs, log)", row=1, col=1)
    fig.update_yaxes(title_text="Model error (%)", row=2, col=1)
    return fig


def end_to_end(frame: pd.DataFrame, tolerance: float = 0.20) -> go.Figure:
    """Model vs published SGLang v0.3.0 and vLLM v0.6.0 figures, one panel per metric."""
    metrics = list(frame.metric)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[m.split(" (")[0] for m in metrics],
                        horizontal_spacing=0.09)
    fig.update_layout(template=TEMPLATE, height=420, barmode="group", margin=dict(t=TOP_MARGIN_SUBPLOTS), title=_title(
        "End to end: Llama-3.1-70B BF16 on 4×H100 (TP 4), ShareGPT-like traffic",
        f"Simulated continuous batching vs the published SGLang v0.3.0 / vLLM v0.6.0 runs; whiskers ±{tolerance:.0%} "
        "around each published value"))
    for i, row in enumerate(frame.itertuples(index=False), start=1):
        is_time = "(s)" in row.metric
        factor, unit = (1e3, "ms") if is_time else (1.0, "tok/s")
        vals = [row.model * factor, getattr(row, "_2") * factor, getattr(row, "_3") * factor]
        names = ["model", "SGLang v0.3.0", "vLLM v0.6.0"]
        colors = ["#4C78A8", "#F58518", "#54A24B"]
        err = [0.0, vals[1] * tolerance, vals[2] * tolerance]
        fig.add_trace(go.Bar(x=names, y=vals, marker_color=colors, showlegend=False,
                             error_y=dict(type="data", array=err, visible=True, color="#6B6B6B"),
                             text=[f"{v:,.1f}" for v in vals], textposition="inside",
                             insidetextanchor="start", textfont=dict(color="white"),
                             hovertemplate=f"%{{x}}: %{{y:,.1f}} {unit}<extra></extra>"), row=1, col=i)
        fig.update_yaxes(title_text=f"{'Median TPOT' if is_time else 'Output throughput'} ({unit})", row=1, col=i)
    fig.update_annotations(font_size=12)
    return fig
