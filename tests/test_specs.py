import json
import math

import pytest

from batching.sim.hardware.specs import (GIB, GPUS, KV_BLOCK_TOKENS, MODELS, Deployment, Model, Node, deployment, gpu_from_dict,
                            gpu_to_dict, load_json_spec, model_from_dict, model_to_dict)


def test_qwen_72b_architecture_numbers():
    m = MODELS["qwen2.5-72b"]
    assert m.num_params / 1e9 == pytest.approx(72.7, abs=0.1)  # the model card says 72.7B
    assert m.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 320 * 1024


def test_llama_param_counts_match_their_names():
    assert MODELS["llama-3.1-70b"].num_params / 1e9 == pytest.approx(70.6, abs=0.1)
    assert MODELS["llama-3.1-8b"].num_params / 1e9 == pytest.approx(8.03, abs=0.01)


def test_default_deployment_capacity():
    d = deployment()
    assert d.node.tp == 8 and d.node.num_gpus == 8 and d.node.replicas == 1
    assert d.weight_bytes_per_gpu == pytest.approx(72.706e9 * 2 / 8, rel=1e-3)
    assert d.kv_bytes_per_token_per_gpu == 320 * 1024 / 8
    free = GPUS["h100-sxm"].memory_bytes * 0.9 - d.weight_bytes_per_gpu - 2 * GIB
    assert d.kv_capacity_tokens == pytest.approx(free / (40 * 1024), abs=KV_BLOCK_TOKENS)
    assert d.kv_capacity_tokens % KV_BLOCK_TOKENS == 0
    assert d.kv_capacity_blocks * KV_BLOCK_TOKENS == d.kv_capacity_tokens


def test_kv_override_shrinks_and_fp8_kv_doubles():
    assert deployment(kv_cache_tokens=4096).kv_capacity_tokens == 4096
    assert deployment(kv_cache_tokens=4100).kv_capacity_tokens == 4096  # whole blocks
    bf, f8 = deployment(), Deployment(kv_dtype="fp8")
    assert f8.kv_capacity_tokens == pytest.approx(2 * bf.kv_capacity_tokens, abs=KV_BLOCK_TOKENS)


def test_fp8_weights_halve_bytes():
    b16, f8 = deployment(), deployment(precision="fp8")
    assert f8.linear_weight_bytes_per_gpu == b16.linear_weight_bytes_per_gpu / 2
    # embeddings, LM head and norms stay BF16 (vLLM FP8 checkpoints): a little over half in all
    assert 0.5 < f8.weight_bytes_per_gpu / b16.weight_bytes_per_gpu < 0.53
    emb = MODELS["qwen2.5-72b"].non_linear_params * 2 / 8
    assert f8.weight_bytes_per_gpu - f8.linear_weight_bytes_per_gpu == pytest.approx(emb)


def test_tp4_on_eight_gpus_is_two_replicas():
    assert deployment(tp=4).node.replicas == 2


def test_model_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ValueError, match=r"does not fit .* tp=1"):
        deployment(tp=1, num_gpus=1)


@pytest.mark.parametrize("kw, field", [
    (dict(gpu="h999"), "gpu"), (dict(model="gpt-5"), "model"), (dict(tp=3), "tp"),
    (dict(precision="int3"), "precision"), (dict(kv_cache_tokens=1), "kv_cache_tokens"),
    (dict(tp=8, num_gpus=4), "tp"), (dict(precision="fp8", gpu="a100-80gb", model="llama-3.1-8b"), "precision"),
])
def test_bad_values_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        deployment(**kw)


def test_num_gpus_range():
    with pytest.raises(ValueError, match="num_gpus=9"):
        Node(GPUS["h100-sxm"], 9, 8).validate()


@pytest.mark.parametrize("key, total_b, active_b", [
    ("qwen2.5-7b", 7.62, 7.62), ("qwen2.5-32b", 32.76, 32.76), ("llama-3.1-405b", 405.85, 405.85),
    ("mixtral-8x7b", 46.70, 12.88), ("qwen3-30b-a3b", 30.53, 3.35),
])
def test_new_models_parameter_counts(key, total_b, active_b):
    m = MODELS[key]
    m.validate()
    assert m.num_params / 1e9 == pytest.approx(total_b, abs=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, abs=0.01)


