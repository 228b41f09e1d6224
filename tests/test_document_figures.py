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
    assert any("2 replicas, least-outstanding router" in part for part in shown)  # whole, never cut across lines
    assert caption_of(fig) == line  # the text itself is unchanged
    steps = pd.DataFrame({"replica": np.repeat([0, 1], 20), "start_s": np.tile(np.arange(20) * 0.1, 2),
                          "duration_s": 0.1, "kv_blocks": 10, "waiting": 1})
    fig = fleet.replica_kv_queue(steps, 16_000, 2, 1, subtitle="2 nodes x 1 replica, least-outstanding router")
    sub = fig.layout.title.subtitle.text.split("<br>")
    assert sub[0] == "2 nodes x 1 replica, least-outstanding router" and sub[1].startswith("time-weighted mean")
    assert all(len(part) <= MAX_LINE_CHARS for part in sub)


# ---------------------------------------------------------------- legends clear of axis titles and captions


def _sweep(values=(16, 32, 64, 128, 256), scale=1.0, shift=1.0):
    import numpy as np
    import pandas as pd

    x = np.asarray(values, float)
    cap = 1600 * scale * np.minimum(x, 128) / 128 + 20 * np.log2(x)
    return pd.DataFrame({"max_num_seqs": x, "steady_output_tok_s": np.full(len(x), 300.0),
                         "capacity_output_tok_s": cap, "offered_output_tok_s": np.full(len(x), 300.0),
                         "ttft_p50_s": 0.1, "ttft_p99_s": 0.5, "tpot_p50_s": 0.02, "tpot_p99_s": 0.03,
                         "capacity_tpot_p99_s": 0.012 * shift * np.sqrt(x)})


def test_tune_and_memory_legends_sit_beside_the_plot():
    """A legend below the plot (y = -0.2 or -0.55 of the plot's height) moved up onto the x-axis title, and onto
    the caption line, as the caption shrank the plot: Tune's charts and Model and hardware's memory bar."""
    from batching.charts import costmodel as ccm
    from batching.charts import planning as cp
    from batching.charts.export import with_caption
    from batching.charts.legend import clear_of_axes
    from batching.sim.simulate import Scenario

    figs = {"throughput": cp.sweep_throughput(_sweep(), "max_num_seqs", 128.0, True, "continuous"),
            "frontier": cp.sweep_frontier({"continuous": _sweep(), "chunked": _sweep(shift=1.05)}, "max_num_seqs",
                                          "tpot_cap", {"continuous": 128.0}),
            "memory": ccm.kv_memory(Scenario().deployment, 1500.0)}
    for name, fig in figs.items():
        fig = with_caption(fig, "Simulated: 8× H100 SXM 80GB · Qwen2.5-72B · TP 8 · BF16 · workload mixed")
        assert clear_of_axes(fig), (name, fig.layout.legend)
        assert fig.layout.legend.y is None or fig.layout.legend.y >= 0  # never below the plot
        assert not fig.layout.margin.b or fig.layout.margin.b <= 60  # no bottom room reserved for a legend


def test_frontier_labels_do_not_collide():
    """The chosen policy's knob labels ran into each other, into the other policies' markers and into the knee
    stars (before: every label 'top center' whatever stood there)."""
    from batching.charts import labels
    from batching.charts import planning as cp

    sweeps = {"continuous": _sweep(), "chunked": _sweep(scale=1.02, shift=1.03), "priority": _sweep(scale=1.08,
                                                                                                      shift=0.8)}
    fig = cp.sweep_frontier(sweeps, "max_num_seqs", "tpot_cap", {"continuous": 128.0, "priority": 64.0})
    x_range, y_range = tuple(fig.layout.xaxis.range), tuple(fig.layout.yaxis.range)
    boxes, markers = [], []

    def sizes(t):
        return list(t.marker.size) if isinstance(t.marker.size, (list, tuple)) else [t.marker.size] * len(t.x)

    for t in fig.data:
        if t.x is None or t.x[0] is None or t.mode == "lines":
            continue
        px, py = labels.to_px(t.x, t.y, x_range, y_range, log_x=True)
        opacity = list(t.marker.opacity) if isinstance(t.marker.opacity, (list, tuple)) else [1.0] * len(t.x)
        markers += [labels.marker_box(a, b, size / 2) for a, b, size, o in zip(px, py, sizes(t), opacity) if o]
    for t in fig.data:
        if t.mode and "text" in t.mode:
            px, py = labels.to_px(t.x, t.y, x_range, y_range, log_x=True)
            for a, b, text, pos, size in zip(px, py, t.text, t.textposition, sizes(t)):
                if text:  # Plotly sets a label off by its point's marker size (the knee's: the star's)
                    r = size / 2 if size == cp.FRONTIER_STAR else size / 2 + 1
                    boxes.append(labels.label_box(a, b, text, pos, r, cp.FRONTIER_FONT))
    chosen = next(t for t in fig.data if t.name == "continuous")
    assert sum(1 for text in chosen.text if text) >= 4  # most values still labelled
    assert len(set(chosen.textposition)) > 1  # moved off 'top center' where something stood there
    for i, a in enumerate(boxes):
        assert not any(labels.overlap(a, b) for b in boxes[i + 1:]), a
        assert not any(labels.overlap(a, m) for m in markers), a


def test_caption_rate_has_four_significant_digits():
    from batching.charts.export import scenario_caption
    from batching.sim.simulate import Scenario
    from batching.sim.workload.requests import workload_preset

    line = scenario_caption(Scenario(workload=workload_preset("chat", 4.71174, 200, 0)))
    assert "4.71174" not in line and "· 4.712 req/s · 200 requests · seed 0" in line
