import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batching.sim.metrics import node_summary
from batching.sim.policy import PRESETS, V0_CONTINUOUS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import deployment
from batching.sim.workload.requests import LengthDist, workload_preset

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = {"num_requests", "num_steps", "throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "gpu_util", "busy", "mfu", "mbu", "batch_efficiency",
                "preemptions", "by_priority"}


def small(policy="continuous", n=300, rate=3.0, **dep):
    return Scenario(deployment(**dep), workload_preset("mixed", rate, n, 1), PRESETS[policy])


@pytest.mark.parametrize("name", list(PRESETS))
def test_summary_keys_and_conservation(name):
    res = simulate(small(name))
    s = res.summary()
    assert SUMMARY_KEYS <= set(s)
    assert s["num_requests"] == 300 == len(res.requests)
    req = res.requests
    assert (req["release_s"] >= req["arrival_s"]).all()
    assert (req["ttft_s"] <= req["e2e_s"]).all()
    # output tokens produced == output tokens asked for
    wall = req["release_s"].max() - req["arrival_s"].min()
    assert s["throughput_output_tok_s"] * wall == pytest.approx(req["output_tokens"].sum())
    assert 0 < s["gpu_util"] <= s["busy"] <= 1.0 + 1e-9
    assert 0 < s["mfu"] < 1 and 0 < s["mbu"] < 1
    assert res.steps["kv_blocks"].max() <= res.scenario.deployment.kv_capacity_blocks
    # per class: both classes of the default mix, counts add up
    by = s["by_priority"]
    assert set(by) == {"0", "1"}
    assert by["0"]["class_name"] == "interactive chat"
    assert by["0"]["num_requests"] + by["1"]["num_requests"] == 300


def test_tpot_definition_matches_vllm_bench():
    res = simulate(small())
    r = res.requests
    multi = r[r.output_tokens >= 2]
    expect = (multi.e2e_s - multi.ttft_s) / (multi.output_tokens - 1)
    assert np.allclose(multi.tpot_s, expect)
    assert r[r.output_tokens < 2].tpot_s.isna().all()


def test_deterministic_for_a_seed():
    a, b = simulate(small("chunked")), simulate(small("chunked"))
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)


def test_replicas_split_requests_round_robin():
    res = simulate(small(tp=4))  # 8 GPUs at TP 4: two replicas
    assert sorted(res.requests.replica.unique()) == [0, 1]
    assert set(res.steps.replica.unique()) == {0, 1}
    assert res.summary()["num_requests"] == 300


def test_kv_override_causes_preemption_and_swap():
    sc = Scenario(deployment(kv_cache_tokens=20000), workload_preset("mixed", 20.0, 300, 1), PRESETS["continuous"])
    rec = simulate(sc).summary()
    swp = simulate(sc.with_policy(with_knobs(PRESETS["continuous"], preemption="swap"))).summary()
    assert rec["preemptions"] > 0 and swp["preemptions"] > 0
    assert simulate(sc).steps["kv_blocks"].max() <= 20000 // 16


def test_request_larger_than_cache_is_a_clear_error():
    sc = Scenario(deployment(kv_cache_tokens=1024), workload_preset("mixed", 3.0, 50, 1), PRESETS["continuous"])
    with pytest.raises(ValueError, match="tokens of KV cache"):
        simulate(sc)


def test_prompt_over_budget_without_chunking_is_a_clear_error():
    pol = with_knobs(PRESETS["continuous"], max_num_batched_tokens=512)
    with pytest.raises(ValueError, match="max_num_batched_tokens=512"):
        simulate(small().with_policy(pol))


def test_static_batch_releases_together_in_the_tables():
    res = simulate(small("static", n=64))
    r = res.requests
    for _, g in r.groupby("first_scheduled_s"):
        assert g.release_s.nunique() == 1
    assert res.steps.padded_tokens.sum() > 0


def test_same_results_without_jit():
    """The kernel interpreted by Python (NUMBA_DISABLE_JIT=1) gives the same answer."""
    code = (
        "import json,sys; from batching.sim.simulate import Scenario, simulate; from batching.sim.policy import PRESETS;"
        "from batching.sim.workload.requests import workload_preset; from batching.sim.hardware.specs import deployment;"
        "out={};\n"
        "for name in ('dynamic','priority'):\n"
        "    r=simulate(Scenario(deployment(kv_cache_tokens=8000), workload_preset('mixed',5.0,25,3), PRESETS[name]))\n"
        "    out[name]=[r.requests.release_s.tolist(), r.steps.duration_s.tolist(), int(r.requests.preemptions.sum())]\n"
        "json.dump(out, sys.stdout)"
    )
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    slow = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                                     text=True, check=True, timeout=600).stdout)
    for name in ("dynamic", "priority"):
        r = simulate(Scenario(deployment(kv_cache_tokens=8000), workload_preset("mixed", 5.0, 25, 3), PRESETS[name]))
        assert slow[name][0] == pytest.approx(r.requests.release_s.tolist(), rel=1e-12)
        assert slow[name][1] == pytest.approx(r.steps.duration_s.tolist(), rel=1e-12)
        assert slow[name][2] == int(r.requests.preemptions.sum())


