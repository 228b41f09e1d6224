import json
import math

import numpy as np
import pytest

from batching.cli.main import main
from batching.studies.capacity import SLO, capacity, slo_point
from batching.studies.sweeps import apply_knob, sweep
from batching.studies.knee import find_knee, sweep_knee
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload import workload_preset


def scenario(policy="chunked", rate=3.0, n=400):
    return Scenario(workload=workload_preset("mixed", rate, n, 2), policy=PRESETS[policy])


# --- knee finder on synthetic curves with known knees ------------------------------------------
def test_knee_of_a_saturating_curve():
    x = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    thr = np.minimum(x, 16) * 100.0
    lat = np.where(x > 16, x / 16.0, 1.0)
    assert find_knee(x, thr, [lat]) == 16


def test_knee_respects_the_share():
    x = np.arange(1, 11)
    thr = 1000 * (1 - np.exp(-x / 2.0))  # diminishing returns
    lat = x.astype(float)
    k5 = find_knee(x, thr, [lat], share=0.05)
    k20 = find_knee(x, thr, [lat], share=0.20)
    assert k20 < k5
    # at the knee the rest of the curve adds less than the share; one step earlier it adds more
    i = int(k5) - 1
    assert thr.max() / thr[i] - 1 < 0.05 <= thr.max() / thr[i - 1] - 1


def test_no_knee_when_throughput_keeps_growing_or_latency_is_flat():
    x = np.arange(1, 9)
    assert find_knee(x, x * 100.0, [x * 1.0]) is None
    assert find_knee(x, np.full(8, 500.0), [np.ones(8)]) is None


def test_knee_ignores_input_order():
    x = np.array([64, 1, 16, 4])
    thr = np.minimum(x, 16) * 10.0
    lat = np.where(x > 16, 5.0, 1.0)
    assert find_knee(x, thr, [lat]) == 16


# --- sweeps ------------------------------------------------------------------------------------
def test_sweep_rows_and_direction():
    sc = Scenario(workload=workload_preset("mixed", 0.05, 60, 2), policy=PRESETS["dynamic"])
    df = sweep(sc, "max_wait_s", [2.0, 0.01, 0.5])
    assert df.max_wait_s.tolist() == [0.01, 0.5, 2.0]
    assert df.ttft_p50_s.is_monotonic_increasing  # waiting longer for a fuller batch delays the first token
    assert (df.capacity_output_tok_s > 0).all()


def test_sweep_of_max_num_seqs_finds_the_knee():
    df = sweep(scenario("continuous", n=300), "max_num_seqs", [1, 4, 16, 64, 256, 1024])
    assert df.capacity_output_tok_s.iloc[-1] > 5 * df.capacity_output_tok_s.iloc[0]
    knee = sweep_knee(df, "max_num_seqs", share=0.10)
    assert knee in (64.0, 256.0)


def test_rate_and_kv_and_share_knobs():
    sc = scenario()
    assert apply_knob(sc, "rate_req_s", 6).workload.rate_req_s == pytest.approx(6)
    assert apply_knob(sc, "kv_cache_tokens", 50000).deployment.kv_capacity_tokens == 50000
    assert apply_knob(sc, "high_share", 0.9).workload.classes[0].share == pytest.approx(0.9)
    assert apply_knob(sc, "max_num_batched_tokens", 512).policy.max_num_batched_tokens == 512


@pytest.mark.parametrize("knob, value, needle", [("nope", 1, "knob"), ("max_num_seqs", 0, "max_num_seqs"),
                                                 ("max_batch_size", 2.5, "whole number"),
                                                 ("kv_cache_tokens", 1, "kv_cache_tokens")])
def test_bad_knob_values(knob, value, needle):
    with pytest.raises(ValueError, match=needle):
        apply_knob(scenario(), knob, value)


# --- capacity ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cap_tight():
    return capacity(scenario(n=600), SLO(ttft_s=1.0, tpot_s=0.05))


def test_capacity_meets_the_slo_and_ten_percent_more_does_not(cap_tight):
    sc = scenario(n=600)
    assert cap_tight.max_rate_req_s > 0
    at = slo_point(sc.with_workload(sc.workload.with_rate(cap_tight.max_rate_req_s)), SLO(ttft_s=1.0, tpot_s=0.05))
    over = slo_point(sc.with_workload(sc.workload.with_rate(1.1 * cap_tight.max_rate_req_s)),
                     SLO(ttft_s=1.0, tpot_s=0.05))
    assert at["attainment"] >= 0.99
    assert over["attainment"] < 0.99
    assert cap_tight.binding_slo in ("ttft_s", "tpot_s")


def test_capacity_is_monotone_in_the_slo(cap_tight):
    loose = capacity(scenario(n=600), SLO(ttft_s=4.0, tpot_s=0.1))
    assert loose.max_rate_req_s >= cap_tight.max_rate_req_s
    looser_attain = capacity(scenario(n=600), SLO(ttft_s=1.0, tpot_s=0.05, attainment=0.9))
    assert looser_attain.max_rate_req_s >= cap_tight.max_rate_req_s


def test_nodes_and_cost():
    r = capacity(scenario(n=400), SLO(ttft_s=2.0), target_rate_req_s=50.0, gpu_hour_usd=3.0)
    assert r.nodes_needed == math.ceil(50.0 / r.max_rate_req_s)
    assert r.usd_per_million_output_tokens == pytest.approx(8 * 3.0 / 3600 / r.throughput_output_tok_s * 1e6)
    assert r.goodput_req_s <= r.max_rate_req_s * 1.05


def test_unattainable_slo_reports_zero_and_the_binding_slo():
    r = capacity(scenario("static", n=200), SLO(ttft_s=0.5))
    assert r.max_rate_req_s == 0.0 and r.binding_slo == "ttft_s" and r.nodes_needed is None


@pytest.mark.parametrize("slo, needle", [(SLO(), "at least one SLO"), (SLO(ttft_s=-1), "ttft_s"),
                                         (SLO(ttft_s=1, attainment=1.5), "attainment")])
def test_bad_slo(slo, needle):
    with pytest.raises(ValueError, match=needle):
        capacity(scenario(n=50), slo)


# --- command line -------------------------------------------------------------------------------
def test_cli_sweep_and_capacity_json(tmp_path):
    out = tmp_path / "s.json"
    assert main(["sweep", "--knob", "max_num_seqs", "--values", "4,64,256", "--requests", "200",
                 "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["knob"] == "max_num_seqs" and len(s["points"]) == 3
    out = tmp_path / "c.json"
    assert main(["capacity", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--requests", "300",
                 "--target-rate", "30", "--gpu-hour-usd", "2.5", "--json", str(out)]) == 0
    c = json.loads(out.read_text())
    for k in ("max_rate_req_s", "throughput_output_tok_s", "goodput_req_s", "binding_slo", "nodes_needed",
              "usd_per_million_output_tokens"):
        assert k in c
    assert c["nodes_needed"] >= 1


def test_cli_bad_values_exit_2(capsys):
    assert main(["capacity", "--requests", "50"]) == 2
    assert "SLO" in capsys.readouterr().err


def test_sweep_rows_carry_mfu_and_mbu():
    df = sweep(scenario("continuous", n=100), "max_num_seqs", [4, 64], with_capacity=False)
    assert (df.mfu > 0).all() and (df.mbu > 0).all()
    assert df.mfu.iloc[1] >= df.mfu.iloc[0]  # a bigger batch does at least as much useful compute per second
