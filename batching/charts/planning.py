"""Plotly figure builders for the planning pages, Tune a knob and Capacity planning (no Streamlit here).

The conventions of ``charts``: the one shared template, a title, axis titles with units, TPOT in
milliseconds. Sweep frames are ``studies.sweeps.sweep`` output (plus ``offered_output_tok_s`` and
``kv_pressure`` where given); capacity points are ``CapacityResult.points``.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts import labels
from batching.charts.colors import policy_colors
from batching.charts.legend import SIDE_LEGEND
from batching.charts.policy import TEMPLATE, TOP_MARGIN_SUBPLOTS, _no_data, _title, log_axis
from batching.charts.text import literal
from batching.studies.capacity import CapacityResult
from batching.studies.sweeps import INT_KNOBS, KNOBS

# knob -> axis title with its unit
KNOB_AXIS = {
    "max_batch_size": "Max batch size (requests)",
    "max_num_seqs": "max_num_seqs (sequences per step)",
    "max_wait_s": "Max wait (s)",
    "max_num_batched_tokens": "Token budget / chunk size (tokens per step)",
    "high_share": "High-priority share (0-1)",
    "rate_req_s": "Request rate (req/s)",
    "kv_cache_tokens": "KV cache (tokens per replica)",
}
KNEE_COLOR = "#444444"
LIGHT_BLUE, DARK_BLUE, GREY = "#9ECAE9", "#4C78A8", "#8C8C8C"
P50_COLOR, P99_COLOR, CAP_COLOR = "#F2A65A", "#C0392B", "#7B241C"
# frontier latency axis: key -> (sweep column, name, unit, factor from seconds)
FRONTIER_LATENCY = {
    "tpot_cap": ("capacity_tpot_p99_s", "P99 TPOT at capacity", "ms", 1e3),
    "tpot": ("tpot_p99_s", "P99 TPOT at the offered load", "ms", 1e3),
    "ttft": ("ttft_p99_s", "P99 TTFT at the offered load", "s", 1.0),
}
SLO_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


# the same, short enough for one panel of two side by side (the long titles of two panels ran into each other)
KNOB_AXIS_SHORT = {
    "max_batch_size": "Max batch size (requests)",
    "max_num_seqs": "max_num_seqs (sequences)",
    "max_wait_s": "Max wait (s)",
    "max_num_batched_tokens": "Token budget (tokens)",
    "high_share": "High-priority share (0-1)",
    "rate_req_s": "Request rate (req/s)",
    "kv_cache_tokens": "KV cache (tokens)",
}


def knob_axis(knob: str, log: bool = False, short: bool = False) -> str:
    text = (KNOB_AXIS_SHORT if short else KNOB_AXIS).get(knob, KNOBS.get(knob, knob))
    return text[:-1] + (", log)" if short else ", log scale)") if log and text.endswith(")") else text


def knob_short(knob: str) -> str:
    return KNOB_AXIS.get(knob, knob).split(" (")[0]


def value_text(knob: str, value: float) -> str:
    """A knob value for labels: whole numbers without decimals, the rest with up to 3 significant digits."""
    if not math.isfinite(value):
        return "n/a"
    if knob in INT_KNOBS:
        v = int(round(value))
        return f"{v // 1024}k" if v >= 16384 and v % 1024 == 0 else f"{v:,}"
    return f"{value:.3g}"


def _figure(title: str, subtitle: str | None, height: int, rows: int = 1, cols: int = 1,
            subplot_titles: Sequence[str] | None = None, **kw) -> go.Figure:
    if rows == 1 and cols == 1:
        fig = go.Figure()
    else:
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=subplot_titles, **kw)
        fig.update_annotations(font_size=13)
    fig.update_layout(template=TEMPLATE, title=_title(title, subtitle), height=height)
    if subplot_titles:
        fig.update_layout(margin=dict(t=TOP_MARGIN_SUBPLOTS))
    return fig


def _axis_names(fig: go.Figure, row: int, col: int) -> tuple[str, str, bool]:
    """('x2', 'y2', is the x axis log) of one subplot (or of a plain figure)."""
    try:
        ref = fig.get_subplot(row, col)
        xname, yname = ref.xaxis.plotly_name, ref.yaxis.plotly_name
        xaxis = ref.xaxis
    except Exception:  # a figure without subplots
        xname, yname, xaxis = "xaxis", "yaxis", fig.layout.xaxis
    short = lambda name: name.replace("axis", "")  # noqa: E731
    return short(xname), short(yname), xaxis.type == "log"


def add_knee(fig: go.Figure, knob: str, knee: float | None, cells: Sequence[tuple[int, int]] = ((1, 1),),
             label: bool = True) -> None:
    """The knee as a dashed vertical line in each cell, annotated once (in the first cell)."""
    if knee is None or not math.isfinite(knee):
        return
    for n, (row, col) in enumerate(cells):
        x, y, log = _axis_names(fig, row, col)
        fig.add_shape(type="line", xref=x, yref=f"{y} domain", x0=knee, x1=knee, y0=0, y1=1, name="knee",
                      line=dict(color=KNEE_COLOR, width=1.5, dash="dash"), layer="below")
        if label and n == 0:
            # annotations on a log axis take log10 of the value (shapes take the value itself)
            fig.add_annotation(xref=x, yref=f"{y} domain", x=math.log10(knee) if log else knee, y=1.0,
                               text=f"knee: {value_text(knob, knee)}", showarrow=False, xanchor="left",
                               yanchor="top", xshift=4, font=dict(size=11, color=KNEE_COLOR), name="knee",
                               bgcolor="rgba(255,255,255,0.8)")


def _line(x, y, name: str, color: str, unit: str, knob: str, dash: str | None = None, group: str | None = None,
          show: bool = True, fmt: str = ",.3g") -> go.Scatter:
    return go.Scatter(x=x, y=y, mode="lines+markers", name=name, legendgroup=group or name, showlegend=show,
                      line=dict(color=color, width=2.5, dash=dash), marker=dict(size=7),
                      hovertemplate=f"{knob_short(knob)} %{{x:,.4g}}<br>{name}: %{{y:{fmt}}} {unit}<extra></extra>")


def _x(df: pd.DataFrame, knob: str) -> np.ndarray:
    return df[knob].to_numpy(float)


def _knob_ticks(fig: go.Figure, df: pd.DataFrame, knob: str, log_x: bool) -> None:
    """On a log knob axis, ticks at the swept values themselves (every other one past 12)."""
    if not log_x or df.empty:
        return
    vals = sorted(set(_x(df, knob)))
    step = max(1, math.ceil(len(vals) / 12))
    vals = vals[::step]
    fig.update_xaxes(type="log", tickvals=vals, ticktext=[value_text(knob, v) for v in vals])


BOTTOM_LEGEND = SIDE_LEGEND  # beside the plot: one below it ran into the x-axis title once a caption shrank the plot


# ---------------------------------------------------------------- Tune: curves against the knob


def sweep_throughput(df: pd.DataFrame, knob: str, knee: float | None = None, log_x: bool = False,
                     policy: str = "") -> go.Figure:
    """Throughput at the offered load (``steady_output_tok_s``: while requests arrive, the drain not counted),
    capacity and the offered load against the knob, knee marked."""
    sub = f"Policy: {policy}. " if policy else ""
    fig = _figure(f"Throughput and capacity vs {knob_short(knob)}",
                  sub + "Throughput: the drain excluded. Capacity: all queued at t = 0", 460)
    if df.empty:
        return _no_data(fig)
    x = _x(df, knob)
    fig.add_trace(_line(x, df["steady_output_tok_s"], "Throughput at this load", LIGHT_BLUE, "tok/s", knob,
                        fmt=",.0f"))
    fig.add_trace(_line(x, df["capacity_output_tok_s"], "Capacity", DARK_BLUE, "tok/s", knob, fmt=",.0f"))
    if "offered_output_tok_s" in df:
        fig.add_trace(go.Scatter(x=x, y=df["offered_output_tok_s"], mode="lines", name="Offered load",
                                 line=dict(color=GREY, width=1.5, dash="dash"),
                                 hovertemplate="offered %{y:,.0f} tok/s<extra></extra>"))
    fig.update_layout(xaxis_title=knob_axis(knob, log_x), yaxis_title="Output tokens per second (tok/s)",
                      xaxis_type="log" if log_x else "linear", yaxis_rangemode="tozero", hovermode="x unified",
                      legend=BOTTOM_LEGEND, height=460)
    _knob_ticks(fig, df, knob, log_x)
    add_knee(fig, knob, knee)
    return fig


def sweep_latency(df: pd.DataFrame, knob: str, knee: float | None = None, log_x: bool = False) -> go.Figure:
    """TTFT P50/P99 (s) and TPOT P50/P99 plus P99 TPOT at capacity (ms) against the knob, log y axes."""
    fig = _figure(f"Latency vs {knob_short(knob)}", "P50 and P99 at the offered load; dotted: P99 TPOT with the "
                  "batch full (capacity run)", 420, rows=1, cols=2, horizontal_spacing=0.13,
                  subplot_titles=("TTFT (log scale)", "TPOT (log scale)"))
    if df.empty:
        return _no_data(fig)
    x = _x(df, knob)
    fig.add_trace(_line(x, df["ttft_p50_s"], "P50", P50_COLOR, "s", knob), row=1, col=1)
    fig.add_trace(_line(x, df["ttft_p99_s"], "P99", P99_COLOR, "s", knob), row=1, col=1)
    fig.add_trace(_line(x, df["tpot_p50_s"] * 1e3, "P50", P50_COLOR, "ms", knob, show=False), row=1, col=2)
    fig.add_trace(_line(x, df["tpot_p99_s"] * 1e3, "P99", P99_COLOR, "ms", knob, show=False), row=1, col=2)
    if "capacity_tpot_p99_s" in df:
        fig.add_trace(_line(x, df["capacity_tpot_p99_s"] * 1e3, "P99 at capacity", CAP_COLOR, "ms", knob,
                            dash="dot"), row=1, col=2)
    log_axis(fig, "y", np.r_[df["ttft_p50_s"], df["ttft_p99_s"]], row=1, col=1)
    tpot = [df["tpot_p50_s"], df["tpot_p99_s"]] + ([df["capacity_tpot_p99_s"]] if "capacity_tpot_p99_s" in df else [])
    log_axis(fig, "y", np.concatenate([np.asarray(t, float) for t in tpot]) * 1e3, row=1, col=2)
    fig.update_yaxes(title_text="TTFT (s, log scale)", row=1, col=1)
    fig.update_yaxes(title_text="TPOT (ms, log scale)", row=1, col=2)
    fig.update_xaxes(title_text=knob_axis(knob, log_x, short=True), type="log" if log_x else "linear")
    _knob_ticks(fig, df, knob, log_x)
    add_knee(fig, knob, knee, ((1, 1), (1, 2)))
    return fig


def sweep_utilisation(df: pd.DataFrame, knob: str, knee: float | None = None, log_x: bool = False) -> go.Figure:
    """GPU util, batch efficiency and peak KV use (%), and preemptions (count), against the knob."""
    fig = _figure(f"GPU use, batch fill, KV cache and preemptions vs {knob_short(knob)}", "At the offered load",
                  420, rows=1, cols=2, horizontal_spacing=0.13,
                  subplot_titles=("Shares (%)", "Preemptions (count)"))
    if df.empty:
        return _no_data(fig)
    x = _x(df, knob)
    fig.add_trace(_line(x, df["gpu_util"] * 100, "GPU util", "#54A24B", "%", knob, fmt=".1f"), row=1, col=1)
    fig.add_trace(_line(x, df["batch_efficiency"] * 100, "Batch efficiency", DARK_BLUE, "%", knob, fmt=".1f"),
                  row=1, col=1)
    if "kv_pressure" in df:
        fig.add_trace(_line(x, df["kv_pressure"] * 100, "Peak KV cache use", "#72B7B2", "%", knob, fmt=".1f"),
                      row=1, col=1)
    fig.add_trace(_line(x, df["preemptions"], "Preemptions", "#E45756", "", knob, fmt=",.0f"), row=1, col=2)
    fig.update_yaxes(title_text="Share (%)", range=[0, 105], row=1, col=1)
    top = float(np.nanmax(df["preemptions"].to_numpy(float), initial=0.0))
    fig.update_yaxes(title_text="Preemptions (count)", range=[0, max(5.0, top * 1.08)], tickformat=",d", row=1,
                     col=2)
    fig.update_xaxes(title_text=knob_axis(knob, log_x, short=True), type="log" if log_x else "linear")
    _knob_ticks(fig, df, knob, log_x)
    add_knee(fig, knob, knee, ((1, 1), (1, 2)))
    return fig


def pareto_front(latency: Sequence[float], throughput: Sequence[float]) -> np.ndarray:
    """Indices of the points no other point beats on both (lower latency and higher throughput), by latency."""
    lat = np.asarray(latency, float)
    thr = np.asarray(throughput, float)
    ok = np.flatnonzero(np.isfinite(lat) & np.isfinite(thr))
    order = ok[np.lexsort((-thr[ok], lat[ok]))]
    front, best = [], -np.inf
    for i in order:
        if thr[i] > best:
            front.append(i)
            best = thr[i]
    return np.asarray(front, int)


def sweep_frontier(sweeps: Mapping[str, pd.DataFrame], knob: str, latency: str = "tpot_cap",
                   knees: Mapping[str, float | None] | None = None, throughput: str | None = None) -> go.Figure:
    """Throughput against P99 latency, one line per policy through its knob values (the chosen policy's points
    labelled, each label placed clear of every marker, line and other label: ``charts.labels``), the Pareto front
    over every point dashed, each policy's knee starred."""
    col, lat_name, unit, factor = FRONTIER_LATENCY[latency]
    thr_key = throughput or ("steady_output_tok_s" if knob == "rate_req_s" else "capacity_output_tok_s")
    thr_name = "Throughput at the offered load" if thr_key == "steady_output_tok_s" else "Capacity"
    short = {"tpot_cap": "P99 TPOT at capacity", "tpot": "P99 TPOT", "ttft": "P99 TTFT"}[latency]
    fig = _figure(f"Frontier: {thr_name.split(' at ')[0].lower()} vs {short}",
                  f"One point per {knob_short(knob)} value; up and to the left is better", 460)
    colors = policy_colors(sweeps)
    items = list(enumerate(sweeps.items()))
    series = []  # (i, name, df, lat, thr, knee point or None), the first (chosen) policy last: drawn on top
    for i, (name, df) in items[1:] + items[:1]:
        if df.empty:
            continue
        lat = df[col].to_numpy(float) * factor
        thr = df[thr_key].to_numpy(float)
        knee = (knees or {}).get(name)
        star = None
        if knee is not None and (df[knob] == knee).any():
            k = df[df[knob] == knee].iloc[0]
            star = (float(k[col]) * factor, float(k[thr_key]))
        series.append((i, name, df, lat, thr, star))
    if not series:
        return _no_data(fig)
    lat_all = np.concatenate([s[3] for s in series])
    thr_all = np.concatenate([s[4] for s in series])
    front = pareto_front(lat_all, thr_all)
    # the axes' ranges set here, so the labels are placed on the same px grid the figure is drawn on
    x_range, y_range = _frontier_ranges(lat_all, thr_all)
    obstacles, lines = [], []
    for _, _, _, lat, thr, star in series:
        px, py = labels.to_px(lat, thr, x_range, y_range, log_x=True)
        obstacles += [labels.marker_box(a, b, FRONTIER_MARKER / 2 + 1) for a, b in zip(px, py)]
        lines += labels.line_samples(px, py)
        if star is not None:
            sx, sy = labels.to_px([star[0]], [star[1]], x_range, y_range, log_x=True)
            obstacles.append(labels.marker_box(float(sx[0]), float(sy[0]), FRONTIER_STAR / 2))
    if len(front) > 1:
        fx, fy = labels.to_px(lat_all[front], thr_all[front], x_range, y_range, log_x=True)
        hx = np.repeat(fx, 2)[1:]  # the front is drawn "hv": across, then up
        hy = np.repeat(fy, 2)[:-1]
        lines += labels.line_samples(hx, hy)
    for i, name, df, lat, thr, star in series:
        color = colors[name]
        text = [value_text(knob, v) for v in df[knob]]
        trace = dict(mode="lines+markers", marker=dict(size=FRONTIER_MARKER, color=color))
        if i == 0:
            px, py = labels.to_px(lat, thr, x_range, y_range, log_x=True)
            knee = (knees or {}).get(name)
            radii = [FRONTIER_STAR / 2 if star is not None and v == knee else FRONTIER_MARKER / 2 + 1
                     for v in df[knob]]
            where = labels.place(px, py, text, radii, FRONTIER_FONT, obstacles, soft=lines)
            # Plotly sets a point's text off by its own marker's size: the knee's point takes the star's size
            # (hidden under the star), so its label clears the star as placed
            big = [r == FRONTIER_STAR / 2 for r in radii]
            trace = dict(mode="lines+markers+text", text=[t if w else "" for t, w in zip(text, where)],
                         textposition=[w or "top center" for w in where],
                         textfont=dict(size=FRONTIER_FONT, color=color),
                         marker=dict(size=[FRONTIER_STAR if b else FRONTIER_MARKER for b in big], color=color,
                                     opacity=[0.0 if b else 1.0 for b in big]))
        fig.add_trace(go.Scatter(x=lat, y=thr, name=name, legendrank=1000 + i, **trace,
                                 line=dict(color=color, width=2),
                                 customdata=df[knob].to_numpy(float),
                                 hovertemplate=f"{name}<br>{knob_short(knob)} %{{customdata:,.4g}}<br>{lat_name} "
                                               f"%{{x:,.3g}} {unit}<br>{thr_name} %{{y:,.0f}} tok/s<extra></extra>"))
        if star is not None:
            knee = (knees or {}).get(name)
            fig.add_trace(go.Scatter(x=[star[0]], y=[star[1]], mode="markers",
                                     name=f"{name} knee", legendgroup=name, showlegend=False,
                                     marker=dict(symbol="star", size=FRONTIER_STAR, color=color,
                                                 line=dict(color="white", width=1)),
                                     hovertemplate=f"{name} knee: {knob_short(knob)} {value_text(knob, knee)}"
                                                   "<extra></extra>"))
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=lat_all[front], y=thr_all[front], mode="lines", name="Best trade-offs",
                                 line=dict(color=GREY, width=1.5, dash="dash", shape="hv"), hoverinfo="skip"))
    if knees and any(v is not None for v in knees.values()):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="knee (star)",
                                 marker=dict(symbol="star", size=13, color=KNEE_COLOR)))
    fig.update_layout(xaxis_title=f"{lat_name} ({unit}, log scale)", yaxis_title=f"{thr_name} (output tok/s)",
                      legend=BOTTOM_LEGEND, legend_traceorder="normal")
    log_axis(fig, "x", lat_all)
    fig.update_xaxes(range=list(x_range), autorange=False)
    fig.update_yaxes(range=list(y_range), autorange=False)
    return fig


