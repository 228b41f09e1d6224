"""The cache layer: the same inputs never simulate twice; capacity runs are shared across request rates."""
from __future__ import annotations

import pytest

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.specs import deployment
from batching.ui import cache
from batching.sim.workload import TraceWorkload, workload_preset


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = cache.simulate

    def counting(scenario, saturated=False):
        calls.append((scenario, saturated))
        return real(scenario, saturated=saturated)

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
