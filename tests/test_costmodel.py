import numpy as np
import pytest

from batching import costmodel as cm
from batching.specs import deployment


@pytest.fixture(scope="module")
def model():
    return cm.cost_model(deployment())


def test_parts_sum_to_step_time(model):
    for args in [(1, 0, 1000, 1), (256, 0, 256 * 1500, 256), (2048, cm.prompt_attn_work(2048, 0), 0, 1),
                 (512, cm.prompt_attn_work(300, 1000), 20000, 200, 5000)]:
        parts = cm.step_breakdown(model, *args)
        assert sum(parts.values()) == pytest.approx(cm.step_time(model, *args), rel=1e-12)


def test_decode_is_memory_bound_and_flat_in_batch(model):
    # weights dominate a small decode batch: 1 and 32 sequences cost nearly the same
    t1 = cm.step_time(model, 1, 0, 1000, 1)
    t32 = cm.step_time(model, 32, 0, 32 * 1000, 32)
    assert t32 / t1 < 1.25
    lin = cm.step_breakdown(model, 1, 0, 1000, 1)["linear"]
    d = deployment()
    ideal = d.weight_bytes_per_gpu * (1 - d.model.embedding_params * 2 / d.model.num_params) / 3.35e12
    assert lin == pytest.approx(ideal / cm.LINEAR_MEMORY_EFF[8], rel=0.02)


def test_prefill_is_compute_bound_and_linear_in_tokens(model):
    a = cm.step_breakdown(model, 4096)["linear"]
    b = cm.step_breakdown(model, 8192)["linear"]
    assert b == pytest.approx(2 * a, rel=1e-9)
    d = deployment()
    flops = 2 * d.model.linear_params_per_layer * d.model.num_layers * 4096 / 8
    assert a == pytest.approx(flops / (989.4e12 * cm.LINEAR_COMPUTE_EFF[8]), rel=1e-9)


def test_attention_grows_quadratically_with_prompt(model):
    a = cm.step_breakdown(model, 1000, cm.prompt_attn_work(1000, 0))["prompt attention"]
    b = cm.step_breakdown(model, 2000, cm.prompt_attn_work(2000, 0))["prompt attention"]
    assert b == pytest.approx(4 * a)


def test_allreduce_interpolates_the_measured_table(model):
    x, y = cm.allreduce_table("vllm_graph", 8)
    # at a measured size the model returns the measured median exactly
    n_tokens = np.exp(x[10]) / (8192 * 2)
    assert cm.allreduce_s_nb(model.coef, x, y, n_tokens) == pytest.approx(y[10])
    # past the table it keeps growing with the payload
    big = np.exp(x[-1]) / (8192 * 2)
    assert cm.allreduce_s_nb(model.coef, x, y, 2 * big) == pytest.approx(2 * y[-1])


def test_tp1_has_no_allreduce():
    m = cm.cost_model(deployment(model="llama-3.1-8b", tp=1))
    assert cm.step_breakdown(m, 512)["all-reduce"] == 0.0


def test_swap_time_is_bytes_over_pcie(model):
    d = deployment()
    t = cm.step_breakdown(model, 0, 0, 0, 0, 10000)["swap"]
    assert t == pytest.approx(10000 * d.kv_bytes_per_token_per_gpu / 55e9)


def test_fp8_moves_the_roofline():
    b16 = cm.cost_model(deployment())
    f8 = cm.cost_model(deployment(precision="fp8"))
    assert cm.step_breakdown(f8, 1)["linear"] == pytest.approx(cm.step_breakdown(b16, 1)["linear"] / 2)
    # FP8 peak is 1978.9 vs 2 x 989.4 TFLOP/s
    assert cm.step_breakdown(f8, 8192)["linear"] == pytest.approx(cm.step_breakdown(b16, 8192)["linear"] / 2, rel=1e-3)


def test_unknown_allreduce_is_an_error():
    with pytest.raises(ValueError, match="allreduce='mpi'"):
        cm.cost_model(deployment(), "mpi")
