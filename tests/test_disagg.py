"""Prefill/decode disaggregation (batching/sim/topology/disagg.py): requests, tokens and transfers are conserved, every
instance keeps its KV within its own capacity, a transfer takes the prompt's KV bytes over the link, runs repeat,
and the DistServe/Splitwise findings of issue 13 hold on a prefill-heavy workload."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from batching.sim.topology.disagg import Disagg
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, MODELS, Deployment
from batching.sim.workload.requests import workload_preset
from batching.studies.capacity import SLO, capacity

SPLIT = Disagg(1, 4, 1, 4)


def _check(res) -> None:
    q, s, sc = res.requests, res.steps, res.scenario
    dis = sc.disagg
    n = len(q)
    assert n == sc.workload.num_requests and np.isfinite(q["release_s"]).all()
    assert (q["first_scheduled_s"] >= q["arrival_s"]).all() and (q["first_token_s"] > q["first_scheduled_s"]).all()
    # every request moves to a decode instance, which streams all its tokens (vLLM's disaggregated serving)
    assert q["decode_replica"].between(dis.prefill_instances, dis.prefill_instances + dis.decode_instances - 1).all()
    assert q["replica"].between(0, dis.prefill_instances - 1).all()
    # transfers never lost: each starts when its decode instance's scheduler next runs after the prefill instance's
    # token is out (that instance's next step start, or at once when it is idle), ends when the request joins its
    # decode queue; the fixed time per transfer comes first
    np.testing.assert_allclose(q["decode_arrival_s"], q["prefill_done_s"] + q["kv_pull_wait_s"] + q["kv_transfer_s"],
                               rtol=0, atol=1e-9)
    assert (q["kv_pull_wait_s"] >= 0).all()
    pull = (q["prefill_done_s"] + q["kv_pull_wait_s"]).to_numpy()
    dcd_steps = s[s["role"] == "decode"]
    for (rep, t0, wait) in zip(q["decode_replica"], pull, q["kv_pull_wait_s"]):
        st = dcd_steps[dcd_steps["replica"] == rep]
        ends = (st["start_s"] + st["duration_s"]).to_numpy()
        if wait > 0:  # a step of that instance was under way at the handoff: the pull starts when it ends
            assert np.isclose(ends, t0, rtol=0, atol=1e-9).any()
            assert not ((st["start_s"] < t0 - wait) & (ends > t0 + 1e-9)).any()
    assert (q["kv_transfer_s"] >= dis.kv_transfer_fixed_s).all()
    assert (q["decode_queue_s"] >= -1e-12).all() and (q["first_token_s"] > q["decode_arrival_s"]).all()
    # TTFT as the client sees it: the prefill, the transfer, the decode queue and the decode's first step
    assert (q["ttft_s"] > q["kv_transfer_s"] + q["decode_queue_s"]).all()
    # tokens: prompts on the prefill side (one token out each, not sent); on the decode side the last prompt token
    # computed again (the first token is sampled from it) and the rest decoded
    pre, dcd = s[s["role"] == "prefill"], s[s["role"] == "decode"]
    if q["preemptions"].sum() == 0:
        assert pre["prefill_tokens"].sum() == q["prompt_tokens"].sum() - q["cached_prompt_tokens"].sum()
        assert pre["decode_tokens"].sum() == 0
        assert dcd["prefill_tokens"].sum() == n
        assert dcd["decode_tokens"].sum() == (q["output_tokens"] - 1).sum()
    assert res.itl_hist.sum() == (q["output_tokens"] - 1).sum()
    # every instance within its own cache, its steps in order
    for role, part in (("prefill", pre), ("decode", dcd)):
        cap = dis.deployment(sc.deployment, role).kv_capacity_blocks
        assert part["kv_blocks"].max() <= cap
        for _, st in part.groupby("replica"):
            start, dur = st["start_s"].to_numpy(), st["duration_s"].to_numpy()
            assert (dur > 0).all() and (start[1:] >= start[:-1] + dur[:-1] - 1e-9).all()
    # a prefill instance keeps a request's blocks until a decode instance has taken it in (the transfer, then any
    # wait for room there): every step's KV holds at least the blocks of the requests it released before the step
    # and not taken in by then (shared cached blocks would count once: only without cache hits)
    if q["cached_prompt_tokens"].sum() == 0:
        blocks = -(-q["prompt_tokens"].to_numpy() // KV_BLOCK_TOKENS)
        taken = (q["decode_arrival_s"] + q["decode_queue_s"]).to_numpy()
        for i, st in pre.groupby("replica"):
            mine = q["replica"].to_numpy() == i
            done, end = q["prefill_done_s"].to_numpy()[mine], taken[mine]
            start = st["start_s"].to_numpy()[:, None]
            held = ((done <= start) & (end > start + 1e-9)).astype(np.int64) @ blocks[mine]  # (end: a sum, rounded)
            assert (st["kv_blocks"].to_numpy() >= held).all()
    # TPOT: (E2E - TTFT) / (n - 1), the decode instance's gaps only
    d = q[q["output_tokens"] > 1]
    np.testing.assert_allclose(d["tpot_s"], (d["e2e_s"] - d["ttft_s"]) / (d["output_tokens"] - 1))


@pytest.mark.parametrize("split,workload,preset", [
    (SPLIT, "code", "chunked"), (Disagg(2, 2, 1, 4), "mixed", "priority"), (Disagg(1, 2, 3, 2), "chat", "continuous"),
])
def test_disaggregated_runs_conserve_requests_tokens_and_transfers(split, workload, preset) -> None:
    res = simulate(Scenario(workload=workload_preset(workload, 3.0, 500, 2), policy=PRESETS[preset], disagg=split))
    _check(res)
    s = res.summary()
    assert s["replicas"] == split.prefill_instances + split.decode_instances and s["gpus"] == split.gpus
    assert 0 < s["prefill_busy"] <= 1 and 0 < s["decode_busy"] <= 1
    assert s["kv_transfer_p50_s"] > 0 and s["decode_queue_p99_s"] >= 0


def test_heavy_load_makes_requests_wait_for_decode_room_and_nothing_is_dropped() -> None:
    """A small decode cache under a burst: requests wait on the decode side (backpressure), all finish."""
    dep = Deployment(kv_cache_tokens=12_000)
    res = simulate(Scenario(dep, workload_preset("chat", 50.0, 600, 0), PRESETS["chunked"], disagg=Disagg(2, 2, 1, 4)))
    _check(res)
    assert res.summary()["decode_queue_p99_s"] > 1.0


def test_a_prefill_instance_holds_the_kv_until_its_transfer_ends() -> None:
    """Issue 23 item 5: the prefill instance keeps a request's blocks until its KV has moved (vLLM frees them when
    the decode side reports the read done). Llama-3.1-8B, 30,000 KV tokens per instance, 3,000-token prompts at
    4 req/s: over a 1 Gb/s link each transfer takes 3,000 x 131,072 B / 125 MB/s = 3.15 s, so ~12 prompts' KV
    (~38,000 tokens) would be held at once, more than the cache: prompts wait for transfers to end. At 10 Gb/s
    (0.32 s) the held KV fits and nobody waits."""
    from batching.studies.trtllm_table import fixed_workload
    from batching.sim.workload.requests import ArrivalProcess

    dep = Deployment(model=MODELS["llama-3.1-8b"], kv_cache_tokens=30_000)
    wl = replace(fixed_workload(3000, 150, 300), arrivals=ArrivalProcess("poisson", 4.0))
    runs = {g: simulate(Scenario(dep, wl, PRESETS["chunked"], disagg=Disagg(1, 1, 1, 1, kv_link_gbps=g)))
            for g in (10.0, 1.0)}
    for res in runs.values():
        _check(res)
    fast, slow = (runs[g].requests for g in (10.0, 1.0))
    np.testing.assert_allclose(slow["kv_transfer_s"], 6.7e-3 + 3000 * 131_072 / 125e6, rtol=1e-12)
    wait = {g: (r.requests["first_scheduled_s"] - r.requests["arrival_s"]).median() for g, r in runs.items()}
    assert wait[10.0] < 0.05 and wait[1.0] > 5.0
    pre = runs[1.0].steps[runs[1.0].steps["role"] == "prefill"]
    cap = dep.kv_capacity_blocks
    # the held transfers fill the prefill instance's cache (a lone 3,000-token prompt takes 188 of its blocks)
    assert pre["kv_blocks"].max() > 0.9 * cap and pre["kv_blocks"].max() <= cap
    assert slow["ttft_s"].median() > fast["ttft_s"].median() + wait[1.0]


def test_decode_backpressure_reaches_the_prefill_instance() -> None:
    """The prefill instance keeps a request's KV until a decode instance takes it in, so a full decode cache holds
    the prefill's blocks too and new prompts wait there (vLLM's decode side reads the KV only once it has room;
    the prefill frees it after the read). Llama-3.1-8B, 30,000 KV tokens per instance, 1,000-token prompts with
    1,000-token answers at 8 req/s: decode-bound."""
    from batching.studies.trtllm_table import fixed_workload
    from batching.sim.workload.requests import ArrivalProcess

    dep = Deployment(model=MODELS["llama-3.1-8b"], kv_cache_tokens=30_000)
    wl = replace(fixed_workload(1000, 1000, 240), arrivals=ArrivalProcess("poisson", 8.0))
    res = simulate(Scenario(dep, wl, PRESETS["chunked"], disagg=Disagg(1, 1, 1, 1)))
    _check(res)
    q, s = res.requests, res.steps
    pre = s[s["role"] == "prefill"]
    assert q["decode_queue_s"].median() > 1.0  # the decode side is full
    # so is the prefill side, with requests waiting for decode room: its prompts queue
    assert pre["kv_blocks"].max() > 0.9 * dep.kv_capacity_blocks
    assert (q["first_scheduled_s"] - q["arrival_s"]).quantile(0.9) > 1.0


def test_transfer_time_is_the_prompts_kv_over_the_link() -> None:
    res = simulate(Scenario(workload=workload_preset("chat", 2.0, 100, 0), policy=PRESETS["chunked"], disagg=SPLIT))
    dep = res.scenario.deployment
    d = res.requests
    assert len(d) == 100
    # by hand: Qwen2.5-72B's KV is 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 2 B (BF16) = 327,680 B per token;
    # TP 4 to TP 4 on one node moves it over 4 GPU pairs x 450 GB/s (H100 NVLink per direction) = 1.8e12 B/s,
    # so 1.82e-7 s per prompt token (1,000 tokens: 0.18 ms), after the 6.7 ms of posting the transfer (vLLM's
    # NixlConnector, issue #50913)
    np.testing.assert_allclose(d["kv_transfer_s"], 6.7e-3 + d["prompt_tokens"] * 327_680 / 1.8e12, rtol=1e-12)
    # the link each GPU pair moves its share over: a stated 100 Gb/s = 12.5 GB/s; NVLink within a node (450 GB/s per
    # direction on H100); past a node's 8 GPUs, one 400 Gb/s NIC per GPU = 50 GB/s
    assert Disagg(1, 4, 1, 4, kv_link_gbps=100.0).link_per_gpu_Bps(dep) == pytest.approx(1.25e10, rel=1e-12)
    assert Disagg(1, 4, 2, 2).link_per_gpu_Bps(dep) == pytest.approx(4.5e11, rel=1e-12)
    assert Disagg(2, 8, 1, 8).link_per_gpu_Bps(dep) == pytest.approx(5e10, rel=1e-12)


def test_an_mla_transfer_moves_the_whole_latent_on_every_rank() -> None:
    """Issue 23 item 5: DeepSeek-V3 FP8 on H200, 1 x TP 8 -> 1 x TP 8 across nodes, a 4,096-token prompt. Every TP rank of an
    MLA model holds the whole latent (512 + 64 RoPE) x 61 layers x 2 B (BF16 KV) = 70,272 B per token, so each
    decode rank receives all 288 MB over its own 50 GB/s NIC: 5.76 ms (it was divided by 8 ranks: 0.72 ms). A GQA
    model's transfer is unchanged: its KV heads split over the ranks."""
    v3 = deployment(model="deepseek-v3", gpu="h200-sxm", precision="fp8", tp=8)  # 671 GB of FP8 weights: H200s
    across = Disagg(1, 8, 1, 8, kv_link_gbps=400.0)  # 400 Gb/s per GPU, the cross-node NIC
    assert across.kv_bytes_per_gpu_token(v3) == 70_272
    fixed = across.kv_transfer_fixed_s
    assert across.transfer_s(v3, np.array([4096]))[0] == pytest.approx(fixed + 4096 * 70_272 / 50e9, rel=1e-12)
    assert across.transfer_s(v3, np.array([4096]))[0] - fixed == pytest.approx(5.757e-3, rel=1e-3)
    qwen = deployment()  # Qwen2.5-72B: 8 KV heads, 327,680 B per token: TP 4 -> TP 2 is bound by the TP 2 side
    assert Disagg(1, 4, 2, 2).transfer_s(qwen, np.array([1000]))[0] == pytest.approx(
        fixed + 1000 * 327_680 / 9e11, rel=1e-12)
    # the fixed time per transfer can be set (0 to 10 s)
    assert Disagg(1, 4, 2, 2, kv_transfer_fixed_s=0.0).transfer_s(qwen, np.array([0]))[0] == 0.0


