"""The cost model of multi-head latent attention and DeepSeek's mixture of experts (issue 13, section 3): MLA reduces
to the same coefficients the engine reads (per-token KV bytes and an effective decode rate, prompt attention FLOPs
per pair), and a whole simulation of DeepSeek-V3 on 8xH200 in FP8 runs and conserves tokens."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.engines import ENGINES
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node, deployment
from batching.sim.workload.requests import workload_preset

V3 = MODELS["deepseek-v3"]


def v3(gpu="h200-sxm", tp=8, kv_dtype="auto", measured=False):
    """DeepSeek-V3 in FP8. ``measured=False``: on a copy of the preset GPU under another name, which has no measured
    MLA/MoE kernel tables, so the roofline these tests describe prices it (tests/test_moe_costs.py: the tables)."""
    g = GPUS[gpu] if measured else replace(GPUS[gpu], name=GPUS[gpu].name[:40] + " (roofline)")
    return Deployment(Node(g, 8, tp), V3, "fp8", kv_dtype)


def test_prompt_attention_uses_the_non_absorbed_head_shapes():
    c = cm.cost_model(v3()).coef
    # QK^T over 128 + 64, PV over 128, per pair and head, 16 heads per GPU
    assert c[cm.C_ATTN_FLOPS_COEF] == 2 * 128 * (192 + 128) / 8 == 10_240
    # GQA models keep 4 * heads * head_dim
    q = cm.cost_model(deployment(model="qwen2.5-72b")).coef
    assert q[cm.C_ATTN_FLOPS_COEF] == 4 * 64 * 128 / 8


def test_decode_reads_the_latent_at_tp8_memory_bound():
    for gpu in ("h200-sxm", "b200"):
        c = cm.cost_model(v3(gpu)).coef
        assert c[cm.C_KV_BYTES_TOK_LAYER] == 576 * 2  # the whole latent on every rank
        assert c[cm.C_KV_BW] == GPUS[gpu].hbm_bw_Bps * cm.ATTN_DECODE_MEMORY_EFF  # 16 heads: memory-bound
    assert cm.decode_attn_flops_per_token(V3) == 128 * 2 * (2 * 512 + 64) == 278_528


def test_decode_turns_compute_bound_with_many_heads_per_gpu():
    # TP 1 (128 heads on one GPU): 278,528 FLOPs per cached token and layer against 1,152 bytes
    c = cm.cost_model(v3("b200", tp=1)).coef
    t_flops = 278_528 / (GPUS["b200"].peak_bf16_flops * cm.MLA_DECODE_COMPUTE_EFF)
    assert c[cm.C_KV_BYTES_TOK_LAYER] / c[cm.C_KV_BW] == pytest.approx(t_flops)
    assert t_flops > 1152 / (GPUS["b200"].hbm_bw_Bps * cm.ATTN_DECODE_MEMORY_EFF)


def test_fp8_kv_halves_memory_bound_decode_attention():
    ctx = 64 * 4000
    a = cm.step_breakdown(cm.cost_model(v3()), 64, 0, ctx, 64)["decode attention"]
    b = cm.step_breakdown(cm.cost_model(v3(kv_dtype="fp8")), 64, 0, ctx, 64)["decode attention"]
    assert b == pytest.approx(a / 2)
    # 61 layers x 4,000 tokens x 64 sequences x 1,152 B at 70 % of 4.8 TB/s
    assert a == pytest.approx(61 * ctx * 1152 / (4.8e12 * 0.7))


def test_tp_replication_eats_mlas_advantage_per_gpu():
    """MLA's cache is 7.3x smaller than Llama-3.1-405B's GQA cache for the whole model, but every TP rank holds
    the whole latent while GQA splits its 8 KV heads over 8 ranks: per GPU at TP 8 MLA holds (and decode
    reads) slightly more per token (70,272 B against 64,512 B), the reason SGLang serves DeepSeek with DP
    attention."""
    gqa_dep = deployment("h200-sxm", "llama-3.1-405b", 8, precision="fp8")
    assert gqa_dep.kv_bytes_per_token / v3().kv_bytes_per_token == pytest.approx(7.34, abs=0.01)
    assert gqa_dep.kv_bytes_per_token_per_gpu == 64_512 < v3().kv_bytes_per_token_per_gpu == 70_272
    ctx = 64 * 4000
    mla = cm.step_breakdown(cm.cost_model(v3()), 64, 0, ctx, 64)["decode attention"]
    gqa = cm.step_breakdown(cm.cost_model(gqa_dep), 64, 0, ctx, 64)["decode attention"]
    # the GQA kernels run at the default (vllm) profile's measured decode factor; MLA's latent at the calibrated one
    assert mla / gqa == pytest.approx((61 * 1152) / (126 * 512) * ENGINES["vllm"].kv_eff)


def test_moe_weight_reads_add_up_to_the_weights_in_memory():
    """A step touching every expert reads every linear weight once: per layer, what every step reads (attention,
    routers, the shared expert, dense layers' MLPs) plus all routed experts, times the layers."""
    dep = v3()
    c = cm.cost_model(dep).coef
    every = c[cm.C_LAYERS] * (c[cm.C_LIN_BYTES] + c[cm.C_MOE_EXPERTS] * c[cm.C_MOE_EXPERT_BYTES])
    assert every == pytest.approx(dep.linear_weight_bytes_per_gpu, rel=1e-12)
    # a one-token step reads 8 routed experts in each of the 58 layers with experts; by hand from config.json, what
    # TP splits over 8 GPUs (FP8) and what every GPU holds whole: q_a_proj and kv_a_proj_with_mqa (FP8) and the
    # router (BF16)
    one = c[cm.C_LAYERS] * (c[cm.C_LIN_BYTES] + cm.moe_experts_touched(256, 8, 1) * c[cm.C_MOE_EXPERT_BYTES])
    expert, replicated, router = 3 * 7168 * 2048, 7168 * 1536 + 7168 * (512 + 64), 7168 * 256
    split = 61 * (V3.attn_params_per_layer - replicated) + 58 * 9 * expert + 3 * 3 * 7168 * 18432
    assert one == pytest.approx(split / 8 + 61 * replicated + 58 * router * 2, rel=1e-9)
    # FLOPs per token per GPU: the active linear parameters, the replicated ones whole on every GPU
    active = V3.active_params - V3.non_linear_params
    whole = 61 * replicated + 58 * router
    assert c[cm.C_LIN_FLOPS_TOK] * c[cm.C_LAYERS] == pytest.approx(2 * ((active - whole) / 8 + whole), rel=1e-12)


def test_replicated_layers_flops_are_not_divided_by_tp():
    """Per token and GPU the replicated layers add 7/8 of 2 x (61 x 15.1 M + 58 x 1.8 M) FLOPs to what TP splits."""
    dep = v3()
    c = cm.cost_model(dep).coef
    whole = 61 * (7168 * 1536 + 7168 * 576) + 58 * 7168 * 256
    split_only = 2 * (V3.active_params - V3.non_linear_params) / 8
    assert c[cm.C_LIN_FLOPS_TOK] * c[cm.C_LAYERS] - split_only == pytest.approx(2 * whole * 7 / 8, rel=1e-12)
    # under DP attention each GPU runs the whole attention for its own tokens: the replicated attention layers are
    # not counted twice, the routers (run on every gathered token) still are
    dp = cm.cost_model(replace(dep, dp_attention=True)).coef
    assert dp[cm.C_LIN_FLOPS_TOK] * dp[cm.C_LAYERS] - split_only == pytest.approx(2 * 58 * 7168 * 256 * 7 / 8,
                                                                                  rel=1e-12)


def test_existing_moe_coefficients_are_unchanged():
    for key in ("mixtral-8x7b", "qwen3-30b-a3b"):
        dep = deployment("h100-sxm", key, 2)
        m, c = dep.model, cm.cost_model(dep).coef
        # the router replicated on both GPUs (vLLM's ReplicatedLinear), the attention split
        assert c[cm.C_LIN_BYTES] == m.attn_params_per_layer * 2.0 / 2 + m.router_params_per_layer * 2.0
        assert c[cm.C_MOE_EXPERT_BYTES] == m.expert_params * 2.0 / 2
        # the default (vllm) engine profile's measured decode-attention factor (GQA kernels)
        assert c[cm.C_KV_BW] == GPUS["h100-sxm"].hbm_bw_Bps * cm.ATTN_DECODE_MEMORY_EFF * ENGINES["vllm"].kv_eff


def test_deepseek_v3_on_8xh200_fp8_end_to_end():
    sc = Scenario(deployment("h200-sxm", "deepseek-v3", 8, precision="fp8"), workload_preset("mixed", 4.0, 200, 0),
                  PRESETS["continuous"])
    res = simulate(sc)
    s = res.summary()
    req, steps = res.requests, res.steps
    assert s["num_requests"] == 200 == len(req)
    # every output token produced once: the first by the prefill step, the rest by decode steps
    assert req.output_tokens.sum() == steps.decode_tokens.sum() + (req.output_tokens >= 1).sum()
    # every prompt token computed or taken from the prefix cache
    cached = steps.cached_tokens.sum() if "cached_tokens" in steps else 0
    assert steps.prefill_tokens.sum() + cached >= req.prompt_tokens.sum()
    wall = req.release_s.max() - req.arrival_s.min()
    assert s["throughput_output_tok_s"] * wall == pytest.approx(req.output_tokens.sum())
    assert math.isfinite(s["throughput_output_tok_s"]) and s["throughput_output_tok_s"] > 0
    assert steps.kv_blocks.max() <= sc.deployment.kv_capacity_blocks
    assert 0 < s["tpot_p50_s"] < 1 and 0 < s["mbu"] < 1
