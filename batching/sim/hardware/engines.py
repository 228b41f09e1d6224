"""Engine profiles: what a serving engine adds to the kernels' time, and its scheduler defaults (DESIGN §2).

An ``EngineProfile`` holds, for one engine version: CPU time per step (scheduling, input preparation, launch gaps),
per sequence emitting a token per step (sampling, detokenisation, streaming) and per step that holds prompt tokens
(prefill launches); the client-side time before a request reaches the engine's queue (HTTP + tokenisation: fixed +
per prompt token) and after a token is computed (detokenise + stream out, plus a per-layer dispatch time before the
first token as aiconfigurator models it); kernel-efficiency factors relative to the calibrated vLLM kernels; the
default all-reduce; and the engine's scheduler defaults as a ``BatchingPolicy``. ``cost_model(dep, allreduce,
engine=profile)`` prices the step terms; ``simulate`` adds the client-side times. Every value names its source here
and in docs/CALIBRATION.md ("Engine profiles"). ``to_dict`` / ``from_dict`` write and read a profile as JSON
(``--profile FILE``), every field validated with its name, value and allowed range.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, fields, replace

from batching.sim.checks import check_range, show
from batching.sim.policy import BatchingPolicy

# --- measured inputs every profile shares ---------------------------------------------------------------------
# Per-step CPU time of an engine that does not overlap its scheduler with the GPU: 2.0 ms (costmodel.STEP_FIXED_S
# keeps the same value and sources: SGLang v0.4 post, 2024-12-04, overlap gained 1.1x, ~9 % of a ~20 ms 70B step;
# vLLM v0.6.0 post, 2024-09-05).
SERIAL_STEP_S = 2.0e-3
# What a pure-decode step run as one captured CUDA graph saves of that per-step CPU time. vLLM 0.11 runs
# cudagraph_mode FULL_AND_PIECEWISE by default (vllm/config/compilation.py, CompilationConfig.cudagraph_mode): a
# step of decodes only (uniform query length) at a captured size replays one full graph; a step holding prompt
# tokens, or past the largest captured size, runs piecewise graphs with attention launched eagerly between them.
# Measured in vLLM PR #20059 ("Allow full cudagraph with separate attention routines ...", 2025-06-29, benchmark
# comment: Qwen2.5-1.5B-Instruct, ShareGPT, 100 prompts at 1 req/s): median ITL 5.39 ms with piecewise graphs only,
# 4.97 ms with full graphs for decode batches and piecewise ones for the rest: 0.42 ms per step. A small model at
# about one sequence a step, where the launch gaps are all exposed: for larger models more of them hide behind the
# kernels, so this is an upper bound there (and it is never more than the step's CPU time).
GRAPH_STEP_SAVING_S = 0.42e-3
# The largest captured step, in tokens: vLLM 0.11 captures up to min(max_num_seqs x decode query length x 2, 512)
# tokens, capped by max_num_batched_tokens (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes); with vLLM's
# defaults on H100/H200 (max_num_seqs 1,024) that is 512, and cudagraph_dispatcher runs any larger step without
# a full graph.
GRAPH_MAX_TOKENS = 512
# Tokenisation: Hugging Face tokenizers README ("takes less than 20 seconds to tokenize a GB of text on a server's
# CPU"), at ~4 bytes of English text per token: 20 s / 2.5e8 tokens = 80 ns per prompt token.
TOKENIZE_PER_TOKEN_S = 80e-9
# Kernel-efficiency factors, H100 SXM, from NVIDIA aiconfigurator 0.12.0's measured per-op tables (Apache-2.0;
# aiconfigurator_core/systems/data/h100_sxm/{gemm,attention}/<engine>/<version>/*.parquet: vLLM 0.24.0, SGLang
# 0.5.14, TensorRT-LLM 1.3.0rc20; tools/engine_kernel_ratios.py recomputes every figure), each time-weighted:
# - GEMM (BF16, FP8): vLLM's summed kernel time over the engine's at the Llama-3.1-8B/70B shapes of TP 1-8 and
#   1-8,192 tokens (308 shapes); vLLM's own kernels are what linear_fit.json was fitted to (1.0);
# - prompt attention: achieved share of the BF16 peak over prompts of 1,024-32,768 tokens (head dim 128, 8 KV
#   heads): vLLM 0.555 (FlashAttention-3), SGLang 0.546, TensorRT-LLM 0.474, over the cost model's
#   ATTN_PREFILL_EFF 0.35 (FlashAttention-2 class, the kernels of the vLLM v0.6.0 reference runs);
# - decode attention: achieved share of HBM bandwidth reading the BF16 KV of every >= 1,024-token context (bytes
#   over time): vLLM 0.847, SGLang 0.868, TensorRT-LLM 0.821, over the cost model's ATTN_DECODE_MEMORY_EFF 0.7
#   (the FlashInfer blog's typical figure; the measured median point of vLLM's kernel is 0.691, but large batches,
#   which take the time, run near 0.85).
ATTN_PREFILL_BASE = 0.35  # costmodel.ATTN_PREFILL_EFF (costmodel imports this module, so the value is repeated)
ATTN_DECODE_BASE = 0.7  # costmodel.ATTN_DECODE_MEMORY_EFF, likewise
MEASURED_PROMPT_ATTN = {"vllm": 0.555, "sglang": 0.546, "trtllm": 0.474}
MEASURED_DECODE_BW = {"vllm": 0.847, "sglang": 0.868, "trtllm": 0.821}
KERNEL_FACTORS = {
    e: {"gemm": g, "gemm_fp8": g8, "attn": round(MEASURED_PROMPT_ATTN[e] / ATTN_PREFILL_BASE, 3),
        "kv": round(MEASURED_DECODE_BW[e] / ATTN_DECODE_BASE, 3)}
    for e, g, g8 in (("vllm", 1.0, 1.0), ("sglang", 0.966, 1.037), ("trtllm", 1.009, 0.950))
}

# field -> (lowest, highest) a profile accepts (seconds, or a factor)
FIELD_LIMITS: dict[str, tuple[float, float]] = {
    "step_s": (0.0, 1.0),
    "graph_step_saving_s": (0.0, 1.0),
    "seq_s": (0.0, 0.01),
    "prefill_step_s": (0.0, 1.0),
    "in_fixed_s": (0.0, 60.0),
    "in_per_token_s": (0.0, 1e-3),
    "out_s": (0.0, 60.0),
    "dispatch_per_layer_s": (0.0, 0.1),
    "gemm_eff": (0.05, 20.0),
    "gemm_fp8_eff": (0.05, 20.0),
    "attn_eff": (0.05, 20.0),
    "kv_eff": (0.05, 20.0),
}
ALLREDUCES = ("vllm_graph", "vllm_eager", "nccl", "trtllm", "vidur_nccl")  # costmodel.ALLREDUCE_IMPLS
_POLICY_KEYS = ("mode", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "prefix_caching",
                "prefill_only_steps")


@dataclass(frozen=True)
class EngineProfile:
    """One engine version's overheads, kernel factors and scheduler defaults (seconds unless noted)."""

    name: str = "vllm"
    label: str = "vLLM 0.11"  # the engine and version the values describe
    step_s: float = SERIAL_STEP_S  # CPU per step: scheduling, input preparation, launch gaps
    # of step_s, what a pure-decode step of at most GRAPH_MAX_TOKENS tokens saves (one full CUDA graph replayed)
    graph_step_saving_s: float = GRAPH_STEP_SAVING_S
    seq_s: float = 0.0  # CPU per sequence emitting a token per step: sampling, detokenisation, streaming
    prefill_step_s: float = 0.0  # launch overhead of a step that holds prompt tokens
    in_fixed_s: float = 0.0  # client -> engine queue: HTTP, request parsing
    in_per_token_s: float = TOKENIZE_PER_TOKEN_S  # client -> engine queue: tokenisation per prompt token
    out_s: float = 0.0  # token computed -> client: detokenise, stream out
    dispatch_per_layer_s: float = 0.0  # before the first token, per model layer (aiconfigurator's prefill dispatch)
    gemm_eff: float = 1.0  # linear-layer speed relative to vLLM's kernels (BF16)
    gemm_fp8_eff: float = 1.0  # the same for FP8 GEMMs
    attn_eff: float = 1.0  # prompt attention speed relative to vLLM's
    kv_eff: float = 1.0  # decode attention (KV read) speed relative to vLLM's
    allreduce: str = "vllm_graph"
    policy: BatchingPolicy = field(default_factory=lambda: VLLM_POLICY)
    source: str = ""  # where the scheduler defaults come from

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 64:
            raise ValueError(f"name={show(self.name)} is not allowed; allowed a text of 1 to 64 characters")
        if not isinstance(self.label, str) or not self.label.strip() or len(self.label) > 80:
            raise ValueError(f"label={show(self.label)} is not allowed; allowed a text of 1 to 80 characters")
        for key, (low, high) in FIELD_LIMITS.items():
            check_range(key, getattr(self, key), low, high)
        if self.allreduce not in ALLREDUCES:
            raise ValueError(f"allreduce={show(self.allreduce)} is unknown; allowed: {', '.join(ALLREDUCES)}")
        if not isinstance(self.policy, BatchingPolicy):
            raise ValueError(f"policy={show(self.policy)} is not a BatchingPolicy")
        self.policy.validate()

    def decode_graph_step_s(self) -> float:
        """CPU time of a pure-decode step replayed as one CUDA graph: step_s less the graph's saving (never < 0)."""
        return self.step_s - min(self.step_s, self.graph_step_saving_s)

    def gemm_factor(self, precision: str) -> float:
        return self.gemm_fp8_eff if precision == "fp8" else self.gemm_eff

    def client_in_s(self, prompt_tokens):
        """Seconds from the client's send to the engine's queue (HTTP + tokenisation), per prompt length."""
        return self.in_fixed_s + self.in_per_token_s * prompt_tokens

    def client_out_s(self, num_layers: int) -> float:
        """Seconds from a token computed to the client seeing it (dispatch before the first token included)."""
        return self.out_s + self.dispatch_per_layer_s * num_layers

    def describe(self) -> str:
        return f"{self.label} profile ({self.name})"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy"}
        d["policy"] = {k: getattr(self.policy, k) for k in _POLICY_KEYS}
        return d

    @classmethod
    def from_dict(cls, data: object) -> "EngineProfile":
        """A profile from ``to_dict``'s form; every field checked (name, value, allowed range)."""
        if not isinstance(data, dict):
            raise ValueError(f"an engine profile is a JSON object of fields; got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"key {show(unknown[0])} is not a profile field; allowed: {', '.join(sorted(known))}")
        kw = dict(data)
        base = ENGINES.get(kw.get("name")) if isinstance(kw.get("name"), str) else None
        pol = kw.pop("policy", None)
        for key in FIELD_LIMITS:
            if key in kw:
                v = kw[key]
                check_range(key, v, *FIELD_LIMITS[key])  # refuses text, booleans, NaN
                kw[key] = float(v)
        if pol is not None:
            if not isinstance(pol, dict):
                raise ValueError(f"policy={show(pol)} is not allowed; allowed an object with keys "
                                 f"{', '.join(_POLICY_KEYS)}")
            bad = sorted(set(pol) - set(_POLICY_KEYS))
            if bad:
                raise ValueError(f"policy key {show(bad[0])} is unknown; allowed: {', '.join(_POLICY_KEYS)}")
            for k in ("max_num_seqs", "max_num_batched_tokens"):
                if k in pol and (not isinstance(pol[k], int) or isinstance(pol[k], bool)):
                    raise ValueError(f"policy.{k}={show(pol[k])} is not an integer")
            for k in ("chunked_prefill", "prefix_caching"):
                if k in pol and not isinstance(pol[k], bool):
                    raise ValueError(f"policy.{k}={show(pol[k])} is not allowed; allowed true or false")
            kw["policy"] = replace((base.policy if base else VLLM_POLICY), **pol)
        prof = replace(base, **kw) if base is not None else cls(**kw)
        prof.validate()
        return prof

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def parse_profile(data: bytes) -> EngineProfile:
    """A profile from JSON bytes (``to_dict``'s form); ValueError saying what is wrong (not JSON, or the field)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON ({e})") from None
    except RecursionError:  # arrays or objects nested thousands deep: the decoder's stack, not a profile
        raise ValueError("not valid JSON: arrays or objects nested too deeply") from None
    except ValueError:  # Python's guard against integer literals of more than 4,300 digits
        raise ValueError(f"not valid JSON: a number has more than {sys.get_int_max_str_digits():,} digits") from None
    try:
        return EngineProfile.from_dict(doc)
    except (ValueError, TypeError) as e:
        raise ValueError(str(e)) from None


# --- the engines' scheduler defaults --------------------------------------------------------------------------
# vLLM 0.11 (V1 engine, OpenAI server): chunked prefill always on; on a GPU of >= 70 GiB other than A100 (H100, H200)
# max_num_batched_tokens 8,192 and max_num_seqs 1,024 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults,
# UsageContext.OPENAI_API_SERVER); automatic prefix caching on; recompute preemption.
VLLM_POLICY = BatchingPolicy(mode="continuous", chunked_prefill=True, max_num_batched_tokens=8192, max_num_seqs=1024,
                             prefix_caching=True, preemption="recompute")
# SGLang 0.5: prefill batches and decode batches run apart (enable_mixed_chunk off by default), a prefill batch holds
# up to max_prefill_tokens 16,384 tokens with prompts chunked at chunked_prefill_size 8,192 on H100/H200
# (python/sglang/srt/server_args.py: gpu_mem < 160 GiB -> 8192); max_running_requests unset -> bounded by the KV
# pool and req_to_token_pool (at most 4,096); schedule_policy "fcfs"; RadixAttention prefix cache on. Modelled as
# prefill-only steps of 16,384 tokens (prompts longer than that are refused here, where SGLang chunks them).
SGLANG_POLICY = BatchingPolicy(mode="continuous", chunked_prefill=False, max_num_batched_tokens=16384,
                               max_num_seqs=4096, prefix_caching=True, preemption="recompute",
                               prefill_only_steps=True)
# TensorRT-LLM 1.0 (PyTorch backend, LLM API / trtllm-serve): max_batch_size 2,048, max_num_tokens 8,192
# (tensorrt_llm/llmapi/llm_args.py, BaseLlmArgs); in-flight batching puts context and generation requests in one
# step; capacity scheduler GUARANTEED_NO_EVICT (its up-front KV reservation is not modelled: recompute preemption
# stands in); KV-cache block reuse on.
TRTLLM_POLICY = BatchingPolicy(mode="continuous", chunked_prefill=True, max_num_batched_tokens=8192,
                               max_num_seqs=2048, prefix_caching=True, preemption="recompute")

ENGINES: dict[str, EngineProfile] = {
    # vLLM 0.11's EngineCore schedules, prepares inputs and samples between steps (async scheduling is opt-in), so
    # the serial per-step CPU time stays (less GRAPH_STEP_SAVING_S in a pure-decode step replayed as one CUDA graph);
    # detokenisation and streaming run in the API-server process, overlapped with the GPU (vLLM V1 post,
    # 2025-01-27): no per-sequence term on the step.
    "vllm": EngineProfile(attn_eff=KERNEL_FACTORS["vllm"]["attn"], kv_eff=KERNEL_FACTORS["vllm"]["kv"],
                          source="vllm/engine/arg_utils.py (v0.11), EngineArgs.get_batch_defaults"),
    # SGLang's overlap ("zero-overhead") scheduler prepares the next batch while the GPU runs this one: its Nsight
    # profile of 5 consecutive decode batches shows no GPU idle time (SGLang v0.4 post, 2024-12-04): no per-step CPU
    # time on the GPU's path (so none for a CUDA graph to save); detokenisation in its own process
    # (DetokenizerManager). Its all-reduce is vLLM's custom kernel (sgl-kernel's custom_all_reduce, ported from vLLM)
    # captured in CUDA graphs: vllm_graph.
    "sglang": EngineProfile(name="sglang", label="SGLang 0.5", step_s=0.0, graph_step_saving_s=0.0,
                            gemm_eff=KERNEL_FACTORS["sglang"]["gemm"], gemm_fp8_eff=KERNEL_FACTORS["sglang"]["gemm_fp8"],
                            attn_eff=KERNEL_FACTORS["sglang"]["attn"], kv_eff=KERNEL_FACTORS["sglang"]["kv"],
                            policy=SGLANG_POLICY,
                            source="python/sglang/srt/server_args.py (v0.5), ServerArgs defaults"),
    # TensorRT-LLM's overlap scheduler (on by default; docs "Overlap Scheduler": step n's CPU work runs while step
    # n+1's GPU work does) likewise hides the per-step CPU time (nothing left for a CUDA graph to save); its custom
    # all-reduce (aiconfigurator's trtllm table).
    "trtllm": EngineProfile(name="trtllm", label="TensorRT-LLM 1.0", step_s=0.0, graph_step_saving_s=0.0,
                            gemm_eff=KERNEL_FACTORS["trtllm"]["gemm"], gemm_fp8_eff=KERNEL_FACTORS["trtllm"]["gemm_fp8"],
                            attn_eff=KERNEL_FACTORS["trtllm"]["attn"], kv_eff=KERNEL_FACTORS["trtllm"]["kv"],
                            allreduce="trtllm", policy=TRTLLM_POLICY,
                            source="tensorrt_llm/llmapi/llm_args.py (v1.0), BaseLlmArgs defaults"),
}
DEFAULT_ENGINE = "vllm"


def engine_profile(engine: "str | EngineProfile | None") -> EngineProfile:
    """The profile a name (ENGINES) or a profile stands for; None is the default engine."""
    if engine is None:
        return ENGINES[DEFAULT_ENGINE]
    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, str) and engine in ENGINES:
        return ENGINES[engine]
    raise ValueError(f"engine={show(engine)} is unknown; allowed: {', '.join(ENGINES)} or an EngineProfile")

