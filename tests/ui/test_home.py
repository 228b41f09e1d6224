"""Home (strategy showdown) in AppTest: default render, URL round trip, clamping, bad input, reset."""
from __future__ import annotations

import json

from uihelpers import FAST, assert_clean, chart, chart_specs, run_page, trace_types

from batching.charts.formatting import metric_spec
from batching.studies.compare import COMPARE_COLUMNS
from batching.sim.policy import PRESETS
from batching.sim.workload.requests import DEFAULT_RATE_REQ_S


def _class_table(at):
    """The per-class table: one column per priority class, named "<class> (P<level>)"."""
    return [d.value for d in at.dataframe if len(d.value.columns) and "(P0) · " in str(d.value.columns[0])][0]


def test_classic_table_columns_overload_and_no_none():
    """At 3 req/s of the mixed workload static and dynamic cannot keep up: their rows read as unbounded, and the
    verdict says so; every column has its definition as tooltip; no cell shows None."""
    at = run_page(rate="3", n="2000")
    assert_clean(at)
    table = at.dataframe[0].value
    for label in ("Busy", "MFU", "MBU", "KV cache in use", "GPU util", "Load", "Batch efficiency"):
        assert label in table.columns, label
    assert table.loc["static", "TTFT P99"].startswith("unbounded: queue grows (+")
    assert table.loc["static", "TTFT P99"].endswith(" req/s)")
    assert table.loc["chunked", "TTFT P99"].endswith(" ms")  # keeps up: a number, below 10 s in ms
    assert table.loc["continuous", "Batch efficiency"].endswith(" of 256)")
    cells = [str(c) for c in table.to_numpy().ravel()]
    assert not any("None" in c or c.lower() == "nan" for c in cells)
    verdict = at.info[0].value
    assert "Overloaded at this rate: 'static'" in verdict and "'dynamic'" in verdict
    # tooltips: each column's help is its metric's definition
    spec = json.loads(at.dataframe[0].proto.columns)
    helps = {c.get("label"): c.get("help") for c in spec.values() if isinstance(c, dict)}
    assert helps["GPU util"] == metric_spec("gpu_util").help
    assert helps["Load"] == metric_spec("load").help
    # SOL util stays available under its own name, in the diagnostics beside the table: drawn when the expander
    # is opened (a closed one draws nothing)
    assert not any("SOL util" in d.value.columns for d in at.dataframe)
    at.session_state["home_diagnostics"] = True
    at.run()
    assert_clean(at)
    assert any("SOL util" in d.value.columns for d in at.dataframe)


def test_default_render():
    at = run_page(**FAST)
    assert_clean(at)
    assert at.title[0].value == "Strategy showdown"
    table = at.dataframe[0].value
    assert list(table.index) == list(PRESETS)
    assert list(table.columns) == [metric_spec(k).label for k in COMPARE_COLUMNS]
    # text with units: shares in percent, TPOT in ms
    assert table.loc["continuous", "GPU util"].endswith(" %")
    assert 0 < float(table.loc["continuous", "GPU util"][:-2]) <= 100
    assert table.loc["continuous", "TPOT P50"].endswith(" ms")
    assert "highest capacity" in at.info[0].value
    assert len(chart_specs(at)) == 3
    assert chart_specs(at)[0]["layout"]["title"]["text"] == "Latency against load"
    assert trace_types(chart(at, "Strategy showdown")) == {"bar"}
    assert trace_types(chart(at, "P99 TTFT by priority class")) == {"bar"}
    # the per-class table has one column per class of the mixed workload
    assert _class_table(at).shape == (5, 8)  # 2 classes x TTFT/TPOT P50/P99
    # the sidebar shows the defaults of the issue
    assert at.selectbox(key="wid:gpu").value == "h100-sxm"
    assert at.selectbox(key="wid:model").value == "qwen2.5-72b"
    assert at.selectbox(key="wid:tp").value == 8
    assert at.selectbox(key="wid:precision").value == "bf16"
    assert at.selectbox(key="wid:workload").value == "mixed"
    assert at.number_input(key="wid:rate").value == DEFAULT_RATE_REQ_S
    assert at.number_input(key="wid:seed").value == 0
    assert len(at.get("download_button")) == 6  # + every chart as PNG and as SVG (issue 24 item 11)


