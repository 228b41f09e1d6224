"""Plotly figure builders for prefill/decode disaggregation (no Streamlit here): aggregated against disaggregated
capacity within the SLOs (``studies.disagg_capacity.SplitCapacity.frame``)."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts.policy import TEMPLATE, TOP_MARGIN_SUBPLOTS, _no_data, _title

AGGREGATED_COLOR, DISAGGREGATED_COLOR = "#4C78A8", "#F58518"  # as TOKEN_COLORS: decode blue, prefill orange
TITLE = "Aggregated vs disaggregated capacity within the SLOs"


def tick_label(configuration: str) -> str:
    """A configuration's name on two lines ('1 prefill × TP 4 +<br>1 decode × TP 4'), so bars stay readable."""
    return configuration.replace(" + ", " +<br>").replace(": ", ":<br>", 1)


def split_capacity_bars(frame: pd.DataFrame, policy: str | None = None) -> go.Figure:
    """Per configuration: the highest rate within the SLOs (req/s) and the same per node (times the copies a node
    holds: the study's and the deployment search's ranking); aggregated in blue, the splits in orange. A configuration that met the SLOs at no rate shows an empty bar labelled 0."""
    sub = "Zero: no rate tried met the SLOs" + (f"; policy {policy}" if policy else "")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("Capacity within the SLOs", "Per node"))
    fig.update_annotations(font_size=13)
    fig.update_layout(template=TEMPLATE, title=_title(TITLE, sub), height=460, margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      showlegend=False)
    fig.update_yaxes(title_text="Requests per second (req/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Requests per second per node (req/s)", rangemode="tozero", row=1, col=2)
    if frame is None or frame.empty:
        return _no_data(fig)
    x = [tick_label(c) for c in frame["configuration"]]
    colors = [AGGREGATED_COLOR if k == "aggregated" else DISAGGREGATED_COLOR for k in frame["kind"]]
    for col, key, unit in ((1, "capacity_req_s", "req/s"), (2, "req_s_per_node", "req/s per node")):
        y = [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None for v in frame[key]]
        fig.add_trace(go.Bar(x=x, y=y, marker_color=colors, text=[f"{v:.3g}" if v is not None else "n/a" for v in y],
                             textposition="outside", cliponaxis=False, name=key,
                             customdata=list(frame["gpus"]),
                             hovertemplate=f"%{{x}}<br>%{{y:.3g}} {unit} on %{{customdata}} GPUs<extra></extra>"),
                      row=1, col=col)
        top = max([v for v in y if v is not None], default=0.0)
        if top > 0:
            fig.update_yaxes(range=[0, top * 1.18], row=1, col=col)
    fig.update_xaxes(title_text="Configuration", tickfont=dict(size=11))
    return fig
