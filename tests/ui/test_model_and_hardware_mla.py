"""Model and hardware page with MLA models (issue 13, section 3): the figures of ``python -m batching specs``
(parameters, active parameters, KV bytes per token, KV capacity) for DeepSeek-V3 on 8xH200 in FP8, the error that
names the GPUs it fits on for 8xH100, and the custom form keeping a model's latent attention."""
from __future__ import annotations

from uihelpers import assert_clean, chart_titles, metric_value, run_page

PAGE = "pages/model_and_hardware.py"
V3_H200 = {"n": "200", "model": "deepseek-v3", "gpu": "h200-sxm", "precision": "fp8"}


def test_deepseek_v3_figures_match_the_specs_command():
    from batching.sim.hardware.specs import deployment, deployment_figures

    at = run_page(PAGE, **V3_H200)
    assert_clean(at)
    f = deployment_figures(deployment("h200-sxm", "deepseek-v3", 8, precision="fp8"))
    assert metric_value(at, "Parameters") == 671.0
    assert metric_value(at, "Active parameters") == round(f["active_parameters"] / 1e9, 1) == 37.6
    assert metric_value(at, "KV per token (MLA)") == 70_272
    assert metric_value(at, "KV cache (tokens)") == f["kv_capacity_tokens"] == 688_944
    assert metric_value(at, "KV cache per node (tokens)") == 688_944
    assert metric_value(at, "Weights per GPU") == 79.3  # q_a_proj, kv_a_proj_with_mqa and the router whole per GPU
    help_text = [m for m in at.metric if m.label == "KV per token (MLA)"][0].help
    assert "(512 + 64) × 61 layers × 2 B" in help_text


def test_gqa_model_shows_its_kv_heads():
    at = run_page(PAGE, n="200")
    assert_clean(at)
    assert metric_value(at, "KV per token (GQA)") == 327_680
    assert metric_value(at, "Parameters") == 72.7 and metric_value(at, "Active parameters") == 72.7


def test_deepseek_v3_on_8xh100_names_the_gpus_it_fits_on():
    at = run_page(PAGE, **(V3_H200 | {"gpu": "h100-sxm"}))
    assert not at.exception
    text = " ".join(e.value for e in at.error)
    assert "does not fit on H100" in text and "8x H200 SXM 141GB in fp8" in text and "B200" in text


def test_custom_form_keeps_latent_attention():
    at = run_page(PAGE, **V3_H200)
    assert [n for n in at.number_input if n.label == "KV LoRA rank"][0].value == 512
    [t for t in at.text_input if t.label == "Model name"][0].set_value("My-V3")
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert_clean(at)
    assert any("My-V3 on H200 SXM 141GB" in t for t in chart_titles(at))
    kv = [m for m in at.metric if m.label == "KV per token (MLA)"]
    assert len(kv) == 2 and all(m.value == "70,272 B" for m in kv)
