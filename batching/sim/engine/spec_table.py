"""Published acceptance of speculative decoding, per method, model family and dataset (issue 39 item 4).

``batching/data/spec_acceptance.csv`` holds one row per published measurement: the method (``eagle``, ``mtp``, ...),
the model family it applies to, the model and proposer measured, the dataset, the workload presets whose traffic
that dataset stands for (``*``: any; empty: none named), the K it ran with and its acceptance, as the source gives
it: a mean acceptance length L (tokens per verification, the bonus token included) or a per-token rate A; and the
source (paper section or table, engine issue or pull request).

When speculation is asked for without an acceptance (neither ``spec_acceptance`` nor ``spec_acceptance_length``),
``default_acceptance`` looks the method and the target's family up: the row whose workloads name the run's
workload first, else the method and family's first row. A row given as L at its own K becomes the per-token A with
(1 - A^(K+1)) / (1 - A) = L (``speculative.acceptance_from_length``), and A applies at the K asked for. No row: the
policy's flat default (``FALLBACK_A``), said as such. ``spec_text`` says method, K, acceptance and its source in
one line for every surface that prints speculation.

Not a kernel source (engine/kernel_cache.KERNEL_SOURCES): nothing here is compiled.
"""
from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, fields
from importlib import resources

from batching.sim.engine.speculative import acceptance_from_length, acceptance_rate, expected_tokens_per_step
from batching.sim.hardware.specs import MODELS, Model
from batching.sim.policy import BatchingPolicy

TABLE_FILE = "spec_acceptance.csv"
# the policy's default A, applied when no row matches: EAGLE's ~0.8 per-token acceptance (Li et al. 2024,
# arXiv:2401.15077), the figure speculative.py quotes for it
FALLBACK_A = BatchingPolicy.spec_acceptance
FALLBACK_WHY = ("the policy's flat default, EAGLE's ~0.8 per-token acceptance (arXiv:2401.15077); give "
                "--spec-acceptance or --spec-acceptance-length (the dashboard's acceptance inputs) from your own "
                "engine's spec-decode metrics")
METHOD_NAMES = {"eagle": "EAGLE", "mtp": "MTP", "ngram": "n-gram", "draft": "draft model"}
_SIZE = re.compile(r"-(\d+(\.\d+)?b|\d+x\d+b)(-a\d+(\.\d+)?b)?$")  # a preset key's size suffix: -70b, -8x7b, -30b-a3b


@dataclass(frozen=True)
class Row:
    method: str
    family: str
    measured_on: str
    proposer: str
    dataset: str
    workloads: str
    k: int
    acceptance_length: float | None
    acceptance_rate: float | None
    source: str

    @property
    def a(self) -> float:
        """The per-token acceptance A this row gives (its rate, or the A its length gives at its own K)."""
        if self.acceptance_rate is not None:
            return self.acceptance_rate
        return acceptance_from_length(self.acceptance_length, self.k)

    def covers(self, workload: str | None) -> bool:
        names = [w for w in self.workloads.split(";") if w]
        return "*" in names or (workload is not None and workload in names)

    def published(self) -> str:
        """What the source measured: 'acceptance length 3.53 at K = 7' or 'acceptance 0.85 at K = 1'."""
        if self.acceptance_rate is not None:
            return f"acceptance {self.acceptance_rate:g} at K = {self.k}"
        return f"acceptance length {self.acceptance_length:g} at K = {self.k}"


def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


@functools.cache
def rows() -> tuple[Row, ...]:
    """The shipped table, in its order (the first row of a method and family is its default)."""
    names = [f.name for f in fields(Row)]
    with resources.files("batching.data").joinpath(TABLE_FILE).open("r", encoding="utf-8", newline="") as f:
        out = []
        for r in csv.DictReader(f):
            vals = {n: r[n] for n in names}
            vals["k"] = int(vals["k"])
            vals["acceptance_length"] = _number(vals["acceptance_length"])
            vals["acceptance_rate"] = _number(vals["acceptance_rate"])
            out.append(Row(**vals))
    return tuple(out)


