"""Messages that say what to change, and outputs that cannot be misdirected (issue 22, items 11 and 12): each
message below used to point at a fix that could not work (a flag at its maximum, a flag the CLI lacks, a file that
was fine, an architecture it then listed as supported, a node count above the maximum); output files are written
all or nothing, never through a symlink; the URL and the CLI read numbers alike; the README says what the code
writes and reads."""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batching.cli.args import float_arg, int_arg
from batching.sim.hardware.specs import HF_ARCHITECTURES, parse_json_spec
from batching.ui.params import Param

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=preexec)


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


def _limit_file_size():
    """A child whose files cannot grow past 2 MB (writes past it fail with EFBIG, as on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))


def test_report_that_cannot_write_names_the_file_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    p = _cli("report", "--requests", "30", "--no-png", "--out", str(out), preexec=_limit_file_size)
    line = _error(p)
    assert "explore_report.html" in line and "nothing was written" in line, line  # the 5 MB HTML report
    assert sorted(os.listdir(out)) == []  # no half-written folder, no temporary file left


def test_report_checks_its_file_names_before_simulating(tmp_path):
    out = tmp_path / "out"
    (out / "explore_summary.json").mkdir(parents=True)
    p = _cli("report", "--requests", "30", "--no-png", "--out", str(out))
    line = _error(p)
    assert "explore_summary.json" in line and "a folder" in line
    assert "files in" not in p.stderr  # refused before the run
    assert sorted(os.listdir(out)) == ["explore_summary.json"]


# ---------------------------------------------------------------- item 12: symlinks, numbers, README

def test_outputs_replace_a_symlink_in_the_output_folder_never_follow_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    csv_dir, out_dir = tmp_path / "csv", tmp_path / "report"
    csv_dir.mkdir()
    out_dir.mkdir()
    links = [csv_dir / "requests.csv", out_dir / "explore_summary.json", tmp_path / "s.json"]
    for link in links:
        link.symlink_to(outside)
    from batching.cli.main import main

    assert main(["run", "--requests", "20", "--csv", str(csv_dir), "--json", str(links[2])]) == 0
    assert main(["report", "--requests", "20", "--no-png", "--out", str(out_dir)]) == 0
    assert outside.read_text() == "keep me"
    for link in links:
        assert not link.is_symlink() and link.is_file() and link.stat().st_size > 100


NUMBER_TEXTS = ["10", "1e3", " 12 ", "1_000", "１０", "1,000", "2.5", "nan", "inf", "-3", "0x10", "", "ten", "١٢"]


def test_the_url_and_the_cli_accept_the_same_numbers():
    """The same texts are numbers to both (a link corrects an out-of-range or fractional count with a notice where
    the CLI refuses it, as before: that is range, not syntax), and both read them as the same value."""
    import argparse

    n = Param("n", 2000, 1, 1_000_000, label="number of requests")
    rate = Param("rate", 1.0, 0.1, 10_000.0, label="request rate")
    for param, cli in ((n, int_arg(1, 1_000_000)), (rate, float_arg(0.1, 10_000.0))):
        for text in NUMBER_TEXTS:
            try:
                cli_value, cli_syntax = cli(text), True
            except argparse.ArgumentTypeError as exc:
                cli_value, cli_syntax = None, "out of range" in str(exc) or "not a whole number" in str(exc)
            url_value, url_note = param.parse(text)
            url_syntax = url_note is None or "is not valid" not in url_note
            assert cli_syntax == url_syntax, (param.key, text, cli_value, url_value, url_note)
            if cli_value is not None:
                assert url_value == cli_value and url_note is None, (param.key, text, cli_value, url_value, url_note)
    # full-width digits: refused by both, and both say why in the same words
    value, note = n.parse("１０")
    assert value == 2000 and "has characters other than ASCII (full-width digits?)" in note
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("has characters other than ASCII (full-width "
                                                                   "digits?)")):
        int_arg(1, 10)("１０")


def test_readme_names_the_files_report_writes(tmp_path):
    from batching.cli.main import main

    out = tmp_path / "o"
    assert main(["report", "--requests", "20", "--no-png", "--out", str(out)]) == 0
    written = set(os.listdir(out))
    from batching import report as rep
    from batching.sim.simulate import Scenario, simulate
    from batching.sim.workload.requests import workload_preset

    export = rep.explore_export(simulate(Scenario(workload=workload_preset("mixed", 1.0, 20, 0))), "continuous")
    pngs = set(export.png_names().values())
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Figures for documents", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"`([\w.]+\.(?:png|csv|json|html))`", section))
    assert named == written | pngs, (named ^ (written | pngs))


def test_readme_and_help_name_the_architectures_model_json_reads():
    readme = (ROOT / "README.md").read_text()
    para = readme.split("`--model-json` reads", 1)[1].split("\n\n", 1)[0]
    for arch in HF_ARCHITECTURES:
        assert f"`{arch}`" in para, arch
    assert "DeepSeek's MLA" not in para  # it loads DeepSeek-V2/V3 with MLA
    from batching.cli.main import make_parser

    helptext = " ".join(make_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    for arch in HF_ARCHITECTURES:
        assert arch in helptext, arch
    assert "max_position_embeddings" in helptext
