"""Where many independent tasks run: one interface, two backends.

- ``local``: a process pool over this machine's cores (the engine's kernel is ``nogil``, but summarising a run is
  Python, so processes, not threads, use every core);
- ``ray``: Ray tasks (``ray.init(address)``, or a local Ray cluster when no address is given), for grids larger
  than one machine. Ray is imported only here, inside ``RayBackend``: without it installed everything else works
  and ``make_backend("ray")`` raises ``BackendUnavailable`` saying how to install it. Connecting to an address
  takes at most ``timeout_s`` (``RAY_TIMEOUT_S``): its port must accept a TCP connection and ``ray.init`` return
  by then, else ``BackendUnavailable`` names the address and what to check (Ray itself retries an unreachable GCS
  forever).

A pool's width is capped at the tasks it will run (``tasks``) and ``WORKERS_PER_CPU`` times the cores here, and its
processes start with its first task (a process pool started in a multi-threaded process also adds them one by one
as tasks need them; a forked one starts them together, as forking next to a running thread is unsafe).

A task is ``fn(payload) -> dict``: ``fn`` a module-level function (it is pickled by reference), ``payload`` anything
picklable, the result a plain dict. ``run_tasks`` keeps at most ``backend.width`` tasks in flight, retries a task
that failed on a worker (an exception, or the worker process dying) once, and then reports it as failed with its
label; it never waits on a task that cannot finish (a dead worker is an error, not a hang).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKENDS = ("local", "ray")
CLUSTER_REQUIREMENTS = "requirements-cluster.txt"
INSTALL_HINT = (f"Ray is not installed; install it with `python -m pip install -r {CLUSTER_REQUIREMENTS}` "
                "(from the project's folder), or use --backend local")
RETRIES = 1  # a task that fails on a worker runs once more, then is reported
WORKERS_PER_CPU = 4  # a local pool never has more processes than this per core here (64 took 3.3 GB: issue 22)
RAY_TIMEOUT_S = 10.0  # connecting to a Ray cluster at an address gives up after this long
RAY_TIMEOUT_LIMITS_S = (0.1, 3600.0)
RAY_CLIENT_PORT, RAY_GCS_PORT = 10001, 6379  # Ray's defaults: the Ray Client server (ray://) and the GCS
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # batching/
ROOT_DIR = PACKAGE_DIR.parent


class BackendUnavailable(ValueError):
    """The backend asked for cannot start here (Ray not installed, no cluster at the address); the message says
    what to do."""


@dataclass
class TaskFailure:
    """A task that failed on every try: its label (e.g. the configuration), the error and where it came from."""

    label: Any
    error: str
    tries: int
    detail: str = ""

    def to_dict(self) -> dict:
        return {"task": self.label, "error": self.error, "tries": self.tries}


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split())[:500]


def _call(fn: Callable[[Any], dict], payload: Any) -> dict:
    """What a worker runs: the task, whose result must be a dict (anything else is an error)."""
    out = fn(payload)
    if not isinstance(out, dict):
        raise TypeError(f"a task must return a dict, not {type(out).__name__}")
    return out


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_cap() -> int:
    """The most processes a local pool starts: ``WORKERS_PER_CPU`` per core here."""
    return WORKERS_PER_CPU * default_workers()


def pool_width(workers: int | None = None, tasks: int | None = None, cap: int | None = None) -> int:
    """Tasks at once: ``workers`` (default: the cores here), at most ``tasks`` (the tasks there are to run; None:
    unknown) and ``cap``; at least 1."""
    width = int(workers) if workers else default_workers()
    for limit in (tasks, cap):
        if limit is not None:
            width = min(width, int(limit))
    return max(1, width)


def _warm() -> None:
    """Pool initializer: load the compiled kernel once per worker (from the on-disk cache; inherited when forked)."""
    try:
        from batching.sim.simulate import Scenario, simulate
        from batching.sim.workload.requests import workload_preset

        simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))
    except Exception:  # a broken worker shows up as task failures, with their own messages
        pass


class LocalBackend:
    """A process pool over the machine's cores. Forked workers inherit the loaded kernel when this process has a
    single thread (the CLI); a multi-threaded one (the dashboard's server) starts them fresh (``spawn``), as
    forking a process with other threads running is unsafe."""

    name = "local"

    def __init__(self, workers: int | None = None, start_method: str | None = None, tasks: int | None = None):
        self.width = pool_width(workers, tasks, worker_cap())
        if start_method is None:
            start_method = "fork" if (sys.platform.startswith("linux") and threading.active_count() == 1) else "spawn"
        self.start_method = start_method
        self._pool = None

    def describe(self) -> str:
        return f"local process pool, {self.width} worker{'s' if self.width != 1 else ''}"

    def _executor(self):
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(max_workers=self.width, mp_context=mp.get_context(self.start_method),
                                             initializer=_warm)
        return self._pool

    def submit(self, fn, payload):
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self._executor().submit(_call, fn, payload)
        except BrokenProcessPool:  # a worker died earlier: a new pool for what comes next
            self._reset()
            return self._executor().submit(_call, fn, payload)

    def wait(self, handles: list) -> list[tuple[Any, dict | None, BaseException | None]]:
        """Block until at least one handle is done; (handle, result, error) for each one done."""
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as wait_futures
        from concurrent.futures.process import BrokenProcessPool

        done, _ = wait_futures(handles, return_when=FIRST_COMPLETED)
        out = []
        broken = False
        for h in done:
            try:
                out.append((h, h.result(), None))
            except BrokenProcessPool as exc:
                broken = True
                out.append((h, None, RuntimeError(f"the worker process died ({exc})")))
            except Exception as exc:  # noqa: BLE001 - any failure on the worker is reported, never raised here
                out.append((h, None, exc))
        if broken:
            self._reset()
        return out

    def _reset(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class ThreadBackend(LocalBackend):
    """A thread pool in this process: no worker start-up (the kernel is already loaded and releases the GIL while
    it runs), for the dashboard's server, whose simulation slots bound it. Summarising a run holds the GIL, so it
    gains less than processes do."""

    name = "threads"

    def __init__(self, workers: int | None = None, tasks: int | None = None):
        super().__init__(workers, start_method="thread", tasks=tasks)

    def describe(self) -> str:
        return f"{self.width} thread{'s' if self.width != 1 else ''} in this process"

    def _executor(self):
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=self.width)
        return self._pool


class _Done:
    """A task the inline backend already ran (hashable, by identity)."""

    __slots__ = ("result", "error")

    def __init__(self, result, error):
        self.result, self.error = result, error


class InlineBackend:
    """Runs each task in this process when submitted: one after another, for comparison and for tests."""

    name = "inline"
    width = 1

    def describe(self) -> str:
        return "one after another in this process"

    def submit(self, fn, payload):
        try:
            return _Done(_call(fn, payload), None)
        except Exception as exc:  # noqa: BLE001
            return _Done(None, exc)

    def wait(self, handles: list):
        h = handles[0]
        return [(h, h.result, h.error)]

    def close(self) -> None:
        pass


def ray_endpoint(address: str | None) -> tuple[str, int] | None:
    """The (host, port) a Ray address connects to: ``ray://host[:port]`` the Ray Client server (port 10001 by
    default), ``host:port`` the head node's GCS; None when Ray finds the cluster itself (``auto``, ``local``, no
    address) or the address is not one of these forms (``ray.init`` then says what is wrong with it)."""
    text = (address or "").strip()
    if not text or text in ("auto", "local"):
        return None
    default = None
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "ray":
            return None
        default = RAY_CLIENT_PORT
    text = text.split("/", 1)[0]
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" not in text:
        host, port_text = text, ""
    else:
        return None  # a bare IPv6 address: Ray's own parser decides
    if not port_text:
        return (host, default) if host and default else None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
        return None
    return host, int(port_text)


def _what_to_check(address: str, version: str) -> str:
    client = address.strip().startswith("ray://")
    port = (f"the Ray Client server's port ({RAY_CLIENT_PORT} unless the head was started with another "
            "--ray-client-server-port)" if client else
            f"the head node's GCS port ({RAY_GCS_PORT} unless started with another --port)")
    return (f"check that a Ray {version} head node runs at that address (ray start --head) and that {port} is "
            "reachable from this machine")


# the thread of a connection that gave up waiting while ray.init still ran (Ray retries a GCS forever): a new
# connection waits for it to end, so two ray.init never run at once in this process
_CONNECTING: list[threading.Thread] = []
_CONNECT_LOCK = threading.Lock()


def _not_the_sigterm_notice(record) -> bool:
    """ray.init's notice when it runs outside the main thread, as ``connect_ray`` means it to."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


