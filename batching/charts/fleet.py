"""The fleet's per-replica view (Explore, when a scenario has more than one replica): KV cache in use and requests
waiting over time, one line per replica, and a per-replica table from ``summary()["by_replica"]`` (no Streamlit).

Screen resolution, not step resolution: a replica runs tens of thousands of forward passes in a long run, and 16
lines of raw steps in two panels would be hundreds of thousands of SVG points that nobody can tell apart. Each
line is the replica's time-weighted mean over at most ``MAX_POINTS`` time bins, the same bins for every replica
(``charts.policy.time_average``: exact for any bin width, 0 while the replica is idle), so a mean never exceeds the
replica's peak and the KV line never exceeds 100 % of its capacity. At most ``MAX_LINES`` replicas get a line
(``shown_replicas``: evenly spread over the fleet, first and last included); the table lists every replica.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batching.charts.colors import DISAGG_COLORS, shade
from batching.charts.formatting import MISSING, shown
from batching.charts.policy import (SERIES_COLORS, SUBTITLE_FONT, TEMPLATE, TOP_MARGIN_SUBPLOTS, f32, line_trace,
                                    time_average)
from batching.sim.hardware.specs import KV_BLOCK_TOKENS

MAX_LINES = 16  # replicas drawn as lines (each in both panels); the table has them all
MAX_POINTS = 2000  # time bins per line at most: about a wide screen's width in pixels
MIN_POINTS = 50
TITLE = "KV cache and queue per replica"
DISAGG_TITLE = "KV cache and queue per instance"  # a disaggregated run's prefill and decode instances
# 16 distinct line styles: the shared series colours, then the same hues darker and dashed
PALETTE = tuple((c, "solid") for c in SERIES_COLORS) + tuple((shade(c, -0.35), "dash") for c in SERIES_COLORS)
TABLE_STATS = ("throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "busy")


def shown_replicas(replicas: int, max_lines: int = MAX_LINES) -> list[int]:
    """The replicas that get a line: all of them up to ``max_lines``, else ``max_lines`` spread evenly over the
    fleet (the first and the last included)."""
    n = int(replicas)
    if n <= max_lines:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, max_lines)})


def replica_name(replica: int, per_node: int) -> str:
    """"replica 3", or "replica 3 (node 1)" when a node holds more than one replica."""
    return f"replica {replica}" if per_node <= 1 else f"replica {replica} (node {replica // per_node})"


# the k-th instance of a role: the role's colour, then darker / lighter shades of it, and a dash per round
_ROLE_SHADES = (0.0, -0.35, 0.4, -0.6, 0.6)
_ROLE_DASHES = ("solid", "dash", "dot", "dashdot")


def disagg_roles(dis, dep) -> dict[int, tuple[str, int]]:
    """replica -> (its line's name, its KV capacity in blocks) for a disaggregated run of ``dep`` split by ``dis``
    (a ``batching.sim.topology.disagg.Disagg``): "prefill 0".."prefill P-1", then "decode P".."decode P+D-1", each role's
    capacity that of one instance at its own TP (``Disagg.deployment(dep, role).kv_capacity_blocks``)."""
    out = {}
    base = 0
    for role, count in (("prefill", dis.prefill_instances), ("decode", dis.decode_instances)):
        cap = int(dis.deployment(dep, role).kv_capacity_blocks)
        for i in range(int(count)):
            out[base + i] = (f"{role} {base + i}", cap)
        base += int(count)
    return out


def _role_style(name: str, k: int) -> tuple[str, str]:
    """(colour, dash) of the k-th line of a role ("prefill 0" -> the prefill colour)."""
    color = DISAGG_COLORS.get(name.split(" ")[0], PALETTE[0][0])
    amount = _ROLE_SHADES[k % len(_ROLE_SHADES)]
    return (shade(color, amount) if amount else color), _ROLE_DASHES[(k // len(_ROLE_SHADES)) % len(_ROLE_DASHES)]


def shown_text(shown_reps: Sequence[int], replicas: int) -> str:
    """Which replicas have a line, for the caption: "" when all do."""
    if len(shown_reps) >= replicas:
        return ""
    return (f"{len(shown_reps)} of {replicas} replicas have a line (spread evenly over the fleet: "
            f"{', '.join(map(str, shown_reps))}); the table lists every replica.")


SUBTITLE_LINE_PX = 16  # the subtitle's second line (the binning under the fleet)


def _height(lines: int) -> int:
    """Tall enough for a legend entry per line (about 25 px each) beside the two panels, no scrolling."""
    return max(560, 240 + 25 * int(lines))


@functools.lru_cache(maxsize=8)
def _layout(height: int = 560) -> go.Layout:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("KV cache in use (% of each replica's capacity)",
                                        "Requests waiting for admission (per replica)"))
    fig.update_layout(template=TEMPLATE, height=height, margin=dict(t=TOP_MARGIN_SUBPLOTS + SUBTITLE_LINE_PX),
                      title=dict(text=TITLE),
                      hovermode="closest")
    fig.update_yaxes(title_text="KV used (%)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Requests (count)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="Simulated time (s)", row=2, col=1)
    fig.update_annotations(font_size=13)
    return fig.layout


def replica_series(steps: pd.DataFrame, replicas: Sequence[int], max_points: int = MAX_POINTS
                   ) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]], float]:
    """(bin starts, {replica: {"kv_blocks", "waiting": time-weighted mean per bin}}, bin width in s) on one time
    grid for all ``replicas``: as many bins as twice the most steps a shown replica ran, within
    [MIN_POINTS, max_points]."""
    steps = steps[steps["replica"].isin(list(replicas))]
    counts = steps["replica"].value_counts()
    bins = int(min(max_points, max(MIN_POINTS, 2 * (int(counts.max()) if len(counts) else 0))))
    start = float(steps["start_s"].min())
    end = float((steps["start_s"] + steps["duration_s"]).max())
    if not end > start:
        end = start + 1.0
    edges = np.linspace(start, end, bins + 1)
    by_rep = dict(tuple(steps.groupby("replica")))
    out = {}
    for rep in replicas:
        part = by_rep.get(rep)
        if part is None or part.empty:
            out[rep] = {"kv_blocks": np.zeros(bins), "waiting": np.zeros(bins)}
        else:
            out[rep] = time_average(part, ("kv_blocks", "waiting"), edges)
    return edges[:-1], out, float(edges[1] - edges[0])


def replica_kv_queue(steps: pd.DataFrame, kv_capacity_tokens: int, replicas: int, per_node: int = 1,
                     subtitle: str = "", max_lines: int = MAX_LINES, max_points: int = MAX_POINTS,
                     roles: Mapping[int, tuple[str, int]] | None = None) -> go.Figure:
    """KV cache in use (% of a replica's capacity) above and requests waiting below, over time, one line per shown
    replica (``shown_replicas``) in both panels; a legend entry toggles a replica in both. ``replicas``: the
    fleet's replica count; ``per_node``: replicas per node (names say the node when it holds more than one).
    ``roles``: a disaggregated run's instances (``disagg_roles``: replica -> (name, KV capacity in blocks)), which
    name the lines and give each its own capacity instead of ``kv_capacity_tokens``."""
    reps = shown_replicas(replicas, max_lines)
    fig = go.Figure(layout=_layout(_height(len(reps))))
    if steps.empty or "replica" not in steps:
        fig.add_annotation(text="No data to show", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                           font=dict(size=14, color="#6B6B6B"))
        return fig
    if roles is not None:
        fig.layout.title.text = DISAGG_TITLE
        fig.layout.annotations[0].text = "KV cache in use (% of each instance's own capacity)"
        fig.layout.annotations[1].text = "Requests waiting for admission (per instance)"
    x, series, width = replica_series(steps, reps, max_points)
    x = f32(x)
    cap = max(1, int(kv_capacity_tokens))
    note = f"time-weighted mean per {width:.3g}-s bin ({len(x):,} points per line)"
    # the fleet and the binning on lines of their own: one line of both was cut at a document's width
    fig.layout.title.subtitle = dict(text="<br>".join(t for t in (subtitle, note) if t), font=dict(SUBTITLE_FONT))
    trace = line_trace(len(x))
    seen: dict[str, int] = {}
    for i, rep in enumerate(reps):
        if roles is not None and rep in roles:
            name, cap_blocks = roles[rep]
            role = name.split(" ")[0]
            color, dash = _role_style(name, seen.get(role, 0))
            seen[role] = seen.get(role, 0) + 1
            kv = np.minimum(series[rep]["kv_blocks"] / max(1, int(cap_blocks)) * 100.0, 100.0)
        else:
            color, dash = PALETTE[i % len(PALETTE)]
            name = replica_name(rep, per_node)
            kv = np.minimum(series[rep]["kv_blocks"] * KV_BLOCK_TOKENS / cap * 100.0, 100.0)
        line = dict(color=color, dash=dash, width=1.5, shape="hv")
        fig.add_trace(trace(x=x, y=f32(kv), name=name, legendgroup=name, mode="lines", line=line, xaxis="x",
                            yaxis="y", hovertemplate=f"{name}<br>t = %{{x:,.1f}} s<br>KV used: %{{y:.1f}} %"
                                                     "<extra></extra>"))
        fig.add_trace(trace(x=x, y=f32(series[rep]["waiting"]), name=name, legendgroup=name, showlegend=False,
                            mode="lines", line=line, xaxis="x2", yaxis="y2",
                            hovertemplate=f"{name}<br>t = %{{x:,.1f}} s<br>waiting: %{{y:,.1f}}<extra></extra>"))
    return fig


def replica_frame(by_replica: Mapping[str, Mapping], per_node: int = 1) -> pd.DataFrame:
    """One row per replica of ``summary()["by_replica"]`` as text with units: its node, requests routed to it,
    output throughput over the fleet's wall time, TTFT and TPOT P50/P99, busy share, peak requests waiting."""
    rows = []
    for key in sorted(by_replica, key=int):
        d = by_replica[key]
        row = {"Replica": int(key), "Node": int(d.get("node", int(key) // max(1, per_node))),
               "Requests": f"{int(d.get('num_requests', 0)):,}"}
        for stat in TABLE_STATS:
            row[_HEADERS[stat]] = shown(stat, d.get(stat))
        peak = d.get("peak_waiting")
        row["Peak waiting"] = MISSING if peak is None else f"{int(peak):,}"
        rows.append(row)
    return pd.DataFrame(rows).set_index("Replica") if rows else pd.DataFrame()


_HEADERS = {"throughput_output_tok_s": "Output throughput", "ttft_p50_s": "TTFT P50", "ttft_p99_s": "TTFT P99",
            "tpot_p50_s": "TPOT P50", "tpot_p99_s": "TPOT P99", "busy": "Busy"}
