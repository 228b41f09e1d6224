import json
import math
from dataclasses import replace
import re

import numpy as np
import pytest

from batching.cli.main import main
from batching.studies.capacity import (HEADROOM_RANGE, SLO, TPOT_UNDERESTIMATE, binding_of, capacity, check_headroom,
                                       default_slo, mean_output_tokens, meets_slo, per_class_values, plan_price,
                                       slo_point)
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies.sweeps import apply_knob, sweep
from batching.studies.knee import capacity_knee, find_knee, sweep_knee
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset


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
    """Issue 24 item 1: $ per million output tokens at the target = the fleet's $/h over the output tokens the target
    brings an hour (target x mean output tokens of the admitted requests x 3600), not over the simulated throughput
    (which counts the queue's drain after the last arrival); at capacity: one node at its rate, no headroom."""
    sc = scenario(n=400)
    r = capacity(sc, SLO(ttft_s=2.0), target_rate_req_s=50.0, gpu_hour_usd=3.0)
    mean_out = float(sc.requests()[0].output_tokens.mean())
    assert r.mean_output_tokens == pytest.approx(mean_out) and r.headroom == DEFAULT_HEADROOM == 1.25
    assert r.nodes_needed == math.ceil(50.0 * 1.25 / r.max_rate_req_s - 1e-9)
    assert r.usd_per_hour == r.nodes_needed * 8 * 3.0
    assert r.usd_per_million_output_tokens == pytest.approx(r.usd_per_hour / (50.0 * mean_out * 3600) * 1e6)
    assert r.usd_per_million_output_tokens_at_capacity == pytest.approx(
        8 * 3.0 / (r.max_rate_req_s * mean_out * 3600) * 1e6)
    # the steady throughput (over the arrival window, the drain not counted) is the rate x mean output the $ uses,
    # within the chance difference between 400 Poisson arrivals' rate and the rate asked
    assert r.steady_output_tok_s == pytest.approx(r.max_rate_req_s * mean_out, rel=0.1)
    assert r.goodput_req_s <= r.max_rate_req_s * 1.1


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
    for k in ("max_rate_req_s", "steady_output_tok_s", "goodput_req_s", "binding_slo", "nodes_needed",
              "usd_per_million_output_tokens"):
        assert k in c
    assert c["nodes_needed"] >= 1


