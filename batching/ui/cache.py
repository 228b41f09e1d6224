"""Cached, bounded simulation calls, keyed on the frozen scenario (the same inputs never simulate twice).

Results live in one process-wide store bounded by bytes (``BATCHING_CACHE_MB``), least recently used first out.
A hit hands out a copy-on-write view of the stored result (pandas 3: the frames share the stored data until
someone writes to them), so a hit costs no memory and no unpickling, and no caller can change what the next one
gets. Pages keep scenarios, not results, between reruns; what a session holds is a view while its script runs.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import fields, replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import streamlit as st

from batching.studies import disagg_capacity
from batching.studies.compare import with_capacity
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario, SimResult, simulate
from batching.sim.workload.requests import ArrivalProcess, SyntheticWorkload, TraceWorkload, workload_preset
from batching.ui import compile_notice, slots
from batching.ui.slots import ServerBusy  # noqa: F401 - pages and widgets read it here

T = TypeVar("T")

# hosted mode (deploy/ sets these): at most this many simulations at once in the process (each holds a core and
# ~2.8 times the memory of the result it makes, see the ceiling below), the bytes of simulation results kept (a
# 20,000-request result takes 5 to 75 MiB on a busy node, up to ~760 MiB when every request runs alone), and how
# long a run waits for a free slot before it gives up with a "try again" message
MAX_CONCURRENT = max(1, int(os.environ.get("BATCHING_MAX_CONCURRENT_SIMULATIONS", "2")))
# the light lane (batching/ui/slots.py): this many more slots, for runs of at most LIGHT_REQUESTS requests only
# (slots.run_cost; the sidebar's default is 2,000), so a small run never queues behind large ones; 0: one lane
LIGHT_SLOTS = max(0, int(os.environ.get("BATCHING_LIGHT_SIMULATIONS", "1")))
LIGHT_REQUESTS = max(1, int(os.environ.get("BATCHING_LIGHT_REQUESTS", "2000")))
CACHE_MB = max(16.0, float(os.environ.get("BATCHING_CACHE_MB", "1024")))
CACHE_BYTES = int(CACHE_MB * 2**20)
SUMMARY_BYTES = max(4 * 2**20, CACHE_BYTES // 64)  # summaries (a few KiB each), in their own store
# entries of the small study caches kept in the summaries' store (sweep tables 4 x, capacity and deployment
# searches 2 x; kilobytes each), least recently used out first, within the store's bytes
CACHE_ENTRIES = max(1, int(os.environ.get("BATCHING_CACHE_ENTRIES", "24")))
BUSY_TIMEOUT_S = max(1.0, float(os.environ.get("BATCHING_BUSY_TIMEOUT_S", "60")))
BUSY_POLL_S = 0.5  # how often a waiting run refreshes its message (and is an interrupt point of its page)
_KERNEL = {"ready": False}

# The server's memory ceiling (README, "Hosting" > "Memory"; tests/load/test_load.py asserts it). Measured with
# tracemalloc and RSS on 20,000-request runs: a result takes 5 to 75 MiB on a busy node and up to ~760 MiB when
# every request runs alone (batch analysis at 0.05 req/s: 5.9 million steps), i.e. ~40 KiB per request at most; a
# simulation peaks at ~2.8 times the result it makes; a page drawing a result adds ~0.6 times it (binned charts)
# plus ~30 MiB (figures, their JSON, the messages)
BASE_MIB = 450  # Python, Streamlit, NumPy/pandas/Plotly, the compiled kernel, the small caches, allocator slack
RESULT_KIB_PER_REQUEST_MAX = 40
SIMULATION_PER_RESULT = 2.8
PAGE_RUN_MIB, PAGE_RUN_PER_RESULT = 30, 0.6


def largest_result_mib(max_requests: int) -> float:
    """The largest result a run of ``max_requests`` requests can make (every request alone in its steps)."""
    return RESULT_KIB_PER_REQUEST_MAX * max_requests / 1024


def memory_ceiling_mib(cache_mb: float, max_concurrent: int, page_runs: int, result_mib: float,
                       light_slots: int = LIGHT_SLOTS, light_requests: int = LIGHT_REQUESTS) -> float:
    """Most resident memory (MiB) the server needs: the stores (results + summaries), ``max_concurrent``
    simulations running and ``light_slots`` light ones (at most ``light_requests`` requests each), ``page_runs``
    pages being drawn at that moment (at most the sessions open), each run's result at most ``result_mib``
    (``largest_result_mib`` for any scenario). Uploaded traces come on top: up to twice the upload limit per
    session that holds one, ~20 times a file while it is parsed, and the parsed traces kept for reuse
    (workload.requests.TRACE_CACHE_BYTES, README "Hosting" > "Memory")."""
    light_mib = min(result_mib, largest_result_mib(light_requests))
    return (BASE_MIB + cache_mb * (1 + 1 / 64) + max_concurrent * SIMULATION_PER_RESULT * result_mib
            + light_slots * SIMULATION_PER_RESULT * light_mib
            + page_runs * (PAGE_RUN_MIB + PAGE_RUN_PER_RESULT * result_mib))


class _NoSlot(Exception):
    """Raised inside a cached function that would have to wait for a slot (never cached, never shown)."""


# The slots (batching/ui/slots.py). A cached function takes a slot only without waiting (``try_take``); when none is
# free it raises ``_NoSlot`` and the caller, outside the cached function, waits in its lane's queue with a message
# on screen and then calls again holding the slot. So messages never live inside a cached function and a cache hit
# never waits.
SLOTS = slots.Slots(MAX_CONCURRENT, LIGHT_SLOTS)


def is_light(cost: int) -> bool:
    """Whether work of this estimated cost (``slots.run_cost``, summed over its runs) takes the light lane."""
    return LIGHT_SLOTS > 0 and cost <= LIGHT_REQUESTS


def light_run(scenario: Scenario) -> bool:
    return is_light(slots.run_cost(scenario))


def _run_in_slot(fn: Callable[[], T], light: bool = False, background: bool = False) -> T:
    """Inside a cached function: run ``fn`` in a slot of its lane (the one ``_with_slot`` waited for, or one taken
    without waiting; none: ``_NoSlot``), or in the slot this thread holds already (a job's). The page's script
    thread stops at the next simulation once its page has gone (``slots.checkpoint``). ``background``: ``fn``
    draws nothing and runs in a low-priority thread while this one waits (``slots.in_background``): heavy runs
    leave the cores to pages and light runs, and a closed page stops waiting for them at once."""
    if SLOTS.held_here():
        return slots.checked(fn)
    lease = SLOTS.lease(light)
    if lease is None:
        raise _NoSlot
    if background:
        return slots.in_background(fn, lease)
    try:
        with SLOTS.holding(lease):
            return slots.checked(fn)
    finally:
        lease.release()


def _busy_message(running: int, position: int, queued: int, waited_s: float, light: bool = False) -> str:
    others = f"{running} other simulation{'s' if running != 1 else ''}"
    lane = "small runs" if light else "large runs"
    return (f"The server is busy with {others}: waiting for a simulation slot, position {position} of {queued} "
            f"in the queue for {lane} (waited {waited_s:.0f} s, giving up after {BUSY_TIMEOUT_S:.0f} s)")


def _with_slot(call: Callable[[], T], light: bool = False) -> T:
    """``call`` a cached function; if it needs a slot and none of its lane is free, wait in the lane's queue with
    a message giving the place in it, then call it again with the slot reserved for it. Raises ServerBusy (a
    RuntimeError) when no slot comes free in time; a closed page leaves the queue at the next refresh."""
    try:
        return call()
    except _NoSlot:
        pass
    holder = st.empty()
    shown = [""]

    def notify(running: int, pos: int, queued: int, waited: float) -> None:
        text = _busy_message(running, pos, queued, waited, light)
        if text != shown[0]:  # redrawn when it changes (about once a second), else only an interrupt point
            shown[0] = text
            holder.info(text, icon=":material/hourglass_top:")
        else:
            slots.checkpoint()

    try:
        SLOTS.wait(notify, BUSY_TIMEOUT_S, light, BUSY_POLL_S)
    finally:
        holder.empty()
    try:
        return call()
    finally:
        SLOTS.drop_reservation()  # unless the call took it (another session may have stored the result)


# public names of the slot discipline, for other cached studies (batching/ui/planning.py)
run_in_slot = _run_in_slot
with_slot = _with_slot


class ByteStore:
    """A thread-safe LRU map bounded by the bytes of its values (as ``put`` counts them), not their number.

    An entry larger than the whole budget is not kept. ``held_bytes`` never exceeds ``budget_bytes``.
    ``kind_limits``: at most this many entries of a kind (a key whose first item is that name, e.g. the
    ``("sweep", ...)`` tables), least recently used of the kind out first.
    """

    def __init__(self, budget_bytes: int, kind_limits: Mapping[str, int] | None = None) -> None:
        self.budget_bytes = int(budget_bytes)
        self.kind_limits = dict(kind_limits or {})
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._kinds: dict[str, OrderedDict[Hashable, None]] = {k: OrderedDict() for k in self.kind_limits}
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _kind(self, key: Hashable) -> OrderedDict | None:
        return self._kinds.get(key[0]) if isinstance(key, tuple) and key and isinstance(key[0], str) else None

    def _drop(self, key: Hashable) -> None:
        _, freed = self._entries.pop(key)
        self._held -= freed
        kind = self._kind(key)
        if kind is not None:
            kind.pop(key, None)

    def count(self, kind: str) -> int:
        """Entries of a limited kind held now."""
        with self._lock:
            return len(self._kinds.get(kind, ()))

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            self._entries.move_to_end(key)
            kind = self._kind(key)
            if kind is not None:
                kind.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        with self._lock:
            if key in self._entries:
                self._drop(key)
            if nbytes > self.budget_bytes:
                return
            while self._entries and self._held + nbytes > self.budget_bytes:
                self._drop(next(iter(self._entries)))
            kind = self._kind(key)
            if kind is not None:
                while len(kind) >= self.kind_limits[key[0]]:
                    self._drop(next(iter(kind)))
                kind[key] = None
            self._entries[key] = (value, nbytes)
            self._held += nbytes

    def resize(self, budget_bytes: int) -> None:
        """A new budget (tests); entries beyond it go, oldest first."""
        with self._lock:
            self.budget_bytes = int(budget_bytes)
            while self._entries and self._held > self.budget_bytes:
                self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            for kind in self._kinds.values():
                kind.clear()
            self._held = 0


class _KeyLocks:
    """One lock per key in use: the second session asking for a result being simulated waits for it instead of
    simulating it again. Locks are always taken summary before result, so they cannot deadlock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Hashable, list] = {}

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]


