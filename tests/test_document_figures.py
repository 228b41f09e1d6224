"""Issue 24 item 12, figures and labels at document size: numbers in captions and tables at sensible digits,
no "None" cells, legends clear of axis titles and captions, labels that do not collide."""
from __future__ import annotations

import math

from batching.charts.formatting import MISSING, change_text, rate_text, sig_text


def test_sig_text_never_prints_a_raw_float():
    assert sig_text(4.71174) == "4.71"
    assert rate_text(4.71174) == "4.71 req/s"
    assert sig_text(0.0277, 2) == "0.028"
    assert sig_text(15.83) == "15.8"
    assert sig_text(1234.5) == "1,234"
    assert sig_text(3.0) == "3" and sig_text(0.5) == "0.5" and sig_text(0) == "0"
    assert sig_text(float("nan")) == MISSING and sig_text(None) == MISSING


def test_change_text_is_a_dash_not_none():
    assert change_text(12.345) == "+12.3 %"
    assert change_text(-4.0) == "-4.0 %"
    for missing in (None, float("nan"), math.inf, True):
        assert change_text(missing) == MISSING


def test_capacity_names_and_report_leave_the_sidebar_rate_out():
    """Capacity's file names and its HTML carried the sidebar's rate ("10rps", "at 10 req/s") although the search
    varies it."""
    from batching import report
    from batching.charts.export import caption_of
    from batching.sim.simulate import Scenario
    from batching.sim.workload.requests import workload_preset

    sc = Scenario(workload=workload_preset("mixed", 10.0, 300, 0))
    assert "10rps" in report.scenario_slug(sc)  # pages that run the sidebar's rate keep it
    slug = report.scenario_slug(sc, rate=False)
    assert "rps" not in slug and slug.endswith("_300req_seed0")
    rows = dict(report.scenario_rows(sc, "rate searched"))
    assert rows["Workload"].startswith("poisson arrivals, rate searched;")
    import plotly.graph_objects as go

    html = report.html_report("Capacity planning", sc, figures=[(go.Figure(), "a figure")], rate="rate searched")
    assert "10 req/s" not in html and "10rps" not in html
    assert html.count("rate searched") >= 2  # the scenario table and the figure's caption line
    plain = report.html_report("Explore", sc, figures=[(go.Figure(), "a figure")])
    assert "10 req/s" in plain
    assert caption_of(go.Figure()) is None


def test_fleet_caption_and_subtitle_wrap_instead_of_clipping():
    """The fleet's caption ran "... · 2 replicas, least-outstanding router" on one 101-character line, cut at a
    document's width ("least-outstanding rou"); so did the subtitle with the binning note."""
    from dataclasses import replace

    import numpy as np
    import pandas as pd

    from batching.charts import fleet
    from batching.charts.export import MAX_LINE_CHARS, caption_of, scenario_caption, with_caption
    from batching.sim.simulate import Scenario

    sc = replace(Scenario(), nodes=2, router="least-outstanding")
    line = scenario_caption(sc, policy="continuous")
    fig = with_caption(fleet.replica_kv_queue(pd.DataFrame(), 1000, 2), line)
    shown = fig.layout["legend9"].title.text.split("<br>")
    assert all(len(part) <= MAX_LINE_CHARS for part in shown), shown
    assert any(part.endswith("least-outstanding router") for part in shown)  # whole, on a line of its own
    assert caption_of(fig) == line  # the text itself is unchanged
    steps = pd.DataFrame({"replica": np.repeat([0, 1], 20), "start_s": np.tile(np.arange(20) * 0.1, 2),
                          "duration_s": 0.1, "kv_blocks": 10, "waiting": 1})
    fig = fleet.replica_kv_queue(steps, 16_000, 2, 1, subtitle="2 nodes x 1 replica, least-outstanding router")
    sub = fig.layout.title.subtitle.text.split("<br>")
    assert sub[0] == "2 nodes x 1 replica, least-outstanding router" and sub[1].startswith("time-weighted mean")
    assert all(len(part) <= MAX_LINE_CHARS for part in sub)
