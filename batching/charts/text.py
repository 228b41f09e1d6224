"""User text in figures: shown as typed, never as Plotly markup (no Streamlit here).

Plotly draws a subset of HTML in every text of a figure: trace names (the legend), hover text and hover templates,
titles and subtitles, axis and tick labels, annotations, legend titles (the caption line of ``charts.export``).
``<a href="https://...">`` becomes a live link, ``<b>``, ``<i>``, ``<br>``, ``<sup>`` and ``<span style=...>``
format the text. So every text a user controls (class names from a trace's ``class_name`` column, a trace's file
name, custom model and GPU names, configuration labels built from them) goes through ``literal`` where it enters
a figure; the figures of the dashboard, its PNGs and the HTML reports are the same objects, so this covers all of
them. The builders' own markup (``<br>`` between lines, ``<extra>`` in hover templates) is written around it.

``literal`` writes ``&``, ``<`` and ``>`` as the entities ``&amp;``, ``&lt;`` and ``&gt;``: Plotly finds no tag in
the text and turns the entities back into the characters as it draws them (plotly.js ``svg_text_utils``:
``convertEntities`` decodes ``&lt;``, ``&gt;``, ``&amp;`` and numeric entities into a text node), so the reader
sees exactly what was typed. Quotes need nothing: outside a tag they are text.

CSV and JSON exports keep the raw text (they are data; formula cells are neutralised by ``report.csv_safe``), and
the HTML report escapes its own text with ``html.escape``.
"""
from __future__ import annotations

from collections.abc import Sequence


def literal(text: object) -> str:
    """``str(text)`` for a figure: Plotly shows it as typed (no link, no formatting, no line break)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def class_label(names: Sequence[str], level: int) -> str:
    """Priority class ``level``'s name for a figure (``literal``), or ``class <level>`` when it has none."""
    level = int(level)
    return literal(names[level]) if 0 <= level < len(names) else f"class {level}"


def unliteral(text: str) -> str:
    """The text ``literal(text)`` shows: its three entities read back (for code that reads a figure's text)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
