"""A kernel variant's first use (issue 25): markers, the CLI's line, waiting for another compiler, the
dashboard's progress box and background compile, and `python -m batching prepare`."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from batching.cli import prepare
from batching.cli.main import main
from batching.sim.engine import first_use, kernel_cache
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import workload_preset



@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Markers in a temporary folder (the kernels stay where they are)."""
    monkeypatch.setattr(kernel_cache, "_ACTIVE", [tmp_path])
    return tmp_path


def _events():
    seen = []
    return seen, (lambda kind, v: seen.append((kind, v.label)))


def test_variant_keys_follow_argument_types():
    a = first_use.variant("engine", (np.zeros(3), 1), None, None, None)
    assert a == first_use.variant("engine", (np.ones(5), 7), None, None, None)  # sizes and values: same compile
    assert a.key != first_use.variant("engine", (np.zeros(3, np.int64), 1)).key  # a dtype: another compile
    assert a.key != first_use.variant("fleet", (np.zeros(3), 1)).key
    assert a.label == ""
    spec = first_use.variant("fleet", (np.zeros(3), 1), None, object(), object())
    assert spec.label == "session turns and closed-loop clients, speculative decoding on a fleet behind a router"
    assert first_use.variant("disagg", ()).label == "a prefill/decode split"


def test_first_use_marks_ready_and_tells_once(cache_dir):
    v = first_use.Variant("abc", "speculative decoding")
    seen, listen = _events()
    with first_use.notices(listen):
        assert not first_use.ready(v)
        with first_use.first_use(v):
            assert (cache_dir / "compiling-abc").read_text() == str(os.getpid())
        assert first_use.ready(v) and not (cache_dir / "compiling-abc").exists()
        with first_use.first_use(v):
            pass
    assert seen == [("compile", "speculative decoding"), ("done", "speculative decoding")]


def test_a_failed_first_use_stays_unready(cache_dir):
    v = first_use.Variant("bad", "x")
    with pytest.raises(RuntimeError), first_use.first_use(v):
        raise RuntimeError("boom")
    assert not first_use.ready(v) and not (cache_dir / "compiling-bad").exists()


def test_waits_for_a_live_compiler_instead_of_compiling(cache_dir, monkeypatch):
    monkeypatch.setattr(first_use, "WAIT_POLL_S", 0.02)
    v = first_use.Variant("shared", "prefix caching")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (cache_dir / "compiling-shared").write_text(str(other.pid))
        threading.Timer(0.3, lambda: (cache_dir / "ready-shared").write_text("")).start()
        seen, listen = _events()
        start = time.monotonic()
        with first_use.notices(listen), first_use.first_use(v):
            waited = time.monotonic() - start
        assert waited >= 0.25
        assert seen == [("wait", "prefix caching"), ("done", "prefix caching")]  # no compile of its own
    finally:
        other.kill()
        other.wait()


def test_a_dead_compilers_marker_is_ignored(cache_dir):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (cache_dir / "compiling-gone").write_text(str(dead.pid))
    seen, listen = _events()
    with first_use.notices(listen), first_use.first_use(first_use.Variant("gone", "y")):
        pass
    assert [k for k, _ in seen] == ["compile", "done"]


def test_an_old_marker_is_ignored_even_if_its_pid_lives(cache_dir):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        marker = cache_dir / "compiling-old"
        marker.write_text(str(other.pid))
        old = time.time() - first_use.STALE_S - 5
        os.utime(marker, (old, old))
        seen, listen = _events()
        with first_use.notices(listen), first_use.first_use(first_use.Variant("old", "z")):
            pass
        assert [k for k, _ in seen] == ["compile", "done"]
    finally:
        other.kill()
        other.wait()


