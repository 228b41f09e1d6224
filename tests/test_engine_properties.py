"""Conservation laws and vLLM's scheduling rules over random scenarios and policies (hypothesis)."""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.engine import kernel as eng
from batching.sim.engine import state as engine_state
from batching.sim.hardware.costmodel import cost_model
from batching.sim.policy import MODE_CODE, MODES, PREEMPTION_CODE, PREEMPTION_MODES
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, deployment

CM = cost_model(deployment())
EXAMPLES = int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "300"))


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    arrival = np.cumsum(gaps)
    prompt = np.array(draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), np.int64)
    output = np.array(draw(st.lists(st.integers(1, 120), min_size=n, max_size=n)), np.int64)
    n_classes = draw(st.integers(1, 3))
    prio = np.array(draw(st.lists(st.integers(0, n_classes - 1), min_size=n, max_size=n)), np.int64)
    mode = draw(st.sampled_from([eng.MODE_STATIC, eng.MODE_DYNAMIC, eng.MODE_CONTINUOUS]))
    chunked = draw(st.booleans()) if mode == eng.MODE_CONTINUOUS else False
    use_prio = draw(st.booleans()) if mode == eng.MODE_CONTINUOUS else False
    preempt = draw(st.sampled_from([eng.PREEMPT_OFF, eng.PREEMPT_RECOMPUTE, eng.PREEMPT_SWAP]))
    need = int(((prompt + output + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS).max())
    kv_blocks = draw(st.integers(need, need * 6))
    # without chunked prefill the budget must hold the longest prompt (simulate refuses less); often exactly that,
    # so that a recompute victim's prompt + generated tokens exceed it
    longest = int(prompt.max())
    budget = draw(st.integers(16, 1024)) if chunked else draw(st.one_of(st.integers(longest, longest + 8),
                                                                          st.integers(longest, 4096)))
    params = dict(
        n_classes=n_classes, mode=mode, max_batch=draw(st.integers(1, 16)), max_wait_s=draw(st.floats(0.0, 1.0)),
        max_seqs=draw(st.integers(1, 32)), budget=budget, chunked=chunked, use_prio=use_prio, preempt=preempt,
        swap_cap_tokens=draw(st.integers(0, 2000)), watermark_blocks=draw(st.integers(0, 2)), kv_blocks=kv_blocks,
    )
    return arrival, prompt, output, prio, params


def simulate(arrival, prompt, output, prio, p):
    return eng.run(eng.inputs(arrival, prompt, output, prio), eng.Knobs(**p), eng.kernel_cost(CM))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_conservation_laws(case):
    arrival, prompt, output, prio, p = case
    out = simulate(arrival, prompt, output, prio, p)
    rf, si, sf = out.req_f, out.steps_i, out.steps_f
    # every request released exactly once, after it arrived, TTFT <= E2E
    assert (rf[:, eng.R_RELEASE] >= arrival).all()
    assert (rf[:, eng.R_FIRST_SCHED] >= arrival).all()
    assert (rf[:, eng.R_FIRST_TOKEN] > rf[:, eng.R_FIRST_SCHED]).all()
    assert (rf[:, eng.R_FIRST_TOKEN] <= rf[:, eng.R_FINISH]).all()
    assert (rf[:, eng.R_FINISH] <= rf[:, eng.R_RELEASE]).all()
    assert (rf[:, eng.R_FIRST_TOKEN] - arrival <= rf[:, eng.R_RELEASE] - arrival).all()
    # output tokens produced == sum of output tokens; ITL gaps == tokens after the first
    assert si[:, eng.S_LM].sum() == output.sum()
    assert out.itl_hist.sum() == (output - 1).sum()
    # prompt tokens: each prefilled once, plus what recompute preemption prefills again
    if out.req_preemptions.sum() == 0:
        assert si[:, eng.S_PREFILL].sum() == prompt.sum()
    else:  # swapped victims keep their KV; recomputed ones prefill prompt + generated again
        assert si[:, eng.S_PREFILL].sum() >= prompt.sum()
    if p["preempt"] == eng.PREEMPT_RECOMPUTE and out.req_preemptions.sum() > 0:
        assert si[:, eng.S_PREFILL].sum() > prompt.sum()
    if p["preempt"] == eng.PREEMPT_OFF or p["mode"] != eng.MODE_CONTINUOUS:
        assert out.req_preemptions.sum() == 0
    # KV never above capacity; token budget respected by iteration-level steps
    assert si[:, eng.S_KV_BLOCKS].max() <= p["kv_blocks"]
    if p["mode"] == eng.MODE_CONTINUOUS:
        # chunked or not (a recompute victim longer than the budget included)
        assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]).max() <= p["budget"]
        assert si[:, eng.S_RUNNING].max() <= p["max_seqs"]
    else:
        assert si[:, eng.S_RUNNING].max() <= p["max_batch"]
    # the clock is monotone: steps never overlap, durations positive
    start, dur = sf[:, eng.F_START], sf[:, eng.F_DURATION]
    assert (dur > 0).all()
    assert (start[1:] >= start[:-1] + dur[:-1] - 1e-9).all()
    # every request is admitted once, plus once more after each recompute
    if out.req_preemptions.sum() == 0 or p["mode"] != eng.MODE_CONTINUOUS:
        assert si[:, eng.S_ADMITTED].sum() == len(arrival)
    else:
        assert len(arrival) <= si[:, eng.S_ADMITTED].sum() <= len(arrival) + out.req_preemptions.sum()
    # vLLM's rules: a step that preempted admits no one; decodes stall only in a prefill-only step
    # (no chunked prefill) or when decodes fill the budget
    assert not ((si[:, eng.S_PREEMPTED] > 0) & (si[:, eng.S_ADMITTED] > 0)).any()
    stalled = si[:, eng.S_STALLED] > 0
    prefill_only = (si[:, eng.S_DECODE] == 0) & (si[:, eng.S_PREFILL] > 0) & (not p["chunked"])
    assert (~stalled | prefill_only | (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE] >= p["budget"])).all()
    # a static or dynamic batch releases together: requests scheduled together leave together
    if p["mode"] != eng.MODE_CONTINUOUS:
        sched = rf[:, eng.R_FIRST_SCHED]
        for t in np.unique(sched):
            assert np.unique(rf[sched == t, eng.R_RELEASE]).size == 1
        assert (np.diff(sched) >= 0).all()  # FIFO
    else:
        assert (rf[:, eng.R_RELEASE] == rf[:, eng.R_FINISH]).all()


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_deterministic(case):
    arrival, prompt, output, prio, p = case
    a = simulate(arrival, prompt, output, prio, p)
    b = simulate(arrival, prompt, output, prio, p)
    assert np.array_equal(a.req_f, b.req_f) and np.array_equal(a.steps_i, b.steps_i)
    assert np.array_equal(a.steps_f, b.steps_f)


