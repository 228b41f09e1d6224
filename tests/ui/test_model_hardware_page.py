"""Model and hardware page in AppTest: every section renders as the first page a session opens,
charts carry titles, units and captions, FP8 KV doubles the capacity, the custom-spec form
prices a user's model, and a model too big for the node is a clear error."""
from __future__ import annotations

import pytest
from uihelpers import assert_clean, chart, chart_titles, metric_value, run_page, data_traces

PAGE = "pages/model_and_hardware.py"
FAST = {"n": "200"}


@pytest.fixture(scope="module")
def default_page():
    at = run_page(PAGE, **FAST)
    assert_clean(at)
    return at


def test_renders_every_section(default_page):
    at = default_page
    assert at.title[0].value == "Model and hardware"
    assert [h.value for h in at.subheader] == ["Where a step's time goes", "Engine profile", "Your own model or GPU",
                                               "Calibration: model vs measurement", "Constants and sources"]
    batch = chart(at, "Decode step time vs batch size")
    names = {t["name"] for t in batch["data"]}
    assert {"linear layers", "attention", "all-reduce", "fixed overhead"} <= names
    assert all(t.get("stackgroup") == "one" for t in data_traces(batch))
    assert "ms" in batch["layout"]["yaxis"]["title"]["text"]
    assert "ridge" in " ".join(a["text"] for a in batch["layout"]["annotations"])
    prompt = chart(at, "Prefill step time vs prompt length")
    assert "tokens" in prompt["layout"]["xaxis"]["title"]["text"]
    assert "concurrent requests" in chart(at, "Memory per GPU and KV capacity")["layout"]["title"]["text"]
    for title in ("Linear layers: measured vs model", "Element-wise ops: measured vs model",
                  "All-reduce 'vllm_graph'", "End to end"):
        chart(at, title)
    # one caption per chart at least (each chart is followed by its reading guide)
    assert len(at.caption) >= len(chart_titles(at))
    assert metric_value(at, "KV cache (tokens)") > 100_000
    assert metric_value(at, "Ridge (linear layers)") > 50


def test_linear_calibration_error_shown_within_bound(default_page):
    title = chart(default_page, "Linear layers: measured vs model")["layout"]["title"]["text"]
    worst = float(title.split("max |error| ")[1].split("%")[0])
    assert worst <= 10.0


def test_constants_table_has_sources(default_page):
    frames = [df.value for df in default_page.dataframe]
    consts = [f for f in frames if "source" in f.columns][0]
    assert (consts["source"].str.len() > 0).all()
    assert {"fixed overhead per step", "prompt attention efficiency (of BF16 peak)"} <= set(consts["name"])


def test_fp8_kv_doubles_capacity():
    at = run_page(PAGE, **FAST)
    before = metric_value(at, "KV cache (tokens)")
    at.segmented_control(key="mh_kv_dtype").set_value("fp8").run()
    assert_clean(at)
    assert metric_value(at, "KV cache (tokens)") == pytest.approx(2 * before, rel=0.01)


def test_model_too_big_is_a_clear_error():
    at = run_page(PAGE, model="llama-3.1-405b", **FAST)
    assert not at.exception
    text = " ".join(e.value for e in at.error)
    assert "does not fit" in text and "fp8" in text


def test_custom_model_form_prices_a_users_model():
    at = run_page(PAGE, **FAST)
    name = [t for t in at.text_input if t.label == "Model name"][0]
    name.set_value("Tiny")
    [n for n in at.number_input if n.label == "Layers"][0].set_value(4)
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert_clean(at)
    assert any("Tiny on H100 SXM 80GB" in t for t in chart_titles(at))
    labels = [b.proto.label for b in at.get("download_button")]
    assert {"Model JSON (--model-json)", "GPU JSON (--gpu-json)"} <= set(labels)
    # each breakdown (the sidebar's and the custom one) exports CSV, JSON, HTML, PNG and SVG (issue 24 item 11)
    for label in ("Breakdown (CSV)", "Data (JSON)", "Report (HTML)", "Charts (PNG)", "Charts (SVG)"):
        assert labels.count(label) == 2, (label, labels)


def test_custom_model_too_big_is_a_clear_error():
    at = run_page(PAGE, **FAST)
    [n for n in at.number_input if n.label == "Layers"][0].set_value(1000)
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert not at.exception
    assert any("does not fit" in e.value for e in at.error)


def test_custom_model_follows_the_kv_dtype_knob():
    """The KV dtype knob sits in the step section's fragment; the custom model's section below it is priced with
    it too (a move reruns the page once a model is entered): FP8 doubles the custom model's KV cache as well."""
    at = run_page(PAGE, **FAST)
    [t for t in at.text_input if t.label == "Model name"][0].set_value("Tiny")
    [n for n in at.number_input if n.label == "Layers"][0].set_value(4)
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert_clean(at)
    kv = [m for m in at.metric if m.label == "KV cache (tokens)"]
    assert len(kv) == 2  # the sidebar's deployment, then the custom model
    before = [float(m.value.replace(",", "")) for m in kv]
    at.segmented_control(key="mh_kv_dtype").set_value("fp8").run()
    assert_clean(at)
    after = [float(m.value.replace(",", "")) for m in at.metric if m.label == "KV cache (tokens)"]
    assert after == pytest.approx([2 * b for b in before], rel=0.01)
    assert any("Tiny on H100 SXM 80GB" in t for t in chart_titles(at))
    assert "mh_knobs_moved" not in at.session_state
