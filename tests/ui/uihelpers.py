"""AppTest helpers: run a page of the dashboard with URL query parameters, read its charts and metrics."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from streamlit.testing.v1 import AppTest

from batching.ui import plot

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120
# small runs keep the suite quick on two cores
FAST = {"n": "200"}


def open_page(page: str = "app.py", **query: str) -> AppTest:
    """A fresh session on ``page`` (a file under the app root), the URL carrying ``query``; not run yet."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = str(v)
    if page != "app.py":
        at.switch_page(page)
    return at


def run_page(page: str = "app.py", **query: str) -> AppTest:
    at = open_page(page, **query)
    at.run()
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def chart_specs(at: AppTest) -> list[dict]:
    return [json.loads(c.spec) for c in drawn_charts(at)]


def chart_titles(at: AppTest) -> list[str]:
    return [s["layout"]["title"]["text"] for s in chart_specs(at)]


def chart(at: AppTest, title_start: str) -> dict:
    found = [s for s in chart_specs(at) if s["layout"]["title"]["text"].startswith(title_start)]
    assert found, f"no chart titled {title_start!r} in {chart_titles(at)}"
    return found[0]


def data_traces(spec: dict) -> list[dict]:
    """The figure's data traces, without the invisible entry that draws the scenario caption (charts.export)."""
    from batching.charts.export import CAPTION_LEGEND

    return [t for t in spec["data"] if t.get("legend") != CAPTION_LEGEND]


def trace_types(spec: dict) -> set[str]:
    return {t.get("type", "scatter") for t in data_traces(spec)}


def metric_value(at: AppTest, label: str) -> float:
    """A metric card's value in seconds (or its number), parsed from text like '78.6 ms' or '1,234 tok/s'."""
    for m in at.metric:
        if m.label == label:
            text = m.value.replace(",", "")
            number = float(re.match(r"[-+]?[\d.]+", text).group())
            return number / 1e3 if text.endswith(" ms") else number
    raise AssertionError(f"no metric {label!r} in {[m.label for m in at.metric]}")



@dataclass(frozen=True)
class Drawn:
    """One chart as the page sent it (batching/ui/plot.py): element id, figure JSON, config JSON."""
    id: str
    spec: str
    config: str


def drawn_charts(at: AppTest) -> list[Drawn]:
    out = []
    for c in at.get("bidi_component"):
        if c.proto.component_name != plot.NAME or c.proto.id.endswith(plot.PRELOAD_KEY):
            continue  # the preload element draws no chart
        sent = json.loads(c.proto.bytes)
        out.append(Drawn(c.proto.id, json.dumps(sent["figure"], ensure_ascii=False),
                         json.dumps(sent["config"], ensure_ascii=False)))
    return out
