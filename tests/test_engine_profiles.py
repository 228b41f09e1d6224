"""Engine profiles (issue 23 item 2): step terms, client-side times, JSON round trip, CLI flags."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.engines import ENGINES, EngineProfile, engine_profile
from batching.sim.hardware.specs import deployment
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset
from batching.studies import graph_step

DEP = deployment("h100-sxm", "llama-3.1-8b", 1, 1, "bf16")


def test_step_terms_add_as_defined():
    base = ENGINES["vllm"]
    prof = replace(base, name="x", seq_s=10e-6, prefill_step_s=3e-3, step_s=1e-3)
    a, b = cm.cost_model(DEP, engine=base), cm.cost_model(DEP, engine=prof)
    # decode step of 32 sequences: per-step 1 ms instead of 2 ms, plus 32 x 10 us
    da, db = cm.step_time(a, 32, 0, 32 * 500, 32), cm.step_time(b, 32, 0, 32 * 500, 32)
    assert db - da == pytest.approx(-1e-3 + 32 * 10e-6, abs=1e-12)
    # a step with prompt tokens adds the prefill launch overhead
    w = cm.prompt_attn_work(512, 0)
    pa, pb = cm.step_time(a, 512, w, 0, 1), cm.step_time(b, 512, w, 0, 1)
    assert pb - pa == pytest.approx(-1e-3 + 10e-6 + 3e-3, abs=1e-12)
    parts = cm.step_breakdown(b, 512, w, 0, 1)
    assert parts["prefill launch"] == pytest.approx(3e-3) and parts["per-sequence CPU"] == pytest.approx(10e-6)
    assert sum(parts.values()) == pytest.approx(pb)


def test_a_pure_decode_step_replays_one_cuda_graph():
    """vLLM 0.11 (cudagraph_mode FULL_AND_PIECEWISE) replays one full CUDA graph for a step of decodes only of at most
    512 tokens and runs piecewise graphs otherwise: by hand, the vllm profile's 2.0 ms per step less 0.42 ms (vLLM
    PR #20059's median ITL, 5.39 ms piecewise against 4.97 ms full) = 1.58 ms for such a step, 2.0 ms for the rest;
    the overlapping profiles pay none either way."""
    vllm = cm.cost_model(DEP, engine="vllm")
    fixed = lambda c, *a: cm.step_breakdown(c, *a)["fixed overhead"]  # noqa: E731
    w = cm.prompt_attn_work(512, 0)
    assert fixed(vllm, 1, 0.0, 1500.0, 1) == pytest.approx(2.0e-3 - 0.42e-3, abs=1e-15)
    assert fixed(vllm, 512, 0.0, 512 * 1500.0, 512) == pytest.approx(1.58e-3, abs=1e-15)
    assert fixed(vllm, 513, 0.0, 513 * 1500.0, 513) == pytest.approx(2.0e-3, abs=1e-15)  # past the largest graph
    assert fixed(vllm, 512, w, 0.0, 1) == pytest.approx(2.0e-3, abs=1e-15)  # prompt tokens: piecewise graphs
    assert fixed(vllm, 513, w / 512, 1500.0, 2) == pytest.approx(2.0e-3, abs=1e-15)  # a mixed step
    for name in ("sglang", "trtllm"):
        c = cm.cost_model(DEP, engine=name)
        assert fixed(c, 1, 0.0, 1500.0, 1) == 0.0 == fixed(c, 512, w, 0.0, 1)
    # a profile cannot save more than its step's CPU time
    assert replace(ENGINES["vllm"], step_s=0.2e-3).decode_graph_step_s() == 0.0


def test_batch_one_decode_pays_the_graph_step_in_the_engine():
    """One closed-loop client of Llama-3.1-8B on one H100: every TPOT step is a one-sequence decode, so the mean TPOT
    is exactly 0.42 ms below the same engine's without the graph saving."""
    eager = replace(ENGINES["vllm"], name="piecewise", graph_step_saving_s=0.0)
    wl = workload_preset("sharegpt", 1.0, 8, 2).with_concurrency(1)
    a = simulate(Scenario(DEP, wl, engine="vllm")).requests
    b = simulate(Scenario(DEP, wl, engine=eager)).requests
    np.testing.assert_allclose(b.tpot_s - a.tpot_s, 0.42e-3, atol=1e-9)
    # the first token (a prefill step) is priced alike in both
    np.testing.assert_allclose(a.ttft_s.iloc[0], b.ttft_s.iloc[0], atol=1e-12)
    # the figure docs/CALIBRATION.md quotes (studies.graph_step): the same difference on the mean
    graph, piecewise = graph_step.batch_one_tpots()
    assert piecewise - graph == pytest.approx(0.42e-3, abs=1e-9)


