"""The speculation crossover chart (Tune): TPOT P50 and output throughput against the offered request rate, with
speculative decoding on and off, and where speculation stops helping (no Streamlit here).

The conventions of ``charts``: the one shared template, a title, axis titles with units, TPOT in milliseconds.
The study is ``studies.spec_crossover.SpecCrossover``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts.colors import SPEC_CURVE_COLORS
from batching.charts.legend import SIDE_LEGEND
from batching.charts.policy import TEMPLATE, TOP_MARGIN_SUBPLOTS, _no_data, _title, log_axis_update
from batching.studies.spec_crossover import CROSSES, SpecCrossover

TITLE = "Speculation crossover: TPOT and throughput vs request rate"
WITH, WITHOUT = "with speculation", "without speculation"
CROSSOVER_COLOR = "#444444"
RATE_AXIS = "Offered request rate (req/s)"


@functools.lru_cache(maxsize=4)
def _layout() -> go.Layout:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.13,
                        subplot_titles=("TPOT P50 (log scale)", "Output throughput"))
    fig.update_layout(template=TEMPLATE, height=440, margin=dict(t=TOP_MARGIN_SUBPLOTS), hovermode="x unified",
                      legend=SIDE_LEGEND)
    fig.update_xaxes(title_text=RATE_AXIS, rangemode="tozero")
    fig.update_yaxes(title_text="TPOT P50 (ms, log scale)", row=1, col=1)
    fig.update_yaxes(title_text="Output throughput (tok/s)", rangemode="tozero", row=1, col=2)
    fig.update_annotations(font_size=13)
    return fig.layout


def crossover_chart(study: SpecCrossover) -> go.Figure:
    """TPOT P50 (ms, log axis, left) and output throughput (tok/s, right) against the offered rate, one line with
    speculation and one without in each panel; the crossover rate (where TPOT with speculation reaches TPOT
    without) as a dashed vertical line in both panels, or the subtitle saying the curves do not cross."""
    fig = go.Figure(layout=_layout())
    df = study.frame
    method = study.method() + (" (the default: the policy does not speculate)" if study.defaulted else "")
    if df.empty:
        fig.layout.title = _title(TITLE, f"Speculation: {method}")
        return _no_data(fig)
    x = df["rate_req_s"].to_numpy(float)
    lo, hi = float(x.min()), float(x.max())
    if study.status == CROSSES:
        sub = f"{method}; speculation stops helping at about {study.crossover_req_s:,.3g} req/s (dashed)"
    else:
        sub = f"{method}; the TPOT curves do not cross between {lo:,.3g} and {hi:,.3g} req/s"
    fig.layout.title = _title(TITLE, sub)
    traces = []
    for key, name in (("on", WITH), ("off", WITHOUT)):
        color = SPEC_CURVE_COLORS[key]
        tpot = df[f"tpot_p50_s_{key}"].to_numpy(float) * 1e3
        thr = df[f"throughput_output_tok_s_{key}"].to_numpy(float)
        common = dict(type="scatter", x=x, mode="lines+markers", name=name, legendgroup=name,
                      line=dict(color=color, width=2.5), marker=dict(size=7))
        traces.append(dict(common, y=tpot, xaxis="x", yaxis="y",
                           hovertemplate=f"{name}: TPOT P50 %{{y:,.1f}} ms<extra></extra>"))
        traces.append(dict(common, y=thr, xaxis="x2", yaxis="y2", showlegend=False,
                           hovertemplate=f"{name}: %{{y:,.0f}} tok/s<extra></extra>"))
    fig.add_traces(traces)
    tpots = np.r_[df["tpot_p50_s_on"].to_numpy(float), df["tpot_p50_s_off"].to_numpy(float)] * 1e3
    fig.update_layout(yaxis=log_axis_update(tpots))
    cross = study.crossover_req_s
    if study.status == CROSSES and cross is not None and math.isfinite(cross):
        shapes = [dict(type="line", xref=xr, yref=f"{yr} domain", x0=cross, x1=cross, y0=0, y1=1, name="crossover",
                       line=dict(color=CROSSOVER_COLOR, width=1.5, dash="dash")) for xr, yr in (("x", "y"),
                                                                                                 ("x2", "y2"))]
        fig.update_layout(shapes=shapes)
        fig.add_annotation(xref="x", yref="y domain", x=cross, y=1.0, text=f"crossover: {cross:,.3g} req/s",
                           showarrow=False, xanchor="right", yanchor="top", xshift=-4, name="crossover",
                           font=dict(size=11, color=CROSSOVER_COLOR), bgcolor="rgba(255,255,255,0.8)")
    return fig
