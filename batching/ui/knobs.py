"""Policy knobs (start from a preset, every knob of its mode) and the scenario knobs of Explore."""
from __future__ import annotations

from dataclasses import dataclass, replace

import streamlit as st

from batching.sim.engine.spec_table import spec_text, with_default_acceptance
from batching.sim.policy import KNOB_LIMITS, PREEMPTION_MODES, PRESETS, SPEC_METHODS, BatchingPolicy, with_knobs
from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import KV_BLOCK_TOKENS, MODELS
from batching.sim.workload.requests import SyntheticWorkload
from batching.ui import state
from batching.ui.params import Param
from batching.ui.safe import plain

NONE = "none"
KV_MIN_TOKENS = 1024
KV_STEP_TOKENS = 1024
# URL key -> (policy field, divisor from the URL/widget value to the field's unit)
FIELDS = {
    "batch": ("max_batch_size", None),
    "wait_ms": ("max_wait_s", 1000),
    "seqs": ("max_num_seqs", None),
    "budget": ("max_num_batched_tokens", None),
    "chunked": ("chunked_prefill", None),
    "prio": ("priority", None),
    "preempt": ("preemption", None),
    "cache": ("prefix_caching", None),
    "spec": ("spec_decode", None),
    "spec_k": ("spec_tokens", None),
    "spec_a": ("spec_acceptance", 100),  # percent in the URL and on the slider
    "spec_len": ("spec_acceptance_length", None),  # tokens per verification; 0: not given (A applies)
    "spec_model": ("spec_draft_model", None),
    "spec_off": ("spec_disable_batch_size", None),
}
# URL key -> (lowest, highest, step) of its slider, in the widget's unit (ms for the wait): the link accepts the
# same range. A dashboard range, inside what the policy accepts (``sim.policy.KNOB_LIMITS``, what the CLI takes)
SLIDERS = {
    "batch": (1, 512, 1),
    "wait_ms": (0, 2000, 10),
    "seqs": (1, 1024, 1),
    "budget": (64, 16384, 64),
    "spec_k": (1, 16, 1),
    "spec_a": (0, 100, 5),
    "spec_off": (0, 1024, 1),
}
MODE_KNOBS = {
    "static": ("batch",),
    "dynamic": ("batch", "wait_ms"),
    "continuous": ("seqs", "budget", "chunked", "prio", "preempt", "cache", "spec", "spec_k", "spec_a", "spec_len",
                   "spec_model", "spec_off"),
}
SPEC_HELP = ("Speculative decoding: each step a decoding sequence verifies K proposed tokens + 1 and keeps the "
             "accepted ones (draft: a smaller model of the family; eagle: an EAGLE draft head; ngram: prompt "
             "lookup, no draft compute; mtp: DeepSeek-V3's multi-token-prediction module). It cuts TPOT at low "
             "load; at large batches verification turns compute-bound and the gain shrinks or turns into a loss.")
SPEC_LEN_HELP = ("The acceptance as engines report it: mean tokens per verification step, the target's own token "
                 "included (vLLM's spec-decode metrics: mean acceptance length; SGLang: accept length). Between 1 "
                 "and K + 1; when set it replaces A by the A that gives it, (1 − A^(K+1)) / (1 − A) = this length. "
                 "0: not given, A applies.")
PREFIX_CACHING_HELP = ("Automatic prefix caching (vLLM V1, SGLang RadixAttention): prompt blocks already in the KV "
                       "cache (a shared system prompt, a conversation's history) are not computed again; free "
                       "cached blocks are evicted LRU when space is needed. It changes nothing when no prompts "
                       "share a prefix. Static and dynamic batching have no prefix cache.")
PRESET_HELP = "\n".join(f"- **{k}**: {p.describe()}" for k, p in PRESETS.items())


@dataclass(frozen=True)
class PolicyChoice:
    preset: str
    policy: BatchingPolicy | None  # None when the knobs are invalid
    error: str | None
    customised: bool

    @property
    def label(self) -> str:
        return self.preset + ("*" if self.customised else "")


