"""Launch commands for vLLM and SGLang from a simulated configuration (issue 24, item 7): exact commands."""
from dataclasses import replace

from batching.sim.hardware.specs import MODELS, Deployment, Node, GPUS
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario
from batching.sim.topology.disagg import Disagg
from batching.studies.launch import HF_IDS, config_launch, launch


def test_every_preset_model_has_a_huggingface_id():
    assert {m.name for m in MODELS.values()} <= set(HF_IDS)
    assert HF_IDS["Qwen2.5-72B"] == "Qwen/Qwen2.5-72B-Instruct"


def test_the_default_scenario_continuous_preset():
    cmd = launch(Scenario())
    assert cmd["vllm"] == (
        "# vLLM 0.11: Qwen2.5-72B on 8x H100 SXM 80GB\n"
        "vllm serve Qwen/Qwen2.5-72B-Instruct \\\n"
        "  --tensor-parallel-size 8 \\\n"
        "  --max-model-len 32768 \\\n"
        "  --gpu-memory-utilization 0.9 \\\n"
        "  --max-num-seqs 256 \\\n"
        "  --max-num-batched-tokens 32768 \\\n"
        "  --no-enable-chunked-prefill \\\n"
        "  --enable-prefix-caching")
    assert cmd["sglang"] == (
        "# SGLang 0.5.3: Qwen2.5-72B on 8x H100 SXM 80GB\n"
        "python -m sglang.launch_server --model-path Qwen/Qwen2.5-72B-Instruct \\\n"
        "  --tp-size 8 \\\n"
        "  --context-length 32768 \\\n"
        "  --mem-fraction-static 0.9 \\\n"
        "  --max-running-requests 256 \\\n"
        "  --chunked-prefill-size 32768 \\\n"
        "  --enable-mixed-chunk \\\n"
        "  --max-prefill-tokens 32768 \\\n"
        "  --schedule-policy fcfs")


def test_tp2_replicas_fp8_chunked_priority_and_ngram():
    dep = Deployment(Node(GPUS["h100-sxm"], 8, 2), MODELS["llama-3.1-8b"], "fp8", "fp8")
    pol = with_knobs(PRESETS["priority"], max_num_seqs=128, spec_decode="ngram", spec_tokens=4,
                     spec_disable_batch_size=32, prefix_caching=False)
    cmd = launch(Scenario(dep, policy=pol))
    assert cmd["vllm"] == (
        "# vLLM 0.11: Llama-3.1-8B on 8x H100 SXM 80GB\n"
        "# priority: each request's class goes in its \"priority\" field (lower runs first)\n"
        "# the simulation's acceptance rate A=0.8 is an input, not a flag\n"
        "vllm serve meta-llama/Llama-3.1-8B-Instruct \\\n"
        "  --tensor-parallel-size 2 \\\n"
        "  --data-parallel-size 4 \\\n"
        "  --max-model-len 131072 \\\n"
        "  --gpu-memory-utilization 0.9 \\\n"
        "  --quantization fp8 \\\n"
        "  --kv-cache-dtype fp8 \\\n"
        "  --max-num-seqs 128 \\\n"
        "  --max-num-batched-tokens 2048 \\\n"
        "  --enable-chunked-prefill \\\n"
        "  --no-enable-prefix-caching \\\n"
        "  --scheduling-policy priority \\\n"
        "  --speculative-config "
        "'{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":4,\"disable_by_batch_size\":32}'")
    sg = cmd["sglang"]
    assert "--tp-size 2 \\\n  --dp-size 4" in sg and "--quantization fp8" in sg and "--kv-cache-dtype fp8_e4m3" in sg
    assert "--chunked-prefill-size 2048" in sg and "--disable-radix-cache" in sg and "--max-running-requests 128" in sg
    assert "speculative decoding 'ngram' is left out" in sg and "--speculative" not in sg


def test_deepseek_mtp_published_in_fp8_has_no_quantization_flag():
    dep = Deployment(Node(GPUS["h200-sxm"], 8, 8), MODELS["deepseek-v3"], "fp8")
    cmd = launch(Scenario(dep, policy=with_knobs(PRESETS["chunked"], spec_decode="mtp", spec_tokens=1)))
    assert "--quantization" not in cmd["vllm"] and "--quantization" not in cmd["sglang"]
    assert cmd["vllm"].endswith("--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'")
    assert cmd["sglang"].endswith("--speculative-algorithm NEXTN \\\n  --speculative-num-steps 1 \\\n"
                                  "  --speculative-eagle-topk 1 \\\n  --speculative-num-draft-tokens 2")
    assert "vllm serve deepseek-ai/DeepSeek-V3" in cmd["vllm"] and "--max-num-batched-tokens 2048" in cmd["vllm"]


