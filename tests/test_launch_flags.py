"""Commands that do what was simulated (issue 39, item 8): every flag any configuration emits is one its engine
version defines (tests/data/engine_flags.json, read from each engine's own argument definitions), SGLang mixes
chunks when the chunked preset does, its own profile keeps its chunk size, TensorRT-LLM gets a trtllm-serve command,
priority scheduling has SGLang's flags, and docs/LAUNCH.md names the defaults the engines have."""
import json
from dataclasses import replace
import re
from pathlib import Path

import pytest

from batching.sim.hardware.engines import ENGINES
from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario
from batching.sim.topology.disagg import Disagg
from batching.studies.launch import launch
from launchrun import options, program, run_set

ROOT = Path(__file__).resolve().parents[1]
FLAGS = json.loads((ROOT / "tests" / "data" / "engine_flags.json").read_text())
H100_70B = Deployment(Node(GPUS["h100-sxm"], 8, 4), MODELS["llama-3.1-70b"], "fp8", "fp8", kv_cache_tokens=400000)
DSV3 = Deployment(Node(GPUS["h200-sxm"], 8, 8), MODELS["deepseek-v3"], "fp8")
TP16 = Deployment(Node(GPUS["h100-sxm"], 16, 16), MODELS["llama-3.1-405b"], "fp8")


def _configurations():
    for engine in ENGINES:
        for name, pol in PRESETS.items():
            yield Scenario(H100_70B, policy=pol, engine=engine)
        yield Scenario(H100_70B, policy=ENGINES[engine].policy, engine=engine)  # --preset engine
    yield Scenario(H100_70B, policy=with_knobs(PRESETS["chunked"], preemption="swap", spec_decode="ngram",
                                               spec_disable_batch_size=32), nodes=3)
    yield Scenario(H100_70B, policy=with_knobs(PRESETS["continuous"], preemption="off", prefix_caching=False))
    for spec in ("eagle", "draft"):
        yield Scenario(Deployment(Node(GPUS["h100-sxm"], 8, 8), MODELS["llama-3.1-70b"]),
                       policy=with_knobs(PRESETS["chunked"], spec_decode=spec, spec_tokens=3))
    yield Scenario(DSV3, policy=with_knobs(PRESETS["chunked"], spec_decode="mtp", spec_tokens=1,
                                           spec_acceptance_length=1.8), nodes=2, disagg=Disagg(1, 8, 1, 8))
    yield Scenario(TP16, policy=PRESETS["chunked"], engine="trtllm")
    yield Scenario(policy=PRESETS["priority"], disagg=Disagg(3, 2, 1, 2))


def _yaml_keys(text: str) -> set[str]:
    keys, parent = set(), ""
    for line in text.splitlines():
        key = line.strip().split(":")[0]
        if line.startswith("  "):
            keys.add(f"{parent}.{key}")
        elif line.endswith(":"):
            parent = key
        else:
            keys.add(key)
    return keys


def test_every_emitted_flag_is_one_its_engine_defines(tmp_path):
    seen = {k: set() for k in FLAGS if k != "about"}
    for sc in _configurations():
        for engine, text in launch(sc).items():
            for p in run_set(text, tmp_path):
                prog = program(p)
                flags = {w for w in p["argv"] if w.startswith("--")}
                unknown = flags - set(FLAGS[prog]["flags"])
                assert not unknown, (prog, sorted(unknown), text)
                seen[prog] |= flags
                env = set(p["env"]) - set(FLAGS.get(prog, {}).get("env", ["CUDA_VISIBLE_DEVICES"]))
                assert not env, (prog, env)
                o = options(p["argv"])
                for flag, keys in (("--speculative-config", "speculative_config_keys"),
                                   ("--kv-transfer-config", "kv_transfer_config_keys")):
                    for (value,) in o.get(flag, []):
                        assert set(json.loads(value)) <= set(FLAGS["vllm"][keys]), (flag, value)
                if prog == "trtllm":
                    yaml = (tmp_path / o["--extra_llm_api_options"][0][0]).read_text()
                    assert _yaml_keys(yaml) <= set(FLAGS["trtllm"]["extra_llm_api_options_keys"]), yaml
    # every program was exercised: the check above covered each engine's commands
    assert all(seen.values()), {k: len(v) for k, v in seen.items()}


def test_the_chunked_preset_mixes_prefill_and_decode_in_sglang():
    s = launch(Scenario(policy=PRESETS["chunked"]))["sglang"]
    assert "--chunked-prefill-size 2048 \\\n  --enable-mixed-chunk" in s
    # EAGLE turns SGLang's mixed chunks off: the command does not pretend otherwise
    eagle = launch(Scenario(policy=with_knobs(PRESETS["chunked"], spec_decode="eagle")))["sglang"]
    assert "\n  --enable-mixed-chunk" not in eagle and "SGLang runs speculative decoding without mixed chunks" in eagle
    # the prefill-only rule (vLLM V0, SGLang's own separate prefill batches) mixes nothing
    v0 = replace(PRESETS["continuous"], prefill_only_steps=True)
    assert "--enable-mixed-chunk" not in launch(Scenario(policy=v0))["sglang"]