def test_figure_captions_name_the_split_not_the_sidebar_tp() -> None:
    from batching.charts.export import scenario_caption

    assert " · 1 prefill × TP 4 + 1 decode × TP 4 · " in scenario_caption(Scenario(disagg=SPLIT))
    assert "TP 8" not in scenario_caption(Scenario(disagg=SPLIT))
    assert scenario_caption(Scenario(nodes=2, disagg=Disagg(1, 8, 1, 8))).startswith("Simulated: 2 nodes of 8×")


def test_a_split_across_two_nodes_runs() -> None:
    res = simulate(Scenario(workload=workload_preset("chat", 4.0, 300, 1), policy=PRESETS["chunked"], nodes=2,
                            disagg=Disagg(1, 8, 1, 8)))
    _check(res)


def test_a_disaggregated_run_repeats() -> None:
    sc = Scenario(workload=workload_preset("mixed", 4.0, 300, 5), policy=PRESETS["chunked"], disagg=SPLIT)
    a, b = simulate(sc), simulate(sc)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)


@pytest.mark.parametrize("kwargs,match", [
    (dict(disagg=Disagg(2, 4, 1, 4)), r"the split needs 12 GPUs .* but 1 node of 8 GPUs have 8"),
    (dict(disagg=Disagg(0, 4, 1, 4)), r"prefill_instances=0 is out of range"),
    (dict(disagg=Disagg(1, 3, 1, 4)), r"prefill_tp=3 is not allowed"),
    (dict(disagg=Disagg(1, 4, 1, 4, kv_link_gbps=0.1)), r"kv_link_gbps=0.1 is out of range"),
    (dict(disagg=Disagg(1, 4, 1, 4, kv_transfer_fixed_s=-1.0)), r"kv_transfer_fixed_s=-1.0 is out of range; allowed 0 to 10 s"),
    (dict(disagg=SPLIT, policy=PRESETS["static"]), r"mode='static' runs each batch as a whole"),
    (dict(disagg=Disagg(1, 1, 1, 4)), r"the prefill instances \(TP 1\): model Qwen2.5-72B"),
    # speculation runs on a split (tests/test_spec_disagg.py); a proposer the model has not is refused by role
    (dict(disagg=SPLIT, policy=replace(PRESETS["chunked"], spec_decode="mtp")),
     r"the prefill instances \(TP 4\): spec_decode='mtp' needs multi-token-prediction modules"),
])
def test_bad_splits_are_refused_with_clear_messages(kwargs, match) -> None:
    kwargs.setdefault("workload", workload_preset("chat", 1.0, 20, 0))
    kwargs.setdefault("policy", PRESETS["chunked"])
    with pytest.raises(ValueError, match=match):
        simulate(Scenario(**kwargs))


