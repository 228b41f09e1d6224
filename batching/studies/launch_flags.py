"""The flags of one vLLM or SGLang server for a simulated configuration, and the quoting every command uses
(``studies.launch`` assembles the commands; docs/LAUNCH.md cites each flag; tests/data/engine_flags.json lists what
each engine version defines).

Every value that reaches a command goes through ``q`` (``shlex.quote``) and every comment through ``printable``,
so a name with ``;``, ``$(...)``, backticks or a newline stays one word (or one comment line) when the command is
pasted into a shell; names with control characters are refused earlier (specs._check_name).
"""
from __future__ import annotations

import json
import shlex
import unicodedata

from batching.sim.engine.speculative import acceptance_from_length
from batching.sim.hardware.engines import ENGINES
from batching.sim.hardware.specs import GIB, MODELS, PUBLISHED_PRECISION, Deployment, GPU, Model
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario

VLLM_VERSION = "0.11"  # vllm serve, V1 engine (docs.vllm.ai/en/stable/cli/serve.html)
SGLANG_VERSION = "0.5.3"  # python -m sglang.launch_server (sglang 0.5.3, python/sglang/srt/server_args.py)
SGLANG_ROUTER_VERSION = "0.1.9"  # python -m sglang_router.launch_router (PD mode)
TRTLLM_VERSION = "1.0"  # trtllm-serve, PyTorch backend (tensorrt_llm/commands/serve.py)
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
# SGLang 0.5.3's chunked_prefill_size when none is given, by the GPU's memory in MiB (server_args.py,
# ServerArgs._handle_gpu_memory_settings): below each bound, that size; 16,384 above the last (B200, MI300)
SGLANG_CHUNK_BY_MIB = ((35 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192))
SGLANG_CHUNK_LARGE = 16384
_UNSAFE = ("Cc", "Cf", "Cs", "Zl", "Zp")  # control and format characters, line and paragraph separators


def printable(text: str) -> str:
    """``text`` with every control or format character (ESC, NUL, newline, bidi overrides...) written as an escape
    (``\\x1b``), so it stays on one line and sends nothing to the terminal."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _UNSAFE else ch
                   for ch in str(text))


def q(value) -> str:
    """One shell word for ``value`` (``shlex.quote`` of its printable text): plain words and numbers stay as they
    are, anything else is single-quoted."""
    return shlex.quote(printable(str(value)))


def model_id(model: Model) -> str:
    """The HuggingFace id of a preset model; a custom model's name stands for its path (unquoted: ``q`` it)."""
    return HF_IDS.get(model.name, f"PATH/TO/{model.name}")


def command(words: list[str], flags: list[str], comments: list[str], env: dict | None = None,
            background: bool = False) -> str:
    """``#`` comment lines, then ``[ENV=v ...] words flag \\`` lines; ``&`` at the end runs it in the background (a
    server of a set that starts together). ``words`` and ``flags`` are already quoted."""
    lines = [f"# {printable(c)}" for c in comments]
    head = [f"{k}={q(v)}" for k, v in (env or {}).items()] + words
    body = " \\\n  ".join([" ".join(head)] + flags)
    lines.append(body + (" &" if background else ""))
    return "\n".join(lines)


def preset_key(model: Model) -> str | None:
    for key, m in MODELS.items():
        if m.name == model.name:
            return key
    return None


def common_notes(sc: Scenario, dp: int) -> list[str]:
    notes = []
    if sc.deployment.node.cross_node:
        notes.append(f"one TP {sc.deployment.node.tp} replica over {sc.deployment.node.physical_nodes} nodes of "
                     f"{sc.deployment.node.num_gpus // sc.deployment.node.physical_nodes} GPUs")
    if sc.nodes > 1:
        notes.append(f"on each of the {sc.nodes} nodes ({sc.nodes * dp} replicas in all) behind your load balancer "
                     f"(the simulation routes {sc.router})")
    return notes


def acceptance_note(pol: BatchingPolicy, where: str) -> str:
    """The note for an acceptance given as engines report it (``spec_acceptance_length``): it is an input, where the
    engine reports it, and the per-token A it stands for (speculative.acceptance_from_length)."""
    a = acceptance_from_length(float(pol.spec_acceptance_length), int(pol.spec_tokens))
    return (f"the simulation's mean acceptance length {pol.spec_acceptance_length:g} tokens per verification step "
            f"(A={a:.3g} per token at K={int(pol.spec_tokens)}) is an input, not a flag; {where}")


