"""Speculative decoding on a prefill/decode split (issue 23 item 3; batching/sim/topology/disagg.py): the decode
instances speculate with their own deployment's Spec, the prefill instances run only the proposer's pass over the
prompt (SGLang's prefill server with --speculative-algorithm), the proposer's KV moves with the target's, and the
summary carries the speculation figures of the decode steps."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from batching.cli.args import SPEC_DISAGG_KEYS, SPEC_KEYS
from batching.cli.main import main
from batching.sim.engine.speculative import expected_tokens_per_step, head_layers
from batching.sim.hardware.specs import deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.topology.disagg import Disagg
from batching.sim.workload.requests import SyntheticWorkload, workload_preset

# DeepSeek-V3 FP8 on H200 served as DeepSeek serves it: MTP (one module, K = 1) on a 1 x TP 8 + 1 x TP 8 split of two
# nodes. Its paper's acceptance of the second token, 85-90 % (arXiv:2412.19437 §5.4.3), as A = 0.85
V3 = deployment(model="deepseek-v3", gpu="h200-sxm", precision="fp8", tp=8)
V3_SPLIT = Disagg(1, 8, 1, 8)
MTP = replace(PRESETS["chunked"], spec_decode="mtp", spec_tokens=1, spec_acceptance=0.85)
# Llama-3.1-8B BF16 with an EAGLE head on two H100s: 1 x TP 1 + 1 x TP 1 (runs in seconds)
L8 = deployment(model="llama-3.1-8b", gpu="h100-sxm", tp=1, num_gpus=2)
L8_SPLIT = Disagg(1, 1, 1, 1)
EAGLE = replace(PRESETS["chunked"], spec_decode="eagle", spec_tokens=3, spec_acceptance=0.7)


def _run(dep, split, policy, rate=0.5, n=60, seed=3, nodes=1, workload="chat"):
    return simulate(Scenario(dep, workload_preset(workload, rate, n, seed), policy, nodes=nodes, disagg=split))


def _check_spec_split(res) -> None:
    q, s, sc = res.requests, res.steps, res.scenario
    dis, dep, pol = sc.disagg, sc.deployment, sc.policy
    n = len(q)
    assert n == sc.workload.num_requests and np.isfinite(q["release_s"]).all()
    pre, dcd = s[s["role"] == "prefill"], s[s["role"] == "decode"]
    # the decode side emits every output token: its first from the recomputed last prompt token, the rest from
    # verification steps (accepted drafts + the target's token); rejected drafts are padding, never emitted
    if q["preemptions"].sum() == 0:
        assert pre["prefill_tokens"].sum() == q["prompt_tokens"].sum()
        assert dcd["prefill_tokens"].sum() == n
        assert dcd["decode_tokens"].sum() == (q["output_tokens"] - 1).sum()
    # one inter-token gap per step that emits for a request: a verification's accepted tokens come out together
    assert res.itl_hist.sum() == (q["output_tokens"] - 1).sum() - q["spec_accepted_tokens"].sum()
    assert pre["decode_tokens"].sum() == 0 and pre["spec_seqs"].sum() == 0 and pre["padded_tokens"].sum() == 0
    # accepted drafts: per request on its decode instance, in total the decode steps'
    assert q["spec_accepted_tokens"].sum() == dcd["spec_accepted"].sum() > 0
    assert (q["spec_accepted_tokens"] <= q["output_tokens"] - 1).all()
    assert dcd["padded_tokens"].sum() == dcd["spec_proposed"].sum() - dcd["spec_accepted"].sum()
    # every instance within its own cache, less the proposer's share
    for role, part in (("prefill", pre), ("decode", dcd)):
        cap = dis.kv_blocks(dep, role, pol)
        assert cap < dis.deployment(dep, role).kv_capacity_blocks  # the head's weights and KV take their share
        assert part["kv_blocks"].max() <= cap
    # the proposer runs over every prompt on the prefill instances: each of their steps drafts
    assert (pre["draft_s"] > 0).all() and (pre["draft_s"] < pre["duration_s"]).all()
    summary = res.summary()
    assert summary["kv_capacity_tokens"] == dis.kv_blocks(dep, "decode", pol) * 16
    assert 0 < summary["prefill_draft_time_share"] < 1 and 0 < summary["draft_time_share"] < 1


def test_deepseek_v3_mtp_on_a_split_conserves_tokens_and_keeps_kv_in_each_cache() -> None:
    res = _run(V3, V3_SPLIT, MTP, nodes=2)
    _check_spec_split(res)
    s = res.summary()
    # K = 1: a verification emits 1 + A tokens on average (1.85), sampled
    assert s["mean_tokens_per_step"] == pytest.approx(expected_tokens_per_step(1, 0.85), rel=0.05)
    assert s["spec_acceptance_rate"] == pytest.approx(0.85, abs=0.05)
    assert s["spec_share"] > 0.9  # at 0.5 req/s every decode step speculates


def test_the_mtp_module_kv_moves_with_the_latent() -> None:
    """The transfer carries the MTP module's KV too (SGLang's prefill sends the draft KV pool): DeepSeek-V3's latent
    is 70,272 B per token on every rank (61 layers), the module adds head_layers / 61 of it."""
    base = V3_SPLIT.kv_bytes_per_gpu_token(V3)
    assert base == 70_272
    assert V3_SPLIT.kv_bytes_per_gpu_token(V3, MTP) == pytest.approx(base * (1 + head_layers(V3) / 61), rel=1e-12)
    assert V3_SPLIT.kv_bytes_per_gpu_token(V3, replace(MTP, spec_decode="off")) == base
    ngram = replace(EAGLE, spec_decode="ngram")  # no proposer KV: the transfer is unchanged
    assert L8_SPLIT.kv_bytes_per_gpu_token(L8, ngram) == L8_SPLIT.kv_bytes_per_gpu_token(L8)
    res = _run(L8, L8_SPLIT, EAGLE, n=30)
    q = res.requests
    per_token = L8_SPLIT.kv_bytes_per_gpu_token(L8, EAGLE)
    assert per_token > L8_SPLIT.kv_bytes_per_gpu_token(L8)
    np.testing.assert_allclose(q["kv_transfer_s"], L8_SPLIT.kv_transfer_fixed_s
                               + q["prompt_tokens"] * per_token / L8.node.gpu.nvlink_Bps, rtol=1e-12)


@pytest.mark.parametrize("method", ["eagle", "ngram"])
def test_eagle_and_ngram_on_a_split_conserve_and_repeat_for_a_seed(method) -> None:
    pol = replace(EAGLE, spec_decode=method)
    a, b = _run(L8, L8_SPLIT, pol), _run(L8, L8_SPLIT, pol)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    other = _run(L8, L8_SPLIT, pol, seed=4)  # another seed: other requests and other acceptance draws
    assert not a.requests["spec_accepted_tokens"].equals(other.requests["spec_accepted_tokens"])
    if method == "eagle":
        _check_spec_split(a)
    else:  # n-gram lookup: no GPU pass anywhere, the caches keep their whole size
        s = a.steps
        assert s["draft_s"].sum() == 0 and a.summary()["prefill_draft_time_share"] == 0
        q = a.requests
        assert s[s["role"] == "decode"]["decode_tokens"].sum() == (q["output_tokens"] - 1).sum()
        assert a.summary()["kv_capacity_tokens"] == L8_SPLIT.deployment(L8, "decode").kv_capacity_tokens


def test_speculation_speeds_up_the_split_at_low_load() -> None:
    """At 0.5 req/s a TP 1 decode instance of Llama-3.1-8B runs a few sequences: verification reads the weights
    once for K + 1 tokens, so TPOT falls by about the tokens per verification less the head's passes; the prefill
    instance pays the head's pass over the prompt, so TTFT rises a little."""
    off = _run(L8, L8_SPLIT, PRESETS["chunked"]).summary()
    on = _run(L8, L8_SPLIT, EAGLE).summary()
    speedup = off["tpot_p50_s"] / on["tpot_p50_s"]
    assert 1.3 < speedup < expected_tokens_per_step(3, 0.7)  # 2.53 tokens per verification bounds it
    assert on["e2e_p50_s"] < off["e2e_p50_s"]
    assert on["ttft_p50_s"] > off["ttft_p50_s"]


