"""Launch commands for a simulated configuration: the vLLM and SGLang servers that run it (issue 24, item 7).

``launch(scenario)`` -> ``{"vllm": str, "sglang": str}``: one shell command each (lines joined by `` \\``), with ``#``
comment lines above it where the simulated policy has no flag in that engine (static and dynamic batching, swap
preemption in vLLM V1, ...). Every flag is one the named engine version documents (docs/LAUNCH.md cites the page of
each); nothing is emitted for a knob the engine lacks. Figures come from the scenario itself (its deployment, policy,
split and fleet), never from defaults of this module.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import replace

from batching.sim.engine.speculative import acceptance_from_length
from batching.sim.hardware.specs import MODELS, PUBLISHED_PRECISION, Deployment, Model
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario
from batching.studies.search import Config, config_scenario

VLLM_VERSION = "0.11"  # vllm serve, V1 engine (docs.vllm.ai/en/stable/cli/serve.html)
SGLANG_VERSION = "0.5"  # python -m sglang.launch_server (docs.sglang.ai/advanced_features/server_arguments.html)
# the preset models' HuggingFace ids (the config.json batching/sim/hardware/specs.py MODELS read), by Model.name
HF_IDS = {
    "Qwen2.5-72B": "Qwen/Qwen2.5-72B-Instruct",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen2.5-32B": "Qwen/Qwen2.5-32B-Instruct",
    "Llama-3.1-405B": "meta-llama/Llama-3.1-405B-Instruct",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "Kimi-K2": "moonshotai/Kimi-K2-Instruct",
}
EAGLE_HEAD = "PATH/TO/EAGLE_HEAD"  # an EAGLE draft head trained for the target: no preset names one
SGLANG_KV_FP8 = "fp8_e4m3"  # SGLang's --kv-cache-dtype takes fp8_e5m2 or fp8_e4m3 (vLLM's fp8 is e4m3)


def model_id(model: Model) -> str:
    """The HuggingFace id of a preset model; a custom model's name stands for its path."""
    return HF_IDS.get(model.name, f"PATH/TO/{model.name}")


def _cmd(head: str, flags: list[str], comments: list[str]) -> str:
    lines = [f"# {c}" for c in comments]
    body = [head] + flags
    lines.append(" \\\n  ".join(body))
    return "\n".join(lines)


def _common_notes(sc: Scenario, dp: int) -> list[str]:
    notes = []
    if sc.deployment.node.cross_node:
        notes.append(f"one TP {sc.deployment.node.tp} replica over {sc.deployment.node.physical_nodes} nodes of "
                     f"{sc.deployment.node.num_gpus // sc.deployment.node.physical_nodes} GPUs")
    if sc.nodes > 1:
        notes.append(f"on each of the {sc.nodes} nodes ({sc.nodes * dp} replicas in all) behind your load balancer "
                     f"(the simulation routes {sc.router})")
    return notes


# ---------------------------------------------------------------- vLLM


def _acceptance_note(pol: BatchingPolicy, where: str) -> str:
    """The note for an acceptance given as engines report it (``spec_acceptance_length``): it is an input, where the
    engine reports it, and the per-token A it stands for (speculative.acceptance_from_length)."""
    a = acceptance_from_length(float(pol.spec_acceptance_length), int(pol.spec_tokens))
    return (f"the simulation's mean acceptance length {pol.spec_acceptance_length:g} tokens per verification step "
            f"(A={a:.3g} per token at K={int(pol.spec_tokens)}) is an input, not a flag; {where}")


