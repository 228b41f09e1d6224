"""Plotly figure builders for the dashboard and the reports (no Streamlit here).

Every builder returns a ``go.Figure`` that uses the one shared template
(``pio.templates["batching"]``, registered on import), has a title and axis titles with
units. Times come in seconds from the library; TPOT and ITL are shown in milliseconds.
Policies are coloured by name (``charts.colors``), the same on every page; log axes carry
decade (or 1-2-5) labels from ``log_axis``.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from batching.charts.colors import DISAGG_COLORS, SPEC_COLORS, alpha, policy_colors
from batching.charts.text import class_label, literal
from batching.sim.metrics import hist_percentile
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.studies.compare import is_unbounded

UNBOUNDED_TEXT = "unbounded"  # written where an overloaded policy's latency bar would stand (issue 24 item 8)

TEMPLATE = "batching"
FONT = "Inter, 'Source Sans Pro', 'Helvetica Neue', Arial, sans-serif"
SERIES_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#9D755D", "#EECA3B")
CLASS_COLORS = ("#D1495B", "#2E86AB", "#66A61E", "#8E6C8A", "#EDAE49", "#00798C", "#30638E", "#7A6C5D")
TOKEN_COLORS = {"prefill": "#F58518", "decode": "#4C78A8", "padded": "#BAB0AC"}
SUBTITLE_FONT = {"size": 12, "color": "#6B6B6B"}
# room above the plot: title, subtitle, and a subplot's own title below them (pixels)
TOP_MARGIN = 96
TOP_MARGIN_SUBPLOTS = 112

# metric -> (name, unit shown, factor from seconds)
LATENCY_UNITS = {
    "ttft": ("TTFT", "s", 1.0),
    "tpot": ("TPOT", "ms", 1e3),
    "e2e": ("E2E latency", "s", 1.0),
    "queue_delay": ("Queue delay", "s", 1.0),
}
TIMELINE_MAX_ROWS = 4000
TIMELINE_WINDOW = 100  # requests the timeline opens on
# The dashboard's timeline draws at most this many points (3 per segment: start, end, a break): the first
# TIMELINE_WINDOW requests in full, then every k-th of the rest (a note says which). About 2,000 rows of segments
# fit the ~400 pixels of plot height several times over, so the zoomed-out view looks the same; every request stays
# in the Requests CSV and the HTML report.
TIMELINE_POINT_BUDGET = 6000
# Up to this many points a line chart is SVG (go.Scatter), above it WebGL (go.Scattergl): headless browsers and
# many laptops render WebGL in software, where a few thousand SVG points draw faster than a WebGL context.
SVG_MAX_POINTS = 10_000
TIME_BINS = 600
RAW_STEPS_MAX = 1500


def register_template() -> None:
    """Register the shared template once (idempotent)."""
    if TEMPLATE in pio.templates:
        return
    # built from scratch, not from plotly_white: Plotly deep-copies the template into every figure, and
    # plotly_white's per-trace defaults make that copy cost ~8 ms a figure
    tpl = go.layout.Template()
    tpl.layout.update(
        font=dict(family=FONT, size=13, color="#262730"),
        colorway=list(SERIES_COLORS),
        # the title a little in from the edge (pad applies with xanchor left), the subtitle under it, and the
        # plot far enough below that a subplot title never touches the subtitle
        title=dict(x=0.0, xanchor="left", y=0.98, yanchor="top", font=dict(size=17), pad=dict(l=10)),
        margin=dict(l=70, r=20, t=TOP_MARGIN, b=60),
        legend=dict(orientation="v", x=1.02, xanchor="left", y=1.0, yanchor="top", bgcolor="rgba(0,0,0,0)",
                    font=dict(size=12), tracegroupgap=6),
        hoverlabel=dict(font=dict(family=FONT)),
        paper_bgcolor="white",
        plot_bgcolor="white",
        bargap=0.2,
    )
    for axis in (tpl.layout.xaxis, tpl.layout.yaxis):
        # axis titles at the body size: a rotated y title longer than the plot is tall would run into the
        # subtitle above it
        axis.update(showline=True, linecolor="#9A9A9A", ticks="outside", gridcolor="#ECECEC", zeroline=False,
                    automargin=True, title=dict(standoff=8, font=dict(size=13)))
    pio.templates[TEMPLATE] = tpl


register_template()


# ---------------------------------------------------------------- helpers


def slug(*parts: object) -> str:
    """A file-name-safe, descriptive name from parts (e.g. for PNG downloads)."""
    text = "_".join(str(p) for p in parts if p not in (None, ""))
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-_.")
    return text[:150] or "chart"


def f32(values) -> np.ndarray:
    """Plot coordinates as float32: Plotly sends numpy arrays as typed arrays, so this halves a figure's bytes;
    float32 keeps 7 significant digits (60 µs at 10 minutes of simulated time), far below a pixel."""
    return np.asarray(values, dtype=np.float32)


def line_trace(points: int):
    """The line trace class for this many points: SVG (go.Scatter) up to ``SVG_MAX_POINTS``, else WebGL."""
    return go.Scatter if points <= SVG_MAX_POINTS else go.Scattergl


def png_config(filename: str) -> dict:
    """Plotly modebar config: PNG download named ``filename`` at scale 2."""
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": slug(filename), "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    }


def _title(text: str, subtitle: str | None = None) -> dict:
    out: dict = {"text": text}
    if subtitle:
        out["subtitle"] = {"text": subtitle, "font": dict(SUBTITLE_FONT)}
    return out


@functools.lru_cache(maxsize=128)
def _layout(title: str, subtitle: str | None, height: int) -> go.Layout:
    return go.Layout(template=TEMPLATE, title=_title(title, subtitle), height=height)


def _figure(title: str, subtitle: str | None = None, height: int = 420) -> go.Figure:
    # from a layout built once per title (validating it again each rerun costs ~4 ms; Plotly copies it in)
    return go.Figure(layout=_layout(title, subtitle, height))


def _from_skeleton(build, *args) -> go.Figure:
    """A new figure on a copy of the layout ``build(*args)`` makes, built once per arguments (``make_subplots`` and
    its axis updates cost ~18 ms a figure; a copy ~2 ms). Traces then name their axes ("x2", "y2"): a copied
    layout has no subplot grid for ``row=``/``col=``."""
    return go.Figure(layout=build(*args))


def _fmt_value(value: float, unit: str) -> str:
    if not np.isfinite(value):
        return "n/a"
    if unit == "ms":
        return f"{value:,.1f} ms"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    if abs(value) >= 1:
        return f"{value:,.2f} {unit}"
    return f"{value:.3g} {unit}"


def _no_data(fig: go.Figure, text: str = "No data to show") -> go.Figure:
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#6B6B6B"))
    return fig


# ---------------------------------------------------------------- log axes


def log_ticks(values, most: int = 8) -> list[float] | None:
    """Tick values for a log axis over these values: the decades (1, 10, 100, ...) when at least three fall in
    the range, else 1-2-5 steps, else finer; None (Plotly's own) when nothing is positive."""
    v = np.asarray(values, float).ravel()
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return None
    lo, hi = float(v.min()) / 1.05, float(v.max()) * 1.05  # about the range Plotly shows
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)

    def within(mantissas) -> list[float]:
        ticks = [float(f"{m * 10.0 ** k:.12g}") for k in decades for m in mantissas]
        return [t for t in ticks if lo <= t <= hi]

    ticks = within((1.0,))
    if len(ticks) >= 3:
        step = math.ceil(len(ticks) / most)  # very wide ranges: every other decade, ...
        return ticks[::step]
    tenths = tuple(round(1.0 + 0.1 * i, 1) for i in range(90))  # a narrow range (20-25 ms): 20, 21, ... 25
    for mantissas in ((1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0), tenths):
        ticks = within(mantissas)
        if len(ticks) >= 3:
            break
    if mantissas is tenths:
        return ticks[::math.ceil(len(ticks) / most)] or None
    return ticks[:most * 2] or None


