"""Speculative decoding's honest costs (issue 23 item 3): each draft pass's fixed cost, the proposer over the step's
prompt tokens and over the tokens a verification accepts, acceptance given as engines report it (tokens per
verification step), and determinism."""
import math
import subprocess
import sys

import numpy as np
import pytest

from batching.sim.engine import kernel as eng
from batching.sim.engine import speculative as sp_mod
from batching.sim.engine.speculative import (
    DRAFT_PASS_FIXED_S, acceptance_from_length, acceptance_rate, draft_pass_table, expected_tokens_per_step, spec_for,
)
from batching.sim.hardware.costmodel import cost_model, prompt_attn_work, token_time_table_nb
from batching.sim.hardware.specs import deployment
from batching.sim.policy import BatchingPolicy, with_knobs
from batching.studies import spec_check

DEP = deployment()
CM = cost_model(DEP)


def spec(method="eagle", k=3, a=0.8, length=0.0, seed=0):
    pol = BatchingPolicy(spec_decode=method, spec_tokens=k, spec_acceptance=a, spec_acceptance_length=length)
    pol.validate()
    return spec_for(pol, DEP, CM, seed)


def run(prompt, output, sp, budget=8192, chunked=False):
    n = len(prompt)
    knobs = eng.Knobs(mode=eng.MODE_CONTINUOUS, n_classes=1, max_batch=1, max_wait_s=0.0, max_seqs=256,
                      budget=budget, chunked=chunked, use_prio=False, preempt=1, swap_cap_tokens=0,
                      watermark_blocks=0, kv_blocks=100_000)
    return eng.run(eng.inputs(np.zeros(n), np.asarray(prompt, np.int64), np.asarray(output, np.int64),
                              np.zeros(n, np.int64)), knobs, eng.kernel_cost(CM), spec=sp)


# --- acceptance length <-> A ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("a", [0.0, 0.1, 0.5, 0.743, 0.9, 0.99])
def test_length_and_rate_round_trip(k, a):
    length = expected_tokens_per_step(k, a)
    assert acceptance_from_length(length, k) == pytest.approx(a, abs=1e-9)


def test_length_edges_and_a_published_value():
    assert acceptance_from_length(1.0, 3) == 0.0
    assert acceptance_from_length(4.0, 3) == 1.0
    # vLLM issue #26191: EAGLE-3 on Llama-3.1-8B, 7 draft tokens, 3.53 tokens per verification -> A = 0.743,
    # and 1 + A + A^2 + A^3 = 2.71 tokens per verification with 3 draft tokens
    a = acceptance_from_length(3.53, 7)
    assert a == pytest.approx(0.7430, abs=1e-4)
    assert expected_tokens_per_step(3, a) == pytest.approx(2.705, abs=1e-3)


@pytest.mark.parametrize("length", [0.99, 4.01, 10.0, math.nan])
def test_length_outside_one_to_k_plus_one_is_refused(length):
    with pytest.raises(ValueError, match=r"spec_acceptance_length=.* out of range for spec_tokens=3; allowed"):
        acceptance_from_length(length, 3)
    pattern = r"spec_acceptance_length=\S+ is out of range(;| for spec_tokens=3; allowed 0 \(not given)"
    with pytest.raises(ValueError, match=pattern):
        with_knobs(BatchingPolicy(), spec_decode="eagle", spec_tokens=3, spec_acceptance_length=length)


def test_policy_length_replaces_the_rate_in_the_engine():
    pol = with_knobs(BatchingPolicy(), spec_decode="eagle", spec_tokens=5, spec_acceptance=0.2,
                     spec_acceptance_length=4.68)
    a = acceptance_rate(pol)
    assert expected_tokens_per_step(5, a) == pytest.approx(4.68, abs=1e-9)
    assert spec_for(pol, DEP, CM).inv_log_a == pytest.approx(1.0 / math.log(a))
    assert "acceptance length 4.68" in pol.describe()
    # sampled acceptance follows it: mean tokens per verification within 3 % of 4.68
    out = run([100] * 8, [3000] * 8, spec_for(pol, DEP, CM, seed=3))
    si = out.spec_steps_i
    assert (si[:, eng.SP_ACCEPTED].sum() + si[:, eng.SP_SEQS].sum()) / si[:, eng.SP_SEQS].sum() == \
        pytest.approx(4.68, rel=0.03)


