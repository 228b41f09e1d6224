"""The calibration bounds over the shipped tables, the end-to-end check against the published
SGLang / vLLM runs, the shipped fit and docs being current, and the CLI pieces of issue 5."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batching.sim.hardware import calibration as cal
from batching.studies import end_to_end as e2e_check
from batching.cli import args as cli_args
from batching.cli import calibrate as cli_calibrate
from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.specs import GPUS, MODELS, gpu_to_dict, model_to_dict

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "batching" / "data" / "raw"  # the published measurements (batching/data/README.md)
LINEAR_BOUND = 0.10
ALLREDUCE_BOUND = 0.15


# --- linear layers: ±10 % at every measured token count and TP degree -----------------
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_linear_layers_within_10_percent_of_every_measured_median(tp):
    d = cal.op_comparison(tp, "linear")
    assert len(d) == 259
    worst = d.loc[d.error.abs().idxmax()]
    assert abs(worst.error) <= LINEAR_BOUND, f"TP {tp}: {worst.error:+.1%} at {worst.num_tokens} tokens"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_elementwise_ops_within_10_percent(tp):
    assert cal.op_comparison(tp, "elementwise").error.abs().max() <= LINEAR_BOUND


def test_the_smooth_part_alone_is_honestly_reported():
    s = cal.op_error_summary("linear")
    # the tile factor is what closes the gap: the p-norm alone misses single token counts by > 20 %
    assert (s.smooth_max_abs_error > 0.2).all()
    assert (s.smooth_median_abs_error < 0.06).all()
    # predicting token counts left out of the fit stays close for most of them
    assert (s.holdout_median_abs_error < 0.04).all() and (s.holdout_max_abs_error < 0.2).all()


def test_fit_is_physical():
    for tp, f in cm.linear_fit()["tp"].items():
        lin = f["linear"]
        assert 0.5 < lin["eff_compute"] < 1.0 and 0.5 < lin["eff_memory"] < 1.0 and lin["p"] >= 1.0
        assert len(lin["segment_bounds"]) <= cm.Q_MAX and lin["segment_bounds"][-1] == 4096
        assert 0.6 < min(lin["segment_factors"]) and max(lin["segment_factors"]) < 1.6  # up to +45 % at a new wave


def test_shipped_fit_is_the_fit_of_the_shipped_table():
    text = (ROOT / "batching" / "data" / cm.LINEAR_FIT_FILE).read_text()
    assert text == cal.fit_json(), "batching/data/linear_fit.json is stale: run python tools/extract_calibration.py"


def test_shipped_tables_derive_from_the_raw_measurements():
    spec = importlib.util.spec_from_file_location("extract_calibration", ROOT / "tools" / "extract_calibration.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules["extract_calibration"] = tool
    spec.loader.exec_module(tool)
    pd.testing.assert_frame_equal(tool.linear_ops(RAW).reset_index(drop=True), cal.load_linear_ops(),
                                  check_dtype=False, atol=1e-9)
    shipped = pd.read_csv(ROOT / "batching" / "data" / "h100_allreduce_vidur.csv")
    pd.testing.assert_frame_equal(tool.vidur_allreduce(RAW), shipped, check_dtype=False)
    shipped_raw = (ROOT / "batching" / "data" / "h100_allreduce.csv").read_bytes()
    assert (RAW / "h100_allreduce.csv").read_bytes() == shipped_raw


def test_linear_sum_is_the_four_ops():
    t = cal.load_linear_ops()
    ops = t[[f"{op}_ms" for op in cal.LINEAR_OPS]].sum(axis=1)
    assert np.allclose(ops, t.linear_ms, atol=2e-5)


# --- all-reduce: ±15 % of the chosen table, 2/4/8 GPUs --------------------------------
@pytest.mark.parametrize("impl", list(cm.ALLREDUCE_IMPLS))
def test_allreduce_within_15_percent_of_the_chosen_table(impl):
    d = cal.allreduce_comparison(impl)
    assert set(d.num_gpus) == {2, 4, 8}
    assert d.error.abs().max() <= ALLREDUCE_BOUND
    # between measured sizes the model stays between the neighbouring measurements
    for tp in (2, 4, 8):
        costs = cm.cost_model(cal.calibration_deployment(tp), impl)
        x, y = costs.ar_log_bytes, costs.ar_s
        mids = np.exp((x[1:] + x[:-1]) / 2)
        model = cm.allreduce_s(costs, mids)
        lo, hi = np.minimum(y[1:], y[:-1]), np.maximum(y[1:], y[:-1])
        assert np.all(model >= lo * (1 - 1e-12)) and np.all(model <= hi * (1 + 1e-12))


@pytest.mark.parametrize("impl", ["vllm_graph", "vllm_eager", "nccl", "trtllm"])
def test_allreduce_within_15_percent_of_every_raw_repeat(impl):
    raw = cal.load_allreduce_raw(impl)
    for tp, g in raw.groupby("num_gpus"):
        costs = cm.cost_model(cal.calibration_deployment(int(tp)), impl)
        model = cm.allreduce_s(costs, g.message_bytes.to_numpy())
        err = model / (g.latency_us.to_numpy() * 1e-6) - 1
        assert np.abs(err).max() <= ALLREDUCE_BOUND, (tp, float(np.abs(err).max()))


def test_vidur_table_is_binned_medians_of_its_rows():
    binned = pd.read_csv(ROOT / "batching" / "data" / "h100_allreduce_vidur.csv")
    assert set(binned.num_gpus) == {2, 4, 8}
    assert binned.samples.sum() == 3 * 994
    assert (binned.min_us <= binned.latency_us).all() and (binned.latency_us <= binned.max_us).all()


def test_allreduce_default_is_vllm_custom_allreduce_under_cuda_graphs():
    assert cm.DEFAULT_ALLREDUCE == "vllm_graph"
    assert cm.ALLREDUCE_IMPLS["vllm_graph"][1].endswith("vllm_graph")


# --- end to end: Llama-3.1-70B BF16, 4xH100 TP4, ShareGPT-like ---------------------------
@pytest.fixture(scope="module")
def e2e():
    return e2e_check.end_to_end()


def test_end_to_end_within_20_percent_of_a_published_engine(e2e):
    assert [r.metric.split(" (")[0] for r in e2e] == ["median TPOT at 4 req/s", "median TPOT at 8 req/s",
                                                      "offline output throughput"]
    for r in e2e:
        assert r.within, (f"{r.metric}: model {r.model:.4g} vs SGLang {r.sglang:.4g} ({r.error_sglang:+.1%}) and "
                          f"vLLM {r.vllm:.4g} ({r.error_vllm:+.1%})")


def test_end_to_end_moves_the_right_way(e2e):
    tpot4, tpot8, offline = (r.model for r in e2e)
    assert tpot4 < tpot8  # more load, more sequences per step, more prefills in between
    assert 3000 < offline < 5000


def test_sharegpt_preset_matches_the_published_lengths():
    from batching.sim.workload.requests import workload_preset

    reqs = workload_preset("sharegpt", 4.0, 5000, 0).generate()
    assert 215 < reqs.prompt_tokens.mean() < 240  # published runs of the sampler: 224-230
    assert 185 < reqs.output_tokens.mean() < 205  # the reference's offline run: 194
    assert reqs.prompt_tokens.min() >= 4 and reqs.prompt_tokens.max() <= 1024


# --- constants, docs, CLI --------------------------------------------------------------------
def test_every_constant_names_its_source():
    t = cal.constants_table()
    assert (t.source.str.len() > 10).all()
    for g in GPUS.values():
        assert any(t.name.str.startswith(g.name))


def test_report_writes_every_table(tmp_path, capsys):
    assert cli_calibrate.main(["calibrate", "--report", "--out", str(tmp_path), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "TP 8: max |error|" in out and "vllm_graph" in out and "offline output throughput" in out
    md = (tmp_path / "CALIBRATION.md").read_text()
    for heading in ("## Constants and sources", "## Linear layers", "## All-reduce", "## Attention",
                    "## Per-step overhead", "## End to end", "## Precision, GPUs, models", "## Custom models and GPUs"):
        assert heading in md
    assert (tmp_path / "calibration" / "linear_comparison.csv").is_file()
    lin = pd.read_csv(tmp_path / "calibration" / "linear_comparison.csv")
    assert len(lin) == 4 * 259 and lin.error.abs().max() <= LINEAR_BOUND


def test_committed_calibration_doc_is_current(e2e):
    doc = ROOT / "docs" / "CALIBRATION.md"
    ar = {impl: cal.allreduce_comparison(impl) for impl in cm.ALLREDUCE_IMPLS}
    expected = cli_calibrate.report_markdown(e2e_check.end_to_end_frame(e2e), ar)
    assert doc.read_text() == expected, "docs/CALIBRATION.md is stale: run python -m batching calibrate --report"


def _args(**kw):
    from types import SimpleNamespace

    base = dict(gpu="h100-sxm", model="qwen2.5-72b", tp=8, num_gpus=8, precision="bf16", kv_cache_tokens=None,
                model_json=None, gpu_json=None, kv_dtype="auto")
    return SimpleNamespace(**{**base, **kw})


def test_cli_custom_specs_and_fp8_kv(tmp_path):
    mj, gj = tmp_path / "model.json", tmp_path / "gpu.json"
    mj.write_text(json.dumps({**model_to_dict(MODELS["llama-3.1-70b"]), "name": "My-70B"}))
    gj.write_text(json.dumps({**gpu_to_dict(GPUS["h200-sxm"]), "name": "My GPU"}))
    dep = cli_args.deployment_from_args(_args(model_json=mj, gpu_json=gj, kv_dtype="fp8", tp=4))
    assert (dep.model.name, dep.node.gpu.name, dep.kv_dtype, dep.node.tp) == ("My-70B", "My GPU", "fp8", 4)
    base = cli_args.deployment_from_args(_args())
    assert cli_args.apply_custom_specs(_args(model_json=mj), base).model.name == "My-70B"
    # a custom model replaces a preset that would not fit before the memory check
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**model_to_dict(MODELS["llama-3.1-8b"]), "name": "Small"}))
    assert cli_args.deployment_from_args(_args(model_json=small, tp=1)).model.name == "Small"


def test_cli_custom_model_too_big_is_a_clear_error(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**model_to_dict(MODELS["llama-3.1-405b"]), "name": "Huge"}))
    with pytest.raises(ValueError, match="Huge in bf16 does not fit on H100 .* fits with precision fp8"):
        cli_args.deployment_from_args(_args(model_json=big))


def test_cli_run_with_a_model_too_big_exits_with_a_clear_error(capsys):
    from batching.cli.main import main

    assert main(["run", "--model", "llama-3.1-405b", "--requests", "10"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "fp8" in err


def test_calibrate_parser_registers(capsys):
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    cli_calibrate.add_parser(sub)
    args = p.parse_args(["calibrate", "--report", "--no-figures"])
    assert args.report and args.no_figures and args.func is cli_calibrate.cmd_calibrate
    run = argparse.ArgumentParser()
    cli_args.add_spec_arguments(run.add_argument_group("scenario"))
    a = run.parse_args(["--model-json", "m.json", "--gpu-json", "g.json", "--kv-dtype", "fp8", "--allreduce", "nccl"])
    assert (str(a.model_json), str(a.gpu_json), a.kv_dtype, a.allreduce) == ("m.json", "g.json", "fp8", "nccl")
    assert run.parse_args([]).allreduce is None and run.parse_args([]).engine == "vllm"  # the engine's all-reduce


# --- the page's figures -------------------------------------------------------------------
def test_breakdown_charts_stack_the_step_time():
    from batching.charts import costmodel as ccm
    from batching.sim.hardware.specs import deployment

    costs = cm.cost_model(deployment(model="llama-3.1-70b", tp=4, num_gpus=4))
    df = ccm.decode_breakdown(costs, 400, [1, 64, 256])
    parts = df.drop(columns="batch").sum(axis=1).to_numpy()
    steps = [cm.step_time(costs, b, 0, b * 400.0, b) for b in (1, 64, 256)]
    assert np.allclose(parts, steps)
    fig = ccm.step_vs_batch(costs, 400, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    total = sum(np.asarray(t.y) for t in fig.data)
    assert total[-1] == pytest.approx(cm.step_time(costs, 512, 0, 512 * 400.0, 512) * 1e3)
    assert fig.layout.yaxis.title.text == "Step time (ms)" and "tokens per step" in fig.layout.xaxis.title.text
    assert any("ridge" in a.text for a in fig.layout.annotations)
    fig = ccm.step_vs_prompt(costs, [64, 1024, 16384])
    assert fig.layout.title.text.startswith("Prefill step time") and "tokens" in fig.layout.xaxis.title.text
    fig = ccm.kv_memory(deployment(model="llama-3.1-70b", tp=4, num_gpus=4), 425)
    assert "concurrent requests" in fig.layout.title.text and fig.layout.xaxis.title.text == "GiB per GPU"


def test_calibration_charts_have_titles_and_units():
    from batching.charts import costmodel as ccm

    fig = ccm.op_calibration({8: cal.op_comparison(8)}, "Linear layers")
    assert "max |error|" in fig.layout.title.text and "µs" in fig.layout.yaxis.title.text
    fig = ccm.allreduce_calibration(cal.allreduce_comparison("nccl"), "nccl")
    assert "bytes" in fig.layout.xaxis2.title.text and "µs" in fig.layout.yaxis.title.text
