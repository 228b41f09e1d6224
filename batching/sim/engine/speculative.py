"""Speculative decoding (DESIGN §2 "Beyond one queue"): the policy's knobs -> the engine's ``Spec``.

Each step a speculating decode sequence verifies k + 1 tokens (k proposed draft tokens and the one the target
adds), accepts a sampled number of the proposals (each with probability A, stopping at the first rejection,
at most k) and emits accepted + 1 tokens. The expected tokens per verification is (1 − A^(K+1)) / (1 − A)
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", ICML, eq. 1, with
A the per-token acceptance rate α).

What a step costs (engine/kernel.py prices it; nothing here is a new constant of the target's cost model):

- Verification is the target's forward pass over the k + 1 tokens of each speculating sequence: they count
  as tokens of the step for the linear layers, element-wise ops, all-reduces and the LM head, so a small
  batch stays memory-bound (the weights are read once for all of them: nearly free) and a large one turns
  compute-bound (every verified token costs FLOPs), which is where the gain shrinks and turns into a loss
  (vLLM, "How Speculative Decoding Boosts vLLM Performance by up to 2.8x", blog 2024-10-17, Llama-3-70B on
  4xH100: at QPS 1 up to 1.5x faster on ShareGPT with a draft model and 2.8x on CNN/DailyMail with n-grams; at
  high QPS 1.4x and 1.8x slower). Attention reads each sequence's
  context once for its k + 1 queries (a multi-query decode kernel, as vLLM's FlashAttention/FlashInfer paths
  run verification: the KV is loaded once per step, the k + 1 queries of a GQA group of 8 stay far below the
  ridge, ~32 FLOP/byte against ~300 on H100), so with long contexts the KV read dominates and costs the same
  for k + 1 tokens as for one: decode stays memory-bound at larger batches and the gain holds (MagicDec,
  Chen et al. 2024, arXiv:2408.11049, §3: "for moderate to long sequences, LLM decoding remains
  memory-bound even at large batch sizes, KV loading being the bottleneck").
- Rejected tokens are computed for nothing: they are the step's ``padded_tokens``, so ``gpu_util`` (useful
  share of the step's token slots) falls with the rejection rate, as for a static batch's padding.
- The proposals: ``draft`` runs a smaller model of the family K times per step over the speculating
  sequences (its own cost model: linear layers, element-wise ops, all-reduces, its KV read and its LM head);
  ``eagle`` runs the EAGLE head K times: one decoder layer plus a fully connected layer fusing the embedding
  and the feature (2·hidden² weights), with the target's LM head (Li et al. 2024, "EAGLE: Speculative
  Sampling Requires Rethinking Feature Uncertainty", ICML 2024, arXiv:2401.15077: the draft model reuses the
  target's embedding and LM head, its autoregression head is an FC layer and one decoder layer, under 1B
  parameters for LLaMA2-Chat 70B; acceptance ~0.8 per token); ``mtp`` runs DeepSeek-V3's MTP module the same
  way (DeepSeek-V3 Technical Report, arXiv:2412.19437, §2.2: a shared embedding and output head, one
  Transformer block and a d×2d projection matrix per module; §5.4.3: the second token is accepted 85-90 % of
  the time, 1.8x the tokens per second); ``ngram`` proposes by prompt lookup on the CPU (vLLM's n-gram
  proposer), no GPU work.
- Memory: a draft model's weights and its KV cache (per token, as the target's) share the GPUs with the
  target's, and the EAGLE/MTP head's one layer likewise: the target's KV capacity shrinks accordingly (vLLM's
  blog above: "the memory manager now handles the KV cache for both the draft and target models").
- speculative_disable_by_batch_size: vLLM PR #4592 ("[Dynamic Spec Decoding] Auto-disable by the running
  queue size"): speculation off for the batch while N or more requests run (the engine's comment cites the code).

- The proposer's passes (vLLM V1's EAGLE proposer, SGLang's EAGLE worker): the first runs over every prompt token
  the step computes (a draft model prefills; a head runs over every scheduled token) and over each speculating
  sequence's accepted tokens plus one (the catch-up), the other k - 1 over one token per sequence; each pass
  carries DRAFT_PASS_FIXED_S (launch, sampling; docs/CALIBRATION.md "Speculative decoding").
- Acceptance may be given as engines report it, tokens per verification step (acceptance_from_length).

Simplifications: the catch-up is priced in the step whose verification accepts the tokens (the engines run it as
the next proposal's first pass); draft passes carry the mean k of the step's speculating sequences; a sequence
swapped back in decodes plainly in that step; tree drafts are priced as chains (CALIBRATION.md says why).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from batching.sim.hardware.costmodel import (
    C_ATTN_FLOPS_COEF, C_ATTN_RATE, C_FIXED, C_GRAPH_SAVING_S, C_KV_BW, C_KV_BYTES_TOK_LAYER, C_LAYERS, C_LM_BW,
    C_LM_BYTES, C_LM_FLOPS_RATE, C_LM_FLOPS_SEQ, CostModel, cost_model, token_time_table_nb,
)
from batching.sim.engine.state import NUM_SPF, NUM_SPI, Spec
from batching.sim.policy import SPEC_METHODS  # noqa: F401  (the methods, named once)
from batching.sim.hardware.specs import GIB, KV_BLOCK_TOKENS, MODELS, Deployment, Model

# A draft pass's fixed cost (seconds): the launch of its CUDA graph, sampling its top-k token(s) and building the
# next pass's inputs, outside the kernels its cost model prices. Fitted (studies/spec_check.fit_draft_fixed) to
# SGLang's measured batch-1 throughput of Llama-3.1-8B-Instruct on one H100 with EAGLE-2 and EAGLE-3 (SGLang docs,
# "Speculative Decoding": 158.34 tok/s without, 244.10 with EAGLE-2, 373.25 with EAGLE-3; sgl-project/sglang
# PR #4247: 361.70 tok/s with 5 EAGLE-3 steps), at the acceptance lengths those runs reported; docs/CALIBRATION.md.
# Refitted (0.91 -> 0.84 ms) when the target's pure-decode steps began to replay one CUDA graph (0.42 ms less CPU
# time each with the default vllm profile the fit runs).
DRAFT_PASS_FIXED_S = 0.84e-3

# methods whose proposals cost GPU passes, and which of them are one-layer heads on the target
DRAFTING_METHODS = ("draft", "eagle", "mtp")
HEAD_METHODS = ("eagle", "mtp")


def expected_tokens_per_step(k: int, a: float) -> float:
    """Expected tokens a speculating sequence emits per verification: (1 − A^(K+1)) / (1 − A) (K + 1 at A = 1)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_from_length(length: float, k: int) -> float:
    """The per-token acceptance A whose expected tokens per verification (1 − A^(K+1)) / (1 − A) is ``length`` (the
    "mean acceptance length" vLLM's spec-decode metrics and SGLang's "accept length" report: tokens per
    verification step, the bonus token included). L = 1 gives A = 0, L = K + 1 gives A = 1; the expectation grows
    monotonically with A, so bisection finds it to 1e-12. ValueError outside 1 .. K + 1."""
    if not (1.0 <= length <= k + 1):  # (NaN fails too)
        raise ValueError(f"spec_acceptance_length={length:g} is out of range for spec_tokens={k}; allowed 1 to "
                         f"{k + 1} (tokens per verification step: the accepted drafts plus the target's own token)")
    if length >= k + 1:
        return 1.0
    if length <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_tokens_per_step(k, mid) < length:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def acceptance_rate(policy) -> float:
    """A of a policy: its spec_acceptance, or the one its spec_acceptance_length gives (when set, > 0)."""
    if policy.spec_acceptance_length > 0:
        return acceptance_from_length(float(policy.spec_acceptance_length), int(policy.spec_tokens))
    return float(policy.spec_acceptance)