def test_kernel_factors_scale_rates():
    a, t = cm.cost_model(DEP, engine="vllm"), cm.cost_model(DEP, engine="trtllm")
    p, v = ENGINES["trtllm"], ENGINES["vllm"]
    assert t.coef[cm.C_LIN_FLOPS_RATE] == pytest.approx(a.coef[cm.C_LIN_FLOPS_RATE] * p.gemm_eff / v.gemm_eff)
    assert t.coef[cm.C_LIN_BW] == pytest.approx(a.coef[cm.C_LIN_BW] * p.gemm_eff / v.gemm_eff)
    assert t.coef[cm.C_ATTN_RATE] == pytest.approx(a.coef[cm.C_ATTN_RATE] * p.attn_eff / v.attn_eff)
    assert t.coef[cm.C_KV_BW] == pytest.approx(a.coef[cm.C_KV_BW] * p.kv_eff / v.kv_eff)
    assert t.coef[cm.C_ATTN_RATE] == pytest.approx(989.4e12 * 0.474, rel=2e-3)  # TensorRT-LLM's measured FLOP-weighted share
    assert a.coef[cm.C_KV_BW] == pytest.approx(3.35e12 * 0.847, rel=2e-3)  # vLLM's measured byte-weighted share
    assert t.allreduce == "trtllm" and a.allreduce == "vllm_graph"
    assert a.coef[cm.C_FIXED] == cm.STEP_FIXED_S  # the calibrated default keeps its per-step time


def test_default_engine_is_calibrated_vllm():
    sc = Scenario(DEP)
    assert sc.profile is ENGINES["vllm"] and sc.allreduce == "vllm_graph"
    assert Scenario(DEP, engine="trtllm").allreduce == "trtllm"
    assert Scenario(DEP, engine="trtllm", allreduce="nccl").allreduce == "nccl"
    assert Scenario(DEP).with_engine("trtllm").allreduce == "trtllm"
    with pytest.raises(ValueError, match="engine='bogus' is unknown; allowed: vllm, sglang, trtllm"):
        Scenario(DEP, engine="bogus").validate()


def _run(prof, n=40, rate=2.0, **kw):
    return simulate(Scenario(DEP, workload_preset("sharegpt", rate, n, 3, **kw), engine=prof))


def test_ttft_includes_client_times_exactly():
    zero = replace(ENGINES["vllm"], name="zero", in_per_token_s=0.0)
    slow = replace(zero, name="slow", in_fixed_s=0.0, out_s=0.05)
    a, b = _run(zero).requests, _run(slow).requests
    # output time only: the engine runs the same schedule, every client time moves by exactly 50 ms
    np.testing.assert_allclose(b.ttft_s - a.ttft_s, 0.05, atol=1e-9)
    np.testing.assert_allclose(b.e2e_s - a.e2e_s, 0.05, atol=1e-9)
    np.testing.assert_allclose(b.tpot_s, a.tpot_s, atol=1e-9, equal_nan=True)
    # input time: the request reaches the engine later; TTFT >= the engine's own + the input time
    tin = replace(zero, name="in", in_fixed_s=0.02)
    c = _run(tin).requests
    np.testing.assert_allclose(c.arrival_s, a.arrival_s)
    assert (c.queue_delay_s >= 0.02 - 1e-12).all()
    assert (c.ttft_s >= 0.02).all() and c.ttft_s.median() > a.ttft_s.median()


def test_closed_loop_clients_see_client_times():
    zero = replace(ENGINES["vllm"], name="zero", in_per_token_s=0.0)
    slow = replace(zero, name="slow", in_fixed_s=0.01, out_s=0.02)
    wl = workload_preset("sharegpt", 1.0, 30, 1).with_concurrency(4)
    a = simulate(Scenario(DEP, wl, engine=zero)).requests
    b = simulate(Scenario(DEP, wl, engine=slow)).requests
    assert (b.ttft_s >= 0.03 - 1e-12).all()
    assert b.release_s.max() > a.release_s.max()  # the clients' cycle is longer


