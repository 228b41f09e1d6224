"""Latency against load (studies/load_curve.py) and its figure (charts/load.py)."""
from __future__ import annotations

import numpy as np
import pytest

from batching.charts.colors import POLICY_COLORS
from batching.charts.load import latency_vs_load
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset
from batching.studies.load_curve import COLUMNS, HIGH, LOW, POINTS, load_curve, load_grid, slo_targets

POLICIES = {k: PRESETS[k] for k in ("static", "continuous")}


@pytest.fixture(scope="module")
def scenario():
    return Scenario(workload=workload_preset("mixed", 1.0, 300, 0))


@pytest.fixture(scope="module")
def curve(scenario):
    return load_curve(scenario, POLICIES)


def test_grid_spans_the_share_of_capacity():
    g = load_grid(10.0)
    assert len(g) == POINTS
    assert g[0] == pytest.approx(LOW * 10) and g[-1] == pytest.approx(HIGH * 10)
    assert np.all(np.diff(g) > 0)
    assert load_grid(float("nan")).size == 0 and load_grid(0.0).size == 0
    with pytest.raises(ValueError):
        load_grid(5.0, low=0.9, high=0.5)


def test_each_policy_stops_short_of_its_own_capacity(scenario, curve):
    assert list(curve.columns) == list(COLUMNS)
    assert list(dict.fromkeys(curve["policy"])) == list(POLICIES)
    for name, pol in POLICIES.items():
        part = curve[curve["policy"] == name]
        cap = simulate(scenario.with_policy(pol), saturated=True).summary()["throughput_req_s"]
        assert len(part) == POINTS
        assert part["capacity_req_s"].iloc[0] == pytest.approx(cap)
        assert part["rate_req_s"].max() == pytest.approx(HIGH * cap)
        assert np.allclose(part["load"], part["rate_req_s"] / cap)
    # continuous carries ~7x the rate of static on the mixed workload, so its line runs much further right
    assert curve[curve.policy == "continuous"].rate_req_s.max() > 3 * curve[curve.policy == "static"].rate_req_s.max()


def test_latency_rises_towards_capacity(curve):
    cont = curve[curve["policy"] == "continuous"].sort_values("rate_req_s")
    assert cont["ttft_p99_s"].iloc[-1] > cont["ttft_p99_s"].iloc[0]
    assert cont["tpot_p99_s"].iloc[-1] > cont["tpot_p99_s"].iloc[0]


def test_rows_match_single_runs(scenario, curve):
    row = curve[curve["policy"] == "continuous"].iloc[3]
    s = simulate(scenario.with_policy(PRESETS["continuous"]).with_workload(
        scenario.workload.with_rate(row["rate_req_s"]))).summary()
    assert row["ttft_p99_s"] == s["ttft_p99_s"] and row["tpot_p99_s"] == s["tpot_p99_s"]


def test_summarize_is_used_and_threads_give_the_same_frame(scenario, curve):
    calls = []

    def summarize(sc, saturated):
        calls.append(saturated)
        return simulate(sc, saturated=saturated).summary()

    threaded = load_curve(scenario, POLICIES, summarize=summarize, workers=2)
    assert calls.count(True) == len(POLICIES) and calls.count(False) == len(POLICIES) * POINTS
    assert threaded.equals(curve)


def test_slo_targets_come_from_the_workload():
    mixed = slo_targets(Scenario(workload=workload_preset("mixed", 1.0, 10, 0)))
    assert mixed == [{"name": "interactive chat", "ttft_s": 1.0, "tpot_s": 0.1}]
    # a workload whose classes set none is drawn with the default SLOs Capacity and Tune read it with
    # (issue 24 item 12: the chat workload drew no SLO lines on the latency chart)
    assert slo_targets(Scenario(workload=workload_preset("chat", 1.0, 10, 0))) == [
        {"name": "chat, default", "ttft_s": 1.0, "tpot_s": 0.1}]


