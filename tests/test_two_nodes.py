"""Issue 23 item 4, TP 16 over two 8-GPU nodes: the node model, the composed all-reduce across the network, the
calibration status that says it is not measured, a DeepSeek-V3 run on 2 x 8 H100 (which one node cannot hold), and
the CLI's flags and refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.kernel_tables import calibration_status_dep, measured_terms
from batching.sim.hardware.specs import GPUS, Node, deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.topology.disagg import Disagg
from batching.sim.workload.requests import workload_preset

ROOT = Path(__file__).resolve().parents[1]
DS_H100 = dict(gpu="h100-sxm", model="deepseek-v3", precision="fp8")


@pytest.mark.parametrize("num_gpus", [9, 12, 15, 17, 32])
def test_a_unit_is_one_node_or_two(num_gpus):
    with pytest.raises(ValueError, match=f"num_gpus={num_gpus}"):
        Node(GPUS["h100-sxm"], num_gpus, 1).validate()


def test_tp16_needs_two_nodes_and_spans_them():
    with pytest.raises(ValueError, match=r"tp=16 must divide num_gpus=8 .*tp 16 needs num_gpus 16"):
        deployment(tp=16, num_gpus=8)
    dep = deployment(tp=16)  # num_gpus follows the TP degree
    node = dep.node
    assert (node.num_gpus, node.replicas, node.physical_nodes, node.cross_node) == (16, 1, 2, True)
    eight = deployment(tp=8, num_gpus=16).node  # two TP 8 replicas, each inside one node
    assert (eight.replicas, eight.physical_nodes, eight.cross_node) == (2, 2, False)


def test_the_two_node_all_reduce_is_nccl_plus_the_network():
    x8, y8 = cm.allreduce_table("nccl", 8)
    tables = [cm.allreduce_table(impl, 16) for impl in cm.ALLREDUCE_IMPLS]
    for x, y in tables:  # every implementation: NCCL runs a group that spans nodes
        assert np.array_equal(x, tables[0][0]) and np.array_equal(y, tables[0][1])
    x, y = tables[0]
    assert np.array_equal(x, x8)
    expected = y8 + cm.NET_HOPS * cm.NET_HOP_S + np.exp(x8) / 8 / cm.NIC_BPS
    assert np.allclose(y, expected, rtol=1e-12)
    # NCCL's tuning model for Tree/LL on 2 x 8 GPUs is 25.2 us; the measured 8-GPU floor is 15.5 us
    assert y[0] == pytest.approx(y8[0] + 10e-6, rel=1e-3) and 24e-6 < y[0] < 27e-6
    assert (np.diff(y) >= 0).all() and (y > y8).all()
    # at 256 MB the NIC term (256 MB / 8 at 47 GB/s = 714 us) is what the network adds past the latency
    i = int(np.argmin(np.abs(np.exp(x) - 2**28)))
    assert (y[i] - y8[i]) * 1e6 == pytest.approx(10 + 2**28 / 8 / 47e9 * 1e6, rel=1e-9)


def test_the_gpus_nvlink_scales_only_the_nvlink_part():
    h100 = cm.cost_model(deployment(tp=16))
    b200 = cm.cost_model(deployment(gpu="b200", tp=16))  # NVLink 5: twice H100's per direction
    assert h100.coef[cm.C_AR_SCALE] == b200.coef[cm.C_AR_SCALE] == 1.0
    x8, y8 = cm.allreduce_table("nccl", 8)
    net = cm.NET_HOPS * cm.NET_HOP_S + np.exp(x8) / 8 / cm.NIC_BPS
    assert np.allclose(h100.ar_s, y8 + net)
    assert np.allclose(b200.ar_s, y8[0] + 0.5 * (y8 - y8[0]) + net)
    # a step's all-reduce on two nodes costs more than inside one (H200: the same GPU at TP 8 and TP 16)
    tp8 = cm.cost_model(deployment(gpu="h200-sxm", model="deepseek-v3", tp=8, precision="fp8"))
    tp16 = cm.cost_model(deployment(gpu="h200-sxm", model="deepseek-v3", tp=16, precision="fp8"))
    ratios = [cm.step_breakdown(tp16, n)["all-reduce"] / cm.step_breakdown(tp8, n)["all-reduce"] for n in (1, 64, 4096)]
    assert ratios[0] > 2 and min(ratios) > 1.2  # the network's latency dominates small steps


def test_deepseek_v3_on_two_h100_nodes_uses_its_measured_kernels_and_says_what_is_not():
    with pytest.raises(ValueError, match=r"does not fit on H100 .* it fits with tp=16 over two nodes"):
        deployment(tp=8, **DS_H100)
    dep = deployment(tp=16, **DS_H100)
    # half the split weights of TP 8; q_a_proj, kv_a_proj_with_mqa and the routers stay whole on every GPU
    assert dep.weight_bytes_per_gpu / 2**30 == pytest.approx(40.17, abs=0.01)
    t = measured_terms(dep)
    assert t["missing"] == [] and t["moe"] is not None and t["decode_s_per_token"] is not None
    ok, why = calibration_status_dep(dep)
    assert not ok and "TP 16 spans two nodes" in why and "not measured" in why
    # the TP 8 fit's terms (no GEMM measurement at 16 GPUs), the shard half the size
    assert cm.fit_key(16) == "8"
    assert cm.tile_factors_apply(deployment(tp=8)) and not cm.tile_factors_apply(deployment(tp=16))
    ep = deployment(tp=16, ep=16, **DS_H100)  # whole experts over the 16 GPUs: aiconfigurator measured EP 16
    assert measured_terms(ep)["missing"] == []


def test_a_run_on_two_nodes_conserves_requests_tokens_and_kv():
    sc = Scenario(deployment(tp=16, **DS_H100), workload_preset("sharegpt", 4.0, 200, 3), PRESETS["chunked"])
    res = simulate(sc)
    req, steps, s = res.requests, res.steps, res.summary()
    assert s["num_requests"] == 200 == len(req) and (req["release_s"] >= req["arrival_s"]).all()
    assert s["preemptions"] == 0  # (else recomputed tokens would count twice below)
    assert steps.prefill_tokens.sum() + s["cached_prompt_tokens"] == req["prompt_tokens"].sum()
    assert steps.decode_tokens.sum() == (req["output_tokens"] - 1).sum()  # the first token comes with the prefill
    assert steps["kv_blocks"].max() <= sc.deployment.kv_capacity_blocks
    assert s["calibrated"] is False and "two nodes" in s["calibration_note"]
    again = simulate(sc)
    pd.testing.assert_frame_equal(again.requests, req)


def test_a_split_and_the_search_stay_on_one_node():
    with pytest.raises(ValueError, match=r"places its instances on nodes of 8 GPUs; num_gpus=16"):
        Disagg(1, 8, 1, 8).validate(deployment(tp=16, **DS_H100))


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def test_cli_runs_tp16_and_says_it_is_not_calibrated(tmp_path):
    out = tmp_path / "r.json"
    p = _cli("run", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--precision", "fp8", "--tp", "16",
             "--workload", "sharegpt", "--requests", "60", "--rate", "2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    s = d.get("summary", d)
    assert s["calibrated"] is False and "TP 16 spans two nodes" in s["calibration_note"]
    assert s["num_requests"] == 60
    p = _cli("specs", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--tp", "16", "--json")
    assert p.returncode == 0, p.stderr
    f = json.loads(p.stdout)
    assert (f["num_gpus"], f["tp"], f["replicas"]) == (16, 16, 1)
    p = _cli("search", "--num-gpus", "16", "--slo-ttft-ms", "500", "--target-rate", "10")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--num-gpus 16: the search's nodes have 1 to 8 GPUs; for TP 16 over two nodes give --num-gpus 8 --tp 16" \
        in p.stderr


def test_a_fleet_of_tp16_replicas_names_its_servers():
    """--tp 16 --nodes 2: two replicas over four 8-GPU servers, each replica on its own pair."""
    from batching.cli.args import fleet_lines, pick

    from dataclasses import replace

    base = Scenario(workload=workload_preset("chat", 2.0, 40, 0))
    s = simulate(replace(base, deployment=deployment("h100-sxm", "deepseek-v3", 16, 16, "fp8"), nodes=2)).summary()
    assert (s["nodes"], s["replicas"], s["physical_nodes"]) == (2, 2, 4)
    out = pick(s)
    assert out["physical_nodes"] == 4
    lines = fleet_lines(out)
    assert lines[0] == "# fleet: 2 replicas over 4 nodes (2 each), router round-robin"
    assert lines[1].startswith("replica 0 (nodes 0-1): ") and lines[2].startswith("replica 1 (nodes 2-3): ")
    one = simulate(replace(base, nodes=2)).summary()
    assert "physical_nodes" not in one and fleet_lines(pick(one))[0].startswith("# fleet: 2 nodes, 2 replicas")
