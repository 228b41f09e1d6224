"""Speculative decoding in the engine: hand-computed steps, the draft's cost, sampled acceptance against its
expectation, determinism for a seed, speculation disabled by batch size, and the conservation laws over random
scenarios (hypothesis) with speculation on."""
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.engine import kernel as eng
from batching.sim.hardware.costmodel import cost_model, step_time
from batching.sim.policy import BatchingPolicy, PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.engine.speculative import expected_tokens_per_step, spec_for, spec_kv_blocks
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, deployment
from batching.sim.workload.requests import workload_preset
from tests.test_engine_properties import scenarios

DEP = deployment()
CM = cost_model(DEP)
EXAMPLES = int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "300"))


def spec(method="ngram", k=3, a=0.8, disable=0, seed=0, max_seqs=256):
    pol = BatchingPolicy(spec_decode=method, spec_tokens=k, spec_acceptance=a, spec_disable_batch_size=disable,
                         max_num_seqs=max_seqs)
    pol.validate()
    return spec_for(pol, DEP, CM, seed)


def run(arrival, prompt, output, sp, max_seqs=256, budget=8192, chunked=False, kv_blocks=100_000, preempt=1,
        prio=None, n_classes=1, use_prio=False, swap_cap=0):
    n = len(arrival)
    prio = np.zeros(n, np.int64) if prio is None else np.asarray(prio, np.int64)
    knobs = eng.Knobs(mode=eng.MODE_CONTINUOUS, n_classes=n_classes, max_batch=1, max_wait_s=0.0, max_seqs=max_seqs,
                      budget=budget, chunked=chunked, use_prio=use_prio, preempt=preempt, swap_cap_tokens=swap_cap,
                      watermark_blocks=0, kv_blocks=kv_blocks)
    return eng.run(eng.inputs(np.asarray(arrival, float), np.asarray(prompt, np.int64), np.asarray(output, np.int64),
                              prio), knobs, eng.kernel_cost(CM), spec=sp)


def test_perfect_drafts_emit_k_plus_one_tokens_until_the_output_ends():
    """A = 1: after the prefill (1 token), 10 output tokens take 4 + 4 + 1 decode steps' tokens. vLLM V1 schedules
    K drafts whatever the request still owes (scheduler.py, Scheduler.schedule: num_tokens_with_spec -
    num_computed_tokens, capped by the budget only) and drops the tokens sampled past max_tokens (_update_request_
    with_output, check_stop): the last step verifies 4 tokens, emits 1, and its 3 accepted drafts are padding."""
    out = run([0.0], [100], [10], spec(a=1.0))
    si = out.steps_i
    assert si[:, eng.S_PREFILL].tolist() == [100, 0, 0, 0]
    assert si[:, eng.S_DECODE].tolist() == [0, 4, 4, 1]
    assert si[:, eng.S_PADDED].tolist() == [0, 0, 0, 3]
    assert out.spec_steps_i[:, eng.SP_SEQS].tolist() == [0, 1, 1, 1]
    assert out.spec_steps_i[:, eng.SP_PROPOSED].tolist() == [0, 3, 3, 3]
    assert out.spec_steps_i[:, eng.SP_ACCEPTED].tolist() == [0, 3, 3, 0]  # accepted and emitted
    assert si[:, eng.S_LM].sum() == 10
    assert out.req_spec_accepted.tolist() == [6]
    # one inter-token gap per delivery: the 4 tokens of a verification arrive together
    assert out.itl_hist.sum() == 3
    # KV: the blocks hold every verified token: 100 + 1 + 4 + 4 + 4 - 1 = 112 tokens -> 7 blocks (n-gram lookup
    # keeps no KV: no lookahead slots)
    assert si[:, eng.S_KV_BLOCKS].tolist() == [7, 7, 7, 0]
    assert out.req_f[0, eng.R_FINISH] == out.req_f[0, eng.R_RELEASE]