def tick_text(t: float) -> str:
    """A log tick as people write it: 0.01, 0.5, 1, 20, 1,000, 10k, 1M."""
    if t >= 1e9:
        return f"{t / 1e9:g}G"
    if t >= 1e6:
        return f"{t / 1e6:g}M"
    if t >= 1e4:
        return f"{t / 1e3:g}k"
    return f"{t:,.0f}" if t >= 1 else f"{t:g}"


def log_axis(fig: go.Figure, axis: str, values, **where) -> None:
    """Make an axis ("x" or "y") log with clean labels: decades (minor ticks at 2-9 between them) or 1-2-5 when
    the data span less than two decades; never Plotly's crowded small digits. ``where``: row/col of a subplot."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(**log_axis_update(values), **where)


def log_axis_update(values) -> dict:
    """The properties ``log_axis`` sets on an axis, as a plain dict (for figures built without ``row=``/``col=``:
    ``fig.update_layout(yaxis2=log_axis_update(values))``)."""
    ticks = log_ticks(values)
    kw: dict = {"type": "log"}
    if ticks:
        kw.update(tickmode="array", tickvals=ticks, ticktext=[tick_text(t) for t in ticks])
        ratios = [b / a for a, b in zip(ticks, ticks[1:])]
        if ratios and min(ratios) >= 9.99:  # decade labels: unlabelled minor ticks at 2..9 help reading
            kw["minor"] = dict(ticks="outside", ticklen=3, dtick="D1", showgrid=False)
    else:
        kw.update(dtick=1, exponentformat="power")  # no data: decades, whatever the range
    return kw


def _latency_values(df: pd.DataFrame, metric: str) -> np.ndarray:
    _, _, factor = LATENCY_UNITS[metric]
    v = df[f"{metric}_s"].to_numpy(dtype=float) * factor
    return v[np.isfinite(v)]


def _log_edges(values: Sequence[np.ndarray], bins: int = 50) -> np.ndarray | None:
    pos = np.concatenate([v[v > 0] for v in values]) if values else np.zeros(0)
    if pos.size == 0:
        return None
    lo, hi = float(pos.min()), float(pos.max())
    if hi <= lo * 1.0001:
        lo, hi = lo / 1.5, hi * 1.5
    return np.logspace(np.log10(lo), np.log10(hi) + 1e-9, bins + 1)


def _step_xy(edges: np.ndarray, counts: np.ndarray, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Outline of a histogram as a step line: x at bin edges, y the counts, closed at ``floor`` at both ends
    (empty bins also at ``floor``: on a log count axis that is the bottom of the axis, not zero)."""
    x = np.repeat(edges, 2)[1:-1]
    y = np.maximum(np.repeat(counts.astype(float), 2), floor)
    return np.concatenate(([edges[0]], x, [edges[-1]])), np.concatenate(([floor], y, [floor]))


def _hist_traces(fig: go.Figure, values: Mapping[str, np.ndarray], colors: Mapping[str, str], unit: str,
                 edges: np.ndarray, markers: bool = True, **cell) -> None:
    """Filled step outlines per series on shared log bins, with P50/P99 marker lines."""
    ymax = 0.0
    hists = {}
    for name, v in values.items():
        counts, _ = np.histogram(v[v > 0], bins=edges)
        hists[name] = counts
        ymax = max(ymax, float(counts.max()) if counts.size else 0.0)
    for name, counts in hists.items():
        x, y = _step_xy(edges, counts)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=name, fill="tozeroy",
                                 line=dict(color=colors[name], width=1.5), fillcolor=alpha(colors[name], 0.3),
                                 hovertemplate=f"{name}<br>%{{x:.3g}} {unit}: %{{y:,.0f}}<extra></extra>"),
                      **cell)
        if not markers or not len(values[name]):
            continue
        top = ymax * (1.05 - 0.09 * list(hists).index(name))  # staggered, so labels of series do not collide
        _percentile_lines(fig, name, values[name], colors[name], unit, top, len(hists) > 1, **cell)


def _percentile_lines(fig: go.Figure, name: str, values: np.ndarray | None, color: str, unit: str, ymax: float,
                      several: bool, at: Mapping[int, float] | None = None, y0: float = 0.0,
                      p99_height: float = 0.93, **cell) -> None:
    """P50 (dashed) and P99 (dotted) vertical lines from ``y0`` up, out of the legend, values in the hover text;
    the P99 line stops at ``p99_height`` of the P50's top so the two labels do not overlap."""
    for q, dash, height in ((50, "dash", 1.0), (99, "dot", p99_height)):
        p = float(np.percentile(values, q)) if at is None else float(at[q])
        if not np.isfinite(p) or p <= 0:
            continue
        label = f"{name} P{q}" if several else f"P{q}"
        fig.add_trace(go.Scatter(x=[p, p], y=[y0, ymax * height], mode="lines+text", legendgroup=name,
                                 showlegend=False, name=f"{name} P{q}", text=["", f"P{q}"],
                                 textposition="top center", textfont=dict(size=10, color=color),
                                 line=dict(color=color, width=2, dash=dash),
                                 hovertemplate=f"{label} = {_fmt_value(p, unit)}<extra></extra>"), **cell)


# ---------------------------------------------------------------- home: showdown

LIGHT_ALPHA = 0.35  # the "at this load" and P50 bars: the policy's colour, light; capacity and P99 solid


@functools.lru_cache(maxsize=4)
def _showdown_layout() -> go.Layout:
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1,
                        subplot_titles=("Throughput at this load vs capacity", "TTFT (log scale)",
                                        "TPOT (log scale)"))
    fig.update_layout(template=TEMPLATE, height=460, barmode="group", margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      title=_title("Strategy showdown: throughput and latency by policy",
                                   "One colour per policy; light bars: at this load / P50, solid bars: capacity / "
                                   "P99"))
    fig.update_yaxes(title_text="Throughput (tok/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TTFT (s)", row=1, col=2)
    fig.update_yaxes(title_text="TPOT (ms)", row=1, col=3)
    fig.update_xaxes(title_text="Policy")
    fig.update_annotations(font_size=13)
    return fig.layout


