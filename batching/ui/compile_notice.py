"""The dashboard's side of a kernel's first use (sim.engine.first_use): a progress box while the engine compiles,
and the background compile of every other feature once the first page's engine is ready.

While a run compiles (once per install and feature), the page shows what it is preparing and how far the compile is:
the parts of the engine compiled so far, the one compiling now and the seconds spent, updated as each part finishes
(Numba's compile events, this session's thread only). Once the engine has run once in this server process,
``start_background`` starts ``python -m batching prepare --background`` (lowest CPU priority, one per kernel cache)
so later first uses load their kernels from the cache; ``BATCHING_PREPARE=off`` turns that off (tests, a host that
prefers to compile on demand).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import streamlit as st
from numba.core import event
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from batching.sim.engine import first_use, kernel_cache

APP_ROOT = Path(__file__).resolve().parents[2]
_STARTED = {"done": False}
_START_LOCK = threading.Lock()


def _ours(ev) -> str | None:
    """The name of the simulator's function an event is about; None for Numba's own helpers."""
    disp = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
    fn = getattr(disp, "py_func", None)
    return fn.__name__ if fn is not None and getattr(fn, "__module__", "").startswith("batching.") else None


class _InPage:
    """Draw from a worker thread into the page whose script run started its work (the run's context, attached
    for the drawing only: pool threads serve other sessions too)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def __enter__(self):
        self.attached = self.ctx is not None and get_script_run_ctx(suppress_warning=True) is None
        if self.attached:
            add_script_run_ctx(threading.current_thread(), self.ctx)

    def __exit__(self, *exc):
        if self.attached:
            add_script_run_ctx(threading.current_thread(), None)


class _Box(event.Listener):
    """The progress box of one compile: a Numba compile-event listener that updates it from this thread only."""

    def __init__(self, v: first_use.Variant, waiting: bool, page: _InPage, slot) -> None:
        self.page = page
        self.owner = threading.get_ident()
        self.start = time.monotonic()
        self.parts = 0
        self.now = "the engine"
        self.waiting = waiting
        what = f"the simulator for {v.label}" if v.label else "the simulator"
        self.title = f"Preparing {what}, once per install"
        self.box = slot
        self.draw()

    def draw(self) -> None:
        took = time.monotonic() - self.start
        if self.waiting:
            text = ("another process is compiling its kernels (the background compile this server started); "
                    f"the page continues when it is done ({took:.0f} s so far)")
        else:
            text = (f"compiling the engine's kernels with Numba: {self.parts} parts done, now {self.now} "
                    f"({took:.0f} s so far; up to a minute on 2 cores). Later runs load them from the cache.")
        with self.page:
            self.box.info(f"**{self.title}**: {text}", icon=":material/hourglass_top:")

    def on_start(self, ev) -> None:
        name = _ours(ev)
        if name and threading.get_ident() == self.owner:
            self.now = name
            self.draw()

    def on_end(self, ev) -> None:
        if _ours(ev) and threading.get_ident() == self.owner:
            self.parts += 1
            self.draw()

    def close(self) -> None:
        with self.page:
            self.box.empty()


def listen(slot=None) -> None:
    """Show this session's first uses as a progress box in ``slot`` (an ``st.empty()`` the page makes on every run,
    so that the page's elements keep their places, and its charts their DOM nodes, whether a run compiled or not;
    default: one made here). Call once per script run, before any simulation."""
    slot = st.empty() if slot is None else slot
    boxes: dict[int, list[_Box]] = {}  # per thread: a page's sweep may compile in several at once
    page = _InPage(get_script_run_ctx(suppress_warning=True))

    def on_event(kind: str, v: first_use.Variant) -> None:
        mine = boxes.setdefault(threading.get_ident(), [])
        if kind in ("compile", "wait"):
            box = _Box(v, kind == "wait", page, slot)
            if kind == "compile":
                event.register("numba:compile", box)
            mine.append(box)
        elif kind == "done" and mine:
            box = mine.pop()
            if not box.waiting:
                event.unregister("numba:compile", box)
            box.close()

    first_use.listen_here(on_event)


def background_on() -> bool:
    return os.environ.get("BATCHING_PREPARE", "on").strip().lower() not in ("off", "0", "false", "no")


def start_background() -> bool:
    """Start the background compile of every feature, once per server process; False when off, started, or when
    the shipped kernels hold every feature already."""
    if not background_on() or kernel_cache.shipped_here():
        return False
    with _START_LOCK:
        if _STARTED["done"]:
            return False
        _STARTED["done"] = True
    try:
        subprocess.Popen([sys.executable, "-m", "batching", "prepare", "--background"], cwd=APP_ROOT,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    except OSError:  # no process can start (a locked-down host): features compile on their first use instead
        return False
    return True
