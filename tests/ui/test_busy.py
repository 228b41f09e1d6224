"""The concurrency limit: a run that finds every simulation slot of its lane taken waits with a polite message
that gives its place in the queue, runs once a slot frees (first come, first served), gives up after
BATCHING_BUSY_TIMEOUT_S with a "try again" error, and never hangs; cache hits never wait; a light run never waits
behind heavy ones, and heavy runs never take the light lane."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from streamlit.testing.v1 import AppTest

from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import deployment
from batching.ui import cache
from batching.sim.workload.requests import workload_preset


def _scenario(seed: int) -> Scenario:
    return Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 40, seed))


ALL = cache.MAX_CONCURRENT + cache.LIGHT_SLOTS


@contextmanager
def every_slot_held(release_after_s: float | None = None, light: bool = True) -> Iterator[threading.Event]:
    """Another thread takes every slot (``light``: of both lanes, else the general ones only, as heavy runs) and
    keeps them until ``release_after_s`` or the block ends."""
    taken, stop = threading.Event(), threading.Event()
    want = ALL if light else cache.MAX_CONCURRENT

    def hold() -> None:
        held = 0
        deadline = time.monotonic() + 10
        while held < want and time.monotonic() < deadline:
            if cache.SLOTS.try_take(light):
                held += 1
            else:
                time.sleep(0.01)
        taken.set()
        stop.wait(release_after_s)
        for _ in range(held):
            cache.SLOTS.release()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert taken.wait(10)
    assert cache.SLOTS.running == want
    try:
        yield stop
    finally:
        stop.set()
        t.join(10)
        assert not t.is_alive()
    assert cache.SLOTS.running == 0


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setitem(cache._KERNEL, "ready", True)
    cache.clear()
    messages: list[tuple] = []
    real = cache._busy_message

    def recording(running: int, position: int, queued: int, waited_s: float, light: bool = False) -> str:
        messages.append((running, position, queued, waited_s, light))
        return real(running, position, queued, waited_s, light)

    monkeypatch.setattr(cache, "_busy_message", recording)
    yield messages
    cache.clear()


def test_a_waiting_run_says_the_server_is_busy_then_runs(fresh):
    with every_slot_held(release_after_s=1.5):
        start = time.monotonic()
        summary = cache.summary_cached(_scenario(1))
        waited = time.monotonic() - start
    assert summary["num_requests"] == 40
    assert 1.3 < waited < 1.5 + cache.BUSY_TIMEOUT_S
    # the message was refreshed while waiting, counted the runs holding the slots and gave the place in the queue
    assert len(fresh) >= 2 and fresh[0] == (ALL, 1, 1, pytest.approx(0.0, abs=0.2), True)
    text = cache._busy_message(*fresh[0])
    assert text.startswith(f"The server is busy with {ALL} other simulations: waiting for a simulation slot, "
                           "position 1 of 1 in the queue for small runs")
    assert cache.SLOTS.running == 0  # the waiting run gave its slot back


def test_a_run_gives_up_after_the_busy_timeout(fresh, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 1.0)
    with every_slot_held():
        start = time.monotonic()
        with pytest.raises(cache.ServerBusy, match="try again"):
            cache.simulate_cached(_scenario(2))
        assert time.monotonic() - start < 3.0
        # the summary path and a whole comparison give up the same way, each within the bound
        start = time.monotonic()
        with pytest.raises(cache.ServerBusy):
            cache.compare_summaries(_scenario(2), {"continuous": _scenario(2).policy})
        assert time.monotonic() - start < 3.0
    assert isinstance(cache.ServerBusy("x"), RuntimeError)  # pages' guarded() turns it into st.error


def test_cache_hits_never_wait(fresh, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 1.0)
    first = cache.summary_cached(_scenario(3))
    run = cache.simulate_cached(_scenario(3))
    with every_slot_held():
        start = time.monotonic()
        assert cache.summary_cached(_scenario(3)) == first
        assert cache.simulate_cached(_scenario(3)).summary()["num_requests"] == run.summary()["num_requests"]
        assert time.monotonic() - start < 0.5
    assert not fresh  # no busy message for a cached result


def _page() -> None:
    import streamlit as st

    from batching.sim.simulate import Scenario
    from batching.sim.hardware.specs import deployment
    from batching.ui import cache, widgets
    from batching.sim.workload.requests import workload_preset

    sc = Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 40, 4))
    summary = widgets.guarded(lambda: cache.summary_cached(sc), "The simulation")
    if summary is not None:
        st.write(f"{summary['num_requests']} requests")


def test_the_page_shows_a_busy_error_not_a_traceback(fresh, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 1.0)
    at = AppTest.from_function(_page, default_timeout=30)
    with every_slot_held():
        at.run()
    assert not at.exception
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "did not run" in msg and "server is busy" in msg and "try again" in msg
    # once the slots are free the same page runs
    at.run()
    assert not at.exception and not at.error
    assert any("40 requests" in m.value for m in at.markdown)


def test_a_run_may_hold_extra_slots_and_give_them_back():
    """A sweep holding its slot may take the free ones too; giving the extras back keeps its own."""
    assert cache.SLOTS.try_take()
    try:
        extra = 0
        while cache.SLOTS.take_extra():
            extra += 1
        assert extra == cache.MAX_CONCURRENT - 1 and cache.SLOTS.running == cache.MAX_CONCURRENT
        for _ in range(extra):
            cache.SLOTS.release()
        assert cache.SLOTS.held_here() and cache.SLOTS.running == 1
        # still holding one: a nested cached call runs in it instead of waiting for another
        assert cache.run_in_slot(lambda: "ran") == "ran"
    finally:
        cache.SLOTS.release()
    assert not cache.SLOTS.held_here() and cache.SLOTS.running == 0


def test_a_download_gets_its_run_outside_the_page_and_never_draws(fresh, monkeypatch):
    """Download buttons keep the scenario; a click runs ``result_for_download`` in Streamlit's worker thread,
    where nothing can be drawn: it takes the cached run, or waits for a slot silently and gives up in time."""
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 1.0)
    out: dict = {}

    def click(sc) -> None:  # a thread with no script run context, as the deferred callable's
        try:
            out["result"] = cache.result_for_download(sc)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc

    t = threading.Thread(target=click, args=(_scenario(5),))
    t.start()
    t.join(60)
    assert out["result"].summary()["num_requests"] == 40 and not fresh
    out.clear()
    with every_slot_held():
        t = threading.Thread(target=click, args=(_scenario(6),))  # not cached: needs a slot
        t.start()
        t.join(10)
    assert isinstance(out["error"], cache.ServerBusy) and not fresh  # no busy message drawn
    assert cache.SLOTS.running == 0


# ---------------------------------------------------------------- lanes and the queue


def _sized(n: int, seed: int) -> Scenario:
    return Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, n, seed))


@pytest.fixture
def small_light(monkeypatch):
    """Light runs are those of at most 30 requests: a 40-request run is heavy, a 20-request one light."""
    monkeypatch.setattr(cache, "LIGHT_REQUESTS", 30)
    assert cache.light_run(_sized(20, 0)) and not cache.light_run(_sized(40, 0))


def test_a_light_run_never_waits_behind_heavy_ones(fresh, small_light, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 5.0)
    out: dict = {}
    with every_slot_held(light=False) as free:  # heavy runs hold every general slot...
        waiter = threading.Thread(target=lambda: out.update(heavy=cache.summary_cached(_sized(40, 7))))
        waiter.start()  # ...and another heavy run waits for one
        deadline = time.monotonic() + 5
        while cache.SLOTS.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.SLOTS.waiting == 1
        start = time.monotonic()
        light = cache.summary_cached(_sized(20, 8))
        took = time.monotonic() - start
        assert light["num_requests"] == 20 and took < 2.5, took  # (the timeout is 5 s)
        assert "heavy" not in out  # still waiting: the light run went past it, in its own lane
        assert not [m for m in fresh if m[4]]  # and showed no busy message
        free.set()
        waiter.join(30)
    assert out["heavy"]["num_requests"] == 40  # the heavy run went once a general slot freed
    assert [m[1:3] for m in fresh if not m[4]][:1] == [(1, 1)]


def test_a_heavy_run_never_takes_the_light_lane(fresh, small_light, monkeypatch):
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 1.0)
    with every_slot_held(light=False):
        assert cache.SLOTS.running == cache.MAX_CONCURRENT  # the light slot is free...
        with pytest.raises(cache.ServerBusy):
            cache.summary_cached(_sized(40, 9))  # ...and a heavy run still waits for a general one
    assert fresh and all(m[1:3] == (1, 1) and not m[4] for m in fresh)
    assert "in the queue for large runs" in cache._busy_message(*fresh[0])


def test_waiting_runs_are_served_first_come_and_know_their_place():
    taken = [cache.SLOTS.try_take() for _ in range(cache.MAX_CONCURRENT)]
    assert all(taken) and not cache.SLOTS.try_take()
    seen: dict[str, list] = {"a": [], "b": [], "c": []}
    order: list[str] = []

    def wait(name: str) -> None:
        cache.SLOTS.wait(lambda running, pos, queued, waited: seen[name].append((pos, queued)), 20, poll_s=0.02)
        order.append(name)
        cache.SLOTS.release()

    threads = []
    for i, name in enumerate("abc"):
        threads.append(threading.Thread(target=wait, args=(name,)))
        threads[-1].start()
        deadline = time.monotonic() + 5
        while cache.SLOTS.waiting < i + 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    time.sleep(0.1)  # every waiter has refreshed its place with all three queued
    assert [seen[n][-1] for n in "abc"] == [(1, 3), (2, 3), (3, 3)]
    assert seen["a"][0] == (1, 1) and seen["c"][0] == (3, 3)
    assert not cache.SLOTS.take_extra()  # nobody takes an extra slot while runs wait
    cache.SLOTS.release()  # one slot: each waiter in turn takes it and gives it back
    for t in threads:
        t.join(10)
    assert order == ["a", "b", "c"] and cache.SLOTS.waiting == 0
    for _ in taken[1:]:
        cache.SLOTS.release()
    assert cache.SLOTS.running == 0