# the study answers pages keep in the summaries' store, at most CACHE_ENTRIES x this many of each kind
# (batching/ui/planning.py: sweep tables, capacity searches and a rate sweep's search; pages/find_a_deployment.py)
STUDY_KINDS = {"sweep": 4, "capacity": 2, "sweep_search": 2, "deployment_search": 2}
RESULTS = ByteStore(CACHE_BYTES)
SUMMARIES = ByteStore(SUMMARY_BYTES, {kind: times * CACHE_ENTRIES for kind, times in STUDY_KINDS.items()})
_KEYS = _KeyLocks()
_MISSING = object()

# a trace's digest, remembered for the bytes objects seen last (the key holds the object, so its id stays valid)
_DIGESTS: OrderedDict[int, tuple[bytes, str]] = OrderedDict()
_DIGEST_LOCK = threading.Lock()
_DIGEST_KEEP = 4


def _digest(data: bytes) -> str:
    with _DIGEST_LOCK:
        hit = _DIGESTS.get(id(data))
        if hit is not None and hit[0] is data:
            _DIGESTS.move_to_end(id(data))
            return hit[1]
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    with _DIGEST_LOCK:
        _DIGESTS[id(data)] = (data, digest)
        while len(_DIGESTS) > _DIGEST_KEEP:  # these bytes are also held by the sessions that uploaded them
            _DIGESTS.popitem(last=False)
    return digest


