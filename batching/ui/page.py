"""Page set-up shared by every page: config, style, sign-in (when the host asks for it), the scenario sidebar."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from batching.charts.export import scenario_caption
from batching.sim.simulate import Scenario
from batching.ui import access, compile_notice, plot
from batching.ui.nav import PageInfo
from batching.ui.sidebar import scenario_sidebar

STYLE = Path(__file__).resolve().parents[2] / "assets" / "style.css"


CAPTION_LINE = "chart_caption_line"  # session: the current scenario's caption line for chart downloads


def setup(page: PageInfo, intro: str) -> Scenario | None:
    """Configure the page, draw its title and the shared sidebar; return the scenario to show.

    ``page`` is the page's entry in ``batching.ui.nav`` (title and icon are defined there, once). When the host
    configured ``[auth]`` in its secrets and this session has not signed in, the page shows only the sign-in
    prompt and stops here (``batching.ui.access``)."""
    st.set_page_config(page_title=f"{page.title} · Batching explorer", page_icon=page.icon, layout="wide",
                       initial_sidebar_state="expanded")
    if STYLE.exists():
        st.html(f"<style>{STYLE.read_text()}</style>")
    if not access.gate():
        st.stop()
    plot.preload()
    st.title(page.title)
    st.caption(intro)
    compile_notice.listen(st.empty())  # a run that compiles (once per install and feature) shows its progress here
    scenario = scenario_sidebar(page.title)
    access.account_box()
    # the scenario line every chart's PNG download carries (widgets.chart), as exported figures do
    st.session_state[CAPTION_LINE] = scenario_caption(scenario) if scenario is not None else None
    return scenario