def test_405b_fits_in_fp8_on_h100_and_bf16_on_h200_only():
    assert deployment(model="llama-3.1-405b", precision="fp8").kv_capacity_tokens > 100_000
    assert deployment(gpu="h200-sxm", model="llama-3.1-405b").kv_capacity_tokens > 100_000
    with pytest.raises(ValueError, match=r"Llama-3.1-405B in bf16 does not fit on H100 .* fits with precision fp8"):
        deployment(model="llama-3.1-405b")
    with pytest.raises(ValueError, match=r"does not fit on A100 .* it fits with tp=16 over two nodes \(num_gpus=16\); "
                                         r"or use a GPU with more memory"):
        deployment(gpu="a100-80gb", model="llama-3.1-405b")


def test_error_suggests_a_tp_that_fits():
    with pytest.raises(ValueError, match=r"tp=1: .* it fits with tp=2"):
        deployment(model="qwen2.5-72b", tp=1)


def test_moe_memory_holds_every_expert():
    d = deployment(model="mixtral-8x7b", tp=2)
    m = MODELS["mixtral-8x7b"]
    # every parameter in BF16 split over 2 GPUs, but the 32 routers of 4,096 x 8, which each GPU holds whole
    # (vLLM's ReplicatedLinear)
    router = 32 * 4096 * 8
    assert d.weight_bytes_per_gpu == pytest.approx((m.num_params - router) * 2 / 2 + router * 2)
    assert m.active_linear_params_per_layer < m.linear_params_per_layer / 3


def test_b200_datasheet_figures():
    g = GPUS["b200"]
    assert g.memory_bytes / GIB == pytest.approx(179.06, abs=0.01)
    assert (g.hbm_bw_Bps, g.peak_bf16_flops, g.peak_fp8_flops, g.nvlink_Bps) == (8e12, 2.25e15, 4.5e15, 900e9)


@pytest.mark.parametrize("kw, field", [
    (dict(num_experts=1, experts_per_token=1), "num_experts"),
    (dict(num_experts=8, experts_per_token=9), "experts_per_token"),
    (dict(num_experts=0, experts_per_token=2), "experts_per_token"),
    (dict(name=""), "name"),
])
def test_bad_moe_and_names_are_named(kw, field):
    base = model_to_dict(MODELS["llama-3.1-8b"])
    with pytest.raises(ValueError, match=field):
        Model(**{**base, **kw}).validate()


def test_custom_gpu_and_model_round_trip():
    for g in GPUS.values():
        assert gpu_from_dict(gpu_to_dict(g)) == g
    for m in MODELS.values():
        assert model_from_dict(model_to_dict(m)) == m


def test_custom_specs_errors_name_the_field():
    with pytest.raises(ValueError, match="memory_gib"):
        gpu_from_dict({"name": "x", "hbm_bandwidth_tb_s": 3, "peak_bf16_tflops": 900})
    with pytest.raises(ValueError, match="unknown GPU field.*tflops"):
        gpu_from_dict({**gpu_to_dict(GPUS["h100-sxm"]), "tflops": 1})
    with pytest.raises(ValueError, match=r"hbm_bandwidth_tb_s=1000 is out of range; allowed 0\.1 to 100$"):
        gpu_from_dict({**gpu_to_dict(GPUS["h100-sxm"]), "hbm_bandwidth_tb_s": 1000})
    with pytest.raises(ValueError, match="hidden_size"):
        model_from_dict({**model_to_dict(MODELS["llama-3.1-8b"]), "hidden_size": "big"})
    with pytest.raises(ValueError, match="missing"):
        model_from_dict({"name": "x", "num_layers": 2})


def test_hugging_face_config_json():
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
               "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
               "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
               "tie_word_embeddings": False, "rope_theta": 1e6, "max_position_embeddings": 32768}
    m = model_from_dict(mixtral, name="Mixtral-8x7B")
    assert m == MODELS["mixtral-8x7b"]
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
            "max_position_embeddings": 32768}
    assert model_from_dict(qwen, name="Qwen2.5-7B") == MODELS["qwen2.5-7b"]


def test_json_files(tmp_path):
    good = tmp_path / "gpu.json"
    good.write_text(json.dumps(gpu_to_dict(GPUS["b200"])))
    assert load_json_spec(good, "gpu") == GPUS["b200"]
    bad = tmp_path / "model.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="model file .*model.json: not valid JSON"):
        load_json_spec(bad, "model")
    with pytest.raises(ValueError, match="no such file"):
        load_json_spec(tmp_path / "nope.json", "gpu")
    dep = deployment(load_json_spec(good, "gpu"), "llama-3.1-70b")
    assert dep.node.gpu.name == "B200 180GB"


# ---------------------------------------------------------------- hostile custom specs: one clear ValueError

