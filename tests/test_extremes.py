"""Extreme but valid settings finish with sensible results or one clear message, in the library and on the
dashboard: 1 request, 10^6 requests, batch 1, a rate far above capacity, a KV cache of one block."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, SimResult, simulate
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, deployment
from batching.sim.workload.requests import LengthDist, SyntheticWorkload, workload_preset

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import drawn_charts, run_page  # noqa: E402


def _fixed(wl: SyntheticWorkload, prompt: int, output: int) -> SyntheticWorkload:
    return replace(wl, classes=tuple(replace(c, prompt=LengthDist("fixed", mean=prompt, low=1, high=prompt),
                                             output=LengthDist("fixed", mean=output, low=1, high=output))
                                     for c in wl.classes))


def assert_conserved(res: SimResult) -> None:
    """Every request released once, after it arrived; tokens in = tokens out; KV within capacity."""
    q, s = res.requests, res.steps
    assert len(q) == res.scenario.workload.num_requests
    assert np.all(np.isfinite(q[["first_token_s", "finish_s", "release_s"]].to_numpy()))
    assert (q["first_scheduled_s"] >= q["arrival_s"]).all() and (q["release_s"] >= q["finish_s"]).all()
    assert (q["ttft_s"] > 0).all() and (q["e2e_s"] >= q["ttft_s"]).all()
    # decode tokens are never computed twice (recompute preemption prefills prompt + generated instead)
    assert s["decode_tokens"].sum() == (q["output_tokens"] - 1).sum()
    assert res.itl_hist.sum() == (q["output_tokens"] - 1).sum()
    if q["preemptions"].sum() == 0:
        assert s["prefill_tokens"].sum() == q["prompt_tokens"].sum()
    else:
        assert s["prefill_tokens"].sum() >= q["prompt_tokens"].sum()
    assert s["kv_blocks"].max() <= res.scenario.deployment.kv_capacity_blocks
    assert (s["duration_s"] > 0).all()


# ---------------------------------------------------------------- the library


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("saturated", [False, True])
def test_one_request_every_preset(name: str, saturated: bool) -> None:
    res = simulate(Scenario(workload=workload_preset("mixed", 3.0, 1, 0), policy=PRESETS[name]), saturated=saturated)
    assert_conserved(res)
    s = res.summary()
    assert s["num_requests"] == 1 and s["preemptions"] == 0
    q = res.requests.iloc[0]
    # alone on the node: no queueing, one prefill then one decode step per further token; a request sent at a rate
    # reaches the engine's queue after its tokenisation (the default engine profile's client time), a capacity run
    # starts in the queue
    wait = 0.0 if saturated else res.scenario.profile.client_in_s(q["prompt_tokens"])
    assert q["queue_delay_s"] == pytest.approx(wait, abs=1e-9)
    assert len(res.steps) == q["output_tokens"]
    assert s["ttft_p50_s"] == s["ttft_p99_s"] == pytest.approx(q["ttft_s"])
    assert 0.005 < q["ttft_s"] < 2.0 and 0.001 < s["tpot_p50_s"] < 0.1
    assert s["throughput_output_tok_s"] == pytest.approx(q["output_tokens"] / q["e2e_s"], rel=1e-6)
    assert 0 < s["gpu_util"] <= 1 and s["busy"] == pytest.approx(1.0 - wait / q["e2e_s"])  # idle while tokenising
    assert s["batch_efficiency"] == pytest.approx(1 / PRESETS[name].batch_cap)


def test_a_million_requests_continuous_finish_and_conserve_tokens() -> None:
    """10^6 requests (the library's cap, workload.MAX_NUM_REQUESTS; the dashboard's is BATCHING_MAX_REQUESTS) in one run."""
    sc = Scenario(workload=workload_preset("sharegpt", 30.0, 1_000_000, 0), policy=PRESETS["continuous"])
    start = time.perf_counter()
    res = simulate(sc)
    elapsed = time.perf_counter() - start
    print(f"\n10^6 requests, continuous: {elapsed:.1f} s, {len(res.steps):,} steps")
    assert elapsed < 60  # about 6 s on 2 cores
    assert_conserved(res)
    s = res.summary()
    assert s["num_requests"] == 1_000_000
    # 30 req/s of ~195-token answers is below this node's capacity: it keeps up
    offered = res.requests["output_tokens"].sum() / res.requests["arrival_s"].iloc[-1]
    assert s["throughput_output_tok_s"] == pytest.approx(offered, rel=0.01)
    assert s["ttft_p99_s"] < 10


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_batch_of_one_serves_requests_one_at_a_time(mode: str) -> None:
    pol = with_knobs(PRESETS[mode], max_batch_size=1)
    res = simulate(Scenario(workload=workload_preset("chat", 3.0, 200, 0), policy=pol))
    assert_conserved(res)
    s, q = res.summary(), res.requests
    assert s["batch_efficiency"] == pytest.approx(1.0) and res.steps["running"].max() == 1
    assert res.steps["padded_tokens"].sum() == 0  # nothing to pad in a batch of one
    for _, rq in q.groupby("replica"):  # per replica, each request runs after the previous one left
        rq = rq.sort_values("first_scheduled_s")
        assert (rq["first_scheduled_s"].to_numpy()[1:] >= rq["release_s"].to_numpy()[:-1] - 1e-9).all()
    batched = simulate(Scenario(workload=workload_preset("chat", 3.0, 200, 0), policy=PRESETS[mode]))
    assert s["throughput_output_tok_s"] <= batched.summary()["throughput_output_tok_s"] * 1.0001


def test_rate_far_above_capacity_queues_and_runs_at_capacity() -> None:
    sc = Scenario(workload=workload_preset("chat", 10_000.0, 5_000, 0), policy=PRESETS["chunked"])
    res = simulate(sc)
    assert_conserved(res)
    s = res.summary()
    cap = simulate(sc, saturated=True).summary()["throughput_output_tok_s"]
    # every request arrives within half a second; the node serves them at its capacity, the queue takes the rest
    assert res.requests["arrival_s"].max() < 1.0
    assert s["throughput_output_tok_s"] == pytest.approx(cap, rel=0.05)
    assert s["ttft_p99_s"] > 10 and s["busy"] > 0.99
    assert res.steps["waiting"].max() > 1000


def test_kv_cache_of_one_block() -> None:
    one_block = replace(deployment(), kv_cache_tokens=KV_BLOCK_TOKENS)
    # requests longer than the cache: one clear error naming the request and the setting to change
    with pytest.raises(ValueError) as info:
        simulate(Scenario(deployment=one_block, workload=workload_preset("chat", 3.0, 20, 0)))
    msg = str(info.value)
    assert msg.startswith("request ") and "tokens of KV cache" in msg and "but the cache holds 16" in msg
    # the override is what keeps it out: raise it, to what the request needs (4,137 tokens: 259 blocks of 16)
    top = deployment().kv_capacity_tokens_max
    assert f"raise kv_cache_tokens to at least 4,144 (this deployment holds up to {top:,}) or use shorter requests" \
        in msg, msg
    # below one block is out of range
    with pytest.raises(ValueError, match=r"kv_cache_tokens=15 is out of range; allowed 16 to "):
        simulate(Scenario(deployment=replace(deployment(), kv_cache_tokens=15),
                          workload=workload_preset("chat", 3.0, 20, 0)))
    # requests that fit in one block run one at a time, under every preset
    wl = _fixed(workload_preset("chat", 3.0, 30, 0), prompt=10, output=6)
    for name, pol in PRESETS.items():
        res = simulate(Scenario(deployment=one_block, workload=wl, policy=pol))
        assert_conserved(res)
        assert res.steps["kv_blocks"].max() == 1 and res.steps["running"].max() == 1, name
        assert res.summary()["num_requests"] == 30


# ---------------------------------------------------------------- the dashboard (AppTest)


def test_dashboard_extremes_from_a_link_clamp_with_notices_and_show_a_clear_error() -> None:
    at = run_page("pages/explore.py", n="1", rate="1000", kv="1")
    assert not at.exception, [e.value for e in at.exception]
    notices = " ".join(w.value for w in at.warning)
    assert "n=1 for number of requests is out of range (allowed 10 to" in notices and "using 10" in notices
    assert "kv=1 for KV cache (tokens) is out of range" in notices and "using 1,024" in notices
    assert at.slider(key="wid:kv").value == 1024
    # a 1,024-token cache cannot hold the mixed workload's longest request: one error, what to change
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "tokens of KV cache" in msg and "raise kv_cache_tokens to at least 8,512 (this deployment holds up to" in msg


def test_dashboard_rate_far_above_capacity_and_batch_of_one() -> None:
    at = run_page("pages/explore.py", n="500", rate="1000", policy="static", batch="1")
    assert not at.exception and not at.error, [e.value for e in at.error]
    scenario, _ = at.session_state["explore_last"]  # the scenario of the last run; its result stays in the cache
    assert scenario.policy.max_batch_size == 1
    from batching.ui import cache

    result = cache.simulate_cached(scenario)  # a cache hit
    assert result.summary()["num_requests"] == 500 and result.steps["running"].max() == 1
    # 5 charts: the latency histograms are tabs, only the open one (TTFT) draws; the others are a click away
    assert len(drawn_charts(at)) == 5
    at.session_state["explore_hist_tab"] = "E2E"
    at.run()
    assert not at.exception and len(drawn_charts(at)) == 5


@pytest.mark.parametrize("query, note", [
    ({"n": "-5"}, "n=-5 for number of requests is out of range"),
    ({"n": "1e30"}, "n=1e30 for number of requests is out of range"),
    ({"n": "12.7"}, "n=12.7 for number of requests is not a whole number; using 13"),
    ({"rate": "0"}, "rate=0 for request rate (req/s) is out of range (allowed 0.1 to 10,000); using 0.1"),
    ({"rate": "1e308"}, "using 10,000"),
    ({"rate": "inf"}, "rate='inf' for request rate (req/s) is not valid"),
    ({"rate": "nan"}, "rate='nan' for request rate (req/s) is not valid"),
    ({"seed": "-1"}, "seed=-1 for seed is out of range"),
    ({"seed": str(2**40)}, "for seed is out of range (allowed 0 to 2,147,483,647)"),
    ({"tp": "3"}, "tp=3 for tensor parallel is not one of the allowed values (allowed 1, 2, 4, 8, 16); using 2"),
    ({"gpu": "tpu-v5"}, "gpu=tpu-v5 for GPU is not one of the allowed values"),
    ({"workload": "<script>"}, "workload=<script> for workload is not one of the allowed values"),
    ({"recorded": "maybe"}, "recorded='maybe' for replay at the recorded rate is not valid (allowed true or false)"),
    ({"n": "9" * 5000}, "(5,000 characters)"),
])
def test_url_values_out_of_range_are_clamped_with_a_notice(query: dict, note: str) -> None:
    at = run_page("app.py", **{"n": "100", **query})
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    notices = [w.value for w in at.warning]
    assert any(note in w for w in notices), notices
    assert all(len(w) < 400 for w in notices)
