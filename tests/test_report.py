"""Exports: a standalone offline HTML report, CSV and JSON; the scenario's caption line on every exported figure;
each page's whole export (figures, tables, JSON, report) with unique file names."""
from __future__ import annotations

import dataclasses
import io
import json
import math
import re

import pandas as pd
import pytest

import plotly.graph_objects as go

from batching.charts import policy as charts
from batching.charts.colors import POLICY_COLORS
from batching.charts.export import CAPTION_LEGEND, caption_of, scenario_caption, with_caption

from batching import report
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import deployment
from batching.sim.workload.requests import LengthDist, TraceWorkload, workload_preset
from batching.studies.capacity import SLO, capacity
from batching.studies.compare import compare
from batching.studies.planning import plan_capacity, sweep_study


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
    # each figure carries the scenario's caption line (hardware, then traffic, on two lines)
    assert html.count("Simulated: 8× H100 SXM 80GB · Qwen2.5-72B · TP 8 · BF16") == 2
    assert html.count("workload chat · 2 req\\u002fs · 80 requests · seed 3") == 2  # "/" escaped in the JSON
    assert caption_of(figs[0][0]) is None  # the report captions copies; the caller's figures are left alone


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


def test_scenario_caption(run):
    assert scenario_caption(run.scenario) == ("Simulated: 8× H100 SXM 80GB · Qwen2.5-72B · TP 8 · BF16 · vLLM 0.11 profile · "
                                              "workload chat · 2 req/s · 80 requests · seed 3")
    assert scenario_caption(run.scenario, policy="chunked*", rate="rate searched").endswith(
        "workload chat · rate searched · 80 requests · seed 3 · policy chunked*")
    fp8 = Scenario(deployment=deployment(precision="fp8", kv_cache_tokens=65536),
                   workload=workload_preset("mixed", 0.5, 40, 0))
    line = scenario_caption(fp8)
    assert "· FP8 ·" in line and "KV cache 65,536 tokens" in line and "workload mixed · 0.5 req/s" in line
    assert "· TensorRT-LLM 1.0 profile ·" in scenario_caption(dataclasses.replace(run.scenario, engine="trtllm"))
    mix = dataclasses.replace(run.scenario.workload, classes=(dataclasses.replace(
        run.scenario.workload.classes[0], output=LengthDist("fixed", mean=64, low=1, high=64)),))
    assert "workload chat (own mix)" in scenario_caption(run.scenario.with_workload(mix))
    trace = TraceWorkload(data=b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n", filename="t.csv",
                          speedup=2.0, max_requests=2)
    assert scenario_caption(run.scenario.with_workload(trace)).endswith(
        "workload trace t.csv at 2x speed · first 2 requests")


def test_scenario_caption_names_shared_prompts_bursts_and_sessions(run):
    wl = run.scenario.workload
    shared = scenario_caption(run.scenario.with_workload(wl.with_shared_prefix(2000)))
    assert "workload chat · 2,000-token shared prompt · 2 req/s" in shared  # still the chat preset
    for kind, params, words in (("gamma", {"cv": 4.0}, "2 req/s · bursty (Gamma CV 4) · 80 requests"),
                                ("onoff", {"on_s": 5.0, "off_s": 15.0}, "2 req/s · on 5 s / off 15 s"),
                                ("diurnal", {"peak_to_trough": 3.0, "period_s": 600.0},
                                 "diurnal peak:trough 3, period 600 s")):
        assert words in scenario_caption(run.scenario.with_workload(wl.with_arrivals(kind, **params)))
    sessions = workload_preset("chat-sessions", 2.0, 80, 3)
    assert "workload chat-sessions · 2 req/s" in scenario_caption(run.scenario.with_workload(sessions))


