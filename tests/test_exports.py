"""Exports complete (issue 24 item 11): every figure as PNG and SVG (kaleido), the showdown's export and report with
the page's first chart (latency against load) and the article table, Find a deployment and the views with CSV, JSON
and HTML, a caption that describes its own points."""
import io
import json
import zipfile

import pandas as pd
import pytest

from batching import report
from batching.charts.export import caption_of, configs_caption
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies import load_curve
from batching.studies.compare import compare

SC = Scenario(workload=workload_preset("mixed", 2.0, 120, 1))
TWO = {k: PRESETS[k] for k in ("static", "continuous")}

# two rows of a search on other GPUs and precisions than the sidebar's (H100 · TP 8 · BF16)
CONFIGS = [
    {"gpu": "b200", "precision": "fp8", "tp": 4, "replicas_per_node": 2, "policy": "chunked", "knobs": {},
     "label": "b200 fp8 tp4 chunked", "meets_slo": True, "pareto": True, "max_rate_req_s": 9.0, "nodes_needed": 3,
     "usd_per_million_output_tokens": 0.9, "ttft_p99_s": 0.4, "tpot_p99_s": 0.03, "fleet_checked": False},
    {"gpu": "h200-sxm", "precision": "fp8", "tp": 8, "replicas_per_node": 1, "policy": "continuous",
     "knobs": {"max_num_seqs": 128}, "label": "h200-sxm fp8 tp8 continuous, max_num_seqs=128", "meets_slo": True,
     "pareto": False, "max_rate_req_s": 6.0, "nodes_needed": 4, "usd_per_million_output_tokens": 1.2,
     "ttft_p99_s": 0.5, "tpot_p99_s": 0.04, "fleet_checked": False},
]
FOUND = {"configs": CONFIGS, "skipped": [{"gpu": "a100-80gb", "precision": "fp8", "tp": 8, "policy": "chunked",
                                          "label": "a100-80gb fp8 tp8 chunked", "reason": "does not fit",
                                          "why": "no FP8 on A100"}],
         "pruned": [], "failed": [], "target_rate_req_s": 20.0, "notes": ["a note"]}


def test_search_caption_describes_its_own_points():
    line = configs_caption(CONFIGS, SC)
    assert "B200 180GB / H200 SXM 141GB" in line and "TP 4 / 8" in line and " FP8 " in line
    assert "H100" not in line and "BF16" not in line and "1 req/s" not in line and "2 req/s" not in line
    assert "policies chunked, continuous" in line and "rate searched" in line
    export = report.search_export(FOUND, SC)
    assert caption_of(export.figures["pareto"][0]) == line


def test_search_exports_csv_json_and_html():
    files = report.search_export(FOUND, SC).files()
    assert sorted(files) == ["search_configurations.csv", "search_data.json", "search_left_out.csv",
                             "search_report.html"]
    configs = pd.read_csv(io.BytesIO(files["search_configurations.csv"]))
    assert list(configs["gpu"]) == ["b200", "h200-sxm"] and list(configs["usd_per_million_output_tokens"]) == [0.9, 1.2]
    assert json.loads(configs["knobs"][1]) == {"max_num_seqs": 128}
    left = pd.read_csv(io.BytesIO(files["search_left_out.csv"]))
    assert left["left_out"].tolist() == ["does not fit"]
    doc = json.loads(files["search_data.json"])
    assert doc["configs"][0]["label"] == "b200 fp8 tp4 chunked" and doc["scenario"]
    html = files["search_report.html"].decode()
    assert html.count("Plotly.newPlot") == 1 and "8× B200 180GB \\u002f H200 SXM 141GB" in html  # its caption


def test_static_images_say_nothing_of_double_clicks():
    from batching.sim.simulate import simulate

    sc = Scenario(workload=workload_preset("chat", 4.0, 400, 1))
    fig, _ = report.policy_figure(simulate(sc), "timeline")
    assert "double-click" in fig.layout.title.subtitle.text  # the live chart and the HTML report keep the hint
    svg = report.figure_svg(fig, width=900)
    assert b"double-click" not in svg and b"shows the first 100" in svg
    assert "double-click" in fig.layout.title.subtitle.text  # the figure itself is unchanged


def test_view_export_has_csv_json_html():
    frame = pd.DataFrame({"rate_req_s": [1.0, 2.0], "tpot_p50_s_on": [0.01, 0.02]})
    files = report.view_export("tune_spec", "Speculation crossover", SC, {}, {"spec_crossover": frame}).files()
    assert sorted(files) == ["tune_spec_data.json", "tune_spec_report.html", "tune_spec_spec_crossover.csv"]
    assert json.loads(files["tune_spec_data.json"])["spec_crossover"][1]["tpot_p50_s_on"] == 0.02
    assert "Speculation crossover" in files["tune_spec_report.html"].decode()


@pytest.fixture(scope="module")
def showdown():
    cmp = compare(SC, TWO)
    curve = load_curve.load_curve(SC, TWO, points=3)
    article = {k: v for k, v in cmp.summaries().items()}  # stands in for the article's runs (same keys)
    return report.showdown_export(cmp, SC, TWO, curve=curve, article_summaries=article), curve


def test_showdown_export_leads_with_latency_against_load_and_has_the_article_table(showdown):
    export, curve = showdown
    assert list(export.figures) == ["latency_vs_load", "bars", "class_ttft"]  # the page's order
    fig = export.figures["latency_vs_load"][0]
    assert caption_of(fig).startswith("Simulated: 8× H100")
    assert {t.name for t in fig.data if t.name} >= {"static", "continuous"}
    files = export.files()
    assert len(pd.read_csv(io.BytesIO(files["showdown_latency_vs_load.csv"]))) == len(curve)
    published = pd.read_csv(io.BytesIO(files["showdown_article_published.csv"]))
    assert published["Throughput (output tok/s)"].tolist() == [1200, 1800, 3200, 3500, 3400]  # as cited
    html = files["showdown_report.html"].decode()
    assert html.count("Plotly.newPlot") == 3
    assert "table, as published" in html and "the simulator on the same setting" in html
    assert html.index("against the offered rate") < html.index("Throughput vs capacity")  # first chart first


def test_every_figure_as_png_and_svg(showdown):
    export, _ = showdown
    images = export.images(scale=1, width=800)
    assert sorted(images) == sorted([*export.png_names().values(), *export.svg_names().values()])
    for key in export.figures:
        assert images[f"showdown_{key}.png"].startswith(b"\x89PNG"), key
        svg = images[f"showdown_{key}.svg"]
        assert svg.startswith(b"<svg") and b"Simulated: " in svg, key
    with zipfile.ZipFile(io.BytesIO(report.figures_zip({"a": export.figures["bars"][0]}, "svg"))) as z:
        assert z.namelist() == ["a.svg"] and z.read("a.svg").startswith(b"<svg")
    with pytest.raises(ValueError, match="image format 'jpg' is not one of png, svg"):
        report.figure_images({"a": export.figures["bars"][0]}, ("jpg",))


def test_explore_export_leads_with_load_from_its_capacity_run():
    from batching.sim.simulate import simulate

    sc = SC.with_policy(PRESETS["continuous"])
    export = report.explore_export(simulate(sc), "continuous", simulate(sc, saturated=True))
    metrics = pd.read_csv(io.BytesIO(export.files()["explore_metrics.csv"]))
    assert list(metrics.columns[1:5]) == ["Load", "MFU", "MBU", "Busy"]  # how full the node is, first
    load = float(metrics["Load"][0].removesuffix(" %"))
    assert 0 < load < 100 and json.loads(export.json)["summaries"]["continuous"]["overloaded"] is False