@st.composite
def pressured(draw, preempt):
    """Chunked prefill under KV pressure: bursts of requests, a cache of one to two of the largest
    requests, small budgets so that prompts take several chunks."""
    n = draw(st.integers(2, 24))
    arrival = np.cumsum(draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n)))
    prompt = np.array(draw(st.lists(st.integers(1, 400), min_size=n, max_size=n)), np.int64)
    output = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), np.int64)
    n_classes = draw(st.integers(1, 3))
    prio = np.array(draw(st.lists(st.integers(0, n_classes - 1), min_size=n, max_size=n)), np.int64)
    need = int(((prompt + output + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS).max())
    params = dict(
        n_classes=n_classes, mode=eng.MODE_CONTINUOUS, max_batch=1, max_wait_s=0.0,
        max_seqs=draw(st.integers(2, 16)), budget=draw(st.integers(16, 256)), chunked=True,
        use_prio=draw(st.booleans()), preempt=preempt, swap_cap_tokens=draw(st.sampled_from([10**6, 200])),
        watermark_blocks=draw(st.integers(0, 1)), kv_blocks=draw(st.integers(need, 2 * need)),
    )
    return arrival, prompt, output, prio, params


@settings(max_examples=max(50, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pressured(eng.PREEMPT_RECOMPUTE))
def test_no_admission_in_a_step_that_preempted(case):
    """vLLM V0 and V1 admit no waiting request in a step in which they preempted: a victim is
    never evicted and readmitted in one step (the old engine did, in most of these runs)."""
    arrival, prompt, output, prio, p = case
    si = simulate(arrival, prompt, output, prio, p).steps_i
    assert not ((si[:, eng.S_PREEMPTED] > 0) & (si[:, eng.S_ADMITTED] > 0)).any()


@settings(max_examples=max(50, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pressured(eng.PREEMPT_SWAP))
def test_no_decode_is_skipped_while_a_prefill_chunk_runs(case):
    """Decodes first, swapped-in sequences included: no sequence past its prefill waits in a step
    that runs a prompt chunk (the old engine queued swapped-in sequences behind prompts still
    being chunked, whose chunks could take the whole budget)."""
    arrival, prompt, output, prio, p = case
    out = simulate(arrival, prompt, output, prio, p)
    si = out.steps_i
    assert not ((si[:, eng.S_PREFILL] > 0) & (si[:, eng.S_STALLED] > 0)).any()
    assert si[:, eng.S_LM].sum() == output.sum()


def test_recompute_victim_longer_than_the_budget_is_prefilled_within_it():
    """The prefill-only rule (vLLM V0) without chunked prefill, budget 64, prompts of 64 and 9 KV blocks: request 1
    is preempted (recompute)
    after its first token, so it must prefill 64 + 1 = 65 tokens again. The old engine did that in one step of
    65 tokens; now it is admitted with the blocks of all 65 and prefilled in prefill-only steps of 64 and 1."""
    for preempt in (eng.PREEMPT_RECOMPUTE, eng.PREEMPT_SWAP):  # (swap without host space recomputes)
        p = dict(n_classes=1, mode=eng.MODE_CONTINUOUS, max_batch=1, max_wait_s=0.0, max_seqs=256, budget=64,
                 chunked=False, use_prio=False, preempt=preempt, swap_cap_tokens=0, watermark_blocks=0, kv_blocks=9,
                 prefill_only=True)
        out = simulate(np.zeros(2), np.array([64, 64]), np.array([40, 40]), np.zeros(2, np.int64), p)
        si = out.steps_i
        assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]).max() <= 64
        assert out.req_preemptions.tolist() == [0, 1]
        # steps 0-1: both prompts; 2: request 0 decodes (its 5th block), request 1 finds none and is preempted;
        # 2-40: request 0's 39 decodes; 41-42: request 1's 65 tokens; 43-80: its 38 decodes
        assert si[:, eng.S_PREFILL].tolist() == [64, 64] + [0] * 39 + [64, 1] + [0] * 38
        assert si[:, eng.S_DECODE].tolist() == [0, 0] + [1] * 39 + [0, 0] + [1] * 38
        assert si[:, eng.S_PREEMPTED].tolist() == [0, 0, 1] + [0] * 78
        assert si[:, eng.S_ADMITTED].tolist() == [1, 1] + [0] * 39 + [1, 0] + [0] * 38
        # its second token comes at the end of its second prefill step; every output token exactly once
        assert si[:, eng.S_LM].tolist() == [1, 1] + [1] * 39 + [0, 1] + [1] * 38
        assert out.itl_hist.sum() == 2 * 39
        assert si[:, eng.S_KV_BLOCKS].max() <= 9


@st.composite
def whole_prompts_pressured(draw):
    """No chunked prefill under KV pressure: budgets of the longest prompt or a little more, outputs as long as
    prompts, a cache of one to two of the largest requests: recompute victims' prompt + generated tokens exceed
    the budget."""
    n = draw(st.integers(2, 16))
    arrival = np.cumsum(draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n)))
    prompt = np.array(draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)), np.int64)
    output = np.array(draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)), np.int64)
    n_classes = draw(st.integers(1, 3))
    prio = np.array(draw(st.lists(st.integers(0, n_classes - 1), min_size=n, max_size=n)), np.int64)
    need = int(((prompt + output + KV_BLOCK_TOKENS - 1) // KV_BLOCK_TOKENS).max())
    params = dict(
        n_classes=n_classes, mode=eng.MODE_CONTINUOUS, max_batch=1, max_wait_s=0.0,
        max_seqs=draw(st.integers(2, 16)), budget=int(prompt.max()) + draw(st.integers(0, 32)), chunked=False,
        use_prio=draw(st.booleans()), preempt=draw(st.sampled_from([eng.PREEMPT_RECOMPUTE, eng.PREEMPT_SWAP])),
        swap_cap_tokens=draw(st.sampled_from([0, 200])), watermark_blocks=draw(st.integers(0, 1)),
        kv_blocks=draw(st.integers(need, 2 * need)), prefill_only=draw(st.booleans()),
    )
    return arrival, prompt, output, prio, params


@settings(max_examples=max(50, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(whole_prompts_pressured())
def test_whole_prompt_steps_stay_within_the_budget_under_preemption(case):
    """Every step of a run without chunked prefill (vLLM V1's whole prompts mixed with decodes, or V0's prefill-only
    steps) computes at most the budget, recompute victims included, and every request still emits its output tokens
    once (no deadlock, nothing dropped)."""
    arrival, prompt, output, prio, p = case
    out = simulate(arrival, prompt, output, prio, p)
    si = out.steps_i
    assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]).max() <= p["budget"]
    assert si[:, eng.S_LM].sum() == output.sum()
    assert (out.req_f[:, eng.R_FINISH] > 0).all()
    assert si[:, eng.S_KV_BLOCKS].max() <= p["kv_blocks"]
    if p["prefill_only"]:  # a step that prefills runs no decode (vLLM V0's prefill-only steps)
        assert not ((si[:, eng.S_PREFILL] > 0) & (si[:, eng.S_DECODE] > 0)).any()


def test_policy_codes_are_the_engine_enums():
    """policy.MODE_CODE / PREEMPTION_CODE and the engine's constants name the same integers, and
    every engine mode and preemption kind has a policy name."""
    for name in MODES:
        assert MODE_CODE[name] == getattr(engine_state, f"MODE_{name.upper()}") == getattr(eng, f"MODE_{name.upper()}")
    for name in PREEMPTION_MODES:
        assert PREEMPTION_CODE[name] == getattr(engine_state, f"PREEMPT_{name.upper()}")
    engine_modes = {v for k, v in vars(engine_state).items() if k.startswith("MODE_")}
    engine_preempt = {v for k, v in vars(engine_state).items() if k.startswith("PREEMPT_")}
    assert set(MODE_CODE.values()) == engine_modes and len(engine_modes) == len(MODES)
    assert set(PREEMPTION_CODE.values()) == engine_preempt and len(engine_preempt) == len(PREEMPTION_MODES)
