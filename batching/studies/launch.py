"""Launch commands for a simulated configuration: the vLLM and SGLang servers that run it (issue 24, item 7), and the
TensorRT-LLM one when the simulation ran TensorRT-LLM's profile (issue 39, item 8).

``launch(scenario)`` -> ``{"vllm": str, "sglang": str}`` (plus ``"trtllm"``, first, for ``engine="trtllm"``): one
shell command set each (lines joined by `` \\``), with ``#`` comment lines above it where the simulated policy has
no flag in that engine (static and dynamic batching, swap preemption in vLLM V1, ...). Every flag is one the named
engine version defines (docs/LAUNCH.md cites the page of each; tests/data/engine_flags.json lists each version's
flags); nothing is emitted for a knob the engine lacks. Every value is shell-quoted (``launch_flags.q``), so a set
runs as printed when pasted into bash. Figures come from the scenario itself (its deployment, policy, split and
fleet), never from defaults of this module. The flags are in ``launch_flags``, a split's commands in
``launch_split``.
"""
from __future__ import annotations

from dataclasses import replace

from batching.sim.hardware.engines import DEFAULT_ENGINE
from batching.sim.simulate import Scenario
from batching.studies.launch_flags import (EAGLE_HEAD, HF_IDS, SGLANG_VERSION, TRTLLM_VERSION, VLLM_VERSION,
                                           command, common_notes, model_id, printable, q, sglang_flags,
                                           vllm_flags)
from batching.studies.launch_split import sglang_split, vllm_split
from batching.studies.search import Config, config_scenario

__all__ = ["EAGLE_HEAD", "HF_IDS", "SGLANG_VERSION", "TRTLLM_VERSION", "VLLM_VERSION", "config_launch", "launch",
           "model_id", "sglang_command", "trtllm_command", "vllm_command", "with_launch"]
TRTLLM_YAML = "extra-llm-api-config.yml"  # the file the TensorRT-LLM set writes for --extra_llm_api_options


def _ran_other(sc: Scenario, engine: str) -> list[str]:
    """A note when the simulation ran another engine's profile than the command's (the default vLLM profile, that
    the presets follow, goes without one)."""
    prof = sc.profile
    if prof.name in (engine, DEFAULT_ENGINE):
        return []
    return [f"the simulation ran the {prof.label} profile; this command runs the same policy on this engine, whose "
            "overheads differ"]


def vllm_command(sc: Scenario) -> str:
    if sc.disagg is not None:
        return vllm_split(sc)
    dep = sc.deployment
    dp = dep.node.replicas
    flags, notes = vllm_flags(sc, dep.node.tp, dp)
    if dep.node.cross_node:  # vLLM's multi-node serving: a Ray cluster over the nodes, the command on its head
        flags.append("--distributed-executor-backend ray")
        notes.append("start a Ray cluster over the nodes first (`ray start --head` on one, `ray start --address "
                     "HEAD_IP:6379` on the other), then run this on the head node")
    return command(["vllm", "serve", q(model_id(dep.model))], flags,
                   [f"vLLM {VLLM_VERSION}: {dep.model.name} on {dep.node.num_gpus}x {dep.node.gpu.name}"]
                   + _ran_other(sc, "vllm") + common_notes(sc, dp) + notes)


def sglang_command(sc: Scenario) -> str:
    if sc.disagg is not None:
        return sglang_split(sc)
    dep = sc.deployment
    dp = dep.node.replicas
    flags, notes = sglang_flags(sc, dep.node.tp, dp)
    if dep.node.cross_node:  # SGLang's multi-node deployment: the same command on every node, its rank set
        n = dep.node.physical_nodes
        flags += ["--dist-init-addr HEAD_IP:20000", f"--nnodes {n}", "--node-rank 0"]
        notes.append(f"run it on each of the {n} nodes with --node-rank 0 to {n - 1} (HEAD_IP: the rank-0 node's "
                     "address)")
    return command(["python", "-m", "sglang.launch_server", "--model-path", q(model_id(dep.model))], flags,
                   [f"SGLang {SGLANG_VERSION}: {dep.model.name} on {dep.node.num_gpus}x {dep.node.gpu.name}"]
                   + _ran_other(sc, "sglang") + common_notes(sc, dp) + notes)


