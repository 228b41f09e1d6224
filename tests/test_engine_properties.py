"""Conservation laws of the engine over random scenarios and policies (hypothesis)."""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim import engine as eng
from batching.sim.costmodel import cost_model
from batching.sim.specs import KV_BLOCK_TOKENS, deployment

CM = cost_model(deployment())


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
    budget = draw(st.integers(16, 1024)) if chunked else draw(st.integers(int(prompt.max()), 4096))
    params = dict(
        n_classes=n_classes, mode=mode, max_batch=draw(st.integers(1, 16)), max_wait_s=draw(st.floats(0.0, 1.0)),
        max_seqs=draw(st.integers(1, 32)), budget=budget, chunked=chunked, use_prio=use_prio, preempt=preempt,
        swap_cap_tokens=draw(st.integers(0, 2000)), watermark_blocks=draw(st.integers(0, 2)), kv_blocks=kv_blocks,
    )
    return arrival, prompt, output, prio, params


def simulate(arrival, prompt, output, prio, p):
    return eng.run(arrival, prompt, output, prio, p["n_classes"], p["mode"], p["max_batch"], p["max_wait_s"],
                   p["max_seqs"], p["budget"], p["chunked"], p["use_prio"], p["preempt"], p["swap_cap_tokens"],
                   p["watermark_blocks"], p["kv_blocks"], CM.coef, CM.ar_log_bytes, CM.ar_s)


@settings(max_examples=int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "300")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
        if p["chunked"]:
            assert (si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]).max() <= p["budget"]
        assert si[:, eng.S_RUNNING].max() <= p["max_seqs"]
    else:
        assert si[:, eng.S_RUNNING].max() <= p["max_batch"]
    # the clock is monotone: steps never overlap, durations positive
    start, dur = sf[:, eng.F_START], sf[:, eng.F_DURATION]
    assert (dur > 0).all()
    assert (start[1:] >= start[:-1] + dur[:-1] - 1e-9).all()
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
