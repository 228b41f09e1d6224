"""Multi-head latent attention and DeepSeek's mixture of experts (issue 13, section 3): KV bytes per token, the
published parameter totals, weights per GPU, what fits where (and the error naming what does), and Hugging Face
configs of DeepSeek-V3 and Kimi-K2 loading as MLA models."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from batching.sim.hardware.specs import (GIB, MODELS, Deployment, Node, GPUS, attention_kind, deployment, deployment_figures,
                                model_from_dict, model_to_dict, parse_json_spec)

V3, K2 = MODELS["deepseek-v3"], MODELS["kimi-k2"]

# deepseek-ai/DeepSeek-V3 config.json (the fields that shape the model, as published; plus a few others it has)
DEEPSEEK_V3_HF = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "v_head_dim": 128, "vocab_size": 129280,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}
# moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3's architecture with 384 experts, 64 heads, 1 dense layer)
KIMI_K2_HF = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "attention_bias": False,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 131072, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 163840,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# deepseek-ai/DeepSeek-V2-Lite config.json: no query bottleneck (q_lora_rank null), 2 shared experts
DEEPSEEK_V2_LITE_HF = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "first_k_dense_replace": 1,
    "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
    "tie_word_embeddings": False,
}


# --- KV cache ----------------------------------------------------------------------------------
def test_mla_kv_bytes_per_token_is_the_latent_and_the_rope_key():
    assert V3.kv_bytes_per_token() == (512 + 64) * 61 * 2 == 70_272  # DeepSeek-V3 in BF16
    assert V3.kv_bytes_per_token(1.0) == 35_136  # FP8 KV cache
    assert K2.kv_bytes_per_token() == 70_272  # same latent, half the heads: MLA's cache does not depend on heads
    assert MODELS["qwen2.5-72b"].kv_bytes_per_token() == 327_680  # GQA, for scale: 4.7x DeepSeek-V3's
    assert attention_kind(V3) == "MLA" and attention_kind(MODELS["qwen2.5-72b"]) == "GQA"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_tp_rank_holds_the_whole_latent(tp):
    dep = Deployment(Node(GPUS["b200"], 8, tp), V3, "fp8")
    assert dep.kv_bytes_per_token_per_gpu == dep.kv_bytes_per_token == 70_272
    assert replace(dep, kv_dtype="fp8").kv_bytes_per_token_per_gpu == 35_136


# --- parameter counts ---------------------------------------------------------------------------
def test_mla_attention_parameters_per_layer_from_config():
    # q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj of DeepseekV3Attention with the config's shapes
    q_a, q_b = 7168 * 1536, 1536 * 128 * (128 + 64)
    kv_a, kv_b = 7168 * (512 + 64), 512 * 128 * (128 + 128)
    o = 128 * 128 * 7168
    assert V3.attn_params_per_layer == q_a + q_b + kv_a + kv_b + o == 187_105_280
    assert K2.attn_params_per_layer == q_a + 1536 * 64 * 192 + kv_a + 512 * 64 * 256 + 64 * 128 * 7168


def test_deepseek_v3_totals_match_the_published_ones():
    # DeepSeek-V3 technical report: 671B total, 37B activated; README_WEIGHTS.md: 36.6B activated without the
    # input embedding lookup (the MTP module not counted)
    assert V3.num_params == pytest.approx(671e9, rel=0.01)
    assert V3.active_params == pytest.approx(37e9, rel=0.02)
    assert V3.active_params - V3.embedding_params == pytest.approx(36.6e9, rel=0.01)
    # by hand: 61 attention blocks, 58 layers of 256 + 1 shared experts and a router, 3 dense MLPs
    expert = 3 * 7168 * 2048
    by_hand = (61 * 187_105_280 + 58 * (257 * expert + 7168 * 256) + 3 * 3 * 7168 * 18432
               + 2 * 129280 * 7168 + (2 * 61 + 1) * 7168 + 61 * (1536 + 512))
    assert V3.num_params == by_hand


def test_kimi_k2_totals_match_the_published_ones():
    # Moonshot: "1 trillion total parameters, 32 billion activated"; the release's safetensors hold ~1.03-1.04T
    assert K2.num_params == pytest.approx(1.04e12, rel=0.02) and K2.num_params > 1e12
    assert K2.active_params - K2.embedding_params == pytest.approx(32e9, rel=0.02)
    # with the input embedding counted (as Mixtral's and Qwen3's figures are) it is 2.7 % above the round 32B
    assert K2.active_params == pytest.approx(32e9, rel=0.03)


def test_existing_presets_keep_their_parameter_counts():
    assert MODELS["mixtral-8x7b"].num_params == 46_702_792_704
    assert MODELS["mixtral-8x7b"].active_params == 12_879_925_248
    assert MODELS["qwen3-30b-a3b"].mlp_params_per_layer == 128 * 3 * 2048 * 768 + 2048 * 128
    assert isinstance(MODELS["qwen2.5-72b"].linear_params_per_layer, int)


# --- weights and fit ----------------------------------------------------------------------------
# DeepSeek-V3 config.json by hand: per layer q_a_proj 7168 x 1536 and kv_a_proj_with_mqa 7168 x (512 + 64), which
# every TP rank holds whole (vLLM's and SGLang's ReplicatedLinear), and in each of the 58 layers with experts a
# router of 7168 x 256, replicated and unquantized (vLLM's GateLinear, quant_config=None: BF16)
V3_REPLICATED = 7168 * 1536 + 7168 * (512 + 64)
V3_ROUTER = 7168 * 256


def test_deepseek_v3_fp8_weights_per_gpu():
    dep = deployment("h200-sxm", "deepseek-v3", 8, precision="fp8")
    assert V3.replicated_attn_params_per_layer == V3_REPLICATED == 15_138_816
    # FP8 linear layers split over 8 GPUs, the replicated ones whole, the routers whole in BF16; BF16 embeddings,
    # LM head and norms split
    linear = V3.num_params - V3.non_linear_params
    split = linear - 61 * V3_REPLICATED - 58 * V3_ROUTER
    by_hand = split / 8 + 61 * V3_REPLICATED + 2 * 58 * V3_ROUTER + 2 * V3.non_linear_params / 8
    assert dep.weight_bytes_per_gpu == pytest.approx(by_hand, rel=1e-12)
    assert dep.weight_bytes_per_gpu / GIB == pytest.approx(79.27, abs=0.01)
    # 0.94 GiB more than every layer split eight ways: 7/8 of the 61 x 15.1 M replicated FP8 weights (0.75 GiB) and
    # of the 58 routers, at 2 bytes (0.19 GiB)
    assert (dep.weight_bytes_per_gpu - (linear + 2 * V3.non_linear_params) / 8) / GIB == pytest.approx(0.938, abs=0.001)


def test_replicated_layers_do_not_shrink_with_tp():
    """Going from TP 4 to TP 8 halves what tensor parallelism splits; the replicated layers stay whole per GPU."""
    four, eight = (deployment("b200", "deepseek-v3", tp, precision="fp8") for tp in (4, 8))
    whole = 61 * V3_REPLICATED + 2 * 58 * V3_ROUTER
    assert four.linear_weight_bytes_per_gpu - whole == pytest.approx(2 * (eight.linear_weight_bytes_per_gpu - whole))
    # a model without MLA or experts keeps every linear layer split
    llama = deployment("h100-sxm", "llama-3.1-70b", 8)
    assert llama.linear_weight_bytes_per_gpu == llama.model.num_layers * llama.model.linear_params_per_layer * 2 / 8


def test_deepseek_v3_fp8_does_not_fit_8xh100_and_says_what_fits():
    with pytest.raises(ValueError) as info:
        deployment("h100-sxm", "deepseek-v3", 8, precision="fp8")
    msg = str(info.value)
    assert "DeepSeek-V3 in fp8 does not fit on H100 SXM 80GB with tp=8" in msg
    assert "81.3 GiB per GPU" in msg and "71.7 GiB are usable" in msg
    assert "it fits on 8x H200 SXM 141GB in fp8 with tp=8 or 8x B200 180GB in fp8 with tp=4" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("gpu, capacity", [("h200-sxm", 688_944), ("b200", 1_220_592)])
def test_deepseek_v3_fp8_fits_8xh200_and_8xb200(gpu, capacity):
    dep = deployment(gpu, "deepseek-v3", 8, precision="fp8")
    assert dep.kv_capacity_tokens == capacity
    free = GPUS[gpu].memory_bytes * 0.9 - dep.weight_bytes_per_gpu - 2 * GIB
    assert capacity == int(free // (70_272 * 16)) * 16
    fp8_kv = deployment(gpu, "deepseek-v3", 8, precision="fp8", kv_dtype="fp8")
    assert fp8_kv.kv_capacity_tokens == pytest.approx(2 * capacity, abs=16)


def test_deepseek_v3_bf16_on_8xh200_points_to_fp8():
    with pytest.raises(ValueError, match=r"DeepSeek-V3 in bf16 does not fit on H200 .* it fits with precision fp8"):
        deployment("h200-sxm", "deepseek-v3", 8, precision="bf16")


def test_kimi_k2_fits_8xh200_and_8xb200_in_fp8_only():
    with pytest.raises(ValueError, match="Kimi-K2 in fp8 does not fit on H100"):
        deployment("h100-sxm", "kimi-k2", 8, precision="fp8")
    h200 = deployment("h200-sxm", "kimi-k2", 8, precision="fp8")
    b200 = deployment("b200", "kimi-k2", 8, precision="fp8")
    assert h200.weight_bytes_per_gpu / GIB == pytest.approx(120.80, abs=0.01)
    assert h200.kv_capacity_tokens == 54_336 and b200.kv_capacity_tokens == 585_984
    # by hand from Kimi-K2's config.json: q_a_proj and kv_a_proj_with_mqa whole (FP8), 60 routers of 7168 x 384
    # whole (BF16), the rest split over 8 GPUs
    replicated, router = 7168 * (1536 + 512 + 64), 7168 * 384
    split = K2.num_params - K2.non_linear_params - 61 * replicated - 60 * router
    assert h200.weight_bytes_per_gpu == pytest.approx(
        split / 8 + 61 * replicated + 2 * 60 * router + 2 * K2.non_linear_params / 8, rel=1e-12)


def test_deployment_figures():
    f = deployment_figures(deployment("h200-sxm", "deepseek-v3", 8, precision="fp8"))
    assert f["parameters"] == V3.num_params and f["active_parameters"] == V3.active_params
    assert f["kv_bytes_per_token"] == 70_272 and f["kv_capacity_tokens"] == 688_944 and f["replicas"] == 1
    assert f["kv_capacity_tokens_node"] == 688_944 and f["attention"] == "MLA"
    assert f["weight_gib_per_gpu"] == pytest.approx(79.27, abs=0.01)
    two = deployment_figures(deployment("b200", "deepseek-v3", 4, precision="fp8"))
    assert two["replicas"] == 2 and two["kv_capacity_tokens_node"] == 2 * two["kv_capacity_tokens"]
    json.dumps(f)  # plain JSON


# --- Hugging Face configs -----------------------------------------------------------------------
def test_deepseek_v3_config_json_loads_as_the_preset():
    assert model_from_dict(DEEPSEEK_V3_HF, name="DeepSeek-V3") == V3
    m = parse_json_spec(json.dumps(DEEPSEEK_V3_HF).encode(), "model")
    assert m.is_mla and m.kv_bytes_per_token() == 70_272 and m.name == "deepseek_v3"


def test_kimi_k2_config_json_loads_as_the_preset():
    assert model_from_dict(KIMI_K2_HF, name="Kimi-K2") == K2
    # without architectures, the model_type alone names it
    no_arch = {k: v for k, v in KIMI_K2_HF.items() if k != "architectures"}
    assert model_from_dict(no_arch, name="Kimi-K2") == K2


def test_transformers_head_dim_is_not_the_query_head():
    # transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim (64); a query/key head is 128 + 64
    assert model_from_dict(DEEPSEEK_V3_HF | {"head_dim": 64}, name="DeepSeek-V3") == V3


def test_deepseek_v2_lite_without_query_bottleneck():
    m = model_from_dict(DEEPSEEK_V2_LITE_HF)
    assert m.q_lora_rank == 0 and m.shared_experts == 2 and m.first_dense_layers == 1 and m.dense_ffn_size == 10944
    assert m.attn_params_per_layer == (2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048)
    assert m.kv_bytes_per_token() == 576 * 27 * 2
    assert m.num_params == pytest.approx(15.7e9, rel=0.02)  # DeepSeek-V2-Lite: 15.7B total
    assert m.active_params - m.embedding_params == pytest.approx(2.4e9, rel=0.05)  # 2.4B activated


@pytest.mark.parametrize("change, message", [
    ({"qk_nope_head_dim": None}, "config.json has kv_lora_rank but lacks qk_nope_head_dim"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"kv_lora_rank": "512"}, "kv_lora_rank='512' is text, not a number"),
    ({"n_shared_experts": 100}, "n_shared_experts=100 is out of range"),
])
def test_bad_deepseek_configs_are_one_clear_error(change, message):
    config = {k: v for k, v in (DEEPSEEK_V3_HF | change).items() if v is not None}
    with pytest.raises(ValueError) as info:
        model_from_dict(config)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_mla_fields_round_trip_and_validate():
    for m in (V3, K2):
        assert model_from_dict(model_to_dict(m)) == m
    d = model_to_dict(V3)
    with pytest.raises(ValueError, match="head_dim=128 must be qk_nope_head_dim \\+ qk_rope_head_dim = 192"):
        model_from_dict(d | {"head_dim": 128})
    dense = model_to_dict(MODELS["llama-3.1-8b"])
    with pytest.raises(ValueError, match="q_lora_rank=1536 needs kv_lora_rank > 0"):
        model_from_dict(dense | {"q_lora_rank": 1536})
    with pytest.raises(ValueError, match="shared_experts=1 needs num_experts > 0"):
        model_from_dict(dense | {"shared_experts": 1})
    with pytest.raises(ValueError, match="first_dense_layers=61 is out of range; allowed 0 to 60"):
        model_from_dict(d | {"first_dense_layers": 61})
