"""The deployment search offers TP 16 over two 8-GPU nodes: a copy is two nodes, priced as the Capacity page prices
the same deployment, and its rows say they are not calibrated."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from batching.sim.hardware.specs import MODELS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies.capacity import capacity, default_slo
from batching.studies.launch import with_launch
from batching.studies.pricing import default_gpu_hour_usd
from batching.studies.search import Config, Grid, config_scenario, copies_at_target, search, search_words

TARGET = 10.0


def _deepseek() -> Scenario:
    base = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    return replace(base, deployment=replace(base.deployment, model=MODELS["deepseek-v3"], precision="fp8"))


@pytest.fixture(scope="module")
def found():
    return search(_deepseek(), default_slo(2), TARGET, None,
                  Grid(("h100-sxm", "h200-sxm"), ("fp8",), (8, 16), ("chunked",), serving="agg"), prune=False)


def test_the_grid_takes_tp16_on_eight_gpu_nodes_only():
    Grid(("h100-sxm",), tps=(8, 16)).validate()
    with pytest.raises(ValueError, match="tp: 16 runs one replica over two 8-GPU nodes; these nodes have 4 GPUs"):
        Grid(("h100-sxm",), tps=(16,), num_gpus=4).validate()
    with pytest.raises(ValueError, match="tp: 32 is not allowed; allowed: 1, 2, 4, 8, 16"):
        Grid(("h100-sxm",), tps=(32,)).validate()


def test_a_skip_names_the_search_s_tp16_not_the_run_flags():
    """DeepSeek-V3 on H100 at TP 8 does not fit; the hint names how the search tries TP 16, not --num-gpus 16."""
    base = _deepseek()
    with pytest.raises(ValueError) as err:
        config_scenario(base, Config("h100-sxm", "fp8", 8, "chunked"), {})
    why = str(err.value)
    assert "num_gpus=16" in why  # the run commands' words
    assert search_words(why, {8}).count("TP 16 over two nodes (not searched: add 16 to the TP degrees, e.g. "
                                        "--tp 8,16 or the page's Tensor parallel)") == 1
    assert "num_gpus" not in search_words(why, {8})
    assert "TP 16 over two nodes (searched: its own rows)" in search_words(why, {8, 16})
    assert search_words("it needs 80 GiB", {8}) == "it needs 80 GiB"


def test_a_tp16_copy_is_two_nodes():
    cfg = Config("h100-sxm", "fp8", 16, "chunked")
    assert (cfg.gpus_per_copy(8), cfg.copies_per_node(8), cfg.nodes_per_copy(8)) == (16, 1, 2)
    assert Config("h100-sxm", "fp8", 8, "chunked").nodes_per_copy(8) == 1
    assert copies_at_target(5.0, 20.0, 1.25, 1, 2) == (10, 5)  # 5 copies of two nodes
    assert copies_at_target(5.0, 20.0, 1.25, 1) == (5, 5)
    sc = config_scenario(_deepseek(), cfg)
    assert (sc.deployment.node.num_gpus, sc.deployment.node.tp, sc.deployment.node.cross_node) == (16, 16, True)


def test_deepseek_on_h100_runs_over_two_nodes_and_says_it_is_not_calibrated(found):
    rows = {r["label"]: r for r in found["configs"]}
    skipped = {s["label"]: s for s in found["skipped"]}
    assert "fits with TP 16 over two nodes (searched: its own rows)" in skipped["h100-sxm fp8 tp8 chunked"]["why"]
    two = rows["h100-sxm fp8 tp16 over two nodes chunked"]
    assert two["meets_slo"] and two["gpus_per_copy"] == 16 and two["nodes_per_copy"] == 2
    assert two["nodes_needed"] % 2 == 0 and two["nodes_needed"] >= 2
    assert two["usd_per_hour"] == pytest.approx(two["nodes_needed"] * 8 * default_gpu_hour_usd("h100-sxm"))
    assert two["calibrated"] is False and "TP 16 spans two nodes" in two["calibration_note"]
    assert all(t["nodes"] % 2 == 0 for t in two["fleet_nodes_tried"]) and two["fleet_nodes_tried"]
    one = rows["h200-sxm fp8 tp8 chunked"]
    assert one["calibrated"] is True and one["calibration_note"] == "" and one["nodes_per_copy"] == 1
    launch = with_launch([dict(two)], _deepseek())[0]["launch"]  # the commands the CLI and the page attach
    assert "--tensor-parallel-size 16" in launch["vllm"] and "--distributed-executor-backend ray" in launch["vllm"]
    assert "--nnodes 2" in launch["sglang"] and "--node-rank 0" in launch["sglang"]


def test_capacity_prices_the_same_two_node_deployment_the_same(found):
    """One answer per money question: the Capacity page's search of the same TP 16 deployment gives the same rate,
    the same 8-GPU nodes (perfect balance) and the same $."""
    two = next(r for r in found["configs"] if r["label"] == "h100-sxm fp8 tp16 over two nodes chunked")
    sc = config_scenario(_deepseek(), Config("h100-sxm", "fp8", 16, "chunked"))
    res = capacity(sc, default_slo(2), target_rate_req_s=TARGET, gpu_hour_usd=default_gpu_hour_usd("h100-sxm"),
                   ceiling=two["ceiling_req_s"])
    assert res.max_rate_req_s == pytest.approx(two["max_rate_req_s"])
    assert res.nodes_needed == two["nodes_needed_perfect_balance"]
    assert res.usd_per_hour == pytest.approx(res.nodes_needed * 8 * default_gpu_hour_usd("h100-sxm"))
    assert res.usd_per_million_output_tokens_at_capacity == pytest.approx(
        two["usd_per_million_output_tokens_at_capacity"])


def test_the_cli_searches_tp16_and_marks_it(tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "batching", "search", "--model", "deepseek-v3", "--precision", "fp8",
                        "--gpus", "h100-sxm", "--tp", "8,16", "--serving", "agg", "--target-rate", "10",
                        "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--requests", "150", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "h100-sxm fp8 tp16 over two nodes chunked" in p.stdout and "(not calibrated)" in p.stdout
    assert "not calibrated: h100-sxm fp8 tp16 over two nodes chunked: TP 16 spans two nodes" in p.stdout
    rows = json.loads(out.read_text())["configs"]
    assert [r["tp"] for r in rows if r["meets_slo"]] == [16] and rows[0]["calibrated"] is False
    p = subprocess.run([sys.executable, "-m", "batching", "search", "--tp", "16", "--num-gpus", "4",
                        "--target-rate", "5", "--slo-ttft-ms", "1000"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--tp: 16 must divide --num-gpus 4; allowed: 1, 2, 4 (16 spans two 8-GPU nodes: give --num-gpus 8)" \
        in p.stderr
