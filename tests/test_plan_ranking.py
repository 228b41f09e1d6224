"""Issue 39 item 2: whole nodes and the headroom must not decide a plan silently. Ties in $/M at the target go to
the fleet with more capacity (not to the lower P99 TTFT); the search and capacity tables (CLI, JSON, dashboard) show
the margin (the share of the fleet's capacity the target uses), $/M at capacity and output tok/s per GPU; a sentence
says when whole-node rounding decided the ranking; every plan says the headroom applies, and says so again when the
engine profile is the user's own (a ``calibrate --fit`` output), which the default headroom was not sized for."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from batching.cli.main import main
from batching.sim.hardware.engines import ENGINES
from batching.sim.simulate import Scenario
from batching.studies.capacity import headroom_note, own_profile, plan_price
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies.search import Ledger, rank_key, ranked, rounding_note

# the first case, small: Llama-3.1-70B FP8 on H200 TP 4, continuous and chunked cost the same 2 nodes for
# 30 req/s, and continuous (lower P99 TTFT, less capacity) ranked first
SEARCH = ["search", "--model", "llama-3.1-70b", "--gpus", "h200-sxm", "--precisions", "fp8", "--tp", "4",
          "--policies", "continuous,chunked", "--serving", "agg", "--workload", "chat", "--requests", "200",
          "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50", "--target-rate", "30", "--fleet-top", "0", "--workers", "1"]


def _row(label, usd, ttft, cap, at_cap=1.0, nodes=2):
    return {"label": label, "usd_per_million_output_tokens": usd, "ttft_p99_s": ttft, "tpot_p99_s": 0.02,
            "max_rate_req_s": cap / nodes, "fleet_capacity_req_s": cap, "margin": 30.0 / cap,
            "usd_per_million_output_tokens_at_capacity": at_cap, "meets_slo": True, "gpu": "h200-sxm",
            "serving": "agg", "nodes_needed": nodes, "usd_per_node_hour": 28.7}


def test_a_cost_tie_goes_to_the_fleet_with_more_capacity_and_rank_one_is_on_the_front():
    slow_start = _row("continuous", 2.265, 0.274, 49.2)  # lower TTFT, less capacity
    roomy = _row("chunked", 2.265, 0.296, 56.6)
    dear = _row("tp8", 3.0, 0.1, 80.0)
    assert sorted([slow_start, roomy, dear], key=rank_key)[0] is roomy
    good, _ = ranked(Ledger(8), {1: slow_start, 2: roomy, 3: dear})
    assert [r["label"] for r in good] == ["chunked", "continuous", "tp8"]
    assert good[0]["pareto"] and dear["pareto"]


def test_rounding_note_names_the_winner_at_capacity_when_it_differs():
    top = _row("h100 tp8", 1.534, 0.3, 20.0, at_cap=1.40)
    lean = _row("b200 nvfp4 tp2", 3.068, 0.3, 124.0, at_cap=0.60, nodes=1)
    note = rounding_note([top, lean])
    assert note is not None and "Whole-node rounding decided the ranking" in note
    assert "b200 nvfp4 tp2 costs least at capacity ($0.600 against $1.400)" in note
    assert rounding_note([_row("a", 1.0, 0.3, 20.0, at_cap=0.5), _row("b", 2.0, 0.3, 20.0, at_cap=0.9)]) is None


def test_plan_price_gives_the_fleet_capacity_margin_and_tokens_per_gpu():
    sc = Scenario()  # 8 GPUs per node
    p = plan_price(sc, 10.0, 30.0, 2.0, headroom=1.25, mean_output=200.0)
    assert p["nodes_needed"] == 4  # ceil(30 x 1.25 / 10)
    assert p["fleet_capacity_req_s"] == pytest.approx(40.0)
    assert p["margin"] == pytest.approx(0.75)
    assert p["output_tok_s_per_gpu"] == pytest.approx(10.0 * 200 / 8)


def test_search_cli_ranks_the_tie_by_capacity_and_shows_the_plan_columns(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(SEARCH + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    ok = [c for c in d["configs"] if c["meets_slo"]]
    assert len(ok) == 2 and ok[0]["usd_per_million_output_tokens"] == ok[1]["usd_per_million_output_tokens"]
    assert ok[0]["fleet_capacity_req_s"] > ok[1]["fleet_capacity_req_s"]
    assert ok[0]["policy"] == "chunked"
    for c in ok:
        assert c["margin"] == pytest.approx(30.0 / c["fleet_capacity_req_s"])
        assert c["output_tok_s_per_gpu"] == pytest.approx(c["max_rate_req_s"] * d["mean_output_tokens"] / 8)
        assert c["usd_per_million_output_tokens_at_capacity"] < c["usd_per_million_output_tokens"]
    assert "margin" in text and "$/M at cap" in text and "tok/s/GPU" in text
    assert f"headroom: Headroom {DEFAULT_HEADROOM:g}× applies" in text
    assert d["headroom_note"].startswith(f"Headroom {DEFAULT_HEADROOM:g}× applies")


def test_the_default_headroom_is_named_with_a_profile_of_ones_own(tmp_path, capsys):
    mine = replace(ENGINES["vllm"], name="fitted-vllm")
    assert own_profile(Scenario()) is None and own_profile(Scenario(engine=mine)) == "fitted-vllm"
    assert "your own" in headroom_note(DEFAULT_HEADROOM, "fitted-vllm")
    assert "your own" not in headroom_note(DEFAULT_HEADROOM) and headroom_note(1.0).startswith("Headroom 1×")
    prof = tmp_path / "fit.profile.json"
    prof.write_text(mine.to_json())
    assert main(["capacity", "--model", "llama-3.1-8b", "--num-gpus", "1", "--tp", "1", "--workload", "chat",
                 "--requests", "100", "--slo-ttft-ms", "1000", "--target-rate", "5", "--profile", str(prof)]) == 0
    text = capsys.readouterr().out
    assert f"Headroom {DEFAULT_HEADROOM:g}× applies" in text and "'fitted-vllm' is your own" in text
    assert "margin" in text and "output_tok_s_per_gpu" in text