def test_cli_says_so_in_one_line_when_it_compiles(cache_dir, capsys):
    sc = Scenario(workload=workload_preset("chat", 1.0, 30, 0))
    simulate(sc)  # the kernel itself is compiled (or loaded) here; its marker went to cache_dir
    for marker in cache_dir.glob("ready-*"):
        marker.unlink()
    assert main(["run", "--requests", "30", "--workload", "chat"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    # one line for the command, however many versions it compiles
    assert err == [
        "python -m batching: preparing the simulator (once per install): compiling its kernels, up to a minute; "
        "`python -m batching prepare` compiles every feature ahead"]
    assert main(["run", "--requests", "30", "--workload", "chat"]) == 0
    assert capsys.readouterr().err == ""  # ready now: nothing said


def test_a_command_compiling_two_versions_says_so_once(capsys):
    """A closed loop on a split and its saturated twin (an open loop) are two kernel versions: one line."""
    from batching.cli import main as cli_main
    from batching.sim.engine.first_use import Variant

    said = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_main, "dispatch", lambda parser, argv: said.append(
            [first_use._DEFAULT[0](e, Variant(k, label)) for e, k, label in
             (("compile", "a", "closed-loop clients on a prefill/decode split"), ("done", "a", ""),
              ("compile", "b", "a prefill/decode split"), ("done", "b", ""))]) or 0)
        assert cli_main.main(["run"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and err == [
        "python -m batching: preparing the simulator for closed-loop clients on a prefill/decode split (once per "
        "install): compiling its kernels, up to a minute; `python -m batching prepare` compiles every feature ahead"]


def test_prepare_features_all_build():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepare, "REQUESTS", 10)
        kinds = set()
        for label, flags in prepare.FEATURES:
            sc = prepare._scenario(flags)
            sc.validate()
            kinds.add(repr(sc))
        assert len(kinds) == len(prepare.FEATURES)  # distinct feature combinations, not one scenario repeated


def test_prepare_runs_each_feature_and_marks_it(cache_dir, monkeypatch, capsys):
    monkeypatch.setattr(prepare, "FEATURES", (("chat", ["--workload", "chat"]),
                                               ("a routed fleet", ["--nodes", "2", "--router", "least-kv"])))
    assert main(["prepare", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "[1/3] chat: ready" in err and "[2/3] a routed fleet: ready" in err and "every feature is compiled" in err
    assert f"[3/3] {prepare.HELPERS}: ready" in err
    assert len(list(cache_dir.glob("ready-*"))) == 2  # the engine's variant and the fleet's
    assert not (cache_dir / "prepare.pid").exists()


def test_prepare_leaves_it_to_a_running_one(cache_dir, capsys):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (cache_dir / "prepare.pid").write_text(str(other.pid))
        assert main(["prepare"]) == 0
        assert f"(pid {other.pid})" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()


def test_prepare_refuses_bad_jobs(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--jobs", "0"])
    assert exc.value.code == 2
    assert "--jobs" in capsys.readouterr().err


def _box_page():
    import streamlit as st

    from batching.sim.engine import first_use as fu
    from batching.ui import compile_notice

    compile_notice.listen()
    fu.current_listener()("compile", fu.Variant("k", "speculative decoding"))
    st.write("after")


def _box_closed_page():
    from batching.sim.engine import first_use as fu
    from batching.ui import compile_notice

    compile_notice.listen()
    tell = fu.current_listener()
    tell("compile", fu.Variant("k", ""))
    tell("done", fu.Variant("k", ""))


def test_dashboard_box_says_what_it_prepares():
    at = AppTest.from_function(_box_page).run()
    assert not at.exception
    text = at.info[0].value
    assert text.startswith("**Preparing the simulator for speculative decoding, once per install**")
    assert "compiling the engine's kernels with Numba: 0 parts done" in text
    at = AppTest.from_function(_box_closed_page).run()
    assert not at.exception and len(at.info) == 0  # done: the box is gone


def test_background_compile_starts_once_and_can_be_turned_off(monkeypatch):
    from batching.ui import compile_notice

    calls = []
    monkeypatch.setattr(compile_notice.subprocess, "Popen", lambda cmd, **kw: calls.append((cmd, kw)))
    monkeypatch.setattr(compile_notice, "_STARTED", {"done": False})
    monkeypatch.setenv("BATCHING_PREPARE", "on")
    monkeypatch.setattr(kernel_cache, "shipped_here", lambda: True)
    assert not compile_notice.start_background() and calls == []  # the shipped kernels hold every feature
    monkeypatch.setattr(kernel_cache, "shipped_here", lambda: False)
    monkeypatch.setenv("BATCHING_PREPARE", "off")
    assert not compile_notice.start_background() and calls == []
    monkeypatch.setenv("BATCHING_PREPARE", "on")
    assert compile_notice.start_background()
    assert not compile_notice.start_background()  # once per server process
    (cmd, kw), = calls
    assert cmd[1:] == ["-m", "batching", "prepare", "--background"] and kw["start_new_session"]


def test_read_only_inputs_share_the_engines_version():
    """A cached trace's arrays are read-only; Numba would compile another version for them (a first use of its own
    that `prepare` does not cover): the engine's inputs are writable copies then."""
    from batching.sim.engine import kernel as eng

    arrival, prompt = np.arange(4, dtype=np.float64), np.full(4, 100, np.int64)
    frozen = [a.copy() for a in (arrival, prompt)]
    for a in frozen:
        a.flags.writeable = False
    out = np.full(4, 10, np.int64)
    prio = np.zeros(4, np.int64)
    a, b = eng.inputs(arrival, prompt, out, prio), eng.inputs(*frozen, out, prio)
    assert all(x.flags.writeable for x in b if isinstance(x, np.ndarray))
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt, b.prompt)
    assert first_use.variant("engine", (a,)).key == first_use.variant("engine", (b,)).key
