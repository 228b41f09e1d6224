"""Home (strategy showdown) in AppTest: default render, URL round trip, clamping, bad input, reset."""
from __future__ import annotations

from uihelpers import FAST, assert_clean, chart, chart_specs, run_page, trace_types

from batching.studies.compare import COMPARE_COLUMNS
from batching.sim.policy import PRESETS


def test_default_render():
    at = run_page(**FAST)
    assert_clean(at)
    assert at.title[0].value == "Strategy showdown"
    table = at.dataframe[0].value
    assert list(table.index) == list(PRESETS)
    assert list(table.columns) == list(COMPARE_COLUMNS)
    # shares are shown in percent, TPOT in ms
    assert 0 < table.loc["continuous", "gpu_util"] <= 100
    assert table.loc["continuous", "tpot_p50_s"] > 1  # ms
    assert "highest capacity" in at.info[0].value
    assert len(chart_specs(at)) == 2
    assert trace_types(chart(at, "Strategy showdown")) == {"bar"}
    assert trace_types(chart(at, "P99 TTFT by priority class")) == {"bar"}
    # the per-class table has one column per class of the mixed workload
    assert at.dataframe[1].value.shape == (5, 2)
    # the sidebar shows the defaults of the issue
    assert at.selectbox(key="wid:gpu").value == "h100-sxm"
    assert at.selectbox(key="wid:model").value == "qwen2.5-72b"
    assert at.selectbox(key="wid:tp").value == 8
    assert at.selectbox(key="wid:precision").value == "bf16"
    assert at.selectbox(key="wid:workload").value == "mixed"
    assert at.number_input(key="wid:rate").value == 3.0
    assert at.number_input(key="wid:seed").value == 0
    assert len(at.get("download_button")) == 4


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
    assert at.dataframe[1].value.shape == (5, 1)
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
    assert len(chart_specs(at)) == 2
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
    assert at.number_input(key="wid:rate").value == 3.0
    assert at.number_input(key="wid:seed").value == 0
    assert at.number_input(key="wid:n").value == 2000
    assert "rate" not in at.query_params and "seed" not in at.query_params
