import pytest

from batching.specs import GIB, GPUS, KV_BLOCK_TOKENS, MODELS, Deployment, Node, deployment


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
    assert deployment(precision="fp8").weight_bytes_per_gpu == pytest.approx(deployment().weight_bytes_per_gpu / 2)


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