# ---------------------------------------------------------------- findings (DistServe, Splitwise)

CODE = workload_preset("code", 1.0, 1000, 0)  # Azure code 2023: prompts mean 2,048 tokens, outputs mean 28


def test_finding_disaggregation_cuts_p99_tpot_at_a_load_both_carry() -> None:
    """Prefill-heavy traffic at 4 req/s, which both carry (no queue growth): aggregated chunked prefill on TP 8
    mixes 2,048-token prompt chunks into the decode steps, so a decode waits behind them; a decode instance runs
    decodes only. Measured: P99 TPOT 98.9 ms aggregated against 26.5 ms disaggregated (1 prefill TP 4 + 1 decode
    TP 4); P99 TTFT rises from 0.61 to 1.52 s (a TP 4 prefill instance instead of TP 8 and all eight GPUs)."""
    wl = CODE.with_rate(4.0)
    agg = simulate(Scenario(workload=wl, policy=PRESETS["chunked"])).summary()
    dis = simulate(Scenario(workload=wl, policy=PRESETS["chunked"], disagg=SPLIT)).summary()
    for s in (agg, dis):
        assert s["queue_growth_req_s"] < 0.05 * s["offered_req_s"]
    assert dis["tpot_p99_s"] < 0.5 * agg["tpot_p99_s"]
    assert dis["ttft_p99_s"] > agg["ttft_p99_s"]


