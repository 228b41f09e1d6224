"""Messages that say what to change (issue 22, item 11): each used to point at a fix that could not work (a flag
at its maximum, a flag the CLI lacks, a file that was fine, an architecture it then listed as supported, a node
count above the maximum)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching.sim.specs import parse_json_spec

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if "error:" in ln]
    assert len(lines) == 1, p.stderr
    return lines[0]


def _native(rows) -> bytes:
    return b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(f"{a},{p},{o}\n".encode() for a, p, o in rows)


# ---------------------------------------------------------------- item 11: misleading messages

def test_a_draft_that_cannot_fit_says_so_not_raise_kv_cache_tokens():
    # Qwen2.5-72B at TP 2 on H100 leaves ~2 GiB per GPU; Qwen2.5-7B's weights alone take 7 GiB there
    line = _error(_cli("run", "--requests", "20", "--tp", "2", "--spec-decode", "draft"))
    assert "kv_cache_tokens" not in line
    assert "--spec-draft-model qwen2.5-7b: the draft model Qwen2.5-7B does not fit beside Qwen2.5-72B" in line
    assert "at any KV cache size" in line and "eagle or ngram" in line


def test_a_request_beyond_the_largest_cache_does_not_say_raise_kv_cache_tokens(tmp_path):
    # Llama-3.1-70B in BF16 at TP 2 on H100 holds 26,032 tokens of KV: a 30,100-token request (within its
    # 131,072-token context) cannot fit at any kv_cache_tokens, the flag's maximum included
    trace = tmp_path / "t.csv"
    trace.write_bytes(_native([(0.0, 30_000, 100), (0.5, 400, 50)]))
    for extra in ((), ("--kv-cache-tokens", "26032")):
        line = _error(_cli("run", "--model", "llama-3.1-70b", "--tp", "2", "--preset", "chunked", "--trace",
                           str(trace), *extra))
        assert "raise kv_cache_tokens" not in line, line
        assert "needs 30,100 tokens of KV cache" in line
        assert "26,032 tokens is the most this deployment's memory holds, so no kv_cache_tokens fits it" in line
    # where the flag is what keeps it out, raising it is the fix, and the message says to what
    line = _error(_cli("run", "--model", "llama-3.1-70b", "--tp", "2", "--preset", "chunked", "--trace", str(trace),
                       "--kv-cache-tokens", "20000"))
    assert "raise kv_cache_tokens to at least 30,112 (this deployment holds up to 26,032)" not in line
    assert "26,032 tokens is the most" in line
    trace.write_bytes(_native([(0.0, 20_000, 100), (0.5, 400, 50)]))
    line = _error(_cli("run", "--model", "llama-3.1-70b", "--tp", "2", "--preset", "chunked", "--trace", str(trace),
                       "--kv-cache-tokens", "10000"))
    assert "raise kv_cache_tokens to at least 20,112 (this deployment holds up to 26,032)" in line


def test_a_mooncake_row_of_a_million_plus_a_million_tokens_is_rejected_by_the_context(tmp_path, capsys):
    from batching.cli.main import main

    def row(t, i, o, base):
        return {"timestamp": t, "input_length": i, "output_length": o,
                "hash_ids": list(range(base, base - (-i // 512)))}

    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in (row(0, 1_000_000, 1_000_000, 0), row(10, 600, 20, 5000),
                                                       row(20, 900, 30, 6000))) + "\n")
    out = tmp_path / "s.json"
    assert main(["run", "--trace", str(trace), "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["rejected_requests"] == 1 and s["num_requests"] == 2
    assert "raise kv_cache_tokens" not in capsys.readouterr().err


def test_a_tiny_rate_on_a_trace_names_the_rate_flag_not_a_speedup(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_bytes(_native([(0.0, 100, 10), (0.5, 200, 20), (1.0, 300, 30)]))
    line = _error(_cli("run", "--trace", str(trace), "--rate", "1e-300"))
    assert "speedup" not in line
    assert "--rate 1e-300:" in line and "use a higher --rate" in line
    line = _error(_cli("run", "--trace", str(trace), "--rate", "10000"))
    assert "speedup" not in line and "--rate 10000:" in line and "2,000 req/s" in line  # 1,000 x the recorded 2 req/s


def test_dashboard_trace_at_a_rate_it_cannot_replay_does_not_blame_the_file():
    sys.path.insert(0, str(ROOT / "tests" / "ui"))
    from uihelpers import run_page

    at = run_page(workload="trace", recorded="false", rate="10000", n="200")
    assert not at.exception
    msgs = [e.value for e in at.error]
    assert len(msgs) == 1, msgs
    assert "Fix the file" not in msgs[0] and "Skip bad rows" not in msgs[0]
    assert "request rate" in msgs[0] and "recorded" in msgs[0]


def test_a_known_architecture_with_mla_is_not_called_unsupported():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
           "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 14336,
           "vocab_size": 128256, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
           "v_head_dim": 128}
    with pytest.raises(ValueError) as info:
        parse_json_spec(json.dumps(cfg).encode(), "model")
    msg = str(info.value)
    assert "is not supported" not in msg, msg
    assert "LlamaForCausalLM has no multi-head latent attention" in msg
    assert "DeepseekV2ForCausalLM" in msg and "DeepseekV3ForCausalLM" in msg


def test_a_split_too_big_for_the_largest_fleet_does_not_suggest_more_nodes_than_allowed():
    line = _error(_cli("run", "--requests", "10", "--prefill-instances", "64", "--prefill-tp", "8",
                       "--decode-instances", "64", "--decode-tp", "8"))
    assert "--num-nodes 128" not in line
    assert "at most --num-nodes 64 (512 GPUs)" in line
    line = _error(_cli("run", "--requests", "10", "--prefill-instances", "2", "--prefill-tp", "8",
                       "--decode-instances", "2", "--decode-tp", "8"))
    assert "or --num-nodes 4" in line