def _vllm_spec(pol: BatchingPolicy, dep: Deployment) -> tuple[list[str], list[str]]:
    if pol.spec_decode == "off":
        return [], []
    k = int(pol.spec_tokens)
    cfg: dict = {}
    notes = []
    if pol.spec_decode == "eagle":
        cfg = {"method": "eagle", "model": EAGLE_HEAD, "num_speculative_tokens": k}
        notes.append(f"EAGLE: {EAGLE_HEAD} is an EAGLE draft head trained for {dep.model.name}")
    elif pol.spec_decode == "ngram":
        cfg = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}
    elif pol.spec_decode == "mtp":
        cfg = {"method": "mtp", "num_speculative_tokens": k}
    elif pol.spec_decode == "draft":
        draft = MODELS.get(pol.spec_draft_model)
        cfg = {"model": model_id(draft) if draft else pol.spec_draft_model, "num_speculative_tokens": k}
        notes.append(f"a separate draft model: vLLM {VLLM_VERSION}'s V1 engine runs EAGLE, MTP and ngram proposers; "
                     "check that your version takes a draft model before relying on this")
    if pol.spec_disable_batch_size:
        cfg["disable_by_batch_size"] = int(pol.spec_disable_batch_size)
    notes.append(_acceptance_note(pol, "vLLM logs it as its spec-decode \"Mean acceptance length\"")
                 if pol.spec_acceptance_length > 0 else
                 f"the simulation's acceptance rate A={pol.spec_acceptance:g} is an input, not a flag")
    return ["--speculative-config " + shlex.quote(json.dumps(cfg, separators=(",", ":")))], notes


def _vllm_flags(sc: Scenario, tp: int, dp: int) -> tuple[list[str], list[str]]:
    dep, pol = sc.deployment, sc.policy
    flags = [f"--tensor-parallel-size {tp}"]
    if dp > 1:
        flags.append(f"--data-parallel-size {dp}")
    if dep.model.max_context_tokens:
        flags.append(f"--max-model-len {dep.model.max_context_tokens}")
    flags.append(f"--gpu-memory-utilization {dep.gpu_memory_utilization:g}")
    if dep.precision == "fp8" and PUBLISHED_PRECISION.get(_preset_key(dep.model)) != "fp8":
        flags.append("--quantization fp8")
    if dep.kv_dtype == "fp8":
        flags.append("--kv-cache-dtype fp8")
    notes: list[str] = []
    if dep.kv_cache_tokens is not None:
        notes.append(f"the simulation caps the KV cache at {dep.kv_cache_tokens:,} tokens per replica "
                     "(vLLM sizes it from --gpu-memory-utilization)")
    if pol.mode != "continuous":
        what = ("static batching (a batch runs to completion)" if pol.mode == "static"
                else f"dynamic batching (max wait {pol.max_wait_s * 1e3:g} ms)")
        notes.append(f"{what} has no vLLM equivalent: vLLM batches every step (continuous batching); "
                     f"--max-num-seqs {pol.max_batch_size} keeps the simulated batch cap")
        flags.append(f"--max-num-seqs {pol.max_batch_size}")
        flags.append("--no-enable-prefix-caching")
        return flags, notes
    flags.append(f"--max-num-seqs {pol.max_num_seqs}")
    flags.append(f"--max-num-batched-tokens {pol.max_num_batched_tokens}")
    flags.append("--enable-chunked-prefill" if pol.chunked_prefill else "--no-enable-chunked-prefill")
    flags.append("--enable-prefix-caching" if pol.prefix_caching else "--no-enable-prefix-caching")
    if pol.priority:
        flags.append("--scheduling-policy priority")
        notes.append("priority: each request's class goes in its \"priority\" field (lower runs first)")
    if pol.preemption == "swap":
        flags.append(f"--swap-space {pol.swap_space_gib:g}")
        notes.append(f"swap preemption: vLLM {VLLM_VERSION} (V1) preempts by recompute; --swap-space sizes the CPU "
                     "swap space per GPU that V0 swapped into")
    elif pol.preemption == "off":
        notes.append("preemption off has no vLLM flag: vLLM preempts by recompute when the KV cache runs out")
    spec, spec_notes = _vllm_spec(pol, dep)
    return flags + spec, notes + spec_notes


