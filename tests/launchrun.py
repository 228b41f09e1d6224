"""Run a printed launch command set in bash, in a temporary folder, with fake ``vllm``, ``python``, ``python3`` and
``trtllm-serve`` first on PATH: each records its argv, CUDA_VISIBLE_DEVICES and VLLM_NIXL_* variables (one JSON line
per process) instead of starting a server. What the shell would have run is then what the fakes recorded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAKES = ("vllm", "python", "python3", "trtllm-serve")
FAKE = f"""#!{sys.executable}
import json, os, sys
env = {{k: v for k, v in os.environ.items() if k == "CUDA_VISIBLE_DEVICES" or k.startswith("VLLM_NIXL")}}
with open(os.environ["LAUNCH_LOG"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": env}}) + "\\n")
"""


def run_set(text: str, tmp: Path) -> list[dict]:
    """Run ``text`` (then ``wait`` for what it started in the background) with bash in ``tmp``; returns the
    processes the fakes recorded, in the order they started."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in FAKES:
        p = bin_dir / name
        p.write_text(FAKE)
        p.chmod(0o755)
    log = tmp / "launch.log"
    log.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LAUNCH_LOG": str(log), "HOME": str(tmp)}
    res = subprocess.run(["bash", "-c", text + "\nwait"], cwd=tmp, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def options(argv: list[str]) -> dict[str, list[list[str]]]:
    """``--flag value...`` words by flag: each occurrence's values (words up to the next ``--`` word)."""
    out: dict[str, list[list[str]]] = {}
    cur = None
    for w in argv:
        if w.startswith("--"):
            cur = out.setdefault(w, [])
            cur.append([])
        elif cur is not None:
            cur[-1].append(w)
    return out


def program(proc: dict) -> str:
    """Which engine program a recorded process is: vllm, sglang, sglang_router, vllm_proxy, trtllm."""
    prog, argv = proc["prog"], proc["argv"]
    if prog == "vllm" and argv[:1] == ["serve"]:
        return "vllm"
    if prog == "trtllm-serve":
        return "trtllm"
    if prog.startswith("python") and argv[:2] == ["-m", "sglang.launch_server"]:
        return "sglang"
    if prog.startswith("python") and argv[:2] == ["-m", "sglang_router.launch_router"]:
        return "sglang_router"
    if prog.startswith("python") and argv[:1] and argv[0].endswith("toy_proxy_server.py"):
        return "vllm_proxy"
    raise AssertionError(f"unknown program {prog} {argv[:2]}")


def no_leftovers(tmp: Path) -> list[str]:
    """Files in ``tmp`` besides the fakes, their log and the TensorRT-LLM YAML (a payload's footprint)."""
    keep = {"bin", "launch.log", "extra-llm-api-config.yml"}
    return sorted(p for p in os.listdir(tmp) if p not in keep)
