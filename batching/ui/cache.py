"""Cached, bounded simulation calls, keyed on the frozen scenario (the same inputs never simulate twice)."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from functools import lru_cache
from typing import TypeVar

import streamlit as st

from batching.studies.compare import with_capacity
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, SimResult, simulate
from batching.sim.workload import ArrivalProcess, SyntheticWorkload, TraceWorkload, workload_preset

T = TypeVar("T")

# hosted mode (deploy/ sets these): at most this many simulations at once in the process (each holds a
# core), this many simulation results kept (summaries, small, 8 times as many), and how long a run waits
# for a free slot before it gives up with a "try again" message
MAX_CONCURRENT = max(1, int(os.environ.get("BATCHING_MAX_CONCURRENT_SIMULATIONS", "2")))
CACHE_ENTRIES = max(4, int(os.environ.get("BATCHING_CACHE_ENTRIES", "24")))
BUSY_TIMEOUT_S = max(1.0, float(os.environ.get("BATCHING_BUSY_TIMEOUT_S", "60")))
BUSY_POLL_S = 0.5  # how often a waiting run retries and refreshes its message
_SLOTS = threading.BoundedSemaphore(MAX_CONCURRENT)
_KERNEL = {"ready": False}


class ServerBusy(RuntimeError):
    """No simulation slot came free within BUSY_TIMEOUT_S; the message asks the user to try again."""


class _NoSlot(Exception):
    """Raised inside a cached function that would have to wait for a slot (never cached, never shown)."""


class _Slots:
    """The process-wide simulation slots: ``_SLOTS`` plus who holds one.

    A cached function takes a slot only without waiting (``try_take``); when none is free it raises
    ``_NoSlot`` and the caller, outside the cached function, waits here with a message on screen and then
    calls again holding the slot. So messages never live inside a cached function (Streamlit would replay
    them on every cache hit) and a cache hit never waits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._local = threading.local()

    @property
    def running(self) -> int:
        """Simulations holding a slot now."""
        with self._lock:
            return self._running

    def held_here(self) -> bool:
        """Whether this thread holds a slot (a run may take extra ones, e.g. a parallel sweep)."""
        return getattr(self._local, "held", 0) > 0

    def _took(self) -> None:
        with self._lock:
            self._running += 1
        self._local.held = getattr(self._local, "held", 0) + 1

    def release(self) -> None:
        self._local.held = max(0, getattr(self._local, "held", 0) - 1)
        with self._lock:
            self._running -= 1
        _SLOTS.release()

    def try_take(self) -> bool:
        if _SLOTS.acquire(blocking=False):
            self._took()
            return True
        return False

    def wait(self, notify: Callable[[int, float], None], timeout_s: float) -> None:
        """Take a slot, calling ``notify(running, waited_s)`` before each retry; ServerBusy after timeout_s."""
        start = time.monotonic()
        while True:
            waited = time.monotonic() - start
            if waited >= timeout_s:
                running = self.running
                raise ServerBusy(
                    f"The server is busy: {running} other simulation{'s' if running != 1 else ''} kept every "
                    f"slot for {timeout_s:.0f} s. Nothing is wrong with your scenario; please try again in a "
                    "minute.")
            notify(self.running, waited)
            if _SLOTS.acquire(timeout=min(BUSY_POLL_S, max(0.01, timeout_s - waited))):
                self._took()
                return


SLOTS = _Slots()


def _run_in_slot(fn: Callable[[], T]) -> T:
    """Inside a cached function: run ``fn`` in a slot, taking one without waiting unless already held."""
    if SLOTS.held_here():
        return fn()
    if not SLOTS.try_take():
        raise _NoSlot
    try:
        return fn()
    finally:
        SLOTS.release()


def _busy_message(running: int, waited_s: float) -> str:
    others = f"{running} other simulation{'s' if running != 1 else ''}"
    return (f"The server is busy with {others}; retrying… (waited {waited_s:.0f} s, giving up after "
            f"{BUSY_TIMEOUT_S:.0f} s)")


def _with_slot(call: Callable[[], T]) -> T:
    """``call`` a cached function; if it needs a slot and none is free, wait with a polite message, then
    call it again holding a slot. Raises ServerBusy (a RuntimeError) when no slot comes free in time."""
    try:
        return call()
    except _NoSlot:
        pass
    holder = st.empty()
    try:
        SLOTS.wait(lambda running, waited: holder.info(_busy_message(running, waited),
                                                       icon=":material/hourglass_top:"), BUSY_TIMEOUT_S)
    finally:
        holder.empty()
    try:
        return call()
    finally:
        SLOTS.release()