def showdown_bars(summaries: Mapping[str, dict]) -> go.Figure:
    """Grouped bars per policy in the policy's colour: throughput at this load (light) vs capacity (solid),
    TTFT and TPOT P50 (light) and P99 (solid) on log axes. Plain-dict traces on a cached layout
    (``make_subplots`` and validated bars cost ~60 ms a figure, every home-page rerun)."""
    names = list(summaries)
    colors = policy_colors(names)
    series = [
        (1, "At this load", "throughput_output_tok_s", 1.0, False, "tok/s"),
        (1, "Capacity", "capacity_output_tok_s", 1.0, True, "tok/s"),
        (2, "P50", "ttft_p50_s", 1.0, False, "s"),
        (2, "P99", "ttft_p99_s", 1.0, True, "s"),
        (3, "P50", "tpot_p50_s", 1e3, False, "ms"),
        (3, "P99", "tpot_p99_s", 1e3, True, "ms"),
    ]
    values: dict[int, list[float]] = {1: [], 2: [], 3: []}
    traces = []
    for col, label, key, factor, solid, unit in series:
        # an overloaded policy's latencies grow with the run's length: no bar, the word "unbounded" instead
        y = [float("nan") if is_unbounded(key, summaries[n]) else _num(summaries[n].get(key)) * factor for n in names]
        values[col] += y
        line = [colors[n] for n in names]
        fill = line if solid else [alpha(c, LIGHT_ALPHA) for c in line]
        axis = "" if col == 1 else str(col)
        traces.append(dict(type="bar", x=names, y=y, name=label, legendgroup=label, showlegend=False,
                           xaxis=f"x{axis}", yaxis=f"y{axis}",
                           marker=dict(color=fill, line=dict(color=line, width=1.5)),
                           hovertemplate=f"%{{x}} {label}: %{{y:,.3g}} {unit}<extra></extra>"))
    fig = go.Figure(data=traces, layout=_showdown_layout())
    fig.update_layout(yaxis2=log_axis_update(values[2]), yaxis3=log_axis_update(values[3]))
    _mark_unbounded(fig, [n for n in names if summaries[n].get("overloaded")], ("2", "3"))
    return fig


def _mark_unbounded(fig: go.Figure, names: Sequence[str], axes: Sequence[str]) -> None:
    """"unbounded" written upright from the bottom of each latency panel (``axes``: "" for x/y, "2" for x2/y2) at
    each overloaded policy, where its bar would stand: its queue grows through the run, so a bar would show the
    run's length (~500 s), not the policy."""
    for axis in axes:
        for n in names:
            fig.add_annotation(x=n, xref=f"x{axis}", y=0, yref=f"y{axis} domain", text=UNBOUNDED_TEXT,
                               textangle=-90, yanchor="bottom", showarrow=False, font=dict(size=12, color="#B00020"),
                               hovertext="Overloaded at this rate: the queue grows through the run, so its latency "
                                         "measures the run's length and is not plotted.")


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def class_ttft_bars(summaries: Mapping[str, dict], quantile: int = 99) -> go.Figure:
    """P99 TTFT of each priority class, grouped by policy."""
    fig = _figure(f"P{quantile} TTFT by priority class", "Does the high-priority class get its first token sooner?",
                  height=400)
    names = list(summaries)
    classes: dict[str, str] = {}
    for s in summaries.values():
        for level, cls in sorted(s.get("by_priority", {}).items(), key=lambda kv: int(kv[0])):
            classes.setdefault(level, literal(cls.get("class_name", f"class {level}")))
    if not classes:
        return _no_data(fig)
    shown = []
    for level, cname in classes.items():
        y = [np.nan if summaries[n].get("overloaded") else
             summaries[n].get("by_priority", {}).get(level, {}).get(f"ttft_p{quantile}_s", np.nan) for n in names]
        shown += y
        fig.add_trace(go.Bar(x=names, y=y, name=f"{cname} (priority {level})",
                             marker_color=CLASS_COLORS[int(level) % len(CLASS_COLORS)],
                             hovertemplate=f"%{{x}} · {cname}: %{{y:,.3g}} s<extra></extra>"))
    fig.update_layout(barmode="group", xaxis_title="Policy", yaxis_title=f"P{quantile} TTFT (s, log scale)")
    log_axis(fig, "y", shown)
    _mark_unbounded(fig, [n for n in names if summaries[n].get("overloaded")], ("",))
    return fig


# ---------------------------------------------------------------- explore: one run


def timeline_sample(requests: pd.DataFrame, max_rows: int = TIMELINE_MAX_ROWS) -> tuple[pd.DataFrame, str | None]:
    """Every k-th request by arrival when there are more than max_rows, with a note saying so."""
    n = len(requests)
    if n <= max_rows:
        return requests, None
    k = int(np.ceil(n / max_rows))
    sample = requests.sort_values("arrival_s", kind="stable").iloc[::k]
    return sample, (f"Showing {len(sample):,} of {n:,} requests (every {_ordinal(k)} by arrival) to keep the chart "
                    "responsive.")


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


# prefill/decode disaggregation (batching/sim/topology/disagg.py): the request table's columns of a disaggregated run and,
# on the timeline, the two segments between a request's first token (its prefill instance) and its decode
DISAGG_COLUMNS = ("prefill_done_s", "decode_arrival_s", "kv_transfer_s", "decode_queue_s")
DISAGG_TRANSFER = "KV transfer"
DISAGG_WAIT = "waiting on the decode instance"


def has_disagg(requests: pd.DataFrame | None) -> bool:
    """Whether a request table comes from a disaggregated run (it has the transfer and decode-queue columns)."""
    return requests is not None and all(c in requests for c in DISAGG_COLUMNS)