def test_rejected_drafts_are_padded_slots():
    """A = 0: every proposal is rejected, each step emits one token; the k rejected tokens are padded slots, K of
    them up to the last decode (V1 does not cap the drafts by the tokens a request still owes)."""
    out = run([0.0], [100], [10], spec(a=0.0))
    si = out.steps_i
    assert si[1:, eng.S_DECODE].tolist() == [1] * 9
    assert si[1:, eng.S_PADDED].tolist() == [3] * 9
    assert out.spec_steps_i[:, eng.SP_ACCEPTED].sum() == 0
    assert out.spec_steps_i[:, eng.SP_PROPOSED].sum() == 27


def test_a_proposer_with_kv_holds_k_lookahead_slots():
    """vLLM V1 passes num_lookahead_tokens = K to allocate_slots for every running request when the proposer is a
    draft model or EAGLE-style (scheduler.py, Scheduler.__init__; kv_cache_manager.py, allocate_slots); n-gram
    lookup keeps none, and a waiting request's first allocation holds none either. Prompt 97, 12 output tokens,
    K = 3, A = 0 (one token a step): decode d (1 .. 11) holds slots for its 97 + d - 1 computed tokens, the one it
    adds and 3 drafts, with EAGLE 3 more; the tenth needs 110 slots (7 blocks) with n-gram, 113 (8) with EAGLE."""
    out_n = run([0.0], [97], [12], spec("ngram", k=3, a=0.0))
    out_e = run([0.0], [97], [12], spec("eagle", k=3, a=0.0))
    kv_n = out_n.steps_i[:, eng.S_KV_BLOCKS].tolist()
    kv_e = out_e.steps_i[:, eng.S_KV_BLOCKS].tolist()
    blocks = lambda tokens: -(-tokens // KV_BLOCK_TOKENS)  # noqa: E731
    # the prefill's 7 blocks, decodes 1 .. 10, and none once the eleventh finishes the request
    assert kv_n == [7] + [blocks(97 + d + 3) for d in range(1, 11)] + [0]
    assert kv_e == [7] + [blocks(97 + d + 6) for d in range(1, 11)] + [0]
    assert (kv_n[-2], kv_e[-2]) == (7, 8)


def test_verification_is_priced_as_k_plus_one_tokens_reading_the_context_once():
    """n-gram proposals cost no GPU work: a verification step costs the target's step over K + 1 tokens, the
    context (with the K + 1 new tokens) read once, the LM head over K + 1 positions."""
    out = run([0.0], [1000], [20], spec("ngram", k=3, a=1.0))
    sf = out.steps_f
    assert out.spec_steps_f[1, eng.SPF_DRAFT_S] == 0.0
    want = step_time(CM, 4, decode_ctx=1000 + 4, n_lm=4)
    assert sf[1, eng.F_DURATION] == pytest.approx(want, rel=1e-12)
    assert sf[1, eng.F_DECODE_CTX] == 1000 + 4
    assert out.spec_steps_f[1, eng.SPF_CTX] == 1000 + 1


def test_eagle_head_costs_k_passes_of_one_layer_and_the_lm_head():
    sp = spec("eagle", k=3, a=1.0)
    out = run([0.0], [1000], [20], sp)
    sf = out.steps_f
    reads = sp.draft_ctx_s * 1001 + max(sp.draft_lm_flops_s, sp.draft_lm_bytes_s)
    one = sp.draft_tab[1] + reads
    # the first pass also catches up on the 3 accepted tokens (1 + 3 tokens), the other two run over 1
    want = sp.draft_tab[4] + reads + 2 * one
    assert out.spec_steps_f[1, eng.SPF_DRAFT_S] == pytest.approx(want, rel=1e-12)
    base = step_time(CM, 4, decode_ctx=1004, n_lm=4)
    assert sf[1, eng.F_DURATION] == pytest.approx(base + want, rel=1e-12)
    # a head pass is a small share of a target step (one of 80 layers plus the LM head)
    assert 0.0 < one < 0.2 * step_time(CM, 1, decode_ctx=1001, n_lm=1)


def test_draft_model_costs_more_than_a_head():
    eagle, draft = spec("eagle"), spec("draft")
    assert draft.drafts and eagle.drafts and not spec("ngram").drafts
    assert draft.draft_tab[8] > eagle.draft_tab[8]


def test_sampled_acceptance_matches_its_expectation():
    """Long outputs (the cap at the output's end rarely binds): tokens per verification within 2 % of
    (1 − A^(K+1)) / (1 − A), acceptance rate within 2 % of (that − 1) / K."""
    n = 200
    for k, a in ((3, 0.8), (5, 0.6), (2, 0.95)):
        out = run(np.arange(n) * 0.01, np.full(n, 50), np.full(n, 400), spec(k=k, a=a, seed=7))
        si = out.steps_i
        seqs, prop, acc = (out.spec_steps_i[:, c].sum() for c in (eng.SP_SEQS, eng.SP_PROPOSED, eng.SP_ACCEPTED))
        per_step = (acc + seqs) / seqs
        exp = expected_tokens_per_step(k, a)
        assert per_step == pytest.approx(exp, rel=0.02)
        assert acc / prop == pytest.approx((exp - 1) / k, rel=0.03)
        assert si[:, eng.S_LM].sum() == 400 * n


def test_deterministic_for_a_seed():
    arr, p, o = np.arange(30) * 0.05, np.full(30, 200), np.arange(30) + 5
    a = run(arr, p, o, spec(seed=3))
    b = run(arr, p, o, spec(seed=3))
    c = run(arr, p, o, spec(seed=4))
    assert np.array_equal(a.steps_i, b.steps_i) and np.array_equal(a.steps_f, b.steps_f)
    assert np.array_equal(a.req_f, b.req_f)
    assert not np.array_equal(a.steps_i, c.steps_i)


def test_disabled_from_the_batch_size():
    """vLLM's speculative_disable_by_batch_size: no sequence speculates in a step while N or more run (its spec
    decode worker: running_queue_size >= disable_by_batch_size)."""
    n = 12
    out = run(np.zeros(n), np.full(n, 64), np.linspace(20, 200, n).astype(int), spec(a=0.8, disable=4))
    si = out.steps_i
    specd = out.spec_steps_i[:, eng.SP_SEQS] > 0
    assert specd.any() and (~specd).any()
    assert (si[specd, eng.S_RUNNING] < 4).all()
    decoding = si[:, eng.S_DECODE] > 0
    assert (out.spec_steps_i[decoding & (si[:, eng.S_RUNNING] >= 4), eng.SP_SEQS] == 0).all()
    assert (out.spec_steps_i[decoding & (si[:, eng.S_RUNNING] < 4), eng.SP_SEQS] > 0).any()


def test_exactly_n_running_do_not_speculate():
    """4 sequences decoding together: with N = 4 no step speculates (the old rule, off only above N, let 20 of
    the 21 steps speculate); with N = 5 every step whose sequences still owe 2 or more tokens does."""
    four = run(np.zeros(4), np.full(4, 64), np.full(4, 40), spec(a=0.8, disable=4))
    assert four.spec_steps_i[:, eng.SP_SEQS].sum() == 0
    assert four.steps_i[:, eng.S_PADDED].sum() == 0
    assert four.steps_i[1:, eng.S_DECODE].tolist() == [4] * 39  # one token each per step: 40 tokens in 1 + 39
    five = run(np.zeros(4), np.full(4, 64), np.full(4, 40), spec(a=0.8, disable=5))
    assert five.spec_steps_i[1, eng.SP_SEQS] == 4
    assert len(five.steps_i) < len(four.steps_i)


def test_speculation_counts_in_the_token_budget():
    """A verification's K + 1 tokens count in max_num_batched_tokens (vLLM V1); k shrinks to fit."""
    n = 8
    out = run(np.zeros(n), np.full(n, 16), np.full(n, 100), spec(k=4, a=0.5), budget=20, chunked=True)
    si = out.steps_i
    assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE] + si[:, eng.S_PADDED]).max() <= 20
    assert si[:, eng.S_LM].sum() == 100 * n