def test_cli_flag_and_its_errors():
    base = [sys.executable, "-m", "batching", "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
            "--num-gpus", "1", "--requests", "20", "--spec-decode", "eagle", "--spec-tokens", "3"]
    bad = subprocess.run(base + ["--spec-acceptance-length", "4.5"], capture_output=True, text=True)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "spec_acceptance_length=4.5 is out of range for spec_tokens=3" in bad.stderr
    both = subprocess.run(base + ["--spec-acceptance-length", "2.5", "--spec-acceptance", "0.5"], capture_output=True,
                          text=True)
    assert both.returncode != 0 and "--spec-acceptance-length:" in both.stderr and "Traceback" not in both.stderr
    ok = subprocess.run(base + ["--spec-acceptance-length", "2.5"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


# --- the draft passes' costs ---------------------------------------------------------------------------------------
def test_each_draft_pass_carries_the_fixed_cost():
    assert DRAFT_PASS_FIXED_S > 0
    sp = spec("eagle")
    coef = CM.coef.copy()
    coef[1] = sp_mod.head_layers(DEP)  # C_LAYERS: the head's one layer and its fusion
    coef[0] = 0.0  # C_FIXED
    bare = token_time_table_nb(coef, CM.ar_log_bytes, CM.ar_s, 64)
    tab = draft_pass_table(coef, CM.ar_log_bytes, CM.ar_s, 64)
    assert tab[0] == 0.0
    assert np.allclose(tab[1:] - bare[1:], DRAFT_PASS_FIXED_S, rtol=0, atol=1e-15)
    # the head's TP all-reduces are in the pass (TP 8: two per layer from the measured table)
    assert np.allclose(sp.draft_tab[:64], tab)


def test_decode_step_prices_k_passes_and_the_catch_up():
    """A = 1, K = 3: the verification step's first pass runs over 1 + 3 accepted tokens, the other two over one."""
    sp = spec("eagle", k=3, a=1.0)
    out = run([1000], [20], sp)
    reads = sp.draft_ctx_s * 1001 + max(sp.draft_lm_flops_s, sp.draft_lm_bytes_s)
    want = sp.draft_tab[4] + reads + 2 * (sp.draft_tab[1] + reads)
    assert out.spec_steps_f[1, eng.SPF_DRAFT_S] == pytest.approx(want, rel=1e-12)
    # the catch-up is the difference of a pass over 4 tokens and one over 1, and 3 fixed costs are in it
    no_catch_up = 3 * (sp.draft_tab[1] + reads)
    assert want - no_catch_up == pytest.approx(sp.draft_tab[4] - sp.draft_tab[1], rel=1e-12)
    assert want > 3 * DRAFT_PASS_FIXED_S


def test_prefill_step_runs_the_proposer_over_the_prompt():
    """An EAGLE head runs its first pass over every prompt token of the step, with the head's share of the prompt
    attention; a draft model prefills with its own cost model; n-gram lookup costs nothing."""
    for method in ("eagle", "draft", "mtp"):
        if method == "mtp":
            continue  # the default target (Qwen2.5-72B) has no MTP module
        sp = spec(method)
        out = run([1000], [5], sp)
        assert out.steps_i[0, eng.S_PREFILL] == 1000
        want = sp.draft_tab[1000] + sp.draft_attn_s * prompt_attn_work(1000, 0)
        assert out.spec_steps_f[0, eng.SPF_DRAFT_S] == pytest.approx(want, rel=1e-12)
        assert out.steps_f[0, eng.F_DURATION] > want > 0
    assert spec("draft").draft_attn_s > spec("eagle").draft_attn_s > 0
    out = run([1000], [5], spec("ngram"))
    assert (out.spec_steps_f[:, eng.SPF_DRAFT_S] == 0).all()


def test_chunked_prefill_prices_each_chunk_once():
    sp = spec("eagle")
    out = run([3000], [4], sp, budget=1024, chunked=True)
    pre = out.steps_i[:, eng.S_PREFILL]
    assert pre[:3].tolist() == [1024, 1024, 952]
    for s in range(3):
        want = sp.draft_tab[pre[s]] + sp.draft_attn_s * out.steps_f[s, eng.F_ATTN_WORK]
        assert out.spec_steps_f[s, eng.SPF_DRAFT_S] == pytest.approx(want, rel=1e-12)


def test_same_seed_same_run_other_seed_other_acceptance():
    a = run([200] * 6, [300] * 6, spec("eagle", k=4, length=3.0, seed=7))
    b = run([200] * 6, [300] * 6, spec("eagle", k=4, length=3.0, seed=7))
    c = run([200] * 6, [300] * 6, spec("eagle", k=4, length=3.0, seed=8))
    assert np.array_equal(a.steps_f, b.steps_f) and np.array_equal(a.req_spec_accepted, b.req_spec_accepted)
    assert not np.array_equal(a.req_spec_accepted, c.req_spec_accepted)


# --- calibration ---------------------------------------------------------------------------------------------------
def test_the_calibrated_point_holds_at_batch_one():
    """SGLang docs: EAGLE-3 (8 steps, acceptance length 5.39) 373.25 / 158.34 = 2.36x at batch 1 on one H100: the
    fitted fixed cost brings the simulated speed-up within 15 % of it."""
    p = spec_check.CALIBRATION[1]
    assert p.speedup == pytest.approx(2.357, abs=1e-3)
    assert spec_check.simulated_speedup(p) == pytest.approx(p.speedup, rel=0.15)