@pytest.mark.parametrize("gpu, chunk", [("h100-sxm", 8192), ("h200-sxm", 8192), ("b200", 16384)])
def test_sglangs_own_profile_keeps_its_chunk_size(gpu, chunk):
    sc = Scenario(Deployment(Node(GPUS[gpu], 8, 8)), policy=ENGINES["sglang"].policy, engine="sglang")
    s = launch(sc)["sglang"]
    assert "--chunked-prefill-size -1" not in s
    assert f"--chunked-prefill-size {chunk} \\\n  --max-prefill-tokens 16384" in s
    assert "--max-running-requests 4096" in s and "--enable-mixed-chunk" not in s


def test_the_trtllm_engine_gets_a_trtllm_serve_command(tmp_path):
    sc = Scenario(H100_70B, policy=PRESETS["chunked"], engine="trtllm")
    cmd = launch(sc)
    assert list(cmd) == ["trtllm", "vllm", "sglang"]
    procs = sorted(run_set(cmd["trtllm"], tmp_path), key=lambda p: options(p["argv"])["--port"])  # any order
    assert [program(p) for p in procs] == ["trtllm", "trtllm"]  # TP 4 on 8 GPUs: two replicas
    for p, gpus, port in zip(procs, ("0,1,2,3", "4,5,6,7"), ("8000", "8001")):
        o = options(p["argv"])
        assert p["argv"][0] == "meta-llama/Llama-3.1-70B-Instruct" and p["env"]["CUDA_VISIBLE_DEVICES"] == gpus
        assert o["--port"] == [[port]] and o["--tp_size"] == [["4"]] and o["--backend"] == [["pytorch"]]
        assert o["--max_batch_size"] == [["256"]] and o["--max_num_tokens"] == [["2048"]]
        assert o["--max_seq_len"] == [["131072"]]
    yaml = (tmp_path / "extra-llm-api-config.yml").read_text()
    assert yaml == "enable_chunked_prefill: true\nkv_cache_config:\n  enable_block_reuse: true\n  dtype: fp8\n"
    # the vLLM and SGLang sets say the simulation ran another engine's profile
    assert "the simulation ran the TensorRT-LLM 1.0 profile" in cmd["vllm"]
    # vLLM's default engine has no TensorRT-LLM command
    assert "trtllm" not in launch(Scenario(H100_70B))


def test_sglang_priority_scheduling_has_its_flags():
    """The priority preset preempts only when a running request needs blocks (vLLM V1): SGLang's default preemption
    threshold (10, server_args.py) keeps a waiting request of class 0 from preempting class 1; the waiting-side rule
    (preempt_for_waiting) is threshold 0."""
    s = launch(Scenario(policy=PRESETS["priority"]))["sglang"]
    assert "--schedule-policy fcfs \\\n  --enable-priority-scheduling \\\n  --schedule-low-priority-values-first" in s
    assert "--priority-scheduling-preemption-threshold" not in s
    assert "no SGLang" not in s
    s = launch(Scenario(policy=replace(PRESETS["priority"], preempt_for_waiting=True)))["sglang"]
    assert "--schedule-low-priority-values-first \\\n  --priority-scheduling-preemption-threshold 0" in s


def test_continuous_preset_mixes_whole_prompts_in_both_engines():
    """The continuous preset is vLLM V1 without chunked prefill: whole prompts mixed with the decodes. vLLM: its
    --no-enable-chunked-prefill; SGLang mixes only with chunked prefill, so a chunk of the whole budget (never
    splitting a prompt) and --enable-mixed-chunk. The prefill-only rule keeps SGLang's separate prefill batches."""
    sc = Scenario(policy=PRESETS["continuous"])
    cmd = launch(sc)
    assert "--no-enable-chunked-prefill" in cmd["vllm"]
    budget = sc.policy.max_num_batched_tokens
    assert f"--chunked-prefill-size {budget} \\\n  --enable-mixed-chunk" in cmd["sglang"]
    v0 = launch(Scenario(policy=replace(PRESETS["continuous"], prefill_only_steps=True)))["sglang"]
    assert "--chunked-prefill-size -1" in v0 and "--enable-mixed-chunk" not in v0


def test_launch_md_names_the_engines_defaults_and_known_flags():
    doc = (ROOT / "docs" / "LAUNCH.md").read_text()
    # SGLang 0.5.3's default schedule_policy is fcfs (server_args.py), as engines.SGLANG_POLICY says
    for m in re.finditer(r"SGLang's default is `?(\w+)`?", doc):
        assert m.group(1) == FLAGS["sglang"]["defaults"]["schedule_policy"], m.group(0)
    known = set().union(*(set(v["flags"]) for k, v in FLAGS.items() if k != "about"))
    cells = [row.split("|")[2] for row in doc.splitlines() if row.startswith("| ") and row.count("|") >= 4]
    named = {f for cell in cells for span in re.findall(r"`([^`]+)`", cell)
             for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]+)", span)}  # the flag column of every table
    assert len(named) > 30 and not named - known, sorted(named - known)
