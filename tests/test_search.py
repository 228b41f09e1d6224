"""Deployment search on a small grid: ranked by cost, what does not fit is skipped with the reason, pruning gives the
same best configuration as the exhaustive search, the top configuration re-run alone with ``studies.capacity``
gives the same rate within 5 %, the Pareto front, knob parsing and input errors."""
from __future__ import annotations

import math

import pytest

from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node
from batching.sim.workload.requests import workload_preset
from batching.studies.backends import make_backend
from batching.studies.capacity import capacity, default_slo
from batching.studies.search import Grid, config_scenario, pareto, parse_knobs, search

PRICES = {"h100-sxm": 2.5, "a100-80gb": 1.6}
GRID = Grid(gpus=("h100-sxm", "a100-80gb"), precisions=("bf16", "fp8"), tps=(4, 8), policies=("chunked",))
TARGET = 40.0


def base(n: int = 200) -> Scenario:
    return Scenario(Deployment(Node(GPUS["h100-sxm"], 8, 8), MODELS["qwen2.5-72b"]), workload_preset("mixed", 1.0, n, 0))


@pytest.fixture(scope="module")
def exhaustive() -> dict:
    be = make_backend("inline")
    return search(base(), default_slo(2), TARGET, PRICES, GRID, backend=be, prune=False, warm=False)


@pytest.fixture(scope="module")
def pruned() -> dict:
    be = make_backend("inline")
    return search(base(), default_slo(2), TARGET, PRICES, GRID, backend=be)


def test_ranked_by_cost_with_costs_from_nodes(exhaustive):
    ok = [c for c in exhaustive["configs"] if c["meets_slo"]]
    assert len(ok) >= 3
    costs = [c["usd_per_million_output_tokens"] for c in ok]
    assert costs == sorted(costs)
    mean_out = exhaustive["mean_output_tokens"]
    for c in ok:
        assert c["replicas_per_node"] == 8 // c["tp"]
        # the perfect-balance estimate; the top rows' nodes are then the fleet check's (tests/test_search_fleet.py)
        assert c["nodes_needed_perfect_balance"] == math.ceil(TARGET * exhaustive["headroom"] / c["max_rate_req_s"] - 1e-9)
        if c["fleet_checked"]:
            assert c["nodes_needed"] >= c["nodes_needed_perfect_balance"]
        else:
            assert c["nodes_needed"] == c["nodes_needed_perfect_balance"]
        want = c["nodes_needed"] * 8 * PRICES[c["gpu"]] / (TARGET * mean_out * 3600) * 1e6
        assert c["usd_per_million_output_tokens"] == pytest.approx(want)
        assert c["ttft_p99_s"] > 0 and c["tpot_p99_s"] > 0 and c["binding_slo"] in ("ttft_s", "tpot_s", None)
    # an H100 in FP8 is cheaper than any A100 (which has no FP8 and is ~3x slower per node here)
    assert ok[0]["gpu"] == "h100-sxm" and ok[0]["precision"] == "fp8"
    assert exhaustive["pruned"] == [] and exhaustive["simulations"] > 0


def test_what_does_not_fit_is_skipped_with_the_reason(exhaustive):
    fp8 = [s for s in exhaustive["skipped"] if s["gpu"] == "a100-80gb" and s["precision"] == "fp8"]
    assert len(fp8) == 2 and all(s["reason"] == "does not fit" and "fp8" in s["why"] and "A100" in s["why"]
                                 for s in fp8)
    assert exhaustive["searched"] + len(exhaustive["skipped"]) - sum(
        1 for s in exhaustive["skipped"] if s["reason"] == "no rate meets the SLOs") == exhaustive["grid_size"]


def test_weights_over_memory_are_skipped_with_why():
    cfg = Grid(("h100-sxm",), ("bf16",), (1,), ("chunked",)).configs()[0]
    with pytest.raises(ValueError, match="does not fit"):
        config_scenario(base(), cfg)
    res = search(base(), default_slo(2), TARGET, {"h100-sxm": 2.5}, Grid(("h100-sxm",), ("bf16",), (1, 8),
                 ("chunked",)), backend=make_backend("inline"))
    (skip,) = [s for s in res["skipped"] if s["tp"] == 1]
    assert "GiB per GPU" in skip["why"]
    assert res["searched"] == 1


