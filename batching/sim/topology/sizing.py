"""How big a run is before it runs: the steps it takes, summed over its replicas or a split's instances, and the
memory they and its requests take. ``simulate`` refuses, in one line, a run whose estimate passes MAX_STEPS steps
or MAX_RUN_GIB, before anything is simulated.

Memory (peak resident bytes above a warm process; ``benchmarks/bench_memory.py --fleets`` measures it): a run
takes BYTES_PER_REQUEST per request and BYTES_PER_STEP per step summed over its engines, and a fleet behind a
router that reads replica state, or a split, holds every request's state in every engine: BYTES_PER_REQUEST_ENGINE
per request and engine on top (a 512-replica fleet: 67 KB a request); every engine also has a step-time table
of 8 bytes per token count a step may hold (up to 1 MiB: 134 MB for 128 replicas at a 131,072-token budget;
a fleet behind a router shares one, counted once).
Steps: at most one per output token of every request plus its prompt's chunks (each request alone: a light load,
or a fleet of idle replicas); when that bound passes MAX_STEPS / 2, a pilot (one replica's share of the first PILOT_REQUESTS x replicas requests, or a
split's first 4 x PILOT_REQUESTS) is simulated and its steps per request scaled to the run.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batching.sim.engine.kernel import MAX_STEPS

MAX_RUN_GIB = 16.0  # the most one run may take: the documented 2-core, 24 GiB host keeps room for the OS and a dashboard
# at or above every case bench_memory.py --fleets measured (single nodes, round-robin and router fleets of 64 to 512
# replicas, splits of 8 and 64 instances): actual / estimate 0.7 to 1.0
BYTES_PER_REQUEST = 500
BYTES_PER_STEP = 460
BYTES_PER_REQUEST_ENGINE = 130
PILOT_REQUESTS = 1000  # requests of one replica's share a pilot simulates


@dataclass(frozen=True)
class RunSize:
    """A run's size: its requests, its engines and whether each holds every request's state, its steps."""

    requests: int
    engines: int  # replicas, or a split's prefill + decode instances
    holds_all: bool  # every engine holds every request's state (a router that reads replica state, a split)
    steps: int  # summed over the engines: an estimate, or the bound when that is small
    measured: bool = False  # steps from a pilot run (else the bound)

    table_tokens: int = 0  # each engine's step-time table: one float64 per token count a step may hold
    shared_table: bool = False  # the engines share one table (a fleet behind a router: fleet.run_fleet)

    @property
    def bytes(self) -> float:
        every = self.requests * self.engines if self.holds_all else 0
        return (BYTES_PER_REQUEST * self.requests + BYTES_PER_STEP * self.steps + BYTES_PER_REQUEST_ENGINE * every
                + 8 * self.table_tokens * (1 if self.shared_table else self.engines))


def step_bound(prompt_tokens: np.ndarray, output_tokens: np.ndarray, budget: int) -> int:
    """Steps a run takes with every request alone: one per output token plus its prompt's chunks of ``budget``
    tokens (preemption can add recomputed ones; batching only removes steps)."""
    return int(output_tokens.sum() + np.ceil(prompt_tokens / max(1, budget)).sum())


@dataclass(frozen=True)
class Pilot:
    """What a sample run took: its steps up to its last arrival, those after it (the drain), its requests."""

    steps: int
    drain: int
    requests: int
    drains: int  # drains in the whole run (replicas for one replica's share, 1 for a whole split)

    def scaled(self, requests: int) -> int:
        """Steps of ``requests`` at the sample's steps per request while requests arrive, plus the drains."""
        return int(round(self.steps * requests / max(1, self.requests))) + self.drain * self.drains


def table_tokens(prompt_tokens: np.ndarray, output_tokens: np.ndarray, budget: int) -> int:
    """Entries of one engine's step-time table (engine.kernel.new_run_nb): a step's token counts up to the budget
    or the longest request, at most 2^17 (1 MiB a table: 128 replicas at a 131,072-token budget, 134 MB)."""
    longest = int((prompt_tokens + output_tokens).max()) if len(prompt_tokens) else 0
    return min(max(int(budget), longest) + 1, 1 << 17)


def estimate(requests: int, engines: int, holds_all: bool, bound: int, pilot: Callable[[], Pilot],
             measure: bool = False, table: int = 0, shared_table: bool = False) -> RunSize:
    """The run's size: steps = the bound while it is at most MAX_STEPS / 2 (unless ``measure``), else a sample
    run's (``pilot()``) scaled to ``requests``; ``table``: each engine's step-time table entries."""
    if bound <= MAX_STEPS // 2 and not measure:
        return RunSize(requests, engines, holds_all, bound, table_tokens=table, shared_table=shared_table)
    return RunSize(requests, engines, holds_all, pilot().scaled(requests), measured=True, table_tokens=table,
                   shared_table=shared_table)


def check(size: RunSize, what: str, engine_word: str, fewer: str) -> None:
    """Raise ValueError (one line, starting with ``what``: the run's nodes, requests and rate) when the run would
    take more than MAX_STEPS steps or MAX_RUN_GIB. ``engine_word``: "replicas" or "instances"; ``fewer``: what to
    use fewer of."""
    over = f" summed over its {size.engines} {engine_word}" if size.engines > 1 else ""
    if size.steps > MAX_STEPS:
        raise ValueError(
            f"{what}: the run would take about {size.steps:,} steps{over} ({size.steps / size.requests:,.0f} per "
            f"request); allowed up to {MAX_STEPS:,} (the step tables of {MAX_STEPS:,} take "
            f"{BYTES_PER_STEP * MAX_STEPS / 2**30:.0f} GiB): use fewer requests, a higher rate or fewer {fewer}")
    gib = size.bytes / 2**30
    if gib > MAX_RUN_GIB:
        every = f", each of its {size.engines} {engine_word} holding every request's state" if size.holds_all else ""
        raise ValueError(
            f"{what}: the run would need about {gib:,.1f} GiB ({size.requests:,} requests, ~{size.steps:,} steps"
            f"{over}{every}); allowed up to {MAX_RUN_GIB:g} GiB: use fewer requests or fewer {fewer}")