def test_url_reproduces_the_view():
    at = run_page(gpu="h200-sxm", model="llama-3.1-8b", tp="2", precision="fp8", workload="code", rate="7.5",
                  n="150", seed="4")
    assert_clean(at)
    assert at.selectbox(key="wid:gpu").value == "h200-sxm"
    assert at.selectbox(key="wid:model").value == "llama-3.1-8b"
    assert at.selectbox(key="wid:tp").value == 2
    assert at.selectbox(key="wid:precision").value == "fp8"
    assert at.selectbox(key="wid:workload").value == "code"
    assert at.number_input(key="wid:rate").value == 7.5
    assert at.number_input(key="wid:n").value == 150
    assert at.number_input(key="wid:seed").value == 4
    # the link keeps every non-default value
    assert at.query_params["gpu"] == "h200-sxm" and at.query_params["rate"] == "7.5"
    # a single-class workload: one class column
    assert _class_table(at).shape == (5, 4)
    # the same URL gives the same numbers
    again = run_page(gpu="h200-sxm", model="llama-3.1-8b", tp="2", precision="fp8", workload="code", rate="7.5",
                     n="150", seed="4")
    assert again.dataframe[0].value.equals(at.dataframe[0].value)
    default = run_page(**FAST)
    assert not default.dataframe[0].value.equals(at.dataframe[0].value)


def test_out_of_range_url_values_are_clamped_with_a_notice():
    at = run_page(n="3", rate="-2", gpu="tpu-v9", tp="3")
    assert_clean(at)
    notices = " ".join(w.value for w in at.warning)
    assert "n=3" in notices and "using 10" in notices
    assert "rate=-2" in notices and "using 0.1" in notices
    assert "gpu='tpu-v9'" in notices or "gpu=tpu-v9" in notices
    assert at.number_input(key="wid:n").value == 10
    assert at.number_input(key="wid:rate").value == 0.1
    assert at.selectbox(key="wid:gpu").value == "h100-sxm"
    assert at.selectbox(key="wid:tp").value in (2, 4)
    assert at.query_params["n"] == "10"


def test_model_that_does_not_fit_keeps_the_previous_result():
    at = run_page(**FAST)
    before = at.dataframe[0].value
    at.selectbox(key="wid:tp").set_value(1).run()
    assert not at.exception
    assert len(at.error) == 1
    assert "does not fit" in at.error[0].value and "tp" in at.error[0].value
    # the last valid showdown stays on screen
    assert at.dataframe[0].value.equals(before)
    assert len(chart_specs(at)) == 3  # the last latency-against-load curve stays too
    # fp8 makes it fit on an H200
    at.selectbox(key="wid:gpu").set_value("h200-sxm").run()
    at.selectbox(key="wid:precision").set_value("fp8").run()
    assert_clean(at)
    assert not at.dataframe[0].value.equals(before)


def test_reset_restores_defaults_and_cleans_the_url():
    at = run_page(rate="6", seed="9", **FAST)
    assert at.number_input(key="wid:rate").value == 6.0
    reset = [b for b in at.button if b.label == "Reset to defaults"][0]
    reset.click().run()
    assert_clean(at)
    assert at.number_input(key="wid:rate").value == DEFAULT_RATE_REQ_S
    assert at.number_input(key="wid:seed").value == 0
    assert at.number_input(key="wid:n").value == 2000
    assert "rate" not in at.query_params and "seed" not in at.query_params


