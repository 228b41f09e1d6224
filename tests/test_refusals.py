"""What no engine would run is refused, or (requests beyond the context) rejected as vLLM rejects them (issue 22,
items 10 and 15): MTP speculation on a model without MTP modules, a draft model of another tokenizer or not smaller
than the target, a draft's tensor parallelism other than 1 or the target's, and requests whose prompt plus output
exceed the model's context length."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from batching.cli.main import main
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.engine.speculative import accepted_drafts, check_spec, draft_deployment
from batching.sim.hardware.specs import MODELS, deployment, model_from_dict
from batching.sim.workload.requests import TraceWorkload

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ---------------------------------------------------------------- MTP needs MTP modules

def test_only_deepseek_v3_among_the_presets_has_mtp_modules():
    # the published configs: DeepSeek-V3's num_nextn_predict_layers is 1, Kimi-K2's 0, the others have none
    assert {k for k, m in MODELS.items() if m.mtp_layers > 0} == {"deepseek-v3"}


def test_mtp_on_a_model_without_mtp_modules_is_refused():
    pol = with_knobs(PRESETS["continuous"], spec_decode="mtp")
    with pytest.raises(ValueError) as info:
        check_spec(pol, deployment(model="qwen2.5-72b"))
    msg = str(info.value)
    assert "spec_decode='mtp'" in msg and "Qwen2.5-72B has no multi-token-prediction" in msg
    assert "deepseek-v3" in msg  # what is allowed
    with pytest.raises(ValueError, match="no multi-token-prediction"):
        simulate(Scenario(policy=pol))
    check_spec(pol, deployment(model="deepseek-v3", gpu="h200-sxm", precision="fp8"))  # accepted


def test_cli_refuses_mtp_without_mtp_modules_in_one_line():
    line = _one_line_error(_cli("run", "--requests", "20", "--spec-decode", "mtp"))
    assert "--spec-decode mtp:" in line and "Qwen2.5-72B" in line and "deepseek-v3" in line


# ---------------------------------------------------------------- drafts: same tokenizer, smaller

def test_each_model_accepts_the_smaller_presets_of_its_vocabulary():
    assert accepted_drafts(MODELS["qwen2.5-72b"]) == ["qwen2.5-7b", "qwen2.5-32b"]
    assert accepted_drafts(MODELS["qwen2.5-32b"]) == ["qwen2.5-7b"]
    assert accepted_drafts(MODELS["qwen2.5-7b"]) == []
    assert accepted_drafts(MODELS["llama-3.1-405b"]) == ["llama-3.1-8b", "llama-3.1-70b"]
    assert accepted_drafts(MODELS["llama-3.1-70b"]) == ["llama-3.1-8b"]
    assert accepted_drafts(MODELS["llama-3.1-8b"]) == []
    # Qwen3's vocabulary (151,936) is not Qwen2.5's (152,064): vLLM refuses such a pair
    assert accepted_drafts(MODELS["qwen3-30b-a3b"]) == []


@pytest.mark.parametrize("target, draft, why, allowed", [
    ("llama-3.1-70b", "qwen2.5-7b", "vocabulary of 152,064 tokens, not Llama-3.1-70B's 128,256", "llama-3.1-8b"),
    ("qwen2.5-32b", "qwen2.5-72b", "not smaller than Qwen2.5-32B", "qwen2.5-7b"),
    ("qwen2.5-32b", "qwen2.5-32b", "not smaller than Qwen2.5-32B", "qwen2.5-7b"),
    ("llama-3.1-8b", "llama-3.1-70b", "not smaller than Llama-3.1-8B", "none of the presets"),
])
def test_a_draft_of_another_tokenizer_or_not_smaller_is_refused(target, draft, why, allowed):
    pol = with_knobs(PRESETS["continuous"], spec_decode="draft", spec_draft_model=draft)
    dep = deployment(model=target, gpu="h200-sxm")
    with pytest.raises(ValueError) as info:
        check_spec(pol, dep)
    msg = str(info.value)
    assert msg.startswith(f"spec_draft_model='{draft}' cannot draft for {MODELS[target].name}") and why in msg, msg
    assert f"accepts: {allowed}" in msg, msg


def test_cli_draft_defaults_to_the_targets_family_and_refuses_another():
    from batching.cli.args import build_scenario
    from batching.cli.main import make_parser

    args = make_parser().parse_args(["run", "--spec-decode", "draft", "--model", "llama-3.1-70b"])
    assert build_scenario(args).policy.spec_draft_model == "llama-3.1-8b"  # was qwen2.5-7b: another tokenizer
    args = make_parser().parse_args(["run", "--spec-decode", "draft"])
    assert build_scenario(args).policy.spec_draft_model == "qwen2.5-7b"
    line = _one_line_error(_cli("run", "--requests", "20", "--model", "llama-3.1-70b", "--spec-decode", "draft",
                                "--spec-draft-model", "qwen2.5-7b"))
    assert line.split("error: ", 1)[1].startswith("--spec-draft-model qwen2.5-7b: cannot draft for Llama-3.1-70B")
    assert "accepts: llama-3.1-8b" in line
    line = _one_line_error(_cli("run", "--requests", "20", "--model", "llama-3.1-8b", "--num-gpus", "1", "--tp", "1",
                                "--spec-decode", "draft"))
    assert "--spec-decode draft:" in line and "no preset" in line and "eagle" in line


# ---------------------------------------------------------------- a draft's tensor parallelism (item 15)

@pytest.mark.parametrize("target, tp, draft, want", [
    ("qwen2.5-72b", 8, "qwen2.5-7b", 1),  # 28 heads do not split 8 ways: vLLM allows only 1 or the target's TP
    ("qwen2.5-72b", 4, "qwen2.5-7b", 4),
    ("qwen2.5-72b", 8, "qwen2.5-32b", 8),  # 40 heads split 8 ways
    ("llama-3.1-70b", 8, "llama-3.1-8b", 8),
    ("llama-3.1-70b", 2, "llama-3.1-8b", 2),
])
def test_a_draft_runs_at_tp_1_or_the_targets(target, tp, draft, want):
    dep = deployment(model=target, tp=tp, gpu="h200-sxm")
    got = draft_deployment(dep, draft).node.tp
    assert got == want and got in (1, tp)


# ---------------------------------------------------------------- context length: rejected, never simulated

def test_preset_context_lengths_are_their_configs_max_position_embeddings():
    got = {k: m.max_context_tokens for k, m in MODELS.items()}
    assert got == {"qwen2.5-72b": 32768, "llama-3.1-70b": 131072, "llama-3.1-8b": 131072, "qwen2.5-7b": 32768,
                   "qwen2.5-32b": 32768, "llama-3.1-405b": 131072, "mixtral-8x7b": 32768,
                   "qwen3-30b-a3b": 40960, "deepseek-v3": 163840, "kimi-k2": 131072}


def test_context_from_a_config_json_follows_vllm():
    base = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
            "vocab_size": 152064}
    assert model_from_dict(base).max_context_tokens == 0  # not stated: no limit
    assert model_from_dict(base | {"max_position_embeddings": 32768}).max_context_tokens == 32768
    # Qwen2.5's README: YaRN with factor 4 over 32,768 positions for 128k
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert model_from_dict(base | {"max_position_embeddings": 32768, "rope_scaling": yarn}).max_context_tokens == 131072
    # Llama 3.1's llama3 scaling leaves max_position_embeddings as it is; the smallest of the keys wins
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert model_from_dict(base | {"max_position_embeddings": 131072, "rope_scaling": llama3}
                           ).max_context_tokens == 131072
    assert model_from_dict(base | {"max_position_embeddings": 131072, "seq_length": 8192}).max_context_tokens == 8192
    assert model_from_dict(base | {"num_nextn_predict_layers": 2}).mtp_layers == 2


def _native(rows) -> bytes:
    return b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(f"{a},{p},{o}\n".encode() for a, p, o in rows)


LONG_ROWS = [(0.0, 200_000, 100), (0.1, 500, 50), (0.2, 32_000, 768), (0.3, 32_000, 769), (0.4, 800, 60)]


def test_requests_beyond_the_context_are_rejected_and_never_simulated():
    sc = Scenario(workload=TraceWorkload(_native(LONG_ROWS), "long.csv"), policy=PRESETS["chunked"])
    res = simulate(sc)
    s = res.summary()
    # 200,100 and 32,769 tokens pass Qwen2.5-72B's 32,768; 32,000 + 768 = 32,768 exactly is served (as vLLM does)
    assert s["rejected_requests"] == 2
    assert s["num_requests"] == 3
    assert sorted(res.requests["prompt_tokens"]) == [500, 800, 32_000]
    assert int((res.requests["prompt_tokens"] + res.requests["output_tokens"]).max()) <= 32_768
    assert s["by_priority"]["0"]["rejected_requests"] == 2
    assert s["max_context_tokens"] == 32_768
    # Llama-3.1-70B's 131,072 tokens serve every request but the 200,100-token one
    s70 = simulate(replace(sc, deployment=deployment(model="llama-3.1-70b"))).summary()
    assert (s70["rejected_requests"], s70["num_requests"]) == (1, 4)


def test_rejected_requests_count_per_class():
    from batching.sim.workload.requests import LengthDist, SyntheticWorkload, workload_preset

    wl = workload_preset("mixed", 2.0, 200, 0)
    long = LengthDist("uniform", mean=30_000, low=20_000, high=40_000)  # about half of them pass 32,768 + output
    wl = replace(wl, classes=tuple(replace(c, prompt=long) if c.priority == 1 else c for c in wl.classes))
    assert isinstance(wl, SyntheticWorkload)
    reqs = wl.generate()
    over = (reqs.prompt_tokens + reqs.output_tokens) > 32_768
    want = np.bincount(reqs.priority[over], minlength=2)
    assert want[0] == 0 and want[1] > 10
    s = simulate(Scenario(workload=wl, policy=PRESETS["chunked"])).summary()
    assert s["rejected_requests"] == int(want.sum())
    assert s["by_priority"]["0"]["rejected_requests"] == 0
    assert s["by_priority"]["1"]["rejected_requests"] == int(want[1])
    assert s["num_requests"] == len(reqs) - int(want.sum())


def test_every_request_beyond_the_context_is_an_error_naming_the_limit():
    sc = Scenario(workload=TraceWorkload(_native([(0.0, 40_000, 10), (1.0, 50_000, 10)]), "all_long.csv"))
    with pytest.raises(ValueError, match="all 2 requests need more than Qwen2.5-72B's context of 32,768 tokens"):
        simulate(sc)


def test_cli_prints_and_writes_the_rejected_count(tmp_path, capsys):
    trace = tmp_path / "long.csv"
    trace.write_bytes(_native(LONG_ROWS))
    out = tmp_path / "s.json"
    assert main(["run", "--trace", str(trace), "--preset", "chunked", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rejected_requests" in text and "2 requests rejected" in text and "32,768" in text
    s = json.loads(out.read_text())
    assert s["rejected_requests"] == 2 and s["by_priority"]["0"]["rejected_requests"] == 2
    line = _one_line_error(_cli("run", "--prompt-tokens", "40000", "--requests", "5"))
    assert "--prompt-tokens/--output-tokens" in line and "32,768" in line
