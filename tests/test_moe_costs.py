"""Measured MoE and MLA kernel costs (issue 23 items 4 and 7): aiconfigurator's tables load and interpolate, a
DeepSeek-V3 step is the table's experts plus the roofline of the rest, dense models are untouched, NVFP4 runs on
B200 only, and results say whether measured data covers them."""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware import kernel_tables as kt
from batching.sim.hardware.specs import BYTES_PER_WEIGHT, GPUS, MODELS, Deployment, Node, deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset

V3 = MODELS["deepseek-v3"]


def v3(gpu="h200-sxm", tp=8, precision="fp8", kv_dtype="auto"):
    return deployment(gpu, "deepseek-v3", tp, precision=precision, kv_dtype=kv_dtype)


# --- the tables ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_tables_load_with_every_preset_moe_shape(gpu):
    for key in ("deepseek-v3", "kimi-k2"):
        x, y = kt.moe_table(gpu, MODELS[key], "fp8", 8)
        assert x[0] == 1 and x[-1] == 16384 and np.all(np.diff(x) > 0)
        assert np.all(y > 0) and y[-1] > 10 * y[0]  # 16,384 tokens cost far more than one
    x, y = kt.moe_table(gpu, MODELS["qwen3-30b-a3b"], "bf16", 1)
    assert len(x) >= 20
    # nothing measured for Mixtral's experts, nor for FP8 Qwen3 split 8 ways
    assert kt.moe_table(gpu, MODELS["mixtral-8x7b"], "bf16", 8) is None
    assert kt.moe_table(gpu, MODELS["qwen3-30b-a3b"], "fp8", 8) is None


def test_moe_values_at_table_points_are_exact_and_interpolate_log_log():
    dep = v3()
    c = cm.cost_model(dep).coef
    x, y = kt.moe_table("h200", V3, "fp8", 8)
    frac = 58 / 61  # 3 of 61 layers are dense: the table's time is averaged over the layers
    assert c[cm.C_MOE_TAB_N] == len(x)
    for n, t in zip(x, y):
        assert cm.moe_table_s_nb(c, float(n)) == pytest.approx(t * frac, rel=1e-12)
    # H200 measured 0.1070 ms at 8 tokens and 0.1475 ms at 16 (aic_moe_h200.csv): 12 tokens sits on the log-log line
    i = list(x).index(8)
    mid = cm.moe_table_s_nb(c, 12.0)
    assert mid == pytest.approx(frac * math.exp((math.log(y[i]) + math.log(y[i + 1])) / 2
                                                 + (math.log(y[i + 1]) - math.log(y[i])) * (math.log(12) - math.log(
                                                     math.sqrt(8 * 16))) / math.log(2)), rel=1e-12)
    assert y[i] * frac < mid < y[i + 1] * frac
    # past the last point the time grows with the tokens
    assert cm.moe_table_s_nb(c, 2 * x[-1]) == pytest.approx(2 * y[-1] * frac, rel=1e-12)
    assert cm.moe_table_s_nb(c, 0.0) == 0.0


def test_mla_fits_are_slopes_of_the_measured_modules():
    """The decode fit is the slope over context: at 16 heads on H200 the module reads the BF16 latent (1,152 B per
    token and layer) at ~4.5 TB/s, 94 % of HBM; between two contexts of a large batch the table's own difference
    agrees within 5 %."""
    s = kt.mla_decode_s_per_token("h200", 16, "auto")
    t = kt._table("aic_mla_decode_h200.csv")
    r = t[(t.num_heads == 16) & (t.kv_cache_dtype == "bfloat16") & (t.batch_size == 256)].set_index("context_tokens")
    direct = (r.latency_ms[32768] - r.latency_ms[8192]) * 1e-3 / (256 * (32768 - 8192))
    assert s == pytest.approx(direct, rel=0.05)
    assert 1152 / s / 4.8e12 == pytest.approx(0.94, abs=0.02)
    # prefill: quadratic term per causal pair; the 32k-token prompt's time is at least its pair term
    p = kt.mla_prefill_s_per_pair("h200", 16, "auto")
    t = kt._table("aic_mla_prefill_h200.csv")
    big = t[(t.num_heads == 16) & (t.kv_cache_dtype == "bfloat16") & (t.batch_size == 1) & (t.prompt_tokens == 32768)]
    assert 0.5 < p * 32768 ** 2 / 2 / (big.latency_ms.iloc[0] * 1e-3) < 1.0
    assert kt.mla_decode_s_per_token("h200", 3, "auto") is None  # no such head count measured


