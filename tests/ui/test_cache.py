"""The cache layer: the same inputs never simulate twice; capacity runs are shared across request rates."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from uihelpers import FAST, ROOT, assert_clean, open_page

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, SimResult, simulate
from batching.sim.hardware.specs import deployment
from batching.ui import cache
from batching.sim.workload.requests import TraceWorkload, workload_preset


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = cache.simulate

    def counting(scenario, saturated=False, steps=True):
        calls.append((scenario, saturated))
        return real(scenario, saturated=saturated, steps=steps)

    monkeypatch.setattr(cache, "simulate", counting)
    monkeypatch.setitem(cache._KERNEL, "ready", True)
    cache.clear()
    yield calls
    cache.clear()


def _scenario(rate: float = 3.0) -> Scenario:
    return Scenario(deployment=deployment(), workload=workload_preset("mixed", rate, 120, 5))


def test_showdown_simulates_each_run_once(counted):
    first = cache.compare_summaries(_scenario(), PRESETS)
    assert len(counted) == 2 * len(PRESETS)
    again = cache.compare_summaries(_scenario(), PRESETS)
    assert len(counted) == 2 * len(PRESETS)  # all cached
    assert again == first
    assert all(s["capacity_output_tok_s"] > 0 for s in first.values())
    # another rate: new offered-load runs, the capacity runs are the same
    cache.compare_summaries(_scenario(5.0), PRESETS)
    assert len(counted) == 3 * len(PRESETS)
    # Explore on a preset reuses the showdown's run
    res = cache.simulate_cached(_scenario().with_policy(PRESETS["dynamic"]))
    assert len(counted) == 3 * len(PRESETS)
    assert res.summary()["ttft_p99_s"] == pytest.approx(first["dynamic"]["ttft_p99_s"])


def test_trace_scenarios_key_on_the_bytes_not_the_object(counted):
    data = b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(f"{i},{100 + i},{10 + i}\n".encode()
                                                                 for i in range(30))
    a = Scenario(deployment=deployment(), workload=TraceWorkload(data=data, filename="a.csv"))
    b = Scenario(deployment=deployment(), workload=TraceWorkload(data=bytes(bytearray(data)), filename="a.csv"))
    c = Scenario(deployment=deployment(), workload=TraceWorkload(data=data + b"31,5,5\n", filename="a.csv"))
    cache.summary_cached(a)
    cache.summary_cached(b)
    assert len(counted) == 1
    cache.summary_cached(c)
    assert len(counted) == 2
    assert cache.scenario_token(a) == cache.scenario_token(b) != cache.scenario_token(c)


# ---------------------------------------------------------------- memory: bounded by bytes, no copies


def _live_results() -> list:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, SimResult)]


def test_the_store_is_bounded_by_bytes_not_entries(counted, monkeypatch):
    one = cache.result_bytes(cache.simulate_cached(_scenario()))
    # honest accounting: what the store counts is at least what a result really holds
    tracemalloc.start()
    kept = simulate(_scenario(4.0))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert 0.9 * held <= cache.result_bytes(kept) <= 1.5 * held + 65536, (held, cache.result_bytes(kept))
    del kept
    monkeypatch.setattr(cache.RESULTS, "budget_bytes", int(2.5 * one))
    cache.clear()
    sizes = []
    for rate in (1.0, 2.0, 3.0, 4.0, 5.0):
        sizes.append(cache.result_bytes(cache.simulate_cached(_scenario(rate))))
        assert cache.RESULTS.held_bytes <= cache.RESULTS.budget_bytes
    # the newest that fit stayed, the older ones went, least recently used first
    kept = len(cache.RESULTS)
    assert 1 <= kept < 5 and cache.RESULTS.held_bytes == sum(sizes[-kept:])
    assert sum(sizes[-kept - 1:]) > cache.RESULTS.budget_bytes
    calls = len(counted)
    cache.simulate_cached(_scenario(5.0))  # still there
    assert len(counted) == calls
    cache.simulate_cached(_scenario(1.0))  # gone: simulated again
    assert len(counted) == calls + 1
    # a result larger than the whole budget runs but is not kept
    monkeypatch.setattr(cache.RESULTS, "budget_bytes", one // 2)
    cache.clear()
    cache.simulate_cached(_scenario(6.0))
    assert len(cache.RESULTS) == 0 and cache.RESULTS.held_bytes == 0


def test_cache_mb_comes_from_the_environment():
    code = "from batching.ui import cache; print(cache.CACHE_BYTES, cache.RESULTS.budget_bytes)"
    env = {**os.environ, "BATCHING_CACHE_MB": "300", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(300 * 2**20)] * 2, out.stderr[-2000:]


def test_cache_entries_bound_the_study_answers():
    """BATCHING_CACHE_ENTRIES (README, "Settings"): sweep tables are kept 4 times that many, capacity and deployment
    searches 2 times, least recently used out first; summaries and sweep points are bounded by bytes only."""
    code = """from batching.ui import cache