def _defaults(base: BatchingPolicy) -> dict:
    return {
        "batch": base.max_batch_size,
        "wait_ms": int(round(base.max_wait_s * 1e3)),
        "seqs": base.max_num_seqs,
        "budget": base.max_num_batched_tokens,
        "chunked": base.chunked_prefill,
        "prio": base.priority,
        "preempt": base.preemption,
        "cache": base.prefix_caching,
        "spec": base.spec_decode,
        "spec_k": base.spec_tokens,
        "spec_a": int(round(base.spec_acceptance * 100)),
        "spec_len": float(base.spec_acceptance_length),
        "spec_model": base.spec_draft_model,
        "spec_off": base.spec_disable_batch_size,
    }


def knob_params(prefix: str, base: BatchingPolicy) -> list[Param]:
    d = _defaults(base)
    every = {
        "batch": Param(prefix + "batch", d["batch"], *SLIDERS["batch"][:2], label="max batch size"),
        "wait_ms": Param(prefix + "wait_ms", d["wait_ms"], *SLIDERS["wait_ms"][:2], label="max wait (ms)"),
        "seqs": Param(prefix + "seqs", d["seqs"], *SLIDERS["seqs"][:2], label="max running sequences"),
        "budget": Param(prefix + "budget", d["budget"], *SLIDERS["budget"][:2], label="token budget per step"),
        "chunked": Param(prefix + "chunked", d["chunked"], label="chunked prefill"),
        "prio": Param(prefix + "prio", d["prio"], label="priority classes"),
        "preempt": Param(prefix + "preempt", d["preempt"], choices=PREEMPTION_MODES, label="preemption"),
        "cache": Param(prefix + "cache", d["cache"], label="prefix caching"),
        "spec": Param(prefix + "spec", d["spec"], choices=SPEC_METHODS, label="speculative decoding"),
        "spec_k": Param(prefix + "spec_k", d["spec_k"], *SLIDERS["spec_k"][:2], label="draft tokens K"),
        "spec_a": Param(prefix + "spec_a", d["spec_a"], *SLIDERS["spec_a"][:2], label="acceptance A (%)"),
        "spec_len": Param(prefix + "spec_len", d["spec_len"], *KNOB_LIMITS["spec_acceptance_length"],
                          label="mean acceptance length (tokens per verification)"),
        "spec_model": Param(prefix + "spec_model", d["spec_model"], choices=tuple(MODELS), label="draft model"),
        "spec_off": Param(prefix + "spec_off", d["spec_off"], *SLIDERS["spec_off"][:2],
                          label="speculation off from (sequences)"),
    }
    return [every[k] for k in MODE_KNOBS[base.mode]]


def preset_param(prefix: str, default: str, optional: bool = False) -> Param:
    choices = tuple(PRESETS) + ((NONE,) if optional else ())
    return Param(prefix + "policy", default, choices=choices, label="policy preset")


def _preset_changed(prefix: str) -> None:
    name = st.session_state[state.widget_key(prefix + "policy")]
    state.set_value(prefix + "policy", name)
    if name in PRESETS:
        for k, v in _defaults(PRESETS[name]).items():
            state.set_value(prefix + k, v)
    state.clear_notices()


def _reset_knobs(prefix: str) -> None:
    name = state.value(prefix + "policy")
    for k, v in _defaults(PRESETS[name]).items():
        state.set_value(prefix + k, v)


def preset_select(prefix: str, default: str, label: str, optional: bool = False) -> tuple[Param, str]:
    """The preset box; changing it resets the knobs to that preset."""
    p = preset_param(prefix, default, optional)
    state.load_with_notices([p])
    kwargs = state.bind(p.key)
    kwargs["on_change"], kwargs["args"] = _preset_changed, (prefix,)
    st.selectbox(label, list(p.choices), help=f"Start from a preset:\n{PRESET_HELP}",
                 format_func=lambda k: "(not used)" if k == NONE else k, **kwargs)
    return p, state.value(p.key)


