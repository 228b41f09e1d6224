"""The server's simulation slots: two lanes with a first-come queue each, and the stop of a page's work.

- **Lanes.** A run is *light* when its estimated cost (``run_cost``: requests simulated, a fleet's counted once per
  node's worth of replicas) is at most ``BATCHING_LIGHT_REQUESTS``; anything else, and every job of many runs
  (a sweep, a capacity search, a deployment search), is *heavy*. Heavy runs share the ``general`` slots
  (``BATCHING_MAX_CONCURRENT_SIMULATIONS``); light runs take a slot of their own lane (``light``, one by
  default) or a free general one that no heavy run is waiting for. So a light run never queues behind a heavy
  one, and light runs never starve heavy ones of the general slots.
- **Queue.** Within a lane, runs are served first come, first served, and a waiting run knows its place
  (``Slots.wait`` tells ``notify`` its position and the queue's length). A run may add extra general slots for
  its own thread pool (``take_extra``) only while nobody waits.
- **Stop.** Streamlit ends a page's script run (tab closed, rerun superseded) by raising StopException or
  RerunException at the script's next interrupt point. ``checkpoint`` is one, callable where nothing is drawn,
  and ``simulate`` calls it before every run (``sim.simulate.before_each_run``), so a job in the script thread
  stops at its next run, not at its end. A job's pool threads check its ``Job``, which the script thread
  stops on its way out (``Job.wrap``, ``StoppableBackend``), and ``as_completed`` waits for them with
  checkpoints. A heavy single run goes to a background thread (``in_background``) while the script thread waits
  with checkpoints, so a closed page ends at once; the run already inside the kernel (it cannot be interrupted)
  finishes in its slot and gives it back. No other run starts for a page that has gone.
- **Priority.** Threads that run heavy simulations (the background ones, a job's pool threads) run at nice
  ``HEAVY_NICE``: on an idle server at full speed, but page scripts, the server's event loop and light runs get
  the cores first.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

from batching.sim.engine import first_use
from batching.sim.simulate import Scenario, before_each_run

T = TypeVar("T")
POLL_S = 0.25  # how often a waiting script thread looks whether its page is still there
HEAVY_NICE = 10  # the CPU priority of heavy simulations' threads (nice; a light page's threads keep 0)


class ServerBusy(RuntimeError):
    """No simulation slot came free within the busy timeout; the message asks the user to try again."""


class RunStopped(BaseException):
    """Raised in a job's pool thread once the page that started the job has gone. A BaseException, like
    Streamlit's own StopException, so that no ``except Exception`` on the way (a task's error handling, a retry)
    mistakes it for a failure of the work."""


def run_cost(scenario: Scenario) -> int:
    """A run's estimated cost, in requests: its requests, counted once per 8 replicas (a node at TP 1) of a fleet,
    whose kernel work grows with its replicas (2,000 chat requests: 0.04 s on one replica, 0.17 s on 8, 1.0 s on
    64 behind least-outstanding). A trace that cannot be read counts as heavy (the run itself says why)."""
    try:
        n = int(scenario.workload.num_requests)
        replicas = int(scenario.replicas)
    except (ValueError, OSError):
        return 2**62
    return n * max(1, -(-replicas // 8))


@dataclass(eq=False)
class _Ticket:
    light: bool
    since: float = field(default_factory=time.monotonic)


class Lease:
    """One slot taken: ``release`` gives it back (once; from any thread, e.g. the one that ran the simulation)."""

    __slots__ = ("slots", "pool", "_held")

    def __init__(self, slots: "Slots", pool: str) -> None:
        self.slots, self.pool, self._held = slots, pool, True

    def release(self) -> None:
        with self.slots._cond:
            if not self._held:
                return
            self._held = False
            self.slots._used[self.pool] -= 1
            self.slots._cond.notify_all()


class Slots:
    """``general`` slots for any run and ``light`` more for light runs only, each lane with its FIFO queue.

    A thread holds slots as a stack (``try_take``/``take_extra`` push, ``release`` pops); a slot granted after
    waiting is reserved for the thread (``wait``) until its next ``lease``/``try_take`` takes it or
    ``drop_reservation`` gives it back."""

    def __init__(self, general: int, light: int) -> None:
        self.general, self.light = int(general), int(light)
        self._cond = threading.Condition()
        self._used = {"general": 0, "light": 0}
        self._queue: list[_Ticket] = []
        self._local = threading.local()  # .leases: the slots this thread holds; .reserved: one granted to it

    # ------------------------------------------------------------ reading

    @property
    def running(self) -> int:
        """Simulations holding a slot now (both lanes)."""
        with self._cond:
            return self._used["general"] + self._used["light"]

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    def held_here(self) -> bool:
        """Whether this thread holds a slot (a run may take extra ones, e.g. a parallel sweep)."""
        return bool(getattr(self._local, "leases", None))

    # ------------------------------------------------------------ taking and giving back

    def _pool(self, light: bool, ticket: _Ticket | None) -> str | None:
        """The pool a run of this lane may take a slot of now, or None. ``ticket``: a waiting run, which may go
        when it is the first of its lane; None: a new run, which may go when none of its lane waits."""
        first = next((t for t in self._queue if t.light == light), None)
        if first is not ticket:
            return None
        if light and self._used["light"] < self.light:
            return "light"
        heavy_waits = any(not t.light for t in self._queue)
        if self._used["general"] < self.general and (not light or not heavy_waits):
            return "general"
        return None

    def _grant(self, pool: str) -> Lease:
        self._used[pool] += 1
        return Lease(self, pool)

    def _stack(self) -> list[Lease]:
        leases = getattr(self._local, "leases", None)
        if leases is None:
            leases = self._local.leases = []
        return leases

    def lease(self, light: bool = False) -> Lease | None:
        """The slot reserved for this thread, else one taken without waiting (if one of the run's lane is free and
        nobody of its lane waits for it), else None. Not counted by ``held_here``."""
        reserved = getattr(self._local, "reserved", None)
        if reserved is not None:
            self._local.reserved = None
            return reserved
        with self._cond:
            pool = self._pool(light, None)
            return None if pool is None else self._grant(pool)

    @contextmanager
    def holding(self, lease: Lease) -> Iterator[None]:
        """``held_here`` while the block runs (a nested cached call then runs in this slot)."""
        stack = self._stack()
        stack.append(lease)
        try:
            yield
        finally:
            stack.remove(lease)

    def try_take(self, light: bool = False) -> bool:
        """``lease`` for this thread (``release`` gives it back)."""
        lease = self.lease(light)
        if lease is None:
            return False
        self._stack().append(lease)
        return True

    def take_extra(self) -> bool:
        """One more general slot for a run that holds one (its pool's width), only while nobody waits."""
        with self._cond:
            if self._queue or self._used["general"] >= self.general:
                return False
            lease = self._grant("general")
        self._stack().append(lease)
        return True

    def release(self) -> None:
        """Give back the slot reserved for this thread, else the one it took last."""
        if getattr(self._local, "reserved", None) is not None:
            self.drop_reservation()
            return
        leases = getattr(self._local, "leases", None)
        if not leases:
            raise RuntimeError("release() without a slot held by this thread")
        leases.pop().release()

    def drop_reservation(self) -> None:
        """Give back the slot ``wait`` reserved for this thread, if nothing took it (a cache hit needed none)."""
        reserved = getattr(self._local, "reserved", None)
        if reserved is not None:
            self._local.reserved = None
            reserved.release()

    def position(self, ticket: _Ticket) -> tuple[int, int]:
        """(place of ``ticket`` in its lane's queue, from 1; runs queued in that lane)."""
        lane = [t for t in self._queue if t.light == ticket.light]
        return lane.index(ticket) + 1, len(lane)

    def wait(self, notify: Callable[[int, int, int, float], None], timeout_s: float, light: bool = False,
             poll_s: float = 0.5) -> None:
        """Reserve a slot for this thread, first come first served in the run's lane, calling ``notify(running,
        position, queued, waited_s)`` while it waits (at least every ``poll_s``; where the page is drawn, each
        call is also an interrupt point: a closed page leaves the queue there). ServerBusy after ``timeout_s``."""
        ticket = _Ticket(bool(light))
        with self._cond:
            pool = self._pool(ticket.light, None)
            if pool is not None:
                self._local.reserved = self._grant(pool)
                return
            self._queue.append(ticket)
        try:
            while True:
                with self._cond:
                    pool = self._pool(ticket.light, ticket)
                    if pool is not None:
                        self._queue.remove(ticket)
                        self._local.reserved = self._grant(pool)
                        self._cond.notify_all()  # the next of the lane may go too
                        return
                    running = self._used["general"] + self._used["light"]
                    pos, queued = self.position(ticket)
                waited = time.monotonic() - ticket.since
                if waited >= timeout_s:
                    raise ServerBusy(
                        f"The server is busy: {running} other simulation{'s' if running != 1 else ''} kept every "
                        f"slot for {timeout_s:.0f} s. Nothing is wrong with your scenario; please try again in a "
                        "minute.")
                notify(running, pos, queued, waited)
                with self._cond:
                    if self._pool(ticket.light, ticket) is None:
                        self._cond.wait(min(poll_s, max(0.01, timeout_s - waited)))
        finally:
            with self._cond:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                    self._cond.notify_all()


# ---------------------------------------------------------------- the stop of a page's work


def checkpoint() -> None:
    """An interrupt point of the page's script run, drawing nothing: raises Streamlit's StopException or
    RerunException when the page has gone or a new run superseded this one. Elsewhere (a pool thread, a
    download's worker, the CLI) it does nothing."""
    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is not None:
        ctx.yield_check()


def checked(fn: Callable[[], object]):
    """``fn()`` with a ``checkpoint`` before each simulation it starts in this thread."""
    with before_each_run(checkpoint):
        return fn()


def lower_priority() -> None:
    """This thread at nice ``HEAVY_NICE`` (Linux gives each thread its own): heavy simulations run at full speed on
    an idle server but leave the cores to the page scripts and light runs when those need them. A thread cannot
    raise its priority again without privileges, so only threads that do heavy work call it. Elsewhere a no-op."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < HEAVY_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, HEAVY_NICE)
    except (AttributeError, OSError):
        pass


_BACKGROUND: dict[str, ThreadPoolExecutor] = {}
_BACKGROUND_LOCK = threading.Lock()


def _background_pool(width: int) -> ThreadPoolExecutor:
    with _BACKGROUND_LOCK:
        if "pool" not in _BACKGROUND:  # a few threads, reused: each run in flight holds a general slot
            _BACKGROUND["pool"] = ThreadPoolExecutor(max_workers=width, initializer=lower_priority,
                                                     thread_name_prefix="heavy-run")
        return _BACKGROUND["pool"]


def in_background(fn: Callable[[], T], lease: Lease) -> T:
    """``fn()`` (which draws nothing: a heavy run) in a low-priority thread (``lower_priority``) that gives
    ``lease`` back when ``fn`` ends, while this thread waits with a ``checkpoint`` every ``POLL_S``. If this
    thread's page goes, it stops waiting at once and ``fn`` stops before its next simulation; a run already in
    the kernel finishes first, in its slot."""
    job = Job()
    listener = first_use.current_listener()  # a compile in the worker shows in this page (compile_notice)

    def work() -> T:
        try:
            with lease.slots.holding(lease), before_each_run(job.check), first_use.notices(listener):
                return fn()  # a nested cached call runs in this slot
        finally:
            lease.release()

    try:
        future = _background_pool(lease.slots.general + lease.slots.light + 1).submit(work)
    except BaseException:
        lease.release()
        raise
    try:
        while not wait_futures([future], timeout=POLL_S)[0]:
            checkpoint()
    except BaseException:
        job.stop()
        raise
    return future.result()


class Job:
    """The pool threads of one page's job (a sweep's points, a search's tasks): stopped together when the page's
    run ends. A stopped job's threads raise ``RunStopped`` before their next simulation."""

    def __init__(self) -> None:
        self._stopped = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()

    def check(self) -> None:
        if self._stopped.is_set():
            raise RunStopped

    def wrap(self, fn: Callable, heavy: bool = True) -> Callable:
        """``fn`` for a pool thread of this job: checked before each simulation it starts; ``heavy``: the thread
        at a lower priority (``lower_priority``; the job's pool threads end with the job)."""

        listener = first_use.current_listener()  # the page's progress box for a compile (compile_notice)

        def run(*args, **kwargs):
            if heavy:
                lower_priority()
            self.check()
            with before_each_run(self.check), first_use.notices(listener):
                return fn(*args, **kwargs)

        return run


def as_completed(futures: Iterable[Future], poll_s: float = POLL_S) -> Iterator[Future]:
    """``concurrent.futures.as_completed`` for the script thread: between results, a ``checkpoint`` every
    ``poll_s``, so a closed page does not wait for the next point to end before it stops."""
    pending = set(futures)
    while pending:
        done, pending = wait_futures(pending, timeout=poll_s, return_when=FIRST_COMPLETED)
        yield from done
        if not done:
            checkpoint()


class StoppableBackend:
    """A ``studies.backends`` backend for a page's search: its thread tasks run as one ``Job`` (stopped by
    ``close``, which the page calls on its way out, done or not), and its ``wait`` polls with checkpoints.
    Another backend's tasks (Ray's, on the cluster) are left to it; the page still stops waiting for them."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.job = Job()
        self.name, self.width = inner.name, inner.width

    def describe(self) -> str:
        return self.inner.describe()

    def submit(self, fn, payload):
        return self.inner.submit(self.job.wrap(fn) if self.inner.name == "threads" else fn, payload)

    def wait(self, handles: list):
        if all(isinstance(h, Future) for h in handles):
            while not wait_futures(handles, timeout=POLL_S, return_when=FIRST_COMPLETED)[0]:
                checkpoint()
        return self.inner.wait(handles)

    def close(self) -> None:
        self.job.stop()
        self.inner.close()
