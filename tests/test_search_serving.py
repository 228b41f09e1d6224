"""Issue 24, items 5 and 6: the search enumerates aggregated TP x replicas and prefill/decode splits (--serving
agg/disagg/both), prices every row with ``pricing.price`` (default prices and headroom from ``pricing``), ranks by
cost then by P99 latency at the target traffic (rank 1 on the Pareto front), finds the best configuration of every
GPU type with why it lost (pruning compares within a GPU type and serving mode only), and the Capacity page's
aggregated-vs-disaggregated comparison tries every aggregated TP, not only the sidebar's."""
from __future__ import annotations

import json
import math

import pytest

from batching.cli.main import main
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies import disagg_capacity as dc
from batching.studies.backends import make_backend
from batching.studies.capacity import SLO
from batching.studies.pricing import DEFAULT_HEADROOM, default_gpu_hour_usd, price
from batching.studies.search import Grid, Ledger, rank_key, ranked, splits_of, search

SLO_Q = SLO(ttft_s=1.0, tpot_s=0.05)
TARGET = 20.0


def small(num_gpus: int = 2, n: int = 150) -> Scenario:
    return Scenario(Deployment(Node(GPUS["h100-sxm"], num_gpus, 1), MODELS["llama-3.1-8b"]),
                    workload_preset("chat", 1.0, n, 0))


# ---------------------------------------------------------------- the grid


def test_every_split_of_a_node_is_kept_or_dominated_with_why():
    kept, dominated = splits_of(8)
    assert len(kept) == 28 and len(dominated) == 43
    for p, t, d, u in kept + list(dominated):
        assert p * t + d * u <= 8 and t in (1, 2, 4, 8) and u in (1, 2, 4, 8)
    assert {(1, 4, 1, 4), (2, 2, 1, 4), (1, 4, 2, 2), (4, 1, 4, 1), (1, 1, 1, 1), (2, 1, 1, 2)} <= set(kept)
    # 1 prefill + 2 decode (TP 1) leaves a GPU idle beside the same 2 copies per node: 2 + 2 fills it
    assert "2 prefill instances fit beside the same 2 copies per node" in dominated[(1, 1, 2, 1)]
    assert splits_of(2) == ([(1, 1, 1, 1)], {})


def test_serving_both_enumerates_aggregated_and_splits_and_refuses_what_cannot_split():
    g = Grid(("h200-sxm",), ("fp8",), (1, 2, 4, 8), ("chunked", "static"), serving="both")
    cfgs = g.configs()
    agg = [c for c in cfgs if c.serving == "agg"]
    dis = [c for c in cfgs if c.serving == "disagg"]
    assert len(agg) == 8 and len(dis) == 28 and all(c.policy == "chunked" for c in dis)
    c = next(c for c in dis if c.split == (2, 2, 1, 4))
    assert c.label() == "h200-sxm fp8 2xTP2 prefill + 1xTP4 decode chunked"
    assert c.gpus_per_copy(8) == 8 and c.copies_per_node(8) == 1
    assert next(c for c in dis if c.split == (1, 1, 1, 1)).copies_per_node(8) == 4
    refused = dict(g.refused())
    assert "iteration-level" in refused["static split"]
    assert len(Grid(("h200-sxm",), serving="agg").configs()) == 4
    with pytest.raises(ValueError, match="serving='split' is not allowed; allowed: agg, disagg, both"):
        Grid(("h200-sxm",), serving="split").validate()


# ---------------------------------------------------------------- the ranking


def _row(label, usd, ttft, tpot, rate, gpu="h100-sxm", serving="agg"):
    return {"label": label, "usd_per_million_output_tokens": usd, "ttft_p99_s": ttft, "tpot_p99_s": tpot,
            "max_rate_req_s": rate, "meets_slo": True, "gpu": gpu, "serving": serving, "nodes_needed": 2,
            "usd_per_node_hour": 21.5}


def test_a_cost_tie_goes_to_more_capacity_then_to_the_lower_latency_and_rank_one_is_on_the_front():
    # issue 39 item 2: TP 2 reaches a higher rate on the same nodes, so its fleet carries more: it ranks first
    # although TP 4 has the lower latency at the target; at equal capacity the lower latency decides
    tp2 = _row("h100-sxm fp8 tp2 chunked", 1.0, 0.40, 0.030, 12.0) | {"fleet_capacity_req_s": 24.0}
    tp4 = _row("h100-sxm fp8 tp4 chunked", 1.0, 0.25, 0.020, 10.0) | {"fleet_capacity_req_s": 20.0}
    dear = _row("h100-sxm fp8 tp8 chunked", 1.5, 0.10, 0.010, 6.0) | {"fleet_capacity_req_s": 12.0}
    assert sorted([tp2, tp4, dear], key=rank_key)[0] is tp2
    assert sorted([tp2 | {"fleet_capacity_req_s": 20.0}, tp4], key=rank_key)[0] is tp4
    good, bad = ranked(Ledger(8), {1: tp2, 2: tp4, 3: dear})
    assert [r["label"] for r in good] == [tp2["label"], tp4["label"], dear["label"]] and bad == []
    assert good[0]["pareto"] and tp4["pareto"] and dear["pareto"]


# ---------------------------------------------------------------- the search


@pytest.fixture(scope="module")
def both() -> dict:
    return search(small(), SLO_Q, TARGET, None, Grid(("h100-sxm",), ("bf16",), (1, 2), ("chunked",), serving="both"),
                  backend=make_backend("inline"), fleet_top=0)