def test_preemption_under_kv_pressure_keeps_the_tokens():
    """A cache of a few requests' worth: speculation's lookahead blocks force preemptions (recompute and swap);
    every request still emits exactly its output tokens and KV never exceeds the cache."""
    n = 16
    prompt, output = np.full(n, 100), np.full(n, 150)
    need = -(-(100 + 150) // KV_BLOCK_TOKENS)
    for preempt in (eng.PREEMPT_RECOMPUTE, eng.PREEMPT_SWAP):
        out = run(np.zeros(n), prompt, output, spec(k=4, a=0.7), kv_blocks=3 * need, preempt=preempt,
                  swap_cap=10**6)
        si = out.steps_i
        assert out.req_preemptions.sum() > 0
        assert si[:, eng.S_KV_BLOCKS].max() <= 3 * need
        assert si[:, eng.S_LM].sum() == output.sum()
        assert (out.req_f[:, eng.R_FINISH] > 0).all()


def test_off_is_plain_continuous_and_knobs_change_nothing():
    """spec_decode off: the same numbers as a policy without the knobs (they are not read)."""
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    plain = simulate(sc).summary()
    knobs = simulate(sc.with_policy(replace(PRESETS["continuous"], spec_tokens=7, spec_acceptance=0.3,
                                            spec_disable_batch_size=5))).summary()
    for key in ("tpot_p50_s", "ttft_p99_s", "throughput_output_tok_s", "gpu_util", "kv_capacity_tokens"):
        assert plain[key] == knobs[key]
    assert "spec_acceptance_rate" not in plain


def test_simulate_reports_speculation():
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0),
                  policy=with_knobs(PRESETS["continuous"], spec_decode="eagle", spec_tokens=3, spec_acceptance=0.8))
    res = simulate(sc)
    s = res.summary()
    assert s["mean_tokens_per_step"] == pytest.approx(expected_tokens_per_step(3, 0.8), rel=0.05)
    assert s["spec_acceptance_rate"] == pytest.approx((expected_tokens_per_step(3, 0.8) - 1) / 3, rel=0.06)
    assert 0.9 < s["spec_share"] <= 1.0
    assert 0.0 < s["draft_time_share"] < 0.2
    # rejected drafts are waste: gpu_util falls below busy
    assert s["gpu_util"] < s["busy"] - 0.05
    assert res.requests["spec_accepted_tokens"].sum() == res.steps["spec_accepted"].sum()
    assert (res.requests["spec_accepted_tokens"] <= res.requests["output_tokens"] - 1).all()
    # the head's layer and KV share the memory: a little less KV capacity
    plain_kv = DEP.kv_capacity_tokens
    assert 0.95 * plain_kv < s["kv_capacity_tokens"] < plain_kv
    # determinism through simulate (seed of the workload)
    assert simulate(sc).summary()["tpot_p50_s"] == s["tpot_p50_s"]


