"""Exports: a standalone offline HTML report, CSV and JSON."""
from __future__ import annotations

import io
import json
import math
import re

import pandas as pd
import pytest

from batching.charts import policy as charts

from batching import report
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.specs import deployment
from batching.sim.workload import TraceWorkload, workload_preset


@pytest.fixture(scope="module")
def run():
    sc = Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 80, 3), policy=PRESETS["chunked"])
    return simulate(sc)


def test_html_report_is_standalone(run):
    figs = [(charts.batch_composition(run.steps), "composition"),
            (charts.latency_histogram(run.requests, "ttft", run.class_names), "ttft <b>")]
    table = pd.DataFrame({"TTFT P99 (s)": ["0.57 s"]}, index=["chunked"])
    html = report.html_report("Explore <chunked>", run.scenario, figures=figs, tables=[("Metrics", table)],
                              policies={"chunked": PRESETS["chunked"]}, verdict="chunked wins", link="http://x/?a=1")
    assert html.startswith("<!DOCTYPE html>")
    # plotly.js inlined exactly once, nothing from a CDN
    assert html.count("Plotly.newPlot") == 2
    assert len(re.findall(r"plotly\.js v\d", html)) >= 1
    assert "cdn.plot.ly" not in re.sub(r"//[^\n]*", "", "".join(re.findall(r"<script[^>]*src=[^>]*>", html)))
    assert not re.search(r"<script[^>]*src=[\"']https?://", html)
    assert len(html) > 3_000_000  # the library itself is in the file
    # scenario, policy, table, captions, escaped
    assert "Qwen2.5-72B" in html and "chunked prefill" in html and "0.57 s" in html
    assert "Explore &lt;chunked&gt;" in html and "ttft &lt;b&gt;" in html and "chunked wins" in html


def test_html_report_without_figures(run):
    html = report.html_report("Empty", run.scenario)
    assert "<h2>Scenario</h2>" in html and "Plotly.newPlot" not in html


def test_csv_exports(run):
    req = pd.read_csv(io.BytesIO(report.requests_csv(run)))
    assert len(req) == 80 and {"arrival_s", "ttft_s", "tpot_s", "e2e_s", "release_s"} <= set(req.columns)
    steps = pd.read_csv(io.BytesIO(report.steps_csv(run)))
    assert len(steps) == len(run.steps)
    assert steps["decode_tokens"].sum() + steps["prefill_tokens"].sum() > 0
    both = pd.read_csv(io.BytesIO(report.combined_csv({"a": run, "b": run}, "requests")))
    assert list(both.columns[:2]) == ["policy", "request_id"] and len(both) == 160


def test_summary_json_has_no_nan(run):
    s = run.summary()
    s["weird"] = float("nan")
    doc = json.loads(report.summary_json({"chunked": s}, run.scenario, {"chunked": PRESETS["chunked"]}))
    assert doc["summaries"]["chunked"]["weird"] is None
    assert doc["summaries"]["chunked"]["ttft_p99_s"] == pytest.approx(s["ttft_p99_s"])
    assert doc["policies"]["chunked"]["max_num_batched_tokens"] == 2048
    assert doc["scenario"]["Model"] == "Qwen2.5-72B"
    assert math.isfinite(doc["summaries"]["chunked"]["throughput_output_tok_s"])


def test_scenario_rows_and_slug(run):
    rows = dict(report.scenario_rows(run.scenario))
    assert rows["Tensor parallel"].startswith("8 (1 replica")
    assert rows["Requests"] == "80"
    assert report.scenario_slug(run.scenario) == "Qwen2.5-72B_H100-SXM_tp8_bf16_2rps_80req_seed3"
    trace = TraceWorkload(data=b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n", filename="t.csv")
    assert "trace t.csv" in report.describe_workload(trace)


@pytest.mark.skipif(not __import__("pathlib").Path("/usr/bin/chromium").exists(),
                    reason="kaleido needs Chromium at /usr/bin/chromium")
def test_figure_png_through_kaleido(run, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", "/usr/bin/chromium")
    png = report.figure_png(charts.itl_histogram(run.itl_hist, run.itl_edges, run.class_names), scale=1, width=600)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
