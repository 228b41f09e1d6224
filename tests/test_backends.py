"""Execution backends: the local pool and Ray give the same ranking (seeded); a task that fails on a worker is
retried once and then reported with the configuration that failed, never a hang; Ray missing is a clear error."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from batching.studies import backends
from batching.studies.backends import BackendUnavailable, make_backend, map_tasks
from batching.studies.capacity import default_slo
from batching.studies.search import Grid, search

from test_search import PRICES, TARGET, base

HAS_RAY = importlib.util.find_spec("ray") is not None
GRID = Grid(gpus=("h100-sxm", "a100-80gb"), precisions=("bf16", "fp8"), tps=(8,), policies=("chunked",))


def flaky(payload: dict) -> dict:
    """Fails on its first try (leaves a marker file), succeeds on the second."""
    marker = Path(payload["dir"]) / f"{payload['name']}.tried"
    if payload.get("always") or not marker.exists():
        marker.write_text("x")
        raise RuntimeError(f"worker failure for {payload['name']}")
    return {"name": payload["name"], "tries": 2}


def crash(payload: dict) -> dict:
    """The worker process dies."""
    os._exit(3)


def ranking(res: dict) -> list[tuple]:
    return [(c["label"], round(c["max_rate_req_s"], 6), c["nodes_needed"]) for c in res["configs"]]


@pytest.mark.parametrize("name", ["inline", "local", "threads"])
def test_retried_once_then_reported(name, tmp_path):
    be = make_backend(name, workers=2)
    try:
        payloads = {"a": {"dir": str(tmp_path), "name": "a"}, "b": {"dir": str(tmp_path), "name": "b", "always": True}}
        run = map_tasks(be, flaky, payloads)
    finally:
        be.close()
    assert run.results == {"a": {"name": "a", "tries": 2}}
    assert list(run.failures) == ["b"]
    f = run.failures["b"]
    assert f.label == "b" and f.tries == 2 and "worker failure for b" in f.error


def test_a_dead_worker_is_reported_not_a_hang():
    be = make_backend("local", workers=1)
    try:
        run = map_tasks(be, crash, {"x": {}})
    finally:
        be.close()
    assert run.results == {} and run.failures["x"].tries == 2 and "died" in run.failures["x"].error


def test_search_reports_the_failing_configuration(monkeypatch):
    import batching.studies.search as s

    real = s.search_task

    def broken(payload):
        if payload["scenario"].deployment.precision == "fp8":
            raise RuntimeError("boom")
        return real(payload)

    monkeypatch.setattr(s, "search_task", broken)
    res = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=make_backend("inline"))
    assert [f["label"] for f in res["failed"]] == ["h100-sxm fp8 tp8 chunked"]
    assert res["failed"][0]["tries"] == 2 and "boom" in res["failed"][0]["error"]
    assert all(c["precision"] == "bf16" for c in res["configs"])


def test_local_pool_gives_the_inline_ranking():
    grid = Grid(("h100-sxm",), ("fp8",), (4, 8), ("chunked",), (("max_num_seqs", (64.0, 256.0)),))
    inline = search(base(), default_slo(2), TARGET, PRICES, grid, backend=make_backend("inline"), prune=False)
    be = make_backend("local", workers=2)
    try:
        local = search(base(), default_slo(2), TARGET, PRICES, grid, backend=be, prune=False)
        pruned = search(base(), default_slo(2), TARGET, PRICES, grid, backend=be)
    finally:
        be.close()
    # warm starts read a fixed configuration per family, so the answer does not depend on which task ends first
    assert ranking(local) == ranking(inline)
    assert any(c["warm_start"] for c in local["configs"])
    assert pruned["configs"][0]["label"] == inline["configs"][0]["label"]


def test_ray_missing_says_how_to_install(without_ray):
    with pytest.raises(BackendUnavailable, match="requirements-cluster.txt"):
        make_backend("ray")


def test_ray_is_imported_only_in_the_ray_backend():
    root = Path(backends.__file__).resolve().parents[1]
    users = [p for p in root.rglob("*.py") if "import ray" in p.read_text(encoding="utf-8")]
    assert users == [Path(backends.__file__).resolve()]


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -r requirements-cluster.txt)")
def test_ray_gives_the_local_ranking(tmp_path):
    be = make_backend("local", workers=2)
    try:
        local = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=be, prune=False)
    finally:
        be.close()
    ray_be = make_backend("ray", workers=2)
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's own tasks: tests/ is not on the workers' path
    try:
        on_ray = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=ray_be, prune=False)
        run = map_tasks(ray_be, flaky, {"a": {"dir": str(tmp_path), "name": "a"},
                                        "b": {"dir": str(tmp_path), "name": "b", "always": True}})
    finally:
        ray_be.close()
    assert ranking(on_ray) == ranking(local)
    assert run.results == {"a": {"name": "a", "tries": 2}}, {k: f.error for k, f in run.failures.items()}
    assert run.failures["b"].tries == 2 and "worker failure for b" in run.failures["b"].error