# --- DeepSeek-V3's step ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 8, 64, 512, 4096])
def test_deepseek_step_is_the_table_plus_the_roofline_of_the_rest(n):
    dep = v3()
    cmod = cm.cost_model(dep)
    c = cmod.coef
    x, y = kt.moe_table("h200", V3, "fp8", 8)
    experts = float(np.exp(np.interp(np.log(n), np.log(x), np.log(y)))) * 58 / 61
    routed = 8 * V3.expert_params * 58 / 61
    # per layer, replicated on every GPU (not divided by TP): q_a_proj and kv_a_proj_with_mqa (FP8) and the router
    # (BF16), the router in 58 of the 61 layers
    replicated, router = 7168 * (1536 + 512 + 64), 7168 * 256 * 58 / 61
    flops = 2 * ((V3.active_linear_params_per_layer - routed - replicated - router) / 8 + replicated + router)
    lin = cm.linear_params_for(dep)
    t_c = n * flops / (GPUS["h200-sxm"].peak_fp8_flops * lin["eff_compute"])
    read = (V3.step_read_params_per_layer - replicated - router) * 1.0 / 8 + replicated * 1.0 + router * 2.0
    t_m = read / (GPUS["h200-sxm"].hbm_bw_Bps * lin["eff_memory"])
    rest = cm._pnorm_nb(t_c, t_m, lin["p"])
    ctx, work = n * 2000.0, n * 100.0
    b = cm.step_breakdown(cmod, n, work, ctx, n)
    assert b["linear"] == pytest.approx(61 * (rest + experts), rel=1e-9)
    assert b["decode attention"] == pytest.approx(61 * ctx * kt.mla_decode_s_per_token("h200", 16, "auto"), rel=1e-9)
    assert b["prompt attention"] == pytest.approx(61 * work * kt.mla_prefill_s_per_pair("h200", 16, "auto"), rel=1e-9)
    # the engine's token-time table is built from the same function
    tab = cm.token_time_table_nb(c, cmod.ar_log_bytes, cmod.ar_s, n + 1)
    assert tab[n] == pytest.approx(b["linear"] + b["elementwise"] + b["all-reduce"] + b["fixed overhead"], rel=1e-12)


def test_measured_experts_are_cheaper_than_uniform_routing_at_mid_batches():
    """At 64 tokens uniform routing touches 222 of 256 experts; the measured kernel (power-law routing) reads fewer:
    the measured step is faster than the roofline's, while at one token both are weight-read bound."""
    meas = cm.cost_model(v3())
    roof = cm.cost_model(Deployment(Node(replace(GPUS["h200-sxm"], name="H200 (roofline)"), 8, 8), V3, "fp8"))
    assert cm.linear_layer_s(meas, 64)[0] < cm.linear_layer_s(roof, 64)[0]
    assert cm.moe_experts_touched(256, 8, 64) == pytest.approx(222, abs=1)


