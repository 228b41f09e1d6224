"""Exports: a standalone HTML report, CSV of requests and steps, summary JSON, chart PNGs, and each page's
whole export (``PageExport``: its figures, tables, JSON and report, as ``python -m batching report --page``
writes them).

The HTML report embeds plotly.js once (``include_plotlyjs=True`` on the first figure), so it
opens offline; nothing is loaded from a CDN. Every figure a report or a page export holds carries the
scenario's caption line (``charts.export``).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from batching.charts import fleet as fleet_charts
from batching.charts import load as load_charts
from batching.charts import planning as cp
from batching.charts import policy as charts
from batching.charts.export import caption_of, scenario_caption, with_caption
from batching.charts.formatting import change_frame, class_frame, report_frame
from batching.sim.topology.fleet import ROUTER_HELP, ROUTERS
from batching.sim.engine.spec_table import spec_text
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, SimResult
from batching.sim.workload.requests import SyntheticWorkload, TraceWorkload
from batching.studies import article as art
from batching.studies import load_curve as lc
from batching.studies.capacity import class_names, default_price, default_price_note, rate_unit
from batching.studies.pricing import table_problem
from batching.studies.compare import Comparison, verdict, with_capacity
from batching.studies.launch import launch
from batching.studies.planning import CapacityPlan, SweepStudy
from batching.studies.sweeps import KNOBS

_CSS = """
body{font-family:Inter,'Source Sans Pro','Helvetica Neue',Arial,sans-serif;color:#262730;margin:2rem auto;
max-width:1200px;padding:0 1.5rem;line-height:1.45}
h1{font-size:1.7rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #e6e6e6;
padding-bottom:.3rem}.meta{color:#6b6b6b;font-size:.9rem}table{border-collapse:collapse;font-size:.88rem;margin:.5rem 0}
th,td{border:1px solid #e0e0e0;padding:.3rem .6rem;text-align:right}th{background:#f6f6f8}
td:first-child,th:first-child{text-align:left}.verdict{background:#eef4fb;border-left:4px solid #4c78a8;
padding:.6rem .9rem;margin:1rem 0}.caption{color:#6b6b6b;font-size:.88rem;margin:.2rem 0 1.4rem}
.kv td{text-align:left}code{background:#f3f3f3;padding:.1rem .3rem;border-radius:3px;word-break:break-all}
"""


# ---------------------------------------------------------------- descriptions


def describe_workload(workload: SyntheticWorkload | TraceWorkload, rate: str | None = None) -> str:
    """``rate``: what to say instead of the workload's rate where a study varies it ("rate searched")."""
    if isinstance(workload, TraceWorkload):
        parts = [f"trace {workload.filename}"]
        if workload.speedup != 1.0:
            parts.append(f"replayed {workload.speedup:.3g}x faster")
        if workload.max_requests is not None:
            parts.append(f"first {workload.max_requests:,} requests")
        return ", ".join(parts)
    classes = ", ".join(f"{c.name} {c.share:.0%}" for c in sorted(workload.classes, key=lambda c: c.priority))
    arr = workload.arrivals
    if getattr(workload, "concurrency", None) is not None:
        load = "concurrency searched" if rate == "rate searched" else (rate or workload.load_text)
        return f"{load}; classes: {classes}"
    return f"{arr.kind} arrivals{f', {rate}' if rate else f' at {arr.rate_req_s:g} req/s'}; classes: {classes}"


def fleet_rows(scenario: Scenario) -> list[tuple[str, str]]:
    """The fleet's rows (nodes, router) when it is not one node behind round-robin (rows that change nothing are
    left out, so a one-node report reads as before)."""
    nodes = int(getattr(scenario, "nodes", 1))
    router = str(getattr(scenario, "router", ROUTERS[0]))
    if nodes == 1 and router == ROUTERS[0]:
        return []
    per_node = scenario.deployment.node.replicas
    replicas = nodes * per_node
    return [("Nodes", f"{nodes:,} x {per_node} replica{'s' if per_node != 1 else ''} "
                      f"({replicas:,} replica{'s' if replicas != 1 else ''} in all)"),
            ("Router", f"{router}: {ROUTER_HELP.get(router, '')}".rstrip(": "))]


def scenario_rows(scenario: Scenario, rate: str | None = None) -> list[tuple[str, str]]:
    """The scenario as (field, value) rows for tables and reports (``rate``: as ``describe_workload``'s)."""
    dep, wl = scenario.deployment, scenario.workload
    node = dep.node
    kv = f"{dep.kv_capacity_tokens:,} tokens per replica"
    if dep.kv_cache_tokens is not None:
        kv += f" (limited from {dep.kv_capacity_tokens_max:,})"
    rows = [
        ("GPU", f"{node.num_gpus} x {node.gpu.name}"),
        ("Model", dep.model.name),
        ("Tensor parallel", f"{node.tp} ({node.replicas} replica{'s' if node.replicas != 1 else ''}"
                            f"{', over two nodes' if node.cross_node else ''})"),
        *fleet_rows(scenario),
        ("Precision", dep.precision),
        ("KV cache", kv),
        ("Workload", describe_workload(wl, rate)),
    ]
    if isinstance(wl, SyntheticWorkload):
        rows += [("Requests", f"{wl.num_requests:,}"), ("Seed", str(wl.seed))]
    if spec_text(scenario.policy):  # method, K, acceptance and its source (issue 39 item 4)
        rows.append(("Speculation", spec_text(scenario.policy)))
    return rows


def scenario_slug(scenario: Scenario, rate: bool = True) -> str:
    """A short file-name part naming the scenario, e.g. ``Qwen2.5-72B_H100-SXM_tp8_bf16_3rps_2000req``; without the
    rate when ``rate`` is off (a capacity search varies it: the sidebar's rate names nothing it found)."""
    dep, wl = scenario.deployment, scenario.workload
    parts = [dep.model.name, dep.node.gpu.name.replace(" 80GB", "").replace(" 141GB", ""), f"tp{dep.node.tp}",
             dep.precision]
    if isinstance(wl, TraceWorkload):
        parts.append(wl.filename.rsplit(".", 1)[0])
    else:
        parts += [f"{wl.rate_req_s:g}rps"] if rate else []
        parts += [f"{wl.num_requests}req", f"seed{wl.seed}"]
    if dep.kv_cache_tokens is not None:
        parts.append(f"kv{dep.kv_cache_tokens}")
    nodes, router = int(getattr(scenario, "nodes", 1)), str(getattr(scenario, "router", ROUTERS[0]))
    if nodes > 1:
        parts.append(f"{nodes}nodes")
    if router != ROUTERS[0]:
        parts.append(router)
    return charts.slug(*parts)


def policy_rows(policies: Mapping[str, BatchingPolicy]) -> list[tuple[str, str]]:
    return [(name, p.describe()) for name, p in policies.items()]


# ---------------------------------------------------------------- data exports


# a spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV injection"; the
# full-width forms too, which some spreadsheets fold to ASCII)
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with every formula-looking *text* cell prefixed by a single quote (OWASP guidance), so
    a class name such as ``=HYPERLINK(...)`` from an uploaded trace opens as text in a spreadsheet.
    Numeric columns (negative numbers included) are untouched; the input is not modified."""
    out = None
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
            continue
        if pd.api.types.is_string_dtype(s) and s.dtype != object:
            risky = s.str.startswith(FORMULA_TRIGGERS).fillna(False).to_numpy(dtype=bool)
        else:
            risky = np.fromiter((isinstance(v, str) and v.startswith(FORMULA_TRIGGERS) for v in s),
                                dtype=bool, count=len(s))
        if risky.any():
            if out is None:
                out = df.copy()
            out[col] = out[col].astype(object)
            out.loc[risky, col] = "'" + s[risky].astype(str)
    return df if out is None else out


def frame_csv(df: pd.DataFrame) -> bytes:
    """A table as CSV bytes, formula-looking text cells neutralised (``csv_safe``)."""
    return csv_safe(df).to_csv(index=False).encode()


def requests_csv(result: SimResult) -> bytes:
    """One row per request with every time and latency (seconds)."""
    return frame_csv(result.requests)


def steps_csv(result: SimResult) -> bytes:
    """One row per forward pass and replica."""
    return frame_csv(result.steps)


def summary_csv(summary: Mapping) -> bytes:
    """A summary as a one-row CSV of its scalar figures (``by_priority`` and other nested parts left to the JSON)."""
    row = {k: v for k, v in summary.items() if not isinstance(v, (Mapping, list, tuple))}
    return frame_csv(pd.DataFrame([row]))


def combined_csv(results: Mapping[str, SimResult], table: str = "requests") -> bytes:
    """Requests or steps of several runs in one CSV, a ``policy`` column first."""
    if not results:
        return b""
    return frame_csv(_combined(results, table))


def jsonable(value):
    """Plain JSON types: NaN and infinities become null, NumPy scalars Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def summary_json(summaries: Mapping[str, dict], scenario: Scenario,
                 policies: Mapping[str, BatchingPolicy] | None = None) -> bytes:
    """Summaries (policy name -> summary dict) with the scenario and policies that made them."""
    doc = {
        "scenario": dict(scenario_rows(scenario)),
        "policies": {k: {"description": p.describe(), **dataclasses.asdict(p)} for k, p in (policies or {}).items()},
        "summaries": summaries,
        # the vLLM and SGLang commands that run each policy on this scenario (studies.launch, docs/LAUNCH.md)
        "launch": {k: launch(scenario.with_policy(p)) for k, p in (policies or {}).items()},
    }
    return json.dumps(jsonable(doc), indent=2, allow_nan=False).encode()


# what a chart's subtitle tells a reader who can click (charts.policy.request_timeline: "opens on the first 200 of
# 2,000, double-click for all"), and what a static image says instead
INTERACTIVE_HINTS = ((re.compile(r"[,;]? *double-click (?:or Autoscale )?(?:for all|shows the whole run)"), ""),
                     (re.compile(r"\bopens on the first\b"), "shows the first"))


def for_print(fig: go.Figure) -> go.Figure:
    """The figure as a static image shows it: its title's and subtitle's hints to zoom by clicking taken out (a
    copy; the figure itself is left as it was, for the interactive report)."""
    title = fig.layout.title
    texts = [getattr(title, "text", None), getattr(getattr(title, "subtitle", None), "text", None)]
    changed = []
    for text in texts:
        new = text
        for pattern, repl in INTERACTIVE_HINTS:
            new = pattern.sub(repl, new) if new else new
        changed.append(new)
    if changed == texts:
        return fig
    out = go.Figure(fig)
    out.layout.title.text = changed[0]
    if changed[1] is not None:
        out.layout.title.subtitle.text = changed[1]
    return out


def figure_png(fig: go.Figure, scale: float = 2, width: int = 1200, height: int | None = None) -> bytes:
    """A chart as PNG through kaleido (needs Chrome/Chromium; the CLI uses this), without interactive hints
    (``for_print``)."""
    fig = for_print(fig)
    return pio.to_image(fig, format="png", scale=scale, width=width, height=height or fig.layout.height or 450)


def figure_svg(fig: go.Figure, width: int = 1200, height: int | None = None) -> bytes:
    """A chart as SVG (vector, for documents) through kaleido, at the size its PNG has before scaling, without
    interactive hints (``for_print``)."""
    fig = for_print(fig)
    return pio.to_image(fig, format="svg", width=width, height=height or fig.layout.height or 450)


IMAGE_FORMATS = ("png", "svg")


def figure_images(figures: Mapping[str, go.Figure], formats: Sequence[str] = IMAGE_FORMATS, scale: float = 2,
                  width: int = 1200) -> dict[str, bytes]:
    """``<name>.<format>`` -> bytes for every figure and format, through one kaleido browser (started once: about
    0.4 s a figure after its start). Made on demand only (a download button's click, the CLI): kaleido is slow."""
    import warnings

    import kaleido

    unknown = [f for f in formats if f not in IMAGE_FORMATS]
    if unknown:
        raise ValueError(f"image format {unknown[0]!r} is not one of {', '.join(IMAGE_FORMATS)}")
    out: dict[str, bytes] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # plotly: "kopts is ignored if using a server"
        kaleido.start_sync_server(silence_warnings=True)
        try:
            for name, fig in figures.items():
                for fmt in formats:
                    out[f"{name}.{fmt}"] = (figure_png(fig, scale=scale, width=width) if fmt == "png"
                                            else figure_svg(fig, width=width))
        finally:
            kaleido.stop_sync_server(silence_warnings=True)
    return out


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """Files (name -> bytes) as one zip archive."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def figures_zip(figures: Mapping[str, go.Figure], fmt: str) -> bytes:
    """Every figure of a page as ``<name>.<fmt>`` (png or svg) in one zip: the dashboard's chart download."""
    return zip_bytes(figure_images(figures, (fmt,)))


# ---------------------------------------------------------------- one policy's figures (Explore a policy)

# how full the node is, the first cards of the showdown and of Explore (issue 24 item 10): the share of capacity the
# traffic takes first, then how much of the peak FLOP/s and HBM bandwidth does useful work, then the time a forward
# pass runs (what nvidia-smi calls GPU-Util: near 100 % at any load that keeps a batch running)
LOAD_CARDS = ("load", "mfu", "mbu", "busy")
# the metric cards of "Explore a policy", and the rows of its report's metrics table
POLICY_METRICS = (*LOAD_CARDS, "throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                  "e2e_p50_s", "e2e_p99_s", "gpu_util", "batch_efficiency", "preemptions")


def policy_label(policy: BatchingPolicy) -> str:
    """The preset a policy is, else ``"custom <mode>"`` (the caption's name for a run without a page label)."""
    return next((name for name, p in PRESETS.items() if p == policy.unsized()), f"custom {policy.mode}")


def policy_figure_keys(result: SimResult) -> tuple[str, ...]:
    """The keys of ``policy_figures`` for this run, in page order: the per-instance or per-replica chart only for
    a split or a fleet."""
    sc = result.scenario
    extra = ("per_instance",) if sc.disagg is not None else ("per_replica",) if sc.replicas > 1 else ()
    return ("timeline", "batch_composition", "kv_queue", "ttft_hist", "tpot_hist", "e2e_hist", "itl", *extra)


def policy_figure(result: SimResult, key: str, label: str | None = None,
                  timeline_points: int | None = None) -> tuple[go.Figure, str]:
    """One figure of ``policy_figures`` (``key`` from ``policy_figure_keys``) with its report caption and the
    scenario's caption line: a page that draws one chart at a time builds only what it shows, when it shows it."""
    names = result.class_names
    sc = result.scenario
    if key == "timeline":
        fig, text = (charts.request_timeline(result.requests, names, max_points=timeline_points, steps=result.steps),
                     "Request timeline: queued, prefill, decode and held segments per request.")
    elif key == "batch_composition":
        fig, text = charts.batch_composition(result.steps), "Batch composition over time."
    elif key == "kv_queue":
        fig, text = (charts.kv_and_queue(result.steps, sc.deployment.kv_capacity_tokens),
                     "KV cache use and queue depth over time.")
    elif key in ("ttft_hist", "tpot_hist", "e2e_hist"):
        metric = key.removesuffix("_hist")
        fig, text = charts.latency_histogram(result.requests, metric, names), f"{metric.upper()} histogram per class."
    elif key == "itl":
        fig, text = charts.itl_histogram(result.itl_hist, result.itl_edges, names), "Inter-token latency histogram."
    elif key == "per_instance" and sc.disagg is not None:
        # the exports show each instance against its own role's cache (Explore draws it apart)
        dis = sc.disagg
        fig, text = (fleet_charts.replica_kv_queue(
            result.steps, sc.deployment.kv_capacity_tokens, dis.prefill_instances + dis.decode_instances,
            subtitle=dis.describe(), roles=fleet_charts.disagg_roles(dis, sc.deployment)),
            "KV cache in use (% of each instance's own cache) and requests waiting, per prefill and decode instance.")
    elif key == "per_replica" and sc.replicas > 1:
        per_node = sc.deployment.node.replicas
        fleet = (f"{sc.nodes} node{'s' if sc.nodes != 1 else ''} x {per_node} replica{'s' if per_node != 1 else ''}"
                 f", {sc.router} router")
        fig, text = (fleet_charts.replica_kv_queue(
            result.steps, sc.deployment.kv_capacity_tokens, sc.replicas, per_node, subtitle=fleet),
            "KV cache in use (% of a replica's cache) and requests waiting, per replica of the fleet.")
    else:
        raise KeyError(f"no figure {key!r} for this run; it has {', '.join(policy_figure_keys(result))}")
    line = scenario_caption(sc, policy=label or policy_label(sc.policy))
    return with_caption(fig, line, copy=False), text


def policy_figures(result: SimResult, label: str | None = None,
                   timeline_points: int | None = None) -> dict[str, tuple[go.Figure, str]]:
    """Every figure "Explore a policy" shows for one run, in page order, each with its report caption and the
    scenario's caption line drawn under it (``label``: the policy's name there, else the preset it is).

    The keys are the file-name suffixes of the dashboard's PNG downloads (``<name>_<key>.png``); the page
    and ``python -m batching report`` both draw from here, so a document's figure is the app's figure.
    ``timeline_points``: the page's live timeline draws within that many points (``charts.timeline_rows``: the
    first requests in full, a sample of the rest, said in its subtitle); None, for the exports, draws every request.
    """
    return {k: policy_figure(result, k, label, timeline_points) for k in policy_figure_keys(result)}


# ---------------------------------------------------------------- HTML report


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _frame_table(df: pd.DataFrame) -> str:
    return df.to_html(na_rep="n/a", escape=True, border=0, float_format=lambda v: f"{v:,.4g}")


def html_report(title: str, scenario: Scenario, *, figures: Sequence[tuple[go.Figure, str]] = (),
                tables: Sequence[tuple[str, pd.DataFrame]] = (), policies: Mapping[str, BatchingPolicy] | None = None,
                verdict: str = "", link: str = "", notes: Sequence[str] = (), rate: str | None = None,
                rows: Sequence[tuple[str, str]] | None = None) -> str:
    """A standalone HTML page: scenario, policies, tables and interactive figures (plotly.js inlined once).
    ``rate``: what the scenario rows and captions say instead of the workload's rate where the study varies it
    ("rate searched": Capacity's report never names the sidebar's rate). ``rows``: the scenario table's rows when
    the study did not run the scenario's own deployment (a search's grid), else ``scenario_rows``."""
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">Batching explorer report, generated {stamp}. Simulated node, not a measurement.</p>',
    ]
    if link:
        out.append(f'<p class="meta">Live view: <code>{html.escape(link)}</code></p>')
    out.append("<h2>Scenario</h2>" + _kv_table(scenario_rows(scenario, rate) if rows is None else rows))
    if policies:
        out.append("<h2>Policies</h2>" + _kv_table(policy_rows(policies)))
    if verdict:
        out.append(f'<div class="verdict">{html.escape(verdict)}</div>')
    for note in notes:
        out.append(f'<p class="caption">{html.escape(note)}</p>')
    for name, df in tables:
        out.append(f"<h2>{html.escape(name)}</h2>" + _frame_table(df))
    if figures:
        out.append("<h2>Charts</h2>")
    line = scenario_caption(scenario, rate=rate)
    for i, (fig, caption) in enumerate(figures):
        if caption_of(fig) is None:  # every figure of a report names its scenario (a page's own line kept)
            fig = with_caption(fig, line)
        div = pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), default_width="100%",
                          config=charts.png_config(_fig_title(fig) or f"chart_{i + 1}"))
        out.append(div)
        if caption:
            out.append(f'<p class="caption">{html.escape(caption)}</p>')
    out.append("</body></html>")
    return "\n".join(out)


def _fig_title(fig: go.Figure) -> str:
    return getattr(fig.layout.title, "text", None) or ""


# ---------------------------------------------------------------- a page's whole export

# the metrics of Compare's table (pages/compare.py KEYS)
COMPARE_METRICS = ("throughput_output_tok_s", "capacity_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                   "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "queue_delay_p99_s", "gpu_util", "batch_efficiency",
                   "preemptions")
LATENCY_METRICS = ("ttft", "tpot", "e2e")
# Capacity's table (pages/capacity.py COLUMNS): CapacityResult field -> header with unit
CAPACITY_COLUMNS = {
    "max_rate_req_s": "Rate per node (req/s)",
    "steady_output_tok_s": "Steady throughput (output tok/s)",
    "goodput_req_s": "Goodput (req/s)",
    "binding_slo": "Binding SLO",
    "binding_class": "Binding class",
    "nodes_needed": "Nodes needed",
    "usd_per_million_output_tokens": "$ per M output tokens at target",
    "usd_per_million_output_tokens_at_capacity": "$ per M output tokens at capacity",
    "rates_tried": "Rates simulated",
}


@dataclass(frozen=True, eq=False)
class PageExport:
    """What one dashboard page shows, for documents: its figures (each with the scenario's caption line), its
    tables, its JSON download and its standalone report. ``files`` names them as ``<page>_<key>.<ext>``, the keys
    unique within the page; ``python -m batching report --page`` writes them (PNGs from ``figures``)."""

    page: str
    title: str
    scenario: Scenario
    figures: dict[str, tuple[go.Figure, str]]  # key -> (figure, report caption)
    tables: dict[str, pd.DataFrame]  # key -> a table written as CSV (the page's tables and CSV downloads)
    json_key: str
    json: bytes
    html_tables: tuple[tuple[str, pd.DataFrame], ...] = ()
    policies: Mapping[str, BatchingPolicy] | None = None
    verdict: str = ""
    notes: tuple[str, ...] = ()
    rate: str | None = None  # html_report's: what the report says instead of the workload's rate
    rows: tuple[tuple[str, str], ...] | None = None  # html_report's: the scenario table's rows, when not the scenario's

    def html(self, link: str = "", notes: Sequence[str] = ()) -> str:
        return html_report(self.title, self.scenario, figures=list(self.figures.values()),
                           tables=self.html_tables, policies=self.policies, verdict=self.verdict, link=link,
                           notes=[*notes, *self.notes], rate=self.rate, rows=self.rows)

    def png_names(self) -> dict[str, str]:
        """figure key -> PNG file name."""
        return {k: f"{self.page}_{k}.png" for k in self.figures}

    def svg_names(self) -> dict[str, str]:
        """figure key -> SVG file name (kaleido writes both: ``images``)."""
        return {k: f"{self.page}_{k}.svg" for k in self.figures}

    def images(self, scale: float = 2, width: int = 1200) -> dict[str, bytes]:
        """Every figure as PNG and SVG (``<page>_<key>.png`` / ``.svg``), through one kaleido browser."""
        return figure_images({f"{self.page}_{k}": fig for k, (fig, _) in self.figures.items()}, IMAGE_FORMATS,
                             scale, width)

    def files(self, notes: Sequence[str] = ()) -> dict[str, bytes]:
        """file name -> bytes of every file but the PNGs: the tables (CSV), the JSON and the report (HTML)."""
        out = {f"{self.page}_{k}.csv": frame_csv(df) for k, df in self.tables.items()}
        out[f"{self.page}_{self.json_key}.json"] = self.json
        out[f"{self.page}_report.html"] = self.html(notes=notes).encode("utf-8")
        names = [*out, *self.png_names().values(), *self.svg_names().values()]
        if len(set(names)) != len(names):
            raise ValueError(f"file names of the {self.page} export repeat: {sorted(names)}")
        return out


def _captioned(figs: Mapping[str, tuple[go.Figure, str]], line: str) -> dict[str, tuple[go.Figure, str]]:
    return {k: (with_caption(fig, line, copy=False), text) for k, (fig, text) in figs.items()}


def _indexed(df: pd.DataFrame, name: str = "policy") -> pd.DataFrame:
    """A frame indexed by policy as a plain first column (CSV keeps it)."""
    return df.rename_axis(name).reset_index()


def explore_export(result: SimResult, label: str, saturated: SimResult | None = None) -> PageExport:
    """Explore a policy: the run's figures (``policy_figures``), its metrics, requests and steps, summary JSON.
    ``saturated``: the run's capacity twin (every request at t = 0), for its load and overload, the page's first
    card; without it those read "–"."""
    summary = result.summary()
    if saturated is not None:
        summary = with_capacity(summary, saturated.summary())
    one, policies = {label: summary}, {label: result.scenario.policy}
    metrics = report_frame(one, POLICY_METRICS)
    _, sample_note = charts.timeline_sample(result.requests)
    return PageExport(
        "explore", f"Explore a policy: {label}", result.scenario, policy_figures(result, label),
        {"metrics": _indexed(metrics), "requests": result.requests, "steps": result.steps}, "summary",
        summary_json(one, result.scenario, policies), (("Metrics", metrics),), policies,
        notes=(sample_note,) if sample_note else ())


def showdown_figures(summaries: Mapping[str, dict], scenario: Scenario, curve: pd.DataFrame | None = None,
                     rate_req_s: float | None = None) -> dict[str, tuple[go.Figure, str]]:
    """The showdown's figures in page order, each with the scenario's caption line: latency against load (the page's
    first chart, when ``curve`` is given: ``studies.load_curve``), the bars, the per-class bars."""
    figs: dict[str, tuple[go.Figure, str]] = {}
    if curve is not None and len(curve):
        rate = float(scenario.workload.rate_req_s) if rate_req_s is None else rate_req_s
        figs["latency_vs_load"] = (load_charts.latency_vs_load(curve, lc.slo_targets(scenario), rate),
                                   f"P99 TTFT and TPOT against the offered rate, one line per policy "
                                   f"({lc.POINTS} rates, {lc.LOW:.0%}-{lc.HIGH:.0%} of its capacity; the x ends it "
                                   "at its capacity). Dashed: the SLOs; dotted: the scenario's rate.")
    figs["bars"] = (charts.showdown_bars(summaries), "Throughput vs capacity, TTFT and TPOT by policy; an "
                    "overloaded policy's latencies read unbounded.")
    figs["class_ttft"] = (charts.class_ttft_bars(summaries), "P99 TTFT per priority class.")
    return _captioned(figs, scenario_caption(scenario))


def article_tables(article_summaries: Mapping[str, dict] | None) -> dict[str, pd.DataFrame]:
    """The page's article table: as published (a cited measurement) and the simulator on the same setting."""
    if not article_summaries:
        return {}
    return {"article_published": art.article_table().rename_axis("strategy").reset_index(),
            "article_simulated": art.simulator_table(article_summaries).round(1).rename_axis("strategy").reset_index()}


def showdown_tables(summaries: Mapping[str, dict],
                    article_summaries: Mapping[str, dict] | None = None) -> tuple[tuple[str, pd.DataFrame], ...]:
    """The showdown report's tables: the classic table, P99 TTFT by class, the article's table (published and
    simulated) when its runs are given."""
    out = [("The classic table", report_frame(summaries)), ("P99 TTFT by class (s)", class_frame(summaries).round(3))]
    tabs = article_tables(article_summaries)
    if tabs:
        out += [(f"The article's table, as published ({art.SOURCE})", tabs["article_published"]),
                ("The article's table, the simulator on the same setting", tabs["article_simulated"])]
    return tuple(out)


def showdown_article(scenario: Scenario) -> dict[str, dict]:
    """The article's setting simulated with the scenario's request count and seed (as the page runs it)."""
    from batching.studies.compare import compare

    sc = art.article_scenario(scenario.workload.num_requests, getattr(scenario.workload, "seed", 0))
    return compare(sc, art.article_policies()).summaries()


def showdown_export(comparison: Comparison, scenario: Scenario,
                    policies: Mapping[str, BatchingPolicy] = PRESETS, curve: pd.DataFrame | None = None,
                    article_summaries: Mapping[str, dict] | None = None) -> PageExport:
    """The home page, the strategy showdown: latency against load (given its ``curve``), its bars and per-class
    bars, the classic and per-class tables, the article's table (given its runs), every run's requests and steps,
    the summaries JSON, the verdict."""
    summaries = comparison.summaries()
    figs = showdown_figures(summaries, scenario, curve)
    classic = report_frame(summaries)
    by_class = class_frame(summaries).round(3)
    extra = {"latency_vs_load": curve} if curve is not None else {}
    return PageExport(
        "showdown", "Strategy showdown", scenario, figs,
        {"classic_table": _indexed(classic), "class_table": _indexed(by_class), **extra,
         **article_tables(article_summaries),
         "requests": _combined(comparison.results, "requests"), "steps": _combined(comparison.results, "steps")},
        "summary", summary_json(summaries, scenario, policies), showdown_tables(summaries, article_summaries),
        policies, verdict(summaries))


def compare_figures(results: Mapping[str, SimResult], line: str | None = None) -> dict[str, tuple[go.Figure, str]]:
    """Compare's latency figures, CDF and histogram per metric, each policy in its colour (by name)."""
    figs = {}
    for metric in LATENCY_METRICS:
        values = {k: r.requests[f"{metric}_s"].to_numpy() for k, r in results.items()}
        figs[f"{metric}_cdf"] = (charts.latency_cdf(values, metric), f"{metric.upper()} CDF by policy.")
        figs[f"{metric}_hist"] = (charts.latency_hist_overlay(values, metric), f"{metric.upper()} histogram by policy.")
    return _captioned(figs, line) if line else figs


def compare_export(comparison: Comparison, scenario: Scenario, policies: Mapping[str, BatchingPolicy]) -> PageExport:
    """Compare policies: the latency CDFs and histograms, the table against the first policy, the runs' requests
    and steps, the summaries JSON."""
    summaries = comparison.summaries()
    change = change_frame(summaries, COMPARE_METRICS).drop(columns="_lower_is_better").round(1)
    return PageExport(
        "compare", "Compare policies", scenario, compare_figures(comparison.results, scenario_caption(scenario)),
        {"metrics": change, "requests": _combined(comparison.results, "requests"),
         "steps": _combined(comparison.results, "steps")},
        "summary", summary_json(summaries, scenario, policies),
        (("Every metric against the first policy", change),), policies)


def _combined(results: Mapping[str, SimResult], table: str) -> pd.DataFrame:
    """Requests or steps of several runs in one frame, a ``policy`` column first."""
    frames = [getattr(res, table).assign(policy=name) for name, res in results.items()]
    df = pd.concat(frames, ignore_index=True)
    return df[["policy", *[c for c in df.columns if c != "policy"]]]


def tune_json(study: SweepStudy) -> bytes:
    """Tune's JSON download: the values, knees, guided checks and every point, with the scenario."""
    doc = {"knob": study.knob, "values": list(study.values), "knee_share": study.share, "knees": study.knees,
           "slo": study.slo.to_dict() if study.slo is not None else None, "slo_default": study.slo_is_default,
           "scenario": dict(scenario_rows(study.scenario)),
           "policies": {n: p.describe() for n, p in study.policies.items()},
           "cards": [c.to_dict() for c in study.cards], "points": study.points().to_dict(orient="records")}
    return json.dumps(jsonable(doc), indent=2, allow_nan=False).encode()


def tune_export(study: SweepStudy, log_x: bool, frontier: str) -> PageExport:
    """Tune a knob: throughput, frontier, latency and utilisation against the knob, every point (CSV), the JSON,
    the knee sentence and the guided checks that fired."""
    knob, label, df, knee = study.knob, study.label, study.frame, study.knee
    line = scenario_caption(study.scenario, policy=label, rate="rate swept" if knob == "rate_req_s" else None)
    figs = _captioned({
        "throughput": (cp.sweep_throughput(df, knob, knee, log_x, label), "Throughput and capacity against the knob."),
        "frontier": (cp.sweep_frontier(study.frames, knob, frontier, study.knees),
                     "Throughput against P99 latency across the values and policies."),
        "latency": (cp.sweep_latency(df, knob, knee, log_x), "Latency against the knob."),
        "utilisation": (cp.sweep_utilisation(df, knob, knee, log_x), "GPU use, batch fill, KV use and preemptions."),
    }, line)
    points = study.points()
    notes = [*([study.slo_text()] if study.slo is not None else []), study.knee_sentence(),
             *[f"{c.number} · {c.title}: {c.text}" for c in study.fired],
             *[f"'{n}' is not on the frontier: {why}" for n, why in study.skipped.items()]]
    return PageExport(
        "tune", f"Tune a knob: {KNOBS[knob]} ({label})", study.scenario, figs, {"sweep": points}, "sweep",
        tune_json(study), ((f"Every point ({label})", points.round(4)),), study.policies, notes=tuple(notes))


def capacity_frame(plan: CapacityPlan) -> pd.DataFrame:
    """Capacity's table: one row per policy (``CAPACITY_COLUMNS``), the binding SLO in words."""
    rows = {}
    for name, result in plan.results.items():
        row = {}
        for key, header in CAPACITY_COLUMNS.items():
            v = getattr(result, key)
            if key == "binding_slo":
                v = cp.binding_text(v)
            elif key == "binding_class":
                v = v if v is not None else "none (node at capacity)"
            row[header] = float("nan") if v is None else v
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def capacity_class_frame(plan: CapacityPlan) -> pd.DataFrame:
    """One row per policy and priority class at the rate each search found (its lowest rate when none met the
    SLOs): the class's SLOs, attainment, goodput and latency percentiles (seconds, shares 0-1)."""
    rows = []
    for name, result in plan.results.items():
        rate = result.max_rate_req_s if result.max_rate_req_s > 0 else float(result.points["rate_req_s"].min())
        for level, cls in result.by_priority.items():
            row = {"policy": name, "priority": level, "at_rate_req_s": rate}
            row.update({k: (json.dumps(jsonable(v)) if isinstance(v, Mapping) else v) for k, v in cls.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def capacity_json(plan: CapacityPlan) -> bytes:
    """Capacity's JSON download: the SLOs, target, price (and where it comes from), headroom, mean output tokens,
    each policy's result (per class too: attainment and P99s against the class's own SLOs) and every rate tried."""
    doc = {"slo": plan.slo.to_dict(), "slo_text": plan.slo.describe(class_names(plan.scenario)),
           "class_names": list(class_names(plan.scenario)),
           "target_rate_req_s": plan.target_rate_req_s, "gpu_hour_usd": plan.gpu_hour_usd,
           "gpu_hour_usd_source": price_source(plan), "headroom": plan.headroom,
           "mean_output_tokens": plan.mean_output_tokens,
           "scenario": dict(scenario_rows(plan.scenario, "rate searched")),
           "policies": {n: {"description": PRESETS[n].describe() if n in PRESETS else n, **r.to_dict(),
                            "rates_tried": r.rates_tried} for n, r in plan.results.items()},
           "points": _capacity_points(plan).to_dict(orient="records"),
           "launch": {n: launch(plan.scenario.with_policy(PRESETS[n])) for n in plan.results if n in PRESETS}}
    return json.dumps(jsonable(doc), indent=2, allow_nan=False).encode()


def price_source(plan: CapacityPlan) -> str:
    """'default: $2.69/GPU-h, h100-sxm default as of 2026-03-10 (...)' when the plan's price is its GPU's default
    from the price table, else 'given' (or 'none' without a price)."""
    if plan.gpu_hour_usd is None:
        return "none"
    if table_problem() is None and plan.gpu_hour_usd == default_price(plan.scenario):
        return f"default: {default_price_note(plan.scenario)}"
    return "given"


def capacity_bars(plan: CapacityPlan) -> go.Figure:
    """The page's and the export's capacity bars: the headroom and the SLOs printed with them."""
    return cp.capacity_bars(plan.results, plan.target_rate_req_s, plan.gpu_hour_usd, plan.headroom,
                            plan.slo.describe(class_names(plan.scenario)), rate_unit(plan.scenario))


def _capacity_points(plan: CapacityPlan) -> pd.DataFrame:
    points = pd.concat([p.assign(policy=n) for n, p in plan.points().items()], ignore_index=True)
    return points[["policy", *[c for c in points.columns if c != "policy"]]]


def capacity_export(plan: CapacityPlan) -> PageExport:
    """Capacity planning: the capacity bars and goodput curves, the plan, each class at each policy's rate and every
    rate tried (CSV), the JSON, the verdict."""
    line = scenario_caption(plan.scenario, rate="rate searched")
    figs = _captioned({
        "bars": (capacity_bars(plan), f"Rate per node, nodes needed and cost per policy, with {plan.headroom:g}× "
                                      f"headroom; {plan.slo.describe(class_names(plan.scenario))}."),
        "goodput": (cp.goodput_curves(plan.points(), plan.max_rates(), plan.slo.attainment),
                    "Goodput (requests within every SLO per second while requests arrive, the drain not counted) "
                    "and SLO attainment against the request rate."),
    }, line)
    table = capacity_frame(plan)
    shown = table
    if plan.target_rate_req_s:  # the report's header says the target, as the page's does
        shown = table.rename(columns={"Nodes needed": f"Nodes for {plan.target_rate_req_s:,.4g} req/s"})
    by_class = capacity_class_frame(plan)
    html_tables = [("Per policy", shown)]
    if by_class["priority"].nunique() > 1:
        html_tables.append(("Per class at each policy's rate", by_class.round(4)))
    return PageExport(
        "capacity", f"Capacity planning: {plan.slo.describe(class_names(plan.scenario))}", plan.scenario, figs,
        {"plan": _indexed(table), "classes": by_class, "rates": _capacity_points(plan)}, "plan",
        capacity_json(plan), tuple(html_tables), {n: PRESETS[n] for n in plan.results if n in PRESETS}, plan.verdict(),
        rate="rate searched")


# ---------------------------------------------------------------- views without a page export of their own
# Find a deployment, the disaggregation and speculation views (issue 24 item 11): every page CSV, JSON and HTML


def _flat(rows: Sequence[Mapping]) -> pd.DataFrame:
    """Rows of dicts as a table, nested values (knobs, per-class figures) as JSON text in their cells."""
    return pd.DataFrame([{k: (json.dumps(jsonable(v)) if isinstance(v, (Mapping, list, tuple)) else v)
                          for k, v in r.items()} for r in rows])


def view_export(page: str, title: str, scenario: Scenario, figures: Mapping[str, tuple[go.Figure, str]],
                tables: Mapping[str, pd.DataFrame], doc: Mapping | None = None,
                notes: Sequence[str] = ()) -> PageExport:
    """A view's export: its figures (each keeps its own caption line), its tables (CSV and the report's tables) and
    a JSON of ``doc`` (else the tables' rows) with the scenario."""
    body = dict(doc) if doc is not None else {k: df.to_dict(orient="records") for k, df in tables.items()}
    data = json.dumps(jsonable({"scenario": dict(scenario_rows(scenario)), **body}), indent=2, allow_nan=False,
                      default=str).encode()
    return PageExport(page, title, scenario, dict(figures), dict(tables), "data", data, tuple((k.replace("_", " ").capitalize(), df) for k, df in tables.items()),
                      notes=tuple(notes))


def _shape(c: Mapping) -> str:
    """A searched configuration's shape: 'TP 4', 'TP 16 over 2 nodes', '3×TP2 prefill + 1×TP2 decode'."""
    sp = c.get("split")
    if sp is None:
        npc = int(c.get("nodes_per_copy") or 1)
        return f"TP {c.get('tp')}" + (f" over {npc} nodes" if npc > 1 else "")
    return (f"{sp['prefill_instances']}×TP{sp['prefill_tp']} prefill + {sp['decode_instances']}×TP{sp['decode_tp']} "
            "decode")


def _fleet_check(c: Mapping) -> str:
    """How a row's nodes were found: 'met ✓ behind least-outstanding', 'missed ✗ ...' or 'perfect balance'."""
    if not c.get("fleet_checked"):
        return "not checked (perfect balance)"
    verdict_ = "met the SLOs" if c.get("fleet_verified") else "missed the SLOs (at least this many)"
    return f"{verdict_} behind {c.get('router', '?')}"


def _num(v):
    return float("nan") if v is None else v


SPLIT_COLUMNS = ("Prefill instances", "Prefill TP", "Decode instances", "Decode TP")


def search_frame(configs: Sequence[Mapping], target: float, tail: str = "P99") -> pd.DataFrame:
    """Find a deployment's table of the configurations that meet the SLOs, ranked by cost, as the page shows it and
    as its CSV holds it (the dashboard's download and ``report --page search`` write this frame): the columns a
    planner reads, units in the headers, numbers as numbers (TP a whole number, empty for a prefill/decode split,
    whose instances have their own columns), the latencies at ``tail`` (the percentile the attainment target
    reads). Every other field stays in the JSON."""
    key = "p99" if tail == "P99" else "tail"
    rows = []
    for i, c in enumerate(c for c in configs if c.get("meets_slo", True)):
        sp = c.get("split") or {}
        rows.append({
            "Rank": i + 1, "Configuration": c["label"], "GPU": c["gpu"], "Precision": str(c["precision"]).upper(),
            "Serving": "disaggregated" if c.get("split") is not None else "aggregated",
            "TP": c.get("tp") if c.get("split") is None else None,
            "Shape": _shape(c),
            "Prefill instances": sp.get("prefill_instances"), "Prefill TP": sp.get("prefill_tp"),
            "Decode instances": sp.get("decode_instances"), "Decode TP": sp.get("decode_tp"),
            # a replica over two nodes: 0.5; a prefill/decode split: its copies (P + D instances each) per node
            "Replicas per node": (c.get("copies_per_node") if c.get("split") is not None else
                                  1 / c["nodes_per_copy"] if (c.get("nodes_per_copy") or 1) > 1 else
                                  c.get("replicas_per_node")),
            "Policy": c["policy"],
            "Knobs": ", ".join(f"{k}={v:g}" for k, v in (c.get("knobs") or {}).items()) or "preset's",
            "Rate per copy (req/s)": c["max_rate_req_s"],
            f"Nodes for {target:,.4g} req/s": c["nodes_needed"], "Fleet check": _fleet_check(c),
            "$ per M output tokens": c["usd_per_million_output_tokens"],
            "Margin (% of capacity used)": None if c.get("margin") is None else 100 * c["margin"],
            "$ per M output tokens at capacity": c.get("usd_per_million_output_tokens_at_capacity"),
            "Output tok/s per GPU": c.get("output_tok_s_per_gpu"),
            f"{tail} TTFT (s)": _num(c.get(f"ttft_{key}_s")),
            f"{tail} TPOT (ms)": _num(None if c.get(f"tpot_{key}_s") is None else c[f"tpot_{key}_s"] * 1e3),
            "Binding SLO": cp.binding_text(c.get("binding_slo")),
            "Binding class": c.get("binding_class") or "none (node at capacity)",
            "Pareto": bool(c.get("pareto")), "Calibrated": bool(c.get("calibrated", True)),
        })
    df = pd.DataFrame(rows, columns=list(rows[0]) if rows else None)
    for col in ("Rank", "TP", *SPLIT_COLUMNS, f"Nodes for {target:,.4g} req/s"):
        if col in df:
            df[col] = df[col].astype("Int64")  # whole numbers, empty where they do not apply (never 4.0)
    # TP when every row is a split, the split's columns when none is: columns no row uses
    unused = [c for c in ("TP", *SPLIT_COLUMNS) if c in df and len(df) and df[c].isna().all()]
    return df.drop(columns=unused)


def search_table_html(table: pd.DataFrame) -> pd.DataFrame:
    """``search_frame`` as the report prints it: ranked by its Rank column, yes/no for the flags, empty cells where
    a column does not apply (TP of a prefill/decode split)."""
    out = table.set_index("Rank") if len(table) else table.copy()
    for col in ("Pareto", "Calibrated"):
        if col in out:
            out[col] = out[col].map({True: "yes", False: "no"})
    return out.astype(object).where(out.notna(), "")


def left_out_frame(found: Mapping) -> pd.DataFrame:
    """The configurations the search left out and why, as the page's "Why not the others" shows them."""
    rows = ([{"Configuration": s["label"], "Left out": s.get("reason", "skipped"), "Why": s.get("why", "")}
             for s in found.get("skipped", ())]
            + [{"Configuration": s["label"], "Left out": "pruned (cannot beat the best)", "Why": s.get("why", "")}
               for s in found.get("pruned", ())]
            + [{"Configuration": s["label"], "Left out": "failed on a worker",
                "Why": f"{s.get('error', '')} ({s.get('tries', '?')} tries)"} for s in found.get("failed", ())])
    return pd.DataFrame(rows, columns=["Configuration", "Left out", "Why"])


def _searched(found: Mapping, key: str) -> list:
    """The values of ``key`` over every configuration of the grid the search met (ranked, skipped, pruned,
    failed), in their first order."""
    seen = []
    for part in ("configs", "skipped", "pruned", "failed"):
        for r in found.get(part, ()):
            v = r.get(key)
            if v is not None and v not in seen:
                seen.append(v)
    return seen


def search_slo_text(found: Mapping, scenario: Scenario) -> str:
    """The search's SLOs in words ('TTFT ≤ 1,000 ms; TPOT ≤ 50 ms for 99 % of each class's requests')."""
    from batching.studies.capacity import SLO

    if not found.get("slo"):
        return "SLOs not recorded"
    try:
        names = class_names(scenario)
    except ValueError:
        names = None
    return SLO(**found["slo"]).describe(names)


def search_rows(found: Mapping, scenario: Scenario) -> list[tuple[str, str]]:
    """The report's scenario table for a search: what the search used (the GPUs, precisions, TPs or splits,
    policies and serving it tried, the target traffic, the SLOs, prices, headroom, router), with the scenario's
    model and workload; never the sidebar's own GPU, TP or rate, which the search replaced."""
    from batching.charts.export import _gpu_name

    dep, wl = scenario.deployment, scenario.workload
    target = found.get("target_rate_req_s")
    shapes = []
    for part in ("configs", "skipped", "pruned", "failed"):
        for r in found.get(part, ()):
            if r.get("gpu") is not None and (r.get("tp") is not None or r.get("split") is not None):
                shape = _shape(r)
                if shape not in shapes:
                    shapes.append(shape)
    serving = {"agg": "aggregated", "disagg": "disaggregated (prefill/decode splits)",
               "both": "aggregated and disaggregated"}
    prices = found.get("gpu_hour_usd") or {}
    rows = [
        ("Target traffic", "n/a" if target is None else f"{target:,.4g} req/s"),
        ("SLOs", search_slo_text(found, scenario)),
        ("Model", dep.model.name),
        ("GPUs searched", ", ".join(_gpu_name(g) for g in (_searched(found, "gpu") or list(prices))) or "none"),
        ("GPUs per node", str(found.get("num_gpus_per_node", dep.node.num_gpus))),
        ("Precisions searched", ", ".join(str(p).upper() for p in _searched(found, "precision")) or "none"),
        ("Serving searched", serving.get(found.get("serving"), str(found.get("serving", "n/a")))),
        ("Shapes searched", "; ".join(shapes) or "none"),
        ("Policies searched", ", ".join(_searched(found, "policy")) or "none"),
        ("Price per GPU-hour", ", ".join(f"{_gpu_name(g)} ${v:,.2f}" for g, v in prices.items()) or "n/a"),
        ("Headroom", found.get("headroom_note") or (f"{found['headroom']:g}x" if found.get("headroom") else "n/a")),
        ("Fleet check", f"the top {found.get('fleet_top', '?')} behind the {found.get('router', '?')} router"),
        ("Workload", describe_workload(wl, "rate searched")),
    ]
    if isinstance(wl, SyntheticWorkload):
        rows += [("Requests", f"{wl.num_requests:,}"), ("Seed", str(wl.seed))]
    return rows


def search_verdict(found: Mapping, chosen: int | None = 0) -> str:
    """The page's answer: the chosen configuration (the cheapest by default) and what it takes at the target, or
    that none meets the SLOs."""
    from batching.studies.search import chosen_sentence

    ok = [c for c in found.get("configs", ()) if c.get("meets_slo")]
    if not ok:
        return "No configuration meets these SLOs; the configurations left out say why."
    pick = chosen if chosen is not None and 0 <= chosen < len(ok) else 0
    best = ok[pick]
    sentence = chosen_sentence(best, found["target_rate_req_s"], found.get("headroom", 1.0), found.get("tail", "P99"))
    return f"{'Cheapest' if pick == 0 else f'Chosen (#{pick + 1})'}: {best['label']}: {sentence}"


def search_export(found: Mapping, scenario: Scenario, chosen: int | None = 0) -> PageExport:
    """Find a deployment: the cost-against-latency chart (captioned with its points' own GPUs, precisions, TPs and
    policies, the SLOs and the target drawn), the ranked configurations as the page's table (CSV and the report),
    the ones left out and why, the search's JSON (every field), the report with the SLOs, the target and the
    verdict. The dashboard's downloads and ``python -m batching report --page search`` both write this."""
    from batching.charts.export import configs_caption
    from batching.charts.search import pareto_chart

    configs = list(found.get("configs", ()))
    target = found.get("target_rate_req_s")
    tail = found.get("tail", "P99")
    fig = with_caption(pareto_chart(configs, chosen, found.get("slo"), target), configs_caption(configs, scenario),
                       copy=False)
    table = search_frame(configs, target or 0.0, tail)
    tables = {"configurations": table}
    left = left_out_frame(found)
    if len(left):
        tables["left_out"] = left
    rows = search_rows(found, scenario)
    doc = {"scenario": dict(rows), **found}
    data = json.dumps(jsonable(doc), indent=2, allow_nan=False, default=str).encode()
    html_tables = [("Configurations meeting the SLOs, ranked by cost", search_table_html(table))]
    if len(left):
        html_tables.append(("Left out, and why", left.set_index("Configuration")))
    notes = tuple(found.get("notes", ())) + tuple(n for n in (found.get("headroom_note"),
                                                              found.get("rounding_note")) if n)
    return PageExport(
        "search", f"Find a deployment: {search_slo_text(found, scenario)}", scenario,
        {"pareto": (fig, "Cost against P99 TTFT and TPOT per configuration at the target traffic; the Pareto front "
                         "in colour and labelled, dashed: the SLOs.")},
        tables, "data", data, tuple(html_tables), verdict=search_verdict(found, chosen), notes=notes,
        rate="rate searched", rows=tuple(rows))
