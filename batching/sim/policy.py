"""Batching policies: a mode plus its knobs, and the named presets of the classic comparison."""
from __future__ import annotations

from dataclasses import dataclass, replace

from batching.sim.checks import check_int, check_range
from batching.sim.engine.state import (
    Knobs, MODE_CONTINUOUS, MODE_DYNAMIC, MODE_STATIC, PREEMPT_OFF, PREEMPT_RECOMPUTE, PREEMPT_SWAP,
)
from batching.sim.hardware.specs import MODELS

# names -> the engine's integer codes (engine.state holds the enums)
MODE_CODE = {"static": MODE_STATIC, "dynamic": MODE_DYNAMIC, "continuous": MODE_CONTINUOUS}
PREEMPTION_CODE = {"off": PREEMPT_OFF, "recompute": PREEMPT_RECOMPUTE, "swap": PREEMPT_SWAP}
MODES = tuple(MODE_CODE)
PREEMPTION_MODES = tuple(PREEMPTION_CODE)
# speculative decoding methods (batching/sim/engine/speculative.py prices them)
SPEC_METHODS = ("off", "draft", "eagle", "ngram", "mtp")
DEFAULT_DRAFT_MODEL = "qwen2.5-7b"  # the default target's family (Qwen2.5-72B)
# vLLM V0's step budget when nobody sets max_num_batched_tokens: without chunked prefill max(max_model_len, 2048), with
# it 2048 (vllm/config.py SchedulerConfig.__post_init__, _DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048)
V0_MIN_BUDGET = 2048
# knob -> (lowest, highest) value a policy accepts: validate() checks them, the CLI's options, the dashboard's
# widgets and links, and sweep ranges read them (the one place they are defined)
KNOB_LIMITS: dict[str, tuple[float, float]] = {
    "max_batch_size": (1, 4096),
    "max_wait_s": (0.0, 3600.0),
    "max_num_seqs": (1, 4096),
    "max_num_batched_tokens": (16, 1_048_576),
    "swap_space_gib": (0.0, 4096.0),
    "watermark": (0.0, 0.5),
    "spec_tokens": (1, 16),  # K draft tokens per step (vLLM num_speculative_tokens)
    "spec_acceptance": (0.0, 1.0),  # A, per-token acceptance probability
    # L, mean tokens per verification step as vLLM ("mean acceptance length") and SGLang ("accept length") report
    # it, the bonus token included; 0 = not given (A is spec_acceptance). validate() also holds it to 1 .. K + 1
    "spec_acceptance_length": (0.0, 17.0),
    "spec_disable_batch_size": (0, 4096),  # 0: speculate at every batch size
}
# knobs validate() refuses unless whole numbers (the others are range-checked only)
_WHOLE_KNOBS = ("spec_tokens", "spec_disable_batch_size")