def test_an_acceptance_length_is_named_as_an_input_on_both_engines_and_both_roles_of_a_split():
    """DeepSeek-V3 MTP (K = 1) with PD, the acceptance given as engines report it: 1.85 tokens per verification is
    A = 0.85 at K = 1; each command's notes say it is an input and which log line reports it; both roles of the
    split get the speculative flags (SGLang's prefill server runs the MTP module over the prompt)."""
    dep = Deployment(Node(GPUS["h200-sxm"], 8, 8), MODELS["deepseek-v3"], "fp8")
    pol = with_knobs(PRESETS["chunked"], spec_decode="mtp", spec_tokens=1, spec_acceptance_length=1.85)
    cmd = launch(Scenario(dep, policy=pol, nodes=2, disagg=Disagg(1, 8, 1, 8)))
    note = ("# the simulation's mean acceptance length 1.85 tokens per verification step (A=0.85 per token at K=1) is "
            "an input, not a flag; ")
    v, s = cmd["vllm"], cmd["sglang"]
    assert v.count(note + 'vLLM logs it as its spec-decode "Mean acceptance length"') == 2
    assert s.count(note + 'SGLang logs it as "accept len" in its decode batch lines') == 2
    assert "acceptance rate A=" not in v
    assert v.count("--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'") == 2
    assert s.count("--speculative-algorithm NEXTN") == 2
    # without a length, A is named as before
    assert "acceptance rate A=0.8 is an input" in launch(Scenario(dep, policy=replace(pol, spec_acceptance_length=0.0)))["vllm"]


def test_static_and_dynamic_say_they_have_no_engine_equivalent():
    for name in ("static", "dynamic"):
        cmd = launch(Scenario(policy=PRESETS[name]))
        first = cmd["vllm"].splitlines()[1]
        assert first.startswith(f"# {name} batching") and "has no vLLM equivalent" in first
        assert "has no SGLang equivalent" in cmd["sglang"]
        assert f"--max-num-seqs {PRESETS[name].max_batch_size}" in cmd["vllm"]
        assert "--max-num-batched-tokens" not in cmd["vllm"] and "--enable-chunked-prefill" not in cmd["vllm"]


def test_disaggregation_gives_one_command_per_instance_with_the_connector():
    cmd = launch(Scenario(disagg=Disagg(2, 2, 1, 4)))
    v, s = cmd["vllm"], cmd["sglang"]
    assert v.count("vllm serve ") == 3 and v.count(
        "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' &") == 3
    assert "# prefill 1: TP 2 on GPUs 0,1\nCUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm serve" in v
    assert "# decode 1: TP 4 on GPUs 4,5,6,7\nCUDA_VISIBLE_DEVICES=4,5,6,7 VLLM_NIXL_SIDE_CHANNEL_PORT=5604 " in v
    assert "--disaggregation-mode prefill" in s and "--disaggregation-mode decode" in s
    assert s.count("--disaggregation-transfer-backend nixl") == 3


def test_a_fleet_and_a_kv_cap_are_named():
    sc = replace(Scenario(deployment=Deployment(kv_cache_tokens=50000)), nodes=3, router="least-outstanding")
    cmd = launch(sc)
    assert "# on each of the 3 nodes (3 replicas in all) behind your load balancer" in cmd["vllm"]
    assert "caps the KV cache at 50,000 tokens" in cmd["vllm"] and "--max-total-tokens 50000" in cmd["sglang"]


def test_a_search_row_gets_its_commands():
    row = {"gpu": "h200-sxm", "precision": "bf16", "tp": 4, "policy": "chunked",
           "knobs": {"max_num_seqs": 512, "max_num_batched_tokens": 4096}, "nodes_needed": 2,
           "router": "least-outstanding"}
    cmd = config_launch(Scenario(), row)
    assert "--tensor-parallel-size 4 \\\n  --data-parallel-size 2" in cmd["vllm"]
    assert "--max-num-seqs 512 \\\n  --max-num-batched-tokens 4096 \\\n  --enable-chunked-prefill" in cmd["vllm"]
    assert "8x H200" in cmd["vllm"] and "on each of the 2 nodes (4 replicas in all)" in cmd["vllm"]
    assert "--chunked-prefill-size 4096" in cmd["sglang"]