def test_cli_sweep_prints_the_guided_checks_after_its_table(tmp_path):
    """``python -m batching sweep`` says which SLOs its knee is read on (the default ones here), and prints the Tune
    page's checks (studies.planning), read off its own sweep at the configured max_num_seqs."""
    import subprocess
    import sys

    from batching.studies import planning as sp

    args = ["sweep", "--knob", "max_num_seqs", "--values", "1,2,4,8", "--rate", "10", "--requests", "200",
            "--max-num-seqs", "4"]
    out = tmp_path / "s.json"
    run = subprocess.run([sys.executable, "-m", "batching", *args, "--json", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    table, checks = run.stdout.split("\nGuided checks:\n")
    lines = table.splitlines()
    assert lines.pop(0) == "# engine: vLLM 0.11 profile (vllm)"
    assert lines[0] == ("SLOs: TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; TPOT ≤ 100 ms for 99 % "
                        "of each class's requests (the default SLOs: none were given). Set --slo-ttft-ms, --slo-tpot-ms or "
                        "--slo-e2e-s to change them.")
    assert lines[1].split()[:3] == ["max_num_seqs", "max_rate_req_s", "slo_attainment"]
    assert "knee: none (capacity within the SLOs still growing by 5 % or more)" in table
    sc = Scenario(workload=workload_preset("mixed", 10.0, 200, 0),
                  policy=with_knobs(PRESETS["continuous"], max_num_seqs=4))  # what the CLI builds
    study = sp.sweep_study(sc, "max_num_seqs", [1, 2, 4, 8])
    assert study.slo_is_default and study.slo == default_slo(2)
    assert study.checks_text().split("Guided checks:\n")[1] == checks.rstrip("\n")
    assert checks.splitlines()[2] == "2 · Batch cap too small (max_num_seqs / max_batch_size): FIRED"
    doc = json.loads(out.read_text())
    assert set(doc) == {"knob", "knee", "knee_basis", "slo", "slo_default", "engine", "engine_label", "points"}
    assert doc["knee"] is None and doc["knee_basis"] == "max_rate_req_s" and doc["slo_default"] is True
    assert doc["slo"] == {"ttft_s": [1.0, 30.0], "tpot_s": 0.1, "e2e_s": None, "attainment": 0.99}
    assert [p["max_rate_req_s"] for p in doc["points"]] == pytest.approx(study.frame["max_rate_req_s"].tolist())
    # a knee share out of range is refused before anything runs
    bad = subprocess.run([sys.executable, "-m", "batching", *args, "--knee-share", "0.9"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "knee share=0.9 is out of range; allowed 0.005 to 0.5" in bad.stderr


def test_cli_bad_values_exit_2(capsys):
    assert main(["capacity", "--requests", "50"]) == 2
    assert "SLO" in capsys.readouterr().err


def test_sweep_rows_carry_mfu_and_mbu():
    df = sweep(scenario("continuous", n=100), "max_num_seqs", [4, 64], with_capacity=False)
    assert (df.mfu > 0).all() and (df.mbu > 0).all()
    assert df.mfu.iloc[1] >= df.mfu.iloc[0]  # a bigger batch does at least as much useful compute per second


# --- per-class SLOs ------------------------------------------------------------------------------
PER_CLASS = SLO(ttft_s=(1.0, 30.0), tpot_s=0.1)  # chat first token within 1 s, batch analysis within 30 s


def test_slo_holds_one_value_or_one_per_class():
    assert SLO(ttft_s=[2.0]) == SLO(ttft_s=2.0) and SLO(ttft_s=[1, 30]).ttft_s == (1.0, 30.0)
    assert not SLO(ttft_s=2.0, tpot_s=0.1).per_class and PER_CLASS.per_class
    assert PER_CLASS.for_class(1) == {"ttft_s": 30.0, "tpot_s": 0.1}
    assert PER_CLASS.limits("ttft_s", 2).tolist() == [1.0, 30.0] and PER_CLASS.limits("tpot_s", 2).tolist() == [0.1] * 2
    assert PER_CLASS.limits("e2e_s", 2) is None
    assert PER_CLASS.to_dict() == {"ttft_s": [1.0, 30.0], "tpot_s": 0.1, "e2e_s": None, "attainment": 0.99}
    assert PER_CLASS.describe(["interactive chat", "batch analysis"]) == (
        "TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; TPOT ≤ 100 ms for 99 % of each class's requests")
    assert default_slo(2) == PER_CLASS and default_slo(1) == SLO(ttft_s=1.0, tpot_s=0.1)


@pytest.mark.parametrize("slo, classes, needle", [
    (SLO(ttft_s=(1.0, 30.0, 5.0)), 2, r"slo ttft_s has 3 values for 2 classes; give one value \(every class\) or "
                                      "2, class 0 first"),
    (SLO(ttft_s=(1.0, 30.0)), 1, "slo ttft_s has 2 values for 1 class; give one value"),
    (SLO(tpot_s=(0.1, 0.0)), 2, r"slo tpot_s\[1\]=0.0 is out of range; allowed > 0 to 3600"),
    (SLO(e2e_s=(5.0, float("nan"))), 2, r"slo e2e_s\[1\]=nan is out of range"),
    (SLO(ttft_s=(1.0, 4000.0)), None, r"slo ttft_s\[1\]=4000.0 is out of range; allowed > 0 to 3600"),
])
def test_per_class_slo_validation(slo, classes, needle):
    with pytest.raises(ValueError, match=needle):
        slo.validate(classes)


@pytest.mark.parametrize("text, needle", [
    ("", "it is empty"), ("1000,", "an empty value in '1000,'"), ("1000,abc", "'abc' is not a number; allowed > 0 to "
                                                                            "3,600,000"),
    ("0", "0 is out of range; allowed > 0 to 3,600,000"), ("5,inf", "'inf' is not a finite number"),
    ("１０００", "characters other than ASCII"), (",".join(["1"] * 9), "9 values; allowed 1 to 8"),
])
def test_per_class_values_parsing(text, needle):
    assert per_class_values(" 1000, 30000 ", 3.6e6) == (1000.0, 30000.0)
    with pytest.raises(ValueError, match=re.escape(needle)):
        per_class_values(text, 3.6e6)


@pytest.fixture(scope="module")
def per_class_cap():
    return capacity(scenario("priority", n=600), PER_CLASS)


def test_a_request_meets_the_slo_of_its_own_class(per_class_cap):
    """At the rate found each class is read against its own targets: the library's by_priority equals the
    attainment and goodput computed by hand from the per-request table."""
    from batching.sim.simulate import simulate

    r = per_class_cap
    assert r.max_rate_req_s > 0 and set(r.by_priority) == {"0", "1"}
    sc = scenario("priority", n=600)
    res = simulate(sc.with_workload(sc.workload.with_rate(r.max_rate_req_s)))
    req = res.requests
    ttft_limit = np.where(req.priority == 0, 1.0, 30.0)
    ok = (req.ttft_s.to_numpy() <= ttft_limit) & (req.tpot_s.isna() | (req.tpot_s <= 0.1)).to_numpy()
    window = req.arrival_s.max() - req.arrival_s.min()
    started = (req.first_token_s <= req.arrival_s.max()).to_numpy()  # by the last arrival: the drain not counted
    for level, cls in r.by_priority.items():
        m = (req.priority == int(level)).to_numpy()
        assert cls["class_name"] == ("interactive chat", "batch analysis")[int(level)]
        assert cls["attainment"] == pytest.approx(ok[m].mean())
        assert cls["goodput_req_s"] == pytest.approx((ok & m & started).sum() / window)
        assert cls["slo"] == PER_CLASS.for_class(int(level))
        assert cls["ttft_p99_s"] == pytest.approx(res.summary()["by_priority"][level]["ttft_p99_s"])
    assert ok.mean() >= 0.99
    assert r.goodput_req_s == pytest.approx(sum(c["goodput_req_s"] for c in r.by_priority.values()))
    # the batch class's 30 s target is what lets the chat class's 1 s hold: one 1 s TTFT for both sustains less
    strict = capacity(scenario("priority", n=600), SLO(ttft_s=1.0, tpot_s=0.1))
    assert strict.max_rate_req_s < r.max_rate_req_s
    assert r.to_dict()["by_priority"] is r.by_priority and r.binding_class in ("interactive chat", "batch analysis")


def test_one_value_for_every_class_is_todays_slo():
    sc = scenario(n=300)
    one = capacity(sc, SLO(ttft_s=2.0, tpot_s=0.1))
    listed = capacity(sc, SLO(ttft_s=(2.0, 2.0), tpot_s=(0.1, 0.1)))
    assert listed.max_rate_req_s == one.max_rate_req_s and listed.points.equals(one.points)
    assert {"max_rate_req_s", "steady_output_tok_s", "goodput_req_s", "binding_slo", "binding_class", "nodes_needed",
            "usd_per_million_output_tokens", "usd_per_million_output_tokens_at_capacity", "mean_output_tokens",
            "headroom", "gpu_hour_usd"} <= set(one.to_dict())
    with pytest.raises(ValueError, match="slo ttft_s has 3 values for 2 classes"):
        capacity(sc, SLO(ttft_s=(1.0, 2.0, 3.0)))


# --- headroom for the cost model's known error ------------------------------------------------------
def test_headroom_multiplies_nodes_and_cost():
    sc = scenario(n=300)
    r = capacity(sc, SLO(ttft_s=2.0), target_rate_req_s=50.0, gpu_hour_usd=3.0, headroom=1.5)
    assert r.headroom == 1.5
    assert r.nodes_needed == math.ceil(50.0 * 1.5 / r.max_rate_req_s - 1e-9)
    bare = r.with_plan(sc, 50.0, 3.0, headroom=1.0)
    assert bare.headroom == 1.0 and bare.nodes_needed == math.ceil(50.0 / r.max_rate_req_s - 1e-9)
    # $ at the target follows the whole nodes; $ at capacity has no headroom
    assert r.usd_per_million_output_tokens / bare.usd_per_million_output_tokens == pytest.approx(
        r.nodes_needed / bare.nodes_needed)
    assert r.usd_per_million_output_tokens_at_capacity == bare.usd_per_million_output_tokens_at_capacity
    for bad in (0.9, 3.5, float("nan")):
        with pytest.raises(ValueError, match="headroom=.* is out of range; allowed 1 to 3"):
            check_headroom(bad)
        with pytest.raises(ValueError, match="headroom=.* is out of range; allowed 1 to 3"):
            plan_price(sc, 1.0, 10.0, 2.5, bad, 200.0)


def test_a_fleet_or_a_split_is_planned_in_copies_of_itself_counted_in_nodes():
    """The rate a 2-node fleet carries is the fleet's: nodes needed = copies x 2; a 4-GPU prefill/decode split's
    is its own: copies x 4 GPUs, in 8-GPU nodes; $ at the target over the whole nodes, at capacity over the GPUs
    that carried the rate."""
    from batching.sim.topology.disagg import Disagg

    sc = scenario(n=300)
    fleet = plan_price(replace(sc, nodes=2), 10.0, 25.0, 2.0, 1.0, 200.0)
    assert fleet["nodes_needed"] == 6 and fleet["usd_per_hour"] == 6 * 8 * 2.0
    assert fleet["usd_per_million_output_tokens"] == pytest.approx(96.0 / (25 * 200 * 3600) * 1e6)
    assert fleet["usd_per_million_output_tokens_at_capacity"] == pytest.approx(16 * 2.0 / (10 * 200 * 3600) * 1e6)
    split = plan_price(replace(sc, disagg=Disagg(1, 2, 1, 2)), 10.0, 25.0, 2.0, 1.0, 200.0)
    assert split["nodes_needed"] == 2 and split["usd_per_hour"] == 32.0
    assert split["usd_per_million_output_tokens_at_capacity"] == pytest.approx(4 * 2.0 / (10 * 200 * 3600) * 1e6)
    # no target: no nodes and no $ at the target, still $ at capacity; no price: no $
    alone = plan_price(sc, 10.0, None, 2.0, 1.0, 200.0)
    assert alone["nodes_needed"] is None and alone["usd_per_million_output_tokens"] is None
    assert alone["usd_per_million_output_tokens_at_capacity"] == pytest.approx(8 * 2.0 / (10 * 200 * 3600) * 1e6)
    free = plan_price(sc, 10.0, 25.0, None, 1.0, 200.0)
    assert free["nodes_needed"] == 3 and free["usd_per_million_output_tokens"] is None


# --- "within SLOs" holds for every class (issue 24 item 4) ------------------------------------------------
def _reading(chat: float, batch: float, n_chat: int = 30, n_batch: int = 70) -> dict:
    by = {"0": {"class_name": "interactive chat", "attainment": chat, "per_slo": {"ttft_s": chat, "tpot_s": 1.0}},
          "1": {"class_name": "batch analysis", "attainment": batch, "per_slo": {"ttft_s": 1.0, "tpot_s": batch}}}
    overall = (chat * n_chat + batch * n_batch) / (n_chat + n_batch)
    return {"rate_req_s": 1.0, "attainment": overall, "per_slo": {}, "queue_growth_req_s": 0.0,
            "offered_req_s": 1.0, "by_priority": by}


def test_a_rate_is_within_the_slos_only_if_every_class_is():
    slo = SLO(ttft_s=(1.0, 30.0), tpot_s=0.1)
    # 97.2 % of chat and 99.9 % of batch: 99.06 % of all requests, which the old rule counted as within the SLOs
    p = _reading(0.972, 0.999)
    assert p["attainment"] >= 0.99 and not meets_slo(p, slo)
    assert binding_of([p], slo) == ("ttft_s", "interactive chat")
    assert meets_slo(_reading(0.99, 0.995), slo) and binding_of([_reading(0.99, 0.995)], slo) == (None, None)
    # the batch class binds on its own SLO (TPOT) when it is the one short
    assert binding_of([_reading(1.0, 0.95)], slo) == ("tpot_s", "batch analysis")


def test_a_sweep_point_meets_the_slos_only_if_every_class_does(monkeypatch):
    """A sweep's slo_met (the knee on the request rate reads it) uses the capacity search's per-class rule."""
    from batching.studies import sweeps

    monkeypatch.setattr(sweeps, "slo_reading", lambda res, slo: _reading(0.972, 0.999) | {"goodput_req_s": 1.0})
    row = sweeps.run_point(scenario(n=50), with_capacity=False, slo=PER_CLASS, search=False)
    assert row["slo_attainment"] >= 0.99 and row["slo_met"] is False


def test_capacity_holds_every_class_to_its_own_slo():
    """Qwen2.5-72B, mixed, chunked, the default SLOs (1 s / 30 s TTFT, 100 ms TPOT): every class at the rate found
    has 99 % of its requests within its own SLOs, and the reading says so per class."""
    r = capacity(scenario("chunked", n=600), PER_CLASS)
    assert r.max_rate_req_s > 0
    for c in r.by_priority.values():
        assert c["attainment"] >= 0.99 and c["meets_slo"] is True
    assert (r.points["class_attainment"] <= r.points["attainment"] + 1e-12).all()


def test_headroom_range_is_the_end_to_end_check():
    """HEADROOM_RANGE comes from the documented TPOT error (docs/CALIBRATION.md): recompute that error."""
    from batching.studies.end_to_end import end_to_end

    tpot = [r for r in end_to_end() if r.metric.startswith("median TPOT")]
    under = [-e for r in tpot for e in (r.error_sglang, r.error_vllm)]
    assert min(under) == pytest.approx(TPOT_UNDERESTIMATE[0], abs=0.01)
    assert max(under) == pytest.approx(TPOT_UNDERESTIMATE[1], abs=0.01)
    assert HEADROOM_RANGE == (1.2, 1.37) and HEADROOM_RANGE[0] <= DEFAULT_HEADROOM <= HEADROOM_RANGE[1]


# --- the knee within the SLOs ------------------------------------------------------------------------
def test_capacity_knee_rule():
    x = [8, 16, 32, 64, 128, 256]
    y = [1.0, 2.0, 4.0, 5.8, 7.3, 7.28]
    assert capacity_knee(x, y) == 128
    assert capacity_knee(x, y, share=0.3) == 64  # 5.8 → at most 7.3: +26 %
    assert capacity_knee(x, [1, 2, 3, 4, 5, 6]) is None  # still growing at the end of the range
    assert capacity_knee(x, [0.0] * 6) is None  # nothing meets the SLOs
    # widening the range past the knee with points that add less than the share leaves it where it is
    assert capacity_knee(x + [512, 1024], y + [7.29, 7.1]) == 128
    # a point beyond that still adds more than the share: the old knee was not one, and the end keeps growing
    assert capacity_knee(x + [512], y + [9.0]) is None


@pytest.fixture(scope="module")
def slo_sweeps():
    sc = scenario("chunked", n=400)
    narrow = sweep(sc, "max_num_seqs", [8, 16, 32, 64, 128, 256], slo=PER_CLASS)
    wide = sweep(sc, "max_num_seqs", [8, 16, 32, 64, 128, 256, 1024, 4096], slo=PER_CLASS)
    return sc, narrow, wide


def test_the_knee_is_where_capacity_within_the_slos_stops_growing(slo_sweeps):
    sc, narrow, wide = slo_sweeps
    knee = sweep_knee(narrow, "max_num_seqs")
    assert knee is not None and knee < 256
    y = narrow.set_index("max_num_seqs")["max_rate_req_s"]
    assert y[y.index > knee].max() < 1.05 * y[knee]
    before = y[y.index < knee]
    assert (y[y.index > before.index.max()].max() >= 1.05 * before.iloc[-1])  # one step earlier it still paid
    # each point's capacity within the SLOs is the capacity search's figure for that value
    at = capacity(apply_knob(sc, "max_num_seqs", knee), PER_CLASS)
    assert y[knee] == pytest.approx(at.max_rate_req_s)
    assert set(narrow.columns) >= {"max_rate_req_s", "slo_attainment", "slo_met", "goodput_req_s", "binding_slo"}


def test_widening_the_range_beyond_the_knee_keeps_it(slo_sweeps):
    _, narrow, wide = slo_sweeps
    assert sweep_knee(wide, "max_num_seqs") == sweep_knee(narrow, "max_num_seqs")
    shared = wide[wide.max_num_seqs <= 256].reset_index(drop=True)
    assert shared["max_rate_req_s"].tolist() == narrow["max_rate_req_s"].tolist()


def test_a_rate_sweep_reads_goodput_within_the_slos():
    sc = scenario("chunked", n=300)
    df = sweep(sc, "rate_req_s", [1.0, 3.0, 6.0, 12.0, 24.0], slo=PER_CLASS)
    cap = capacity(sc, PER_CLASS)
    assert df["max_rate_req_s"].tolist() == [cap.max_rate_req_s] * 5  # one search: the rate does not move it
    assert df["slo_met"].tolist() == (df["slo_attainment"] >= 0.99).tolist()
    knee = sweep_knee(df, "rate_req_s")
    met = df[df.slo_met]
    assert knee == met["rate_req_s"].max() and knee <= cap.max_rate_req_s * 1.05


def test_capacity_reads_the_runs_it_is_given_and_finds_the_same_rate():
    """``capacity(run=...)`` (the dashboard's cached runs) searches the same rates and finds the same answer."""
    from batching.sim.simulate import simulate

    sc = scenario("continuous", n=200)
    seen = []

    def run(s):
        seen.append(s.workload.rate_req_s)
        return simulate(s)

    plain_ = capacity(sc, PER_CLASS)
    given = capacity(sc, PER_CLASS, run=run)
    assert sorted(seen) == plain_.points["rate_req_s"].tolist()  # one run per rate tried, the same rates
    assert given.to_dict() == plain_.to_dict() and given.points.equals(plain_.points)


def test_capacity_never_counts_a_rate_the_node_cannot_keep_up_with():
    """A short run at a rate the node cannot carry still meets a loose SLO (every request of a 20 s run waits
    less than 1,000 s): the search counts a rate only if the waiting queue does not grow through the run."""
    from batching.studies.capacity import SLO, capacity, ceiling_req_s

    sc = Scenario(workload=workload_preset("mixed", 1.0, 200, 0), policy=PRESETS["chunked"])
    loose = SLO(ttft_s=1000.0, tpot_s=10.0)
    res = capacity(sc, loose)
    # what the node carries flat out over a run long enough for its tail not to matter (8.6 req/s); 200
    # requests' own saturated run understates it (5.2 req/s: its tail drains with a thin batch)
    long_run = ceiling_req_s(sc.with_workload(sc.workload.with_num_requests(2000)))
    assert res.max_rate_req_s <= 1.05 * long_run  # before this rule: doubled while the SLOs held
    assert res.binding_slo is None  # the node's capacity binds, not an SLO
    grown = res.points[res.points["rate_req_s"] > res.max_rate_req_s]
    assert (grown["attainment"] >= loose.attainment).any()  # it met the SLOs there, but its queue grew
    assert (grown["queue_growth_req_s"] > 0.1 * grown["offered_req_s"]).all()