def test_finding_a_tight_tpot_slo_favours_disaggregation_a_loose_one_aggregation() -> None:
    """Capacity within the SLOs on the same 8 GPUs. Tight (TPOT <= 50 ms, TTFT <= 5 s): the aggregated node meets
    TPOT only at low rates (measured 1.40 req/s, TPOT binds) against 5.94 req/s for the split (TTFT binds).
    Loose (TPOT <= 200 ms, TTFT <= 5 s): aggregation carries 9.69 req/s against the split's 5.94: all eight GPUs
    prefill there, while the split's one TP 4 prefill instance binds and its decode instance has room to spare."""
    tight, loose = SLO(ttft_s=5.0, tpot_s=0.05), SLO(ttft_s=5.0, tpot_s=0.2)
    rates = {}
    for name, slo in (("tight", tight), ("loose", loose)):
        for label, split in (("agg", None), ("dis", SPLIT)):
            sc = Scenario(workload=CODE, policy=PRESETS["chunked"], disagg=split)
            rates[name, label] = capacity(sc, slo, rel_tol=0.03).max_rate_req_s
    assert rates["tight", "dis"] > 1.5 * rates["tight", "agg"], rates
    assert rates["loose", "agg"] > rates["loose", "dis"], rates


# ---------------------------------------------------------------- property tests over random splits and traffic
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from batching.sim.hardware.specs import GPUS, Node, deployment, model_from_dict  # noqa: E402
from tests.test_specs_mla import DEEPSEEK_V2_LITE_HF  # noqa: E402

