"""Figure builders: titles, axis titles with units, trace types, the shared template; one colour per policy on
every builder and page; clean log-axis labels; the ITL histogram's log count axis, the timeline's opening window,
decode tokens in their own panel; room for titles (no axis title longer than its panel)."""
from __future__ import annotations

import math
import re
import zlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from batching.charts import colors as chart_colors
from batching.charts import costmodel as ccm
from batching.charts import planning as cp
from batching.charts import policy as charts
from batching.charts.colors import EXTRA_COLORS, POLICY_COLORS
from batching.sim.hardware import costmodel as cm
from batching.studies.compare import Comparison
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import deployment
from batching.sim.workload.requests import workload_preset

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import chart_specs  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    sc = Scenario(deployment=deployment(), workload=workload_preset("mixed", 3.0, 150, 1))
    return {name: simulate(sc.with_policy(PRESETS[name])) for name in ("dynamic", "continuous")}


@pytest.fixture(scope="module")
def summaries(runs):
    sat = {k: simulate(r.scenario, saturated=True) for k, r in runs.items()}
    return Comparison(runs, sat).summaries()


def _axis_titles(fig: go.Figure) -> list[str]:
    layout = fig.to_plotly_json()["layout"]
    return [v["title"]["text"] for k, v in layout.items()
            if re.fullmatch(r"[xy]axis\d*", k) and isinstance(v, dict) and v.get("title", {}).get("text")]


def _has_unit(title: str) -> bool:
    """A unit in brackets, a count per something ("Requests per bin"), or the categorical policy axis."""
    return bool(re.search(r"\([^)]+\)", title)) or " per " in title or title == "Policy"


def _check(fig: go.Figure, types: set[str], n_axes_with_units: int = 2) -> None:
    go.Figure(fig.to_plotly_json())  # valid for Plotly: the builders skip validation for speed
    assert fig.layout.template.layout.font.family == pio.templates[charts.TEMPLATE].layout.font.family
    assert fig.layout.title.text, "every chart has a title"
    titles = _axis_titles(fig)
    assert len(titles) >= n_axes_with_units, titles
    assert all(_has_unit(t) for t in titles), titles
    assert any(re.search(r"\((s|ms|%|output tok/s|s, log scale|ms, log scale)\)", t) for t in titles), titles
    assert {t.type for t in fig.data} >= types, {t.type for t in fig.data}
    assert len(fig.data) > 0


def test_template_registered_once():
    assert charts.TEMPLATE in pio.templates
    before = pio.templates[charts.TEMPLATE]
    charts.register_template()
    assert pio.templates[charts.TEMPLATE] is before


def test_showdown_bars(summaries):
    fig = charts.showdown_bars(summaries)
    _check(fig, {"bar"}, 3)
    titles = _axis_titles(fig)
    assert "Throughput (tok/s)" in titles and "TTFT (s)" in titles and "TPOT (ms)" in titles
    capacity = [t for t in fig.data if t.name == "Capacity"][0]
    assert list(capacity.x) == list(summaries)
    assert capacity.y[1] == pytest.approx(summaries["continuous"]["capacity_output_tok_s"])
    tpot = [t for t in fig.data if t.name == "P99" and t.xaxis == "x3"][0]
    for i, name in enumerate(summaries):  # an overloaded policy's latency is not plotted: "unbounded" (issue 24)
        if summaries[name]["overloaded"]:
            assert np.isnan(tpot.y[i])
        else:
            assert tpot.y[i] == pytest.approx(summaries[name]["tpot_p99_s"] * 1e3)
    # every bar in its policy's colour: solid for capacity and P99, the same colour light for the others
    assert list(capacity.marker.color) == [POLICY_COLORS["dynamic"], POLICY_COLORS["continuous"]]
    at_load = [t for t in fig.data if t.name == "At this load"][0]
    assert list(at_load.marker.line.color) == list(capacity.marker.color)
    assert all(c.startswith("rgba(") and c.endswith(",0.35)") for c in at_load.marker.color)
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis3.type == "log"


def test_class_bars(summaries):
    fig = charts.class_ttft_bars(summaries)
    _check(fig, {"bar"})
    assert len(fig.data) == 2  # two classes in the mixed workload
    assert fig.data[0].y[1] == pytest.approx(summaries["continuous"]["by_priority"]["0"]["ttft_p99_s"])
    assert np.isnan(fig.data[0].y[0]) == bool(summaries["dynamic"]["overloaded"])  # unbounded: not plotted