def test_with_caption_is_one_legend_title_at_the_bottom(run):
    """The caption is the title of a legend of its own anchored to the figure's bottom edge (Plotly then makes
    room for it under the axis titles and legends); one invisible, inert entry; applied twice, still one."""
    fig = charts.itl_histogram(run.itl_hist, run.itl_edges, run.class_names)
    line = scenario_caption(run.scenario)
    out = with_caption(fig, line)
    assert caption_of(fig) is None and len(fig.data) + 1 == len(out.data)  # the input is left alone
    assert caption_of(out) == line
    legend = out.layout[CAPTION_LEGEND]
    assert (legend.xref, legend.yref, legend.yanchor, legend.xanchor) == ("container", "container", "bottom", "left")
    assert legend.y == 0 and legend.title.text == line.replace(" · workload", "<br>workload")
    entry = [t for t in out.data if t.legend == CAPTION_LEGEND]
    assert len(entry) == 1 and entry[0].hoverinfo == "skip" and entry[0].line.width == 0
    assert legend.itemclick is False and legend.itemdoubleclick is False
    again = with_caption(out, "Simulated: something else · workload x")
    assert len(again.data) == len(out.data) and caption_of(again) == "Simulated: something else · workload x"
    go.Figure(again.to_plotly_json())  # valid for Plotly


def test_policy_figures_carry_the_caption(run):
    figs = report.policy_figures(run)
    line = scenario_caption(run.scenario, policy="chunked")
    assert [caption_of(f) for f, _ in figs.values()] == [line] * len(figs)
    assert caption_of(report.policy_figures(run, "chunked*")["itl"][0]).endswith("policy chunked*")


@pytest.fixture(scope="module")
def exports(run):
    sc = run.scenario
    cmp = compare(sc, {k: PRESETS[k] for k in ("static", "continuous")})
    slots = {"A · continuous": PRESETS["continuous"], "B · chunked": PRESETS["chunked"]}
    study = sweep_study(sc.with_policy(PRESETS["continuous"]), "max_num_seqs", [16, 64], label="continuous")
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    plan = plan_capacity(sc, slo, {n: capacity(sc.with_policy(PRESETS[n]), slo) for n in ("static", "chunked")},
                         20.0, 2.5)
    return {"explore": report.explore_export(run, "chunked"),
            "showdown": report.showdown_export(cmp, sc, {k: PRESETS[k] for k in ("static", "continuous")}),
            "compare": report.compare_export(compare(sc, slots), sc, slots),
            "tune": report.tune_export(study, True, "tpot_cap"),
            "capacity": report.capacity_export(plan)}


PAGE_FILES = {
    "explore": ({"timeline", "batch_composition", "kv_queue", "ttft_hist", "tpot_hist", "e2e_hist", "itl"},
                {"metrics", "requests", "steps"}, "summary"),
    "showdown": ({"bars", "class_ttft"}, {"classic_table", "class_table", "requests", "steps"}, "summary"),
    "compare": ({f"{m}_{k}" for m in ("ttft", "tpot", "e2e") for k in ("cdf", "hist")},
                {"metrics", "requests", "steps"}, "summary"),
    "tune": ({"throughput", "frontier", "latency", "utilisation"}, {"sweep"}, "sweep"),
    "capacity": ({"bars", "goodput"}, {"plan", "classes", "rates"}, "plan"),
}


@pytest.mark.parametrize("page", list(PAGE_FILES))
def test_page_export(exports, run, page):
    """Each page's export: its figures (each with the scenario's caption), its tables, its JSON and report, under
    unique names that start with the page."""
    export = exports[page]
    figures, tables, json_key = PAGE_FILES[page]
    assert export.page == page and set(export.figures) == figures and set(export.tables) == tables
    for key, (fig, text) in export.figures.items():
        line = caption_of(fig)
        assert line and line.startswith("Simulated: 8× H100 SXM 80GB · Qwen2.5-72B · TP 8 · BF16 · vLLM 0.11 profile · workload chat"), \
            key
        assert text, key
    files = export.files(notes=["made by a test"])
    names = [*files, *export.png_names().values()]
    assert len(set(names)) == len(names) == len(figures) + len(tables) + 2
    assert all(n.startswith(f"{page}_") for n in names)
    assert set(files) == {f"{page}_{k}.csv" for k in tables} | {f"{page}_{json_key}.json", f"{page}_report.html"}
    assert set(export.png_names().values()) == {f"{page}_{k}.png" for k in figures}
    json.loads(files[f"{page}_{json_key}.json"])
    html = files[f"{page}_report.html"].decode()
    assert html.count("Plotly.newPlot") == len(figures) and "made by a test" in html
    for key in tables:
        df = pd.read_csv(io.BytesIO(files[f"{page}_{key}.csv"]))
        assert len(df) > 0, key


