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
    assert list(configs["GPU"]) == ["b200", "h200-sxm"] and list(configs["$ per M output tokens"]) == [0.9, 1.2]
    assert list(configs["Knobs"]) == ["preset's", "max_num_seqs=128"]  # a knob in words, not JSON
    left = pd.read_csv(io.BytesIO(files["search_left_out.csv"]))
    assert left["Left out"].tolist() == ["does not fit"] and left["Why"].tolist() == ["no FP8 on A100"]
    doc = json.loads(files["search_data.json"])  # every field stays in the JSON
    assert doc["configs"][0]["label"] == "b200 fp8 tp4 chunked" and doc["scenario"]
    assert doc["configs"][1]["knobs"] == {"max_num_seqs": 128}
    html = files["search_report.html"].decode()
    assert html.count("Plotly.newPlot") == 1 and "8× B200 180GB \\u002f H200 SXM 141GB" in html  # its caption


# issue 39 item 9: a search as Find a deployment runs it, on a sidebar at TP 8 and 10 req/s that it does not use
SIDEBAR = Scenario(workload=workload_preset("mixed", 10.0, 120, 1))


def _row(rank, gpu, precision, tp, usd, ttft, tpot, pareto, split=None):
    return {"gpu": gpu, "precision": precision, "serving": "agg" if split is None else "disagg",
            "tp": tp if split is None else None, "split": split,
            "replicas_per_node": 8 // tp if split is None else None, "copies_per_node": 8 // tp if tp else 1,
            "nodes_per_copy": 1, "policy": "chunked", "knobs": {"max_num_seqs": 256} if rank == 2 else {},
            "label": f"{gpu} {precision} tp{tp} chunked", "meets_slo": True, "pareto": pareto,
            "max_rate_req_s": 3.0 * (tp or 4), "nodes_needed": 2 + rank % 3, "usd_per_million_output_tokens": usd,
            "usd_per_million_output_tokens_at_capacity": 3.881, "margin": 0.7, "output_tok_s_per_gpu": 400.0,
            "ttft_p99_s": ttft, "tpot_p99_s": tpot, "binding_slo": "ttft", "binding_class": "interactive chat",
            "fleet_checked": rank == 1, "fleet_verified": rank == 1, "router": "least-outstanding",
            "fleet_nodes": 2, "fleet_ttft_p99_s": 0.5, "fleet_tpot_p99_s": 0.03, "calibrated": True}


SEARCHED = {
    "configs": [_row(1, "h200-sxm", "fp8", 4, 1.0, 0.40, 0.030, True),
                _row(2, "h200-sxm", "fp8", 2, 1.1, 0.30, 0.028, True),
                _row(3, "h100-sxm", "fp8", 4, 1.2, 0.21, 0.020, False),
                _row(4, "h100-sxm", "bf16", None, 1.5, 0.2, 0.019, True,
                     split={"prefill_instances": 3, "prefill_tp": 2, "decode_instances": 1, "decode_tp": 2})],
    "skipped": [], "pruned": [], "failed": [], "target_rate_req_s": 30.0, "headroom": 1.25, "serving": "both",
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "e2e_s": None, "attainment": 0.99},
    "gpu_hour_usd": {"h100-sxm": 2.69, "h200-sxm": 3.5}, "num_gpus_per_node": 8, "mean_output_tokens": 200.0,
    "router": "least-outstanding", "fleet_top": 3, "notes": [], "tail": "P99"}


def test_search_report_states_the_slos_the_target_and_the_verdict_and_what_the_search_used():
    html = report.search_export(SEARCHED, SIDEBAR).files()["search_report.html"].decode()
    scenario = html[html.index("<h2>Scenario</h2>"):html.index("</table>", html.index("<h2>Scenario</h2>"))]
    assert "<th>Target traffic</th><td>30 req/s</td>" in scenario
    assert "<th>SLOs</th><td>TTFT ≤ 1,000 ms; TPOT ≤ 50 ms for 99 % of each class&#x27;s requests</td>" in scenario
    assert "H200 SXM 141GB, H100 SXM 80GB" in scenario and "FP8, BF16" in scenario
    assert "TP 4; TP 2; 3×TP2 prefill + 1×TP2 decode" in scenario
    # not the sidebar's H100 TP 8 at 10 req/s, which the search replaced
    assert "10 req/s" not in scenario and "Tensor parallel" not in scenario and "rate searched" in scenario
    verdict = html[html.index('<div class="verdict">'):]
    assert verdict.startswith('<div class="verdict">Cheapest: h200-sxm fp8 tp4 chunked: ')
    assert "3 nodes for 30 req/s" in verdict[:400]