@dataclass(frozen=True)
class BatchingPolicy:
    """One scheduling policy. Request-level modes (static, dynamic) use ``max_batch_size``
    and ``max_wait_s``; the iteration-level mode (continuous) uses the rest."""

    mode: str = "continuous"
    max_batch_size: int = 32  # static / dynamic: requests per batch
    max_wait_s: float = 0.1  # dynamic: the oldest request waits at most this long
    max_num_seqs: int = 256  # continuous: running sequences per step (vLLM default 256)
    max_num_batched_tokens: int = 8192  # continuous: token budget per step (= chunk size when chunked)
    chunked_prefill: bool = False
    priority: bool = False  # order the waiting queue by (class, arrival)
    preemption: str = "recompute"  # off | recompute | swap
    swap_space_gib: float = 4.0  # host swap space per GPU (vLLM default 4 GiB)
    # share of KV blocks kept free when admitting: vLLM V0's BlockSpaceManager kept 1 % (watermark=0.01); V1's
    # KVCacheManager.allocate_slots keeps none (vllm/v1/core/kv_cache_manager.py)
    watermark: float = 0.0
    # engine rules that are not vLLM V1's, each named for the schedulers that have it:
    # without chunked prefill, a step that admits prompts is prefill-only and its decodes stall: vLLM V0
    # (vllm/core/scheduler.py, Scheduler._schedule_default) and SGLang without --enable-mixed-chunk (a prefill batch
    # and a decode batch run apart); V1 mixes whole prompts with the decodes in the step's budget
    prefill_only_steps: bool = False
    # vLLM V0 with priority: running requests of lower classes are preempted so a waiting one can be admitted
    # (vllm/core/scheduler.py, Scheduler._schedule_priority_preemption); V1 preempts only when a running request
    # needs blocks
    preempt_for_waiting: bool = False
    # automatic prefix caching (vLLM V1, SGLang RadixAttention): prompt blocks already in the KV cache are not
    # computed again. Iteration-level engines only: the request-level batchers modelled (FasterTransformer,
    # Triton's dynamic batcher) have no prefix cache.
    prefix_caching: bool = False
    # speculative decoding (iteration-level only): off | draft (a smaller model of the family, spec_draft_model)
    # | eagle (EAGLE draft head) | ngram (prompt lookup) | mtp (DeepSeek-V3 multi-token-prediction module). Each
    # step a decoding sequence verifies spec_tokens (K) proposed tokens + 1, each accepted with probability
    # spec_acceptance (A); speculation is off while spec_disable_batch_size or more sequences run (vLLM's
    # speculative_disable_by_batch_size; 0 = never off; 1, never on, is refused as vLLM refuses it)
    spec_decode: str = "off"
    spec_tokens: int = 3
    spec_acceptance: float = 0.8
    spec_draft_model: str = DEFAULT_DRAFT_MODEL
    spec_disable_batch_size: int = 0
    # acceptance as engines report it: mean tokens per verification step L (incl. the target's bonus token); when
    # > 0 it replaces spec_acceptance by the A with (1 - A^(K+1)) / (1 - A) = L (speculative.acceptance_from_length)
    spec_acceptance_length: float = 0.0
    # where spec_acceptance comes from when it was not given: the published row (batching/data/spec_acceptance.csv)
    # or the flat default, said as such (engine/spec_table.with_default_acceptance); empty: given by the user
    spec_acceptance_source: str = ""
    # the step budget as vLLM V0 sizes it when nobody sets it: without chunked prefill max(max_model_len, 2048) (the
    # deployment's model context, and at least the longest prompt), so every prompt fits one step; a Scenario fills it
    # in from its deployment (``sized_for``). An explicit max_num_batched_tokens (``with_knobs``) turns it off.
    budget_from_context: bool = False

    @property
    def sizes_budget(self) -> bool:
        """True when the step budget comes from the model's context (continuous, no chunked prefill, not set)."""
        return self.budget_from_context and self.mode == "continuous" and not self.chunked_prefill

    def sized_for(self, context_tokens: int, longest_prompt: int = 0) -> "BatchingPolicy":
        """This policy with the step budget vLLM V0 gives it on a model of ``context_tokens`` (max_model_len; 0 = not
        stated): max(max_model_len, 2048), at least ``longest_prompt``; the policy itself when the budget is set, or
        when neither is known."""
        if not self.sizes_budget or not (context_tokens or longest_prompt):
            return self  # set by the user, or nothing known yet (no stated context: the run sizes it from its prompts)
        budget = max(int(context_tokens or 0), V0_MIN_BUDGET, int(longest_prompt or 0))
        budget = min(budget, int(KNOB_LIMITS["max_num_batched_tokens"][1]))
        return self if budget == self.max_num_batched_tokens else replace(self, max_num_batched_tokens=budget)

    def unsized(self) -> "BatchingPolicy":
        """The policy before a deployment sized its budget (``sized_for``): what compares equal to its preset."""
        return replace(self, max_num_batched_tokens=V0_MIN_BUDGET) if self.sizes_budget else self

    def with_acceptance(self, a: float, source: str) -> "BatchingPolicy":
        """This policy speculating with per-token acceptance ``a`` taken from ``source`` (not the user's)."""
        return replace(self, spec_acceptance=float(a), spec_acceptance_length=0.0, spec_acceptance_source=source)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not allowed; allowed: {', '.join(MODES)}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption={self.preemption!r} is not allowed; allowed: {', '.join(PREEMPTION_MODES)}"
            )
        for name, (low, high) in KNOB_LIMITS.items():
            (check_int if name in _WHOLE_KNOBS else check_range)(name, getattr(self, name), low, high)
        if self.mode != "continuous" and (self.chunked_prefill or self.priority or self.prefix_caching):
            raise ValueError(
                f"chunked_prefill, priority and prefix_caching need mode='continuous' (mode={self.mode!r})"
            )
        if self.spec_decode not in SPEC_METHODS:
            raise ValueError(f"spec_decode={self.spec_decode!r} is not allowed; allowed: {', '.join(SPEC_METHODS)}")
        if self.spec_decode != "off" and self.mode != "continuous":
            raise ValueError(f"spec_decode={self.spec_decode!r} needs mode='continuous' (mode={self.mode!r})")
        if self.spec_decode != "off" and self.spec_disable_batch_size == 1:
            # vLLM's SpeculativeConfig refuses a threshold below 2 ("Expect the batch size threshold of disabling
            # speculative decoding is > 1"): with its >= rule, 1 would switch speculation off in every step
            raise ValueError("spec_disable_batch_size=1 would never speculate; allowed 0 (never off) or 2 to 4096")
        length = self.spec_acceptance_length
        if length != 0 and not (1.0 <= length <= self.spec_tokens + 1):
            raise ValueError(f"spec_acceptance_length={length:g} is out of range for spec_tokens={self.spec_tokens}; "
                             f"allowed 0 (not given: spec_acceptance applies) or 1 to {self.spec_tokens + 1} (tokens "
                             "per verification step: the accepted drafts plus the target's own token)")
        if self.spec_decode == "draft":
            if self.spec_draft_model not in MODELS:
                raise ValueError(
                    f"spec_draft_model={self.spec_draft_model!r} is unknown; allowed: {', '.join(MODELS)}")

    def knobs(self, n_classes: int, kv_blocks: int, swap_cap_tokens: int, *, mode: str | None = None,
              chunked: bool | None = None) -> Knobs:
        """The engine's Knobs for this policy on a cache of ``kv_blocks`` with ``swap_cap_tokens`` of host swap
        space. ``mode`` and ``chunked`` override the policy's (a disaggregated decode instance runs continuous,
        chunked: it only ever takes in one token per request)."""
        return Knobs(mode=MODE_CODE[self.mode if mode is None else mode], n_classes=int(n_classes),
                     max_batch=int(self.max_batch_size), max_wait_s=float(self.max_wait_s),
                     max_seqs=int(self.max_num_seqs), budget=int(self.max_num_batched_tokens),
                     chunked=bool(self.chunked_prefill if chunked is None else chunked), use_prio=bool(self.priority),
                     preempt=PREEMPTION_CODE[self.preemption], swap_cap_tokens=int(swap_cap_tokens),
                     watermark_blocks=int(self.watermark * kv_blocks), kv_blocks=int(kv_blocks),
                     prefill_only=bool(self.prefill_only_steps), wait_preempt=bool(self.preempt_for_waiting))

    @property
    def batch_cap(self) -> int:
        """The cap batch efficiency is measured against."""
        return self.max_num_seqs if self.mode == "continuous" else self.max_batch_size

    def describe(self) -> str:
        if self.mode == "static":
            return f"static batching, batch {self.max_batch_size}"
        if self.mode == "dynamic":
            return f"dynamic batching, max batch {self.max_batch_size}, max wait {self.max_wait_s * 1e3:g} ms"
        if self.sizes_budget:
            n = self.max_num_batched_tokens
            budget = (f"max(max_model_len, {V0_MIN_BUDGET}){f' = {n:,}' if n > V0_MIN_BUDGET else ''} tokens/step "
                      "as vLLM V0 sizes it")
        else:
            budget = f"{self.max_num_batched_tokens} tokens/step"
        parts = [f"continuous batching, max {self.max_num_seqs} seqs, {budget}"]
        if self.chunked_prefill:
            parts.append("chunked prefill")
        if self.priority:
            parts.append("priority classes")
        if self.prefix_caching:
            parts.append("prefix caching")
        if self.spec_decode != "off":
            what = f"draft {self.spec_draft_model}" if self.spec_decode == "draft" else self.spec_decode
            limit = f", off at {self.spec_disable_batch_size}+ seqs" if self.spec_disable_batch_size else ""
            acc = (f"acceptance length {self.spec_acceptance_length:g}" if self.spec_acceptance_length > 0
                   else f"A={self.spec_acceptance:g}")
            parts.append(f"speculative decoding ({what}, K={self.spec_tokens}, {acc}{limit})")
        parts.append(f"preemption {self.preemption}")
        return ", ".join(parts)