# ---------------------------------------------------------------- vLLM


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
    notes.append(acceptance_note(pol, "vLLM logs it as its spec-decode \"Mean acceptance length\"")
                 if pol.spec_acceptance_length > 0 else
                 f"the simulation's acceptance rate A={pol.spec_acceptance:g} is an input, not a flag")
    return ["--speculative-config " + q(json.dumps(cfg, separators=(",", ":")))], notes


def vllm_flags(sc: Scenario, tp: int, dp: int) -> tuple[list[str], list[str]]:
    """The flags of one ``vllm serve`` (TP ``tp``, ``dp`` data-parallel replicas) and the notes for what has none."""
    dep, pol = sc.deployment, sc.policy
    flags = [f"--tensor-parallel-size {q(tp)}"]
    if dp > 1:
        flags.append(f"--data-parallel-size {q(dp)}")
    if dep.model.max_context_tokens:
        flags.append(f"--max-model-len {q(dep.model.max_context_tokens)}")
    flags.append(f"--gpu-memory-utilization {q(f'{dep.gpu_memory_utilization:g}')}")
    if dep.precision == "fp8" and PUBLISHED_PRECISION.get(preset_key(dep.model)) != "fp8":
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
        flags.append(f"--max-num-seqs {q(pol.max_batch_size)}")
        flags.append("--no-enable-prefix-caching")
        return flags, notes
    flags.append(f"--max-num-seqs {q(pol.max_num_seqs)}")
    flags.append(f"--max-num-batched-tokens {q(pol.max_num_batched_tokens)}")
    flags.append("--enable-chunked-prefill" if pol.chunked_prefill else "--no-enable-chunked-prefill")
    flags.append("--enable-prefix-caching" if pol.prefix_caching else "--no-enable-prefix-caching")
    if pol.priority:
        flags.append("--scheduling-policy priority")
        notes.append("priority: each request's class goes in its \"priority\" field (lower runs first)")
    if pol.preemption == "swap":
        flags.append(f"--swap-space {q(f'{pol.swap_space_gib:g}')}")
        notes.append(f"swap preemption: vLLM {VLLM_VERSION} (V1) preempts by recompute; --swap-space sizes the CPU "
                     "swap space per GPU that V0 swapped into")
    elif pol.preemption == "off":
        notes.append("preemption off has no vLLM flag: vLLM preempts by recompute when the KV cache runs out")
    spec, spec_notes = _vllm_spec(pol, dep)
    return flags + spec, notes + spec_notes


# ---------------------------------------------------------------- SGLang


def sglang_default_chunk(gpu: GPU) -> int:
    """The chunked_prefill_size SGLang picks for a GPU of this memory when none is given (SGLANG_CHUNK_BY_MIB)."""
    mib = gpu.memory_bytes / GIB * 1024
    return next((size for bound, size in SGLANG_CHUNK_BY_MIB if mib < bound), SGLANG_CHUNK_LARGE)


def sglang_own_prefill(sc: Scenario) -> bool:
    """Whether the scenario runs SGLang's own prefill batching: the SGLang profile with its scheduler defaults'
    budget and no chunked (mixed) steps, the way engines.SGLANG_POLICY models SGLang's separate prefill batches of
    max_prefill_tokens, prompts chunked at chunked_prefill_size."""
    own = ENGINES["sglang"].policy
    pol = sc.policy
    return (sc.profile.name == "sglang" and pol.mode == "continuous" and not pol.chunked_prefill
            and pol.max_num_batched_tokens == own.max_num_batched_tokens)


def _sglang_spec(pol: BatchingPolicy, dep: Deployment) -> tuple[list[str], list[str]]:
    if pol.spec_decode == "off":
        return [], []
    k = int(pol.spec_tokens)
    steps = [f"--speculative-num-steps {q(k)}", "--speculative-eagle-topk 1",
             f"--speculative-num-draft-tokens {q(k + 1)}"]
    given = ([acceptance_note(pol, "SGLang logs it as \"accept len\" in its decode batch lines")]
             if pol.spec_acceptance_length > 0 else [])
    if pol.spec_decode == "eagle":
        return (["--speculative-algorithm EAGLE", f"--speculative-draft-model-path {EAGLE_HEAD}"] + steps,
                [f"EAGLE: {EAGLE_HEAD} is an EAGLE draft head trained for {dep.model.name}"] + given)
    if pol.spec_decode == "mtp":
        return ["--speculative-algorithm NEXTN"] + steps, ["MTP: the model's own next-token module (NEXTN)"] + given
    return [], [f"speculative decoding '{pol.spec_decode}' is left out: no SGLang {SGLANG_VERSION} flag for it is "
                "cited in docs/LAUNCH.md"]


