"""Aggregated against disaggregated serving on the same GPUs (issue 13 §2): the capacity within the SLOs of the
scenario served aggregated (``Scenario.disagg = None``) and split into prefill and decode instances
(``batching.sim.topology.disagg.Disagg``), one capacity search (``studies.capacity.capacity``) per configuration.
The splits are the deployment search's (``splits_of`` here, which studies.search enumerates: every split of the
node that leaves no instance's room idle), ranked as it ranks them: by requests/s per node, a split's rate times the copies of it a node
holds (issue 39 item 1: three fixed splits gave one answer here and the search another).

Also the rule every page that runs several policies applies to a disaggregated scenario: request-level batching
(static, dynamic) runs each batch as a whole and cannot be split into a prefill and a decode phase, so those
policies are skipped (``disagg_skips``), not run (speculative decoding runs on the decode instances: disagg.py).
No Streamlit here.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from batching.sim.topology.disagg import Disagg
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario
from batching.studies.capacity import REL_TOL, SLO, SLO_LABELS, CapacityResult, capacity

REQUEST_LEVEL_REASON = ("static and dynamic batching run each batch as a whole; disaggregation needs "
                        "iteration-level batching")
DEFAULT_POLICY = "chunked"
AGGREGATED = "aggregated"
DISAGGREGATED = "disaggregated"
# the frame's columns, in order
COLUMNS = ("configuration", "kind", "gpus", "capacity_req_s", "copies_per_node", "req_s_per_node", "req_s_per_gpu",
           "binding_slo", "ttft_p99_s", "tpot_p99_s", "rates_tried")


# ---------------------------------------------------------------- which policies a split can run



SPLIT_TPS = (1, 2, 4, 8)  # within a node: an aggregated replica's, a split's instances' TP degrees


def splits_of(num_gpus: int) -> tuple[list[tuple[int, int, int, int]], dict[tuple, str]]:
    """Every prefill/decode split P x T + D x U of one node's GPUs (T, U in 1, 2, 4, 8; P, D >= 1), as (kept,
    dominated -> why). A split is dominated when one more prefill or decode instance still fits beside the same
    number of copies per node: the bigger split costs the same nodes per copy and adding an instance never lowers
    a split's capacity, so it is never dearer (the search keeps the bigger one)."""
    kept, dominated = [], {}
    for t, u in itertools.product(SPLIT_TPS, SPLIT_TPS):
        if t > num_gpus or u > num_gpus:
            continue
        for p in range(1, num_gpus // t + 1):
            for d in range(1, (num_gpus - p * t) // u + 1):
                g = p * t + d * u
                c = num_gpus // g
                grow = [(f"{p + 1} prefill", g + t), (f"{d + 1} decode", g + u)]
                bigger = next((name for name, g2 in grow if g2 <= num_gpus and num_gpus // g2 == c), None)
                if bigger is None:
                    kept.append((p, t, d, u))
                else:
                    dominated[(p, t, d, u)] = (
                        f"leaves GPUs of the node idle: {bigger} instances fit beside the same {c} cop"
                        f"{'y' if c == 1 else 'ies'} per node, never dearer (an instance more never lowers capacity)")
    return kept, dominated


def skip_reason(policy: BatchingPolicy) -> str | None:
    """Why ``policy`` cannot run disaggregated, or None when it can."""
    if policy.mode != "continuous":
        return REQUEST_LEVEL_REASON
    return None


def disagg_skips(scenario: Scenario, policies: Mapping[str, BatchingPolicy]) -> dict[str, str]:
    """name -> why it is skipped, for the policies that cannot run on this scenario's split (none when the
    scenario is aggregated)."""
    if scenario.disagg is None:
        return {}
    return {name: reason for name, pol in policies.items() if (reason := skip_reason(pol)) is not None}


def runnable(scenario: Scenario, policies: Mapping[str, BatchingPolicy]
             ) -> tuple[dict[str, BatchingPolicy], dict[str, str]]:
    """(the policies that run on this scenario, in their order; name -> reason for those skipped)."""
    skipped = disagg_skips(scenario, policies)
    return {k: p for k, p in policies.items() if k not in skipped}, skipped


def skipped_text(skipped: Mapping[str, str]) -> str:
    """One sentence naming the skipped policies and why, grouped by reason ('' when none)."""
    if not skipped:
        return ""
    by: dict[str, list[str]] = {}
    for name, reason in skipped.items():
        by.setdefault(reason, []).append(name)
    parts = []
    for reason, names in by.items():
        listed = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + f" and {names[-1]}"
        parts.append(f"{listed} ({reason})")
    return "Skipped on this disaggregated scenario: " + "; ".join(parts) + "."


# ---------------------------------------------------------------- the configurations compared


def split_label(dis: Disagg) -> str:
    """'1 prefill × TP 4 + 1 decode × TP 4'."""
    return (f"{dis.prefill_instances} prefill × TP {dis.prefill_tp} + {dis.decode_instances} decode × TP "
            f"{dis.decode_tp}")


def aggregated_label(scenario: Scenario) -> str:
    tp, n = scenario.deployment.node.tp, scenario.replicas
    return f"aggregated: {n} × TP {tp}" if n > 1 else f"aggregated: TP {tp}"


def aggregated_gpus(scenario: Scenario) -> int:
    """GPUs the aggregated fleet runs on: replicas × TP."""
    return scenario.replicas * scenario.deployment.node.tp


def node_splits(num_gpus: int) -> list[Disagg]:
    """Every split of one node's GPUs the deployment search enumerates (``studies.search.splits_of``'s kept
    ones, in its order): P prefill x TP T + D decode x TP U, T and U in 1, 2, 4, 8, none dominated by a bigger split
    that fits beside the same copies per node (on 8 GPUs: 28, from 1 x TP 1 + 1 x TP 1 to 1 x TP 4 + 1 x TP 4)."""

    return [Disagg(*sp) for sp in splits_of(num_gpus)[0]]


def copies_per_node(num_gpus: int, dis: Disagg | None) -> int:
    """Copies of a configuration one node holds, as the search counts them (``search.Config.copies_per_node``): 1
    for an aggregated node (its replicas fill it), num_gpus // the split's GPUs for a split."""
    return 1 if dis is None else max(num_gpus // dis.gpus, 1)


@dataclass(frozen=True)
class Config:
    label: str
    scenario: Scenario
    gpus: int

    @property
    def copies_per_node(self) -> int:
        return copies_per_node(self.scenario.deployment.node.num_gpus, self.scenario.disagg)

    @property
    def kind(self) -> str:
        return AGGREGATED if self.scenario.disagg is None else DISAGGREGATED


def policy_for(policy: BatchingPolicy | None) -> BatchingPolicy:
    """The policy the comparison runs: the one given when a split can run it, else the chunked preset."""
    return policy if policy is not None and skip_reason(policy) is None else PRESETS[DEFAULT_POLICY]


def aggregated_tps(scenario: Scenario) -> list[int]:
    """The TP degrees an aggregated node of this scenario can run (1, 2, 4, 8 dividing its GPUs), its own first:
    the comparison's aggregated side is the best of them, not only the sidebar's TP."""
    n = scenario.deployment.node.num_gpus
    own = scenario.deployment.node.tp
    return [own] + [t for t in (8, 4, 2, 1) if t != own and t <= n and n % t == 0]


def configurations(scenario: Scenario, policy: BatchingPolicy | None = None,
                   splits: Sequence[Disagg] | None = None, agg_tps: Sequence[int] | None = None
                   ) -> tuple[list[Config], dict[str, str]]:
    """(the configurations to search: the scenario aggregated at its own TP, its own split if any, the other
    aggregated TPs (``agg_tps``, default ``aggregated_tps``: every TP that divides the node, replicas filling it)
    and ``splits`` (default ``node_splits``: the deployment search's), each once; label -> reason for those that do not
    validate for this model and hardware)."""
    pol = policy_for(policy)
    base = scenario.with_policy(pol)
    agg = replace(base, disagg=None)
    agg.validate()  # the scenario itself is wrong: the caller says so
    configs = [Config(aggregated_label(agg), agg, aggregated_gpus(agg))]
    refused: dict[str, str] = {}
    others = []
    for tp in (aggregated_tps(agg) if agg_tps is None else agg_tps):
        if tp == agg.deployment.node.tp:
            continue
        sc = replace(agg, deployment=replace(agg.deployment, node=replace(agg.deployment.node, tp=int(tp))))
        try:
            sc.validate()
        except ValueError as exc:
            refused[aggregated_label(sc)] = str(exc)
            continue
        others.append(Config(aggregated_label(sc), sc, aggregated_gpus(sc)))
    wanted = [scenario.disagg] if scenario.disagg is not None else []
    for d in (node_splits(scenario.deployment.node.num_gpus) if splits is None else splits):
        if d not in wanted:
            wanted.append(d)
    split_configs = []
    for d in wanted:
        sc = replace(agg, disagg=d)
        try:
            sc.validate()
        except ValueError as exc:
            refused[split_label(d)] = str(exc)
            continue
        split_configs.append(Config(split_label(d), sc, d.gpus))
    own = [c for c in split_configs if scenario.disagg is not None and c.label == split_label(scenario.disagg)]
    return configs + own + others + [c for c in split_configs if c not in own], refused


# ---------------------------------------------------------------- the study


Search = Callable[[Scenario], CapacityResult]
RunAll = Callable[[list[tuple[str, Callable[[], object]]]], list]


def _at_rate(result: CapacityResult, column: str) -> float:
    """A column of the search's points at the rate found (or, when none met the SLOs, at the lowest tried)."""
    pts = result.points
    if pts is None or not len(pts) or column not in pts:
        return math.nan
    if result.max_rate_req_s > 0:
        i = (pts["rate_req_s"] - result.max_rate_req_s).abs().idxmin()
    else:
        i = pts["rate_req_s"].idxmin()
    return float(pts.loc[i, column])


def row(cfg: Config, result: CapacityResult) -> dict:
    rate = float(result.max_rate_req_s)
    return {"configuration": cfg.label, "kind": cfg.kind, "gpus": cfg.gpus, "capacity_req_s": rate,
            "copies_per_node": cfg.copies_per_node, "req_s_per_node": rate * cfg.copies_per_node,
            "req_s_per_gpu": rate / cfg.gpus if cfg.gpus else math.nan, "binding_slo": result.binding_slo,
            "ttft_p99_s": _at_rate(result, "ttft_p99_s"), "tpot_p99_s": _at_rate(result, "tpot_p99_s"),
            "rates_tried": result.rates_tried}


@dataclass(frozen=True, eq=False)
class SplitCapacity:
    """The comparison: one row per configuration that ran (``frame``), the ones that could not (``failed``:
    label -> reason), the SLO and the policy."""

    frame: pd.DataFrame
    failed: dict[str, str]
    slo: SLO
    policy: BatchingPolicy
    results: dict[str, CapacityResult] = field(default_factory=dict)
    num_gpus: int = 8  # GPUs per node
    rel_tol: float = REL_TOL  # each capacity search's tolerance: configurations closer than it are tied

    def best(self) -> pd.Series | None:
        """The configuration with the most requests per second per node (None when none meets the SLOs): what the
        deployment search ranks by, since nodes are what a deployment buys (a split that leaves GPUs idle pays
        for them)."""
        ok = self.frame[self.frame["capacity_req_s"] > 0]
        return None if ok.empty else ok.loc[ok["req_s_per_node"].idxmax()]

    def verdict(self) -> str:
        """Sentences from the numbers: who carries the most per GPU, by how much, and which SLO binds each side
        (so what a tighter or looser SLO would change)."""
        f = self.frame
        best = self.best()
        if best is None:
            return "No configuration meets these SLOs at any rate tried; relax them."
        agg = f[f["kind"] == AGGREGATED]
        dis = f[f["kind"] == DISAGGREGATED]
        copies = int(best["copies_per_node"])
        text = (f"Most traffic per node within these SLOs: {best['configuration']}, {best['capacity_req_s']:.3g} "
                f"req/s on {int(best['gpus'])} GPUs" + (f", {copies} copies per node: {best['req_s_per_node']:.3g} "
                                                        "req/s per node" if copies > 1 else "")
                + f" ({best['req_s_per_node'] / self.num_gpus:.3g} req/s per GPU of the node)")
        other = dis if best["kind"] == AGGREGATED else agg
        if not other.empty:
            o = other.loc[other["req_s_per_node"].idxmax()]
            if o["req_s_per_node"] > 0:
                text += (f", {best['req_s_per_node'] / o['req_s_per_node']:.2g}× the best "
                         f"{'split' if best['kind'] == AGGREGATED else 'aggregated configuration'} "
                         f"({o['configuration']}).")
            else:
                text += f"; {'no split' if best['kind'] == AGGREGATED else 'aggregated serving'} meets them at all."
        else:
            text += "."
        tied = f[(f["configuration"] != best["configuration"])
                 & (f["req_s_per_node"] >= best["req_s_per_node"] * (1 - self.rel_tol))]
        if not tied.empty:
            text += (f" Within the searches' tolerance ({self.rel_tol * 100:.3g} %) of it: "
                     + ", ".join(f"{r['configuration']} ({r['req_s_per_node']:.3g} req/s per node)"
                                 for _, r in tied.iterrows()) + ".")
        binds = lambda part: {b for b in part["binding_slo"] if isinstance(b, str)}  # noqa: E731
        agg_b, dis_b = binds(agg), binds(dis)
        if best["kind"] == DISAGGREGATED and "tpot_s" in agg_b:
            text += (" Aggregated serving is held back by TPOT (prompt chunks share its steps with decodes); a "
                     "looser TPOT SLO would narrow the gap or favour aggregation.")
        elif best["kind"] == AGGREGATED and dis_b & {"ttft_s", "e2e_s"}:
            held = "/".join(SLO_LABELS[b] for b in sorted(dis_b & {"ttft_s", "e2e_s"}))
            text += (f" The splits are held back by {held} (their prefill instances have fewer GPUs than the whole "
                     "node); a tighter TPOT SLO would favour disaggregation, whose decode instances run decodes "
                     "only.")
        elif best["kind"] == AGGREGATED and "tpot_s" in dis_b:
            text += " The splits are held back by TPOT too."
        return text


def _attempt(search: Search, sc: Scenario) -> CapacityResult | str:
    try:
        return search(sc)
    except ValueError as exc:
        return str(exc)


def disagg_capacity(scenario: Scenario, slo: SLO, policy: BatchingPolicy | None = None,
                    splits: Sequence[Disagg] | None = None, search: Search | None = None,
                    run_all: RunAll | None = None, rel_tol: float = 0.01,
                    agg_tps: Sequence[int] | None = None) -> SplitCapacity:
    """Capacity within ``slo`` of the scenario aggregated and of each split (``configurations``), under
    ``policy`` (default: the chunked preset; a policy a split cannot run falls back to it).

    ``search(scenario)``: stands in for ``capacity(scenario, slo)`` (e.g. a cached search); ``run_all(tasks)``:
    runs [(label, fn)] and returns their values in order (e.g. under a progress bar). A configuration whose
    requests do not fit (a prompt larger than a prefill instance's KV cache, ...) lands in ``failed``."""
    slo.validate()
    pol = policy_for(policy)
    configs, failed = configurations(scenario, pol, splits, agg_tps)
    search = search or (lambda sc: capacity(sc, slo, rel_tol=rel_tol))
    tasks = [(c.label, lambda c=c: _attempt(search, c.scenario)) for c in configs]
    found = run_all(tasks) if run_all is not None else [fn() for _, fn in tasks]
    rows, results = [], {}
    for cfg, res in zip(configs, found):
        if isinstance(res, str):
            failed[cfg.label] = res
            continue
        rows.append(row(cfg, res))
        results[cfg.label] = res
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return SplitCapacity(frame, failed, slo, pol, results, scenario.deployment.node.num_gpus, rel_tol)