def policy_knobs(prefix: str, preset: str, columns: int = 3, reset_button: bool = True,
                 model=None) -> tuple[list[Param], PolicyChoice]:
    """Sliders and toggles for every knob of the preset's mode; returns their params and the policy. With the
    sidebar's ``model``, speculation whose acceptance slider stands at its default and without a mean acceptance
    length takes the published acceptance of the model's family (``engine.spec_table``), and a caption says method,
    K, acceptance and where it comes from (issue 39 item 4)."""
    base = PRESETS[preset]
    ps = knob_params(prefix, base)
    state.load_with_notices(ps)
    keys = [p.key[len(prefix):] for p in ps]
    state.drop(prefix + k for k in FIELDS if k not in keys)
    cols = st.columns(columns)
    for i, k in enumerate(keys):
        with cols[i % columns]:
            _knob_widget(prefix, k)
    if reset_button:
        st.button("Reset knobs to the preset", key=f"reset_knobs_{prefix or 'main'}", on_click=_reset_knobs,
                  args=(prefix,), icon=":material/undo:")
    customised = any(state.value(prefix + k) != _defaults(base)[k] for k in keys)
    # a budget left at the preset's follows the model's context (the continuous preset, as vLLM V0 sizes it)
    follow = base.budget_from_context and state.value(prefix + "budget") == _defaults(base)["budget"]
    values = {FIELDS[k][0]: _field_value(k, state.value(prefix + k)) for k in keys if not (follow and k == "budget")}
    try:
        pol = with_knobs(base, **values)
    except ValueError as exc:
        return ps, PolicyChoice(preset, None, str(exc), customised)
    if pol.spec_decode != "off" and model is not None:
        untouched = (state.value(prefix + "spec_a") == _defaults(base)["spec_a"]
                     and not float(state.value(prefix + "spec_len", 0.0)))
        if untouched:
            pol = with_default_acceptance(pol, model, state.value("workload", None))
        st.caption(plain(f"Speculation: {spec_text(pol)}" + (
            f". The acceptance slider's default ({_defaults(base)['spec_a']} %) stands for this published value; "
            "move it, or give a mean acceptance length, to use your own." if untouched else ".")))
    return ps, PolicyChoice(preset, pol, None, customised)


def _field_value(k: str, v):
    divisor = FIELDS[k][1]
    return v if divisor is None else v / divisor


def _range(k: str) -> dict:
    low, high, step = SLIDERS[k]
    return {"min_value": low, "max_value": high, "step": step}


def _knob_widget(prefix: str, k: str) -> None:
    kw = state.bind(prefix + k)
    chunked = state.value(prefix + "chunked", False)
    if k == "batch":
        st.slider("Max batch size (requests)", **_range(k), help="Requests per batch (static and dynamic "
                  "batching run a batch to completion).", **kw)
    elif k == "wait_ms":
        st.slider("Max wait (ms)", **_range(k), help="A batch launches when it is full or its oldest "
                  "request has waited this long.", **kw)
    elif k == "seqs":
        st.slider("Max running sequences", **_range(k), help="max_num_seqs: sequences in a step "
                  "(vLLM default 256).", **kw)
    elif k == "budget":
        label = "Chunk size (tokens per step)" if chunked else "Token budget per step"
        st.slider(label, **_range(k), help="max_num_batched_tokens: tokens one step may compute. Without "
                  "chunked prefill it must hold the longest prompt; the continuous preset sizes it as vLLM V0 does, "
                  "max(the model's context, 2,048) tokens, until you move this slider.", **kw)
    elif k == "chunked":
        st.toggle("Chunked prefill", help="Mixed steps: decodes first, prompt chunks fill the rest of the "
                  "budget (Sarathi-Serve, vLLM V1).", **kw)
    elif k == "prio":
        st.toggle("Priority classes", help="Order the waiting queue by (class, arrival); with preemption on, "
                  "high-priority requests evict lower ones.", **kw)
    elif k == "preempt":
        st.selectbox("Preemption", list(PREEMPTION_MODES), help="What happens when the KV cache runs out: "
                     "recompute (free and prefill again later) or swap (copy to host memory over PCIe).", **kw)
    elif k == "cache":
        st.toggle("Prefix caching", help=PREFIX_CACHING_HELP, **kw)
    elif k == "spec":
        st.selectbox("Speculative decoding", list(SPEC_METHODS), help=SPEC_HELP, **kw)
    else:
        off = state.value(prefix + "spec", "off") == "off"
        if k == "spec_k":
            st.slider("Draft tokens K", **_range(k), help="Tokens proposed per sequence and step "
                      "(vLLM num_speculative_tokens).", disabled=off, **kw)
        elif k == "spec_a":
            by_length = float(state.value(prefix + "spec_len", 0.0)) > 0
            st.slider("Acceptance A (%)", **_range(k), help="Per-token acceptance probability: a verification "
                      "emits (1 − A^(K+1)) / (1 − A) tokens on average. Greyed out while a mean acceptance length "
                      "is given: that length sets A.", disabled=off or by_length, **kw)
        elif k == "spec_len":
            low, high = KNOB_LIMITS["spec_acceptance_length"]
            st.number_input("Mean acceptance length (tokens)", min_value=float(low), max_value=float(high),
                            step=0.1, format="%.2f", help=SPEC_LEN_HELP, disabled=off, **kw)
        elif k == "spec_model":
            draft = state.value(prefix + "spec", "off") == "draft"
            st.selectbox("Draft model", list(MODELS), help="The smaller model of the family that drafts "
                         "(speculative decoding 'draft'); it shares the GPUs, so the KV cache shrinks.",
                         disabled=not draft, **kw)
        elif k == "spec_off":
            st.slider("Speculation off from (sequences)", **_range(k), help="vLLM's "
                      "speculative_disable_by_batch_size: no speculation while this many sequences or more run; "
                      "0: never off (1 is refused: it would never speculate).",
                      disabled=off, **kw)