# --- dense models unchanged ------------------------------------------------------------------------------------------
# step_time(n, attn_work = 300 n, decode_ctx = 1,000 n, n_lm = n) at n = 1, 37, 512, 4,096, computed with the cost model
# of the commit before the measured kernels (4defdf7)
DENSE_BEFORE = {
    ("h100-sxm", "llama-3.1-70b", 8, "bf16"): (0.011046048827626932, 0.013618635840928792, 0.03766803258927645,
                                               0.24936074475773887),
    ("h200-sxm", "qwen2.5-72b", 4, "fp8"): (0.009036439839101285, 0.011311915635177121, 0.03863766292887428,
                                            0.27910053687097897),
    ("b200", "llama-3.1-8b", 1, "bf16"): (0.005434861472578375, 0.006385016136286379, 0.021013938363441103,
                                          0.1415936775907707),
    ("h100-sxm", "llama-3.1-8b", 2, "fp8"): (0.004695526444186296, 0.0059283266159635166, 0.022671347709622085,
                                             0.15615199268653646),
}


@pytest.mark.parametrize("key", list(DENSE_BEFORE))
def test_dense_models_price_exactly_as_before(key):
    """The measured MoE/MLA tables leave a dense model's steps as they were. The engine profiles (merged after these
    values were taken) scale prompt and decode attention by their own measured factors: held at 1 here, the vLLM
    profile is the cost model of 4defdf7."""
    from dataclasses import replace as dc_replace

    from batching.sim.hardware.engines import ENGINES

    gpu, model, tp, prec = key
    before = dc_replace(ENGINES["vllm"], attn_eff=1.0, kv_eff=1.0)
    c = cm.cost_model(deployment(gpu, model, tp, precision=prec), engine=before)
    got = [cm.step_time(c, n, attn_work=n * 300.0, decode_ctx=n * 1000.0, n_lm=n) for n in (1, 37, 512, 4096)]
    # since then the LM head of an FP8 deployment runs at the BF16 peak (it stays a BF16 GEMM): by hand, the roofline
    # max(n x 2 x vocab x hidden / tp / (peak x e_c), vocab x hidden x 2 / tp / (bw x e_m)) at the BF16 peak instead
    # of the FP8 one; everything else as before
    dep = deployment(gpu, model, tp, precision=prec)
    m, lin = dep.model, cm.linear_params_for(dep)
    g = GPUS[gpu]
    def lm(n, peak):  # noqa: E306
        return max(n * 2 * m.vocab_size * m.hidden_size / tp / (peak * lin["eff_compute"]),
                   m.vocab_size * m.hidden_size * 2 / tp / (g.hbm_bw_Bps * lin["eff_memory"]))
    shift = [lm(n, g.peak_bf16_flops) - lm(n, g.peak_flops(prec)) for n in (1, 37, 512, 4096)]
    assert got == pytest.approx([b + d for b, d in zip(DENSE_BEFORE[key], shift)], rel=1e-12)
    assert (prec == "fp8") == (shift[-1] > 0)
    assert c.coef[cm.C_MOE_TAB_N] == 0 and not c.coef[cm.C_MOE_TAB_X:].any()
    assert kt.calibration_status_dep(deployment(gpu, model, tp, precision=prec)) == (True, "")


# --- NVFP4 (item 7) ---------------------------------------------------------------------------------------------------
def test_nvfp4_on_b200_uses_fp4_peak_block_scales_and_an_fp8_kv_cache():
    dep = v3("b200", precision="nvfp4")
    assert BYTES_PER_WEIGHT["nvfp4"] == 0.5625  # 4 bits + one FP8 scale per 16
    assert GPUS["b200"].peak_flops("nvfp4") == 9.0e15  # HGX B200: 144 PF sparse FP4 / 8 GPUs / 2
    assert dep.kv_bytes_per_element == 1.0 and dep.kv_bytes_per_token_per_gpu == 576 * 61
    fp8 = v3("b200")
    router = 58 * 7168 * 256 * 2.0  # BF16 in every precision (vLLM's GateLinear is unquantized)
    assert dep.linear_weight_bytes_per_gpu == pytest.approx((fp8.linear_weight_bytes_per_gpu - router) * 0.5625
                                                            + router)
    assert dep.kv_capacity_tokens > 2 * fp8.kv_capacity_tokens  # half the KV bytes and the weights' room
    c = cm.cost_model(dep).coef
    assert c[cm.C_PEAK_FLOPS] == 9.0e15 and c[cm.C_MOE_TAB_N] > 0  # B200's measured NVFP4 expert kernels
    assert kt.calibration_status_dep(dep) == (True, "")
    # a dense model in NVFP4 has no measured FP4 GEMM behind it
    ok, why = kt.calibration_status_dep(deployment("b200", "llama-3.1-70b", 8, precision="nvfp4"))
    assert not ok and "NVFP4" in why


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm", "a100-80gb"])
def test_nvfp4_is_refused_without_fp4_tensor_cores(gpu):
    with pytest.raises(ValueError, match=r"precision='nvfp4' is not supported on .*no FP4 tensor cores.*allowed: bf16"):
        deployment(gpu, "llama-3.1-8b", 1, precision="nvfp4")


