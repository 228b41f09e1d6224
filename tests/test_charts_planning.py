"""Figure builders of the planning pages: shared template, titles and axis units, the knee marker where
the knee is, log axes with readable ticks, the frontier's Pareto points, capacity bars and goodput curves."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batching.charts import planning as cp
from batching.charts import policy as charts
from batching.charts.colors import POLICY_COLORS
from batching.charts.policy import TEMPLATE
from batching.studies.capacity import SLO, capacity
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset


def sweep_frame(knob: str = "max_num_seqs", values=(8, 16, 32, 64, 128, 256)) -> pd.DataFrame:
    """A synthetic sweep: capacity saturates at 64, TPOT at capacity keeps rising, preemptions past 64."""
    x = np.asarray(values, float)
    cap = 2000 * np.minimum(x, 64) / 64
    return pd.DataFrame({
        knob: x,
        "steady_output_tok_s": np.minimum(cap, 800.0),
        "capacity_output_tok_s": cap,
        "offered_output_tok_s": np.full(len(x), 850.0),
        "ttft_p50_s": np.where(x < 32, 50.0, 0.08),
        "ttft_p99_s": np.where(x < 32, 120.0, 0.5),
        "tpot_p50_s": np.full(len(x), 0.017),
        "tpot_p99_s": np.full(len(x), 0.029),
        "capacity_tpot_p99_s": 0.01 * np.sqrt(x),
        "gpu_util": np.full(len(x), 0.43),
        "batch_efficiency": np.minimum(1.0, 14 / x),
        "kv_pressure": np.minimum(1.0, x / 128),
        "preemptions": np.where(x > 64, (x - 64) * 3, 0).astype(int),
    })


def _knee_shapes(fig) -> list:
    return [s for s in fig.layout.shapes if s.name == "knee"]


def test_knob_labels_carry_units():
    for knob in cp.KNOB_AXIS:
        assert "(" in cp.knob_axis(knob) and cp.knob_axis(knob).endswith(")")
    assert cp.knob_axis("max_wait_s", log=True) == "Max wait (s, log scale)"
    assert cp.value_text("max_num_seqs", 256.0) == "256"
    assert cp.value_text("kv_cache_tokens", 65536.0) == "64k"
    assert cp.value_text("max_wait_s", 0.0123) == "0.0123"


def test_log_ticks_are_one_two_five_or_decades():
    assert charts.log_ticks([0.015, 0.9]) == pytest.approx([0.02, 0.05, 0.1, 0.2, 0.5])
    wide = charts.log_ticks([0.05, 300.0])
    assert wide == pytest.approx([0.1, 1.0, 10.0, 100.0])  # 1-2-5 would be more than 8 ticks
    assert len(charts.log_ticks([20.0, 35.0])) >= 3  # a narrow range still gets ticks
    assert charts.log_ticks([0.0, float("nan")]) is None


def test_throughput_chart_marks_the_knee():
    df = sweep_frame()
    fig = cp.sweep_throughput(df, "max_num_seqs", knee=64.0, log_x=True, policy="continuous")
    assert fig.layout.template is not None and fig.layout.title.text == "Throughput and capacity vs max_num_seqs"
    assert fig.layout.yaxis.title.text == "Output tokens per second (tok/s)"
    assert fig.layout.xaxis.title.text == "max_num_seqs (sequences per step, log scale)"
    assert fig.layout.xaxis.type == "log"
    assert list(fig.layout.xaxis.tickvals) == [8, 16, 32, 64, 128, 256]  # ticks at the swept values
    names = [t.name for t in fig.data]
    assert names == ["Throughput at this load", "Capacity", "Offered load"]
    assert list(fig.data[1].y) == pytest.approx(list(df["capacity_output_tok_s"]))
    shapes = _knee_shapes(fig)
    assert len(shapes) == 1 and shapes[0].x0 == shapes[0].x1 == 64.0 and shapes[0].yref == "y domain"
    notes = [a for a in fig.layout.annotations if a.name == "knee"]
    assert len(notes) == 1 and notes[0].text == "knee: 64"
    assert notes[0].x == pytest.approx(math.log10(64))  # annotations on a log axis take log10
    # on a linear axis the annotation sits at the value itself; no knee, no marker
    lin = cp.sweep_throughput(df, "max_num_seqs", knee=64.0, log_x=False)
    assert [a.x for a in lin.layout.annotations if a.name == "knee"] == [64.0]
    assert not _knee_shapes(cp.sweep_throughput(df, "max_num_seqs", knee=None))


def test_latency_chart_units_and_knee_in_both_panels():
    df = sweep_frame()
    fig = cp.sweep_latency(df, "max_num_seqs", knee=64.0, log_x=True)
    assert fig.layout.yaxis.title.text == "TTFT (s, log scale)" and fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis2.title.text == "TPOT (ms, log scale)" and fig.layout.yaxis2.type == "log"
    tpot = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in tpot] == ["P50", "P99", "P99 at capacity"]
    assert list(tpot[1].y) == pytest.approx([29.0] * 6)  # seconds -> ms
    assert {s.xref for s in _knee_shapes(fig)} == {"x", "x2"}
    assert len([a for a in fig.layout.annotations if a.name == "knee"]) == 1


def test_utilisation_chart_shares_in_percent_and_whole_preemptions():
    df = sweep_frame()
    fig = cp.sweep_utilisation(df, "max_num_seqs", knee=None, log_x=False)
    by = {t.name: t for t in fig.data}
    assert list(by["Batch efficiency"].y)[0] == pytest.approx(100.0)
    assert list(by["Peak KV cache use"].y)[-1] == pytest.approx(100.0)
    assert list(by["Preemptions"].y) == list(df["preemptions"])
    assert fig.layout.yaxis.title.text == "Share (%)"
    assert fig.layout.yaxis2.title.text == "Preemptions (count)" and fig.layout.yaxis2.tickformat == ",d"
    # no preemptions at all: the count axis still reads 0 to 5 in whole numbers
    flat = cp.sweep_utilisation(df.assign(preemptions=0), "max_num_seqs")
    assert tuple(flat.layout.yaxis2.range) == (0, 5.0)


def test_pareto_front():
    lat = [1.0, 2.0, 3.0, 2.5, 0.5, 4.0]
    thr = [10.0, 20.0, 30.0, 15.0, 5.0, 29.0]
    # 3 (2.5, 15) is beaten by 1 (2.0, 20); 5 (4.0, 29) by 2 (3.0, 30)
    assert cp.pareto_front(lat, thr).tolist() == [4, 0, 1, 2]
    assert cp.pareto_front([np.nan, 1.0], [5.0, 1.0]).tolist() == [1]


def test_frontier_across_policies():
    a = sweep_frame()
    b = sweep_frame().assign(capacity_output_tok_s=lambda d: d["capacity_output_tok_s"] * 1.1)
    fig = cp.sweep_frontier({"continuous*": a, "chunked": b}, "max_num_seqs", "tpot_cap",
                            knees={"continuous*": 64.0, "chunked": None})
    assert fig.layout.title.text == "Frontier: capacity vs P99 TPOT at capacity"
    assert fig.layout.xaxis.title.text == "P99 TPOT at capacity (ms, log scale)" and fig.layout.xaxis.type == "log"
    assert fig.layout.yaxis.title.text == "Capacity (output tok/s)"
    lines = {t.name: t for t in fig.data}
    assert list(lines["continuous*"].text) == ["8", "16", "32", "64", "128", "256"]  # labelled by value
    assert "text" not in lines["chunked"].mode  # only the chosen policy carries labels
    assert list(lines["continuous*"].x) == pytest.approx(list(a["capacity_tpot_p99_s"] * 1e3))
    star = lines["continuous* knee"]
    assert star.marker.symbol == "star" and star.y[0] == pytest.approx(2000.0)
    # the dashed front holds chunked's points (10 % more capacity at the same latency) where they differ
    front = lines["Best trade-offs"]
    assert max(front.y) == pytest.approx(2200.0)
    # for the request rate the frontier plots throughput at the offered load against TTFT
    rate = cp.sweep_frontier({"x": sweep_frame("rate_req_s", (1, 2, 4))}, "rate_req_s", "ttft")
    assert rate.layout.yaxis.title.text == "Throughput at the offered load (output tok/s)"
    assert rate.layout.xaxis.title.text == "P99 TTFT at the offered load (s, log scale)"


def test_empty_inputs_say_so():
    empty = sweep_frame().iloc[0:0]
    for fig in (cp.sweep_throughput(empty, "max_num_seqs"), cp.sweep_latency(empty, "max_num_seqs"),
                cp.sweep_utilisation(empty, "max_num_seqs"), cp.sweep_frontier({"a": empty}, "max_num_seqs"),
                cp.capacity_bars({}), cp.goodput_curves({}, {}, 0.99)):
        assert any(a.text == "No data to show" for a in fig.layout.annotations), fig.layout.title.text


@pytest.fixture(scope="module")
def capacities():
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 1))
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    return {name: capacity(sc, slo, policy=PRESETS[name], target_rate_req_s=20.0, gpu_hour_usd=2.5)
            for name in ("static", "chunked")}


def test_capacity_bars(capacities):
    plans = {n: r.to_dict() for n, r in capacities.items()}
    fig = cp.capacity_bars(plans, 20.0, 2.5)
    assert fig.layout.title.text == "Capacity per policy within the SLOs"
    assert [a.text for a in fig.layout.annotations][:3] == [
        "Sustainable rate per node", "Nodes for 20 req/s", "$ per M output tok. at 20 req/s"]
    assert fig.layout.title.subtitle.text.endswith("cost at $2.5 per GPU-hour")
    rate, nodes, usd = fig.data
    assert list(rate.x) == ["static", "chunked"]
    assert rate.y[1] == pytest.approx(capacities["chunked"].max_rate_req_s)
    assert nodes.y[1] == capacities["chunked"].nodes_needed
    assert usd.y[1] == pytest.approx(capacities["chunked"].usd_per_million_output_tokens)
    assert usd.text[1].startswith("$")
    # static meets no rate: a zero rate, no nodes, no cost (missing bars, "n/a" labels)
    assert capacities["static"].max_rate_req_s == 0.0
    assert nodes.y[0] is None and usd.text[0] == "n/a"
    # short axis titles: a rotated one longer than the panel is tall ran into the subtitle
    assert fig.layout.yaxis.title.text == "Rate per node (req/s)"
    assert fig.layout.yaxis2.title.text == "Nodes (count)"
    assert fig.layout.yaxis3.title.text == "$ per M output tokens ($)"
    # one colour per policy (charts.colors), whatever its place
    assert list(rate.marker.color) == [POLICY_COLORS["static"], POLICY_COLORS["chunked"]]
    # the Capacity page passes the results themselves (studies.planning.CapacityPlan.results): the same figure
    typed = cp.capacity_bars(capacities, 20.0, 2.5)
    for a, b in zip(typed.data, fig.data):
        assert list(a.x) == list(b.x) and list(a.text) == list(b.text)
        assert [None if v is None else pytest.approx(v) for v in a.y] == list(b.y)


def test_goodput_curves(capacities):
    points = {n: r.points for n, r in capacities.items()}
    rates = {n: r.max_rate_req_s for n, r in capacities.items()}
    fig = cp.goodput_curves(points, rates, 0.99)
    assert fig.layout.title.text == "Goodput and SLO attainment vs request rate"
    assert fig.layout.yaxis.title.text == "Goodput (req/s)"
    assert fig.layout.yaxis2.title.text == "Worst class within (%)"
    assert fig.layout.xaxis2.title.text == "Request rate offered to one node (req/s)"
    assert not fig.layout.xaxis.title.text and fig.layout.xaxis.showticklabels  # nothing between the panels
    assert {t.line.color for t in fig.data if t.name == "chunked"} == {POLICY_COLORS["chunked"]}
    chunked = [t for t in fig.data if t.name == "chunked"]
    assert len(chunked) == 2  # goodput and attainment
    assert list(chunked[0].x) == pytest.approx(sorted(points["chunked"]["rate_req_s"]))
    assert max(chunked[1].y) <= 100.0
    # the bottom panel is what the search holds to the target: the worst class's share (issue 24 item 4)
    by_rate = points["chunked"].sort_values("rate_req_s")
    assert list(chunked[1].y) == pytest.approx(list(by_rate["class_attainment"] * 100))
    # the sustainable rate of chunked is drawn in both panels, the target once; static has none (rate 0)
    limits = [s for s in fig.layout.shapes if s.name == "chunked max rate"]
    assert len(limits) == 2 and limits[0].x0 == pytest.approx(rates["chunked"])
    assert not [s for s in fig.layout.shapes if s.name == "static max rate"]
    target = [s for s in fig.layout.shapes if s.name == "attainment target"]
    assert len(target) == 1 and target[0].y0 == pytest.approx(99.0)


def test_capacity_bars_print_the_headroom_and_the_slos(capacities):
    """Issue 24 item 2: the nodes and the $ depend on the headroom and the SLOs, so the figure says both (class
    names as typed, never markup)."""
    slo_text = "TTFT ≤ 1,000 ms for <b>chat</b>; TPOT ≤ 100 ms for 99 % of each class's requests"
    fig = cp.capacity_bars(capacities, 40.0, 2.5, headroom=1.25, slo_text=slo_text)
    sub = fig.layout.title.subtitle.text
    assert "Nodes and $ with 1.25× headroom" in sub and "1/1.25 of the rate per node" in sub
    assert "SLOs, every class at its own: TTFT ≤ 1,000 ms for &lt;b&gt;chat&lt;/b&gt;" in sub and "<b>" not in sub
    assert [a.text for a in fig.layout.annotations][1] == "Nodes for 40 req/s"
    assert fig.layout.margin.t > cp.capacity_bars(capacities, 40.0, 2.5).layout.margin.t  # room for the lines


def test_every_figure_uses_the_shared_template(capacities):
    df = sweep_frame()
    figs = [cp.sweep_throughput(df, "max_num_seqs"), cp.sweep_latency(df, "max_num_seqs"),
            cp.sweep_utilisation(df, "max_num_seqs"), cp.sweep_frontier({"a": df}, "max_num_seqs"),
            cp.capacity_bars({n: r.to_dict() for n, r in capacities.items()}),
            cp.goodput_curves({n: r.points for n, r in capacities.items()}, {}, 0.99)]
    import plotly.io as pio

    shared = pio.templates[TEMPLATE].layout.font.family
    for fig in figs:
        assert fig.layout.template.layout.font.family == shared
        assert fig.layout.title.text
        for axis in ("xaxis", "yaxis"):
            matches = fig.layout[axis].matches  # panels sharing an x axis: its title once, under the bottom one
            named = fig.layout[matches.replace("x", "xaxis")] if matches else fig.layout[axis]
            assert named.title.text, (fig.layout.title.text, axis)
