import numpy as np
import pytest

from batching.sim.hardware import calibration as cal
from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.engines import ENGINES
from batching.sim.hardware.specs import MODELS, deployment


@pytest.fixture(scope="module")
def model():
    return cm.cost_model(deployment())


def test_parts_sum_to_step_time(model):
    for args in [(1, 0, 1000, 1), (256, 0, 256 * 1500, 256), (2048, cm.prompt_attn_work(2048, 0), 0, 1),
                 (512, cm.prompt_attn_work(300, 1000), 20000, 200, 5000), (9000, 0, 0, 3)]:
        parts = cm.step_breakdown(model, *args)
        assert sum(parts.values()) == pytest.approx(cm.step_time(model, *args), rel=1e-12)


def test_token_table_matches_token_time(model):
    tab = cm.token_time_table_nb(model.coef, model.ar_log_bytes, model.ar_s, 5000)
    for n in (0, 1, 7, 255, 256, 257, 520, 4096, 4999):
        assert tab[n] == cm.token_time_nb(model.coef, model.ar_log_bytes, model.ar_s, float(n), 0.0)


def test_decode_is_memory_bound_and_flat_in_batch(model):
    # weights dominate a small decode batch: 1 and 32 sequences cost nearly the same
    t1 = cm.step_time(model, 1, 0, 1000, 1)
    t32 = cm.step_time(model, 32, 0, 32 * 1000, 32)
    assert t32 / t1 < 1.25
    # one token per layer reads the weights at the fitted efficiency: Qwen2.5-72B's layer is Llama-2-70B's
    # with a 3 % wider FFN, so its time is the measured TP 8 time scaled by the parameter ratio
    measured = cal.load_linear_ops().query("tp == 8 and num_tokens == 1").linear_ms.iloc[0] * 1e-3
    ratio = MODELS["qwen2.5-72b"].linear_params_per_layer / cal.CALIBRATION_MODEL.linear_params_per_layer
    lin = cm.step_breakdown(model, 1, 0, 1000, 1)["linear"] / 80
    assert lin == pytest.approx(measured * ratio, rel=0.10)


def test_prefill_is_compute_bound_and_linear_in_tokens(model):
    a = cm.step_breakdown(model, 4096)["linear"]
    b = cm.step_breakdown(model, 8192)["linear"]
    assert b == pytest.approx(2 * a, rel=0.05)  # the weight-read share fades as tokens grow
    d = deployment()
    flops = 2 * d.model.linear_params_per_layer * d.model.num_layers * 8192 / 8
    eff = flops / (989.4e12 * b)  # achieved share of the BF16 peak
    assert 0.6 < eff < 0.85


def test_linear_matches_the_measured_table_at_every_tp():
    for tp in (1, 2, 4, 8):
        costs = cm.cost_model(cal.calibration_deployment(tp))
        t = cal.load_linear_ops().query("tp == @tp")
        model = cm.linear_layer_s(costs, t.num_tokens.to_numpy())
        assert np.abs(model / (t.linear_ms.to_numpy() * 1e-3) - 1).max() <= 0.10


def test_attention_grows_quadratically_with_prompt(model):
    a = cm.step_breakdown(model, 1000, cm.prompt_attn_work(1000, 0))["prompt attention"]
    b = cm.step_breakdown(model, 2000, cm.prompt_attn_work(2000, 0))["prompt attention"]
    assert b == pytest.approx(4 * a)
    flops = 80 * 4 * 64 * 128 / 8 * cm.prompt_attn_work(1000, 0)
    # the default (vllm) engine profile's measured prompt-attention factor on the calibrated efficiency
    assert a == pytest.approx(flops / (989.4e12 * cm.ATTN_PREFILL_EFF * ENGINES["vllm"].attn_eff))


def test_decode_attention_reads_the_kv_cache(model):
    d = deployment()
    t = cm.step_breakdown(model, 10, 0, 10 * 2000, 10)["decode attention"]
    assert t == pytest.approx(20000 * d.kv_bytes_per_token_per_gpu
                              / (3.35e12 * cm.ATTN_DECODE_MEMORY_EFF * ENGINES["vllm"].kv_eff))


def test_allreduce_interpolates_the_measured_table(model):
    x, y = cm.allreduce_table("vllm_graph", 8)
    # at a measured size the model returns the measured median exactly
    n_tokens = np.exp(x[10]) / (8192 * 2)
    assert cm.allreduce_s_nb(model.coef, x, y, n_tokens) == pytest.approx(y[10])
    # between two sizes it stays between their times (log-log interpolation)
    mid = np.exp((x[10] + x[11]) / 2) / (8192 * 2)
    assert y[10] <= cm.allreduce_s_nb(model.coef, x, y, mid) <= y[11]
    assert cm.allreduce_s_nb(model.coef, x, y, mid) == pytest.approx(np.sqrt(y[10] * y[11]))
    # past the table it keeps growing with the payload
    big = np.exp(x[-1]) / (8192 * 2)
    assert cm.allreduce_s_nb(model.coef, x, y, 2 * big) == pytest.approx(2 * y[-1])


