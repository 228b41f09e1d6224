"""``python -m batching search``: the ranked configurations on stdout and in JSON (the documented keys, best first),
skipped and pruned with why, progress on stderr, and one-line errors (flag, value, allowed range) for bad input."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from batching.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG_KEYS = {"gpu", "precision", "tp", "replicas_per_node", "policy", "knobs", "max_rate_req_s", "nodes_needed",
               "usd_per_million_output_tokens", "ttft_p99_s", "tpot_p99_s", "binding_slo", "meets_slo"}
BASE = ["search", "--model", "qwen2.5-72b", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100", "--target-rate",
        "40", "--requests", "150", "--workers", "2"]


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
    assert best["nodes_needed_perfect_balance"] == math.ceil(40 / best["max_rate_req_s"] - 1e-9)
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
    (["--gpus", "h100-sxm,b200", "--gpu-hour-usd", "h100-sxm=2"], "--gpu-hour-usd: no price for b200"),
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
