import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from batching.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["num_requests", "num_steps", "throughput_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
        "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "gpu_util", "busy", "mfu", "mbu", "batch_efficiency",
        "preemptions", "by_priority"]


def test_run_writes_json_and_csv(tmp_path, capsys):
    rc = main(["run", "--preset", "chunked", "--rate", "2", "--requests", "120", "--json", str(tmp_path / "s.json"),
               "--csv", str(tmp_path / "csv")])
    assert rc == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert list(s) == KEYS
    assert s["num_requests"] == 120
    assert set(s["by_priority"]) == {"0", "1"}
    assert s["by_priority"]["0"]["class_name"] == "interactive chat"
    req = pd.read_csv(tmp_path / "csv" / "requests.csv")
    steps = pd.read_csv(tmp_path / "csv" / "steps.csv")
    assert len(req) == 120 and len(steps) == s["num_steps"]
    assert req.output_tokens.sum() == steps.decode_tokens.sum() + (req.output_tokens >= 1).sum()
    assert "throughput_output_tok_s" in capsys.readouterr().out


def test_run_policy_flags_change_the_result(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    base = ["run", "--preset", "dynamic", "--rate", "0.05", "--requests", "40"]
    main(base + ["--max-wait-ms", "10", "--json", str(a)])
    main(base + ["--max-wait-ms", "2000", "--json", str(b)])
    assert json.loads(b.read_text())["ttft_p50_s"] > json.loads(a.read_text())["ttft_p50_s"]


def test_fixed_lengths_and_kv_override(tmp_path):
    out = tmp_path / "s.json"
    main(["run", "--prompt-tokens", "500", "--output-tokens", "400", "--requests", "30", "--rate", "50",
          "--kv-cache-tokens", "2048", "--preemption", "swap", "--json", str(out)])
    s = json.loads(out.read_text())
    assert s["num_steps"] > 0 and s["preemptions"] > 0


def test_trace_replay(tmp_path):
    out = tmp_path / "s.json"
    rc = main(["run", "--trace", str(ROOT / "assets" / "sample_trace.csv"), "--requests", "200",
               "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["num_requests"] == 200


def test_compare_json(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", "--requests", "150", "--rate", "3", "--json", str(out)]) == 0
    c = json.loads(out.read_text())
    assert list(c) == ["static", "dynamic", "continuous", "chunked", "priority"]
    assert c["continuous"]["capacity_output_tok_s"] > c["static"]["capacity_output_tok_s"]
    table = capsys.readouterr().out
    assert "static" in table and "priority" in table


@pytest.mark.parametrize("argv, needle", [
    (["run", "--rate", "-3"], "rate"),
    (["run", "--requests", "abc"], "requests"),
    (["run", "--preemption", "maybe"], "preemption"),
    (["run", "--tp", "1"], "does not fit"),
    (["run", "--max-num-seqs", "99999"], "max_num_seqs"),
    (["run", "--trace", "/nonexistent.csv"], "no such file"),
    (["run", "--max-num-batched-tokens", "100"], "max_num_batched_tokens"),
])
def test_bad_flags_one_line_exit_2(argv, needle):
    p = subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in p.stderr


def test_malformed_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-4,5\n")
    p = subprocess.run([sys.executable, "-m", "batching", "run", "--trace", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "row 2" in p.stderr and "prompt_tokens" in p.stderr