def test_allreduce_on_faster_nvlink_keeps_the_latency_floor():
    h100 = cm.cost_model(deployment(model="llama-3.1-70b"))
    b200 = cm.cost_model(deployment(gpu="b200", model="llama-3.1-70b"))
    sizes = [256, 1 << 20, 1 << 28]  # 256 B is the table's first size: its latency floor
    th, tb = cm.allreduce_s(h100, sizes), cm.allreduce_s(b200, sizes)
    floor = h100.ar_s[0]
    assert tb[0] == pytest.approx(th[0])  # latency-bound: no faster
    assert tb[2] - floor == pytest.approx((th[2] - floor) * 450 / 900)  # bandwidth-bound: NVLink5 halves it


@pytest.mark.parametrize("impl", list(cm.ALLREDUCE_IMPLS))
def test_every_allreduce_table_loads(impl):
    for tp in (2, 4, 8):
        x, y = cm.allreduce_table(impl, tp)
        assert len(x) >= 20 and np.all(np.diff(x) > 0) and np.all(y > 0)


def test_tp1_has_no_allreduce():
    m = cm.cost_model(deployment(model="llama-3.1-8b", tp=1))
    assert cm.step_breakdown(m, 512)["all-reduce"] == 0.0


def test_swap_time_is_bytes_over_pcie(model):
    d = deployment()
    t = cm.step_breakdown(model, 0, 0, 0, 0, 10000)["swap"]
    assert t == pytest.approx(10000 * d.kv_bytes_per_token_per_gpu / 55e9)


def test_fp8_halves_weight_bytes_and_moves_the_roofline():
    b16 = cm.cost_model(deployment())
    f8 = cm.cost_model(deployment(precision="fp8"))
    assert f8.coef[cm.C_LIN_BYTES] == b16.coef[cm.C_LIN_BYTES] / 2
    # both ends of the linear roofline halve: the weight reads and the FLOP rate (1978.9 vs 2 x 989.4 TF)
    assert cm.step_breakdown(f8, 1)["linear"] == pytest.approx(cm.step_breakdown(b16, 1)["linear"] / 2, rel=1e-4)
    assert cm.step_breakdown(f8, 8192)["linear"] == pytest.approx(cm.step_breakdown(b16, 8192)["linear"] / 2, rel=1e-4)
    # the ridge in FLOP/byte doubles; in tokens per step it stays where it was
    assert cm.ridge_intensity(f8) == pytest.approx(2 * cm.ridge_intensity(b16), rel=1e-4)
    assert cm.ridge_tokens(f8) == pytest.approx(cm.ridge_tokens(b16), rel=1e-4)
    # the LM head stays a BF16 GEMM (test_lm_head_is_a_bf16_gemm_in_every_precision)
    assert cm.step_breakdown(f8, 1, n_lm=1)["lm head"] > 0.9 * cm.step_breakdown(b16, 1, n_lm=1)["lm head"]


@pytest.mark.parametrize("precision, gpu", [("bf16", "h100-sxm"), ("fp8", "h100-sxm"), ("nvfp4", "b200")])
def test_lm_head_is_a_bf16_gemm_in_every_precision(precision, gpu):
    """Llama-3.1-70B's LM head (vocab 128,256 x hidden 8,192, BF16 in every checkpoint) at TP 4, by hand: one
    position reads its 128,256 x 8,192 x 2 / 4 bytes at the fitted weight-read bandwidth; 1,024 positions (a
    verification step of 64 sequences x 16, or a long prompt's logits) run 2 x 128,256 x 8,192 / 4 FLOPs each at
    the GPU's BF16 peak (989.4 TF on H100, 2,250 TF on B200) x the fitted compute efficiency, whatever the precision
    of the linear layers."""
    dep = deployment(gpu, "llama-3.1-70b", tp=4, num_gpus=4, precision=precision)
    costs = cm.cost_model(dep)
    lin = cm.linear_params_for(dep)
    peak_bf16 = {"h100-sxm": 989.4e12, "b200": 2250e12}[gpu]
    bw = {"h100-sxm": 3.35e12, "b200": 8.0e12}[gpu]
    one = 128256 * 8192 * 2 / 4 / (bw * lin["eff_memory"])
    many = 1024 * 2 * 128256 * 8192 / 4 / (peak_bf16 * lin["eff_compute"])
    assert many > one  # 1,024 positions are compute-bound
    assert cm.step_breakdown(costs, 1, n_lm=1)["lm head"] == pytest.approx(one, rel=1e-12)
    assert cm.step_breakdown(costs, 1024, n_lm=1024)["lm head"] == pytest.approx(many, rel=1e-12)