def test_request_timeline_segments(runs):
    res = runs["dynamic"]
    fig = charts.request_timeline(res.requests, res.class_names)
    _check(fig, {"scatter"})  # 150 requests: a few thousand points, SVG
    assert "Simulated time (s)" == fig.layout.xaxis.title.text
    # the decode segments of class 0 start at first_token_s and end at finish_s
    dec = [t for t in fig.data if t.name.endswith("· decode")][0]
    x = np.asarray(dec.x, float)
    req0 = res.requests[res.requests["priority"] == 0].sort_values("arrival_s")
    assert x[0] == pytest.approx(req0["first_token_s"].iloc[0])
    assert x[1] == pytest.approx(req0["finish_s"].iloc[0])
    assert np.isnan(x[2])
    # static-style batches hold finished requests until release
    assert any("held" in t.name for t in fig.data)


def test_request_timeline_opens_on_the_first_hundred_requests(runs):
    """150 requests: every one is drawn, the initial ranges show the first 100 (rows and their time span), so the
    whole run is one double-click (autorange) away."""
    res = runs["continuous"]
    req = res.requests.sort_values("arrival_s", kind="stable")
    fig = charts.request_timeline(res.requests, res.class_names)
    rows = set()
    for t in fig.data:
        rows |= {int(v) for v in np.asarray(t.y, float) if np.isfinite(v)}
    assert rows == set(req["request_id"])  # the data keep every request
    first = req.iloc[:charts.TIMELINE_WINDOW]
    assert tuple(fig.layout.yaxis.range) == pytest.approx((first["request_id"].iloc[0] - 0.5,
                                                           first["request_id"].iloc[-1] + 0.5))
    x0, x1 = fig.layout.xaxis.range
    assert x0 <= first["arrival_s"].min() and x1 >= first["release_s"].max()
    assert x1 < req["release_s"].max()  # narrower than the run: later requests are a zoom-out away
    assert "first 100 of 150" in fig.layout.title.subtitle.text and "double-click" in fig.layout.title.subtitle.text
    # a run that fits the window opens on all of it
    small = charts.request_timeline(req.iloc[:40], res.class_names)
    assert small.layout.xaxis.range is None and small.layout.yaxis.range is None


def test_request_timeline_samples_big_runs(runs):
    req = runs["continuous"].requests
    big = req.loc[req.index.repeat(40)].reset_index(drop=True)
    big["request_id"] = np.arange(len(big))
    sample, note = charts.timeline_sample(big, 1000)
    assert len(sample) <= 1000 and note and f"of {len(big):,}" in note
    fig = charts.request_timeline(big, runs["continuous"].class_names, max_rows=1000)
    assert f"1,000 of {len(big):,} drawn" in fig.layout.title.subtitle.text
    rows = sum(np.isfinite(np.asarray(t.y, float)).sum() for t in fig.data if t.name.endswith("· decode")) / 2
    assert rows <= 1000


def _big_requests(runs, n: int) -> pd.DataFrame:
    """``n`` requests: the continuous run's 150 repeated back to back in time (each copy after the last)."""
    req = runs["continuous"].requests.sort_values("arrival_s", kind="stable")
    span = float(req["release_s"].max()) + 1.0
    copies = math.ceil(n / len(req))
    parts = []
    for i in range(copies):
        part = req.copy()
        for c in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "release_s"):
            part[c] = part[c] + i * span
        parts.append(part)
    big = pd.concat(parts, ignore_index=True).iloc[:n].copy()
    big["request_id"] = np.arange(len(big))
    return big


def _points(fig: go.Figure) -> int:
    return sum(len(t.x) for t in fig.data)


