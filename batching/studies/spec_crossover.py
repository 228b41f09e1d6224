"""Speculative decoding against load: where it stops helping (no Streamlit).

The same scenario runs with speculation on and off at a grid of request rates, from light load to about the
capacity of the run without it; at each rate the two runs' TPOT P50 and output throughput are compared. At low
load speculation cuts TPOT (a small batch is memory-bound: verifying K + 1 tokens costs about what one does);
as the batch grows verification turns compute-bound and the gain shrinks, and where TPOT with speculation
reaches TPOT without it speculation stops helping: the *crossover rate*, read off the two curves by linear
interpolation between the two rates around the first crossing (``crossing``).

What a planner prices is capacity within the SLOs (issue 39 item 4): given an SLO, the study also searches the
highest rate within it with speculation and without (``studies.capacity.capacity``, or the caller's cached
search), and its verdict leads with them; the TPOT curves are the second view.

"With speculation" is the scenario's own speculative decoding when its policy speculates, else EAGLE with
K = 3 (``DEFAULT_SPEC``) at the acceptance the published table gives for the model's family
(``engine.spec_table``; its flat default when no row matches, said as such); "without" is the same policy with
``spec_decode="off"``. Runs are capped at ``MAX_REQUESTS`` requests to keep the view quick (2 × points + 2
simulations, and the two capacity searches).

``summarize(scenario, saturated) -> summary dict`` runs (or looks up) one simulation, as in
``studies.load_curve``: the dashboard passes its cached one, so each point is cached on its own.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from batching.sim.engine.spec_table import spec_text, with_default_acceptance
from batching.sim.hardware.specs import Model
from batching.sim.policy import BatchingPolicy, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.workload.requests import SyntheticWorkload, TraceWorkload
from batching.studies.compare import Progress
from batching.studies.load_curve import capacity_req_s, load_grid

Summarize = Callable[[Scenario, bool], dict]
SloCapacity = Callable[[Scenario], float]  # the highest rate within the SLOs (req/s; 0: none meets them)

DEFAULT_SPEC = {"spec_decode": "eagle", "spec_tokens": 3}  # when the policy does not speculate (acceptance: the table)
SLO_GAIN_TOLERANCE = 0.02  # capacity within the SLOs counts as changed beyond this share (the search's resolution)
MAX_REQUESTS = 2000  # requests per run, at most (the sidebar's count when smaller)
POINTS = 7  # rates per curve
MAX_POINTS = 8
LOW, HIGH = 0.10, 1.0  # the rates, as shares of the capacity without speculation
THROUGHPUT_TOLERANCE = 0.01  # throughput with speculation counts as lower only when it is this much lower
COLUMNS = ("rate_req_s", "load", "tpot_p50_s_on", "tpot_p50_s_off", "throughput_output_tok_s_on",
           "throughput_output_tok_s_off", "tpot_gain", "throughput_ratio")
# crossing(): how the gain behaves over the range
CROSSES, NEVER_HELPS, NO_CROSSING, NO_DATA = "crosses", "never helps", "no crossing", "no data"


def _simulate_summary(scenario: Scenario, saturated: bool) -> dict:
    return simulate(scenario, saturated=saturated).summary()


def spec_policies(policy: BatchingPolicy, model: Model | None = None, workload: str | None = None
                  ) -> tuple[BatchingPolicy, BatchingPolicy, bool]:
    """(with speculation, without, whether the first is ``DEFAULT_SPEC`` because the policy does not
    speculate). The default's acceptance is the one the published table gives for ``model`` (and the workload
    preset ``workload``). Speculation needs continuous batching: other modes raise ValueError."""
    if policy.mode != "continuous":
        raise ValueError(f"speculative decoding needs continuous batching (this policy's mode is {policy.mode!r}); "
                         "pick the continuous, chunked or priority preset")
    defaulted = policy.spec_decode == "off"
    on = with_knobs(policy, **DEFAULT_SPEC) if defaulted else policy
    if defaulted and model is not None:
        on = with_default_acceptance(on, model, workload)
    off = with_knobs(policy, spec_decode="off")
    return on, off, defaulted


def capped(scenario: Scenario, max_requests: int = MAX_REQUESTS) -> Scenario:
    """The scenario with at most ``max_requests`` requests (a synthetic workload's count, a trace's first ones)."""
    wl = scenario.workload
    if isinstance(wl, SyntheticWorkload) and wl.num_requests > max_requests:
        return scenario.with_workload(wl.with_num_requests(int(max_requests)))
    if isinstance(wl, TraceWorkload) and (wl.max_requests is None or wl.max_requests > max_requests):
        return scenario.with_workload(replace(wl, max_requests=int(max_requests)))
    return scenario


def crossing(rates: Sequence[float], gain: Sequence[float], tolerance: float = 0.0) -> tuple[float | None, str]:
    """Where a gain (with / without, above 1 = speculation better) first falls below ``1 - tolerance`` over
    increasing rates: (rate, ``CROSSES``) by linear interpolation between the last rate at or above and the first
    below; (None, ``NEVER_HELPS``) when it is below at the lowest rate already; (None, ``NO_CROSSING``) when it
    never falls below within the range; (None, ``NO_DATA``) without a finite gain. Rates without a finite gain
    are skipped."""
    r = np.asarray(rates, float)
    g = np.asarray(gain, float)
    ok = np.isfinite(r) & np.isfinite(g)
    r, g = r[ok], g[ok]
    if not len(r):
        return None, NO_DATA
    order = np.argsort(r, kind="stable")
    r, g = r[order], g[order]
    level = 1.0 - tolerance
    below = np.flatnonzero(g < level)
    if not len(below):
        return None, NO_CROSSING
    i = int(below[0])
    if i == 0:
        return None, NEVER_HELPS
    r0, r1, g0, g1 = r[i - 1], r[i], g[i - 1], g[i]
    t = (g0 - level) / (g0 - g1) if g0 != g1 else 0.0
    return float(r0 + t * (r1 - r0)), CROSSES


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else float("nan")


@dataclass(frozen=True, eq=False)
class SpecCrossover:
    """Both curves and where speculation stops helping."""

    scenario_on: Scenario  # with speculation (capped to MAX_REQUESTS)
    scenario_off: Scenario
    defaulted: bool  # the scenario did not speculate: "on" is DEFAULT_SPEC
    frame: pd.DataFrame  # COLUMNS, one row per rate, increasing
    capacity_on_req_s: float  # saturated runs: requests/s served flat out
    capacity_off_req_s: float
    capacity_on_tok_s: float
    capacity_off_tok_s: float
    crossover_req_s: float | None  # where TPOT P50 with speculation reaches TPOT P50 without it
    status: str  # crossing()'s status of the TPOT gain
    throughput_crossover_req_s: float | None  # where throughput with it falls THROUGHPUT_TOLERANCE below without
    throughput_status: str
    # the highest rate within the SLOs with and without speculation (None: no SLO was given) and the SLOs, in words
    slo_capacity_on_req_s: float | None = None
    slo_capacity_off_req_s: float | None = None
    slo_text: str = ""

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(float(r) for r in self.frame["rate_req_s"])

    @property
    def num_requests(self) -> int:
        return int(self.scenario_off.workload.num_requests)

    def method(self) -> str:
        """The speculation compared, as people write it: 'EAGLE, K = 3, A = 0.743'."""
        p = self.scenario_on.policy
        text = spec_text(p).split(";")[0]
        text = text.split(" (")[0] if "tokens per verification" in text else text
        if p.spec_disable_batch_size:
            text += f", off at {p.spec_disable_batch_size} or more sequences"
        return text

    def acceptance_text(self) -> str:
        """Method, K, acceptance and where the acceptance comes from (``engine.spec_table.spec_text``)."""
        return spec_text(self.scenario_on.policy)

    @property
    def slo_gain(self) -> float:
        """Capacity within the SLOs with / without speculation (NaN without an SLO or a capacity without)."""
        if self.slo_capacity_on_req_s is None or self.slo_capacity_off_req_s is None:
            return float("nan")
        return _ratio(self.slo_capacity_on_req_s, self.slo_capacity_off_req_s)

    def slo_sentence(self) -> str:
        """The capacity verdict: does speculation raise the rate served within the SLOs ('' without an SLO)."""
        on, off = self.slo_capacity_on_req_s, self.slo_capacity_off_req_s
        if on is None or off is None:
            return ""
        within = f"within the SLOs ({self.slo_text})" if self.slo_text else "within the SLOs"
        if off <= 0 and on <= 0:
            return f"Neither with nor without speculation ({self.method()}) does any rate tried stay {within}."
        if off <= 0:
            return (f"Only with speculation ({self.method()}) does a rate stay {within}: {on:,.3g} req/s; without "
                    "it none tried does.")
        gain = on / off
        if gain > 1 + SLO_GAIN_TOLERANCE:
            verdict = f"speculation ({self.method()}) pays: {gain:.2f}× the capacity"
        elif gain < 1 - SLO_GAIN_TOLERANCE:
            verdict = f"speculation ({self.method()}) costs capacity: {gain:.2f}× without it"
        else:
            verdict = (f"speculation ({self.method()}) changes capacity by less than "
                       f"{SLO_GAIN_TOLERANCE * 100:.0f} % ({gain:.2f}×)")
        return (f"Capacity {within}: {on:,.3g} req/s with speculation, {off:,.3g} without; {verdict}.")

    def sentence(self) -> str:
        """The capacity within the SLOs with and without speculation first (when an SLO was given), then what the
        two TPOT curves say, with numbers."""
        lead = self.slo_sentence()
        return f"{lead} {self.tpot_sentence()}" if lead else self.tpot_sentence()

    def tpot_sentence(self) -> str:
        """What the two curves say, in one or two sentences with numbers."""
        df = self.frame
        if df.empty:
            return "No rate could be run: the run without speculation finished no request."
        lo, hi = float(df["rate_req_s"].iloc[0]), float(df["rate_req_s"].iloc[-1])
        g0, g1 = float(df["tpot_gain"].iloc[0]), float(df["tpot_gain"].iloc[-1])
        if self.status == CROSSES:
            head = (f"Speculation ({self.method()}) stops helping at about {self.crossover_req_s:,.3g} req/s: "
                    f"below it TPOT P50 is lower with speculation ({g0:.2f}× at {lo:,.3g} req/s), above it higher "
                    f"({g1:.2f}× at {hi:,.3g} req/s).")
        elif self.status == NEVER_HELPS:
            head = (f"Speculation ({self.method()}) does not help even at the lowest rate: TPOT P50 is {1 / g0:.2f}× "
                    f"higher with it at {lo:,.3g} req/s.")
        elif self.status == NO_CROSSING:
            head = (f"Speculation ({self.method()}) helps over the whole range: the curves do not cross between "
                    f"{lo:,.3g} and {hi:,.3g} req/s (TPOT P50 {g0:.2f}× lower at the lowest rate, {g1:.2f}× at "
                    "the highest).")
        else:
            head = f"No TPOT could be compared between {lo:,.3g} and {hi:,.3g} req/s."
        cap = _ratio(self.capacity_on_tok_s, self.capacity_off_tok_s)
        tail = (f" Capacity (every request queued at once): {self.capacity_on_req_s:,.3g} req/s with speculation, "
                f"{self.capacity_off_req_s:,.3g} without ({cap:.2f}×).") if math.isfinite(cap) else ""
        if self.throughput_status == CROSSES:
            tail += (f" Output throughput falls below the run without speculation from about "
                     f"{self.throughput_crossover_req_s:,.3g} req/s.")
        return head + tail


def read_crossover(scenario_on: Scenario, scenario_off: Scenario, defaulted: bool, rates: Sequence[float],
                   on: Sequence[dict], off: Sequence[dict], saturated_on: dict, saturated_off: dict
                   ) -> SpecCrossover:
    """The study from the runs' summaries: ``on``/``off`` at each rate of ``rates``, and the saturated runs."""
    cap_off = capacity_req_s(saturated_off)
    rows = []
    for rate, s_on, s_off in zip(rates, on, off):
        t_on, t_off = _num(s_on.get("tpot_p50_s")), _num(s_off.get("tpot_p50_s"))
        x_on, x_off = _num(s_on.get("throughput_output_tok_s")), _num(s_off.get("throughput_output_tok_s"))
        rows.append({"rate_req_s": float(rate), "load": _ratio(float(rate), cap_off), "tpot_p50_s_on": t_on,
                     "tpot_p50_s_off": t_off, "throughput_output_tok_s_on": x_on,
                     "throughput_output_tok_s_off": x_off, "tpot_gain": _ratio(t_off, t_on),
                     "throughput_ratio": _ratio(x_on, x_off)})
    df = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("rate_req_s", kind="stable").reset_index(drop=True)
    cross, status = crossing(df["rate_req_s"], df["tpot_gain"])
    t_cross, t_status = crossing(df["rate_req_s"], df["throughput_ratio"], THROUGHPUT_TOLERANCE)
    return SpecCrossover(scenario_on, scenario_off, defaulted, df, capacity_req_s(saturated_on), cap_off,
                         _num(saturated_on.get("throughput_output_tok_s")),
                         _num(saturated_off.get("throughput_output_tok_s")), cross, status, t_cross, t_status)