def test_fp8_kv_cache_halves_decode_reads():
    auto = cm.cost_model(deployment())
    f8 = cm.cost_model(deployment(kv_dtype="fp8"))
    assert cm.step_breakdown(f8, 64, 0, 64 * 4000, 64)["decode attention"] == pytest.approx(
        cm.step_breakdown(auto, 64, 0, 64 * 4000, 64)["decode attention"] / 2)


def test_ridge_tokens_is_where_compute_meets_weight_reads():
    costs = cm.cost_model(deployment(model="llama-3.1-70b", tp=4, num_gpus=4))
    c = costs.coef
    r = cm.ridge_tokens(costs)
    assert r * c[cm.C_LIN_FLOPS_TOK] / c[cm.C_LIN_FLOPS_RATE] == pytest.approx(c[cm.C_LIN_BYTES] / c[cm.C_LIN_BW])
    assert 150 < r < 500


def test_moe_uses_active_parameters_for_flops_and_touched_experts_for_reads():
    m = MODELS["mixtral-8x7b"]
    costs = cm.cost_model(deployment(model="mixtral-8x7b", tp=2))
    c = costs.coef
    # the router (4,096 x 8) runs whole on both GPUs (vLLM's ReplicatedLinear), the rest split
    router = 4096 * 8
    assert c[cm.C_LIN_FLOPS_TOK] == pytest.approx(2 * ((m.active_linear_params_per_layer - router) / 2 + router))
    assert c[cm.C_LIN_FLOPS_TOK] < 0.35 * 2 * m.linear_params_per_layer / 2
    # one token reads attention + router + 2 of the 8 experts; many tokens read all 8
    assert cm.moe_experts_touched(8, 2, 1) == pytest.approx(2)
    assert cm.moe_experts_touched(8, 2, 64) == pytest.approx(8, rel=1e-6)
    all_bytes = c[cm.C_LIN_BYTES] + 8 * c[cm.C_MOE_EXPERT_BYTES]
    two_bytes = c[cm.C_LIN_BYTES] + 2 * c[cm.C_MOE_EXPERT_BYTES]
    one = cm.linear_layer_s(costs, [1])[0]
    assert one == pytest.approx(two_bytes / c[cm.C_LIN_BW], rel=0.02)  # weight-read bound, 2 experts
    assert one < 0.4 * all_bytes / c[cm.C_LIN_BW]
    many = cm.linear_layer_s(costs, [256])[0]
    assert many >= all_bytes / c[cm.C_LIN_BW] * 0.99  # by 256 tokens every expert is read
    flops, nbytes = cm.useful_flops_bytes(c, np.array([1, 256]), np.zeros(2), np.zeros(2), np.zeros(2))
    assert flops[1] == pytest.approx(256 * flops[0])
    assert nbytes[0] == pytest.approx(32 * two_bytes + c[cm.C_LM_BYTES], rel=1e-6)
    assert nbytes[1] == pytest.approx(32 * all_bytes + c[cm.C_LM_BYTES], rel=1e-6)


def test_tile_factors_apply_only_to_measured_shapes_and_kernels():
    assert cm.tile_factors_apply(deployment())  # Qwen2.5-72B on H100
    assert cm.tile_factors_apply(deployment(gpu="h200-sxm", model="llama-3.1-70b"))
    assert not cm.tile_factors_apply(deployment(gpu="b200"))
    assert not cm.tile_factors_apply(deployment(model="llama-3.1-8b"))
    assert cm.cost_model(deployment(model="llama-3.1-8b")).coef[cm.C_LINQ_N] == 0


def test_other_shapes_interpolate_the_fit_by_shard_size():
    fit = cm.linear_fit()["tp"]
    # Llama-3.1-8B at TP 1 (218 M parameters per layer per GPU) lies between the 70B's shards at
    # TP 2 (428 M) and TP 4 (214 M)
    p = cm.linear_params_for(deployment(model="llama-3.1-8b", tp=1))
    lo, hi = sorted((fit["2"]["linear"]["eff_memory"], fit["4"]["linear"]["eff_memory"]))
    assert lo <= p["eff_memory"] <= hi
    # the calibration shapes get their own TP degree's fit
    assert cm.linear_params_for(deployment(model="llama-3.1-70b", tp=4, num_gpus=4))["p"] == fit["4"]["linear"]["p"]


def test_b200_is_faster_than_h100():
    h = cm.cost_model(deployment(model="llama-3.1-70b"))
    b = cm.cost_model(deployment(gpu="b200", model="llama-3.1-70b"))
    for args in [(1, 0, 1000, 1), (4096, cm.prompt_attn_work(4096, 0), 0, 1)]:
        assert cm.step_time(b, *args) < 0.75 * cm.step_time(h, *args)


def test_unknown_allreduce_is_an_error():
    with pytest.raises(ValueError, match="allreduce='mpi'"):
        cm.cost_model(deployment(), "mpi")