def test_figure_has_a_line_per_policy_slos_rate_and_capacity_markers(scenario, curve):
    fig = latency_vs_load(curve, slo_targets(scenario), 1.0)
    assert fig.layout.title.text == "Latency against load"
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert sorted({t.name for t in lines}) == sorted(POLICIES)
    assert len(lines) == 2 * len(POLICIES)  # TTFT and TPOT panels
    for t in lines:
        assert t.line.color == POLICY_COLORS[t.name]
        part = curve[curve["policy"] == t.name].sort_values("rate_req_s")
        assert np.allclose(t.y, part["ttft_p99_s" if t.yaxis == "y" else "tpot_p99_s"] * 1e3)  # ms
    caps = [t for t in fig.data if t.name.endswith(" capacity")]
    assert len(caps) == 2 * len(POLICIES)
    for t in caps:
        name = t.name.removesuffix(" capacity")
        assert t.x[0] == pytest.approx(curve[curve.policy == name].capacity_req_s.iloc[0])
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert sorted(s.y0 for s in dashed) == [100.0, 1000.0]  # chat's TPOT 100 ms and TTFT 1 s
    dotted = [s for s in fig.layout.shapes if s.line.dash == "dot"]
    assert len(dotted) == 2 and all(s.x0 == 1.0 for s in dotted)
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"
    # without a rate or SLOs, neither is drawn
    bare = latency_vs_load(curve)
    assert not bare.layout.shapes


def test_empty_curve_draws_a_notice():
    fig = latency_vs_load(load_curve(Scenario(workload=workload_preset("mixed", 1.0, 50, 0)), {}))
    assert not fig.data and "No policy" in fig.layout.annotations[-1].text


# ---------------------------------------------------------------- issue 24 item 12: the figure at document size


@pytest.fixture(scope="module")
def chat_curve():
    """chunked and priority on the single-class chat workload: priority has no lower class, so they run alike."""
    scenario = Scenario(workload=workload_preset("chat", 1.0, 200, 0))
    return scenario, load_curve(scenario, {k: PRESETS[k] for k in ("chunked", "priority")}, points=3)


def test_chat_workload_draws_its_slo_lines(chat_curve):
    scenario, curve = chat_curve
    fig = latency_vs_load(curve, slo_targets(scenario), 1.0)
    dashed = sorted(s.y0 for s in fig.layout.shapes if s.line.dash == "dash")
    assert dashed == [100.0, 1000.0]  # TPOT 100 ms, TTFT 1 s: the default SLOs Capacity and Tune read chat with
    assert {a.text for a in fig.layout.annotations if a.text.startswith("SLO")} == {
        "SLO chat, default: 1,000 ms", "SLO chat, default: 100 ms"}


def test_chunked_is_not_hidden_under_priority_on_one_class(chat_curve):
    _, curve = chat_curve
    fig = latency_vs_load(curve, (), None)
    lines = [t for t in fig.data if t.mode == "lines+markers" and t.yaxis == "y"]
    assert [t.legendgroup for t in lines] == ["chunked", "priority"]
    chunked, priority = lines
    assert np.allclose(chunked.y, priority.y, rtol=1e-3)  # the same run: one would hide the other
    # told apart: a different dash and marker, and the legend says they coincide
    assert (chunked.line.dash, chunked.marker.symbol) != (priority.line.dash, priority.marker.symbol)
    assert priority.line.dash == "dash" and chunked.line.dash == "solid"
    assert priority.name == "priority (same as chunked)" and chunked.name == "chunked"


def test_rate_line_label_reads_three_significant_digits(chat_curve):
    _, curve = chat_curve
    fig = latency_vs_load(curve, (), 4.71174)
    texts = [a.text for a in fig.layout.annotations if a.text.startswith("this rate")]
    assert texts == ["this rate: 4.71 req/s"]


def test_slo_lines_of_one_value_are_drawn_once():
    slos = [{"name": "a", "ttft_s": 1.0, "tpot_s": 0.1}, {"name": "b", "ttft_s": 30.0, "tpot_s": 0.1}]
    curve = __import__("pandas").DataFrame(columns=list(COLUMNS))
    fig = latency_vs_load(curve, slos, None)
    tpot = [a.text for a in fig.layout.annotations if a.text.startswith("SLO") and a.yref == "y2"]
    assert tpot == ["SLO a, b: 100 ms"]  # one line, not two labels written over each other
