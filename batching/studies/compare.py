"""The preset showdown: every policy at the offered load and saturated (its capacity)."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from batching.sim.metrics import saturated_capacity
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, SimResult, simulate

# progress(done, total, message)
Progress = Callable[[int, int, str], None]

# columns of the classic comparison table: summary key -> header with unit
COMPARE_COLUMNS: dict[str, str] = {
    "throughput_output_tok_s": "Throughput at this load (output tok/s)",
    "capacity_output_tok_s": "Capacity (output tok/s)",
    "load": "Load (0-1)",
    "ttft_p50_s": "TTFT P50 (s)",
    "ttft_p99_s": "TTFT P99 (s)",
    "tpot_p50_s": "TPOT P50 (s)",
    "tpot_p99_s": "TPOT P99 (s)",
    "e2e_p99_s": "E2E P99 (s)",
    "gpu_util": "GPU util (0-1)",
    "busy": "Busy (0-1)",
    "mfu": "MFU (0-1)",
    "mbu": "MBU (0-1)",
    "kv_util": "KV cache in use (0-1)",
    "batch_efficiency": "Batch efficiency (0-1)",
    "preemptions": "Preemptions",
}
# latencies of an overloaded policy grow with the run's length: shown as unbounded, never compared
UNBOUNDED_PREFIXES = ("ttft_", "tpot_", "e2e_", "queue_delay_", "itl_")
# a waiting queue growing faster than this share of the offered rate = the queue grows through the run; a
# marginal overload (offered just above capacity) grows slower than this and is caught by offered >= capacity,
# while the trend of a short run's queue below capacity stays within it (noise)
QUEUE_GROWTH_TOLERANCE = 0.10


@dataclass(frozen=True, eq=False)
class Comparison:
    results: dict[str, SimResult]  # at the offered load
    saturated: dict[str, SimResult]  # every request at t = 0

    def summaries(self) -> dict[str, dict]:
        return {name: with_capacity(res.summary(), self.saturated[name].summary())
                for name, res in self.results.items()}

    def table(self) -> pd.DataFrame:
        """One row per policy, the classic columns and ``overloaded`` (raw summary keys as column names)."""
        rows = {name: {k: s[k] for k in COMPARE_COLUMNS} | {"overloaded": s["overloaded"]}
                for name, s in self.summaries().items()}
        return pd.DataFrame.from_dict(rows, orient="index")


def with_capacity(summary: dict, saturated_summary: dict) -> dict:
    """A run's summary with its saturated twin's capacity, ``load`` and ``overloaded``.

    load        steady throughput at the offered load (over the arrival window, metrics.steady_rate: the run's
                drain left out) / capacity (output tokens)
    overloaded  offered request rate ≥ capacity (requests/s of the saturated run), or the
                requests in the system grow by more than ``QUEUE_GROWTH_TOLERANCE`` × the offered
                rate (``queue_growth_req_s``, metrics.queue_growth); never for closed-loop clients
                (``concurrency``): N clients keep at most N requests in the system, so their latencies are
                what a fixed-concurrency benchmark measures however busy the engine is (``load`` says how busy)
    """
    cap_req, cap = saturated_capacity(saturated_summary)  # a split: its steady state (metrics.split_steady_capacity)
    out = {**summary, "capacity_output_tok_s": cap, "capacity_req_s": cap_req}
    thr = summary.get("steady_output_tok_s", summary["throughput_output_tok_s"])
    out["load"] = thr / cap if cap > 0 else float("nan")
    offered = summary.get("offered_req_s", float("nan"))
    growth = summary.get("queue_growth_req_s", float("nan"))
    over_rate = not math.isnan(offered) and offered >= cap_req  # inf: every request at once
    grows = math.isfinite(growth) and math.isfinite(offered) and growth > QUEUE_GROWTH_TOLERANCE * offered
    closed = summary.get("concurrency") is not None
    out["overloaded"] = bool((over_rate or grows) and not closed)
    return out


def is_unbounded(key: str, summary: Mapping) -> bool:
    """Whether this figure of this summary is a latency of an overloaded run (meaningless as a number)."""
    return bool(summary.get("overloaded")) and key.startswith(UNBOUNDED_PREFIXES)


def growth_rate(summary: Mapping) -> float:
    """How fast an overloaded run's queue grows (req/s): the larger of the measured trend and offered − capacity
    (the long-run rate; a short run's trend is noisy, batches leave the queue in steps)."""
    growth = summary.get("queue_growth_req_s", float("nan"))
    growth = growth if isinstance(growth, (int, float)) and math.isfinite(growth) else 0.0
    offered, cap = summary.get("offered_req_s", float("nan")), summary.get("capacity_req_s", float("nan"))
    excess = offered - cap if all(isinstance(x, (int, float)) and math.isfinite(x) for x in (offered, cap)) else 0.0
    return float(max(0.0, growth, excess))


def unbounded_text(summary: Mapping) -> str:
    return f"unbounded: queue grows (+{growth_rate(summary):.1f} req/s)"


def compare(scenario: Scenario, policies: Mapping[str, BatchingPolicy] | None = None,
            progress: Progress | None = None) -> Comparison:
    """Run each policy on the scenario at its offered load and saturated (for capacity)."""
    policies = dict(PRESETS if policies is None else policies)
    total = 2 * len(policies)
    results, saturated = {}, {}
    done = 0
    for name, pol in policies.items():
        sc = scenario.with_policy(pol)
        for sat, store in ((False, results), (True, saturated)):
            if progress:
                progress(done, total, f"{name}: {'capacity run' if sat else 'offered load'}")
            store[name] = simulate(sc, saturated=sat)
            done += 1
    if progress:
        progress(total, total, "done")
    return Comparison(results, saturated)


def verdict(summaries: Mapping[str, dict]) -> str:
    """Plain sentences reading a comparison: who wins, by how much, at what latency; which policies
    cannot carry the load (their latencies are never praised)."""
    if not summaries:
        return ""
    best = max(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    worst = min(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    b, w = summaries[best], summaries[worst]
    ratio = b["capacity_output_tok_s"] / max(w["capacity_output_tok_s"], 1e-9)
    over = [k for k, s in summaries.items() if s.get("overloaded")]
    keeps = [k for k in summaries if k not in over]
    text = (f"'{best}' has the highest capacity, {b['capacity_output_tok_s']:,.0f} output tok/s, "
            f"{ratio:.1f}x '{worst}' ({w['capacity_output_tok_s']:,.0f}); ")
    if b.get("overloaded"):
        text += f"even it cannot carry this load (its queue grows by {growth_rate(b):.1f} req/s)."
    else:
        text += (f"at this load ({b['load'] * 100:.0f} % of its capacity) it serves "
                 f"{b['throughput_output_tok_s']:,.0f} tok/s with P99 TTFT {_latency(b['ttft_p99_s'])} and P99 TPOT "
                 f"{_latency(b['tpot_p99_s'])}.")
    if keeps:
        fastest = min(keeps, key=lambda k: summaries[k]["ttft_p99_s"])
        text += f" Lowest P99 TTFT: '{fastest}' ({_latency(summaries[fastest]['ttft_p99_s'])})"
        text += " among the policies that keep up." if over else "."
    if over:
        names = ", ".join(f"'{k}' (queue +{growth_rate(summaries[k]):.1f} req/s)" for k in over)
        its = "its" if len(over) == 1 else "their"
        text += (f" Overloaded at this rate: {names}: the queue grows through the run, so {its} latencies measure "
                 f"the run's length, not the policy, and are not compared.")
    return text


def _latency(v: float) -> str:
    """Seconds as a reader expects them: ms below 10 s."""
    if not math.isfinite(v):
        return "n/a"
    return f"{v * 1e3:,.0f} ms" if v < 10 else f"{v:,.1f} s"