def test_fixed_lengths_give_exact_token_counts():
    wl = workload_preset("chat", 2.0, 40, 0)
    c = wl.classes[0]
    wl = replace(wl, classes=(replace(c, prompt=LengthDist("fixed", mean=100), output=LengthDist("fixed", mean=10)),))
    res = simulate(Scenario(workload=wl))
    assert (res.requests.prompt_tokens == 100).all() and (res.requests.output_tokens == 10).all()
    assert res.steps.prefill_tokens.sum() == 4000
    assert res.steps.decode_tokens.sum() == 40 * 9


def test_shares_never_exceed_one_despite_float_sums():
    """busy, gpu_util, mfu and mbu are shares of the wall time: a float sum of step times that
    lands an ulp above it (0.1 + 0.2 > 0.3) or a step whose useful work is costed above its
    duration must not report more than 100 %."""
    steps = pd.DataFrame({"duration_s": [0.1, 0.2], "useful_flops": [5e14, 1e15], "useful_bytes": [1e12, 1e9],
                          "running": [1, 1], "kv_blocks": [1, 1], "prefill_tokens": [0, 0], "decode_tokens": [1, 1],
                          "padded_tokens": [0, 0]})
    assert steps.duration_s.sum() / 0.3 > 1.0  # the raw ratio the clamp is for
    s = node_summary(steps, 0.3, 1, 1, peak_flops=1e15, peak_bw=1e12)
    assert s["busy"] == 1.0
    for k in ("gpu_util", "sol_util", "mfu", "mbu"):
        assert 0.0 < s[k] <= s["busy"]
    assert s["mfu"] == pytest.approx((0.1 + 0.2) / 0.3) and s["mbu"] == pytest.approx((0.1 + 0.001) / 0.3)


@pytest.mark.parametrize("name", ["dynamic", "chunked", "priority"])
def test_saturated_runs_report_busy_at_most_one(name):
    # saturated: the GPU never idles, so step times add up to the wall time (before: busy 1.0000000000000022)
    sc = Scenario(deployment(tp=8), workload_preset("mixed", 50.0, 300, 1), PRESETS[name])
    s = simulate(sc, saturated=True).summary()
    assert s["busy"] <= 1.0 and s["busy"] == pytest.approx(1.0)
    for k in ("gpu_util", "mfu", "mbu"):
        assert 0.0 < s[k] <= s["busy"]


def test_step_table_counts_admissions_and_follows_vllm_rules():
    sc = Scenario(deployment(kv_cache_tokens=20000), workload_preset("mixed", 20.0, 300, 1), PRESETS["chunked"])
    for pol in (PRESETS["chunked"], with_knobs(PRESETS["chunked"], preemption="swap"), PRESETS["continuous"],
                V0_CONTINUOUS):
        res = simulate(sc.with_policy(pol))
        st, req = res.steps, res.requests
        assert {"admitted", "stalled"} <= set(st.columns)
        assert req.preemptions.sum() > 0
        assert len(req) <= st.admitted.sum() <= len(req) + req.preemptions.sum()
        assert not ((st.preempted > 0) & (st.admitted > 0)).any()
        if not pol.prefill_only_steps:  # vLLM V1, chunked or whole prompts: every decode runs beside the prompts
            assert not ((st.prefill_tokens > 0) & (st.stalled > 0)).any()
        else:  # vLLM V0: decodes stall during prefill-only steps
            assert (st.stalled[(st.prefill_tokens > 0)] > 0).any()
    res = simulate(small("static", n=64))
    assert res.steps.admitted.sum() == 64 and res.steps.stalled.sum() == 0


def test_a_run_past_the_step_ceiling_is_a_clear_error_not_an_oom(monkeypatch):
    """A lightly loaded run takes many steps per request; the step tables stop at MAX_STEPS with a
    ValueError naming the requests and their span (the CLI prints it as one line) instead of
    doubling until the host runs out of memory."""
    from batching.sim.engine import kernel as eng
    from batching.sim.workload.requests import workload_preset

    monkeypatch.setattr(eng, "MAX_STEPS", 5_000)
    sc = Scenario(workload=workload_preset("chat", rate_req_s=0.05, num_requests=60, seed=0))
    with pytest.raises(ValueError, match=r"more than 5,000 steps \(60 requests arriving over [\d,]+ s\)"):
        simulate(sc)
    monkeypatch.setattr(eng, "MAX_STEPS", 10_000_000)
    assert simulate(sc).summary()["num_requests"] == 60
