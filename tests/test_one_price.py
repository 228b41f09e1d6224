"""One answer per money question (issue 24): ``capacity`` (CLI, JSON), ``report --page capacity`` (JSON) and the
Capacity page (AppTest) run on one small scenario with their defaults give the same nodes and the same $ per
million output tokens, at the target and at capacity, through the one pricing rule (``studies.pricing.price``), with
the one headroom default and the GPU's default price from the price table. (The search and Find a deployment join
this test through the same rule: ``search`` (CLI, JSON) and Find a deployment (AppTest) on a grid of that one
configuration.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from batching.cli.main import main
from batching.report import capacity_json
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies import pricing
from batching.studies.capacity import capacity, default_slo

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import assert_clean, run_page  # noqa: E402

# the page's scenario with n=200: mixed at 3 req/s, seed 0 (the sidebar's defaults)
SCENARIO = ["--workload", "mixed", "--rate", "3", "--requests", "200", "--seed", "0"]
TARGET = 20.0
KEYS = ("nodes_needed", "usd_per_hour", "usd_per_million_output_tokens", "usd_per_million_output_tokens_at_capacity",
        "mean_output_tokens", "headroom", "gpu_hour_usd", "max_rate_req_s")


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("one_price")
    out = {}
    # capacity: the default SLOs given as flags, no price and no headroom given
    assert main(["capacity", *SCENARIO, "--preset", "chunked", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100",
                 "--target-rate", str(TARGET), "--json", str(tmp / "c.json")]) == 0
    out["capacity"] = json.loads((tmp / "c.json").read_text())
    # report --page capacity: the page's defaults
    assert main(["report", *SCENARIO, "--page", "capacity", "--policies", "chunked", "--target-rate", str(TARGET),
                 "--no-png", "--out", str(tmp / "r")]) == 0
    out["report_doc"] = (tmp / "r" / "capacity_plan.json").read_text()
    out["report"] = json.loads(out["report_doc"])["policies"]["chunked"]
    # the Capacity page: its plan, its JSON download and the table it shows
    at = run_page("pages/capacity.py", n="200", policies="chunked", target=str(TARGET))
    assert_clean(at)
    plan = at.session_state["capacity_last"]
    out["page"] = json.loads(capacity_json(plan))["policies"]["chunked"]
    row = at.dataframe[0].value.loc["chunked"]
    out["page_table"] = {"nodes_needed": int(row["Nodes needed"]),
                         "usd_at_target": row["$ per M output tokens at target"],
                         "usd_at_capacity": row["$ per M output tokens at capacity"]}
    # search: a grid of this one configuration (H100 BF16 TP 8 chunked, aggregated), its fleet check on
    assert main(["search", *SCENARIO, "--gpus", "h100-sxm", "--precisions", "bf16", "--tp", "8", "--policies",
                 "chunked", "--serving", "agg", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100",
                 "--target-rate", str(TARGET), "--json", str(tmp / "s.json")]) == 0
    out["search_doc"] = json.loads((tmp / "s.json").read_text())
    out["search"] = out["search_doc"]["configs"][0]
    # Find a deployment: the same grid from a link (searched as the page opens)
    at = run_page("pages/find_a_deployment.py", n="200", s_gpus="h100-sxm", s_precs="bf16", s_tps="8",
                  s_policies="chunked", s_serving="agg", target=str(TARGET))
    assert_clean(at)
    out["find_doc"] = at.session_state["search_last"][1]
    out["find"] = out["find_doc"]["configs"][0]
    return out


def test_every_surface_gives_the_same_nodes_and_prices(surfaces):
    cli, rep, page = surfaces["capacity"], surfaces["report"], surfaces["page"]
    for key in KEYS:
        assert cli[key] == pytest.approx(rep[key]) == pytest.approx(page[key]), key
    # the one headroom default and the GPU's default price (H100 SXM) on every surface, with no flag given
    assert cli["headroom"] == pricing.DEFAULT_HEADROOM == 1.25
    assert cli["gpu_hour_usd"] == pricing.default_gpu_hour_usd("h100-sxm") == 2.69
    assert cli["gpu_hour_usd_source"].startswith("default: $2.69/GPU-h, h100-sxm default as of 2026-03-10")
    assert json.loads(surfaces["report_doc"])["gpu_hour_usd_source"] == cli["gpu_hour_usd_source"]
    # the search, on the CLI and on Find a deployment: the same nodes and prices, its price and headroom the same
    for name in ("search", "find"):
        row, doc = surfaces[name], surfaces[f"{name}_doc"]
        assert row["nodes_needed"] == cli["nodes_needed"], name
        assert row["max_rate_req_s"] == pytest.approx(cli["max_rate_req_s"]), name
        for key in ("usd_per_million_output_tokens", "usd_per_million_output_tokens_at_capacity"):
            assert row[key] == pytest.approx(cli[key]), (name, key)
        assert doc["headroom"] == cli["headroom"] and doc["gpu_hour_usd"] == {"h100-sxm": cli["gpu_hour_usd"]}
        assert doc["mean_output_tokens"] == pytest.approx(cli["mean_output_tokens"])
    shown = surfaces["page_table"]
    assert shown["nodes_needed"] == cli["nodes_needed"]
    assert shown["usd_at_target"] == f"${cli['usd_per_million_output_tokens']:.3f}"
    assert shown["usd_at_capacity"] == f"${cli['usd_per_million_output_tokens_at_capacity']:.3f}"


def test_the_price_is_the_pricing_rule_at_the_target_traffic(surfaces):
    """$/M at the target = the fleet's $/h over the tokens the target brings an hour (target x mean output tokens of
    the admitted requests x 3600), not over a simulated throughput; at capacity: one node at its rate."""
    c = surfaces["capacity"]
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0), policy=PRESETS["chunked"])
    mean_out = float(sc.requests()[0].output_tokens.mean())
    assert c["mean_output_tokens"] == pytest.approx(mean_out)
    p = pricing.price(c["max_rate_req_s"], 8, 8, TARGET, 2.69, mean_out)
    assert (c["nodes_needed"], c["usd_per_hour"]) == (p.nodes, p.usd_per_hour)
    assert c["usd_per_million_output_tokens"] == pytest.approx(p.usd_per_million_output_tokens)
    assert c["usd_per_million_output_tokens_at_capacity"] == pytest.approx(p.usd_per_million_output_tokens_at_capacity)
    lib = capacity(sc, default_slo(2), target_rate_req_s=TARGET, gpu_hour_usd=2.69)
    assert lib.usd_per_million_output_tokens == pytest.approx(c["usd_per_million_output_tokens"])


def test_a_gpu_without_a_default_price_is_planned_without_dollars(tmp_path, capsys):
    """A custom GPU has no row in the price table: capacity gives nodes and says to give a price (no made-up $);
    with --gpu-hour-usd it prices as any GPU."""
    gpu = tmp_path / "g.json"
    gpu.write_text(json.dumps({"name": "Lab GPU", "memory_gib": 141, "hbm_bandwidth_tb_s": 4.8,
                               "peak_bf16_tflops": 989}))
    out = tmp_path / "c.json"
    flags = ["capacity", *SCENARIO, "--gpu-json", str(gpu), "--preset", "chunked", "--slo-ttft-ms", "1000,30000",
             "--slo-tpot-ms", "100", "--target-rate", "20", "--json", str(out)]
    assert main(flags) == 0
    c = json.loads(out.read_text())
    assert c["nodes_needed"] >= 1 and c["gpu_hour_usd"] is None and c["gpu_hour_usd_source"] == "none"
    assert c["usd_per_million_output_tokens"] is None and c["usd_per_million_output_tokens_at_capacity"] is None
    assert "no default price for Lab GPU" in capsys.readouterr().out
    assert main([*flags, "--gpu-hour-usd", "4"]) == 0
    priced = json.loads(out.read_text())
    assert priced["usd_per_hour"] == priced["nodes_needed"] * 8 * 4.0 and priced["gpu_hour_usd_source"] == "given"
