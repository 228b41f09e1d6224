"""Exports: a standalone HTML report, CSV of requests and steps, summary JSON, chart PNGs.

The HTML report embeds plotly.js once (``include_plotlyjs=True`` on the first figure), so it
opens offline; nothing is loaded from a CDN.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from batching.charts import policy as charts
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, SimResult
from batching.sim.workload import SyntheticWorkload, TraceWorkload

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


def describe_workload(workload: SyntheticWorkload | TraceWorkload) -> str:
    if isinstance(workload, TraceWorkload):
        parts = [f"trace {workload.filename}"]
        if workload.speedup != 1.0:
            parts.append(f"replayed {workload.speedup:.3g}x faster")
        if workload.max_requests is not None:
            parts.append(f"first {workload.max_requests:,} requests")
        return ", ".join(parts)
    classes = ", ".join(f"{c.name} {c.share:.0%}" for c in sorted(workload.classes, key=lambda c: c.priority))
    arr = workload.arrivals
    return f"{arr.kind} arrivals at {arr.rate_req_s:g} req/s; classes: {classes}"


def scenario_rows(scenario: Scenario) -> list[tuple[str, str]]:
    """The scenario as (field, value) rows for tables and reports."""
    dep, wl = scenario.deployment, scenario.workload
    node = dep.node
    kv = f"{dep.kv_capacity_tokens:,} tokens per replica"
    if dep.kv_cache_tokens is not None:
        kv += f" (limited from {dep.kv_capacity_tokens_max:,})"
    rows = [
        ("GPU", f"{node.num_gpus} x {node.gpu.name}"),
        ("Model", dep.model.name),
        ("Tensor parallel", f"{node.tp} ({node.replicas} replica{'s' if node.replicas != 1 else ''})"),
        ("Precision", dep.precision),
        ("KV cache", kv),
        ("Workload", describe_workload(wl)),
    ]
    if isinstance(wl, SyntheticWorkload):
        rows += [("Requests", f"{wl.num_requests:,}"), ("Seed", str(wl.seed))]
    return rows


def scenario_slug(scenario: Scenario) -> str:
    """A short file-name part naming the scenario, e.g. ``Qwen2.5-72B_H100-SXM_tp8_bf16_3rps_2000req``."""
    dep, wl = scenario.deployment, scenario.workload
    parts = [dep.model.name, dep.node.gpu.name.replace(" 80GB", "").replace(" 141GB", ""), f"tp{dep.node.tp}",
             dep.precision]
    if isinstance(wl, TraceWorkload):
        parts.append(wl.filename.rsplit(".", 1)[0])
    else:
        parts += [f"{wl.rate_req_s:g}rps", f"{wl.num_requests}req", f"seed{wl.seed}"]
    if dep.kv_cache_tokens is not None:
        parts.append(f"kv{dep.kv_cache_tokens}")
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


def combined_csv(results: Mapping[str, SimResult], table: str = "requests") -> bytes:
    """Requests or steps of several runs in one CSV, a ``policy`` column first."""
    frames = [getattr(res, table).assign(policy=name) for name, res in results.items()]
    if not frames:
        return b""
    df = pd.concat(frames, ignore_index=True)
    return frame_csv(df[["policy", *[c for c in df.columns if c != "policy"]]])


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
    }
    return json.dumps(jsonable(doc), indent=2, allow_nan=False).encode()


def figure_png(fig: go.Figure, scale: float = 2, width: int = 1200, height: int | None = None) -> bytes:
    """A chart as PNG through kaleido (needs Chrome/Chromium; the CLI uses this)."""
    return pio.to_image(fig, format="png", scale=scale, width=width, height=height or fig.layout.height or 450)


# ---------------------------------------------------------------- one policy's figures (Explore a policy)

# the metric cards of "Explore a policy", and the rows of its report's metrics table
POLICY_METRICS = ("throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                  "e2e_p50_s", "e2e_p99_s", "gpu_util", "batch_efficiency", "preemptions")


def policy_figures(result: SimResult) -> dict[str, tuple[go.Figure, str]]:
    """Every figure "Explore a policy" shows for one run, in page order, each with its report caption.

    The keys are the file-name suffixes of the dashboard's PNG downloads (``<name>_<key>.png``); the page
    and ``python -m batching report`` both draw from here, so a document's figure is the app's figure.
    """
    names = result.class_names
    figs = {
        "timeline": (charts.request_timeline(result.requests, names),
                     "Request timeline: queued, prefill, decode and held segments per request."),
        "batch_composition": (charts.batch_composition(result.steps), "Batch composition over time."),
        "kv_queue": (charts.kv_and_queue(result.steps, result.scenario.deployment.kv_capacity_tokens),
                     "KV cache use and queue depth over time."),
    }
    for metric in ("ttft", "tpot", "e2e"):
        figs[f"{metric}_hist"] = (charts.latency_histogram(result.requests, metric, names),
                                  f"{metric.upper()} histogram per class.")
    figs["itl"] = (charts.itl_histogram(result.itl_hist, result.itl_edges, names), "Inter-token latency histogram.")
    return figs


# ---------------------------------------------------------------- HTML report


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _frame_table(df: pd.DataFrame) -> str:
    return df.to_html(na_rep="n/a", escape=True, border=0, float_format=lambda v: f"{v:,.4g}")


def html_report(title: str, scenario: Scenario, *, figures: Sequence[tuple[go.Figure, str]] = (),
                tables: Sequence[tuple[str, pd.DataFrame]] = (), policies: Mapping[str, BatchingPolicy] | None = None,
                verdict: str = "", link: str = "", notes: Sequence[str] = ()) -> str:
    """A standalone HTML page: scenario, policies, tables and interactive figures (plotly.js inlined once)."""
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
    out.append("<h2>Scenario</h2>" + _kv_table(scenario_rows(scenario)))
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
    for i, (fig, caption) in enumerate(figures):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), default_width="100%",
                          config=charts.png_config(_fig_title(fig) or f"chart_{i + 1}"))
        out.append(div)
        if caption:
            out.append(f'<p class="caption">{html.escape(caption)}</p>')
    out.append("</body></html>")
    return "\n".join(out)


def _fig_title(fig: go.Figure) -> str:
    return getattr(fig.layout.title, "text", None) or ""
