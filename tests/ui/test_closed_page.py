"""A page that goes away mid-run (tab closed: Streamlit stops its script run; a rerun superseded it) gives its
simulation slots back and stops its work at its next simulation, wherever that work runs: the script thread (a
capacity search), a sweep's thread pool (Tune), a deployment search's thread backend (Find a deployment), or the
queue for a slot. Every simulation's start is recorded (``engine.run``), so the tests count the runs that started
after the page had gone: at most the one already starting."""
from __future__ import annotations

import threading
import time

import pytest
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.local_script_runner import LocalScriptRunner
from uihelpers import ROOT

from batching.sim.engine import kernel as engine
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset
from batching.ui import cache

N = 20000  # the hosted cap: each run takes ~1 s, a whole job tens of seconds


@pytest.fixture(scope="module", autouse=True)
def warm_kernel():
    simulate(Scenario(workload=workload_preset("chat", 1.0, 4, 0)))  # loaded once, outside the timed part


@pytest.fixture
def starts(monkeypatch):
    """The start time of every engine run from now on (any thread), and a clean slate for the slots."""
    monkeypatch.setitem(cache._KERNEL, "ready", True)
    cache.clear()
    times: list[float] = []
    real = engine.run

    def counted(*args, **kwargs):
        times.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "run", counted)
    assert cache.SLOTS.running == 0
    yield times
    cache.clear()


@pytest.fixture
def runners(monkeypatch) -> list[LocalScriptRunner]:
    """The script runners AppTest starts from now on (to stop or rerun one from another thread)."""
    out: list[LocalScriptRunner] = []
    real = LocalScriptRunner.run

    def keep(self, *args, **kwargs):
        out.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalScriptRunner, "run", keep)
    return out


def _closed_when(at: AppTest, runners: list, ready, rerun: bool = False) -> tuple[float, float]:
    """Run the page and, once ``ready()`` (its job is under way), close it as Streamlit does for a tab that
    closed (``request_stop``), or supersede the run (``rerun``: a new run requested, as a moved knob does).
    Returns (when it was closed, when the page's script run had ended)."""
    asked: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not (runners and ready()) and time.monotonic() < deadline:
            time.sleep(0.01)
        asked.append(time.monotonic())
        if rerun:
            runners[0].request_rerun(RerunData())
        else:
            runners[0].request_stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    at.run(timeout=180)
    ended = time.monotonic()
    watcher.join(5)
    assert asked, "the page ended before its job was under way"
    return asked[0], ended


def _assert_stopped(starts: list[float], stopped: float, ended: float, job_s: float) -> None:
    """No run started after the page went, and within ``job_s`` of it every slot was free (a heavy run already in
    the kernel when the page went finishes first, in its slot, outside the page's script run)."""
    while cache.SLOTS.running and time.monotonic() - stopped < job_s + 30:
        time.sleep(0.02)
    free = time.monotonic()
    # the script thread looks every 0.25 s while it waits for its pool (slots.POLL_S), then the pool's threads
    # stop before their next run: none starts later
    after = [t for t in starts if t > stopped + 0.5]
    assert not after, f"{len(after)} runs started after the page went (of {len(starts)})"
    assert starts, "the job never ran"
    assert ended - stopped < job_s, f"the page's script ran {ended - stopped:.1f} s after it closed"
    assert free - stopped < job_s, f"the page's work held a slot {free - stopped:.1f} s after it closed"
    assert cache.SLOTS.running == 0 and cache.SLOTS.waiting == 0
    assert cache.SLOTS.try_take() and cache.SLOTS.try_take()  # a fresh session gets a slot at once
    cache.SLOTS.release()
    cache.SLOTS.release()


def _capacity_page() -> None:
    import streamlit as st

    from batching.sim.policy import PRESETS
    from batching.sim.simulate import Scenario
    from batching.sim.hardware.specs import deployment
    from batching.sim.workload.requests import workload_preset
    from batching.studies.capacity import SLO
    from batching.ui import planning, widgets

    sc = Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 20000, 11))
    if st.session_state.get("started"):  # a rerun: nothing heavy
        st.write("second run")
        return
    st.session_state["started"] = True
    slo = SLO(ttft_s=2.0, tpot_s=0.05)
    # three searches of 15 to 21 runs each, one after another with nothing drawn in between (~30 s in all)
    found = widgets.guarded(lambda: [planning.capacity_cached(sc.with_policy(PRESETS[p]), slo)
                                     for p in ("chunked", "continuous", "priority")], "The searches")
    st.write(f"found {[f.max_rate_req_s for f in found]}" if found else "no answer")


