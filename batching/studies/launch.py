"""Launch commands for a simulated configuration: the vLLM and SGLang servers that run it (issue 24, item 7).

``launch(scenario)`` -> ``{"vllm": str, "sglang": str}``: one shell command set each (lines joined by `` \\``),
with ``#`` comment lines above it where the simulated policy has no flag in that engine (static and dynamic batching,
swap preemption in vLLM V1, ...). Every flag is one the named engine version documents (docs/LAUNCH.md cites the
page of each); nothing is emitted for a knob the engine lacks. Every value is shell-quoted (``launch_flags.q``), so
a set runs as printed when pasted into bash. Figures come from the scenario itself (its deployment, policy, split
and fleet), never from defaults of this module. The flags are in ``launch_flags``, a split's commands in
``launch_split``.
"""
from __future__ import annotations

from dataclasses import replace

from batching.sim.simulate import Scenario
from batching.studies.launch_flags import (EAGLE_HEAD, HF_IDS, SGLANG_VERSION, VLLM_VERSION, command, common_notes,
                                           model_id, q, sglang_flags, vllm_flags)
from batching.studies.launch_split import sglang_split, vllm_split
from batching.studies.search import Config, config_scenario

__all__ = ["EAGLE_HEAD", "HF_IDS", "SGLANG_VERSION", "VLLM_VERSION", "config_launch", "launch", "model_id",
           "sglang_command", "vllm_command", "with_launch"]


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
                   + common_notes(sc, dp) + notes)


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
                   + common_notes(sc, dp) + notes)


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