def head_layers(dep: Deployment) -> float:
    """An EAGLE head or MTP module in target layers: one decoder layer plus the 2·hidden × hidden fusion."""
    m = dep.model
    return 1.0 + 2.0 * m.hidden_size * m.hidden_size / m.active_linear_params_per_layer


def draft_deployment(dep: Deployment, draft_model: str) -> Deployment:
    """The draft model on the target's GPUs: at the target's TP degree when it divides the draft's heads, else at
    TP 1. vLLM allows a draft only these two degrees (vllm/config/speculative.py, SpeculativeConfig: its
    draft_tensor_parallel_size "can only be 1 or the same as the target model's tensor parallel size",
    _verify_and_get_draft_tp; it defaults to the target's), and a degree must divide the heads
    (ModelConfig.verify_with_parallel_config); Qwen2.5-7B's 28 heads under TP 8 run at TP 1, not 4."""
    if draft_model not in MODELS:
        raise ValueError(f"spec_draft_model={draft_model!r} is unknown; allowed: {', '.join(MODELS)}")
    m = MODELS[draft_model]
    tp = dep.node.tp if m.num_heads % dep.node.tp == 0 else 1
    return replace(dep, model=m, node=replace(dep.node, tp=tp), kv_cache_tokens=None)


def accepted_drafts(target: Model) -> list[str]:
    """The presets that can draft for ``target``, smallest first: the target's vocabulary (vLLM refuses a draft
    whose vocab_size differs from the target's, since token ids of another tokenizer mean other tokens:
    vllm/config/speculative.py, verify_equal_vocab_size_if_draft_model) and fewer parameters (a draft as large as
    the target saves nothing)."""
    ok = [k for k, m in MODELS.items() if m.vocab_size == target.vocab_size and m.num_params < target.num_params]
    return sorted(ok, key=lambda k: MODELS[k].num_params)


