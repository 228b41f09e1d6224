"""Plotly figure for the deployment search (``studies.search``): cost against P99 TTFT and P99 TPOT, the Pareto
front marked, the chosen configuration highlighted. No Streamlit here."""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts.legend import SIDE_LEGEND
from batching.charts.policy import TEMPLATE, TOP_MARGIN_SUBPLOTS, _no_data, _title
from batching.charts.text import literal

FRONT_COLOR, OTHER_COLOR, CHOSEN_COLOR = "#4C78A8", "#BAB0AC", "#C0392B"
TITLE = "Cost against tail latency per configuration"


def _fleet(c: dict) -> str:
    """How the row's nodes were found: a fleet simulation behind its router, or perfect load balancing."""
    if not c.get("fleet_checked"):
        return "perfect load balancing assumed"
    if c.get("fleet_verified"):
        return f"fleet-checked ✓ behind {c.get('router', '?')}"
    return f"at least: not verified behind {c.get('router', '?')}"


def _hover(c: dict) -> str:
    return (f"{literal(c['label'])}<br>${c['usd_per_million_output_tokens']:,.3f} per M output tokens, "
            f"{c['nodes_needed']} node(s) ({_fleet(c)})<br>{c['max_rate_req_s']:,.3g} req/s per node<br>"
            f"P99 TTFT {c['ttft_p99_s']:,.3f} s, P99 TPOT {c['tpot_p99_s'] * 1e3:,.1f} ms")


def pareto_chart(configs: Sequence[dict], chosen: int | None = 0) -> go.Figure:
    """Two panels sharing the cost axis: $ per million output tokens against P99 TTFT (s) and against P99 TPOT
    (ms), one marker per configuration that meets the SLOs (``search(...)['configs']`` rows), the Pareto front
    (cost, TTFT, TPOT) in colour, the others grey, ``chosen`` (an index into the rows meeting the SLOs) circled."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("Cost vs P99 TTFT", "Cost vs P99 TPOT"))
    fig.update_annotations(font_size=13)
    fig.update_layout(template=TEMPLATE, height=440, margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      title=_title(TITLE, "Each point one configuration: its cost, and its P99 latencies at the target traffic; "
                                          "coloured: the Pareto front (no other is cheaper and faster); "
                                          "red ring: the chosen one. Lower left is better."))
    rows = [c for c in configs if c.get("meets_slo")]
    if not rows:
        return _no_data(fig, "No configuration meets the SLOs")
    groups = (("Pareto front", [c for c in rows if c.get("pareto")], FRONT_COLOR),
              ("Other configurations", [c for c in rows if not c.get("pareto")], OTHER_COLOR))
    for name, group, color in groups:
        if not group:
            continue
        for col, key, factor in ((1, "ttft_p99_s", 1.0), (2, "tpot_p99_s", 1e3)):
            fig.add_trace(go.Scatter(
                x=[c[key] * factor for c in group], y=[c["usd_per_million_output_tokens"] for c in group],
                mode="markers", name=name, legendgroup=name, showlegend=col == 1,
                marker=dict(color=color, size=10, line=dict(width=1, color="#FFFFFF")),
                text=[_hover(c) for c in group], hovertemplate="%{text}<extra></extra>"), row=1, col=col)
    if chosen is not None and 0 <= chosen < len(rows):
        c = rows[chosen]
        for col, key, factor in ((1, "ttft_p99_s", 1.0), (2, "tpot_p99_s", 1e3)):
            fig.add_trace(go.Scatter(
                x=[c[key] * factor], y=[c["usd_per_million_output_tokens"]], mode="markers",
                name=f"Chosen: {literal(c['label'])}", legendgroup="chosen", showlegend=col == 1,
                marker=dict(color="rgba(0,0,0,0)", size=20, line=dict(width=3, color=CHOSEN_COLOR)),
                text=[_hover(c)], hovertemplate="%{text}<extra></extra>"), row=1, col=col)
    fig.update_xaxes(title_text="P99 TTFT (s)", row=1, col=1)
    fig.update_xaxes(title_text="P99 TPOT (ms)", row=1, col=2)
    fig.update_yaxes(title_text="$ per M output tokens ($)", rangemode="tozero", row=1, col=1)
    fig.update_layout(legend=SIDE_LEGEND)
    return fig