def _token(value):
    """A hashable stand-in for a field: a trace's bytes become a digest (computed once per bytes object)."""
    if isinstance(value, TraceWorkload):
        return ("TraceWorkload",) + tuple(
            (f.name, _digest(value.data) if f.name == "data" else getattr(value, f.name)) for f in fields(value))
    return value


def scenario_token(scenario: Scenario) -> tuple:
    """What a scenario is, field by field, without hashing a trace's bytes on every call."""
    return tuple((f.name, _token(getattr(scenario, f.name))) for f in fields(scenario))


def _frame_bytes(df: pd.DataFrame) -> int:
    return int(df.memory_usage(index=True, deep=True).sum())


def result_bytes(result: SimResult) -> int:
    """The memory a stored result holds: its frames (object columns included), histogram, and a trace's bytes."""
    wl = result.scenario.workload
    trace = len(wl.data) if isinstance(wl, TraceWorkload) else 0
    return (_frame_bytes(result.requests) + _frame_bytes(result.steps) + result.itl_hist.nbytes
            + result.itl_edges.nbytes + trace + 4096)


def _frozen(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _view(result: SimResult) -> SimResult:
    """A copy-on-write view: new frame objects over the stored data (pandas copies a block only when written),
    read-only arrays, and the stored summary (``summary()`` hands out copies of it)."""
    view = replace(result, requests=result.requests.copy(deep=False), steps=result.steps.copy(deep=False),
                   itl_hist=_frozen(result.itl_hist), itl_edges=_frozen(result.itl_edges))
    view.__dict__["_summary"] = result._summary  # computed once, when stored
    return view


def _cached(store: ByteStore, key: Hashable, compute: Callable[[], T], size: Callable[[T], int],
            in_slot: bool = True, light: bool = False) -> T:
    """``store[key]``, or ``compute()`` stored with ``size(value)`` bytes; ``in_slot``: computed in a simulation
    slot of the light lane or not (``_run_in_slot`` raises ``_NoSlot`` when none is free, which leaves the key's
    lock)."""
    hit = store.get(key, _MISSING)
    if hit is not _MISSING:
        return hit
    with _KEYS.hold(key):
        hit = store.get(key, _MISSING)  # another session may have simulated it while this one waited
        if hit is not _MISSING:
            return hit
        value = _run_in_slot(compute, light=light, background=not light) if in_slot else compute()
        store.put(key, value, size(value))
        return value


def _simulate(scenario: Scenario, saturated: bool) -> SimResult:
    def run() -> SimResult:
        result = simulate(scenario, saturated=saturated)
        result.summary()  # computed once here, shared by every view
        return result

    return _view(_cached(RESULTS, ("result", scenario_token(scenario), saturated), run, result_bytes,
                         light=light_run(scenario)))


def _summary(scenario: Scenario, saturated: bool) -> dict:
    stored = _cached(SUMMARIES, ("summary", scenario_token(scenario), saturated),
                     lambda: _simulate(scenario, saturated).summary(), lambda s: len(repr(s)) + 4096,
                     in_slot=False)  # a stored result needs no slot; a simulation takes its own
    return deepcopy(stored)


def simulate_cached(scenario: Scenario, saturated: bool = False) -> SimResult:
    """``simulate`` through the bounded store: a copy-on-write view of the stored result.

    At most MAX_CONCURRENT simulations run at once in the process, and LIGHT_SLOTS more light ones; a run that
    finds every slot of its lane taken shows "The server is busy… position P of Q" while it waits and raises
    ServerBusy after BUSY_TIMEOUT_S.
    """
    return _with_slot(lambda: _simulate(scenario, bool(saturated)), light_run(scenario))


def summary_cached(scenario: Scenario, saturated: bool = False) -> dict:
    """The run's ``summary()`` through its own store (small dicts); slots as ``simulate_cached``."""
    return _with_slot(lambda: _summary(scenario, bool(saturated)), light_run(scenario))


def result_for_download(scenario: Scenario, saturated: bool = False) -> SimResult:
    """``simulate_cached`` for a download button's deferred callable, which runs outside the page's script (no
    messages can be drawn there): waits for a slot silently, ServerBusy after BUSY_TIMEOUT_S."""
    try:
        return _simulate(scenario, bool(saturated))
    except _NoSlot:
        pass
    SLOTS.wait(lambda *_: None, BUSY_TIMEOUT_S, light_run(scenario), BUSY_POLL_S)
    try:
        return _simulate(scenario, bool(saturated))
    finally:
        SLOTS.drop_reservation()


class Reading:
    """A run reduced to what the planning studies read (``studies.capacity.slo_reading``, the sweeps' rows): its
    summary and, per request, the class, arrival, release and latencies. ~41 bytes a request instead of the
    whole result, so the runs of a capacity search stay cached and another SLO re-reads them."""

    __slots__ = ("scenario", "class_names", "requests", "saturated", "_summary", "_nbytes")

    def __init__(self, result: SimResult) -> None:
        self.scenario, self.class_names, self.saturated = result.scenario, tuple(result.class_names), result.saturated
        req = result.requests
        # copies: a view would keep the whole result's column block alive, beyond the bytes counted
        cols = {c: req[c].to_numpy(copy=True) for c in READING_COLUMNS if c in req}
        if "priority" in cols and len(cols["priority"]) and cols["priority"].max() < 128:
            cols["priority"] = cols["priority"].astype(np.int8)
        self.requests = pd.DataFrame(cols, copy=False)
        # numeric columns: their arrays (what the frame's deep memory_usage says, without its 1.3 ms a run)
        self._nbytes = sum(v.nbytes for v in cols.values()) + int(self.requests.index.memory_usage())
        self._summary = result.summary()

    def summary(self) -> dict:
        return deepcopy(self._summary)

    @property
    def nbytes(self) -> int:
        return self._nbytes + len(repr(self._summary)) + 1024


READING_COLUMNS = ("priority", "arrival_s", "release_s", "ttft_s", "tpot_s", "e2e_s")


def _read(scenario: Scenario, token, saturated: bool, key: tuple, steps: bool = True) -> Reading:
    """The ``Reading`` stored under ``key``, or one made from a stored whole result or a run (``steps``: with its
    step table), without taking a slot."""

    def run() -> Reading:
        full = RESULTS.get(("result", token, saturated))
        return Reading(full if full is not None else simulate(scenario, saturated=saturated, steps=steps))

    return _cached(RESULTS, key, run, lambda r: r.nbytes, in_slot=False)


def reading(scenario: Scenario, saturated: bool = False) -> Reading:
    """The run's ``Reading``, kept beside the results (same byte budget; a whole stored result serves it
    too). Simulates without taking a slot: for code that already holds one (``batching.ui.planning``'s pool). A
    saturated run is read as ``capacity_scenario``'s (one run for every arrival rate: a Tune move of the request
    rate re-runs each value's offered load, not its capacity run)."""
    saturated = bool(saturated)
    if saturated:
        scenario = capacity_scenario(scenario)
    token = scenario_token(scenario)
    return _read(scenario, token, saturated, ("reading", token, saturated))


def probe_reading(scenario: Scenario) -> Reading:
    """A capacity search's run at one rate (unsaturated): the stored ``reading`` when there is one, else a run
    without its step table (``simulate(steps=False)``: its summary has latencies and the queue, what the search
    reads, and no node figures), kept under its own key so a page's reading of the same run is never the lean
    one. Simulates without taking a slot, as ``reading``."""
    token = scenario_token(scenario)
    hit = RESULTS.get(("reading", token, False), _MISSING)
    return hit if hit is not _MISSING else _read(scenario, token, False, ("probe", token), steps=False)


def small_cached(key: Hashable, compute: Callable[[], T], nbytes: int = 4096) -> T:
    """``compute()`` kept in the summaries' store under ``key`` (a small value: a sweep's row, a search's
    answer); no slot is taken (the caller holds one). Hand out copies of mutable values."""
    return _cached(SUMMARIES, key, compute, lambda _: nbytes, in_slot=False)


def peek(key: Hashable) -> Any:
    """What ``small_cached`` keeps under ``key``, or None; touches nothing else."""
    return SUMMARIES.get(key)


def clear() -> None:
    RESULTS.clear()
    SUMMARIES.clear()


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


def runnable_policies(scenario: Scenario, policies: Mapping[str, BatchingPolicy]) -> dict[str, BatchingPolicy]:
    """The policies that can run on this scenario, in their order. On a disaggregated scenario
    (``scenario.disagg``) static and dynamic batching cannot: they are left out and one
    caption says which and why (``studies.disagg_capacity.skipped_text``), never an error for the page."""
    keep, skipped = disagg_capacity.runnable(scenario, policies)
    if skipped:
        st.caption(disagg_capacity.skipped_text(skipped))
    return keep


def compare_summaries(scenario: Scenario, policies: Mapping[str, BatchingPolicy]) -> dict[str, dict]:
    """``studies.compare.compare(...).summaries()`` for these policies, from cached runs, with progress. A policy
    a disaggregated scenario cannot run is left out (pages say so with ``runnable_policies``)."""
    policies = disagg_capacity.runnable(scenario, policies)[0]
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
    # a compile (an empty kernel cache) shows compile_notice's progress box; loading from the cache takes ~1 s
    with st.spinner("Starting the simulator (first run since the server started)…", show_time=True):
        simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))
    _KERNEL["ready"] = True
    compile_notice.start_background()  # every other feature's kernels, at the lowest CPU priority