def test_request_timeline_within_a_point_budget_at_20000_requests(runs):
    """The dashboard's timeline: at most TIMELINE_POINT_BUDGET points at 20,000 requests, the first 100 requests
    (the view it opens on) drawn in full, every k-th of the rest, SVG; a note says what is drawn."""
    big = _big_requests(runs, 20_000)
    names = runs["continuous"].class_names
    budget = charts.TIMELINE_POINT_BUDGET
    fig = charts.request_timeline(big, names, max_points=budget)
    assert _points(fig) <= budget
    assert {t.type for t in fig.data} == {"scatter"}  # under SVG_MAX_POINTS: SVG, not software WebGL
    rows = set()
    for t in fig.data:
        rows |= {int(v) for v in np.asarray(t.y, float) if np.isfinite(v)}
    assert set(range(charts.TIMELINE_WINDOW)) <= rows  # the first window in full
    df, note = charts.timeline_rows(big, max_points=budget)
    assert rows == set(df["request_id"]) and 500 < len(df) < 20_000
    assert note and "first 100 requests in full" in note and "of 20,000 requests" in note and "CSV" in note
    assert "then a sample" in fig.layout.title.subtitle.text and "double-click" in fig.layout.title.subtitle.text
    # the opening view is the same as without a budget: the first 100 rows and their time span
    full = charts.request_timeline(big.iloc[:1000], names)  # every request drawn
    assert fig.layout.xaxis.range == full.layout.xaxis.range and fig.layout.yaxis.range == full.layout.yaxis.range
    # a run within the budget is drawn whole, with no note
    small = runs["continuous"].requests
    assert charts.timeline_rows(small, max_points=budget)[1] is None
    assert _points(charts.request_timeline(small, names, max_points=budget)) == \
        _points(charts.request_timeline(small, names))


def test_line_trace_type_by_point_count(runs):
    """SVG up to SVG_MAX_POINTS points, WebGL above: the exports' full timeline of 2,000 requests is WebGL, the
    page's budgeted one SVG; coordinates go out as float32 typed arrays."""
    assert charts.line_trace(charts.SVG_MAX_POINTS) is go.Scatter
    assert charts.line_trace(charts.SVG_MAX_POINTS + 1) is go.Scattergl
    big = _big_requests(runs, 2000)
    names = runs["continuous"].class_names
    full = charts.request_timeline(big, names)
    assert _points(full) > charts.SVG_MAX_POINTS and {t.type for t in full.data} == {"scattergl"}
    live = charts.request_timeline(big, names, max_points=charts.TIMELINE_POINT_BUDGET)
    assert {t.type for t in live.data} == {"scatter"}
    spec = live.to_plotly_json()
    assert all(t["x"]["dtype"] == t["y"]["dtype"] == "f4" for t in spec["data"])  # base64 float32 arrays
    assert '"dtype":"f4"' in pio.to_json(live, validate=False).replace(" ", "")
    # float32 is far finer than a pixel: the segments' ends within 0.1 ms of the data
    dec = [t for t in live.data if t.name.endswith("· decode")][0]
    first = big[big["priority"] == 0].sort_values("arrival_s")["first_token_s"].iloc[0]
    assert abs(float(dec.x[0]) - first) < 1e-4


@pytest.mark.parametrize("policy", ["dynamic", "continuous"])
def test_batch_composition_shows_decode_on_its_own_scale(runs, policy):
    """Prefill (with padding stacked on it) on top and decode below, each panel on its own y axis: decode tokens
    per step fill their panel instead of a sliver under the prefill spikes."""
    res = runs[policy]
    fig = charts.batch_composition(res.steps)
    _check(fig, {"scatter"})  # filled step areas: one SVG path per series, not one element per bar
    by = {t.name: t for t in fig.data}
    assert by["prefill tokens"].stackgroup == by["padded slots"].stackgroup != by["decode tokens"].stackgroup
    assert all(t.line.shape == "hv" for t in fig.data)
    assert list(by) == ["prefill tokens", "padded slots", "decode tokens"]
    assert by["prefill tokens"].yaxis == by["padded slots"].yaxis == "y"
    assert by["decode tokens"].yaxis == "y2" and by["decode tokens"].xaxis == "x2"
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # one time axis
    assert fig.layout.yaxis.title.text == fig.layout.yaxis2.title.text == "Tokens per step"
    assert fig.layout.xaxis2.title.text == "Simulated time (s)"
    decode = np.asarray(by["decode tokens"].y, float)
    prefill = np.asarray(by["prefill tokens"].y, float)
    assert decode.max() > 0 and prefill.max() > 10 * decode.max()  # what one shared axis hid
    # one bar per step when the run is short: the panel holds the steps' own decode tokens
    few = res.steps.iloc[:400]
    raw = {t.name: t for t in charts.batch_composition(few).data}
    assert np.asarray(raw["decode tokens"].y, float).sum() == few["decode_tokens"].sum()
    assert np.asarray(raw["padded slots"].y, float).sum() == few["padded_tokens"].sum()
    # each step's value holds from its start to its end, 0 in idle gaps between steps
    s = few.sort_values("start_s", kind="stable")
    x, y = np.asarray(raw["decode tokens"].x, float), np.asarray(raw["decode tokens"].y, float)
    at = np.searchsorted(x, s["start_s"].to_numpy(np.float32).astype(float))
    assert np.allclose(y[at], s["decode_tokens"].to_numpy())
    assert y[-1] == 0 and x[-1] == pytest.approx((s["start_s"] + s["duration_s"]).max(), rel=1e-6)


