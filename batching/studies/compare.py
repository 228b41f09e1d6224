"""The preset showdown: every policy at the offered load and saturated (its capacity)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, SimResult, simulate

# progress(done, total, message)
Progress = Callable[[int, int, str], None]

# columns of the classic comparison table: summary key -> header with unit
COMPARE_COLUMNS: dict[str, str] = {
    "throughput_output_tok_s": "Throughput at this load (output tok/s)",
    "capacity_output_tok_s": "Capacity (output tok/s)",
    "ttft_p50_s": "TTFT P50 (s)",
    "ttft_p99_s": "TTFT P99 (s)",
    "tpot_p50_s": "TPOT P50 (s)",
    "tpot_p99_s": "TPOT P99 (s)",
    "e2e_p99_s": "E2E P99 (s)",
    "gpu_util": "GPU util (0-1)",
    "batch_efficiency": "Batch efficiency (0-1)",
    "preemptions": "Preemptions",
}


@dataclass(frozen=True, eq=False)
class Comparison:
    results: dict[str, SimResult]  # at the offered load
    saturated: dict[str, SimResult]  # every request at t = 0

    def summaries(self) -> dict[str, dict]:
        return {name: with_capacity(res.summary(), self.saturated[name].summary())
                for name, res in self.results.items()}

    def table(self) -> pd.DataFrame:
        """One row per policy, the classic columns (raw summary keys as column names)."""
        rows = {name: {k: s[k] for k in COMPARE_COLUMNS} for name, s in self.summaries().items()}
        return pd.DataFrame.from_dict(rows, orient="index")


def with_capacity(summary: dict, saturated_summary: dict) -> dict:
    """A run's summary with ``capacity_output_tok_s`` from its saturated twin."""
    return {**summary, "capacity_output_tok_s": saturated_summary["throughput_output_tok_s"]}


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
    """One plain sentence reading a comparison: who wins, by how much, at what latency."""
    if not summaries:
        return ""
    best = max(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    worst = min(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
    b, w = summaries[best], summaries[worst]
    fastest = min(summaries, key=lambda k: summaries[k]["ttft_p99_s"])
    ratio = b["capacity_output_tok_s"] / max(w["capacity_output_tok_s"], 1e-9)
    return (
        f"'{best}' has the highest capacity, {b['capacity_output_tok_s']:,.0f} output tok/s, "
        f"{ratio:.1f}x '{worst}' ({w['capacity_output_tok_s']:,.0f}); at this load it serves "
        f"{b['throughput_output_tok_s']:,.0f} tok/s with P99 TTFT {b['ttft_p99_s']:.2f} s and P99 TPOT "
        f"{b['tpot_p99_s'] * 1e3:.0f} ms. Lowest P99 TTFT: '{fastest}' ({summaries[fastest]['ttft_p99_s']:.2f} s)."
    )