@pytest.mark.parametrize("engine", list(ENGINES))
def test_conservation_and_determinism_per_profile(engine):
    r1, r2 = _run(engine), _run(engine)
    s1 = r1.summary()
    assert s1["engine"] == engine and s1["engine_label"] == ENGINES[engine].label
    np.testing.assert_array_equal(r1.requests.first_token_s, r2.requests.first_token_s)
    req = r1.requests
    assert int(req.preemptions.sum()) == 0  # a light load: every token is a decode but each request's first
    assert int(r1.steps.decode_tokens.sum()) + len(req) == int(req.output_tokens.sum())
    assert (req.first_token_s >= req.arrival_s).all() and (req.release_s >= req.first_token_s).all()


def test_json_round_trip_and_validation(tmp_path):
    for prof in ENGINES.values():
        assert EngineProfile.from_dict(json.loads(prof.to_json())) == prof
    with pytest.raises(ValueError, match=r"step_s=-1 is out of range; allowed 0 to 1"):
        EngineProfile.from_dict({"name": "x", "step_s": -1})
    with pytest.raises(ValueError, match=r"graph_step_saving_s=2 is out of range; allowed 0 to 1"):
        EngineProfile.from_dict({"name": "x", "graph_step_saving_s": 2})
    with pytest.raises(ValueError, match="key 'bogus' is not a profile field"):
        EngineProfile.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="allreduce='x' is unknown"):
        EngineProfile.from_dict({"allreduce": "x"})
    with pytest.raises(ValueError, match=r"max_num_seqs=0 is out of range"):
        EngineProfile.from_dict({"policy": {"max_num_seqs": 0}})
    assert engine_profile(None) is ENGINES["vllm"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "batching", *args], capture_output=True, text=True, timeout=600)


def test_cli_engine_and_profile(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(replace(ENGINES["trtllm"], name="mine", label="my TRT-LLM").to_json())
    base = ["run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--num-gpus", "1", "--requests", "20"]
    r = _cli(*base, "--engine", "sglang", "--preset", "engine")
    assert r.returncode == 0, r.stderr
    assert "SGLang 0.5 profile (sglang)" in r.stdout and "16384 tokens/step" in r.stdout
    r = _cli(*base, "--profile", str(good))
    assert r.returncode == 0, r.stderr
    assert "my TRT-LLM profile (mine)" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"seq_s": 5}))
    r = _cli(*base, "--profile", str(bad))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "seq_s=5 is out of range; allowed 0 to 0.01" in r.stderr
    r = _cli(*base, "--profile", str(tmp_path / "none.json"))
    assert r.returncode != 0 and "no such file" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("--profile") == 1  # named once
    # every command's JSON names the profile it ran with
    out = tmp_path / "cap.json"
    r = _cli("capacity", *base[1:], "--engine", "trtllm", "--slo-tpot-ms", "100", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "# engine: TensorRT-LLM 1.0 profile (trtllm)" in r.stdout
    assert (json.loads(out.read_text())["engine"], json.loads(out.read_text())["engine_label"]) == (
        "trtllm", "TensorRT-LLM 1.0")
    r = _cli(*base, "--engine", "sglang", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["engine"] == "sglang"


def test_committed_trtllm_table_rows_are_current():
    """Three rows of docs/calibration/trtllm_table.csv (what CALIBRATION.md shows) against a fresh simulation."""
    import pandas as pd

    from batching.cli.calibrate import TRTLLM_CSV
    from batching.studies import trtllm_table as tt

    doc = pd.read_csv(TRTLLM_CSV)
    assert len(doc) == sum(len(v) for v in tt.PUBLISHED.values())
    rows = {("llama-3.1-8b", "h100-sxm", 1): {(1000, 1000): 15220, (2048, 128): 3450},
            ("llama-3.1-70b", "h100-sxm", 2): {(5000, 500): 898}}
    fresh = tt.table_check("trtllm", rows)
    for r in fresh.itertuples(index=False):
        d = doc[(doc.model == r.model) & (doc.gpu == r.gpu) & (doc.tp == r.tp) & (doc.isl == r.isl)
                & (doc.osl == r.osl)].iloc[0]
        assert d.published_tok_s == r.published_tok_s
        assert d.simulated_tok_s == pytest.approx(r.simulated_tok_s, rel=1e-9)
        assert abs(r.error) < 0.25  # these rows are within 25 % of the published table