def test_time_average_is_exact():
    import pandas as pd

    steps = pd.DataFrame({"replica": [0, 0], "start_s": [0.0, 2.0], "duration_s": [1.0, 2.0],
                          "tokens": [10.0, 4.0]})
    edges = np.array([0.0, 2.0, 4.0])
    out = charts.time_average(steps, ["tokens"], edges)["tokens"]
    # bin 1: 10 tokens for 1 s of 2 s; bin 2: 4 tokens the whole time
    assert out == pytest.approx([5.0, 4.0])


def test_kv_and_queue(runs):
    res = runs["continuous"]
    fig = charts.kv_and_queue(res.steps, res.scenario.deployment.kv_capacity_tokens)
    _check(fig, {"scatter"})
    assert fig.layout.yaxis.title.text == "KV used (%)"
    kv = np.asarray(fig.data[0].y, float)
    assert 0 < kv.max() <= 100
    names = {t.name for t in fig.data}
    assert {"KV cache used", "waiting (queue)", "running"} <= names


def _kv_steps(cached: list[int], kv: list[int], replicas: int = 1) -> pd.DataFrame:
    n = len(kv)
    rows = []
    for r in range(replicas):
        rows.append(pd.DataFrame({"replica": r, "step": np.arange(n), "start_s": np.arange(n, dtype=float) * 2.0,
                                  "duration_s": 1.5, "kv_blocks": kv, "cached_blocks": cached, "waiting": 0,
                                  "running": 1, "swapped": 0, "prefill_tokens": 0, "decode_tokens": 1,
                                  "padded_tokens": 0}))
    return pd.concat(rows, ignore_index=True)