def crossover_scenarios(scenario: Scenario, max_requests: int = MAX_REQUESTS, workload: str | None = None
                        ) -> tuple[Scenario, Scenario, bool]:
    """(with speculation, without, defaulted): ``spec_policies`` on the scenario (the acceptance looked up for
    its model and the workload preset ``workload`` when none is given), capped to ``max_requests``."""
    on, off, defaulted = spec_policies(scenario.policy, scenario.deployment.model, workload)
    base = capped(scenario, max_requests)
    return base.with_policy(on), base.with_policy(off), defaulted


def crossover_rates(saturated_off: dict, points: int = POINTS, low: float = LOW, high: float = HIGH) -> list[float]:
    """The rates both curves run at: ``points`` from ``low`` to ``high`` of the capacity without speculation."""
    if not 2 <= int(points) <= MAX_POINTS:
        raise ValueError(f"points={points!r}; allowed 2 to {MAX_POINTS}")
    rates = load_grid(capacity_req_s(saturated_off), int(points), low, high)
    if not len(rates):
        raise ValueError("the run without speculation finished no request, so it has no capacity to sweep up to")
    return [float(r) for r in rates]


def spec_crossover(scenario: Scenario, points: int = POINTS, low: float = LOW, high: float = HIGH,
                   max_requests: int = MAX_REQUESTS, summarize: Summarize | None = None,
                   progress: Progress | None = None, slo=None, slo_capacity: SloCapacity | None = None,
                   workload: str | None = None) -> SpecCrossover:
    """Sweep the request rate with speculation on and off (``crossover_scenarios``), ``points`` rates from ``low``
    to ``high`` of the capacity without it, and read where speculation stops helping (``read_crossover``). With an
    ``slo`` (``studies.capacity.SLO``) the highest rate within it is searched with and without speculation
    (``slo_capacity(scenario)``, default ``studies.capacity.capacity``'s max_rate_req_s): the verdict's lead.
    ``progress(done, total, label)`` after each run (2 saturated runs, 2 per rate, then the 2 searches)."""
    summarize = summarize or _simulate_summary
    sc_on, sc_off, defaulted = crossover_scenarios(scenario, max_requests, workload)
    searches = 2 if slo is not None else 0
    total = 2 + 2 * int(points) + searches
    done = 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    sat_off = summarize(sc_off, True)
    step("capacity without speculation")
    sat_on = summarize(sc_on, True)
    step("capacity with speculation")
    rates = crossover_rates(sat_off, points, low, high)
    total = 2 + 2 * len(rates) + searches
    on, off = [], []
    for rate in rates:
        off.append(summarize(sc_off.with_workload(sc_off.workload.with_rate(rate)), False))
        step(f"{rate:,.3g} req/s without speculation")
        on.append(summarize(sc_on.with_workload(sc_on.workload.with_rate(rate)), False))
        step(f"{rate:,.3g} req/s with speculation")
    study = read_crossover(sc_on, sc_off, defaulted, rates, on, off, sat_on, sat_off)
    if slo is None:
        return study
    if slo_capacity is None:
        from batching.studies.capacity import capacity  # (the search, only when an SLO asks for it)

        def slo_capacity(sc: Scenario) -> float:
            return capacity(sc, slo).max_rate_req_s
    cap_off = float(slo_capacity(sc_off))
    step("capacity within the SLOs without speculation")
    cap_on = float(slo_capacity(sc_on))
    step("capacity within the SLOs with speculation")
    return replace(study, slo_capacity_on_req_s=cap_on, slo_capacity_off_req_s=cap_off,
                   slo_text=slo.describe() if hasattr(slo, "describe") else str(slo))
