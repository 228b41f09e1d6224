"""Latency against load: P99 TTFT and P99 TPOT against the request rate, one line per policy (no Streamlit).

The figure the serving papers draw (vLLM, Sarathi-Serve, DistServe): each policy's line runs up to its
capacity, where a marker ends it; the workload's SLOs are dashed horizontal lines and the rate being looked at
is a dotted vertical line. Input: the frame of ``batching.studies.load_curve.load_curve``.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts.colors import alpha, policy_colors
from batching.charts.formatting import rate_text
from batching.charts.policy import SUBTITLE_FONT, TEMPLATE, TOP_MARGIN_SUBPLOTS, log_axis_update

TITLE = "Latency against load"
SLO_COLOR = "#6B6B6B"
RATE_COLOR = "#333333"
# one marker and dash per line, in the figure's order: two policies that run the same (chunked and priority on a
# single-class workload: priority has no lower class to hold back) stay told apart, the later one dashed over the
# earlier with its own marker, instead of hiding it
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "star", "hexagon", "pentagon")
DASHES = ("solid", "solid", "solid", "solid", "dash", "dot", "dashdot", "longdash")
SAME_DASH = "dash"  # a line that coincides with an earlier one


def same_as(curve: pd.DataFrame, names: Sequence[str]) -> dict[str, str]:
    """name -> the earlier policy whose line it coincides with (same rates, P99 TTFT and TPOT within 0.1 %)."""
    out: dict[str, str] = {}
    cols = ["rate_req_s", "ttft_p99_s", "tpot_p99_s"]
    parts = {n: curve[curve["policy"] == n].sort_values("rate_req_s")[cols].to_numpy(float) for n in names}
    for i, name in enumerate(names):
        for earlier in names[:i]:
            a, b = parts[name], parts[earlier]
            if earlier not in out and a.shape == b.shape and len(a) and np.allclose(a, b, rtol=1e-3, equal_nan=True):
                out[name] = earlier
                break
    return out


# (frame column, subplot title, y-axis title); both shown in ms
PANELS = (("ttft_p99_s", "P99 time to first token", "P99 TTFT (ms, log scale)"),
          ("tpot_p99_s", "P99 time per output token", "P99 TPOT (ms, log scale)"))


@functools.lru_cache(maxsize=4)
def _skeleton() -> go.Layout:
    """The two panels, titles and axis titles, built once (``make_subplots`` and its updates cost ~20 ms a figure;
    a copy of the finished layout ~2 ms). Traces then name their axes ("x2", "y2")."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[p[1] for p in PANELS], horizontal_spacing=0.1)
    fig.update_layout(template=TEMPLATE, height=460, margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      title={"text": TITLE, "subtitle": {
                          "text": "P99 latency as the offered rate rises to each policy's capacity (×); lower and "
                                  "further right is better", "font": dict(SUBTITLE_FONT)}},
                      legend=dict(title_text="Policy"), hovermode="closest")
    for i, (_, _, title) in enumerate(PANELS, start=1):
        fig.update_xaxes(title_text="Request rate (req/s)", rangemode="tozero", row=1, col=i)
        fig.update_yaxes(title_text=title, row=1, col=i)
    return fig.layout


