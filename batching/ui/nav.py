"""The dashboard's pages in navigation order: file, title and icon, defined once (no Streamlit here).

Each page's ``page.setup`` takes its title and icon from here (the heading and the browser tab), and the
sidebar's links list the same entries, so a page cannot be named one way in the links and another on screen.
"""
from __future__ import annotations

from typing import NamedTuple


class PageInfo(NamedTuple):
    path: str  # relative to the app root, as st.page_link and AppTest.switch_page take it
    title: str
    icon: str  # a Material Symbols name, as Streamlit writes it


HOME = PageInfo("app.py", "Strategy showdown", ":material/leaderboard:")
EXPLORE = PageInfo("pages/explore.py", "Explore a policy", ":material/tune:")
COMPARE = PageInfo("pages/compare.py", "Compare policies", ":material/compare_arrows:")
TUNE = PageInfo("pages/tune.py", "Tune a knob", ":material/show_chart:")
CAPACITY = PageInfo("pages/capacity.py", "Capacity planning", ":material/dns:")
MODEL_AND_HARDWARE = PageInfo("pages/model_and_hardware.py", "Model and hardware", ":material/memory:")
FIND_A_DEPLOYMENT = PageInfo("pages/find_a_deployment.py", "Find a deployment", ":material/travel_explore:")
PAGES: tuple[PageInfo, ...] = (HOME, EXPLORE, COMPARE, TUNE, CAPACITY, FIND_A_DEPLOYMENT, MODEL_AND_HARDWARE)