for i in range(12):
    for kind in ("sweep", "capacity", "deployment_search", "sweep_point"):
        cache.small_cached((kind, i), lambda i=i: i)
    if i == 0:
        cache.peek(("sweep", 0))
    cache.peek(("sweep", 0))  # used again and again: kept
kept = {k: [i for i in range(12) if cache.peek((k, i)) is not None]
        for k in ("sweep", "capacity", "deployment_search", "sweep_point")}
print(kept)"""
    env = {**os.environ, "BATCHING_CACHE_ENTRIES": "2", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == str({"sweep": [0, 5, 6, 7, 8, 9, 10, 11], "capacity": [8, 9, 10, 11],
                                      "deployment_search": [8, 9, 10, 11], "sweep_point": list(range(12))}), \
        out.stdout + out.stderr[-2000:]


def test_a_store_counts_its_kinds_through_every_eviction():
    store = cache.ByteStore(10_000, {"sweep": 3})
    for i in range(5):
        store.put(("sweep", i), i, 1000)
    assert store.count("sweep") == 3 and [store.get(("sweep", i)) for i in range(5)] == [None, None, 2, 3, 4]
    store.put(("summary", 0), "s", 8500)  # evicted by bytes: the oldest go, the kind's count follows
    assert store.held_bytes == 9500 and store.count("sweep") == 1 and store.get(("sweep", 4)) == 4
    store.put(("sweep", 4), "again", 500)  # replaced, not counted twice
    assert store.count("sweep") == 1 and len(store) == 2
    store.clear()
    assert store.count("sweep") == 0 and store.held_bytes == 0


def test_hits_share_the_stored_result_and_cannot_change_it(counted):
    sc = _scenario()
    first = cache.simulate_cached(sc)
    size = cache.result_bytes(first)
    del first
    tracemalloc.start()
    hits = [cache.simulate_cached(sc) for _ in range(10)]
    grown = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(counted) == 1
    # ten hits, not ten copies (st.cache_data unpickled each one): every column of a hit is the stored array, and the
    # hits together hold a fraction of one result (their frames' own bookkeeping: one block per step column, since
    # the step frame takes its columns without consolidating them, ~12 KB a hit here)
    stored = cache.simulate_cached(sc)
    for hit in hits[:2]:
        for frame, whole in ((hit.steps, stored.steps), (hit.requests, stored.requests)):
            assert all(np.shares_memory(frame[c].to_numpy(), whole[c].to_numpy()) for c in frame.columns
                       if pd.api.types.is_numeric_dtype(frame[c]))
    assert grown < 0.5 * size, (grown, size)
    # a caller that writes to its view changes only its view
    ttft = hits[1].requests["ttft_s"].copy()
    hits[0].requests["ttft_s"] = 0.0
    hits[0].requests.loc[0, "prompt_tokens"] = -1
    hits[0].steps["extra"] = 1
    with pytest.raises(ValueError):
        hits[0].itl_hist[0, 0] = 7  # read-only
    again = cache.simulate_cached(sc)
    assert again.requests["ttft_s"].equals(ttft) and again.requests.loc[0, "prompt_tokens"] > 0
    assert "extra" not in again.steps
    assert again.summary() == hits[2].summary()


def test_trace_digests_do_not_keep_uploads_alive():
    header = b"arrival_s,prompt_tokens,output_tokens\n"
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(12):  # twelve 1 MiB uploads, hashed and dropped
        data = header + bytes([65 + i]) * 2**20
        cache.scenario_token(Scenario(workload=TraceWorkload(data=data, filename="t.csv")))
        del data
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert kept < 5 * 2**20, kept  # the few digests remembered, not every upload (lru_cache kept 16)


@pytest.mark.parametrize("page, query", [
    ("pages/explore.py", {}),
    ("pages/compare.py", {}),
    ("app.py", {}),
])
def test_a_page_keeps_no_result_once_it_has_run(page, query):
    """Between reruns a session holds scenarios and summaries, never a result or its figures: the results alive
    are the ones the store holds."""
    cache.clear()
    at = open_page(page, **FAST, **query)
    at.run()
    assert_clean(at)
    stored = {id(entry[0]) for entry in cache.RESULTS._entries.values()}
    alive = _live_results()
    assert alive and all(id(r) in stored for r in alive), (len(alive), len(stored))