def test_pruning_keeps_the_best_and_runs_fewer_simulations(exhaustive, pruned):
    best = lambda r: [c for c in r["configs"] if c["meets_slo"]][0]  # noqa: E731
    a, b = best(exhaustive), best(pruned)
    assert (a["gpu"], a["precision"], a["tp"], a["policy"], a["knobs"]) == \
        (b["gpu"], b["precision"], b["tp"], b["policy"], b["knobs"])
    assert b["usd_per_million_output_tokens"] == pytest.approx(a["usd_per_million_output_tokens"])
    assert pruned["pruned"], "nothing was pruned on a grid with clearly dearer configurations"
    assert pruned["simulations"] < exhaustive["simulations"]
    # every pruned configuration really costs more than the best in the exhaustive search
    by = {c["label"]: c for c in exhaustive["configs"]}
    for p in pruned["pruned"]:
        c = by[p["label"]]
        assert not c["meets_slo"] or c["usd_per_million_output_tokens"] > a["usd_per_million_output_tokens"]


def test_top_configuration_rerun_with_capacity_gives_the_same_rate(pruned):
    top = [c for c in pruned["configs"] if c["meets_slo"]][0]
    cfg = Grid((top["gpu"],), (top["precision"],), (top["tp"],), (top["policy"],)).configs()[0]
    alone = capacity(config_scenario(base(), cfg), default_slo(2))
    assert alone.max_rate_req_s == pytest.approx(top["max_rate_req_s"], rel=0.05)


def test_warm_starts_give_the_cold_rate_within_tolerance():
    grid = Grid(("h100-sxm",), ("fp8",), (8,), ("chunked",), parse_knobs(["max_num_seqs=64,256"]))
    kw = dict(backend=make_backend("inline"), prune=False)
    cold = search(base(), default_slo(2), TARGET, PRICES, grid, warm=False, **kw)
    warm = search(base(), default_slo(2), TARGET, PRICES, grid, warm=True, **kw)
    assert any(c["warm_start"] for c in warm["configs"])
    for a, b in zip(sorted(cold["configs"], key=lambda c: c["label"]), sorted(warm["configs"], key=lambda c: c["label"])):
        assert b["max_rate_req_s"] == pytest.approx(a["max_rate_req_s"], rel=0.05)


def test_pareto_front():
    rows = [{"c": 1, "t": 5, "p": 5}, {"c": 2, "t": 1, "p": 5}, {"c": 3, "t": 6, "p": 6}, {"c": 1, "t": 5, "p": 5}]
    assert pareto(rows, ("c", "t", "p")) == [True, True, False, True]


def test_knobs_apply_only_to_modes_that_use_them():
    grid = Grid(("h100-sxm",), ("bf16",), (8,), ("chunked", "static"),
                parse_knobs(["max_num_seqs=128,256", "max_batch_size=16"]))
    labels = [c.label() for c in grid.configs()]
    assert labels == ["h100-sxm bf16 tp8 chunked, max_num_seqs=128", "h100-sxm bf16 tp8 chunked, max_num_seqs=256",
                      "h100-sxm bf16 tp8 static, max_batch_size=16"]


@pytest.mark.parametrize("items,message", [
    (["max_num_seqs"], "NAME=V1"), (["foo=1"], "not allowed"), (["max_num_seqs=0"], "out of range"),
    (["max_num_seqs=1.5"], "whole number"), (["max_num_seqs=a"], "not a number"),
    (["max_num_seqs=1", "max_num_seqs=2"], "twice"),
])
def test_bad_knobs(items, message):
    with pytest.raises(ValueError, match=message):
        parse_knobs(items)


def test_bad_inputs():
    with pytest.raises(ValueError, match="gpu_hour_usd a100-80gb=-1 is out of range"):
        search(base(), default_slo(2), TARGET, {"h100-sxm": 2.5, "a100-80gb": -1}, GRID, backend=make_backend("inline"))
    with pytest.raises(ValueError, match="gpus"):
        Grid(("tpu",)).validate()