# ---------------------------------------------------------------- scenario knobs (Explore)


def high_share_param(scenario: Scenario) -> Param | None:
    wl = scenario.workload
    if not isinstance(wl, SyntheticWorkload) or len(wl.classes) < 2:
        return None
    share = [c.share for c in wl.classes if c.priority == 0][0]
    return Param("high", int(round(share * 100)), 0, 100, label="high-priority share (%)")


def kv_param(scenario: Scenario) -> Param:
    top = scenario.deployment.kv_capacity_tokens_max
    return Param("kv", top, min(KV_MIN_TOKENS, top), top, label="KV cache (tokens)")


def scenario_knobs(scenario: Scenario) -> tuple[list[Param], Scenario]:
    """Priority mix and KV cache size; returns their params and the scenario they make."""
    hp, kp = high_share_param(scenario), kv_param(scenario)
    ps = [p for p in (hp, kp) if p is not None]
    prev_top = st.session_state.get("kv_top")
    if prev_top is not None and prev_top != kp.default and state.value("kv") == prev_top:
        state.set_value("kv", kp.default)  # "the whole cache" follows the model and GPU
    st.session_state["kv_top"] = kp.default
    state.load_with_notices(ps)
    c1, c2 = st.columns(2)
    with c1:
        if hp is not None:
            st.slider("High-priority share (%)", **hp.widget_range(), step=1, help="Share of requests in the "
                      "interactive (priority 0) class; the other classes share the rest.", **state.bind("high"))
        else:
            st.slider("High-priority share (%)", 0, 100, 100, disabled=True, key="high_disabled",
                      help="Needs a workload with two or more priority classes (the mixed preset).")
    with c2:
        top = kp.high
        st.slider("KV cache (tokens per replica)", int(kp.low), int(top), step=KV_STEP_TOKENS,
                  help=f"Shrink the paged KV cache to watch preemption happen; the memory left after the "
                       f"weights holds {int(top):,} tokens ({KV_BLOCK_TOKENS}-token blocks).",
                  **state.bind("kv"))
    kv = int(state.value("kv"))
    sc = scenario
    if hp is not None and state.value("high") != hp.default:
        sc = sc.with_workload(scenario.workload.with_high_share(state.value("high") / 100))
    if kv < top:
        sc = sc.with_deployment(replace(sc.deployment, kv_cache_tokens=kv))
    return ps, sc