def family(model: Model) -> str | None:
    """The preset's family: its key without the size ('llama-3.1-70b' -> 'llama-3.1', 'qwen3-30b-a3b' -> 'qwen3');
    None for a custom model (a --model-json or an upload: no published row is known to be its)."""
    for key, m in MODELS.items():
        if m == model:
            return _SIZE.sub("", key)
    return None


@dataclass(frozen=True)
class Acceptance:
    a: float  # per-token acceptance to run with
    row: Row | None  # the published row it comes from (None: FALLBACK_A)
    note: str  # where it comes from, in words (printed beside method and K)


def default_acceptance(method: str, model: Model, k: int, workload: str | None = None) -> Acceptance:
    """The acceptance to use for ``method`` on ``model`` with K = ``k`` when none is given, and which row gave it
    (or that none matched and the flat default applies, and why)."""
    fam = family(model)
    matches = [r for r in rows() if r.method == method and fam is not None and r.family == fam]
    if not matches:
        what = f"{model.name} (family {fam})" if fam else f"{model.name} (a custom model, no family)"
        return Acceptance(FALLBACK_A, None, f"no published row for {METHOD_NAMES.get(method, method)} on {what} "
                                            f"in batching/data/{TABLE_FILE}: A = {FALLBACK_A:g}, {FALLBACK_WHY}")
    row = next((r for r in matches if r.covers(workload)), matches[0])
    a = row.a
    how = "" if row.acceptance_rate is not None else f" -> A = {a:.3f}"
    fit = ("" if row.covers(workload) else
           f"; {row.dataset} stands for no workload of its own here, the nearest published measurement"
           + (f" for '{workload}'" if workload else ""))
    return Acceptance(a, row, f"published: {row.measured_on} with {row.proposer} on {row.dataset}, "
                              f"{row.published()}{how} ({row.source}){fit}")


def with_default_acceptance(policy: BatchingPolicy, model: Model, workload: str | None = None) -> BatchingPolicy:
    """``policy`` with its acceptance looked up (``default_acceptance``) and its source noted; for a policy that
    speculates and whose acceptance nobody gave (the caller knows: a flag or input left out). A policy without
    speculation, with an acceptance length, or already looked up is returned as it is."""
    if policy.spec_decode == "off" or policy.spec_acceptance_length > 0 or policy.spec_acceptance_source:
        return policy
    found = default_acceptance(policy.spec_decode, model, int(policy.spec_tokens), workload)
    return policy.with_acceptance(found.a, found.note)


def spec_fields(policy: BatchingPolicy) -> dict | None:
    """Method, K, acceptance (A, tokens per verification at K) and its source, for JSON (None: no speculation)."""
    if policy.spec_decode == "off":
        return None
    a = acceptance_rate(policy)
    out = {"method": policy.spec_decode, "k": int(policy.spec_tokens), "acceptance": round(a, 4),
           "tokens_per_verification": round(expected_tokens_per_step(int(policy.spec_tokens), a), 3),
           "acceptance_source": policy.spec_acceptance_source or _given(policy)}
    if policy.spec_decode == "draft":
        out["draft_model"] = policy.spec_draft_model
    return out


def _given(policy: BatchingPolicy) -> str:
    if policy.spec_acceptance_length > 0:
        return f"given: acceptance length {policy.spec_acceptance_length:g} at K = {policy.spec_tokens}"
    return f"given: A = {policy.spec_acceptance:g}"


def spec_text(policy: BatchingPolicy) -> str:
    """'EAGLE, K = 3, A = 0.744 (2.71 tokens per verification); acceptance published: ...' (empty: no
    speculation)."""
    d = spec_fields(policy)
    if d is None:
        return ""
    name = METHOD_NAMES.get(d["method"], d["method"])
    if d["method"] == "draft":
        name += f" {d['draft_model']}"
    return (f"{name}, K = {d['k']}, A = {d['acceptance']:.3g} ({d['tokens_per_verification']:.3g} tokens per "
            f"verification); acceptance {d['acceptance_source']}")
