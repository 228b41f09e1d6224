"""``python -m batching search``: the ranked configurations on stdout and in JSON (the documented keys, best first),
skipped and pruned with why, progress on stderr, and one-line errors (flag, value, allowed range) for bad input."""
from __future__ import annotations

import importlib.util
import json
import math
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from batching.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG_KEYS = {"gpu", "precision", "tp", "replicas_per_node", "policy", "knobs", "max_rate_req_s", "nodes_needed",
               "usd_per_million_output_tokens", "ttft_p99_s", "tpot_p99_s", "binding_slo", "meets_slo"}
BASE = ["search", "--model", "qwen2.5-72b", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100", "--target-rate",
        "40", "--requests", "150", "--workers", "2", "--serving", "agg"]


def test_search_json_and_table(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(BASE + ["--gpus", "h100-sxm,a100-80gb", "--precisions", "bf16,fp8", "--tp", "8",
                      "--knobs", "max_num_seqs=128,256", "--gpu-hour-usd", "h100-sxm=2.5,a100-80gb=1.6",
                      "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert {"configs", "searched", "skipped", "pruned", "simulations"} <= set(d)
    ok = [c for c in d["configs"] if c["meets_slo"]]
    assert ok and all(CONFIG_KEYS <= set(c) for c in d["configs"])
    assert [c["usd_per_million_output_tokens"] for c in ok] == sorted(c["usd_per_million_output_tokens"] for c in ok)
    best = ok[0]
    assert best["gpu"] == "h100-sxm" and best["precision"] == "fp8" and best["replicas_per_node"] == 1
    assert best["knobs"]["max_num_seqs"] in (128, 256)
    # the perfect-balance estimate, then the fleet check (behind the CLI's default router) may add nodes
    assert best["nodes_needed_perfect_balance"] == math.ceil(40 * d["headroom"] / best["max_rate_req_s"] - 1e-9)
    assert best["fleet_checked"] and best["fleet_verified"] and d["router"] == best["router"] == "round-robin"
    assert best["nodes_needed"] == best["fleet_nodes_needed"] >= best["nodes_needed_perfect_balance"]
    why = {s["label"]: s["why"] for s in d["skipped"]}
    assert "precision='fp8' is not supported" in why["a100-80gb fp8 tp8 chunked, max_num_seqs=128"]
    assert d["simulations"] > 0 and d["searched"] >= 1
    assert d["searched"] + len(d["pruned"]) + sum(s["reason"] == "does not fit" for s in d["skipped"]) == 8
    captured = capsys.readouterr()
    assert "h100-sxm fp8 tp8 chunked" in captured.out and "perfect load balancing" in captured.out
    assert f"{best['nodes_needed']} nodes ✓ round-robin" in captured.out and "Router: round-robin" in captured.out
    assert "[1/" in captured.err  # progress on stderr


def _one_line_exit_2(*argv: str) -> str:
    p = subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.mark.parametrize("extra,expected", [
    (["--gpus", "h100-sxm,tpu", "--gpu-hour-usd", "2"], "--gpus: 'tpu' is not allowed; allowed: h100-sxm"),
    (["--tp", "3", "--gpu-hour-usd", "2"], "argument --tp: '3' is not allowed; allowed: 1, 2, 4, 8"),
    (["--gpus", "h100-sxm,b200", "--gpu-hour-usd", "a100-80gb=2"], "--gpu-hour-usd: 'a100-80gb' is not searched"),
    (["--gpu-hour-usd", "h100-sxm=-1"], "h100-sxm=-1 is out of range; allowed > 0 to"),
    (["--gpu-hour-usd", "2", "--knobs", "max_num_seqs=0"], "--knobs: knob max_num_seqs=0 is out of range; allowed 1"),
    (["--gpu-hour-usd", "2", "--knobs", "foo=1"], "knob 'foo' is not allowed; allowed: max_num_seqs"),
    (["--gpu-hour-usd", "2", "--policies", "fast"], "argument --policies: 'fast' is not allowed; allowed: static"),
    (["--gpu-hour-usd", "2", "--num-gpus", "4", "--tp", "8"], "--tp: 8 must divide --num-gpus 4"),
    (["--gpu-hour-usd", "2", "--slo-ttft-ms", "1,2,3"], "--slo-ttft-ms: 3 values for 2 classes"),
])
def test_bad_input_is_one_line(extra, expected):
    line = _one_line_exit_2("search", "--slo-ttft-ms", "1000", "--target-rate", "10", "--requests", "50", *extra)
    assert expected in line, line


def test_needs_an_slo_and_a_target():
    assert "give at least one SLO" in _one_line_exit_2("search", "--target-rate", "10", "--gpu-hour-usd", "2")
    assert "--target-rate" in _one_line_exit_2("search", "--slo-ttft-ms", "1000", "--gpu-hour-usd", "2")


def test_ray_backend_without_ray_says_how_to_install(without_ray, capsys):
    rc = main(["search", "--slo-ttft-ms", "1000", "--target-rate", "10", "--gpu-hour-usd", "2", "--requests", "50",
               "--backend", "ray"])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install -r requirements-cluster.txt" in err and len(err.strip().splitlines()) == 1


# --- Ray: an address that cannot be reached is one line within the timeout, never a hang -----------------------------

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -r requirements-cluster.txt)")
TINY = ["search", "--requests", "100", "--slo-ttft-ms", "1000", "--target-rate", "10", "--gpu-hour-usd", "2",
        "--knobs", "max_num_seqs=16", "--tp", "8", "--serving", "agg"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def silent_listener():
    """A loopback port that accepts connections and never answers (no Ray there): the port of a cluster that hangs."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()
        for c in held:
            c.close()


def _cli(*argv: str, timeout: float = 90) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    return p, time.monotonic() - t0


@needs_ray
@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_unreachable_ray_address_is_one_line(scheme):
    address = f"{scheme}127.0.0.1:{closed_port()}"
    p, took = _cli(*TINY, "--backend", "ray", "--ray-address", address)
    assert p.returncode == 2, (p.stdout, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert repr(address) in lines[0] and "Connection refused" in lines[0] and "check that" in lines[0], lines[0]
    assert took < 45, took  # refused at once: the time is Python, NumPy and Ray starting


@needs_ray
def test_a_ray_client_address_connects_and_times_out():
    """``ray://`` gets as far as Ray Client's connection (the ``client`` extra is installed) and gives up after
    --ray-timeout-s when the port accepts but no Ray Client server answers."""
    with silent_listener() as port:
        address = f"ray://127.0.0.1:{port}"
        p, took = _cli(*TINY, "--backend", "ray", "--ray-address", address, "--ray-timeout-s", "2")
    assert p.returncode == 2, (p.stdout, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert repr(address) in lines[0] and "did not connect within 2 s" in lines[0], lines[0]
    assert "ray[client]" not in lines[0]
    assert took < 45, took


def test_the_cluster_requirements_pin_ray_with_its_client_extra():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements-cluster.txt").read_text().splitlines()]
    pins = [ln for ln in lines if ln.startswith("ray")]
    assert len(pins) == 1 and pins[0].startswith("ray[client]=="), pins
    if HAS_RAY:
        import ray

        assert pins[0] == f"ray[client]=={ray.__version__}"  # the version the tests ran with


@needs_ray
def test_a_grid_where_nothing_fits_never_connects():
    """Every configuration is skipped (A100 has no FP8): the answer comes at once, with the skipped list, and no
    backend is started (the Ray address is never tried)."""
    p, took = _cli(*TINY, "--gpus", "a100-80gb", "--precisions", "fp8", "--backend", "ray",
                   "--ray-address", f"127.0.0.1:{closed_port()}")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "skipped a100-80gb fp8 tp8 chunked, max_num_seqs=16: does not fit" in p.stdout
    assert "searched 0 of 1 configurations, 1 skipped" in p.stdout
    assert "Ray" not in p.stderr and "searching" not in p.stderr, p.stderr[-2000:]
    assert took < 45, took


@pytest.mark.parametrize("flag,value", [("--ray-address", "127.0.0.1:6379"), ("--ray-timeout-s", "5")])
def test_ray_flags_need_the_ray_backend(flag, value):
    line = _one_line_exit_2(*TINY, flag, value)
    assert f"{flag}: only with --backend ray" in line, line


@pytest.mark.parametrize("value", ["0", "-1", "nan", "100000"])
def test_ray_timeout_is_checked(value):
    line = _one_line_exit_2(*TINY, "--backend", "ray", "--ray-timeout-s", value)
    assert "--ray-timeout-s" in line and "allowed" in line, line


# --- --workers: capped at the configurations to run and a multiple of the cores ---------------------------------------

def test_workers_are_capped_at_the_grid_and_the_cores(monkeypatch, capsys):
    """``--workers 4096`` on a grid of 2 configurations starts at most 2 worker processes (it forked 4,096)."""
    import multiprocessing.process as mpp

    started = []
    real_start = mpp.BaseProcess.start

    def start(self):
        started.append(self.name)
        if len(started) > 8:  # stop a runaway pool here rather than fork thousands of processes
            raise RuntimeError(f"{len(started)} worker processes started")
        return real_start(self)

    monkeypatch.setattr(mpp.BaseProcess, "start", start)
    t0 = time.monotonic()
    rc = main(TINY + ["--tp", "4,8", "--workers", "4096", "--fleet-top", "0"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 0, err
    assert 1 <= len(started) <= 2, started
    assert "searching 2 of 2 configurations on local process pool, 2 workers" in err, err
    assert took < 120, took


def test_workers_help_says_the_cap():
    from batching.studies.backends import WORKERS_PER_CPU, default_workers

    p = subprocess.run([sys.executable, "-m", "batching", "search", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    text = " ".join(p.stdout.split())
    assert p.returncode == 0
    assert (f"at most the configurations that fit and {WORKERS_PER_CPU}x this machine's cores "
            f"({WORKERS_PER_CPU * default_workers()} here)") in text, text