def latency_vs_load(curve: pd.DataFrame, slos: Sequence[dict] = (), rate_req_s: float | None = None) -> go.Figure:
    """Two panels (P99 TTFT, P99 TPOT, ms, log y) against request rate; one line per policy ending at a marker
    on its capacity; ``slos``: ``{"name", "ttft_s", "tpot_s"}`` per class, drawn dashed; ``rate_req_s``: the
    rate looked at, a dotted vertical line.

    Built from plain dicts on a cached skeleton, the lines and labels added to the layout in one update: Plotly's
    ``add_hline``/``add_vline`` per panel cost ~100 ms a figure, most of a home-page rerun's chart time."""
    names = list(dict.fromkeys(curve["policy"])) if len(curve) else []
    colors = policy_colors(names)
    same = same_as(curve, names) if names else {}
    shown: dict[str, list] = {col: [] for col, _, _ in PANELS}
    traces: list[dict] = []
    for k, name in enumerate(names):
        symbol = SYMBOLS[k % len(SYMBOLS)]
        dash = SAME_DASH if name in same else DASHES[k % len(DASHES)]
        legend = f"{name} (same as {same[name]})" if name in same else name
        part = curve[curve["policy"] == name].sort_values("rate_req_s")
        cap = float(part["capacity_req_s"].iloc[0])
        x = part["rate_req_s"].to_numpy(float)
        load = part["load"].to_numpy(float) * 100
        for i, (col, label, _) in enumerate(PANELS, start=1):
            axes = dict(xaxis=f"x{'' if i == 1 else i}", yaxis=f"y{'' if i == 1 else i}")
            y = part[col].to_numpy(float) * 1e3
            shown[col] += list(y)
            traces.append(dict(
                type="scatter", x=x, y=y, mode="lines+markers", name=legend, legendgroup=name, showlegend=i == 1,
                line=dict(color=colors[name], width=2, dash=dash),
                marker=dict(size=9 if name in same else 6, symbol=symbol,
                            **({"line": dict(width=1.5, color=colors[name]), "color": "white"} if name in same else {})),
                customdata=load[:, None], **axes,
                hovertemplate=f"{name}: %{{x:.3g}} req/s (%{{customdata[0]:.0f}} % of capacity)<br>{label}: "
                              "%{y:,.4g} ms<extra></extra>"))
            # the end of the line: the capacity, at the last measured latency (the latency past it is unbounded)
            traces.append(dict(
                type="scatter", x=[cap], y=[y[-1]] if len(y) else [np.nan], mode="markers", name=f"{name} capacity",
                legendgroup=name, showlegend=False, **axes,
                marker=dict(symbol="x-thin", size=12, line=dict(width=2.5, color=colors[name]),
                            color=alpha(colors[name], 1.0)),
                hovertemplate=f"{name} capacity: %{{x:.3g}} req/s (queue grows past it)<extra></extra>"))
    fig = go.Figure(data=traces, layout=_skeleton())
    shapes: list[dict] = []
    notes: list[dict] = []
    for i, (col, _, _) in enumerate(PANELS, start=1):
        xa, ya = f"x{'' if i == 1 else i}", f"y{'' if i == 1 else i}"
        key = "ttft_s" if col.startswith("ttft") else "tpot_s"
        targets: dict[float, list[str]] = {}  # one line per value, naming every class it holds for
        for slo in slos:
            if slo.get(key) is not None:
                targets.setdefault(float(slo[key]), []).append(str(slo["name"]))
        for value, who in targets.items():
            slo = {"name": ", ".join(who)}
            shown[col].append(value * 1e3)
            shapes.append(dict(type="line", xref=f"{xa} domain", yref=ya, x0=0, x1=1, y0=value * 1e3,
                               y1=value * 1e3, line=dict(color=SLO_COLOR, dash="dash", width=1)))
            # on a log axis an annotation's y is log10 of the value
            notes.append(dict(text=f"SLO {slo['name']}: {value * 1e3:,.0f} ms", x=0, y=math.log10(value * 1e3),
                              xref=f"{xa} domain", yref=ya, xanchor="left", yanchor="bottom", showarrow=False,
                              font=dict(size=11, color=SLO_COLOR)))
        if rate_req_s is not None and np.isfinite(rate_req_s):
            shapes.append(dict(type="line", xref=xa, yref=f"{ya} domain", x0=rate_req_s, x1=rate_req_s, y0=0, y1=1,
                               line=dict(color=RATE_COLOR, dash="dot", width=1.5)))
            if i == 1:
                notes.append(dict(text=f"this rate: {rate_text(rate_req_s)}", x=rate_req_s, y=1, xref=xa,
                                  yref=f"{ya} domain", xanchor="left", yanchor="top", showarrow=False,
                                  font=dict(size=11, color=RATE_COLOR)))
    if not names:
        notes.append(dict(text="No policy could be measured", x=0.5, y=0.5, xref="paper", yref="paper",
                          showarrow=False, font=dict(size=14, color="#6B6B6B")))
    update: dict = {}
    if shapes:
        update["shapes"] = shapes
    if notes:
        update["annotations"] = list(fig.layout.annotations) + notes
    for i, (col, _, _) in enumerate(PANELS, start=1):
        update[f"yaxis{'' if i == 1 else i}"] = log_axis_update(shown[col])
    fig.update_layout(update)
    return fig
