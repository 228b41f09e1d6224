"""Hostile names and how to read figures and HTML reports for the markup they could carry (charts.text.literal).

Plotly draws ``<a href>``, ``<b>``, ``<br>``, ``<i>``, ``<span style>`` found in any text of a figure; a user's text
must reach a figure as entities (``&lt;a href=...&gt;``), which Plotly shows as typed.
"""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Sequence
from html.parser import HTMLParser

from batching.charts.text import literal

CLASS_LINK = '<a href="https://evil.example/a">Click A</a>'
CLASS_FORMAT = "<b>Bold</b><br><i>it</i> & &lt;x&gt;"  # formatting, a line break and text that looks escaped
FILE_LINK = "<a href='https://evil.example/g'>Open me</a>.csv"  # an uploaded file's name
HOSTILE_CLASSES = (CLASS_LINK, CLASS_FORMAT, "batch")
_ANCHOR = re.compile(r"<\s*a[\s>/]", re.IGNORECASE)


def hostile_trace(rows: int = 60) -> bytes:
    """A native trace whose three priority classes are named ``HOSTILE_CLASSES`` (quoted by the csv module)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arrival_s", "prompt_tokens", "output_tokens", "priority", "class_name"])
    for i in range(rows):
        level = i % len(HOSTILE_CLASSES)
        w.writerow([f"{i * 0.5:.2f}", 200 + 37 * i % 900, 20 + 13 * i % 150, level, HOSTILE_CLASSES[level]])
    return buf.getvalue().encode()


def strings(obj, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a figure's JSON with where it is (``.data[0].name``)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from strings(v, f"{path}[{i}]")
    elif isinstance(obj, str):
        yield path, obj


def live_markup(spec: dict, hostile: Sequence[str]) -> list[str]:
    """Where a figure could draw a user's markup: any ``<a`` tag (no builder writes links), or one of ``hostile``
    found as typed rather than as entities."""
    return [f"{p}: {s[:160]}" for p, s in strings(spec) if _ANCHOR.search(s) or any(h in s for h in hostile)]


def shows(spec: dict, text: str, where: str = "") -> bool:
    """The figure carries ``text`` escaped (so Plotly shows it as typed), in a string whose path contains ``where``."""
    escaped = literal(text)
    return any(escaped in s for p, s in strings(spec) if where in p)


def report_figures(html: str) -> list[dict]:
    """The figures of a standalone HTML report (``Plotly.newPlot("id", data, layout, config)`` calls), decoded."""
    decoder = json.JSONDecoder()
    out = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]*",\s*', html):
        data, end = decoder.raw_decode(html, m.end())
        gap = re.compile(r"\s*,\s*").match(html, end)
        layout, _ = decoder.raw_decode(html, gap.end())
        out.append({"data": data, "layout": layout})
    return out


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.text: list[str] = []
        self._raw = 0

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self._raw += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._raw -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._raw:
            self.text.append(data)


def report_tags(html: str) -> tuple[set[str], str]:
    """The element names a report's HTML holds and its visible text (scripts and styles left out)."""
    parser = _Tags()
    parser.feed(html)
    return parser.tags, "".join(parser.text)