PRESETS: dict[str, BatchingPolicy] = {
    # FasterTransformer-style request-level batching of 32
    "static": BatchingPolicy(mode="static", max_batch_size=32),
    # Triton dynamic batcher: up to 64, the oldest waits at most 100 ms
    "dynamic": BatchingPolicy(mode="dynamic", max_batch_size=64, max_wait_s=0.1),
    # vLLM V1 (0.11) with chunked prefill off (--no-enable-chunked-prefill): 256 sequences, whole prompts mixed with the
    # decodes in a budget of max(max_model_len, 2048) tokens, recompute preemption, prefix caching on (vLLM V1 and
    # SGLang default to it; with no shared prefixes its block pool still gives a recompute victim back the blocks it
    # computed that survive). vLLM V0's prefill-only steps are the policy's prefill_only_steps rule.
    "continuous": BatchingPolicy(mode="continuous", max_num_batched_tokens=V0_MIN_BUDGET, prefix_caching=True,
                                 budget_from_context=True),
    # vLLM V1 / Sarathi-Serve: mixed steps with a 2,048-token budget
    "chunked": BatchingPolicy(mode="continuous", chunked_prefill=True, max_num_batched_tokens=2048,
                              prefix_caching=True),
    # chunked prefill plus priority classes that preempt lower classes
    "priority": BatchingPolicy(mode="continuous", chunked_prefill=True, max_num_batched_tokens=2048,
                               priority=True, preemption="recompute", prefix_caching=True),
}

