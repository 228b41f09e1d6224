"""batching/ui/plot.py: charts that redraw in place (issue 11).

The page sends each chart as a keyed st.components.v2 element whose script calls Plotly.react on the node it
drew before; plotly.js is served from static/. These tests check what the server side owns: the bundle is the
pinned plotly package's own, Streamlit serves it, a knob move keeps every chart's element (so the browser
updates it in place) while its figure changes, and the figure sent is the one the page built. The browser side
is tests/e2e/test_browser.py (charts drawn, a knob move redraws) and benchmarks/bench_browser.py (timings)."""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import plotly
import plotly.graph_objects as go

from batching.ui import plot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ui"))
from uihelpers import FAST, assert_clean, drawn_charts, run_page  # noqa: E402


def test_static_bundle_is_the_pinned_plotly_packages_own():
    shipped = (ROOT / "static" / "plotly.min.js").read_bytes()
    packaged = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    assert shipped == packaged, "static/plotly.min.js differs from the installed plotly's: copy it again"
    assert b"Licensed under the MIT license" in shipped[:400]
    assert "MIT License" in (ROOT / "static" / "LICENSE-plotly.js.txt").read_text()


def test_streamlit_serves_static_and_the_script_loads_from_there():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["enableStaticServing"] is True
    assert 'PLOTLY_SRC = "app/static/plotly.min.js"' in plot.JS  # relative: works under a base URL path too


def test_figure_bytes_carry_the_figure_and_its_config():
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[4.5, 5.5, 6.5], name="é·x"))
    fig.update_layout(title="t", height=300)
    sent = json.loads(plot.figure_bytes(fig, {"toImageButtonOptions": {"filename": "f", "scale": 2}}))
    assert sent["config"] == {"toImageButtonOptions": {"filename": "f", "scale": 2}}
    assert sent["figure"] == json.loads(fig.to_json())
    assert sent["figure"]["data"][0]["name"] == "é·x" and sent["figure"]["layout"]["height"] == 300
    assert json.loads(plot.figure_bytes(fig))["config"] == {}


def test_a_knob_move_keeps_every_charts_element_and_changes_its_figure():
    """Explore, max wait 100 -> 300 ms on the dynamic preset: the same element ids in the same order (the browser
    keeps each chart's node and calls Plotly.react), and every figure that depends on the run changed."""
    at = run_page("pages/explore.py", policy="dynamic", **FAST)
    assert_clean(at)
    before = drawn_charts(at)
    assert len(before) == 5 and len({c.id for c in before}) == 5
    at.slider(key="wid:wait_ms").set_value(300).run()
    assert_clean(at)
    after = drawn_charts(at)
    assert [c.id for c in after] == [c.id for c in before]
    changed = [a.spec != b.spec for a, b in zip(after, before)]
    assert all(changed), changed
    assert all('"filename": "explore_dynamic' in c.config for c in after)


def test_slots_are_named_by_call_site_and_count():
    """Two charts drawn from one line get two slots; the next run names them the same."""
    from streamlit.testing.v1 import AppTest

    def app():
        import plotly.graph_objects as go
        import streamlit as st

        from batching.ui import plot

        n = st.number_input("n", 1, 5, 2)
        for i in range(int(n)):
            plot.plotly_chart(go.Figure(go.Bar(x=[i], y=[n])))

    at = AppTest.from_function(app).run()
    assert not at.exception
    first = [c.proto.id for c in at.get("bidi_component")]
    assert len(first) == 2 and first[0] != first[1] and first[0].endswith("#0") and first[1].endswith("#1")
    at.number_input[0].set_value(3).run()
    again = [c.proto.id for c in at.get("bidi_component")]
    assert again[:2] == first and len(again) == 3