def connect_ray(ray, address: str, timeout_s: float = RAY_TIMEOUT_S, **init_kwargs) -> None:
    """``ray.init(address, **init_kwargs)`` within ``timeout_s``: the address's port must accept a TCP connection
    (``ray_endpoint``), then ``ray.init`` must return; else ``BackendUnavailable`` naming the address, why and what
    to check. Both run in a daemon thread, as Ray's connection to a GCS retries forever: one still inside
    ``ray.init`` at the deadline is left to end on its own (a connection made that late is shut down again) and
    never keeps the process alive."""
    timeout_s = float(timeout_s)
    where = f"the Ray cluster at {address!r}"
    with _CONNECT_LOCK:
        if any(t.is_alive() for t in _CONNECTING):
            raise BackendUnavailable(f"cannot connect to {where}: an earlier connection attempt to Ray has not "
                                     f"ended; {_what_to_check(address, ray.__version__)}")
        _CONNECTING.clear()
    worker_log = logging.getLogger("ray._private.worker")
    if _not_the_sigterm_notice not in worker_log.filters:
        worker_log.addFilter(_not_the_sigterm_notice)
    box: dict[str, Any] = {"stage": "probe"}
    gave_up = threading.Event()
    deadline = time.monotonic() + timeout_s

    def attempt() -> None:
        try:
            endpoint = ray_endpoint(address)
            if endpoint is not None:
                with socket.create_connection(endpoint, timeout=max(0.05, deadline - time.monotonic())):
                    pass
            with _CONNECT_LOCK:
                if gave_up.is_set():  # the probe answered after the deadline: too late to connect
                    return
                box["stage"] = "init"
            ray.init(address=address, **init_kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller, with the address
            box["error"] = exc
            return
        with _CONNECT_LOCK:
            box["done"] = True
            late = gave_up.is_set()
        if late:
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001
                pass

    thread = threading.Thread(target=attempt, name="ray-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with _CONNECT_LOCK:
        if box.get("done"):
            return
        if thread.is_alive():
            gave_up.set()
            if box["stage"] == "init":
                _CONNECTING.append(thread)
    err = box.get("error")
    if err is not None and "ray[client]" in str(err):  # ray:// without the client extra: an install problem
        raise BackendUnavailable(f"cannot connect to {where}: Ray Client needs the client extra; "
                                 f"{INSTALL_HINT.split('; ', 1)[1]}")
    if err is None:
        why = (f"no answer within {timeout_s:g} s" if box["stage"] == "probe" else
               f"the port accepts connections but Ray did not connect within {timeout_s:g} s")
    elif isinstance(err, TimeoutError):
        why = f"no answer within {timeout_s:g} s"
    elif isinstance(err, OSError) and err.strerror:
        why = err.strerror  # Connection refused, Name or service not known, No route to host...
    else:
        why = _error_text(err)
    raise BackendUnavailable(f"cannot connect to {where}: {why}; {_what_to_check(address, ray.__version__)}")


class NothingToRun(InlineBackend):
    """Where a search with no task to run "runs": nothing is started."""

    name = "none"

    def describe(self) -> str:
        return "nothing run: no configuration fits"


class RayBackend:
    """Ray tasks: ``ray.init(address)`` joins a running cluster (the package is shipped to its workers; the
    connection gives up after ``timeout_s``, see ``connect_ray``); without an address a local Ray cluster starts on
    this machine. Ray's own retries are off: ``run_tasks`` retries once."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, tasks: int | None = None,
                 timeout_s: float = RAY_TIMEOUT_S):
        try:
            import ray
        except ImportError:
            raise BackendUnavailable(INSTALL_HINT) from None
        self._ray = ray
        self.address = address or None
        self._started_here = False
        if not ray.is_initialized():
            if self.address and self.address.strip() != "local":
                env = {"py_modules": [str(PACKAGE_DIR)], "excludes": ["__pycache__", "*.pyc"]}
                connect_ray(ray, self.address, timeout_s, runtime_env=env, log_to_driver=False,
                            configure_logging=False)
            else:
                env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT_DIR), os.environ.get("PYTHONPATH", "")) if p)}}
                kwargs = {"num_cpus": int(workers or default_workers()), "runtime_env": env,
                          "include_dashboard": False}
                if self.address:
                    kwargs["address"] = self.address
                try:
                    ray.init(log_to_driver=False, configure_logging=False, **kwargs)
                except Exception as exc:  # noqa: BLE001
                    raise BackendUnavailable(f"Ray could not start on this machine: {_error_text(exc)}") from None
            self._started_here = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.width = pool_width(workers or cpus, tasks)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_call)

    def describe(self) -> str:
        where = self.address or "a local Ray cluster"
        return f"Ray ({where}), {self.width} task{'s' if self.width != 1 else ''} at once"

    def submit(self, fn, payload):
        return self._remote.remote(fn, payload)

    def wait(self, handles: list):
        ray = self._ray
        ready, _ = ray.wait(list(handles), num_returns=1)
        out = []
        for ref in ready:
            try:
                out.append((ref, ray.get(ref), None))
            except Exception as exc:  # noqa: BLE001 - RayTaskError, WorkerCrashedError...
                cause = getattr(exc, "cause", None)
                out.append((ref, None, cause if isinstance(cause, BaseException) else exc))
        return out

    def close(self) -> None:
        if self._started_here and self._ray.is_initialized():
            self._ray.shutdown()


def make_backend(name: str = "local", address: str | None = None, workers: int | None = None,
                 tasks: int | None = None, timeout_s: float = RAY_TIMEOUT_S):
    """The backend by name: ``local``, ``ray`` (BackendUnavailable when Ray is missing or the cluster at ``address``
    does not answer within ``timeout_s``) or ``inline``. ``workers``: tasks at once (default: the cores here, or
    the Ray cluster's CPUs), at most ``tasks`` (how many there are to run, when known) and, for a local pool,
    ``worker_cap()``."""
    if name == "local":
        return LocalBackend(workers, tasks=tasks)
    if name == "ray":
        return RayBackend(address, workers, tasks=tasks, timeout_s=timeout_s)
    if name == "inline":
        return InlineBackend()
    if name == "threads":
        return ThreadBackend(workers, tasks=tasks)
    raise ValueError(f"backend={name!r} is not allowed; allowed: {', '.join(BACKENDS)}")


@dataclass
class _Slot:
    key: Any
    label: Any
    fn: Callable
    payload: Any
    tries: int = 0


@dataclass
class TaskRun:
    """The tasks a run finished: ``results`` (key -> dict) and ``failures`` (key -> TaskFailure)."""

    results: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)


def run_tasks(backend, next_task: Callable[[], tuple[Any, Any, Callable, Any] | None],
              on_result: Callable[[Any, dict], None] | None = None,
              on_failure: Callable[[Any, TaskFailure], None] | None = None,
              retries: int = RETRIES) -> TaskRun:
    """Run tasks on ``backend``, at most ``backend.width`` at once. ``next_task()`` gives the next (key, label, fn,
    payload), or None when there is nothing more to start *now*; it is called again after each result, so a
    caller can decide what to run (or skip) from what came back. A task that raises or whose worker dies is run
    again up to ``retries`` times, then reported (``on_failure``, and in ``TaskRun.failures``) with its label."""
    run = TaskRun()
    flight: dict = {}  # handle -> _Slot
    exhausted = False

    def fill() -> None:
        nonlocal exhausted
        while not exhausted and len(flight) < backend.width:
            task = next_task()
            if task is None:
                exhausted = not flight  # nothing running and nothing to start: done
                return
            key, label, fn, payload = task
            slot = _Slot(key, label, fn, payload)
            slot.tries = 1
            flight[backend.submit(fn, payload)] = slot

    fill()
    while flight:
        for handle, result, error in backend.wait(list(flight)):
            slot = flight.pop(handle)
            if error is None:
                run.results[slot.key] = result
                if on_result is not None:
                    on_result(slot.key, result)
            elif slot.tries <= retries:
                slot.tries += 1
                flight[backend.submit(slot.fn, slot.payload)] = slot
            else:
                detail = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-2000:]
                failure = TaskFailure(slot.label, _error_text(error), slot.tries, detail)
                run.failures[slot.key] = failure
                if on_failure is not None:
                    on_failure(slot.key, failure)
        exhausted = False
        fill()
    return run


def map_tasks(backend, fn: Callable[[Any], dict], payloads: dict, retries: int = RETRIES,
              on_result: Callable[[Any, dict], None] | None = None) -> TaskRun:
    """``fn(payload)`` for every (key -> payload) of ``payloads``, the key as the label."""
    todo: Iterator = iter(payloads.items())

    def nxt():
        for key, payload in todo:
            return key, key, fn, payload
        return None

    return run_tasks(backend, nxt, on_result=on_result, retries=retries)