def default_draft(target: Model) -> str | None:
    """The draft of --spec-decode draft when none is named: the smallest accepted preset (None: there is none)."""
    ok = accepted_drafts(target)
    return ok[0] if ok else None


def _allowed_drafts(target: Model) -> str:
    ok = accepted_drafts(target)
    return ", ".join(ok) if ok else "none of the presets (use eagle or ngram)"


def check_spec(policy, dep: Deployment) -> None:
    """Refuse what no engine would run: MTP on a model without MTP modules, a draft model of another vocabulary or
    not smaller than the target, and a proposer whose weights leave no room for the KV cache. One line naming the
    field, the value and what is allowed."""
    method = policy.spec_decode
    if method == "off" or policy.mode != "continuous":
        return
    m = dep.model
    if method == "mtp" and m.mtp_layers <= 0:
        have = ", ".join(k for k, x in MODELS.items() if x.mtp_layers > 0)
        raise ValueError(f"spec_decode='mtp' needs multi-token-prediction modules published with the model, and "
                         f"{m.name} has no multi-token-prediction module; allowed for models that have them: {have} "
                         "(or a config.json with num_nextn_predict_layers > 0); use draft, eagle or ngram for "
                         f"{m.name}")
    if method == "draft":
        name = policy.spec_draft_model
        if name not in MODELS:
            raise ValueError(f"spec_draft_model={name!r} is unknown; allowed: {', '.join(MODELS)}")
        d = MODELS[name]
        why = None
        if d.vocab_size != m.vocab_size:
            why = (f"its vocabulary of {d.vocab_size:,} tokens, not {m.name}'s {m.vocab_size:,}, is another "
                   "tokenizer's (vLLM refuses the pair)")
        elif d.num_params >= m.num_params:
            why = (f"{d.name} ({d.num_params / 1e9:.1f}B parameters) is not smaller than {m.name} "
                   f"({m.num_params / 1e9:.1f}B)")
        if why:
            raise ValueError(f"spec_draft_model={name!r} cannot draft for {m.name}: {why}; {m.name} accepts: "
                             f"{_allowed_drafts(m)}")
    if method in DRAFTING_METHODS and spec_kv_blocks(policy, replace(dep, kv_cache_tokens=None)) < 1:
        w, _ = draft_memory_per_gpu(policy, dep)
        room = max(0.0, dep.kv_bytes_available_per_gpu) / GIB
        head = "EAGLE head" if method == "eagle" else "MTP module"
        what = (f"spec_draft_model={policy.spec_draft_model!r}: the draft model {MODELS[policy.spec_draft_model].name}"
                if method == "draft" else f"spec_decode={method!r}: the {head}")
        fix = (f"a smaller draft ({m.name} accepts: {_allowed_drafts(m)}), eagle or ngram" if method == "draft"
               else "ngram, more GPUs per replica (tp) or a GPU with more memory")
        raise ValueError(f"{what} does not fit beside {m.name} in {dep.precision} on {dep.node.gpu.name} with "
                         f"tp={dep.node.tp}: it needs {w / GIB:.1f} GiB per GPU and its KV cache, but the target "
                         f"leaves {room:.1f} GiB per GPU for it and the KV cache together, at any KV cache size; "
                         f"use {fix}")


