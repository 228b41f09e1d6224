"""Published measurements (issue 23 item 9): batching/data/published_points.csv is read whole, every setting
simulates, the reference run keeps its documented errors, and ``calibrate --published`` prints every figure with
its error before and now (one-line errors for bad flags)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from batching.cli.main import main
from batching.studies import published as pub


def test_every_point_names_its_source_role_and_setting():
    pts = pub.points()
    assert len(pts) >= 20 and pts["id"].is_unique
    assert set(pts["role"]) == {"calibration", "check"}
    assert pts["source"].str.len().min() > 5 and pts["value"].gt(0).all()
    # a figure added later has no error before (n/a): the disaggregated ones, which could not run then
    known = pts["error_before"].notna()
    assert pts.loc[known, "error_before"].abs().lt(10).all()
    assert set(pts.loc[~known, "group"]) == {"disaggregation"}
    # "the same ..." only after a row naming the full source
    assert not pts.iloc[0]["source"].startswith("the same")


def test_the_reference_run_keeps_its_documented_errors():
    """The SGLang v0.3 / vLLM v0.6 Llama-3.1-70B reference (docs/CALIBRATION.md "End to end"): the same errors
    through this registry as through studies/end_to_end.py."""
    from batching.studies import end_to_end as e2e

    e = pub.published_errors(groups=("dense",)).set_index("id")
    ref = {r.metric: r for r in e2e.end_to_end()}
    off = ref["offline output throughput (tok/s)"]
    assert e.loc["sgl-70b-offline", "error"] == pytest.approx(off.error_sglang, abs=1e-9)
    assert e.loc["vllm060-70b-offline", "error"] == pytest.approx(off.error_vllm, abs=1e-9)
    assert e.loc["sgl-70b-4rps", "error"] == pytest.approx(ref["median TPOT at 4 req/s (s)"].error_sglang, abs=1e-9)


def test_a_closed_loop_point_runs_its_clients():
    row = pub.points().set_index("id").loc["nim-70b-c5-itl"]
    sc = pub.scenario_of(row.rename("nim-70b-c5-itl").to_frame().T.assign(id="nim-70b-c5-itl").iloc[0])
    assert sc.workload.concurrency == 5 and sc.deployment.kv_dtype == "fp8" and sc.deployment.node.tp == 2


def test_cli_prints_every_figure_and_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", "--published", "--group", "closed-loop", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "nim-70b-c1-itl" in text and "# median |error| per group: closed-loop (check, 12 points)" in text
    doc = json.loads(out.read_text())
    assert len(doc["points"]) == 12
    for p in doc["points"]:
        assert math.isfinite(p["error"]) and p["error"] == pytest.approx(p["simulated"] / p["measured"] - 1)


@pytest.mark.parametrize("argv, needle", [
    (["calibrate", "--published", "--group", "nope"], "--group nope: not a group of the published points; allowed: "),
    (["calibrate", "--group", "dense"], "--group: applies to --published; give --published"),
])
def test_bad_flags_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_disaggregated_point_runs_its_split_budget_and_clients():
    """Dynamo's recipe (issue #402): 4 prefill workers of TP 1 + 1 decode worker of TP 4, 3,500 tokens per step,
    32 clients; vLLM PR #18242's: 1P1D at 3.6 req/s with burstiness 100 (Gamma arrivals, CV 0.1)."""
    pts = pub.points().set_index("id", drop=False)
    dyn = pub.scenario_of(pts.loc["dynamo402-70b-pd-itl-mean"])
    d = dyn.disagg
    assert (d.prefill_instances, d.prefill_tp, d.decode_instances, d.decode_tp) == (4, 1, 1, 4)
    assert dyn.policy.max_num_batched_tokens == 3500 and dyn.workload.concurrency == 32
    vllm = pub.scenario_of(pts.loc["vllm-pr18242-pd-ttft-p95"])
    assert vllm.disagg.gpus == 2 and vllm.workload.concurrency is None
    assert vllm.workload.arrivals.kind == "gamma" and vllm.workload.arrivals.cv == pytest.approx(0.1)
    e = pub.published_errors(groups=("disaggregation",))
    assert len(e) == 11 and e["error"].notna().all() and e["error_before"].isna().all()
    assert "| n/a |" in pub.markdown(e)


def test_the_closed_loop_note_is_the_jitter_check_s_arithmetic():
    jitter = pd.DataFrame([{"clients": 5, "measured_s": 0.5467, "fixed_s": 0.854, "jittered_s": 0.51,
                            "jittered_queue_s": 0.06, "first_wave_s": 1.2, "jittered_rest_s": 0.41},
                           {"clients": 50, "measured_s": 0.8345, "fixed_s": 2.99, "jittered_s": 2.15,
                            "jittered_queue_s": 1.61, "first_wave_s": 10.3, "jittered_rest_s": 0.52}])
    text = pub.jitter_text(jitter)
    assert text.startswith("The closed-loop TTFT at 5 clients and more is off by 1.6-3.6x in part")
    assert "0.51 s at 5 clients (measured 0.55 s, fixed lengths 0.85 s)" in text
    assert "Lockstep explains the gap at 5 clients (within 15 %)." in text
    assert "up to 2.6x the measured (50 clients), most of it a wait for the scheduler (1.61 s mean)" in text
    assert "their mean TTFT 10.3 s at 50 clients" in text
    assert "the drifting runs give 0.41 s at 5, 0.52 s at 50 clients, -25%, -38% against the measured" in text
    assert "not made" in pub.jitter_text(None)


def test_the_drift_checks_take_the_fixed_runs_from_the_published_errors():
    """jitter_check and dynamo_drift read the fixed-length runs from published_errors' frame (not run twice)."""
    e = pub.published_errors(groups=("closed-loop", "disaggregation"))
    j = pub.jitter_check(e)
    sim = e.set_index("id")["simulated"]
    assert list(j.fixed_s) == [sim[i] for i in pub.JITTER_IDS]
    assert (j.jittered_s < j.fixed_s).all()  # clients that drift apart queue less behind each other
    assert (j.jittered_rest_s < j.first_wave_s).all()
    d = pub.dynamo_drift(e)
    assert d["fixed_p90_s"] == sim["dynamo402-70b-pd-ttft-p90"] and d["drift_p90_s"] > d["fixed_p90_s"]
