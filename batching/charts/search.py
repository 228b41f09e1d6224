"""Plotly figure for the deployment search (``studies.search``): cost against P99 TTFT and P99 TPOT, the Pareto
front marked, the chosen configuration highlighted. No Streamlit here."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def short_label(c: dict) -> str:
    """A point's label on the chart: GPU, precision and shape, e.g. 'h200-sxm FP8 TP4' or 'h100-sxm FP8 3×TP2 P +
    1×TP2 D' (the hover and the table give the rest)."""
    sp = c.get("split")
    if sp is None:
        shape = f"TP{c.get('tp')}"
    else:
        shape = (f"{sp['prefill_instances']}×TP{sp['prefill_tp']} P + {sp['decode_instances']}×TP{sp['decode_tp']} "
                 "D")
    return f"{c['gpu']} {str(c['precision']).upper()} {shape}"


def _slo_values(value) -> list[float]:
    """One SLO target's distinct values (one, or one per class), in seconds."""
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return sorted({float(v) for v in values if v is not None})


def _subtitle(target: float | None) -> str:
    """Two short lines (a long single line was cut at the right edge of a half-width column: "Lower lef")."""
    at = f"at the target of {target:,.4g} req/s" if target else "at the target traffic"
    return (f"One point per configuration meeting the SLOs: its P99 latencies {at}.<br>"
            "Coloured and labelled #rank: the Pareto front; red ring: the chosen one;<br>"
            "dashed: the SLOs. Lower left is better (cheaper and faster).")


LABEL_STEP_PX = 15  # how far apart the labels of points at about the same cost are stacked


def _label(fig: go.Figure, group: Sequence[dict], rank: Mapping[int, int], key: str, factor: float, col: int,
           color: str) -> None:
    """Each point of ``group`` labelled '#rank GPU PRECISION shape', below left of it (the front runs from cheap and
    slow to dear and fast: no point of the front lies there) with a thin line to it. Points at about the same cost
    (nodes are whole, so equal costs are common) stack their labels a line apart, the leftmost nearest, so that no
    label covers another."""
    costs = [c["usd_per_million_output_tokens"] for c in group]
    near = 0.04 * (max(costs) or 1.0)
    placed: list[float] = []
    for c in sorted(group, key=lambda c: (c[key], c["usd_per_million_output_tokens"])):
        y = c["usd_per_million_output_tokens"]
        k = sum(abs(y - other) < near for other in placed)
        placed.append(y)
        fig.add_annotation(x=c[key] * factor, y=y, text=literal(f"#{rank[id(c)]} {short_label(c)}"),
                           showarrow=True, arrowhead=0, arrowwidth=0.8, arrowcolor=color, ax=-24,
                           ay=14 + LABEL_STEP_PX * k, xanchor="right", yanchor="middle",
                           font=dict(size=10, color=color), row=1, col=col)


def pareto_chart(configs: Sequence[dict], chosen: int | None = 0, slo: Mapping | None = None,
                 target: float | None = None) -> go.Figure:
    """Two panels sharing the cost axis: $ per million output tokens against P99 TTFT (s) and against P99 TPOT
    (ms), one marker per configuration that meets the SLOs (``search(...)['configs']`` rows), the others grey
    below, the Pareto front (cost, TTFT, TPOT) in colour on top, each of its points labelled with its rank and
    shape, ``chosen`` (an index into the rows meeting the SLOs) circled. ``slo``: the search's SLOs
    (``SLO.to_dict``), drawn as dashed lines at the TTFT and TPOT targets; ``target``: the target traffic (req/s)
    the latencies are read at, said in the subtitle."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("Cost vs P99 TTFT", "Cost vs P99 TPOT"))
    fig.update_annotations(font_size=13)
    fig.update_layout(template=TEMPLATE, height=480, margin=dict(t=TOP_MARGIN_SUBPLOTS + 36),
                      title=_title(TITLE, _subtitle(target)))
    rows = [c for c in configs if c.get("meets_slo")]
    if not rows:
        return _no_data(fig, "No configuration meets the SLOs")
    rank = {id(c): i + 1 for i, c in enumerate(rows)}
    # the grey ones first: the Pareto front is drawn above them, never hidden under a grey marker
    groups = (("Other configurations", [c for c in rows if not c.get("pareto")], OTHER_COLOR, False),
              ("Pareto front", [c for c in rows if c.get("pareto")], FRONT_COLOR, True))
    for name, group, color, labelled in groups:
        if not group:
            continue
        for col, key, factor in ((1, "ttft_p99_s", 1.0), (2, "tpot_p99_s", 1e3)):
            fig.add_trace(go.Scatter(
                x=[c[key] * factor for c in group], y=[c["usd_per_million_output_tokens"] for c in group],
                mode="markers", name=name, legendgroup=name, showlegend=col == 1,
                marker=dict(color=color, size=10, line=dict(width=1, color="#FFFFFF")),
                text=[_hover(c) for c in group], hovertemplate="%{text}<extra></extra>"), row=1, col=col)
            if labelled:
                _label(fig, group, rank, key, factor, col, color)
    if chosen is not None and 0 <= chosen < len(rows):
        c = rows[chosen]
        for col, key, factor in ((1, "ttft_p99_s", 1.0), (2, "tpot_p99_s", 1e3)):
            fig.add_trace(go.Scatter(
                x=[c[key] * factor], y=[c["usd_per_million_output_tokens"]], mode="markers",
                name=f"Chosen: {literal(c['label'])}", legendgroup="chosen", showlegend=col == 1,
                marker=dict(color="rgba(0,0,0,0)", size=20, line=dict(width=3, color=CHOSEN_COLOR)),
                text=[_hover(c)], hovertemplate="%{text}<extra></extra>"), row=1, col=col)
    for col, key, factor, unit in ((1, "ttft_s", 1.0, "s"), (2, "tpot_s", 1e3, "ms")):
        for v in _slo_values((slo or {}).get(key)):
            fig.add_vline(x=v * factor, line=dict(color=CHOSEN_COLOR, width=1.5, dash="dash"), row=1, col=col,
                          annotation=dict(text=f"SLO {v * factor:,.4g} {unit}", font=dict(size=10,
                                                                                          color=CHOSEN_COLOR)),
                          annotation_position="top left")
    fig.update_xaxes(title_text="P99 TTFT (s)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="P99 TPOT (ms)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="$ per M output tokens ($)", rangemode="tozero", row=1, col=1)
    fig.update_layout(legend=SIDE_LEGEND)
    return fig