def test_kv_chart_draws_the_prefix_cache_as_its_own_trace():
    """Blocks held only by the prefix cache are a trace of their own, stacked on the blocks running sequences hold:
    each is its blocks' tokens in % of the capacity, and the two add up to the whole cache's occupancy."""
    cap = 16 * 100  # 100 blocks
    kv, cached = [10, 30, 20, 0, 50], [0, 5, 40, 70, 50]
    fig = charts.kv_and_queue(_kv_steps(cached, kv), cap)
    _check(fig, {"scatter"})
    traces = {t.name: t for t in fig.data}
    assert charts.KV_CACHED_NAME in traces
    used, held = traces["KV cache used"], traces[charts.KV_CACHED_NAME]
    assert used.stackgroup == held.stackgroup == "kv" and held.yaxis == "y"
    np.testing.assert_allclose(np.asarray(held.y, float), cached, rtol=1e-6)  # 16-token blocks of 1,600: 1 % each
    total = np.asarray(used.y, float) + np.asarray(held.y, float)
    np.testing.assert_allclose(total, np.add(kv, cached), rtol=1e-6)
    assert total.max() <= 100
    assert fig.layout.yaxis.title.text == "KV used (%)"
    assert "prefix cache" in fig.layout.annotations[0].text
    # binned (many steps, two replicas): time-weighted means, the same sums
    n = 3000
    rng = np.random.default_rng(0)
    kv2, cached2 = rng.integers(0, 50, n), rng.integers(0, 50, n)
    steps = _kv_steps(list(cached2), list(kv2), replicas=2)
    fig = charts.kv_and_queue(steps, cap, bins=60)
    traces = {t.name: t for t in fig.data}
    edges = np.linspace(0.0, float((steps.start_s + steps.duration_s).max()), 61)
    means = charts.time_average(steps, ["kv_blocks", "cached_blocks"], edges)
    np.testing.assert_allclose(np.asarray(traces[charts.KV_CACHED_NAME].y, float), means["cached_blocks"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(traces["KV cache used"].y, float) + np.asarray(
        traces[charts.KV_CACHED_NAME].y, float), means["kv_blocks"] + means["cached_blocks"], rtol=1e-5)


def test_kv_chart_without_a_prefix_cache_is_unchanged():
    """No cached blocks (caching off, static/dynamic, or an engine without the column): no extra trace, one fill."""
    for steps in (_kv_steps([0, 0, 0], [10, 20, 5]), _kv_steps([0, 0, 0], [10, 20, 5]).drop(columns="cached_blocks")):
        fig = charts.kv_and_queue(steps, 1600)
        assert charts.KV_CACHED_NAME not in {t.name for t in fig.data}
        assert fig.data[0].fill == "tozeroy" and fig.data[0].stackgroup is None
        assert fig.layout.annotations[0].text.startswith("KV cache in use (capacity")


def test_kv_chart_of_a_run_with_a_shared_prompt():
    sc = Scenario(deployment=deployment(), workload=workload_preset("sharegpt", 3.0, 120, 1).with_shared_prefix(1024))
    res = simulate(sc.with_policy(PRESETS["chunked"]))
    assert res.steps["cached_blocks"].max() > 0
    cap = res.scenario.deployment.kv_capacity_tokens
    fig = charts.kv_and_queue(res.steps, cap)
    traces = {t.name: t for t in fig.data}
    total = np.asarray(traces["KV cache used"].y, float) + np.asarray(traces[charts.KV_CACHED_NAME].y, float)
    assert total.max() <= 100 + 1e-6  # running and cached blocks together never exceed the cache


@pytest.mark.parametrize("metric,unit", [("ttft", "s"), ("tpot", "ms"), ("e2e", "s")])
def test_latency_histograms(runs, metric, unit):
    res = runs["continuous"]
    fig = charts.latency_histogram(res.requests, metric, res.class_names)
    _check(fig, {"scatter"}, 2)
    assert fig.layout.xaxis.title.text.endswith(f"({unit}, log scale)")
    assert fig.layout.xaxis.type == "log"
    # a P50 and a P99 line per class, at the class's percentile
    p99 = [t for t in fig.data if t.name == "interactive chat P99"][0]
    values = res.requests.loc[res.requests["priority"] == 0, f"{metric}_s"].dropna()
    factor = 1e3 if unit == "ms" else 1.0
    assert p99.x[0] == pytest.approx(np.percentile(values, 99) * factor)


def test_itl_histogram(runs):
    res = runs["continuous"]
    fig = charts.itl_histogram(res.itl_hist, res.itl_edges, res.class_names)
    _check(fig, {"scatter"})
    assert "ms" in fig.layout.xaxis.title.text
    assert sum(np.nansum(np.asarray(t.y, float)) for t in fig.data if not t.name.endswith(("P50", "P99"))) > 0


def test_itl_histogram_counts_on_a_log_axis(runs):
    """A log count axis: a bin of 3 gaps sits a third of the way up to one of 1,000, not on the floor; empty bins
    sit at the axis' bottom (no zero on a log axis), and the outlines are closed shapes filled inside."""
    res = runs["continuous"]
    fig = charts.itl_histogram(res.itl_hist, res.itl_edges, res.class_names)
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis.type == "log"
    assert fig.layout.yaxis.title.text == "Gaps per bin (log scale)"
    lo, hi = fig.layout.yaxis.range
    assert lo == pytest.approx(math.log10(charts.ITL_FLOOR)) and 10 ** hi > res.itl_hist.max()
    outlines = [t for t in fig.data if not t.name.endswith(("P50", "P99"))]
    for t in outlines:
        y = np.asarray(t.y, float)
        assert t.fill == "toself" and y.min() == charts.ITL_FLOOR and y[0] == y[-1] == charts.ITL_FLOOR
    assert list(fig.layout.yaxis.tickvals)[:3] == [1.0, 10.0, 100.0]  # decades
    # the counts themselves are unchanged: the tallest step is the fullest bin
    assert max(np.asarray(t.y, float).max() for t in outlines) == res.itl_hist.max()


def test_compare_cdf_and_histogram(runs):
    values = {k: r.requests["ttft_s"].to_numpy() for k, r in runs.items()}
    cdf = charts.latency_cdf(values, "ttft")
    _check(cdf, {"scatter"})
    assert cdf.layout.yaxis.title.text == "Requests at or below (%)"
    y = np.asarray(cdf.data[0].y, float)
    assert y[0] == pytest.approx(0) and y[-1] == pytest.approx(100) and np.all(np.diff(y) >= 0)
    hist = charts.latency_hist_overlay(values, "tpot")
    _check(hist, {"scatter"})
    assert hist.layout.xaxis.title.text == "TPOT (ms, log scale)"


# ---------------------------------------------------------------- one colour per policy


def test_policy_colour_by_name():
    for name in ("continuous", "continuous*", "B · continuous", "D · continuous*", "continuous knee"):
        assert chart_colors.policy_color(name) == POLICY_COLORS["continuous"], name
    assert len(set(POLICY_COLORS.values())) == len(POLICY_COLORS)  # five presets, five colours
    # a custom name: one of the extra colours (none a preset's), picked by a CRC of the name, so stable
    custom = chart_colors.policy_color("my-vllm-config")
    assert custom == EXTRA_COLORS[zlib.crc32(b"my-vllm-config") % len(EXTRA_COLORS)]
    assert custom not in POLICY_COLORS.values() and chart_colors.policy_color("A · my-vllm-config*") == custom
    # two series of the same preset in one figure: the second a darker shade of the same colour
    both = chart_colors.policy_colors(["A · continuous", "B · continuous*", "C · chunked"])
    assert both["A · continuous"] == POLICY_COLORS["continuous"] and both["C · chunked"] == POLICY_COLORS["chunked"]
    assert both["B · continuous*"] == chart_colors.shade(POLICY_COLORS["continuous"], -0.35) != both["A · continuous"]
    assert chart_colors.shade("#4C78A8", -1.0) == "#000000" and chart_colors.shade("#4C78A8", 1.0) == "#FFFFFF"


def _trace_colour(trace) -> str:
    if trace.type == "bar":
        return trace.marker.color
    return trace.line.color


def _colour_of(fig, name: str) -> set[str]:
    """The colours a figure draws a policy's series in (bars: the bar of that policy)."""
    found = set()
    for t in fig.data:
        if t.type == "bar" and t.x is not None and name in list(t.x) and isinstance(t.marker.color, tuple):
            # a light bar's fill is the colour made translucent; its outline is the colour itself
            colours = t.marker.line.color if isinstance(t.marker.line.color, tuple) else t.marker.color
            found.add(colours[list(t.x).index(name)])
        elif t.name == name:
            found.add(_trace_colour(t))
    return found


def test_same_policy_same_colour_in_every_builder(runs, summaries):
    """continuous and dynamic get their colours on the home bars, Compare's CDF and histogram (slot names),
    Tune's frontier and Capacity's bars and curves, whatever their order or slot."""
    values = {"A · continuous": runs["continuous"].requests["ttft_s"].to_numpy(),
              "B · dynamic": runs["dynamic"].requests["ttft_s"].to_numpy()}
    swapped = dict(reversed(list(values.items())))
    sweep = pd.DataFrame({"max_num_seqs": [8.0, 64.0], "capacity_output_tok_s": [500.0, 900.0],
                          "capacity_tpot_p99_s": [0.02, 0.05]})
    plans = {"dynamic": {"max_rate_req_s": 1.0, "nodes_needed": 9, "usd_per_million_output_tokens": 5.0},
             "continuous": {"max_rate_req_s": 3.0, "nodes_needed": 3, "usd_per_million_output_tokens": 2.0}}
    points = {n: pd.DataFrame({"rate_req_s": [0.5, 1.0], "goodput_req_s": [0.5, 0.9], "attainment": [1.0, 0.9]})
              for n in ("dynamic", "continuous")}
    figures = {
        "showdown": (charts.showdown_bars(summaries), "continuous", "dynamic"),
        "cdf": (charts.latency_cdf(values, "ttft"), "A · continuous", "B · dynamic"),
        "cdf swapped": (charts.latency_cdf(swapped, "ttft"), "A · continuous", "B · dynamic"),
        "hist": (charts.latency_hist_overlay(values, "ttft"), "A · continuous", "B · dynamic"),
        "frontier": (cp.sweep_frontier({"continuous*": sweep, "dynamic": sweep}, "max_num_seqs"), "continuous*",
                     "dynamic"),
        "capacity": (cp.capacity_bars(plans, 20.0, 2.5), "continuous", "dynamic"),
        "goodput": (cp.goodput_curves(points, {"dynamic": 1.0, "continuous": 3.0}, 0.99), "continuous", "dynamic"),
    }
    for what, (fig, cont, dyn) in figures.items():
        assert _colour_of(fig, cont) == {POLICY_COLORS["continuous"]}, what
        assert _colour_of(fig, dyn) == {POLICY_COLORS["dynamic"]}, what


def test_pages_colour_policies_alike():
    """The dashboard's Compare (policies in slots B and C) and Capacity (in preset order) pages draw continuous and
    chunked in the same colours as each other and as the home page."""
    import json

    from streamlit.testing.v1 import AppTest

    root = Path(__file__).resolve().parents[1]

    def run_page(page: str, **query: str) -> AppTest:
        at = AppTest.from_file(str(root / "app.py"), default_timeout=180)
        for k, v in {"n": "200", **query}.items():
            at.query_params[k] = v
        if page != "app.py":
            at.switch_page(page)
        at.run()
        assert not at.exception and not at.error, (page, [e.value for e in [*at.exception, *at.error]])
        return at

    def colours(at, title_start: str) -> dict[str, str]:
        out = {}
        for spec in chart_specs(at):
            if not spec["layout"]["title"]["text"].startswith(title_start):
                continue
            for t in spec["data"]:
                if t.get("type") == "bar" and isinstance(t.get("marker", {}).get("color"), list):
                    out.update({chart_colors.policy_base(x): col for x, col in zip(t["x"], t["marker"]["color"])
                                if not str(col).startswith("rgba")})
                elif t.get("name") and t.get("line", {}).get("color"):
                    out.setdefault(chart_colors.policy_base(t["name"]), t["line"]["color"])
        return out

    compare = run_page("pages/compare.py", a_policy="chunked", b_policy="continuous", c_policy="static")
    capacity = run_page("pages/capacity.py", policies="continuous,chunked")
    home = run_page("app.py")
    seen = {"compare": colours(compare, "TTFT CDF"), "capacity": colours(capacity, "Capacity per policy"),
            "home": colours(home, "Strategy showdown")}
    for page, found in seen.items():
        for name in ("continuous", "chunked"):
            assert found.get(name) == POLICY_COLORS[name], (page, name, found)


def test_empty_inputs_give_a_titled_figure():
    fig = charts.latency_cdf({"a": np.array([])}, "ttft")
    assert fig.layout.title.text and fig.layout.annotations


def test_png_config_and_slug():
    cfg = charts.png_config("explore dynamic/timeline: Qwen2.5")
    assert cfg["toImageButtonOptions"] == {"format": "png", "filename": "explore-dynamic-timeline-Qwen2.5", "scale": 2}
    assert charts.slug("a", None, "b c") == "a_b-c"


# ---------------------------------------------------------------- log axes and room for titles


def _log_axes(fig: go.Figure) -> dict[str, go.layout.XAxis]:
    layout = fig.layout
    return {k: layout[k] for k in layout if re.fullmatch(r"[xy]axis\d*", k) and layout[k].type == "log"}


def _all_figures(runs, summaries) -> dict[str, go.Figure]:
    res = runs["continuous"]
    sc = res.scenario
    costs = cm.cost_model(sc.deployment, cm.DEFAULT_ALLREDUCE)
    values = {k: r.requests["ttft_s"].to_numpy() for k, r in runs.items()}
    sweep = pd.DataFrame({"max_num_seqs": [8.0, 16.0, 32.0, 64.0, 128.0], "steady_output_tok_s": 800.0,
                          "capacity_output_tok_s": [250.0, 500.0, 1000.0, 2000.0, 2000.0],
                          "offered_output_tok_s": 850.0, "ttft_p50_s": [50.0, 5.0, 0.08, 0.08, 0.08],
                          "ttft_p99_s": [120.0, 12.0, 0.5, 0.5, 0.5], "tpot_p50_s": 0.017, "tpot_p99_s": 0.029,
                          "capacity_tpot_p99_s": [0.02, 0.03, 0.05, 0.1, 0.2], "gpu_util": 0.43,
                          "batch_efficiency": 0.5, "kv_pressure": 0.5, "preemptions": 0})
    plans = {"static": {"max_rate_req_s": 1.0, "nodes_needed": 20, "usd_per_million_output_tokens": 9.0},
             "continuous": {"max_rate_req_s": 3.0, "nodes_needed": 7, "usd_per_million_output_tokens": 3.0}}
    return {
        "showdown": charts.showdown_bars(summaries), "class_ttft": charts.class_ttft_bars(summaries),
        "timeline": charts.request_timeline(res.requests, res.class_names),
        "batch_composition": charts.batch_composition(res.steps),
        "kv_queue": charts.kv_and_queue(res.steps, sc.deployment.kv_capacity_tokens),
        "ttft_hist": charts.latency_histogram(res.requests, "ttft", res.class_names),
        "itl": charts.itl_histogram(res.itl_hist, res.itl_edges, res.class_names),
        "cdf": charts.latency_cdf(values, "ttft"), "hist_overlay": charts.latency_hist_overlay(values, "e2e"),
        "sweep_throughput": cp.sweep_throughput(sweep, "max_num_seqs", 64.0, True, "continuous"),
        "sweep_latency": cp.sweep_latency(sweep, "max_num_seqs", 64.0, True),
        "sweep_utilisation": cp.sweep_utilisation(sweep, "max_num_seqs", 64.0, True),
        "frontier": cp.sweep_frontier({"continuous": sweep}, "max_num_seqs"),
        "capacity_bars": cp.capacity_bars(plans, 20.0, 2.5),
        "step_vs_batch": ccm.step_vs_batch(costs, 1000.0, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)),
        "step_vs_prompt": ccm.step_vs_prompt(costs, (16, 64, 256, 1024, 4096, 16384)),
    }


