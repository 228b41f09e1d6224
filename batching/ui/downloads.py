"""A page's downloads in one call (issue 24 item 11): its tables as CSV, its data as JSON, its standalone HTML report,
and every figure as PNG and as SVG (kaleido, zipped). Every file is made only when its button is clicked (deferred
callables): kaleido takes seconds, the page's reruns stay fast."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import plotly.graph_objects as go
import streamlit as st

from batching import report
from batching.ui import state

ICONS = {"text/csv": ":material/table:", "application/json": ":material/data_object:",
         "text/html": ":material/description:", "application/zip": ":material/image:"}


def figure_files(figures: Callable[[], Mapping[str, go.Figure]], fmt: str) -> Callable[[], bytes]:
    """A button's deferred data: every figure as ``<name>.<fmt>`` in one zip. A figure kaleido cannot render (no
    Chromium on the server) gives a zip with ``error.txt`` saying why, never a traceback."""
    def make() -> bytes:
        try:
            return report.figures_zip(figures(), fmt)
        except Exception as exc:  # kaleido/choreographer raise their own types
            return report.zip_bytes({"error.txt": f"The charts could not be rendered as {fmt.upper()} on this "
                                                  f"server: {type(exc).__name__}: {exc}\n".encode()})
    return make


def chart_buttons(cols, name: str, figures: Callable[[], Mapping[str, go.Figure]]) -> None:
    """Two buttons in ``cols``: every figure of the page as PNG, and as SVG (each a zip of ``<name>_<key>.<fmt>``)."""
    for col, fmt, what in zip(cols, ("png", "svg"), ("PNG (raster, 2x)", "SVG (vector, for documents)")):
        col.download_button(f"Charts ({fmt.upper()})", figure_files(figures, fmt), f"{name}_charts_{fmt}.zip",
                            "application/zip", on_click="ignore", icon=ICONS["application/zip"], width="stretch",
                            help=f"Every chart of this page as {what}, with its caption line, in one zip; made "
                                 "when clicked (a few seconds).")


def export_buttons(export: report.PageExport, name: str | None = None, link: str | None = None,
                   heading: str | None = "Downloads") -> None:
    """A view's export (``report.PageExport``) as buttons: each table (CSV), the data (JSON), the report (HTML),
    the charts (PNG and SVG); then the link to this view."""
    name = name or export.page
    if heading:
        st.subheader(heading, divider="gray")
    link = link or state.current_link()
    files: list[tuple[str, Callable[[], bytes], str, str]] = [
        (f"{key.replace('_', ' ').capitalize()} (CSV)", (lambda df=df: report.frame_csv(df)), f"{name}_{key}.csv",
         "text/csv") for key, df in export.tables.items()]
    files.append(("Data (JSON)", lambda: export.json, f"{name}_{export.json_key}.json", "application/json"))
    files.append(("Report (HTML)", lambda: export.html(link).encode("utf-8"), f"{name}_report.html", "text/html"))
    cols = st.columns(max(4, len(files) + (2 if export.figures else 0)))
    for col, (label, data, file_name, mime) in zip(cols, files):
        col.download_button(label, data, file_name, mime, on_click="ignore", icon=ICONS[mime], width="stretch")
    if export.figures:
        chart_buttons(cols[len(files):], name, lambda: {f"{name}_{k}": fig for k, (fig, _) in export.figures.items()})
    st.markdown("**Link to this view** (the scenario and settings are in the URL):")
    st.code(link, language=None, wrap_lines=True)