FRONTIER_MARKER = 8  # px
FRONTIER_STAR = 17  # px
FRONTIER_FONT = 10  # px


def _frontier_ranges(lat: np.ndarray, thr: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """(x range in log10 units, y range) of the frontier: every point with room around it for a marker and its
    label; the throughput from zero."""
    pos = lat[np.isfinite(lat) & (lat > 0)]
    lo, hi = (math.log10(pos.min()), math.log10(pos.max())) if pos.size else (0.0, 1.0)
    pad = max(0.08 * (hi - lo), 0.05)
    top = float(np.nanmax(thr)) if np.isfinite(thr).any() else 1.0
    return (lo - pad, hi + pad), (0.0, max(top, 1e-9) * 1.12)


# ---------------------------------------------------------------- Capacity planning


@functools.lru_cache(maxsize=16)
def _capacity_layout(target: str, price: str, plan: str = "", unit: str = "node") -> go.Layout:
    # short subplot and axis titles: a third of the width each, and a rotated y title must stay within the
    # plot's height (longer ones ran into the subtitle); the headroom and the SLOs on the subtitle's own lines
    extra = 18 * plan.count("<br>")  # px per subtitle line
    fig = _figure("Capacity per policy within the SLOs", f"Zero or missing: no rate tried met the SLOs{price}{plan}",
                  440 + extra, rows=1, cols=3, horizontal_spacing=0.1,
                  subplot_titles=("Sustainable rate per node" if unit == "node" else f"Rate per {unit}",
                                  f"Nodes for {target}",
                                  f"$ per M output tok. at {target}"))
    if extra:
        fig.update_layout(margin=dict(t=TOP_MARGIN_SUBPLOTS + extra))
    fig.update_yaxes(title_text=f"Rate per {unit} (req/s)" if unit == "node" else "Rate per replica (req/s)",
                     rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Nodes (count)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="$ per M output tokens ($)", rangemode="tozero", row=1, col=3)
    fig.update_xaxes(title_text="Policy")
    return fig.layout


def capacity_plan_text(headroom: float | None, slo_text: str | None) -> str:
    """The subtitle lines of what the nodes and $ depend on: the headroom and the SLOs (user class names literal)."""
    out = ""
    if headroom is not None:
        out += (f"<br>Nodes and $ with {headroom:g}× headroom: a node planned at 1/{headroom:g} of the rate per node"
                " shown")
    if slo_text:
        out += f"<br>SLOs, every class at its own: {literal(slo_text)}"
    return out


def capacity_bars(plans: Mapping[str, CapacityResult | Mapping], target_rate_req_s: float | None = None,
                  gpu_hour_usd: float | None = None, headroom: float | None = None,
                  slo_text: str | None = None, unit: str = "node") -> go.Figure:
    """Per policy: sustainable request rate per node (``unit``: what the rate is per, ``capacity.rate_unit``: a TP 16
    replica's two nodes), nodes needed for the target, $ per million output tokens at the target traffic
    (``studies.pricing.price``). ``headroom`` and ``slo_text`` (``SLO.describe``): printed under the title, as the
    nodes and the $ depend on them.

    ``plans``: name -> ``CapacityResult`` (as ``studies.planning.CapacityPlan.results`` holds them, priced) or
    its ``to_dict()``. Plain-dict bars on a layout built once per target, price, headroom and SLOs
    (``make_subplots`` and its updates cost most of this figure's time)."""
    target = f"{target_rate_req_s:,.4g} req/s" if target_rate_req_s else "the target"
    price = f"; cost at ${gpu_hour_usd:,.4g} per GPU-hour" if gpu_hour_usd else ""
    plan = capacity_plan_text(headroom, slo_text)
    names = list(plans)
    if not names:
        return _no_data(go.Figure(layout=_capacity_layout(target, price, plan, unit)))
    cmap = policy_colors(names)
    colors = [cmap[n] for n in names]
    series = (("max_rate_req_s", "req/s", ",.3g", 1), ("nodes_needed", "nodes", ",.0f", 2),
              ("usd_per_million_output_tokens", "$", ",.2f", 3))
    traces, axes = [], {}
    for key, sign, fmt, col in series:
        y = [_num(_field(plans[n], key)) for n in names]
        text = [("n/a" if not math.isfinite(v) else (f"${v:{fmt}}" if sign == "$" else f"{v:{fmt}}")) for v in y]
        axis = "" if col == 1 else str(col)
        traces.append(dict(type="bar", x=names, y=[v if math.isfinite(v) else None for v in y],
                           marker=dict(color=colors), text=text, textposition="outside", cliponaxis=False,
                           showlegend=False, name=key, xaxis=f"x{axis}", yaxis=f"y{axis}",
                           hovertemplate=f"%{{x}}: %{{y:{fmt}}} {sign}<extra></extra>"))
        # room above the tallest bar for its label
        top = max([v for v in y if math.isfinite(v)], default=0.0)
        kw: dict = {}
        if top > 0:
            kw["range"] = [0, top * 1.18]
        if col == 2 and top <= 10:
            kw["dtick"] = 1  # whole nodes
        if kw:
            axes[f"yaxis{axis}"] = kw
    fig = go.Figure(data=traces, layout=_capacity_layout(target, price, plan, unit))
    if axes:
        fig.update_layout(axes)
    return fig


def _field(plan: CapacityResult | Mapping, key: str):
    return plan.get(key) if isinstance(plan, Mapping) else getattr(plan, key, None)


def _num(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return v


@functools.lru_cache(maxsize=16)
def _goodput_layout(attainment: float) -> go.Layout:
    fig = _figure("Goodput and SLO attainment vs request rate", "Every rate the search tried; dotted: each "
                  "policy's sustainable rate; dashed: the target", 680, rows=2, cols=1,
                  shared_xaxes=True, vertical_spacing=0.14,
                  subplot_titles=("Goodput: requests per second within every SLO while requests arrive",
                                  f"Worst class's share within its SLOs (target {attainment * 100:.3g} %)"))
    # tick labels under both panels, the axis title once (under the bottom one: nothing between a panel and the
    # title of the one below it)
    fig.update_xaxes(showticklabels=True, rangemode="tozero")
    fig.update_xaxes(title_text="Request rate offered to one node (req/s)", row=2, col=1)
    fig.update_yaxes(title_text="Goodput (req/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Worst class within (%)", range=[0, 103], row=2, col=1)
    return fig.layout


def goodput_curves(points: Mapping[str, pd.DataFrame], max_rates: Mapping[str, float],
                   attainment: float) -> go.Figure:
    """Goodput (top) and SLO attainment (bottom: the lowest class's share of its requests within its own SLOs,
    ``class_attainment``, what the search holds to the target; a frame without it: all requests) against the
    request rate, for every rate each search tried; the attainment target dashed, each policy's sustainable rate
    dotted. Plain-dict traces and shapes on a layout built once per attainment target."""
    traces, shapes = [], []
    all_rates = []
    colors = policy_colors(points)
    for name, df in points.items():
        if df is None or df.empty:
            continue
        color = colors[name]
        df = df.sort_values("rate_req_s")
        x = df["rate_req_s"].to_numpy(float)
        all_rates.append(x)
        traces.append(dict(type="scatter", x=x, y=df["goodput_req_s"].to_numpy(float), mode="lines+markers",
                           name=name, legendgroup=name, line=dict(color=color, width=2.5), marker=dict(size=7),
                           xaxis="x", yaxis="y",
                           hovertemplate=f"{name}<br>%{{x:,.3g}} req/s offered<br>goodput %{{y:,.3g}} req/s"
                                         "<extra></extra>"))
        share = df["class_attainment"] if "class_attainment" in df else df["attainment"]
        traces.append(dict(type="scatter", x=x, y=share.to_numpy(float) * 100, mode="lines+markers",
                           name=name, legendgroup=name, showlegend=False, line=dict(color=color, width=2.5),
                           marker=dict(size=7), xaxis="x2", yaxis="y2",
                           hovertemplate=f"{name}<br>%{{x:,.3g}} req/s<br>worst class %{{y:.1f}} % within its SLOs"
                                         "<extra></extra>"))
        rate = max_rates.get(name)
        if rate is not None and rate > 0:
            for row in (1, 2):
                shapes.append(dict(type="line", xref="x" if row == 1 else "x2",
                                   yref="y domain" if row == 1 else "y2 domain", x0=rate, x1=rate, y0=0, y1=1,
                                   name=f"{name} max rate", line=dict(color=color, width=1.5, dash="dot")))
    if not all_rates:
        return _no_data(go.Figure(layout=_goodput_layout(float(attainment))))
    hi = float(np.concatenate(all_rates).max())
    # what goodput would be if every request met the SLOs: the offered rate itself
    ref = np.array([0.0, hi])
    traces.append(dict(type="scatter", x=ref, y=ref, mode="lines", name="All requests within the SLOs",
                       line=dict(color=GREY, width=1, dash="dash"), hoverinfo="skip", xaxis="x", yaxis="y"))
    shapes.append(dict(type="line", xref="x2 domain", yref="y2", x0=0, x1=1, y0=attainment * 100,
                       y1=attainment * 100, name="attainment target",
                       line=dict(color=KNEE_COLOR, width=1.5, dash="dash")))
    fig = go.Figure(data=traces, layout=_goodput_layout(float(attainment)))
    fig.update_layout(shapes=shapes)
    return fig


def binding_text(binding: str | None) -> str:
    """The SLO a capacity search hit first; none when every rate tried met them (the node's capacity binds)."""
    return SLO_NAMES.get(binding, binding) if binding else "none (node at capacity)"