def test_log_axes_have_clean_labels(runs, summaries):
    """Every log axis of every builder carries its own ticks: decades when the data span three or more, else
    1-2-5 steps; never Plotly's small digits between decades."""
    checked = 0
    for name, fig in _all_figures(runs, summaries).items():
        for axis_name, axis in _log_axes(fig).items():
            checked += 1
            ticks = list(axis.tickvals or ())
            assert len(ticks) >= 3, (name, axis_name, ticks)
            mantissas = {round(t / 10 ** math.floor(math.log10(t) + 1e-9), 6) for t in ticks}
            decades = mantissas == {1.0}
            assert decades or mantissas <= {1.0, 2.0, 5.0} or len(ticks) <= 8, (name, axis_name, ticks)
            assert list(axis.ticktext) == [charts.tick_text(t) for t in ticks]
            if decades:  # minor ticks at 2..9, unlabelled
                assert axis.minor.dtick == "D1", (name, axis_name)
    assert checked >= 12
    # TTFT from ~0.1 s to minutes: decades (the overload flag off: an overloaded policy's bar reads "unbounded")
    wide = charts.showdown_bars({k: {**v, "overloaded": False} for k, v in summaries.items()}).layout.yaxis2
    assert all(t == 10.0 ** round(math.log10(t)) for t in wide.tickvals)
    assert charts.log_ticks([0.3, 2000.0]) == pytest.approx([1.0, 10.0, 100.0, 1000.0])
    assert charts.log_ticks([3.0, 150.0]) == pytest.approx([5.0, 10.0, 20.0, 50.0, 100.0])
    assert [charts.tick_text(t) for t in (0.01, 0.5, 1.0, 1000.0, 1e4, 2e6, 1e9)] == \
        ["0.01", "0.5", "1", "1,000", "10k", "2M", "1G"]


