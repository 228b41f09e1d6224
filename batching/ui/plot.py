"""A Plotly chart that redraws in place: the dashboard's one way to put a figure on the page.

``st.plotly_chart`` gives a chart whose figure changed a new element id, so the browser re-mounts it and runs a
full ``Plotly.newPlot`` (and Streamlit's own JSON re-parse) for every chart on every knob move. Here each chart
slot is an ``st.components.v2`` component with a key that stays the same across reruns; its script
(``plot.js``) keeps the chart's node and calls ``Plotly.react`` with the new figure, and skips a figure it has
drawn already. plotly.js is the bundle of the pinned Python ``plotly`` package, served from ``static/``.

The figure goes out as plotly's own JSON (numeric arrays as base64 typed arrays), the same bytes
``st.plotly_chart`` sends. Keys: a caller may pass one; otherwise the call site (file and line) and how many
charts that site drew before in this script run name the slot, so a chart keeps its node as long as the page
draws the same charts in the same places.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

NAME = "batching_plot"
JS = (Path(__file__).with_name("plot.js")).read_text(encoding="utf-8")
_mount = st.components.v2.component(NAME, js=JS, isolate_styles=False)


def figure_bytes(fig: go.Figure, config: dict | None = None) -> bytes:
    """``{"figure": <plotly's JSON of fig>, "config": <config>}`` as UTF-8: what one chart sends."""
    return ('{"figure": ' + fig.to_json() + ', "config": ' + json.dumps(config or {}) + "}").encode("utf-8")


def _slot(depth: int) -> str:
    """``file:line#n`` of the caller ``depth`` frames up: the n-th chart that line drew in this run."""
    frame = sys._getframe(depth + 1)
    site = f"{Path(frame.f_code.co_filename).stem}:{frame.f_lineno}"
    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None:
        return f"{site}#0"
    run, seen = getattr(ctx, "_batching_plot_slots", (None, None))
    if run is not ctx.cursors:  # Streamlit gives each script (or fragment) run a new cursors dict
        seen = {}
        ctx._batching_plot_slots = (ctx.cursors, seen)
    n = seen.get(site, 0)
    seen[site] = n + 1
    return f"{site}#{n}"


PRELOAD_KEY = "batching-plotly-preload"  # assets/style.css hides its element (Streamlit names it st-key-<key>)


def preload() -> None:
    """Start loading plotly.js in the browser now (page.setup calls it first thing): on a page's first visit the
    4.8 MB bundle is fetched and compiled while the server simulates, not after the first chart arrives."""
    _mount(key=PRELOAD_KEY, data="preload", width="stretch", height="content")


def plotly_chart(fig: go.Figure, config: dict | None = None, key: str | None = None, depth: int = 1) -> None:
    """Draw ``fig`` full width; a rerun with another figure in the same slot redraws it in place."""
    _mount(key=f"plot:{key or _slot(depth)}", data=figure_bytes(fig, config), width="stretch", height="content")