def test_page_exports_name_their_study(exports):
    assert "workload chat · rate searched" in caption_of(exports["capacity"].figures["bars"][0])
    assert caption_of(exports["tune"].figures["latency"][0]).endswith("policy continuous")
    plan = pd.read_csv(io.BytesIO(exports["capacity"].files()["capacity_plan.csv"]))
    assert list(plan["policy"]) == ["static", "chunked"] and "Rate per node (req/s)" in plan.columns
    assert "Nodes for 20 req/s" in exports["capacity"].html()  # the report's header says the target
    sweep = pd.read_csv(io.BytesIO(exports["tune"].files()["tune_sweep.csv"]))
    assert list(sweep["max_num_seqs"]) == [16, 64] and set(sweep["policy"]) == {"continuous"}
    doc = json.loads(exports["tune"].json)
    assert doc["knob"] == "max_num_seqs" and len(doc["cards"]) == 3
    # Compare: slot names, each policy in its own colour
    cdf = exports["compare"].figures["ttft_cdf"][0]
    assert {t.name: t.line.color for t in cdf.data if t.name in ("A · continuous", "B · chunked")} == {
        "A · continuous": POLICY_COLORS["continuous"], "B · chunked": POLICY_COLORS["chunked"]}
    metrics = pd.read_csv(io.BytesIO(exports["compare"].files()["compare_metrics.csv"]))
    assert list(metrics.columns) == ["Metric", "A · continuous", "B · chunked", "B · chunked vs A · continuous"]
    classic = pd.read_csv(io.BytesIO(exports["showdown"].files()["showdown_classic_table.csv"]))
    assert list(classic["policy"]) == ["static", "continuous"]


@pytest.mark.skipif(not __import__("pathlib").Path("/usr/bin/chromium").exists(),
                    reason="kaleido needs Chromium at /usr/bin/chromium")
def test_figure_png_through_kaleido(run, monkeypatch):
    """The PNG of a captioned figure shows the caption's text at its bottom left, under the x axis title, with the
    plot pushed up to make room (nothing overlaps, nothing is cut)."""
    from PIL import Image

    monkeypatch.setenv("BROWSER_PATH", "/usr/bin/chromium")
    fig = charts.itl_histogram(run.itl_hist, run.itl_edges, run.class_names)
    png = report.figure_png(fig, scale=1, width=600)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    captioned = report.figure_png(with_caption(fig, scenario_caption(run.scenario)), scale=1, width=600)

    def bands(data: bytes, x0: int, x1: int) -> list[tuple[int, int]]:
        """(first, last) row of each run of rows holding ink (any pixel darker than light grey) in columns x0..x1."""
        img = Image.open(io.BytesIO(data)).convert("L")
        px = img.load()
        rows = [y for y in range(img.size[1]) if any(px[x, y] < 200 for x in range(x0, x1))]
        out: list[tuple[int, int]] = []
        for y in rows:
            if out and y == out[-1][1] + 1:
                out[-1] = (out[-1][0], y)
            else:
                out.append((y, y))
        return out

    height = Image.open(io.BytesIO(png)).size[1]
    assert Image.open(io.BytesIO(captioned)).size == (600, height)
    low = height - 50
    # the far left of the bottom is blank without a caption (tick labels and the x title are further right) ...
    assert not [b for b in bands(png, 0, 60) if b[1] > low]
    # ... and holds the caption's two lines of text with one, inside the image
    lines = [b for b in bands(captioned, 0, 60) if b[1] > low]
    assert len(lines) == 2 and lines[-1][1] < height - 1, lines
    # under the x axis title (the lowest text in the middle columns, above the caption), not over it
    x_title = [b for b in bands(captioned, 260, 340) if b[0] < lines[0][0]]
    assert x_title and x_title[-1][1] < lines[0][0]