def vllm_command(sc: Scenario) -> str:
    dep = sc.deployment
    head = f"vllm serve {model_id(dep.model)}"
    if sc.disagg is not None:
        d = sc.disagg
        kv = shlex.quote(json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":")))
        out = [f"# vLLM {VLLM_VERSION}: prefill/decode disaggregation over NIXL; a proxy sends each request to a "
               "prefill instance, then to a decode instance (vLLM's disaggregated-serving examples)"]
        for role, n, tp in (("prefill", d.prefill_instances, d.prefill_tp), ("decode", d.decode_instances,
                                                                           d.decode_tp)):
            flags, notes = _vllm_flags(sc, tp, 1)
            flags.append(f"--kv-transfer-config {kv}")
            out.append(_cmd(head, flags, [f"{role}: {n} instance{'s' if n != 1 else ''} of TP {tp}, one per "
                                          f"{tp} GPUs (CUDA_VISIBLE_DEVICES)"] + notes))
        return "\n".join(out)
    dp = dep.node.replicas
    flags, notes = _vllm_flags(sc, dep.node.tp, dp)
    if dep.node.cross_node:  # vLLM's multi-node serving: a Ray cluster over the nodes, the command on its head
        flags.append("--distributed-executor-backend ray")
        notes.append("start a Ray cluster over the nodes first (`ray start --head` on one, `ray start --address "
                     "HEAD_IP:6379` on the other), then run this on the head node")
    return _cmd(head, flags, [f"vLLM {VLLM_VERSION}: {dep.model.name} on {dep.node.num_gpus}x {dep.node.gpu.name}"]
                + _common_notes(sc, dp) + notes)


# ---------------------------------------------------------------- SGLang


def _sglang_spec(pol: BatchingPolicy, dep: Deployment) -> tuple[list[str], list[str]]:
    if pol.spec_decode == "off":
        return [], []
    k = int(pol.spec_tokens)
    steps = [f"--speculative-num-steps {k}", "--speculative-eagle-topk 1", f"--speculative-num-draft-tokens {k + 1}"]
    given = ([_acceptance_note(pol, "SGLang logs it as \"accept len\" in its decode batch lines")]
             if pol.spec_acceptance_length > 0 else [])
    if pol.spec_decode == "eagle":
        return (["--speculative-algorithm EAGLE", f"--speculative-draft-model-path {EAGLE_HEAD}"] + steps,
                [f"EAGLE: {EAGLE_HEAD} is an EAGLE draft head trained for {dep.model.name}"] + given)
    if pol.spec_decode == "mtp":
        return ["--speculative-algorithm NEXTN"] + steps, ["MTP: the model's own next-token module (NEXTN)"] + given
    return [], [f"speculative decoding '{pol.spec_decode}' is left out: no SGLang {SGLANG_VERSION} flag for it is "
                "cited in docs/LAUNCH.md"]


def _sglang_flags(sc: Scenario, tp: int, dp: int) -> tuple[list[str], list[str]]:
    dep, pol = sc.deployment, sc.policy
    flags = [f"--tp-size {tp}"]
    if dp > 1:
        flags.append(f"--dp-size {dp}")
    if dep.model.max_context_tokens:
        flags.append(f"--context-length {dep.model.max_context_tokens}")
    flags.append(f"--mem-fraction-static {dep.gpu_memory_utilization:g}")
    if dep.precision == "fp8" and PUBLISHED_PRECISION.get(_preset_key(dep.model)) != "fp8":
        flags.append("--quantization fp8")
    if dep.kv_dtype == "fp8":
        flags.append(f"--kv-cache-dtype {SGLANG_KV_FP8}")
    notes: list[str] = []
    if dep.kv_cache_tokens is not None:
        flags.append(f"--max-total-tokens {dep.kv_cache_tokens}")
    if pol.mode != "continuous":
        what = "static batching" if pol.mode == "static" else f"dynamic batching (max wait {pol.max_wait_s * 1e3:g} ms)"
        notes.append(f"{what} has no SGLang equivalent: SGLang batches every step (continuous batching); "
                     f"--max-running-requests {pol.max_batch_size} keeps the simulated batch cap")
        return flags + [f"--max-running-requests {pol.max_batch_size}", "--disable-radix-cache"], notes
    flags.append(f"--max-running-requests {pol.max_num_seqs}")
    if pol.chunked_prefill:
        flags.append(f"--chunked-prefill-size {pol.max_num_batched_tokens}")
    else:
        flags += ["--chunked-prefill-size -1", f"--max-prefill-tokens {pol.max_num_batched_tokens}"]
    if not pol.prefix_caching:
        flags.append("--disable-radix-cache")
    flags.append("--schedule-policy fcfs")
    if pol.priority:
        notes.append(f"priority classes: no SGLang {SGLANG_VERSION} flag is cited in docs/LAUNCH.md; fcfs keeps the "
                     "arrival order")
    if pol.preemption != "recompute":
        notes.append(f"preemption {pol.preemption}: SGLang retracts (recomputes) requests when memory runs out")
    spec, spec_notes = _sglang_spec(pol, dep)
    return flags + spec, notes + spec_notes