# public names of the slot discipline, for other cached studies (batching/ui/planning.py)
run_in_slot = _run_in_slot
with_slot = _with_slot


@lru_cache(maxsize=16)
def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _token(value):
    """A hashable stand-in for a field: a trace's bytes become a digest (computed once per bytes object)."""
    if isinstance(value, TraceWorkload):
        return ("TraceWorkload",) + tuple(
            (f.name, _digest(value.data) if f.name == "data" else getattr(value, f.name)) for f in fields(value))
    return value


def scenario_token(scenario: Scenario) -> tuple:
    """What a scenario is, field by field, without hashing a trace's bytes on every call."""
    return tuple((f.name, _token(getattr(scenario, f.name))) for f in fields(scenario))


_HASH = {Scenario: scenario_token}


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False, hash_funcs=_HASH)
def _simulate(scenario: Scenario, saturated: bool) -> SimResult:
    return _run_in_slot(lambda: simulate(scenario, saturated=saturated))


@st.cache_data(max_entries=8 * CACHE_ENTRIES, show_spinner=False, hash_funcs=_HASH)
def _summary(scenario: Scenario, saturated: bool) -> dict:
    return _simulate(scenario, saturated).summary()  # the cached call, not the one that draws messages


# the cache keys on the arguments as passed, so every call goes through these with both given
def simulate_cached(scenario: Scenario, saturated: bool = False) -> SimResult:
    """``simulate`` through the bounded cache (a copy of the cached result).

    At most MAX_CONCURRENT simulations run at once in the process; a run that finds every slot taken
    shows "The server is busy…" while it waits and raises ServerBusy after BUSY_TIMEOUT_S.
    """
    return _with_slot(lambda: _simulate(scenario, bool(saturated)))


def summary_cached(scenario: Scenario, saturated: bool = False) -> dict:
    """The run's ``summary()`` through its own, larger cache (small dicts); slots as ``simulate_cached``."""
    return _with_slot(lambda: _summary(scenario, bool(saturated)))


def clear() -> None:
    _simulate.clear()
    _summary.clear()


def capacity_scenario(scenario: Scenario) -> Scenario:
    """The same capacity run for every arrival rate: saturated runs put every request at t = 0,
    so the arrival process does not matter (lengths and classes have their own random streams)."""
    wl = scenario.workload
    if isinstance(wl, SyntheticWorkload):
        return replace(scenario, workload=replace(wl, arrivals=ArrivalProcess()))
    if isinstance(wl, TraceWorkload) and wl.max_duration_s is None:
        return replace(scenario, workload=replace(wl, speedup=1.0))
    return scenario


def capacity_summary(scenario: Scenario) -> dict:
    return summary_cached(capacity_scenario(scenario), True)


def compare_summaries(scenario: Scenario, policies: Mapping[str, BatchingPolicy]) -> dict[str, dict]:
    """``studies.compare.compare(...).summaries()`` for these policies, from cached runs, with progress."""
    tasks: list[tuple[str, Callable[[], dict]]] = []
    for name, pol in policies.items():
        sc = scenario.with_policy(pol)
        tasks.append((f"{name} at the offered load", lambda sc=sc: summary_cached(sc, False)))
        tasks.append((f"{name} capacity run", lambda sc=sc: capacity_summary(sc)))
    done = run_with_progress(tasks, "Simulating")
    return {name: with_capacity(done[2 * i], done[2 * i + 1]) for i, name in enumerate(policies)}


def run_with_progress(tasks: Sequence[tuple[str, Callable[[], T]]], text: str) -> list[T]:
    """Run tasks in order; a spinner appears after 0.5 s and a progress bar once it takes a while."""
    ensure_kernel()
    holder = st.empty()
    bar = None
    start = time.perf_counter()
    out: list[T] = []
    try:
        with st.spinner(f"{text}…", show_time=True):
            for i, (label, fn) in enumerate(tasks):
                if bar is None and time.perf_counter() - start > 0.25:
                    bar = holder.progress(0.0)
                if bar is not None:
                    bar.progress(i / len(tasks), text=f"{text}: {label} ({i + 1} of {len(tasks)})")
                out.append(fn())
    finally:
        holder.empty()
    return out


def ensure_kernel() -> None:
    """Load (or JIT-compile) the engine once per process, behind a spinner."""
    if _KERNEL["ready"]:
        return
    with st.spinner("Loading the simulation kernel (first run since the server started; compiling can take "
                    "a minute if its cache is cold)…", show_time=True):
        simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))
    _KERNEL["ready"] = True