def test_a_closed_page_stops_its_capacity_search(starts, runners):
    """The searches run in the script thread, one run after another: they stop at the next run."""
    stopped, ended = _closed_when(AppTest.from_function(_capacity_page), runners, lambda: len(starts) >= 3)
    _assert_stopped(starts, stopped, ended, job_s=4.0)
    assert len(starts) < 15  # the first search alone takes 15 to 21 runs


def _sweep_page() -> None:
    import streamlit as st

    from batching.sim.simulate import Scenario
    from batching.sim.hardware.specs import deployment
    from batching.sim.workload.requests import workload_preset
    from batching.studies.capacity import SLO
    from batching.ui import planning, widgets

    sc = Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 20000, 12))
    jobs = [("sweep", sc, "max_num_seqs", [32.0, 64.0, 128.0, 256.0], SLO(ttft_s=2.0, tpot_s=0.05))]
    done = widgets.guarded(lambda: planning.sweeps_cached(jobs, "Sweeping"), "The sweep")
    st.write("swept" if done else "no sweep")


def test_a_closed_page_stops_its_sweep_threads(starts, runners):
    """Tune's points run on a thread pool as wide as the free slots, each a capacity search: the points not
    started are dropped and the running ones stop at their next run, so every slot is back at once."""
    threads = threading.active_count()
    stopped, ended = _closed_when(AppTest.from_function(_sweep_page), runners, lambda: len(starts) >= 6)
    _assert_stopped(starts, stopped, ended, job_s=4.0)
    assert threading.active_count() <= threads  # the pool's threads ended


def test_a_closed_page_stops_its_deployment_search(starts, runners, monkeypatch):
    """Find a deployment's search runs each configuration's capacity search (~10 runs) as a task on a thread
    backend: a page closed during those searches stops waiting for them, and they stop at their next run."""
    from batching.studies import search as search_module

    searching: list[float] = []
    real = search_module.search_task

    def task(payload):
        searching.append(time.monotonic())
        return real(payload)

    monkeypatch.setattr(search_module, "search_task", task)
    at = AppTest.from_file(str(ROOT / "app.py"))
    for k, v in dict(n=str(N), s_gpus="h100-sxm,a100-80gb", s_precs="bf16,fp8", s_tps="8", target="20",
                     s_serving="agg").items():
        at.query_params[k] = v
    at.switch_page("pages/find_a_deployment.py")  # 4 configurations: searched as the page opens
    # closed once two capacity searches have run a few simulations each
    stopped, ended = _closed_when(at, runners, lambda: len(searching) >= 2 and len(
        [t for t in starts if t > searching[1]]) >= 3)
    _assert_stopped(starts, stopped, ended, job_s=4.0)


def test_a_superseded_run_gives_its_slot_to_the_next(starts, runners):
    """A rerun that supersedes a run in the middle of its job (a knob moved) starts once the job has stopped at
    its next simulation, not when the job would have ended."""
    at = AppTest.from_function(_capacity_page)
    asked, done = _closed_when(at, runners, lambda: len(starts) >= 3, rerun=True)
    assert not at.exception and any("second run" in m.value for m in at.markdown)
    after = [t for t in starts if t > asked + 0.5]
    assert not after and done - asked < 4.0, (len(after), done - asked)
    while cache.SLOTS.running and time.monotonic() - asked < 10:
        time.sleep(0.02)
    assert cache.SLOTS.running == 0 and cache.SLOTS.waiting == 0


def _waiting_page() -> None:
    from batching.sim.simulate import Scenario
    from batching.sim.hardware.specs import deployment
    from batching.sim.workload.requests import workload_preset
    from batching.ui import cache, widgets

    widgets.guarded(lambda: cache.summary_cached(
        Scenario(deployment=deployment(), workload=workload_preset("chat", 2.0, 40, 13))), "The run")


def test_a_closed_page_leaves_the_queue(starts, runners):
    held = 0
    while cache.SLOTS.try_take(light=True):
        held += 1
    try:
        stopped, ended = _closed_when(AppTest.from_function(_waiting_page), runners,
                                      lambda: cache.SLOTS.waiting == 1)
        assert ended - stopped < 1.5 and cache.SLOTS.waiting == 0 and not starts
    finally:
        for _ in range(held):
            cache.SLOTS.release()
    assert cache.SLOTS.running == 0
