"""The deployment search's fleet check (``studies.search``, step 5): the top configurations are simulated as a fleet of
their estimated nodes behind the router at the target rate, a node is added while the SLOs fail (at most 3), the
nodes and cost then come from the fleet, the rows are re-ranked (and a row that rises into the top is checked too),
the simulations are counted, and the JSON and the CLI table say which router ran."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

import batching.studies.search as s
from batching.cli.main import main
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node
from batching.sim.workload.requests import workload_preset
from batching.studies.backends import make_backend
from batching.studies.capacity import default_slo, meets_slo, slo_reading
from batching.studies.search import Grid, config_scenario, fleet_router, fleet_task, search

PRICES = {"h100-sxm": 2.5}
GRID = Grid(("h100-sxm",), ("bf16", "fp8"), (4, 8), ("chunked",))  # 4 configurations, every one fits
TARGET = 40.0
N = 200


def base(n: int = N, workload: str = "mixed", shared_prefix: int = 0) -> Scenario:
    wl = workload_preset(workload, 1.0, n, 0)
    if shared_prefix:
        wl = wl.with_shared_prefix(shared_prefix)
    return Scenario(Deployment(Node(GPUS["h100-sxm"], 8, 8), MODELS["qwen2.5-72b"]), wl)


def config_of(row: dict):
    return Grid((row["gpu"],), (row["precision"],), (row["tp"],), (row["policy"],),
                tuple((k, (float(v),)) for k, v in row["knobs"].items())).configs()[0]


def usd(row: dict, nodes: int, mean_out: float, target: float = TARGET) -> float:
    return nodes * 8 * PRICES[row["gpu"]] / (target * mean_out * 3600) * 1e6


@pytest.fixture(scope="module")
def res() -> dict:
    return search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"), prune=False)


def test_the_top_three_are_checked_as_a_fleet(res):
    ok = [c for c in res["configs"] if c["meets_slo"]]
    assert len(ok) == 4 and res["router"] == "least-outstanding" and res["fleet_top"] == 3
    for c in ok[:3]:
        assert c["fleet_checked"] is True and c["fleet_verified"] is True and c["router"] == "least-outstanding"
        assert c["nodes_needed_perfect_balance"] == math.ceil(TARGET * res["headroom"] / c["max_rate_req_s"] - 1e-9)
        assert c["fleet_nodes_needed"] >= c["nodes_needed_perfect_balance"]
        assert c["nodes_needed"] == c["fleet_nodes_needed"]
        assert c["usd_per_million_output_tokens"] == pytest.approx(usd(c, c["nodes_needed"], res["mean_output_tokens"]))
        tried = c["fleet_nodes_tried"]
        assert [t["nodes"] for t in tried] == list(range(c["nodes_needed_perfect_balance"], c["nodes_needed"] + 1))
        assert tried[-1]["meets_slo"] and not any(t["meets_slo"] for t in tried[:-1])
        assert c["fleet_ttft_p99_s"] == tried[-1]["ttft_p99_s"] > 0 and c["fleet_tpot_p99_s"] > 0
        assert c["fleet_simulations"] == len(tried)
    # the rest keep the perfect-balance estimate
    rest = ok[3]
    assert rest["fleet_checked"] is False and rest["fleet_nodes_needed"] is None and rest["fleet_verified"] is None
    assert rest["nodes_needed"] == rest["nodes_needed_perfect_balance"]
    costs = [c["usd_per_million_output_tokens"] for c in ok]
    assert costs == sorted(costs)


def test_the_top_row_rerun_as_a_fleet_meets_the_slos(res):
    top = [c for c in res["configs"] if c["meets_slo"]][0]
    n = top["fleet_nodes_needed"]
    sc = config_scenario(base(), config_of(top))
    fleet = replace(sc, nodes=n, router="least-outstanding",
                    workload=sc.workload.with_num_requests(N * n).with_rate(TARGET * res["headroom"]))
    run = simulate(fleet)
    p = slo_reading(run, default_slo(2))
    assert meets_slo(p, default_slo(2))
    summary = run.summary()
    assert summary["nodes"] == n and summary["router"] == "least-outstanding"
    assert summary["num_requests"] == N * n and len(summary["by_replica"]) == n * top["replicas_per_node"]
    assert p["ttft_p99_s"] == pytest.approx(top["fleet_ttft_p99_s"])


def test_simulations_count_the_fleet_checks_and_zero_turns_it_off(res):
    off = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"), prune=False,
                 fleet_top=0)
    assert all(c["fleet_checked"] is False and c["nodes_needed"] == c["nodes_needed_perfect_balance"]
               for c in off["configs"])
    assert "no fleet was simulated" in off["notes"][0] and off["router"] == "least-outstanding"
    fleet_runs = sum(c["fleet_simulations"] for c in res["configs"])
    assert fleet_runs >= 3
    assert res["simulations"] == off["simulations"] + fleet_runs


def test_the_json_names_the_router(res):
    d = json.loads(json.dumps(res))
    assert d["router"] == "least-outstanding"
    assert "perfect load balancing" in d["notes"][0] and "Router: least-outstanding" in d["notes"][0]
    assert all("router" in c and "fleet_checked" in c for c in d["configs"])


def test_the_fleet_check_adds_a_node_where_the_estimate_is_optimistic():
    """Chat requests sharing a 2,000-token system prompt, 200 per run: one node's capacity search finds about
    22.6 req/s within the SLOs, so 45 req/s is estimated at 2 nodes. Two nodes behind least-outstanding, each sent
    about 200 of 400 requests, miss the SLOs: the 200-request run ended before the queue it builds at that rate
    hurt (one node sent 400 requests at 22.5 req/s misses them too: not the router's doing). The check adds a
    third node, and the cost is that of 3 nodes."""
    b = base(workload="chat", shared_prefix=2000)
    slo = default_slo(1)
    grid = Grid(("h100-sxm",), ("fp8",), (8,), ("chunked",))
    res = search(b, slo, 45.0, PRICES, grid, backend=make_backend("inline"), headroom=1.0)  # as designed: no headroom
    (c,) = res["configs"]
    assert c["nodes_needed_perfect_balance"] == 2  # 45 req/s is just under twice the rate per node
    assert c["fleet_checked"] and c["fleet_verified"] and c["router"] == "least-outstanding"
    assert c["fleet_nodes_needed"] == c["nodes_needed"] == 3
    assert [(t["nodes"], t["meets_slo"]) for t in c["fleet_nodes_tried"]] == [(2, False), (3, True)]
    assert c["usd_per_million_output_tokens"] == pytest.approx(usd(c, 3, res["mean_output_tokens"], 45.0))
    # re-run independently: 2 nodes miss the SLOs, 3 meet them; one node with twice the requests misses them too
    sc = config_scenario(b, config_of(c))

    def reading(nodes: int, requests: int, rate: float) -> dict:
        at = replace(sc, nodes=nodes, router="least-outstanding",
                     workload=sc.workload.with_num_requests(requests).with_rate(rate))
        return slo_reading(simulate(at), slo)

    assert not meets_slo(reading(2, 2 * N, 45.0), slo) and meets_slo(reading(3, 3 * N, 45.0), slo)
    assert meets_slo(reading(1, N, 22.5), slo) and not meets_slo(reading(1, 2 * N, 22.5), slo)


def _point(ok: bool, growth: float = 0.0) -> dict:
    return {"attainment": 1.0 if ok else 0.5, "queue_growth_req_s": growth, "offered_req_s": 40.0,
            "ttft_p99_s": 0.5 if ok else 3.0, "tpot_p99_s": 0.05, "rate_req_s": 40.0,
            "ttft_tail_s": 0.5 if ok else 3.0, "tpot_tail_s": 0.05}  # the tail the attainment reads: P99 here


def test_fleet_task_adds_a_node_at_a_time(monkeypatch):
    calls = []

    def fake(sc, slo):
        calls.append((sc.nodes, sc.router, sc.workload.num_requests, sc.workload.rate_req_s))
        return _point(sc.nodes >= 4)

    monkeypatch.setattr(s, "slo_point", fake)
    sc = config_scenario(base(), Grid(("h100-sxm",), ("fp8",), (8,), ("chunked",)).configs()[0])
    out = fleet_task({"scenario": sc, "slo": default_slo(2), "nodes": 2, "router": "least-kv", "rate_req_s": 40.0})
    assert out["nodes"] == 4 and out["simulations"] == 3 and out["router"] == "least-kv"
    assert calls == [(2, "least-kv", 400, 40.0), (3, "least-kv", 600, 40.0), (4, "least-kv", 800, 40.0)]
    # the capacity search's rule: every request within the SLOs but a queue that grows does not pass
    calls.clear()
    monkeypatch.setattr(s, "slo_point", lambda sc, slo: calls.append(sc.nodes) or _point(True, growth=40.0))
    out = fleet_task({"scenario": sc, "slo": default_slo(2), "nodes": 2, "router": "least-kv", "rate_req_s": 40.0})
    assert out["nodes"] is None and out["last_nodes"] == 5 and calls == [2, 3, 4, 5]  # at most 3 more, then stop
    assert [t["sustained"] for t in out["tried"]] == [False] * 4


def test_a_failed_check_is_not_verified_and_the_next_row_is_checked(monkeypatch):
    """The cheapest configuration misses the SLOs as a fleet even with 3 more nodes: it is ranked at the lower bound
    (one node more than the last tried), marked not verified, and the row that rises into the top 3 is checked."""
    seen = []

    def fake(payload):
        sc, n = payload["scenario"], payload["nodes"]
        seen.append((sc.deployment.precision, sc.deployment.node.tp, n, payload["router"]))
        bad = sc.deployment.precision == "fp8" and sc.deployment.node.tp == 4
        tried = [{"nodes": k, "meets_slo": False, "attainment": 0.5, "sustained": True, "ttft_p99_s": 3.0,
                  "tpot_p99_s": 0.05} for k in range(n, n + 4)] if bad else \
            [{"nodes": n, "meets_slo": True, "attainment": 1.0, "sustained": True, "ttft_p99_s": 0.5,
              "tpot_p99_s": 0.05}]
        return {"status": "done", "simulations": len(tried), "router": payload["router"], "tried": tried,
                "nodes": None if bad else n, "last_nodes": tried[-1]["nodes"]}

    monkeypatch.setattr(s, "fleet_task", fake)
    res = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"), prune=False,
                 router="least-kv")
    ok = [c for c in res["configs"] if c["meets_slo"]]
    labels = [c["label"] for c in ok]
    worst = next(c for c in ok if c["label"] == "h100-sxm fp8 tp4 chunked")
    est = worst["nodes_needed_perfect_balance"]
    assert worst["fleet_checked"] and worst["fleet_verified"] is False and worst["fleet_nodes_needed"] is None
    assert worst["nodes_needed"] == est + 4 and "not verified" in worst["fleet_note"]
    assert worst["usd_per_million_output_tokens"] == pytest.approx(usd(worst, est + 4, res["mean_output_tokens"]))
    assert labels[-1] == "h100-sxm fp8 tp4 chunked"  # it was first by the estimate; now last
    assert all(c["fleet_checked"] for c in ok[:3])  # the fourth by the estimate rose into the top 3: checked
    assert len(seen) == 4 and {r for *_, r in seen} == {"least-kv"}
    costs = [c["usd_per_million_output_tokens"] for c in ok]
    assert costs == sorted(costs)
    assert res["simulations"] >= sum(c["fleet_simulations"] for c in ok) == 4 + 3


def test_request_level_policies_run_round_robin_and_bad_routers_are_refused():
    assert fleet_router("least-kv", PRESETS["static"]) == "round-robin"
    assert fleet_router("least-kv", PRESETS["chunked"]) == "least-kv"
    with pytest.raises(ValueError, match="router='random' is not allowed"):
        search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"), router="random")
    with pytest.raises(ValueError, match="fleet_top=-1 is out of range"):
        search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"), fleet_top=-1)


def test_cli_table_marks_the_checked_rows(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["search", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100", "--target-rate", "40",
               "--requests", "150", "--workers", "1", "--gpus", "h100-sxm", "--precisions", "fp8", "--tp", "4,8",
               "--gpu-hour-usd", "2.5", "--serving", "agg", "--router", "least-outstanding", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["router"] == "least-outstanding"
    top = d["configs"][0]
    assert top["fleet_checked"] and top["router"] == "least-outstanding"
    text = capsys.readouterr().out
    line = next(l for l in text.splitlines() if top["label"] in l and "req/s" in l)
    assert line.rstrip().endswith(f"{top['nodes_needed']} nodes ✓ least-outstanding") or \
        line.rstrip().endswith(f"{top['nodes_needed']} node ✓ least-outstanding")
    assert "Router: least-outstanding" in text