# vLLM V0's continuous batching (the engine of published vLLM 0.6 runs): the continuous preset with V0's prefill-only
# steps and its 1 % admission watermark (vllm/core/scheduler.py, vllm/core/block_manager.py)
V0_CONTINUOUS = replace(PRESETS["continuous"], prefill_only_steps=True, watermark=0.01)
# policies that published settings name beside the presets (published_points.csv's policy column)
NAMED_POLICIES: dict[str, BatchingPolicy] = {**PRESETS, "continuous-v0": V0_CONTINUOUS}


def preset(name: str) -> BatchingPolicy:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset={name!r} is unknown; allowed: {', '.join(PRESETS)}") from None


def with_knobs(policy: BatchingPolicy, **knobs) -> BatchingPolicy:
    """A copy with the given knobs changed (None values are ignored), validated. A max_num_batched_tokens given is the
    user's: the budget no longer follows the model's context; a method or acceptance given drops the source of a
    looked-up acceptance (spec_acceptance_source)."""
    given = {k: v for k, v in knobs.items() if v is not None}
    if "max_num_batched_tokens" in given and "budget_from_context" not in given:
        given["budget_from_context"] = False
    if given.keys() & {"spec_decode", "spec_acceptance", "spec_acceptance_length"} and \
            "spec_acceptance_source" not in given:
        given["spec_acceptance_source"] = ""  # a looked-up acceptance no longer holds: the method or A changed
    p = replace(policy, **given)
    p.validate()
    return p