LLAMA_8B_HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
               "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "vocab_size": 128256, "tie_word_embeddings": False, "_name_or_path": "meta-llama/Llama-3.1-8B",
               "max_position_embeddings": 131072,
               "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def _spec_error(tmp_path, name: str, data: bytes, kind: str = "model") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        load_json_spec(path, kind)
    msg = str(info.value)
    assert msg.startswith(f"{kind} file {path}: "), msg  # names the file
    assert "\n" not in msg and len(msg) < 600
    return msg


@pytest.mark.parametrize("name, data, message", [
    ("inf.json", json.dumps(model_to_dict(MODELS["llama-3.1-8b"])).replace('"num_layers": 32', '"num_layers": '
                                                                             'Infinity').encode(),
     "num_layers=Infinity is not a finite number"),
    ("nan.json", json.dumps(LLAMA_8B_HF).replace("14336", "NaN").encode(), "intermediate_size=NaN is not a finite"),
    ("heads0.json", json.dumps(LLAMA_8B_HF | {"num_attention_heads": 0}).encode(),
     "num_attention_heads=0 is out of range; allowed 1 to 1024"),
    ("kv0.json", json.dumps(LLAMA_8B_HF | {"num_key_value_heads": 0}).encode(),
     "num_key_value_heads=0 is out of range; allowed 1 to 1024"),
    ("kv_more.json", json.dumps(LLAMA_8B_HF | {"num_key_value_heads": 64}).encode(),
     "num_key_value_heads=64 is out of range; allowed 1 to 32"),
    ("list.json", json.dumps(LLAMA_8B_HF | {"hidden_size": [4096]}).encode(),
     "hidden_size=<a JSON array> is not a number"),
    ("object.json", json.dumps(LLAMA_8B_HF | {"hidden_size": {"a": 1}}).encode(),
     "hidden_size=<a JSON object> is not a number"),
    ("text.json", json.dumps(LLAMA_8B_HF | {"hidden_size": "４０９６"}, ensure_ascii=False).encode(),
     "hidden_size='４０９６' is text, not a number (it has non-ASCII characters, e.g. full-width digits)"),
    ("digits.json", json.dumps(LLAMA_8B_HF | {"vocab_size": int("9" * 400)}).encode(),
     "vocab_size=<a 400-digit number> is out of range; allowed 1 to 4194304"),
    ("digits5000.json", json.dumps(LLAMA_8B_HF).replace("128256", "9" * 5000).encode(),
     "not valid JSON: a number has more than 4,300 digits"),
    ("1e30.json", json.dumps(LLAMA_8B_HF | {"num_hidden_layers": 1e30}).encode(),
     "num_hidden_layers=1e+30 is out of range; allowed 1 to 1000"),
    ("half.json", json.dumps(LLAMA_8B_HF | {"num_hidden_layers": 2.5}).encode(),
     "num_hidden_layers=2.5 is not a whole number; allowed 1 to 1000"),
    ("nested.json", b"[" * 100_000 + b"]" * 100_000, "not valid JSON: arrays or objects nested too deeply"),
    ("nested_obj.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
    ("latin1.json", '{"name": "café", "num_layers": 2}'.encode("latin-1"),
     "not UTF-8 text: byte 0xe9 at offset 13 cannot be decoded; save the file as UTF-8"),
    ("broken.json", b'{"name": ', "not valid JSON: Expecting value at line 1 column 10"),
    ("array.json", b"[1, 2]", "a model description must be a JSON object, not <a JSON array>"),
    ("bias.json", json.dumps(LLAMA_8B_HF | {"attention_bias": [1]}).encode(), "attention_bias=<a JSON array> is not "
                                                                             "true or false"),
    ("unknown.json", json.dumps({f"k{i}": 1 for i in range(20_000)}).encode(), "unknown model field(s) k0, k1, k2"),
    ("big.json", b" " * (1 << 20) + b"{}", "larger than 1,048,576 bytes, the most allowed"),
    ("longname.json", json.dumps(model_to_dict(MODELS["llama-3.1-8b"]) | {"name": "n" * 100_000}).encode(),
     "name='" + "n" * 200 + "'... (100,000 characters) is not allowed; allowed 1 to 64 characters"),
], ids=lambda v: v if isinstance(v, str) and v.endswith(".json") else "")
def test_hostile_model_files_are_one_clear_error(tmp_path, name, data, message):
    assert message in _spec_error(tmp_path, name, data)


@pytest.mark.parametrize("field, value, message", [
    ("memory_gib", math.inf, "memory_gib=Infinity is not a finite number"),
    ("memory_gib", 10**400, "memory_gib=<a 401-digit number> is out of range; allowed 1 to 1024"),
    ("memory_gib", 1e308, "memory_gib=1e+308 is out of range; allowed 1 to 1024"),
    ("hbm_bandwidth_tb_s", [3.35], "hbm_bandwidth_tb_s=<a JSON array> is not a number"),
    ("peak_bf16_tflops", "989", "peak_bf16_tflops='989' is text, not a number"),
    ("name", ["H100"], "name=<a JSON array> is not text"),
    ("name", "g" * 5000, "(5,000 characters) is not allowed; allowed 1 to 64 characters"),
    ("arch", "x" * 5000, "(5,000 characters) is not allowed; allowed: '', 'hopper'"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_hostile_gpu_files_are_one_clear_error(tmp_path, field, value, message):
    data = json.dumps(gpu_to_dict(GPUS["h100-sxm"]) | {field: value}).encode()
    assert message in _spec_error(tmp_path, "gpu.json", data, "gpu")


def test_name_or_path_of_any_length_is_accepted():
    for path in ("m" * 100_000, "/home/me/" + "d" * 5000 + "/Llama-3.1-8B-Instruct", "   ", "x" * 64):
        m = model_from_dict(LLAMA_8B_HF | {"_name_or_path": path})
        assert 1 <= len(m.name) <= 64 and m.num_params == MODELS["llama-3.1-8b"].num_params
    assert model_from_dict(LLAMA_8B_HF | {"_name_or_path": "/home/me/" + "d" * 5000 + "/Llama-3.1-8B"}).name == \
        "Llama-3.1-8B"  # a long local path keeps its last part
    assert model_from_dict(LLAMA_8B_HF | {"_name_or_path": "   "}).name == "llama"
    assert model_from_dict(LLAMA_8B_HF | {"_name_or_path": ["x"] * 3}).name == "llama"
    # other keys nested deep are ignored, not walked
    deep = json.loads("[" * 900 + "]" * 900)
    assert model_from_dict(LLAMA_8B_HF | {"rope_scaling": deep}).hidden_size == 4096


SUPPORTED = ("LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
             "Qwen3MoeForCausalLM")


@pytest.mark.parametrize("config, why", [
    ({"architectures": ["MambaForCausalLM"], "model_type": "mamba", "num_hidden_layers": 64, "hidden_size": 2560,
      "vocab_size": 50280, "intermediate_size": 5120, "state_size": 16}, "state-space or recurrent model"),
    ({"architectures": ["JambaForCausalLM"], "model_type": "jamba", "num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536},
     "state-space or recurrent model"),
    ({"architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "num_hidden_layers": 61,
      "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
      "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8, "vocab_size": 129280,
      "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64}, "multi-head latent attention (MLA)"),
    ({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": LLAMA_8B_HF,
      "vision_config": {"hidden_size": 1024}}, "multimodal wrapper"),
    ({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", **{
        k: v for k, v in LLAMA_8B_HF.items() if k not in ("architectures", "model_type")}}, "multimodal wrapper"),
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_hidden_layers": 24,
      "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
      "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
      "num_experts_per_tok": 4, "vocab_size": 151936}, "not known to match"),
    ({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 14336,
      "vocab_size": 32000}, "names neither its architectures nor its model_type"),
])
def test_unknown_architectures_are_refused_with_the_supported_list(config, why):
    with pytest.raises(ValueError) as info:
        model_from_dict(config)
    msg = str(info.value)
    assert why in msg and SUPPORTED in msg, msg


def test_a_supported_architecture_with_an_unmodelled_feature_is_not_called_unsupported():
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096,
               **{k: v for k, v in LLAMA_8B_HF.items() if k not in ("architectures", "model_type")}}
    with pytest.raises(ValueError) as info:
        model_from_dict(mistral)
    msg = str(info.value)
    assert msg.startswith("architectures=MistralForCausalLM is a supported architecture, but not as this "
                          "config.json describes it: its sliding-window attention"), msg


def test_supported_architectures_read_exactly():
    assert model_from_dict(LLAMA_8B_HF, name="Llama-3.1-8B") == MODELS["llama-3.1-8b"]
    qwen3_moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 48,
                 "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                 "attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "sliding_window": None, "use_sliding_window": False, "max_position_embeddings": 40960}
    assert model_from_dict(qwen3_moe, name="Qwen3-30B-A3B") == MODELS["qwen3-30b-a3b"]
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192,
             "intermediate_size": 29568, "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
             "vocab_size": 152064, "tie_word_embeddings": False, "sliding_window": 131072, "use_sliding_window": False,
             "max_position_embeddings": 32768}
    assert model_from_dict(qwen2, name="Qwen2.5-72B") == MODELS["qwen2.5-72b"]
