"""The continuous preset's step budget as vLLM V0 sizes it without chunked prefill: max(max_model_len, 2048) (issue 24,
item 9). An explicit max_num_batched_tokens still wins and still errors when below the longest prompt."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from batching.cli.main import main
from batching.sim.hardware.specs import MODELS, Deployment
from batching.sim.policy import PRESETS, V0_MIN_BUDGET, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import TraceWorkload

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"


def test_the_continuous_preset_takes_the_models_context_as_its_budget():
    assert V0_MIN_BUDGET == 2048
    sc = Scenario()  # Qwen2.5-72B: max_model_len 32,768
    assert sc.policy.max_num_batched_tokens == 32768
    assert "max(max_model_len, 2048) = 32,768 tokens/step as vLLM V0 sizes it" in sc.policy.describe()
    llama = Scenario(deployment=Deployment(model=MODELS["llama-3.1-70b"]))
    assert llama.policy.max_num_batched_tokens == 131072
    # another model through with_deployment is sized again, from its own context
    assert sc.with_deployment(llama.deployment).policy.max_num_batched_tokens == 131072
    # a model with no stated context: at least 2048, and at least the longest prompt once the requests are known
    ctx0 = replace(MODELS["qwen2.5-72b"], max_context_tokens=0)
    assert PRESETS["continuous"].sized_for(0, 100).max_num_batched_tokens == 2048
    assert PRESETS["continuous"].sized_for(0, 5000).max_num_batched_tokens == 5000
    assert Scenario(deployment=Deployment(model=ctx0)).policy.max_num_batched_tokens == 2048


def test_chunked_and_explicit_budgets_are_kept():
    assert Scenario(policy=PRESETS["chunked"]).policy.max_num_batched_tokens == 2048
    mine = with_knobs(PRESETS["continuous"], max_num_batched_tokens=8192)
    assert not mine.budget_from_context
    assert Scenario(policy=mine).policy.max_num_batched_tokens == 8192
    assert "8192 tokens/step" in mine.describe()


def test_compare_chat_with_a_2000_token_shared_prefix_runs(tmp_path, capsys):
    # failed before: "max_num_batched_tokens=8192 is below the longest prompt"
    out = tmp_path / "c.json"
    rc = main(["compare", "--workload", "chat", "--shared-prefix-tokens", "2000", "--requests", "300",
               "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    text = json.dumps(doc)
    assert "below the longest prompt" not in text
    assert "continuous" in text
    assert doc["continuous"]["num_requests"] == 300 and doc["continuous"]["throughput_output_tok_s"] > 0


def test_the_shipped_mooncake_trace_runs_on_the_default_preset():
    wl = TraceWorkload.from_path(MOONCAKE, max_requests=40)
    res = simulate(Scenario(workload=wl))
    s = res.summary()
    assert s["num_requests"] + s["rejected_requests"] == 40
    assert res.scenario.policy.max_num_batched_tokens == 32768
    assert int(res.requests.prompt_tokens.max()) > 8192  # the prompt the old 8,192-token budget refused


def test_an_explicit_budget_below_the_longest_prompt_still_errors(capsys):
    wl = TraceWorkload.from_path(MOONCAKE, max_requests=40)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=8192 is below the longest prompt"):
        simulate(Scenario(workload=wl, policy=with_knobs(PRESETS["continuous"], max_num_batched_tokens=8192)))
    rc = main(["run", "--workload", "chat", "--shared-prefix-tokens", "2000", "--requests", "40",
               "--max-num-batched-tokens", "1024"])
    err = capsys.readouterr().err
    assert rc != 0 and "max_num_batched_tokens=1024" in err and "Traceback" not in err


def test_the_cli_sizes_a_disaggregated_prefill_budget_from_the_context(tmp_path):
    # the split's prefill instances run the preset's budget: chat prompts after a 6,000-token shared prompt (over 8,192)
    out = tmp_path / "d.json"
    rc = main(["run", "--workload", "chat", "--shared-prefix-tokens", "6000", "--requests", "30", "--prefill-tp", "4",
               "--decode-tp", "4", "--prefill-instances", "1", "--decode-instances", "1", "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["num_requests"] == 30


def test_a_model_without_a_stated_context_gets_its_longest_prompt(tmp_path):
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
          "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    (tmp_path / "m.json").write_text(json.dumps(hf))
    out = tmp_path / "s.json"
    assert main(["run", "--model-json", str(tmp_path / "m.json"), "--tp", "1", "--requests", "20", "--json",
                 str(out)]) == 0
    assert json.loads(out.read_text())["num_requests"] == 20
    ctx0 = replace(MODELS["qwen2.5-72b"], max_context_tokens=0)
    res = simulate(Scenario(deployment=Deployment(model=ctx0), workload=TraceWorkload.from_path(MOONCAKE,
                                                                                               max_requests=12)))
    assert res.scenario.policy.max_num_batched_tokens == int(res.requests.prompt_tokens.max()) > 8192


def test_a_sized_preset_is_still_named_as_its_preset():
    from batching.report import policy_label

    sized = Scenario().policy
    assert sized != PRESETS["continuous"] and sized.unsized() == PRESETS["continuous"]
    assert policy_label(sized) == "continuous"
    assert with_knobs(PRESETS["continuous"], max_num_batched_tokens=4096).unsized() != PRESETS["continuous"]