def trtllm_command(sc: Scenario) -> str:
    """``trtllm-serve`` (PyTorch backend) for the scenario: its own flags (--tp_size, --max_batch_size,
    --max_num_tokens, --max_seq_len) and an --extra_llm_api_options YAML for chunked prefill, KV-cache block reuse
    and the KV dtype (tensorrt_llm/llmapi/llm_args.py); one server per replica, each on its GPUs and port."""
    dep, pol = sc.deployment, sc.policy
    head = f"TensorRT-LLM {TRTLLM_VERSION}: {dep.model.name} on {dep.node.num_gpus}x {dep.node.gpu.name}"
    if sc.disagg is not None:
        return "# " + printable(f"{head}: prefill/decode disaggregation is not written for TensorRT-LLM here "
                                "(trtllm-serve disaggregated takes a cluster YAML of context and generation servers); "
                                "see the vLLM and SGLang sets")
    notes = common_notes(sc, dep.node.replicas)
    if dep.precision != "bf16":
        notes.append(f"{dep.precision} weights: MODEL must be a checkpoint quantized to {dep.precision} (TensorRT-LLM "
                     "reads the quantization from the checkpoint; no flag)")
    notes.append(f"KV cache: TensorRT-LLM's default share of the memory left after the weights "
                 f"(--kv_cache_free_gpu_memory_fraction 0.9); the simulation sizes it from gpu_memory_utilization "
                 f"{dep.gpu_memory_utilization:g} of the whole GPU"
                 + (f", capped at {dep.kv_cache_tokens:,} tokens" if dep.kv_cache_tokens is not None else ""))
    cap = pol.max_batch_size if pol.mode != "continuous" else pol.max_num_seqs
    flags = ["--backend pytorch", f"--tp_size {q(dep.node.tp)}", f"--max_batch_size {q(cap)}"]
    if pol.mode != "continuous":
        notes.append(f"{pol.mode} batching has no TensorRT-LLM equivalent: it batches in flight at every step; "
                     f"--max_batch_size {cap} keeps the simulated batch cap")
    else:
        flags.append(f"--max_num_tokens {q(pol.max_num_batched_tokens)}")
    if dep.model.max_context_tokens:
        flags.append(f"--max_seq_len {q(dep.model.max_context_tokens)}")
    chunked = pol.mode == "continuous" and pol.chunked_prefill
    reuse = pol.mode == "continuous" and pol.prefix_caching
    options = [f"enable_chunked_prefill: {'true' if chunked else 'false'}", "kv_cache_config:",
            f"  enable_block_reuse: {'true' if reuse else 'false'}"]
    if dep.kv_dtype == "fp8":
        options.append("  dtype: fp8")
    flags.append(f"--extra_llm_api_options {TRTLLM_YAML}")
    if pol.priority:
        notes.append(f"priority classes: no trtllm-serve {TRTLLM_VERSION} flag is cited in docs/LAUNCH.md; requests "
                     "run in arrival order")
    if pol.spec_decode != "off":
        notes.append(f"speculative decoding '{pol.spec_decode}' is left out: its speculative_config for TensorRT-LLM "
                     "is not cited in docs/LAUNCH.md")
    if pol.preemption != "recompute":
        notes.append(f"preemption {pol.preemption}: no trtllm-serve flag (its capacity scheduler reserves KV up front)")
    if sc.profile.name != "trtllm":
        head += f" (the simulation ran the {sc.profile.label} profile)"
    out = [f"# {printable(n)}" for n in [head] + notes]
    out.append(f"cat > {TRTLLM_YAML} <<'EOF'\n" + "\n".join(options) + "\nEOF")
    words = ["trtllm-serve", q(model_id(dep.model))]
    if dep.node.cross_node:
        out.append(f"# TP {dep.node.tp} over {dep.node.physical_nodes} nodes: run it under MPI on every node "
                   "(TensorRT-LLM's multi-node serving: mpirun with trtllm-llmapi-launch)")
    replicas = dep.node.replicas
    if replicas == 1:
        out.append(command(words, flags, []))
        return "\n".join(out)
    out.append(f"# {replicas} replicas of TP {dep.node.tp}: one server each, on its own GPUs and port, in the "
               "background (&), behind your load balancer")
    for r in range(replicas):
        gpus = ",".join(str(g) for g in range(r * dep.node.tp, (r + 1) * dep.node.tp))
        out.append(command(words, [f"--port {8000 + r}"] + flags, [], {"CUDA_VISIBLE_DEVICES": gpus},
                           background=True))
    return "\n".join(out)


def launch(sc: Scenario) -> dict[str, str]:
    """``{"vllm": command, "sglang": command}`` for the scenario (its budget sized as the run sizes it), with the
    ``trtllm-serve`` set first when the scenario runs TensorRT-LLM's profile."""
    out = {"trtllm": trtllm_command(sc)} if sc.profile.name == "trtllm" else {}
    out.update({"vllm": vllm_command(sc), "sglang": sglang_command(sc)})
    return out


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