def disagg_times(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(pull start: the decode instance's next step after the handoff, decode arrival: the KV transfer done, decode
    start: admitted on its decode instance) per row of a disaggregated run's requests, NaN for a request done at its
    first token; None for any other run."""
    if not has_disagg(df):
        return None
    arrive = df["decode_arrival_s"].to_numpy(float)
    pull = arrive - df["kv_transfer_s"].to_numpy(float)
    return pull, arrive, arrive + df["decode_queue_s"].to_numpy(float)


def _decode_from(df: pd.DataFrame, first: np.ndarray) -> np.ndarray:
    """Where a row's decode segment starts: its first token, or its admission on a decode instance."""
    times = disagg_times(df)
    if times is None:
        return first
    return np.where(np.isfinite(times[2]), times[2], first)


def _prefill_end(df: pd.DataFrame, first: np.ndarray) -> np.ndarray:
    """Where a row's prefill segment ends: its first token, or (a disaggregated run) the prefill instance's token,
    after which the KV moves and the decode instance sends the first token the client sees."""
    return df["prefill_done_s"].to_numpy(float) if has_disagg(df) else first


def _segment_counts(df: pd.DataFrame) -> np.ndarray:
    """Segments ``request_timeline`` draws per row: queued, prefill, decode, held (each only when it has length);
    a disaggregated run's KV transfer and wait for a decode slot too."""
    arrival, sched, first, finish, release = (df[c].to_numpy(float) for c in (
        "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "release_s"))
    times = disagg_times(df)
    pre_end = _prefill_end(df, first)
    with np.errstate(invalid="ignore"):
        counts = ((sched > arrival).astype(int) + (pre_end > sched) + (finish > _decode_from(df, first))
                  + ((release - finish) > 1e-6))
        if times is not None:
            counts += (times[0] > pre_end).astype(int) + (times[1] > times[0]) + (times[2] > times[1])
    return counts


def timeline_rows(requests: pd.DataFrame, max_rows: int = TIMELINE_MAX_ROWS, window: int = TIMELINE_WINDOW,
                  max_points: int | None = None) -> tuple[pd.DataFrame, str | None]:
    """The rows the request timeline draws, in arrival order, and a note saying what is shown (None: every request).

    ``max_points`` None: every request up to ``max_rows`` (``timeline_sample``). Else at most that many points: the
    first ``window`` requests (the view the chart opens on) in full, then every k-th of the others, k as small as
    the budget allows."""
    if max_points is None:
        df, note = timeline_sample(requests, max_rows)
        return df.sort_values("arrival_s", kind="stable"), note
    df = requests.sort_values("arrival_s", kind="stable")
    n = len(df)
    if n <= window:
        return df, None
    points = 3 * _segment_counts(df)
    if points.sum() <= max_points:
        return df, None
    rest = points[window:]
    room = max(int(max_points - points[:window].sum()), 1)
    k = max(2, math.ceil(rest.sum() / room))
    while k < len(rest) and rest[::k].sum() > room:
        k += 1
    keep = np.concatenate([np.arange(window), window + np.arange(0, n - window, k)])
    return df.iloc[keep], (
        f"The timeline draws the first {window} requests in full, then every {_ordinal(k)} of the other "
        f"{n - window:,} ({len(keep):,} of {n:,} requests, at most {max_points:,} points, so the chart stays quick "
        "to draw); the Requests CSV has every request.")


# speculative decoding: the step table's columns (batching/sim/simulate.py) and, on the timeline, the most segments
# of each kind its forward-pass rows draw (more steps than that are packed per time bin; see spec_step_segments)
SPEC_STEP_COLUMNS = ("spec_seqs", "spec_proposed", "spec_accepted", "draft_s")
SPEC_SEGMENTS_MAX = TIME_BINS
SPEC_MAX_REPLICA_ROWS = 8  # a fleet's first replicas only: more rows would crowd out the requests the chart opens on
SPEC_DRAFTING = "drafting"
SPEC_VERIFYING = "verification (target forward pass)"
SPEC_ACCEPTED = "accepted draft tokens"
SPEC_REJECTED = "rejected draft tokens"


def has_spec(steps: pd.DataFrame | None) -> bool:
    """Whether a step table comes from a run with speculative decoding (it has the speculation columns)."""
    return steps is not None and len(steps) > 0 and all(c in steps for c in SPEC_STEP_COLUMNS)


def spec_step_segments(steps: pd.DataFrame, max_segments: int = SPEC_SEGMENTS_MAX
                       ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], str]:
    """The timeline's forward-pass rows of a speculating run: {"drafting" | "verification": (start_s, end_s,
    row)} and a note saying how they are drawn. Replica r is row -2 - r (below the first request, a row apart).

    Each step splits into its drafting time (``draft_s``, first: the draft model or head proposes) and the rest
    of ``duration_s`` (the target's forward pass that verifies the drafts, or an ordinary pass). A replica with
    more steps than its share of ``max_segments`` is drawn per time bin instead: each bin's drafting seconds, then
    its verification seconds, from the bin's first step on (steps of a replica never overlap, so packed segments
    stay within the time its steps took). Either way the segments' lengths add up to ``draft_s`` and
    ``duration_s - draft_s`` exactly. A fleet draws its first ``SPEC_MAX_REPLICA_ROWS`` replicas (said in the
    note)."""
    reps = np.sort(steps["replica"].unique()) if "replica" in steps else np.zeros(1, int)
    total = len(reps)
    reps = reps[:SPEC_MAX_REPLICA_ROWS]
    per_rep = max(50, int(max_segments) // max(1, len(reps)))
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {"drafting": [], "verification": []}
    binned = None
    for i, rep in enumerate(reps):
        part = steps if "replica" not in steps else steps[steps["replica"] == rep]
        part = part.sort_values("start_s", kind="stable")
        start = part["start_s"].to_numpy(float)
        dur = part["duration_s"].to_numpy(float)
        draft = np.clip(part["draft_s"].to_numpy(float), 0.0, dur)
        if len(start) > per_rep:
            end = float((start + dur).max())
            edges = np.linspace(float(start[0]), end, per_rep + 1)
            idx = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, per_rep - 1)
            used = np.unique(idx)
            first = np.searchsorted(idx, used)  # idx is sorted: each used bin's first step
            start = start[first]
            draft = np.bincount(idx, draft, per_rep)[used]
            dur = np.bincount(idx, dur, per_rep)[used]
            binned = float(edges[1] - edges[0])
        row = np.full(len(start), -2.0 - i)
        parts["drafting"].append((start, start + draft, row))
        parts["verification"].append((start + draft, start + dur, row))
    out = {}
    for kind, chunks in parts.items():
        x0, x1, y = (np.concatenate([c[j] for c in chunks]) for j in range(3))
        keep = x1 > x0
        out[kind] = (x0[keep], x1[keep], y[keep])
    rows = "bottom row: forward passes" if len(reps) == 1 else (
        "bottom rows: each replica's forward passes" if total == len(reps) else
        f"bottom rows: the forward passes of the first {len(reps)} of {total} replicas")
    note = (f"{rows}, drafting apart from verification" if binned is None else
            f"{rows}, drafting and verification summed per {binned:.3g}-s bin")
    return out, note


def _segment_xy(x0: np.ndarray, x1: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments as one line with NaN breaks: (x0, x1, NaN) and (y, y, NaN) per segment."""
    k = len(x0)
    x = np.empty(3 * k)
    x[0::3], x[1::3], x[2::3] = x0, x1, np.nan
    yy = np.empty(3 * k)
    yy[0::3] = yy[1::3] = y
    yy[2::3] = np.nan
    return x, yy


def _spec_timeline_traces(fig: go.Figure, steps: pd.DataFrame) -> tuple[int, str]:
    """The forward-pass rows of a speculating run on the request timeline: one trace per kind (drafting, then
    verification), NaN breaks between segments; one step's seconds as float64 (its drafting is under a
    millisecond: in float32 at t = 1,000 s it would be off by a tenth), a bin's as float32. Returns (rows drawn,
    the note)."""
    segments, note = spec_step_segments(steps)
    packed = "summed per" in note  # segments of a bin's steps: long enough for float32
    for kind, name in (("drafting", SPEC_DRAFTING), ("verification", SPEC_VERIFYING)):
        x0, x1, y = segments[kind]
        if not len(x0):  # n-gram speculation drafts on the CPU: no drafting time to draw
            continue
        x, yy = _segment_xy(x0, x1, y)
        if packed:
            x, yy = f32(x), f32(yy)
        fig.add_trace(line_trace(len(x))(
            x=x, y=yy, mode="lines", name=name, legendgroup="forward passes", connectgaps=False,
            line=dict(color=SPEC_COLORS[kind], width=4),
            hovertemplate=f"{name}<br>t = %{{x:,.4f}} s<extra>forward passes</extra>"))
    rows = min(steps["replica"].nunique(), SPEC_MAX_REPLICA_ROWS) if "replica" in steps else 1
    return int(rows), note


def disagg_segments(first: np.ndarray, pull: np.ndarray, arrive: np.ndarray, start: np.ndarray
                    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{"transfer": pull start -> decode arrival, "decode_wait": the prefill instance's token -> pull start (the
    decode instance's next step) and decode arrival -> decode start (a slot)} as (start_s, end_s, index of the row),
    only the segments with length (a request done at its first token has none)."""
    out = {}
    for kind, spans in (("transfer", ((pull, arrive),)), ("decode_wait", ((first, pull), (arrive, start)))):
        x0s, x1s, idx = [], [], []
        for x0, x1 in spans:
            with np.errstate(invalid="ignore"):
                keep = np.flatnonzero(x1 > x0)
            x0s.append(x0[keep])
            x1s.append(x1[keep])
            idx.append(keep)
        out[kind] = (np.concatenate(x0s), np.concatenate(x1s), np.concatenate(idx))
    return out


def _disagg_timeline_traces(fig: go.Figure, trace, row: np.ndarray, first: np.ndarray, pull: np.ndarray,
                            arrive: np.ndarray, start: np.ndarray) -> None:
    """A disaggregated run's KV transfers and waits for a decode slot on the request timeline: one trace per kind,
    NaN breaks between segments, every class in one colour; x as float64 (a transfer takes well under a
    millisecond: float32 at t = 1,000 s is off by a sixteenth of one), the length in ms in the hover; the transfers
    with markers too, so a sub-millisecond one shows as a dot before zooming in."""
    for kind, name, line, mode in (("transfer", DISAGG_TRANSFER, dict(width=6), "lines+markers"),
                                   ("decode_wait", DISAGG_WAIT, dict(width=2, dash="dot"), "lines")):
        x0, x1, idx = disagg_segments(first, pull, arrive, start)[kind]
        if not len(x0):
            continue
        x, y = _segment_xy(x0, x1, row[idx].astype(float))
        ms = np.repeat((x1 - x0) * 1e3, 3)
        # a transfer is a small dot on its row until zoomed in: the markers (no extra points) show where it is
        fig.add_trace(trace(x=x, y=f32(y), customdata=ms, mode=mode, name=name, legendgroup="disaggregation",
                            connectgaps=False, line=dict(color=DISAGG_COLORS[kind], **line), marker=dict(size=4),
                            hovertemplate=f"request %{{y:.0f}} · {name}: %{{customdata:,.3f}} ms<br>"
                                          "t = %{x:,.4f} s<extra>disaggregation</extra>"))


def request_timeline(requests: pd.DataFrame, class_names: Sequence[str] = (),
                     max_rows: int = TIMELINE_MAX_ROWS, window: int = TIMELINE_WINDOW,
                     max_points: int | None = None, steps: pd.DataFrame | None = None) -> go.Figure:
    """One row per request: queued, prefill, decode and held segments, coloured by class.

    The chart opens on the first ``window`` requests (the x and y ranges set to their rows and their time span),
    where single requests can be read; double-click or Autoscale shows the whole run. ``max_points``: draw within
    that many points (``timeline_rows``: the first ``window`` in full, a sample of the rest, said in the subtitle);
    None draws every request up to ``max_rows``. SVG lines up to ``SVG_MAX_POINTS`` points, else WebGL;
    coordinates as float32.

    ``steps`` of a run with speculative decoding (``has_spec``) adds a row of forward passes per replica below the
    requests: each step's drafting time apart from the target's verification pass (``spec_step_segments``), two
    traces in all. Without speculation ``steps`` changes nothing.

    A disaggregated run's requests (``has_disagg``) add two segment kinds, one trace each after the classes': the
    KV transfer (from the decode instance's next step after the prefill instance's token, ``prefill_done_s`` +
    ``kv_pull_wait_s``, to ``decode_arrival_s``) and the waits on the decode instance (for that step, and for a slot:
    ``decode_arrival_s`` -> admission on the decode instance, where the decode segment then starts; the first token
    the client sees comes from its first step).
    """
    df, note = timeline_rows(requests, max_rows, window, max_points)
    fig = _figure("Request timeline: queued, prefill, decode", note or "One row per request, in arrival order",
                  height=520)
    if df.empty:
        return _no_data(fig)
    row = df["request_id"].to_numpy() if "request_id" in df else np.arange(len(df))
    arrival = df["arrival_s"].to_numpy(float)
    sched = df["first_scheduled_s"].to_numpy(float)
    first = df["first_token_s"].to_numpy(float)
    finish = df["finish_s"].to_numpy(float)
    release = df["release_s"].to_numpy(float)
    prio = df["priority"].to_numpy()
    names = list(class_names) or sorted(df["class_name"].unique())
    segments = (
        ("queued", arrival, sched, dict(width=1, dash="dot"), 0.55),
        ("prefill", sched, _prefill_end(df, first), dict(width=4), 1.0),
        ("decode", _decode_from(df, first), finish, dict(width=2), 0.9),
        ("held until batch release", finish, release, dict(width=1, dash="dash"), 0.6),
    )
    trace = line_trace(3 * int(_segment_counts(df).sum()))
    for level in np.unique(prio):
        mask = prio == level
        cname = class_label(names, level)
        color = CLASS_COLORS[int(level) % len(CLASS_COLORS)]
        for seg, start, end, line, opacity in segments:
            with np.errstate(invalid="ignore"):
                m = mask & (end > start)
                if seg.startswith("held"):
                    m &= (end - start) > 1e-6
            if not m.any():
                continue
            k = int(m.sum())
            x = np.empty(3 * k, np.float32)
            x[0::3], x[1::3], x[2::3] = start[m], end[m], np.nan
            y = np.empty(3 * k, np.float32)
            y[0::3] = y[1::3] = row[m]
            y[2::3] = np.nan
            fig.add_trace(trace(x=x, y=y, mode="lines", name=f"{cname} · {seg}", legendgroup=cname,
                                line=dict(color=color, **line), opacity=opacity, connectgaps=False,
                                hovertemplate=f"request %{{y:.0f}} · {seg}<br>t = %{{x:,.2f}} s"
                                              f"<extra>{cname}</extra>"))
    times = disagg_times(df)
    if times is not None:
        fig.layout.title.text = "Request timeline: queued, prefill, KV transfer, decode"
        _disagg_timeline_traces(fig, trace, row, _prefill_end(df, first), *times)
    spec_rows, spec_note = 0, None
    if has_spec(steps):  # after the requests: the legend lists them first
        fig.layout.title.text = "Request timeline: queued, prefill, decode; drafting vs verification"
        spec_rows, spec_note = _spec_timeline_traces(fig, steps)
    # no reversed y axis: Streamlit's plotly.js draws WebGL lines wrongly on a reversed axis
    fig.update_layout(xaxis_title="Simulated time (s)",
                      yaxis_title="Request (arrival order, first at the bottom)" if not spec_rows else
                      "Request (arrival order); below 0: forward passes")
    if len(df) > window:
        # open on the first `window` requests; the data stay whole, so zooming out shows the run
        sampled = f": the first {window}, then a sample" if note and max_points is not None else ""
        ends = np.where(np.isfinite(release), release, np.where(np.isfinite(finish), finish, arrival))
        x0, x1 = float(arrival[:window].min()), float(np.nanmax(ends[:window]))
        pad = 0.02 * max(x1 - x0, 1e-3)
        fig.update_xaxes(range=[x0 - pad, x1 + pad])
        bottom = -1.0 - spec_rows if spec_rows else float(row[0])  # the forward-pass rows, a row apart
        fig.update_yaxes(range=[bottom - 0.5, float(row[window - 1]) + 0.5])
        fig.layout.title.subtitle.text = (
            f"One row per request in arrival order ({len(df):,} of {len(requests):,} drawn{sampled}); opens on the "
            f"first {window}, double-click for all" if note else
            f"One row per request in arrival order; opens on the first {window} of {len(df):,}, double-click for all")
    if spec_note:
        fig.layout.title.subtitle.text = f"{fig.layout.title.subtitle.text}; {spec_note}"
    return fig


def _time_edges(steps: pd.DataFrame, bins: int) -> np.ndarray:
    end = float((steps["start_s"] + steps["duration_s"]).max())
    start = float(steps["start_s"].min())
    if end <= start:
        end = start + 1.0
    return np.linspace(start, end, bins + 1)


def time_average(steps: pd.DataFrame, columns: Sequence[str], edges: np.ndarray) -> dict[str, np.ndarray]:
    """Time-weighted mean of per-step columns over each time bin (0 while idle), averaged over replicas.

    A step's value holds from its start to its end; the integral is exact for any bin width.
    """
    out = {c: np.zeros(len(edges) - 1) for c in columns}
    width = np.diff(edges)
    replicas = steps["replica"].unique() if "replica" in steps else [None]
    for rep in replicas:
        part = steps if rep is None else steps[steps["replica"] == rep]
        part = part.sort_values("start_s", kind="stable")
        t0 = part["start_s"].to_numpy(float)
        t1 = t0 + part["duration_s"].to_numpy(float)
        t1 = np.maximum(t1, t0)
        times = np.empty(2 * len(t0))
        times[0::2], times[1::2] = t0, t1
        times = np.maximum.accumulate(times)
        dur = times[1::2] - times[0::2]
        for c in columns:
            v = part[c].to_numpy(float)
            cum = np.empty(2 * len(t0))
            area = np.cumsum(v * dur)
            cum[1::2] = area
            cum[0::2] = area - v * dur
            integral = np.interp(edges, times, cum, left=0.0, right=area[-1] if len(area) else 0.0)
            out[c] += np.diff(integral) / width
    n = max(1, len(replicas))
    return {c: v / n for c, v in out.items()}


def _per_step_or_binned(steps: pd.DataFrame, columns: Sequence[str], bins: int = TIME_BINS):
    """(start, width, {col: y}, note): raw steps when few and one replica, else time-binned means."""
    replicas = steps["replica"].nunique() if "replica" in steps else 1
    if len(steps) <= RAW_STEPS_MAX and replicas == 1:
        s = steps.sort_values("start_s", kind="stable")
        return (s["start_s"].to_numpy(float), s["duration_s"].to_numpy(float),
                {c: s[c].to_numpy(float) for c in columns}, "one bar per step")
    edges = _time_edges(steps, bins)
    ys = time_average(steps, columns, edges)
    width = float(edges[1] - edges[0])
    note = f"time-weighted mean per {width:.3g}-s bin"
    if replicas > 1:
        note += f", averaged over {replicas} replicas"
    return edges[:-1], np.diff(edges), ys, note


@functools.lru_cache(maxsize=8)
def _composition_layout(spec: bool = False) -> go.Layout:
    decode = ("Decode tokens per step: emitted, and rejected drafts" if spec else
              "Decode tokens per step (one per decoding sequence)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=("Prompt work: prefill tokens and padded slots per step", decode))
    fig.update_layout(template=TEMPLATE, height=520, margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      title=_title("Batch composition: tokens per forward pass"))
    fig.update_layout(hovermode="x unified", legend_traceorder="normal")
    fig.update_yaxes(title_text="Tokens per step", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Tokens per step", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="Simulated time (s)", row=2, col=1)
    fig.update_annotations(font_size=13)
    return fig.layout


def batch_composition(steps: pd.DataFrame, bins: int = TIME_BINS) -> go.Figure:
    """Tokens per forward pass over time in two panels sharing the time axis, each on its own scale: prompt work
    on top (prefill tokens, padded slots stacked on them), decode tokens below.

    Why two panels: a prefill step computes hundreds to thousands of prompt tokens, a decode step one token per
    running sequence, so on one axis (the old single stack) decode was a sliver under the prefill spikes. Separate
    panels keep both in tokens per step, readable and comparable with the knobs (token budget on top, running
    sequences below), which a secondary axis over one stack or a share per step would not.

    With speculative decoding (``has_spec``) the lower panel stacks, on the decode tokens the target emits itself
    (one per decoding sequence), the accepted draft tokens and the rejected ones (computed for nothing; the
    engine counts them in ``padded_tokens``, so the upper panel's padded slots leave them out): two more traces,
    none without speculation.
    """
    cols = ("prefill_tokens", "decode_tokens", "padded_tokens")
    spec = has_spec(steps)
    fig = _from_skeleton(_composition_layout, spec)
    if steps.empty:
        return _no_data(fig)
    series = [("prefill_tokens", "prefill tokens", 1, TOKEN_COLORS["prefill"]),
              ("padded_tokens", "padded slots", 1, TOKEN_COLORS["padded"]),
              ("decode_tokens", "decode tokens", 2, TOKEN_COLORS["decode"])]
    if spec:
        # speculative decoding: the rejected draft tokens are in padded_tokens and the accepted ones in
        # decode_tokens (simulate.py); drawn apart, stacked on the decode tokens the target emits itself (one
        # per decoding sequence), so the top of the lower stack is every token the verification passes computed
        rejected = steps["spec_proposed"].to_numpy(float) - steps["spec_accepted"].to_numpy(float)
        accepted = steps["spec_accepted"].to_numpy(float)
        steps = pd.DataFrame({
            **{c: steps[c] for c in ("start_s", "duration_s", "prefill_tokens") + (("replica",) if "replica" in steps
                                                                                  else ())},
            "padded_tokens": np.maximum(steps["padded_tokens"].to_numpy(float) - rejected, 0.0),
            "decode_tokens": steps["decode_tokens"].to_numpy(float) - accepted,
            "accepted_tokens": accepted, "rejected_tokens": rejected})
        cols += ("accepted_tokens", "rejected_tokens")
        series[2] = ("decode_tokens", "decode tokens (1 per sequence)", 2, TOKEN_COLORS["decode"])
        series += [("accepted_tokens", SPEC_ACCEPTED, 2, SPEC_COLORS["accepted"]),
                   ("rejected_tokens", SPEC_REJECTED, 2, SPEC_COLORS["rejected"])]
    x, width, ys, note = _per_step_or_binned(steps, cols, bins)
    fig.layout.title.subtitle = dict(text=f"Each panel on its own scale; {note.replace('bar', 'value')}",
                                     font=dict(SUBTITLE_FONT))
    xs, index = _step_outline(x, width)
    for col, label, row, color in series:
        axes = ("x", "y") if row == 1 else ("x2", "y2")
        y = np.append(ys[col], 0.0)[index]  # each step's (or bin's) value over its span, 0 in idle gaps
        fig.add_trace(go.Scatter(x=xs, y=f32(y), mode="lines", name=label, xaxis=axes[0], yaxis=axes[1],
                                 stackgroup=f"tokens{row}", fillcolor=color,
                                 line=dict(color=color, width=0.5, shape="hv"),
                                 hovertemplate=f"t = %{{x:,.1f}} s<br>{label}: %{{y:,.0f}} per step<extra></extra>"))
    return fig


def _step_outline(start: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans [start, start + width) as the x of an "hv" step line, and for each x the index of its span's value
    (``len(start)``, meaning 0, where a gap between spans starts and at the end): a filled step area draws what
    stacked bars with no gap between them drew, as one SVG path per series instead of one element per bar
    (~130 ms less to draw in the browser per rerun at 600 bins)."""
    start = np.asarray(start, float)
    end = start + np.asarray(width, float)
    n = len(start)
    gap = np.append(start[1:] > end[:-1] + 1e-9, True)  # a span followed by idle time (or the last one)
    xs = np.empty(n + int(gap.sum()))
    index = np.empty(len(xs), dtype=int)
    pos = np.arange(n) + np.concatenate(([0], np.cumsum(gap)[:-1]))  # where each span's start goes
    xs[pos], index[pos] = start, np.arange(n)
    xs[pos[gap] + 1], index[pos[gap] + 1] = end[gap], n
    return f32(xs), index


KV_CACHED_NAME = "prefix cache only (evictable)"


@functools.lru_cache(maxsize=32)
def _kv_layout(kv_capacity_tokens: int, per_replica: bool, cached: bool = False) -> go.Layout:
    # both fit a half-width column (a longer title is cut at its left edge)
    what = (f"KV + prefix cache (of {int(kv_capacity_tokens):,} tok/replica)" if cached
            else f"KV cache in use (capacity {int(kv_capacity_tokens):,} tokens per replica)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(what,
                                        "Queue depth (per replica)" if per_replica else "Queue depth"))
    fig.update_layout(template=TEMPLATE, height=520, margin=dict(t=TOP_MARGIN_SUBPLOTS),
                      title=_title("KV cache use and queue depth"))
    fig.update_yaxes(title_text="KV used (%)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Requests (count)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="Simulated time (s)", row=2, col=1)
    fig.update_annotations(font_size=13)
    return fig.layout


def kv_and_queue(steps: pd.DataFrame, kv_capacity_tokens: int, bins: int = TIME_BINS) -> go.Figure:
    """KV cache use (% of capacity) and queue depth (waiting, running, swapped) over time.

    With prefix caching, the blocks held only by the prefix cache (``cached_blocks``: free to evict, kept for
    reuse) are their own trace stacked on the blocks running sequences reference (``kv_blocks``), so the top of the
    stack is the cache's whole occupancy and the gap above it is free memory."""
    per_replica = (not steps.empty) and steps.get("replica", pd.Series([0])).nunique() > 1
    cached = (not steps.empty) and "cached_blocks" in steps and bool((steps["cached_blocks"] > 0).any())
    fig = _from_skeleton(_kv_layout, int(kv_capacity_tokens), bool(per_replica), cached)
    if steps.empty:
        return _no_data(fig)
    cols = ("kv_blocks", "waiting", "running", "swapped") + (("cached_blocks",) if cached else ())
    x, _, ys, note = _per_step_or_binned(steps, cols, bins)
    x, ys = f32(x), {c: f32(v) for c, v in ys.items()}
    shape = "hv"
    fig.layout.title.subtitle = dict(text=note.replace("one bar per step", "one point per step").capitalize(),
                                     font=dict(SUBTITLE_FONT))
    cap = max(1, int(kv_capacity_tokens))
    kv_pct = ys["kv_blocks"] * KV_BLOCK_TOKENS / cap * 100.0
    stack = dict(stackgroup="kv") if cached else dict(fill="tozeroy")
    fig.add_trace(go.Scatter(x=x, y=kv_pct, name="KV cache used", mode="lines", **stack,
                             line=dict(color="#72B7B2", shape=shape), xaxis="x", yaxis="y",
                             hovertemplate="t = %{x:,.1f} s<br>KV used: %{y:.1f} %<extra></extra>"))
    if cached:
        cached_pct = ys["cached_blocks"] * KV_BLOCK_TOKENS / cap * 100.0
        fig.add_trace(go.Scatter(x=x, y=cached_pct, name=KV_CACHED_NAME, mode="lines", stackgroup="kv",
                                 fillcolor="rgba(178, 121, 162, 0.35)", xaxis="x", yaxis="y",
                                 line=dict(color="#B279A2", width=1, shape=shape),
                                 hovertemplate="t = %{x:,.1f} s<br>held only by the prefix cache: %{y:.1f} %"
                                               "<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=ys["waiting"], name="waiting (queue)", mode="lines",
                             line=dict(color="#E45756", shape=shape), xaxis="x2", yaxis="y2",
                             hovertemplate="t = %{x:,.1f} s<br>waiting: %{y:,.1f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=ys["running"], name="running", mode="lines",
                             line=dict(color="#4C78A8", shape=shape), xaxis="x2", yaxis="y2",
                             hovertemplate="t = %{x:,.1f} s<br>running: %{y:,.1f}<extra></extra>"))
    if np.nanmax(ys["swapped"], initial=0) > 0:
        fig.add_trace(go.Scatter(x=x, y=ys["swapped"], name="swapped to host", mode="lines", xaxis="x2", yaxis="y2",
                                 line=dict(color="#9D755D", dash="dot", shape=shape)))
    return fig


def latency_histogram(requests: pd.DataFrame, metric: str, class_names: Sequence[str] = (),
                      bins: int = 50) -> go.Figure:
    """Histogram of one latency per priority class on log bins, with P50 (dashed) and P99 (dotted) lines."""
    name, unit, _ = LATENCY_UNITS[metric]
    fig = _figure(f"{name} distribution by priority class", "Dashed line: P50, dotted line: P99", height=400)
    names = list(class_names) or sorted(requests["class_name"].unique())
    values, colors = {}, {}
    for level in sorted(requests["priority"].unique()):
        cname = class_label(names, level)
        values[cname] = _latency_values(requests[requests["priority"] == level], metric)
        colors[cname] = CLASS_COLORS[int(level) % len(CLASS_COLORS)]
    edges = _log_edges(list(values.values()), bins)
    if edges is None:
        return _no_data(fig)
    _hist_traces(fig, values, colors, unit, edges)
    fig.update_layout(xaxis_title=f"{name} ({unit}, log scale)", yaxis_title="Requests per bin")
    log_axis(fig, "x", edges)
    return fig


ITL_FLOOR = 0.5  # the bottom of the ITL histogram's log count axis: empty bins sit there, one gap just above


def itl_histogram(itl_hist: np.ndarray, itl_edges: np.ndarray, class_names: Sequence[str] = ()) -> go.Figure:
    """Inter-token gaps per class from the engine's log-binned histogram, with P50/P99 lines, on a log count axis:
    the few long gaps of decodes stalled behind prefills (the stall hump) stay visible next to the millions of
    ordinary ones."""
    fig = _figure("Inter-token latency (every gap between two tokens)",
                  "Log count axis, so rare stalls (decodes behind prefills) show; dashed P50, dotted P99",
                  height=420)
    hist = np.atleast_2d(np.asarray(itl_hist))
    edges_ms = np.asarray(itl_edges, float) * 1e3
    if hist.sum() == 0:
        return _no_data(fig, "No inter-token gaps (every request has one output token)")
    nz = np.flatnonzero(hist.sum(axis=0))
    lo, hi = max(0, nz[0] - 2), min(hist.shape[1], nz[-1] + 3)
    ymax = float(hist[:, lo:hi].max())
    several = int((hist.sum(axis=1) > 0).sum()) > 1
    shown = 0
    for level, counts in enumerate(hist):
        if counts.sum() == 0:
            continue
        cname = class_label(class_names, level)
        color = CLASS_COLORS[level % len(CLASS_COLORS)]
        x, y = _step_xy(edges_ms[lo:hi + 1], counts[lo:hi], floor=ITL_FLOOR)
        # a closed outline filled inside ("tozeroy" has no zero to reach on a log axis)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=cname, legendgroup=cname, fill="toself",
                                 line=dict(color=color, width=1.5), fillcolor=alpha(color, 0.3),
                                 hovertemplate=f"{cname}<br>%{{x:.3g}} ms: %{{y:,.0f}} gaps<extra></extra>"))
        at = {q: hist_percentile(counts, itl_edges, q) * 1e3 for q in (50, 99)}
        # staggered by a factor per class: equal steps on the log axis
        _percentile_lines(fig, cname, None, color, "ms", ymax * 2.0 / 2.2 ** shown, several, at=at, y0=ITL_FLOOR,
                          p99_height=0.6)
        shown += 1
    fig.update_layout(xaxis_title="Gap between consecutive tokens (ms, log scale)",
                      yaxis_title="Gaps per bin (log scale)")
    log_axis(fig, "x", edges_ms[lo:hi + 1])
    log_axis(fig, "y", [1.0, max(ymax, 1.0)])
    fig.update_yaxes(range=[math.log10(ITL_FLOOR), math.log10(max(ymax, 1.0) * 2.0) + 0.3])
    return fig


# ---------------------------------------------------------------- compare: several runs


def latency_cdf(values: Mapping[str, np.ndarray], metric: str, points: int = 400) -> go.Figure:
    """Empirical CDF of one latency (seconds in ``values``) per policy, log x axis, each in its policy's colour."""
    name, unit, factor = LATENCY_UNITS[metric]
    fig = _figure(f"{name} CDF by policy", "Further left is faster; the gap at the top is the tail", height=420)
    colors = policy_colors(values)
    shown = []
    for label, v in values.items():
        v = np.sort(np.asarray(v, float)[np.isfinite(v)] * factor)
        v = v[v > 0]
        if not v.size:
            continue
        q = np.linspace(0, 1, min(points, v.size))
        x = np.quantile(v, q)
        shown.append(x)
        fig.add_trace(go.Scatter(x=x, y=q * 100, mode="lines", name=label, line=dict(color=colors[label], width=2.5),
                                 hovertemplate=f"{label}<br>%{{y:.1f}} % of requests ≤ %{{x:.3g}} {unit}"
                                               "<extra></extra>"))
    if not shown:
        return _no_data(fig)
    # the P50 and P99 lines and labels as add_hline draws them, set in one layout update (add_hline costs ~6 ms
    # a line, most of this figure's time)
    fig.update_layout(
        shapes=[dict(type="line", xref="x domain", yref="y", x0=0, x1=1, y0=y, y1=y,
                     line=dict(color="#9A9A9A", width=1, dash="dot")) for y in (50, 99)],
        annotations=[dict(text=f"P{y}", x=0, y=y, xref="x domain", yref="y", xanchor="left", yanchor="bottom",
                          showarrow=False, font=dict(size=11)) for y in (50, 99)],
        xaxis=dict(title=dict(text=f"{name} ({unit}, log scale)"), **log_axis_update(np.concatenate(shown))),
        yaxis=dict(title=dict(text="Requests at or below (%)"), range=[0, 101]))
    return fig


def latency_hist_overlay(values: Mapping[str, np.ndarray], metric: str, bins: int = 50) -> go.Figure:
    """Overlaid histograms of one latency (seconds in ``values``) per policy on shared log bins, in the policies'
    colours."""
    name, unit, factor = LATENCY_UNITS[metric]
    fig = _figure(f"{name} histogram by policy", "Dashed line: P50, dotted line: P99", height=420)
    scaled = {k: np.asarray(v, float)[np.isfinite(v)] * factor for k, v in values.items()}
    edges = _log_edges(list(scaled.values()), bins)
    if edges is None:
        return _no_data(fig)
    _hist_traces(fig, scaled, policy_colors(scaled), unit, edges)
    fig.update_layout(xaxis_title=f"{name} ({unit}, log scale)", yaxis_title="Requests per bin")
    log_axis(fig, "x", edges)
    return fig