CHAR_PX = 7.0  # an axis title's width per character at the template's 13 px (a little over the real ~6.5)
NARROW_PX = 550  # a half-width dashboard column: the figures Explore, Compare and Model and hardware draw in pairs
HALF_WIDTH = {"batch_composition", "kv_queue", "ttft_hist", "itl", "cdf", "hist_overlay", "sweep_throughput",
              "frontier", "step_vs_batch", "step_vs_prompt"}


def test_titles_fit_their_panels(runs, summaries):
    """Nothing runs into anything: every axis has automargin; figures with subplot titles leave the room for them
    under the subtitle; a rotated y title is no longer than its panel is tall (longer ones ran up into the
    subtitle), an x title no wider than its panel at the width the page draws it (the clipped "atch size"),
    and a subtitle fits a half-width column."""
    for name, fig in _all_figures(runs, summaries).items():
        layout = fig.layout
        tpl = layout.template.layout
        top = layout.margin.t if layout.margin.t is not None else tpl.margin.t
        bottom = layout.margin.b if layout.margin.b is not None else tpl.margin.b
        subplot_titles = [a for a in layout.annotations if a.yref == "paper" and a.text and a.y is not None
                          and a.yanchor == "bottom"]
        assert top >= (charts.TOP_MARGIN_SUBPLOTS if subplot_titles else charts.TOP_MARGIN), name
        width = NARROW_PX if name in HALF_WIDTH else 1100
        subtitle = layout.title.subtitle.text if layout.title.subtitle else ""
        assert len(subtitle or "") * 6.2 <= width - 20, (name, subtitle)  # 12 px subtitle
        plot_h = layout.height - top - bottom - 40  # 40: the caption line and the x title
        for key in layout:
            if not re.fullmatch(r"[xy]axis\d*", key):
                continue
            axis = layout[key]
            assert axis.automargin is not False and tpl[key[0] + "axis"].automargin, (name, key)
            text = axis.title.text or ""
            lo, hi = axis.domain or (0.0, 1.0)
            if key.startswith("y"):
                assert len(text) * CHAR_PX <= (hi - lo) * plot_h, (name, key, text)
            else:
                assert len(text) * CHAR_PX <= (hi - lo) * (width - 140), (name, key, text)
