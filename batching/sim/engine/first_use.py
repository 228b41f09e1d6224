"""A kernel variant's first use: knowing it will compile, saying so, and sharing one compile between processes.

Numba compiles one version of the engine per combination of argument types: the prefix cache off, by block id or
by trace hash; session turns off or on; speculative decoding off or on; one engine, a fleet behind a router, or a
prefill/decode split. Each is compiled once per install, on its first use, and cached on disk (kernel_cache). This
module names the variant of a call (``variant``) and keeps one marker file per variant in the kernel cache directory:
``ready-<key>`` once its compile is on disk, ``compiling-<key>`` (holding the pid) while a process compiles it.

``first_use(v)`` wraps an engine call: when the variant is not ready it tells whoever listens (``notices``: the
CLI's one line on stderr, the dashboard's progress box), waits for another live process already compiling it
(``batching prepare``, the dashboard's background compile) instead of compiling it a second time, and marks it ready
afterwards. A deleted cache directory takes its markers with it.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batching.sim.engine import kernel_cache

WAIT_POLL_S = 0.25
# a compile of the largest variant took 3 minutes at most on 2 cores shared with three other compiling processes; a
# marker older than this is left over (its process died and its pid was reused), so nobody waits on it
STALE_S = 900.0


@dataclass(frozen=True)
class Variant:
    key: str  # a digest of the call's argument types as Numba tells them apart: one compiled version each
    label: str  # what it serves, for people: "speculative decoding on a fleet behind a router"; "" for the plain engine


def _label(kind: str, pc, lat, spec) -> str:
    parts = []  # (the block pool, ``pc``, is every iteration-level preset's: the engine itself, not a feature)
    if lat is not None:
        parts.append("session turns and closed-loop clients")
    if spec is not None:
        parts.append("speculative decoding")
    where = {"engine": "", "fleet": "a fleet behind a router", "disagg": "a prefill/decode split"}[kind]
    if not parts:
        return where
    return ", ".join(parts) + (f" on {where}" if where else "")


def _type_of(a) -> object:
    """What Numba compiles a separate version for, read without Numba (its typeof takes ~0.4 ms on the engine's
    tuples): an array's dtype, dimensions, layout and writability; a tuple's class and items; else the class."""
    if isinstance(a, np.ndarray):
        layout = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A"
        return a.dtype.str, a.ndim, layout, a.flags.writeable
    if isinstance(a, tuple):
        return type(a).__name__, tuple(_type_of(x) for x in a)
    return type(a).__name__


_HOST: list[str] = []


def _host() -> str:
    """What else Numba's cache is keyed by, so that a marker is ready exactly when the cache holds the compile: the
    CPU it compiles for (kernel_cache's portable level where shipped kernels exist, else the host's or
    NUMBA_CPU_NAME's). Not where the sources are: kernel_cache files each compile by its place in the package, and
    their content names its directory."""
    if not _HOST:
        from llvmlite import binding
        from numba.core import config

        name = config.CPU_NAME or binding.get_host_cpu_name()
        features = config.CPU_FEATURES if config.CPU_FEATURES is not None else binding.get_host_cpu_features().flatten()
        _HOST.append(f"{name}:{features}")
    return _HOST[0]


def variant(kind: str, args: tuple, pc=None, lat=None, spec=None) -> Variant:
    """The variant of a call of the ``kind`` entry ("engine", "fleet", "disagg") with ``args``; ``pc``, ``lat``,
    ``spec`` (each possibly None) name what it serves."""
    sig = repr(tuple(_type_of(a) for a in args))
    return Variant(hashlib.sha256(f"{kind}:{sig}:{_host()}".encode()).hexdigest()[:16], _label(kind, pc, lat, spec))


def _dir() -> Path:
    return Path(kernel_cache.active_dir())


def ready(v: Variant) -> bool:
    return (_dir() / f"ready-{v.key}").exists()


def _compiler(v: Variant) -> int | None:
    """The pid of a live process compiling ``v``, if any."""
    path = _dir() / f"compiling-{v.key}"
    try:
        pid = int(path.read_text().strip() or 0)
        if time.time() - path.stat().st_mtime > STALE_S:
            return None
    except (OSError, ValueError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def _touch(name: str, text: str = "") -> None:
    try:
        path = _dir() / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the variant compiles again next time, nothing else changes
        pass


def _remove(name: str) -> None:
    try:
        (_dir() / name).unlink()
    except OSError:
        pass


# who is told about a first use: a per-thread listener (a dashboard session) over the process-wide one (the CLI)
Listener = Callable[[str, Variant], None]  # (event "compile" | "wait" | "done", variant)
_DEFAULT: list[Listener] = []
_LOCAL = threading.local()


def set_default_listener(fn: Listener | None) -> None:
    _DEFAULT[:] = [fn] if fn is not None else []


def current_listener() -> Listener | None:
    """This thread's listener (for a worker thread to take over: ``notices(current_listener())``)."""
    return getattr(_LOCAL, "fn", None)


def listen_here(fn: Listener | None) -> None:
    """Send this thread's first-use events to ``fn`` from now on (a dashboard session's script thread)."""
    _LOCAL.fn = fn


@contextmanager
def notices(fn: Listener) -> Iterator[None]:
    """Send this thread's first-use events to ``fn`` inside the block."""
    outer = getattr(_LOCAL, "fn", None)
    _LOCAL.fn = fn
    try:
        yield
    finally:
        _LOCAL.fn = outer


def _tell(event: str, v: Variant) -> None:
    fn = getattr(_LOCAL, "fn", None) or (_DEFAULT[0] if _DEFAULT else None)
    if fn is not None:
        fn(event, v)


@contextmanager
def first_use(v: Variant) -> Iterator[None]:
    """Wrap the engine call of variant ``v`` (see the module docstring)."""
    if ready(v):
        yield
        return
    told = None
    if _compiler(v) is not None:  # another process compiles it: its result is read from the cache afterwards
        told = "wait"
        _tell("wait", v)
        while _compiler(v) is not None and not ready(v):
            time.sleep(WAIT_POLL_S)
    if not ready(v):
        if told:
            _tell("done", v)
        told = "compile"
        _tell("compile", v)
        _touch(f"compiling-{v.key}", str(os.getpid()))
    try:
        yield
    except BaseException:
        if told == "compile":
            _remove(f"compiling-{v.key}")
        raise
    else:
        if told == "compile":
            _touch(f"ready-{v.key}")
            _remove(f"compiling-{v.key}")
    finally:
        _tell("done", v)
