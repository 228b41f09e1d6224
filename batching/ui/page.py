"""Page set-up shared by every page: config, style, the scenario sidebar."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from batching.sim.simulate import Scenario
from batching.ui.sidebar import scenario_sidebar

STYLE = Path(__file__).resolve().parents[2] / "assets" / "style.css"


def setup(title: str, icon: str, intro: str) -> Scenario | None:
    """Configure the page, draw its title and the shared sidebar; return the scenario to show."""
    st.set_page_config(page_title=f"{title} · Batching explorer", page_icon=icon, layout="wide",
                       initial_sidebar_state="expanded")
    if STYLE.exists():
        st.html(f"<style>{STYLE.read_text()}</style>")
    st.title(title)
    st.caption(intro)
    return scenario_sidebar(title)