def test_rows_are_priced_by_pricing_with_the_default_table_and_headroom(both):
    assert both["headroom"] == DEFAULT_HEADROOM and both["gpu_hour_usd"] == {"h100-sxm": default_gpu_hour_usd("h100-sxm")}
    ok = [r for r in both["configs"] if r["meets_slo"]]
    assert {r["serving"] for r in ok} == {"agg", "disagg"}
    mean_out = both["mean_output_tokens"]
    for r in ok:
        copies = math.ceil(TARGET * DEFAULT_HEADROOM / r["max_rate_req_s"] - 1e-9)
        nodes = math.ceil(copies / r["copies_per_node"])
        assert r["nodes_needed"] == nodes
        want = price(r["max_rate_req_s"], r["gpus_per_copy"], 2, TARGET, 2.69, mean_out, DEFAULT_HEADROOM, nodes=nodes)
        assert r["usd_per_million_output_tokens"] == pytest.approx(want.usd_per_million_output_tokens)
        assert r["usd_per_million_output_tokens"] == pytest.approx(nodes * 2 * 2.69 / (TARGET * mean_out * 3600) * 1e6)
        # latency at the target traffic: each deployed copy carries target / copies, below its own maximum rate
        assert r["rate_per_copy_at_target_req_s"] == pytest.approx(TARGET / (nodes * r["copies_per_node"]))
        assert r["rate_per_copy_at_target_req_s"] < r["max_rate_req_s"]
        assert 0 < r["ttft_p99_s"] and 0 < r["tpot_p99_s"] <= SLO_Q.tpot_s
        assert r["tpot_p99_at_max_rate_s"] is not None
    costs = [(r["usd_per_million_output_tokens"], -r["fleet_capacity_req_s"], r["ttft_p99_s"]) for r in ok]
    assert costs == sorted(costs) and ok[0]["pareto"]  # cost, then the fleet's capacity (issue 39), then latency


def test_the_split_and_the_best_of_each_serving_mode(both):
    (split,) = [r for r in both["configs"] if r["serving"] == "disagg"]
    assert split["split"] == {"prefill_instances": 1, "prefill_tp": 1, "decode_instances": 1, "decode_tp": 1}
    assert split["tp"] is None and split["gpus_per_copy"] == 2
    best = {b["serving"]: b for b in both["best_by_serving"]}
    assert set(best) == {"agg", "disagg"} and all(b["usd_per_million_output_tokens"] for b in best.values())
    top = both["configs"][0]
    assert best[top["serving"]]["why_not_best"] is None
    loser = best["disagg" if top["serving"] == "agg" else "agg"]
    assert loser["why_not_best"].startswith(("costs $", "the same cost"))


def test_every_gpu_type_gets_its_best_row_with_a_cost_and_why_it_lost():
    res = search(small(), SLO_Q, TARGET, {"a100-80gb": 1.39}, Grid(("b200", "a100-80gb"), ("bf16",), (1, 2),
                 ("chunked",)), backend=make_backend("inline"), fleet_top=0)
    by = {b["gpu"]: b for b in res["best_by_gpu"]}
    assert set(by) == {"b200", "a100-80gb"}
    assert all(b["usd_per_million_output_tokens"] > 0 and b["rank"] for b in by.values())
    top = res["configs"][0]
    assert by[top["gpu"]]["why_not_best"] is None
    other = by["a100-80gb" if top["gpu"] == "b200" else "b200"]
    assert other["why_not_best"]
    # pruning only ever compares within a GPU type: no GPU loses every configuration to a pruning
    for p in res["pruned"]:
        assert any(r["gpu"] == p["gpu"] and r["meets_slo"] for r in res["configs"])


def test_the_cli_searches_both_by_default_with_default_prices(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["search", "--model", "llama-3.1-8b", "--num-gpus", "2", "--tp", "2", "--workload", "chat",
               "--requests", "100", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50", "--target-rate", "20",
               "--workers", "1", "--fleet-top", "0", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["serving"] == "both" and d["gpu_hour_usd"] == {"h100-sxm": 2.69} and d["headroom"] == DEFAULT_HEADROOM
    assert {c["serving"] for c in d["configs"]} == {"agg", "disagg"}
    text = capsys.readouterr().out
    assert "best agg: #" in text and "best disagg: #" in text and "at the target traffic" in text


# ---------------------------------------------------------------- the Capacity page's comparison


def test_the_aggregated_side_tries_every_tp_the_node_divides_the_sidebar_first():
    sc = Scenario(workload=workload_preset("mixed", 3.0, 100, 0))  # Qwen2.5-72B on 8 x H100, TP 8
    configs, refused = dc.configurations(sc)
    labels = [c.label for c in configs]
    assert labels[0] == "aggregated: TP 8"
    assert "aggregated: 2 × TP 4" in labels and "aggregated: 4 × TP 2" in labels
    assert "aggregated: 8 × TP 1" in refused  # 72B in BF16 does not fit one H100
    assert [c.kind for c in configs].count("aggregated") == 3
    only = dc.configurations(sc, agg_tps=(8,))[0]
    assert [c.label for c in only if c.kind == "aggregated"] == ["aggregated: TP 8"]


def test_a_bad_serving_is_one_line():
    import subprocess
    import sys
    from pathlib import Path

    p = subprocess.run([sys.executable, "-m", "batching", "search", "--slo-ttft-ms", "1000", "--target-rate", "10",
                        "--serving", "split"], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                       text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--serving" in lines[0] and "'split'" in lines[0] and "agg" in lines[0] and "both" in lines[0]
