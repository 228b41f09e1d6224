"""The Capacity page's speculation control (issue 39 item 4): method, K and acceptance applied to every policy the
page plans with, feeding the same capacity search. Acceptance 0 (the default) takes the published acceptance of the
method on the model's family (``engine.spec_table``; the flat default where no row matches, said so)."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from batching.sim.engine.spec_table import spec_text, with_default_acceptance
from batching.sim.engine.speculative import check_spec, default_draft
from batching.sim.policy import KNOB_LIMITS, SPEC_METHODS, BatchingPolicy, with_knobs
from batching.sim.simulate import Scenario
from batching.ui import state
from batching.ui.params import Param

KEYS = ("cap_spec", "cap_spec_k", "cap_spec_a")


def params() -> list[Param]:
    """The method (off by default), K and A (0: the published table's)."""
    low, high = KNOB_LIMITS["spec_tokens"]
    return [Param("cap_spec", "off", choices=SPEC_METHODS, label="speculative decoding"),
            Param("cap_spec_k", 3, int(low), int(high), label="draft tokens K"),
            Param("cap_spec_a", 0.0, 0.0, 1.0, label="acceptance A (0: published table)")]


def controls(columns) -> None:
    """The three inputs, in three ``columns``."""
    r = {p.key: p.widget_range() for p in params() if p.low is not None}
    off = state.value("cap_spec", "off") == "off"
    columns[0].selectbox("Speculative decoding", list(SPEC_METHODS), help="Price the policies with speculative "
                         "decoding: eagle (an EAGLE head), mtp (the model's multi-token-prediction module: "
                         "DeepSeek-V3), draft (the smallest preset of the model's vocabulary), ngram (prompt lookup). "
                         "Request-level policies (static, dynamic) cannot speculate and run without it.",
                         **state.bind("cap_spec"))
    columns[1].number_input("Draft tokens K", **r["cap_spec_k"], step=1, disabled=off,
                            help="Tokens proposed per sequence and step (vLLM num_speculative_tokens).",
                            **state.bind("cap_spec_k"))
    columns[2].number_input("Acceptance A (0: published)", **r["cap_spec_a"], step=0.05, format="%.3f",
                            disabled=off, help="Per-token acceptance probability. 0 takes the published acceptance "
                                               "of the method on the model's family (batching/data/"
                                               "spec_acceptance.csv), or 0.8 where it has no row; the caption below "
                                               "says which.", **state.bind("cap_spec_a"))


@dataclass(frozen=True)
class Speculation:
    method: str
    k: int
    a: float  # 0: the published table's

    @classmethod
    def from_state(cls) -> "Speculation":
        return cls(str(state.value("cap_spec", "off")), int(state.value("cap_spec_k", 3)),
                   float(state.value("cap_spec_a", 0.0)))

    def apply(self, policy: BatchingPolicy, base: Scenario) -> BatchingPolicy:
        """``policy`` speculating as asked (itself when off, or when it batches whole requests); ValueError in one
        line when the method cannot run on the deployment (MTP without MTP modules, no draft, no room)."""
        if self.method == "off" or policy.mode != "continuous":
            return policy
        model = base.deployment.model
        knobs = {"spec_decode": self.method, "spec_tokens": self.k}
        if self.a > 0:
            knobs["spec_acceptance"] = self.a
        if self.method == "draft":
            draft = default_draft(model)
            if draft is None:
                raise ValueError(f"speculative decoding 'draft': no preset drafts for {model.name} (a draft needs "
                                 "its vocabulary and fewer parameters); use eagle or ngram")
            knobs["spec_draft_model"] = draft
        p = with_knobs(policy, **knobs)
        if self.a <= 0:
            p = with_default_acceptance(p, model, state.value("workload", None))  # the sidebar's workload preset
        check_spec(p, base.deployment)
        return p

    @staticmethod
    def caption(policies: dict[str, BatchingPolicy]) -> str:
        """'Speculation: EAGLE, K = 3, A = ... (source) on chunked, continuous, priority; static, dynamic without.'"""
        spec = [n for n, p in policies.items() if p.spec_decode != "off"]
        if not spec:
            return ""
        plain_ones = [n for n in policies if n not in spec]
        rest = f"; {', '.join(plain_ones)} batch whole requests and run without it" if plain_ones else ""
        return f"Speculation on {', '.join(spec)}: {spec_text(policies[spec[0]])}{rest}."