def sglang_flags(sc: Scenario, tp: int, dp: int, role: str | None = None) -> tuple[list[str], list[str]]:
    """The flags of one ``sglang.launch_server`` (TP ``tp``, ``dp`` replicas; ``role``: the prefill or decode
    server of a split, which mixes nothing) and the notes for what has none."""
    dep, pol = sc.deployment, sc.policy
    flags = [f"--tp-size {q(tp)}"]
    if dp > 1:
        flags.append(f"--dp-size {q(dp)}")
    if dep.model.max_context_tokens:
        flags.append(f"--context-length {q(dep.model.max_context_tokens)}")
    flags.append(f"--mem-fraction-static {q(f'{dep.gpu_memory_utilization:g}')}")
    if dep.precision == "fp8" and PUBLISHED_PRECISION.get(preset_key(dep.model)) != "fp8":
        flags.append("--quantization fp8")
    if dep.kv_dtype == "fp8":
        flags.append(f"--kv-cache-dtype {SGLANG_KV_FP8}")
    notes: list[str] = []
    if dep.kv_cache_tokens is not None:
        flags.append(f"--max-total-tokens {q(dep.kv_cache_tokens)}")
    if pol.mode != "continuous":
        what = "static batching" if pol.mode == "static" else f"dynamic batching (max wait {pol.max_wait_s * 1e3:g} ms)"
        notes.append(f"{what} has no SGLang equivalent: SGLang batches every step (continuous batching); "
                     f"--max-running-requests {pol.max_batch_size} keeps the simulated batch cap")
        return flags + [f"--max-running-requests {q(pol.max_batch_size)}", "--disable-radix-cache"], notes
    spec, spec_notes = _sglang_spec(pol, dep)
    flags.append(f"--max-running-requests {q(pol.max_num_seqs)}")
    if pol.chunked_prefill:
        flags.append(f"--chunked-prefill-size {q(pol.max_num_batched_tokens)}")
        if spec:  # server_args.py: EAGLE/NEXTN turn mixed chunks off ("Mixed chunked prefill is disabled ...")
            notes.append("SGLang runs speculative decoding without mixed chunks (it turns --enable-mixed-chunk off): "
                         "its prefill and decode batches run apart")
        elif role is None:  # mixed prefill + decode steps, as simulated (SGLang's enable_mixed_chunk is off by default)
            flags.append("--enable-mixed-chunk")
    elif sglang_own_prefill(sc):
        chunk = sglang_default_chunk(dep.node.gpu)
        flags += [f"--chunked-prefill-size {q(chunk)}", f"--max-prefill-tokens {q(pol.max_num_batched_tokens)}"]
        notes.append(f"SGLang's own prefill batches: up to {pol.max_num_batched_tokens:,} prompt tokens, prompts "
                     f"chunked at {chunk:,} (its default for {dep.node.gpu.name}'s memory), decode batches apart")
    elif not pol.prefill_only_steps and role is None and not spec:
        # whole prompts mixed with the decodes (vLLM V1 without chunked prefill): SGLang mixes only with chunked
        # prefill on; a chunk of the whole budget (at least the longest prompt) never splits a prompt
        flags += [f"--chunked-prefill-size {q(pol.max_num_batched_tokens)}", "--enable-mixed-chunk",
                  f"--max-prefill-tokens {q(pol.max_num_batched_tokens)}"]
    else:
        flags += ["--chunked-prefill-size -1", f"--max-prefill-tokens {q(pol.max_num_batched_tokens)}"]
    if not pol.prefix_caching:
        flags.append("--disable-radix-cache")
    flags.append("--schedule-policy fcfs")
    if pol.priority and pol.preempt_for_waiting:
        flags += ["--enable-priority-scheduling", "--schedule-low-priority-values-first",
                  "--priority-scheduling-preemption-threshold 0"]
        notes.append("priority: each request's class goes in its \"priority\" field (lower runs first); a waiting "
                     "request of a higher class preempts running ones (threshold 0)")
    elif pol.priority:
        flags += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
        notes.append("priority: each request's class goes in its \"priority\" field (lower runs first); as simulated, "
                     "a waiting request preempts no running one: SGLang's default preemption threshold (10) is above "
                     "the classes' difference")
    if pol.preemption != "recompute":
        notes.append(f"preemption {pol.preemption}: SGLang retracts (recomputes) requests when memory runs out")
    return flags + spec, notes + spec_notes
