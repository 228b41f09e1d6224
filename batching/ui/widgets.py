"""Screen pieces pages share: a chart with its caption, metric cards, downloads, guarded calls."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import plotly.graph_objects as go
import streamlit as st

from batching.charts import policy as charts
from batching.charts.export import caption_of, with_caption
from batching.ui import plot, state
from batching.ui.cache import ServerBusy
from batching.ui.page import CAPTION_LINE
from batching.ui.safe import plain
from batching.ui.tables import metric_spec, shown

T = TypeVar("T")
CARD_LABELS = {"throughput_output_tok_s": "Throughput at this load", "batch_efficiency": "Batch efficiency",
               "busy": "GPU busy", "load": "Load (share of capacity)"}


def chart(fig: go.Figure, caption: str, filename: str, key: str | None = None, scenario_line: str | None = None) -> None:
    """A Plotly chart in the shared template, its one-line reading guide, PNG download named ``filename``. The
    figure carries the scenario line under the plot (so its PNG download does, as exports do): ``scenario_line``,
    else (None) the page's scenario (``page.setup``), unless the figure has a caption already. ``""``: no line,
    for a chart that is not a run of the sidebar's scenario (the calibration against measurements); such a figure
    is left as it was given, so a page may keep it between reruns."""
    line = st.session_state.get(CAPTION_LINE) if scenario_line is None else scenario_line
    if line and caption_of(fig) is None:
        fig = with_caption(fig, line, copy=False)
    plot.plotly_chart(fig, config=charts.png_config(filename), key=key, depth=2)
    st.caption(caption)


def open_tabs(labels: Sequence[str], items: Sequence[T], key: str) -> list[tuple[object, T]]:
    """Tabs whose hidden ones draw nothing: (tab, item) for the open tab only. A click on another tab reruns the
    script (or the fragment it is in) and draws that one: hidden Plotly charts would be sent, parsed and drawn
    by the browser on every rerun although nobody sees them. Every tab stays one click away, nothing is lost."""
    tabs = st.tabs(list(labels), key=key, on_change="rerun")
    opened = [(tab, item) for tab, item in zip(tabs, items) if tab.open]
    return opened or [(tabs[0], items[0])]  # no state yet (bare mode): the first, as st.tabs opens


def guarded(fn: Callable[[], T], what: str) -> T | None:
    """Run a library call; a ValueError or RuntimeError becomes an st.error saying what to change
    (or, when every simulation slot stayed taken, that the server is busy and to try again). ``what`` and the
    message are shown as plain text: they may quote a spec name, a file name or a trace cell."""
    try:
        return fn()
    except ServerBusy as exc:
        st.error(f"**{plain(what)} did not run:** {plain(exc)}", icon=":material/hourglass_disabled:")
        return None
    except (ValueError, RuntimeError) as exc:
        st.error(f"**{plain(what)} failed:** {plain(exc)}", icon=":material/error:")
        return None


def metric_cards(summary: Mapping, keys: Sequence[str], baseline: Mapping | None = None,
                 per_row: int = 5) -> None:
    """One st.metric per key with its definition as tooltip; deltas against ``baseline`` when given."""
    for start in range(0, len(keys), per_row):
        cols = st.columns(per_row)
        for col, key in zip(cols, keys[start:start + per_row]):
            spec = metric_spec(key)
            value = summary.get(key)
            delta = None
            if baseline is not None and value is not None and baseline.get(key) is not None:
                diff = value - baseline[key]
                if abs(diff) > 1e-4 * max(abs(baseline[key]), 1e-9):
                    delta = _delta_text(key, diff)
            label = CARD_LABELS.get(key, spec.header.split(" (")[0])
            col.metric(label, shown(key, value), delta=delta, help=spec.help, border=True,
                       delta_color="inverse" if spec.lower_is_better else "normal")


def _delta_text(key: str, diff: float) -> str:
    text = shown(key, abs(diff))
    if text.endswith(" %"):
        text = text[:-2] + " pp"  # a change of a share is in percentage points
    return ("+" if diff > 0 else "-") + text  # ASCII minus: st.metric reads the sign from it


def downloads(*, name: str, summary_json: Callable[[], bytes], report_html: Callable[[], str],
              requests_csv: Callable[[], bytes] | None = None, steps_csv: Callable[[], bytes] | None = None,
              link: str | None = None, figures: Callable[[], Mapping[str, go.Figure]] | None = None) -> None:
    """CSV of requests and steps, summary JSON, the standalone HTML report, every chart as PNG and SVG (``figures``:
    file stem -> figure, built on the click), and the link to this view.

    The files are made only when a button is clicked (deferred callables), so reruns stay fast.
    """
    st.subheader("Downloads", divider="gray")
    cols = st.columns(4)
    if requests_csv is not None:
        cols[0].download_button("Requests (CSV)", requests_csv, f"{name}_requests.csv", "text/csv",
                                on_click="ignore", icon=":material/table:", width="stretch",
                                help="One row per request: arrival, first token, finish, release, latencies (s).")
    if steps_csv is not None:
        cols[1].download_button("Steps (CSV)", steps_csv, f"{name}_steps.csv", "text/csv", on_click="ignore",
                                icon=":material/table:", width="stretch",
                                help="One row per forward pass and replica: tokens, running, waiting, KV blocks.")
    cols[2].download_button("Summary (JSON)", summary_json, f"{name}_summary.json", "application/json",
                            on_click="ignore", icon=":material/data_object:", width="stretch",
                            help="Every metric of the summary, with the scenario and policies.")
    cols[3].download_button("Report (HTML)", report_html, f"{name}_report.html", "text/html", on_click="ignore",
                            icon=":material/description:", width="stretch",
                            help="A standalone page with the scenario, tables and interactive charts; opens "
                                 "offline.")
    if figures is not None:
        from batching.ui.downloads import chart_buttons

        chart_buttons(st.columns(4)[:2], name, figures)
    st.markdown("**Link to this view** (the scenario and knobs are in the URL):")
    st.code(link or state.current_link(), language=None, wrap_lines=True)