def test_a_proposer_that_does_not_fit_an_instance_is_refused_by_role() -> None:
    # Llama-3.1-70B BF16 on TP 2 H100s leaves no room: the prefill instances are named
    dep = deployment(model="llama-3.1-70b", gpu="h100-sxm", tp=4)
    pol = replace(PRESETS["chunked"], spec_decode="draft", spec_draft_model="llama-3.1-8b")
    with pytest.raises(ValueError, match=r"^the prefill instances \(TP 2\): spec_draft_model='llama-3.1-8b'"):
        simulate(Scenario(dep, SyntheticWorkload(num_requests=5), pol, disagg=Disagg(1, 2, 1, 4)))


def test_cli_runs_eagle_on_a_split_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    rc = main(["run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-gpus", "2", "--tp", "1",
               "--requests", "40", "--rate", "0.5", "--spec-decode", "eagle", "--spec-tokens", "3",
               "--spec-acceptance-length", "2.5", "--prefill-instances", "1", "--prefill-tp", "1",
               "--decode-instances", "1", "--decode-tp", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "# disaggregated: 1 prefill x TP 1 + 1 decode x TP 1" in text
    for k in (*SPEC_KEYS, *SPEC_DISAGG_KEYS):
        assert k in text
    s = json.loads(out.read_text())
    assert set(SPEC_KEYS) | set(SPEC_DISAGG_KEYS) <= set(s)
    # the acceptance given as engines report it: 2.5 tokens per verification, sampled
    assert s["mean_tokens_per_step"] == pytest.approx(2.5, rel=0.1)
    assert 0 < s["prefill_draft_time_share"] < 1
