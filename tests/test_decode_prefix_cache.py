"""Issue 23 item 5: a prefill/decode split's decode instances keep a prefix cache, as vLLM's decode instance does
(NixlConnector's get_num_new_matched_tokens pulls only the prompt tokens past its local prefix-cache hits): a
request's transfer moves only what its decode instance does not hold, the blocks it holds are shared there, and
every figure stays conserved and within each instance's KV cache."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.topology.disagg import Disagg
from batching.sim.workload.requests import workload_preset

SPLIT = Disagg(1, 4, 1, 4)


def _run(wl, policy="chunked", split=SPLIT, caching=True):
    pol = replace(PRESETS[policy], prefix_caching=caching)
    return simulate(Scenario(workload=wl, policy=pol, disagg=split))


def _moved_s(res):
    """What each request's transfer takes by hand: the fixed time and the prompt tokens its decode instance did not
    hold, at the link's seconds per token."""
    dis, dep = res.scenario.disagg, res.scenario.deployment
    q = res.requests
    return dis.transfer_s(dep, (q["prompt_tokens"] - q["decode_cached_tokens"]).to_numpy())


def test_a_shared_system_prompt_moves_once_per_decode_instance():
    wl = workload_preset("chat", 1.0, 60, 0).with_shared_prefix(2048)
    res = _run(wl)
    q = res.requests.sort_values("prefill_done_s")
    cached = q["decode_cached_tokens"].to_numpy()
    assert cached[0] == 0  # the first request finds nothing on the decode side
    assert (cached % KV_BLOCK_TOKENS == 0).all() and (cached <= q["prompt_tokens"].to_numpy() - 1).all()
    # every later one finds the 2,048-token prompt (128 blocks) there: it moves only its own tokens
    assert (cached[1:] >= 2048).all()
    np.testing.assert_allclose(res.requests["kv_transfer_s"], _moved_s(res), rtol=1e-12)
    # the decode instance's steps count what its admissions found cached
    dcd = res.steps[res.steps["role"] == "decode"]
    assert dcd["cached_tokens"].sum() >= 2048 * (len(q) - 1)


def test_without_prefix_caching_every_prompt_moves_whole():
    wl = workload_preset("chat", 1.0, 60, 0).with_shared_prefix(2048)
    res = _run(wl, caching=False)
    assert (res.requests["decode_cached_tokens"] == 0).all() and (res.requests["cached_prompt_tokens"] == 0).all()
    np.testing.assert_allclose(res.requests["kv_transfer_s"], _moved_s(res), rtol=1e-12)


@pytest.mark.parametrize("split", [Disagg(1, 4, 1, 4), Disagg(2, 2, 2, 2), Disagg(1, 2, 3, 2)])
def test_sessions_conserve_and_stay_within_each_cache(split):
    wl = workload_preset("chat-sessions", 2.0, 150, 1)
    res = _run(wl, split=split)
    q, s = res.requests, res.steps
    n = len(q)
    assert n == 150 and np.isfinite(q["release_s"]).all()
    assert (q["decode_cached_tokens"] > 0).any()
    np.testing.assert_allclose(res.requests["kv_transfer_s"], _moved_s(res), rtol=1e-12)
    np.testing.assert_allclose(q["decode_arrival_s"], q["prefill_done_s"] + q["kv_pull_wait_s"] + q["kv_transfer_s"],
                               rtol=0, atol=1e-9)
    dcd = s[s["role"] == "decode"]
    if q["preemptions"].sum() == 0:  # the decode side computes each last prompt token again, then the outputs
        assert dcd["prefill_tokens"].sum() == n
        assert dcd["decode_tokens"].sum() == (q["output_tokens"] - 1).sum()
    assert res.itl_hist.sum() == (q["output_tokens"] - 1).sum()
    for role in ("prefill", "decode"):
        cap = split.deployment(res.scenario.deployment, role).kv_capacity_blocks
        assert s.loc[s["role"] == role, "kv_blocks"].max() <= cap
    again = _run(wl, split=split)
    pd.testing.assert_frame_equal(again.requests, q)


def test_the_decode_cache_is_what_the_transfer_saves_not_what_the_prefill_skipped():
    """The prefill instance's cache skips computing a prompt's cached blocks (cached_prompt_tokens); the decode
    instance's skips moving them (decode_cached_tokens). A session's earlier output was computed on the decode side
    only, so a later turn finds more of its prompt there than on the prefill side."""
    wl = workload_preset("chat-sessions", 1.0, 120, 0)
    reqs = wl.generate()
    q = _run(wl).requests.set_index("request_id").loc[np.arange(len(reqs))]
    later = reqs.after >= 0
    assert q["decode_cached_tokens"].to_numpy()[later].sum() > q["cached_prompt_tokens"].to_numpy()[later].sum()


def test_the_cli_and_explore_report_what_the_decode_caches_held(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "batching", "run", "--workload", "chat", "--shared-prefix-tokens",
                        "2048", "--requests", "40", "--rate", "1", "--preset", "chunked", "--prefill-instances", "1",
                        "--prefill-tp", "4", "--decode-instances", "1", "--decode-tp", "4", "--json", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())
    s = s.get("summary", s)
    assert s["decode_cached_tokens"] >= 39 * 2048
    sys.path.insert(0, str(root / "tests" / "ui"))
    from uihelpers import assert_clean, run_page

    at = run_page("pages/explore.py", workload="chat", n="40", prefix_tokens="2048", serving="disaggregated",
                  prefill_tp="4", decode_tp="4")
    assert_clean(at)
    assert any("prefix caches held" in c.value and "did not move" in c.value for c in at.caption)


def test_speculating_decode_instances_keep_their_cache_too():
    from batching.sim.hardware.specs import deployment

    pol = replace(PRESETS["chunked"], spec_decode="eagle")
    split = Disagg(1, 1, 1, 1)
    sc = Scenario(deployment(model="llama-3.1-8b", tp=1, num_gpus=2), workload_preset("chat-sessions", 2.0, 120, 2),
                  pol, disagg=split)
    res = simulate(sc)
    q, s = res.requests, res.steps
    assert len(q) == 120 and (q["decode_cached_tokens"] > 0).any()
    np.testing.assert_allclose(q["kv_transfer_s"], split.transfer_s(sc.deployment, (
        q["prompt_tokens"] - q["decode_cached_tokens"]).to_numpy(), pol), rtol=1e-12)
    assert res.itl_hist.sum() <= (q["output_tokens"] - 1).sum()  # a verification's tokens arrive together
    for role in ("prefill", "decode"):
        assert s.loc[s["role"] == role, "kv_blocks"].max() <= split.kv_blocks(sc.deployment, role, pol)