def test_draft_model_memory_shrinks_the_cache():
    pol = with_knobs(PRESETS["continuous"], spec_decode="draft", spec_draft_model="qwen2.5-7b")
    assert spec_kv_blocks(pol, DEP) < spec_kv_blocks(with_knobs(pol, spec_decode="eagle"), DEP) \
        < DEP.kv_capacity_blocks
    assert spec_kv_blocks(with_knobs(pol, spec_decode="ngram"), DEP) == DEP.kv_capacity_blocks


# --- conservation laws with speculation on, over random scenarios --------------------------------------------
@st.composite
def spec_scenarios(draw):
    arrival, prompt, output, prio, p = draw(scenarios())
    p = dict(p, mode=eng.MODE_CONTINUOUS)
    if p["use_prio"] is False and p["chunked"] is False and draw(st.booleans()):
        p["chunked"] = True
    if p["chunked"]:
        p["budget"] = max(p["budget"], 16)
    else:
        p["budget"] = max(p["budget"], int(prompt.max()))
    method = draw(st.sampled_from(["ngram", "eagle", "draft", "mtp"]))
    k = draw(st.integers(1, 8))
    a = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]) | st.floats(0.0, 1.0))
    disable = draw(st.just(0) | st.integers(2, 8))  # (1 is refused, as vLLM refuses it)
    seed = draw(st.integers(0, 2**31))
    return arrival, prompt, output, prio, p, spec(method, k, a, disable, seed, max_seqs=p["max_seqs"])


