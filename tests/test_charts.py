"""Figure builders: titles, axis titles with units, trace types, the shared template."""
from __future__ import annotations

import re

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from batching.charts import policy as charts
from batching.studies.compare import Comparison
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.specs import deployment
from batching.sim.workload import workload_preset


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
    assert tpot.y[0] == pytest.approx(summaries["dynamic"]["tpot_p99_s"] * 1e3)


def test_class_bars(summaries):
    fig = charts.class_ttft_bars(summaries)
    _check(fig, {"bar"})
    assert len(fig.data) == 2  # two classes in the mixed workload
    assert fig.data[0].y[1] == pytest.approx(summaries["continuous"]["by_priority"]["0"]["ttft_p99_s"])


def test_request_timeline_webgl(runs):
    res = runs["dynamic"]
    fig = charts.request_timeline(res.requests, res.class_names)
    _check(fig, {"scattergl"})
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


def test_request_timeline_samples_big_runs(runs):
    req = runs["continuous"].requests
    big = req.loc[req.index.repeat(40)].reset_index(drop=True)
    big["request_id"] = np.arange(len(big))
    sample, note = charts.timeline_sample(big, 1000)
    assert len(sample) <= 1000 and note and f"of {len(big):,}" in note
    fig = charts.request_timeline(big, runs["continuous"].class_names, max_rows=1000)
    assert "Showing" in fig.layout.title.subtitle.text
    rows = sum(np.isfinite(np.asarray(t.y, float)).sum() for t in fig.data if t.name.endswith("· decode")) / 2
    assert rows <= 1000


def test_batch_composition_stacked_bars(runs):
    res = runs["dynamic"]
    fig = charts.batch_composition(res.steps)
    _check(fig, {"bar"})
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["prefill tokens", "decode tokens", "padded tokens"]
    assert fig.layout.yaxis.title.text == "Tokens per step"


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


def test_empty_inputs_give_a_titled_figure():
    fig = charts.latency_cdf({"a": np.array([])}, "ttft")
    assert fig.layout.title.text and fig.layout.annotations


def test_png_config_and_slug():
    cfg = charts.png_config("explore dynamic/timeline: Qwen2.5")
    assert cfg["toImageButtonOptions"] == {"format": "png", "filename": "explore-dynamic-timeline-Qwen2.5", "scale": 2}
    assert charts.slug("a", None, "b c") == "a_b-c"