SMALL = deployment(model="llama-3.1-8b")  # fits TP 1, so every split of the GPUs is valid
V2_LITE = model_from_dict(DEEPSEEK_V2_LITE_HF)  # MLA, 16 heads (TP 1 to 8), 31 GB of BF16 weights: fits TP 1
# KV bytes per token, by hand: Llama-3.1-8B 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 B = 131,072;
# DeepSeek-V2-Lite (MLA) (512 latent + 64 RoPE key) x 27 layers x 2 B = 31,104
KV_BYTES = {"Llama-3.1-8B": 131_072, V2_LITE.name: 31_104}


@st.composite
def splits(draw):
    """A split of 1 or 2 nodes of 8 H100s (TP 1 to 8 on each side, more than 8 GPUs: across nodes), a GQA or an
    MLA model, a workload, a policy, a rate, a seed and a KV cache size (None: what memory leaves)."""
    nodes = draw(st.sampled_from([1, 2]))
    gpus = 8 * nodes
    tps = (1, 2, 4, 8)
    p_tp = draw(st.sampled_from([t for t in tps if t < gpus]))  # room for a decode instance beside it
    d_tp = draw(st.sampled_from([t for t in tps if p_tp + t <= gpus]))
    p = draw(st.integers(1, min(4, (gpus - d_tp) // p_tp)))
    d = draw(st.integers(1, min(8, (gpus - p * p_tp) // d_tp)))
    model = draw(st.sampled_from([SMALL.model, V2_LITE]))
    kv = draw(st.sampled_from([None, 12_000, 40_000]))
    return (Disagg(p, p_tp, d, d_tp), nodes, model, draw(st.sampled_from(["chat", "mixed", "code", "sharegpt"])),
            draw(st.sampled_from(["continuous", "chunked", "priority"])), draw(st.floats(0.5, 40.0)),
            draw(st.integers(0, 10_000)), kv)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(splits())
@example((Disagg(1, 8, 1, 8), 2, V2_LITE, "code", "chunked", 20.0, 1, None))  # TP 8, across nodes, MLA
@example((Disagg(3, 2, 1, 8), 2, SMALL.model, "chat", "priority", 10.0, 2, 12_000))  # 14 GPUs, unequal TP
def test_property_every_split_conserves_requests_tokens_transfers_and_kv(case) -> None:
    split, nodes, model, workload, preset, rate, seed, kv = case
    dep = Deployment(Node(GPUS["h100-sxm"]), model, kv_cache_tokens=kv)
    res = simulate(Scenario(dep, workload_preset(workload, rate, 120, seed), PRESETS[preset], nodes=nodes,
                            disagg=split))
    _check(res)
    # each transfer: the prompt's KV at 450 GB/s (H100 NVLink per direction) per GPU within a node, or at 400 Gb/s =
    # 50 GB/s (a NIC per GPU) when the split spans nodes; a GQA model's KV (KV_BYTES) split over min(prefill TP,
    # decode TP) GPU pairs, an MLA model's whole latent moved by every decode rank (each rank holds all of it)
    per_gpu = 450e9 if split.gpus <= 8 else 50e9
    ranks = 1 if model.is_mla else min(split.prefill_tp, split.decode_tp)
    d = res.requests[res.requests["decode_replica"] >= 0]
    np.testing.assert_allclose(d["kv_transfer_s"], split.kv_transfer_fixed_s
                               + d["prompt_tokens"] * KV_BYTES[model.name] / (ranks * per_gpu), rtol=1e-12)


def test_exports_carry_the_per_instance_chart_of_a_split() -> None:
    """The report and the downloads (report.policy_figures) show each instance against its own role's cache."""
    from batching import report

    res = simulate(Scenario(workload=workload_preset("chat", 2.0, 150, 0), policy=PRESETS["chunked"],
                            disagg=Disagg(1, 4, 2, 2)))
    figs = report.policy_figures(res)
    fig = figs["per_instance"][0]
    names = sorted({t.name for t in fig.data} - {"scenario caption"})
    assert names == ["decode 1", "decode 2", "prefill 0"]
    kv = [t for t in fig.data if t.name in names and t.yaxis in (None, "y")]
    assert len(kv) == 3
    assert all(np.nanmax(np.asarray(t.y, float)) <= 100.0 for t in kv)
    assert "per_instance" not in report.policy_figures(simulate(Scenario(workload=workload_preset("chat", 2.0, 50,
                                                                                                  0))))


# ------------------------------------------------- closed-loop clients and sessions on a split (issue 23 item 1)


def _in_flight_max(req) -> int:
    """The most requests sent and not yet released at any moment (a release before a send at the same instant)."""
    events = np.r_[req["arrival_s"].to_numpy(), req["release_s"].to_numpy()]
    moves = np.r_[np.ones(len(req)), -np.ones(len(req))]
    return int(np.cumsum(moves[np.lexsort((moves, events))]).max())


def test_closed_loop_clients_on_a_split_send_after_their_last_token() -> None:
    """Published disaggregated runs use a fixed number of clients (genai-perf, aiperf, vllm bench serve
    --max-concurrency): each client sends its next request a think time after its last token came from the decode
    instance, so never two in flight per client, and TTFT is measured from that send."""
    wl = workload_preset("sharegpt", 1.0, 320, 0).with_concurrency(8, 0.5)
    res = simulate(Scenario(workload=wl, policy=PRESETS["chunked"], disagg=Disagg(2, 2, 1, 4)))
    _check(res)
    req = res.requests
    client = req["request_id"].to_numpy() % 8
    for c in range(8):
        mine = req[client == c].sort_values("arrival_s")
        assert len(mine) == 40
        send, done = mine["arrival_s"].to_numpy(), mine["release_s"].to_numpy()
        np.testing.assert_allclose(send[1:], done[:-1] + 0.5, rtol=0, atol=1e-9)
    assert _in_flight_max(req) <= 8
    np.testing.assert_allclose(req["ttft_s"], req["first_token_s"] - req["arrival_s"], rtol=0, atol=1e-12)
    s = res.summary()
    assert s["concurrency"] == 8 and s["think_time_s"] == 0.5
    # both prefill instances took requests (the router picks per request, not per client)
    assert set(req["replica"]) == {0, 1}


def test_more_clients_on_a_split_queue_at_the_prefill_and_stay_bounded() -> None:
    """A closed loop never overloads: more clients wait longer (TTFT grows with the clients, as Dynamo's 32-client
    runs show) but at most N requests are ever in the system. 64 clients on one prefill instance of TP 2 keep it
    busy: the run's send rate reaches the saturated run's (the open-loop rule would call it overloaded), yet its
    latencies are what the clients measure, so the comparison does not mark them unbounded."""
    from batching.studies.compare import compare

    split = Disagg(1, 2, 1, 4)
    ttft = {}
    for n in (4, 64):
        wl = workload_preset("code", 1.0, 384, 1).with_concurrency(n)
        res = simulate(Scenario(workload=wl, policy=PRESETS["chunked"], disagg=split))
        _check(res)
        assert _in_flight_max(res.requests) <= n
        ttft[n] = res.summary()["ttft_p50_s"]
    assert ttft[64] > 3 * ttft[4]
    wl = workload_preset("code", 1.0, 384, 1).with_concurrency(64)
    s = compare(Scenario(workload=wl, policy=PRESETS["chunked"], disagg=split), {"chunked": PRESETS["chunked"]}
                ).summaries()["chunked"]
    assert s["load"] > 0.95 and s["prefill_busy"] > 0.95
    assert s["offered_req_s"] >= s["capacity_req_s"]  # the open-loop rule's "overloaded"
    assert s["overloaded"] is False and s["concurrency"] == 64


def test_sessions_on_a_split_arrive_after_their_previous_turn() -> None:
    """Multi-turn sessions run on a split: each later turn is sent a think time after the previous turn's last
    token (its decode instance's release); the decode instance's prefix cache holds the earlier turns' prompt and
    output, so a later turn moves only the rest (tests/test_decode_prefix_cache.py checks it request by request)."""
    wl = workload_preset("chat-sessions", 1.0, 120, 0)
    reqs = wl.generate()
    res = simulate(Scenario(workload=wl, policy=PRESETS["chunked"], disagg=SPLIT))
    _check(res)
    req = res.requests.set_index("request_id").loc[np.arange(len(reqs))]
    later = np.flatnonzero(reqs.after >= 0)
    assert len(later) > 0
    np.testing.assert_allclose(req["arrival_s"].to_numpy()[later],
                               req["release_s"].to_numpy()[reqs.after[later]] + reqs.think_s[later], rtol=0, atol=1e-9)
    # every turn's prompt KV moves but what its decode instance held: first turns whole, later turns mostly not
    moved = (req["prompt_tokens"] - req["decode_cached_tokens"]).to_numpy()
    np.testing.assert_allclose(req["kv_transfer_s"], SPLIT.transfer_s(res.scenario.deployment, moved), rtol=1e-12)
    cached, prompt = req["decode_cached_tokens"].to_numpy(), req["prompt_tokens"].to_numpy()
    assert cached[later].sum() > 0.5 * prompt[later].sum()
    assert cached[later].mean() > cached[reqs.after < 0].mean()


def test_a_split_is_calibrated_only_if_both_roles_are() -> None:
    """Qwen3-30B-A3B in FP8 on H100: the measured grouped-expert table covers TP 2 but not TP 4, so a split with
    TP 4 decode instances is not calibrated though the sidebar's TP 2 is (each role's own TP is what runs)."""
    from batching.sim.hardware.kernel_tables import calibration_status

    dep = deployment(gpu="h100-sxm", model="qwen3-30b-a3b", tp=2, num_gpus=8, precision="fp8")
    assert calibration_status(Scenario(dep)) == (True, "")
    ok, why = calibration_status(Scenario(dep, disagg=Disagg(1, 2, 1, 4)))
    assert ok is False and "no measured grouped-expert table for Qwen3-30B-A3B" in why
    assert calibration_status(Scenario(dep, disagg=Disagg(2, 2, 2, 2)))[0] is True


def test_a_closed_loop_on_a_split_equals_the_open_loop_of_its_send_times() -> None:
    """The split's loop is exact: the sends a closed loop discovers as its requests end, given to an open loop in
    advance, give the same run request by request (the closed loop steps one instance at a time, the open loop
    runs each instance up to its next event; an instance that ran past a send would join it late)."""
    from batching.sim.engine.state import R_ARRIVAL, R_FIRST_SCHED, R_FIRST_TOKEN, R_RELEASE
    from batching.sim.topology.disagg import run_disagg
    from batching.sim.workload.requests import Requests

    dep, split, pol = deployment(), Disagg(2, 2, 1, 4), PRESETS["chunked"]
    closed = workload_preset("sharegpt", 1.0, 160, 3).with_concurrency(6, 0.2).generate()
    a = run_disagg(closed, dep, split, pol, "vllm_graph")
    sent = a["prefill"][0].req_f[:, R_ARRIVAL]
    order = np.lexsort((np.arange(len(sent)), sent))
    opened = Requests(sent[order], closed.prompt_tokens[order], closed.output_tokens[order], closed.priority[order],
                      closed.class_names)
    b = run_disagg(opened, dep, split, pol, "vllm_graph")
    for role, col in (("prefill", R_FIRST_SCHED), ("prefill", R_FIRST_TOKEN), ("decode", R_FIRST_TOKEN),
                      ("decode", R_RELEASE)):
        np.testing.assert_array_equal(a[role][0].req_f[order, col], b[role][0].req_f[:, col])
    np.testing.assert_array_equal(a["dec_rep"][order], b["dec_rep"])
    # and no request waits on the decode side longer than a decode step: the cache has room for all
    q = a["decode"][0].req_f[:, R_FIRST_SCHED] - a["decode_arrival_s"]
    steps = a["decode"][0].steps_f[0, : a["decode"][1][0]]
    assert q.max() <= steps[:, 1].max() + 1e-9