def sglang_command(sc: Scenario) -> str:
    dep = sc.deployment
    head = f"python -m sglang.launch_server --model-path {model_id(dep.model)}"
    if sc.disagg is not None:
        d = sc.disagg
        out = [f"# SGLang {SGLANG_VERSION}: prefill/decode disaggregation (KV over NIXL); sglang_router in PD mode "
               "sends each request to a prefill and a decode server"]
        for role, n, tp in (("prefill", d.prefill_instances, d.prefill_tp), ("decode", d.decode_instances,
                                                                           d.decode_tp)):
            flags, notes = _sglang_flags(sc, tp, 1)
            flags += [f"--disaggregation-mode {role}", "--disaggregation-transfer-backend nixl"]
            out.append(_cmd(head, flags, [f"{role}: {n} server{'s' if n != 1 else ''} of TP {tp}"] + notes))
        return "\n".join(out)
    dp = dep.node.replicas
    flags, notes = _sglang_flags(sc, dep.node.tp, dp)
    if dep.node.cross_node:  # SGLang's multi-node deployment: the same command on every node, its rank set
        n = dep.node.physical_nodes
        flags += ["--dist-init-addr HEAD_IP:20000", f"--nnodes {n}", "--node-rank 0"]
        notes.append(f"run it on each of the {n} nodes with --node-rank 0 to {n - 1} (HEAD_IP: the rank-0 node's "
                     "address)")
    return _cmd(head, flags, [f"SGLang {SGLANG_VERSION}: {dep.model.name} on {dep.node.num_gpus}x "
                              f"{dep.node.gpu.name}"] + _common_notes(sc, dp) + notes)


def _preset_key(model: Model) -> str | None:
    for key, m in MODELS.items():
        if m.name == model.name:
            return key
    return None


def launch(sc: Scenario) -> dict[str, str]:
    """``{"vllm": command, "sglang": command}`` for the scenario (its budget sized as the run sizes it)."""
    return {"vllm": vllm_command(sc), "sglang": sglang_command(sc)}


def config_launch(base: Scenario, row: dict, custom_gpus=None) -> dict[str, str]:
    """The launch commands of one search row (``studies.search``'s configs: gpu, precision, tp, policy, knobs,
    nodes_needed, router) on the search's base scenario."""
    knobs = tuple(sorted((k, float(v)) for k, v in (row.get("knobs") or {}).items()))
    split = row.get("split")
    if split:  # a prefill/decode split of one node (its decode TP is the config's tp): the commands of one copy
        parts = tuple(int(split[k]) for k in ("prefill_instances", "prefill_tp", "decode_instances", "decode_tp"))
        cfg = Config(row["gpu"], row["precision"], parts[3], row["policy"], knobs, parts)
    else:
        cfg = Config(row["gpu"], row["precision"], int(row["tp"]), row["policy"], knobs)
    sc = config_scenario(base, cfg, custom_gpus)
    nodes = int(row.get("nodes_needed") or 1) // int(row.get("nodes_per_copy") or 1)  # TP 16: copies of two nodes
    if nodes > 1 and not split:
        sc = replace(sc, nodes=nodes, router=row.get("router") or sc.router)
    return launch(sc)


def with_launch(rows: list[dict], base: Scenario, custom_gpus=None) -> list[dict]:
    """Each search row with its ``launch: {vllm, sglang}`` (a row whose scenario cannot be built gets none)."""
    for r in rows:
        try:
            r["launch"] = config_launch(base, r, custom_gpus)
        except (ValueError, KeyError):
            continue
    return rows