def test_cli_refuses_nvfp4_on_h200_in_one_line():
    out = subprocess.run([sys.executable, "-m", "batching", "specs", "--model", "llama-3.1-8b", "--gpu", "h200-sxm",
                          "--tp", "1", "--precision", "nvfp4"], capture_output=True, text=True)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "precision='nvfp4' is not supported on H200 SXM 141GB" in out.stderr + out.stdout


# --- the calibrated flag ----------------------------------------------------------------------------------------------
def test_calibration_status_names_what_is_missing():
    assert kt.calibration_status_dep(v3()) == (True, "")
    ok, why = kt.calibration_status_dep(deployment("h100-sxm", "mixtral-8x7b", 8))
    assert not ok and "Mixtral-8x7B" in why and "grouped-expert" in why
    custom = Deployment(Node(replace(GPUS["h200-sxm"], name="my H200"), 8, 8), V3, "fp8")
    ok, why = kt.calibration_status_dep(custom)
    assert not ok and "my H200" in why


def test_summary_and_cli_carry_the_flag(tmp_path):
    wl = workload_preset("chat", 2.0, 6, 0)
    s = simulate(Scenario(deployment("h100-sxm", "mixtral-8x7b", 8), wl, PRESETS["chunked"])).summary()
    assert s["calibrated"] is False and "Mixtral-8x7B" in s["calibration_note"]
    s = simulate(Scenario(v3(), wl, PRESETS["chunked"])).summary()
    assert s["calibrated"] is True and s["calibration_note"] == ""
    out = subprocess.run([sys.executable, "-m", "batching", "run", "--model", "mixtral-8x7b", "--gpu", "h100-sxm",
                          "--requests", "4", "--prompt-tokens", "32", "--output-tokens", "4", "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "# not calibrated: no measured grouped-expert table for Mixtral-8x7B" in out.stdout
    assert '"calibrated": false' in (tmp_path / "s.json").read_text()


# --- expert parallelism and DP attention (item 4's layouts) -----------------------------------------------------------
def test_expert_parallel_uses_the_ep_table_and_keeps_memory():
    tp_dep, ep_dep = v3(), deployment("h200-sxm", "deepseek-v3", 8, precision="fp8", ep=8)
    assert ep_dep.weight_bytes_per_gpu == tp_dep.weight_bytes_per_gpu  # 32 whole experts a GPU = 1/8 of each
    x, y = kt.moe_table("h200", V3, "fp8", 1, 8)
    c = cm.cost_model(ep_dep).coef
    for n, t in zip(x, y):
        assert cm.moe_table_s_nb(c, float(n)) == pytest.approx(t * 58 / 61, rel=1e-12)
    assert kt.calibration_status_dep(ep_dep) == (True, "")


def test_dp_attention_holds_each_latent_once_and_replicates_attention_weights():
    tp_dep = v3()
    dp = deployment("h200-sxm", "deepseek-v3", 8, precision="fp8", dp_attention=True)
    assert dp.kv_bytes_per_token_per_gpu == 70_272 / 8
    # FP8; q_a_proj and kv_a_proj_with_mqa are whole on every GPU under TP attention already
    attn = 61 * (V3.attn_params_per_layer - 7168 * (1536 + 512 + 64)) * 1.0
    assert dp.weight_bytes_per_gpu == pytest.approx(tp_dep.weight_bytes_per_gpu + attn * 7 / 8)
    # less room for KV on each GPU (the replicated attention weights), but 8x the tokens per byte
    free = lambda d: d.kv_bytes_available_per_gpu  # noqa: E731
    assert dp.kv_capacity_tokens == pytest.approx(free(dp) / free(tp_dep) * 8 * tp_dep.kv_capacity_tokens, rel=1e-3)
    assert dp.kv_capacity_tokens > 6 * tp_dep.kv_capacity_tokens
    # costs: attention over every head on 1/8 of the sequences, one all-reduce's bytes per layer, all weights read
    ctp, cdp = cm.cost_model(tp_dep), cm.cost_model(dp)
    s128 = kt.mla_decode_s_per_token("h200", 128, "auto")
    b = cm.step_breakdown(cdp, 64, 0.0, 64 * 2000.0, 64)
    assert b["decode attention"] == pytest.approx(61 * 64 * 2000 * s128 / 8, rel=1e-9)
    assert cm.step_breakdown(cdp, 64)["all-reduce"] == pytest.approx(cm.step_breakdown(ctp, 64)["all-reduce"] / 2)
    assert cdp.coef[cm.C_LIN_BYTES] == pytest.approx(ctp.coef[cm.C_LIN_BYTES] + attn / 61 * 7 / 8)
    assert kt.calibration_status_dep(dp) == (True, "")


@pytest.mark.parametrize("kw, match", [
    (dict(model="deepseek-v3", ep=4), r"ep=4 is not allowed with tp=8; allowed: 1 .* or 8"),
    (dict(model="llama-3.1-70b", ep=8), r"ep=8 needs a mixture-of-experts model; Llama-3.1-70B is dense"),
    (dict(model="llama-3.1-70b", dp_attention=True), r"dp_attention needs a mixture-of-experts model"),
    (dict(model="qwen3-30b-a3b", tp=1, num_gpus=1, dp_attention=True), r"dp_attention needs tp > 1"),
    (dict(model="deepseek-v3", ep=0), r"ep=0 is not allowed; allowed: 1 or tp=8"),
])
def test_layout_validation_errors(kw, match):
    kw = {"gpu": "h200-sxm", "tp": 8, "precision": "fp8"} | kw
    with pytest.raises(ValueError, match=match):
        deployment(**kw)


def test_cli_layout_flags(tmp_path):
    out = subprocess.run([sys.executable, "-m", "batching", "specs", "--model", "deepseek-v3", "--gpu", "h200-sxm",
                          "--dp-attention", "--ep", "8", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json
    d = json.loads(out.stdout)
    assert d["ep"] == 8 and d["dp_attention"] is True and d["kv_bytes_per_token_per_gpu"] == 8784
    out = subprocess.run([sys.executable, "-m", "batching", "specs", "--model", "deepseek-v3", "--gpu", "h200-sxm",
                          "--ep", "2"], capture_output=True, text=True)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "ep=2 is not allowed with tp=8" in out.stderr


def test_sglang_kernels_price_the_experts_with_sglangs_table():
    x, y = kt.moe_table("h200", V3, "fp8", 8, 1, "sglang")
    c = cm.cost_model(v3(), kernels="sglang").coef
    assert cm.moe_table_s_nb(c, 64.0) == pytest.approx(float(np.interp(64, x, y)) * 58 / 61, rel=1e-12)
    assert not np.array_equal(y, kt.moe_table("h200", V3, "fp8", 8, 1, "vllm")[1])
    with pytest.raises(ValueError, match=r"kernels='trt' is unknown; allowed: vllm, sglang"):
        cm.cost_model(deployment("h100-sxm", "llama-3.1-8b", 1), kernels="trt")
