"""``python -m batching specs``: what fits and how much KV cache, in text and JSON; a model that does not fit, a bad
flag or a bad file is one line on stderr naming what would fit or what is wrong, exit code 2, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching.cli.main import main
from batching.sim.hardware.specs import MODELS

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["model", "gpu", "num_gpus", "tp", "replicas", "precision", "kv_dtype", "attention", "parameters",
        "active_parameters", "weight_bytes_per_gpu", "weight_gib_per_gpu", "usable_gib_per_gpu",
        "kv_cache_gib_per_gpu", "kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "kv_capacity_tokens",
        "kv_capacity_tokens_node"]


def specs_json(capsys, *argv: str) -> dict:
    assert main(["specs", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_deepseek_v3_on_8xh200_json(capsys):
    d = specs_json(capsys, "--model", "deepseek-v3", "--gpu", "h200-sxm", "--tp", "8", "--precision", "fp8")
    assert list(d) == KEYS
    assert d["parameters"] == MODELS["deepseek-v3"].num_params and round(d["parameters"] / 1e9) == 671
    assert round(d["active_parameters"] / 1e9, 1) == 37.6
    assert d["weight_gib_per_gpu"] == pytest.approx(79.27, abs=0.01)
    assert d["kv_bytes_per_token"] == 70_272 and d["kv_bytes_per_token_per_gpu"] == 70_272
    assert d["kv_capacity_tokens"] == 688_944 and d["replicas"] == 1 and d["attention"] == "MLA"


def test_precision_defaults_to_the_published_one(capsys):
    assert specs_json(capsys, "--model", "deepseek-v3", "--gpu", "b200")["precision"] == "fp8"
    assert specs_json(capsys, "--model", "llama-3.1-70b")["precision"] == "bf16"


def test_fp8_kv_and_replicas(capsys):
    d = specs_json(capsys, "--model", "deepseek-v3", "--gpu", "b200", "--tp", "4", "--kv-dtype", "fp8")
    assert d["kv_bytes_per_token"] == 35_136 and d["replicas"] == 2
    assert d["kv_capacity_tokens_node"] == 2 * d["kv_capacity_tokens"]
    g = specs_json(capsys, "--model", "qwen2.5-72b", "--tp", "8")
    assert g["kv_bytes_per_token"] == 327_680 and g["kv_bytes_per_token_per_gpu"] == 40_960 and g["attention"] == "GQA"


def test_text_output_and_json_file(tmp_path, capsys):
    out = tmp_path / "sub" / "specs.json"
    assert main(["specs", "--model", "kimi-k2", "--gpu", "b200", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("parameters", "active_parameters", "weight_gib_per_gpu", "kv_bytes_per_token",
                  "kv_capacity_tokens"):
        assert f"\n{label} " in "\n" + text
    assert "Kimi-K2 (MLA)" in text and "70,272 B" in text and "585,984 per replica" in text
    assert json.loads(out.read_text())["kv_capacity_tokens"] == 585_984


def test_hugging_face_config_with_kv_lora_rank(tmp_path, capsys):
    from test_specs_mla import DEEPSEEK_V3_HF

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(DEEPSEEK_V3_HF))
    d = specs_json(capsys, "--model-json", str(cfg), "--gpu", "h200-sxm", "--precision", "fp8")
    assert d["attention"] == "MLA" and d["kv_bytes_per_token"] == 70_272 and d["kv_capacity_tokens"] == 688_944


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batching", "specs", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("argv, needle", [
    (["--model", "deepseek-v3", "--gpu", "h100-sxm", "--precision", "fp8"],
     "model DeepSeek-V3 in fp8 does not fit on H100 SXM 80GB with tp=8: it needs 81.3 GiB per GPU for weights and "
     "activations but 71.7 GiB are usable; no tensor-parallel degree or precision on this node fits it; it fits "
     "with tp=16 over two nodes (num_gpus=16); or use a GPU with more memory: it fits on 8x H200 SXM 141GB in fp8 "
     "with tp=8 or 8x B200 180GB in fp8 with tp=4"),
    (["--tp", "3"], "argument --tp: 3 is not allowed; allowed 1, 2, 4, 8, 16"),
    (["--num-gpus", "12"], "argument --num-gpus: 12 is not allowed; allowed 1, 2, 3, 4, 5, 6, 7, 8, 16"),
    (["--tp", "16", "--num-gpus", "8"], "tp=16 must divide num_gpus=8 (allowed tp: 1, 2, 4, 8; tp 16 needs "
                                        "num_gpus 16)"),
    (["--model-json", "/nonexistent/config.json"], "model file /nonexistent/config.json: no such file"),
])
def test_errors_are_one_line_exit_2(argv, needle):
    p = _run(*argv)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m batching") and needle in lines[0], lines


def test_in_process_errors(tmp_path, capsys):
    assert main(["specs", "--model", "llama-3.1-405b", "--gpu", "h100-sxm"]) == 2
    assert "it fits with precision fp8" in capsys.readouterr().err
    assert main(["specs", "--json", str(tmp_path)]) == 2
    assert "a folder, not a file" in capsys.readouterr().err
    assert main(["specs", "--gpu", "h200-sxm", "--model", "deepseek-v3", "--kv-cache-tokens", "1e9"]) == 2
    assert "kv_cache_tokens=1000000000 is out of range; allowed 16 to 688944" in capsys.readouterr().err