def _draft_cost(policy, dep: Deployment, allreduce: str, engine=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The proposer's coefficients, with the target's engine profile (its kernel factors; its per-step CPU time is the
    target step's)."""
    if policy.spec_decode == "draft":
        cm = cost_model(draft_deployment(dep, policy.spec_draft_model), allreduce, engine)
        coef = cm.coef.copy()
    else:
        cm = cost_model(dep, allreduce, engine)
        coef = cm.coef.copy()
        coef[C_LAYERS] = head_layers(dep)
    coef[C_FIXED] = 0.0  # inside the target's scheduler step
    coef[C_GRAPH_SAVING_S] = 0.0  # (so no CUDA-graph saving of a fixed time it does not pay)
    return coef, cm.ar_log_bytes, cm.ar_s


def draft_memory_per_gpu(policy, dep: Deployment) -> tuple[float, float]:
    """(weight bytes, KV bytes per token) the proposer adds on each GPU of the target's group."""
    if policy.spec_decode == "draft":
        d = draft_deployment(dep, policy.spec_draft_model)
        return d.weight_bytes_per_gpu, d.kv_bytes_per_token_per_gpu
    if policy.spec_decode in HEAD_METHODS:
        frac = head_layers(dep) / dep.model.num_layers
        return frac * dep.linear_weight_bytes_per_gpu, frac * dep.kv_bytes_per_token_per_gpu
    return 0.0, 0.0


def spec_kv_blocks(policy, dep: Deployment) -> int:
    """The target's KV blocks per replica once the proposer's weights and KV share the memory (the user's
    ``kv_cache_tokens`` override still caps it)."""
    base = dep.kv_capacity_blocks
    if policy.spec_decode not in DRAFTING_METHODS:
        return base
    w, kv = draft_memory_per_gpu(policy, dep)
    per_block = (dep.kv_bytes_per_token_per_gpu + kv) * KV_BLOCK_TOKENS
    blocks = int(max(0.0, dep.kv_bytes_available_per_gpu - w) // per_block)
    return min(base, blocks)


def spec_for(policy, dep: Deployment, cm: CostModel | None = None, seed: int = 0, allreduce: str | None = None
             ) -> Spec | None:
    """The engine's Spec for a policy (None when speculation is off)."""
    if policy.spec_decode == "off" or policy.mode != "continuous":
        return None
    a = acceptance_rate(policy)
    inv = 0.0 if a <= 0.0 else (-math.inf if a >= 1.0 else 1.0 / math.log(a))
    disable = policy.spec_disable_batch_size if policy.spec_disable_batch_size > 0 else 1 << 62
    drafts = policy.spec_decode in DRAFTING_METHODS
    # one row per token count a draft pass can run over: the first pass takes the step's prompt tokens (at most the
    # budget) and each speculating sequence's accepted tokens + 1 (at most max_num_seqs more than the budget)
    size = policy.max_num_seqs + policy.max_num_batched_tokens + 1
    if drafts:
        ar = allreduce if allreduce is not None else (cm.allreduce if cm is not None else "vllm_graph")
        coef, ar_x, ar_y = _draft_cost(policy, dep, ar, cm.engine if cm is not None else None)
        tab = draft_pass_table(coef, ar_x, ar_y, size)
        ctx_s = coef[C_LAYERS] * coef[C_KV_BYTES_TOK_LAYER] / coef[C_KV_BW]
        lm_f = coef[C_LM_FLOPS_SEQ] / coef[C_LM_FLOPS_RATE]  # the draft's LM head: BF16, as the target's
        lm_b = coef[C_LM_BYTES] / coef[C_LM_BW]
        attn_s = coef[C_LAYERS] * coef[C_ATTN_FLOPS_COEF] / coef[C_ATTN_RATE]
    else:
        tab, ctx_s, lm_f, lm_b, attn_s = np.zeros(size), 0.0, 0.0, 0.0, 0.0
    return Spec(int(policy.spec_tokens), float(inv), int(disable), int(seed) % (2 ** 32), bool(drafts),
                np.ascontiguousarray(tab, np.float64), float(ctx_s), float(lm_f), float(lm_b), float(attn_s),
                np.ones(1, np.int64), np.zeros(1, np.int64), np.zeros((1, NUM_SPI), np.int64), np.zeros((1, NUM_SPF)))


def draft_pass_table(coef: np.ndarray, ar_x: np.ndarray, ar_y: np.ndarray, size: int) -> np.ndarray:
    """Seconds of one draft pass over 0 .. size - 1 tokens: the draft's linear layers, element-wise ops and its
    all-reduces (its own cost model's token_time_nb: two all-reduces per layer from the measured table at the draft's
    TP degree, none at TP 1) plus DRAFT_PASS_FIXED_S for every pass that runs (n >= 1)."""
    tab = token_time_table_nb(coef, ar_x, ar_y, size)
    tab[1:] += DRAFT_PASS_FIXED_S
    return tab
