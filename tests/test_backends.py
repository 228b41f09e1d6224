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


def test_nothing_fits_makes_no_backend():
    """A grid where every configuration is skipped answers with the skipped list and never makes its backend."""
    made = []
    grid = Grid(gpus=("a100-80gb",), precisions=("fp8",), tps=(8,), policies=("chunked",))  # A100 has no FP8
    res = search(base(), default_slo(2), TARGET, PRICES, grid, backend=lambda tasks: made.append(tasks))
    assert made == [] and res["searched"] == 0 and res["simulations"] == 0
    assert [s["label"] for s in res["skipped"]] == ["a100-80gb fp8 tp8 chunked"]
    assert res["backend"] == "nothing run: no configuration fits"


def test_a_backend_factory_gets_the_configurations_that_fit():
    made = []

    def factory(tasks):
        made.append(tasks)
        return make_backend("inline")

    res = search(base(), default_slo(2), TARGET, PRICES, GRID, backend=factory, prune=False)
    assert made == [3]  # 4 configurations, A100 FP8 skipped before any run
    assert res["searched"] == 3


def test_pool_width_is_capped_at_the_tasks_and_the_cores():
    cap = backends.WORKERS_PER_CPU * backends.default_workers()
    assert make_backend("local", workers=4096).width == cap == backends.worker_cap()
    assert make_backend("local", workers=4096, tasks=3).width == 3
    assert make_backend("local", tasks=1).width == 1
    assert make_backend("threads", workers=4096, tasks=2).width == 2
    assert make_backend("local", workers=2, tasks=0).width == 1


@pytest.mark.parametrize("address,endpoint", [
    ("ray://ray-head:10001", ("ray-head", 10001)),
    ("ray://ray-head", ("ray-head", 10001)),  # Ray Client's default port
    ("ray://10.0.0.5:2000/", ("10.0.0.5", 2000)),
    ("head:6379", ("head", 6379)),
    ("[::1]:6379", ("::1", 6379)),
    ("ray://[::1]", ("::1", 10001)),
    ("auto", None), ("local", None), ("", None), (None, None),  # Ray finds the cluster itself
    ("head", None), ("head:port", None), ("head:70000", None), ("::1", None),  # ray.init says what is wrong
    ("anyscale://cluster", None),
])
def test_ray_endpoint(address, endpoint):
    assert backends.ray_endpoint(address) == endpoint


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -r requirements-cluster.txt)")
def test_an_unreachable_ray_address_is_refused_at_once():
    import socket
    import time

    import ray  # noqa: F401 - imported before the clock starts

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable) as err:
        make_backend("ray", address, timeout_s=5)
    assert time.monotonic() - t0 < 5
    text = str(err.value)
    assert text.startswith(f"cannot connect to the Ray cluster at {address!r}: Connection refused; check that")
    assert "6379" in text and "\n" not in text