def spec_run(arrival, prompt, output, prio, p, sp):
    return eng.run(eng.inputs(arrival, prompt, output, prio), eng.Knobs(**p), eng.kernel_cost(CM), spec=sp)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_scenarios())
def test_conservation_laws_with_speculation(case):
    arrival, prompt, output, prio, p, sp = case
    out = spec_run(arrival, prompt, output, prio, p, sp)
    rf, si, sf = out.req_f, out.steps_i, out.steps_f
    # every request finishes (gen reached exactly its output_tokens: the engine finishes on equality) and is
    # released once, in order of its own times
    assert (rf[:, eng.R_RELEASE] >= arrival).all()
    assert (rf[:, eng.R_FIRST_TOKEN] > rf[:, eng.R_FIRST_SCHED]).all()
    assert (rf[:, eng.R_FIRST_TOKEN] <= rf[:, eng.R_FINISH]).all()
    assert (rf[:, eng.R_RELEASE] == rf[:, eng.R_FINISH]).all()
    # output tokens conserved: emitted tokens == Σ output_tokens; accepted drafts per request within its output
    assert si[:, eng.S_LM].sum() == output.sum()
    assert out.req_spec_accepted.sum() == out.spec_steps_i[:, eng.SP_ACCEPTED].sum()
    assert (out.req_spec_accepted <= output - 1).all()
    assert out.itl_hist.sum() <= (output - 1).sum()
    # proposals: accepted <= proposed <= K per speculating sequence; rejected ones are the padded slots
    assert (out.spec_steps_i[:, eng.SP_ACCEPTED] <= out.spec_steps_i[:, eng.SP_PROPOSED]).all()
    assert (out.spec_steps_i[:, eng.SP_PROPOSED] <= sp.k * out.spec_steps_i[:, eng.SP_SEQS]).all()
    assert (out.spec_steps_i[:, eng.SP_PROPOSED] >= out.spec_steps_i[:, eng.SP_SEQS]).all()
    sp_i = out.spec_steps_i
    assert (si[:, eng.S_PADDED] == sp_i[:, eng.SP_PROPOSED] - sp_i[:, eng.SP_ACCEPTED]).all()
    # requests: each admitted once (plus recomputes); no preemption without preemption
    if out.req_preemptions.sum() == 0:
        assert si[:, eng.S_ADMITTED].sum() == len(arrival)
        assert si[:, eng.S_PREFILL].sum() == prompt.sum()
    if p["preempt"] == eng.PREEMPT_OFF:
        assert out.req_preemptions.sum() == 0
    # KV never above capacity; budget and sequence cap respected
    assert si[:, eng.S_KV_BLOCKS].max() <= p["kv_blocks"]
    assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE] + si[:, eng.S_PADDED]).max() <= p["budget"]
    assert si[:, eng.S_RUNNING].max() <= p["max_seqs"]
    # time monotone; drafting only with a drafting method, within the step
    start, dur = sf[:, eng.F_START], sf[:, eng.F_DURATION]
    assert (dur > 0).all()
    assert (start[1:] >= start[:-1] + dur[:-1] - 1e-9).all()
    assert (out.spec_steps_f[:, eng.SPF_DRAFT_S] < dur).all()
    if not sp.drafts:
        assert (out.spec_steps_f[:, eng.SPF_DRAFT_S] == 0).all()
    assert not ((si[:, eng.S_PREEMPTED] > 0) & (si[:, eng.S_ADMITTED] > 0)).any()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_scenarios())
def test_deterministic_with_speculation(case):
    arrival, prompt, output, prio, p, sp = case
    a = spec_run(arrival, prompt, output, prio, p, sp)
    b = spec_run(arrival, prompt, output, prio, p, sp)
    assert np.array_equal(a.req_f, b.req_f) and np.array_equal(a.steps_i, b.steps_i)
    assert np.array_equal(a.steps_f, b.steps_f) and np.array_equal(a.req_spec_accepted, b.req_spec_accepted)