def test_search_configuration_table_is_readable():
    export = report.search_export(SEARCHED, SIDEBAR)
    (_, table), = [t for t in export.html_tables if t[0].startswith("Configurations")]
    assert len(table.columns) <= 30 and "Prefill TP" in table.columns  # a split's columns: one row is a split
    assert {"$ per M output tokens", "Nodes for 30 req/s", "P99 TTFT (s)", "P99 TPOT (ms)", "Binding class",
            "Margin (% of capacity used)"} <= set(table.columns)
    cells = [str(v) for v in table.to_numpy().ravel()]
    assert not any(v.startswith(("{", "[")) for v in cells)  # no JSON in a cell
    html = export.files()["search_report.html"].decode()
    body = html[html.index("Configurations meeting"):html.index("<h2>Charts</h2>")]
    assert "{&quot;" not in body and "&lt;NA&gt;" not in body and "nan" not in body


def test_search_csv_numbers_are_numbers_and_match_the_page_table():
    export = report.search_export(SEARCHED, SIDEBAR)
    csv = export.files()["search_configurations.csv"]
    df = pd.read_csv(io.BytesIO(csv))
    assert df["$ per M output tokens"].dtype.kind == "f" and df["$ per M output tokens at capacity"][0] == 3.881
    assert b"$3.881" not in csv and b'"$' not in csv
    assert df["Binding class"].tolist() == ["interactive chat"] * 4
    assert df["Nodes for 30 req/s"].dtype.kind == "i" and df["Rank"].tolist() == [1, 2, 3, 4]
    assert csv.decode().splitlines()[1].split(",")[5] == "4"  # TP 4, never 4.0
    assert df["TP"].isna().tolist() == [False, False, False, True]  # the split's TP is its own columns
    assert df.loc[3, ["Prefill instances", "Prefill TP", "Decode instances", "Decode TP"]].tolist() == [3, 2, 1, 2]
    # the page's table is this frame: the dashboard's CSV, its table and `report --page search` agree
    page = report.search_frame(SEARCHED["configs"], 30.0)
    assert csv == report.frame_csv(page)


def test_search_pareto_chart_draws_the_front_on_top_labelled_with_the_slos_and_the_target():
    from batching.charts.search import pareto_chart

    fig = pareto_chart(SEARCHED["configs"], 0, SEARCHED["slo"], 30.0)
    names = [t.name for t in fig.data if t.name]
    assert names.index("Pareto front") > names.index("Other configurations")  # drawn above the grey points
    # every point of the front labelled in both panels (not only the chosen one), none of the others
    labels = [(a.text, a.xref) for a in fig.layout.annotations if a.text.startswith("#")]
    assert sorted(labels) == sorted((t, x) for t in ("#1 h200-sxm FP8 TP4", "#2 h200-sxm FP8 TP2",
                                                     "#4 h100-sxm BF16 3×TP2 P + 1×TP2 D") for x in ("x", "x2"))
    # points at about the same cost stack their labels apart (equal costs are common: nodes are whole)
    same = [_row(1, "h200-sxm", "fp8", 4, 2.0, 0.46, 0.019, True),
            _row(2, "h200-sxm", "fp8", 8, 2.0, 0.45, 0.022, True)]
    offsets = sorted(a.ay for a in pareto_chart(same, 0).layout.annotations if a.text.startswith("#") and a.xref == "x")
    assert offsets[1] - offsets[0] >= 14
    assert sorted((s.x0, s.xref) for s in fig.layout.shapes) == [(1.0, "x"), (50.0, "x2")]  # the SLOs, dashed
    subtitle = fig.layout.title.subtitle.text
    assert "target of 30 req/s" in subtitle
    # in lines short enough for a half-width column (one 190-character line was cut at "Lower lef")
    assert all(len(line) <= 90 for line in subtitle.split("<br>"))


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