def test_latency_against_load_is_the_first_chart():
    """Latency against load comes first: a line per policy in each panel, each ending at a capacity marker, the
    workload's SLOs dashed, the sidebar's rate dotted; a caption says how to read it and which load each policy
    runs at."""
    at = run_page(rate="2", **FAST)
    assert_clean(at)
    spec = chart_specs(at)[0]
    assert spec["layout"]["title"]["text"] == "Latency against load"
    lines = [t for t in spec["data"] if t.get("mode") == "lines+markers"]
    assert sorted({t["name"] for t in lines}) == sorted(PRESETS)
    assert len(lines) == 2 * len(PRESETS)  # P99 TTFT and P99 TPOT
    assert len([t for t in spec["data"] if t["name"].endswith(" capacity")]) == 2 * len(PRESETS)
    shapes = spec["layout"]["shapes"]
    assert sorted(s["y0"] for s in shapes if s["line"]["dash"] == "dash") == [100, 1000]  # chat SLOs, ms
    assert [s["x0"] for s in shapes if s["line"]["dash"] == "dot"] == [2.0, 2.0]  # the sidebar's rate
    assert spec["layout"]["yaxis"]["type"] == "log"
    captions = " ".join(c.value for c in at.caption)
    assert "How to read it" in captions and "At 2 req/s each policy runs at" in captions
    assert "static" in captions and "%" in captions
    # the chart comes before the classic table: its subheader is the first one
    assert at.subheader[0].value == "Latency against load"


def test_article_section_shows_both_tables_and_why_they_differ():
    from batching.studies.article import ARTICLE_ROWS
    at = run_page(**FAST)
    assert_clean(at)
    assert "The article's table" in [h.value for h in at.subheader]
    labels = [r.label for r in ARTICLE_ROWS]
    tables = [d.value for d in at.dataframe if list(d.value.index) == labels]
    assert len(tables) == 2
    published, ours = tables
    assert published.loc["Static (b=32)", "Throughput (output tok/s)"] == 1200
    assert published.loc["+ Priority", "TTFT P50 (ms)"] == "60 high / 120 low"
    assert "Capacity (output tok/s)" in ours.columns
    assert ours.loc["Static (b=32)", "Capacity (output tok/s)"] < ours.loc["Continuous", "Capacity (output tok/s)"]
    notes = [m.value for m in at.markdown if "Why they differ" in m.value]
    assert len(notes) == 1 and all(f"**{label}:**" in notes[0] for label in labels)



def test_every_chart_download_carries_the_scenario_line():
    """Modebar PNG downloads carry the same scenario caption as exported figures, on every page."""
    import json

    for page, query in (("app.py", {}), ("pages/compare.py", {}), ("pages/capacity.py", {"policies": "chunked"})):
        at = run_page(page, n="200", **query)
        assert_clean(at)
        figs = chart_specs(at)
        assert figs, page
        for fig in figs:
            text = json.dumps(fig["layout"])
            assert "H100 SXM 80GB" in text and "Qwen2.5-72B" in text and "seed 0" in text, (page, fig["layout"].get("title"))
    cap = run_page("pages/capacity.py", n="200", policies="chunked")
    assert "rate searched" in json.dumps(chart_specs(cap)[0]["layout"])


def test_home_shows_p50_and_p99_ttft_and_tpot_per_class():
    at = run_page("app.py", n="200")
    assert_clean(at)
    frames = [d.value for d in at.dataframe]
    per_class = [f for f in frames if any("(P0) · TPOT P50" in str(c) for c in f.columns)]
    assert per_class, [list(f.columns) for f in frames]
    df = per_class[0]
    for cls in ("interactive chat (P0)", "batch analysis (P1)"):
        for stat in ("TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99"):
            assert any(c.startswith(cls) and stat in c for c in df.columns), (cls, stat, list(df.columns))
    assert "None" not in df.to_string() and all(" ms" in v or " s" in v or v == "unbounded" for v in df.iloc[0])
