"""The planning pages' Streamlit pieces (Tune a knob, Capacity planning): the SLO inputs both pages share (one
default, one set of URL keys), cached sweeps and capacity searches that take the simulation slots like every
other cached call, the guided checks drawn, and the download row.

The rules themselves (ranges, readings, the checks, the plan) live in ``batching.studies.planning``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass, replace

import pandas as pd
import streamlit as st

from batching.sim.metrics import saturated_capacity
from batching.sim.simulate import Scenario
from batching.studies import planning as sp
from batching.studies.capacity import (ATTAINMENT_DEFAULT, SLO, SLO_MAX_S, CapacityResult, capacity, default_slo,
                                       per_class_values)
from batching.studies import disagg_capacity, sweeps
from batching.ui import cache, slots, state
from batching.ui.params import Param
from batching.ui.safe import plain



# ---------------------------------------------------------------- the SLOs both pages read

# URL key -> (label, the input's unit per second, the most it accepts in that unit); "0" or empty = no such SLO
SLO_INPUTS = {"ttft_ms": ("TTFT SLO (ms)", 1e3, SLO_MAX_S * 1e3), "tpot_ms": ("TPOT SLO (ms)", 1e3, SLO_MAX_S * 1e3),
              "e2e_s": ("E2E SLO (s)", 1.0, SLO_MAX_S)}
_FIELDS = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_s": "e2e_s"}
_SLO_CLASSES = "slo_classes"  # the class names the stored SLO texts were written for


def _text(value, per_s: float) -> str:
    if value is None:
        return "0"
    values = value if isinstance(value, tuple) else (value,)
    return ",".join(f"{v * per_s:.10g}" for v in values)


def slo_params(num_classes: int) -> list[Param]:
    """The SLO inputs as URL values: a comma list per target (class 0 first; one value = every class; 0 = no
    such SLO), defaulting to ``studies.capacity.default_slo``, and the attainment target in %."""
    d = default_slo(num_classes)
    out = [Param(key, _text(getattr(d, _FIELDS[key]), per_s), label=label)
           for key, (label, per_s, _) in SLO_INPUTS.items()]
    return out + [Param("attain", ATTAINMENT_DEFAULT * 100, 1.0, 100.0, label="attainment target (%)")]


def load_slo_params(names: Sequence[str]) -> list[Param]:
    """``slo_params`` for these classes, loaded from the link or the session. When the number of classes changed
    (another workload in the sidebar), a target still at the old default moves to the new one."""
    ps = slo_params(len(names))
    seen = st.session_state.get(_SLO_CLASSES)
    if seen is not None and len(seen) != len(names):
        old = {p.key: p.default for p in slo_params(len(seen))}
        for p in ps:
            if p.key in old and state.value(p.key) == old[p.key]:
                state.set_value(p.key, p.default)
    st.session_state[_SLO_CLASSES] = tuple(names)
    state.load_with_notices(ps)
    return ps


def _is_zero(text: str) -> bool:
    try:
        return text == "" or float(text) == 0
    except ValueError:
        return False


def slo_from_state(names: Sequence[str]) -> tuple[SLO | None, str | None]:
    """(the SLO the inputs give, None) or (None, a one-line reason naming the input)."""
    k = len(names)
    given = {}
    for key, (label, per_s, high) in SLO_INPUTS.items():
        text = str(state.value(key, "0")).strip()
        if _is_zero(text):  # "", "0", "0.0": no such SLO
            continue
        try:
            values = per_class_values(text, high)
        except ValueError as exc:
            return None, f"{label}: {exc}"
        if len(values) not in (1, k):
            listed = ", ".join(names)
            want = "1 value" if k == 1 else f"1 value (every class) or {k}, class 0 first"
            return None, (f"{label}: {len(values)} values for {k} class{'es' if k != 1 else ''} "
                          f"({listed[:120]}); give {want}")
        given[_FIELDS[key]] = tuple(v / per_s for v in values)
    slo = SLO(**given, attainment=float(state.value("attain", ATTAINMENT_DEFAULT * 100)) / 100)
    try:
        slo.validate(k)
    except ValueError as exc:
        return None, str(exc)
    return slo, None


def slo_inputs(names: Sequence[str], columns: Sequence | None = None) -> None:
    """The TTFT, TPOT and E2E inputs (text: one value or one per class) and the attainment target, bound to the
    shared URL keys, in ``columns`` (four) or a new row."""
    cols = list(columns) if columns is not None else st.columns(4, gap="medium")
    classes = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
    per = (f"One value applies to every class; or one per class separated by commas, class 0 first ({classes}). "
           "0 = no such SLO.")
    helps = {"ttft_ms": "Time to first token, queueing included, that a request must not exceed. ",
             "tpot_ms": "Time per output token after the first (mean per request). ",
             "e2e_s": "End-to-end latency, arrival to release. "}
    for col, (key, (label, _, _)) in zip(cols, SLO_INPUTS.items()):
        col.text_input(label, help=plain(helps[key] + per), **state.bind(key))
    attain = slo_params(len(names))[-1]
    cols[3].number_input("Attainment target (%)", **attain.widget_range(), step=0.5, format="%.1f",
                         help="Share of all requests that must meet the SLOs of their class (99 % reads as 'P99 "
                              "within the SLOs').", **state.bind("attain"))


# ---------------------------------------------------------------- cached studies


def _extra_slots(wanted: int) -> int:
    """Take up to ``wanted`` more simulation slots without waiting (the caller already holds one), only while
    nobody waits for one (``slots.Slots.take_extra``)."""
    took = 0
    while took < wanted and cache.SLOTS.take_extra():
        took += 1
    return took


# a sweep point's runs at most: the offered load, the capacity run, and a capacity search of up to 20 rates
POINT_RUNS = 22


def _row(sc: Scenario, slo: SLO | None, search: bool) -> dict:
    """One value's sweep row from cached reduced runs (``cache.reading``): a new SLO re-reads the runs at the
    offered load and at capacity, and every rate its capacity search already tried."""
    row = sweeps.run_point(sc, True, slo, search, run=cache.reading, probe=cache.probe_reading)
    metrics = sweeps.SWEEP_METRICS + (sweeps.SLO_METRICS if slo is not None else ())
    return {k: row[k] for k in metrics if k in row}


def _search(sc: Scenario, slo: SLO) -> CapacityResult:
    """A rate sweep's one capacity search (``sweeps.sweep`` runs the same), on cached reduced runs. Closed-loop
    clients: the highest concurrency within the SLOs (``capacity`` searches it; no saturated ceiling needed)."""
    if getattr(sc.workload, "concurrency", None) is not None:
        return capacity(sc, slo, run=cache.probe_reading)
    sat = cache.reading(sc, True).summary()
    return capacity(sc, slo, ceiling=saturated_capacity(sat)[0], run=cache.probe_reading)


def _frame_key(scenario: Scenario, knob: str, values: tuple[float, ...], slo: SLO | None) -> tuple:
    return ("sweep", cache.scenario_token(scenario), knob, values, slo)


def sweeps_cached(jobs: Sequence[tuple[str, Scenario, str, Sequence[float], SLO | None]], text: str,
                  preview: Callable[[dict[int, pd.DataFrame], int, int], None] | None = None
                  ) -> list[pd.DataFrame | str]:
    """``studies.sweeps.sweep`` (with capacity runs and, with ``slo``, a capacity search within the SLOs per value)
    for several sweeps (label, scenario, knob, values, slo) at once through bounded caches, with the columns the
    checks read (``studies.planning.with_readings``: offered load per value and peak KV use). Each point is
    cached on its own: a move that changes some values, or only the SLOs, recomputes only what it must. The
    missing points of every sweep run together on every free simulation slot (the kernel releases the GIL),
    the first sweep's first (its charts complete before the other policies' points), under a progress bar that
    counts them. ``preview(frames, done, total)``: called on the script thread as points finish (at most every
    PREVIEW_S, not after the last), with each sweep's frame of the points it has so far (job index -> frame; a
    rate sweep's capacity column once its search is done), so the page draws them as they come. The first
    sweep's ValueError is raised; another's comes back as its text."""
    out: list[pd.DataFrame | str | None] = [None] * len(jobs)
    plans = []  # (job index, values, scenarios, per-value search, point keys, search key)
    for j, (_, scenario, knob, values, slo) in enumerate(jobs):
        vals = tuple(float(v) for v in values)
        hit = cache.peek(_frame_key(scenario, knob, vals, slo))
        if hit is not None:
            out[j] = hit.copy()
            continue
        try:
            scenarios = sweeps.point_scenarios(scenario, knob, vals, slo)
        except ValueError as exc:
            if j == 0:
                raise
            out[j] = str(exc)
            continue
        per_value = sweeps.searches_per_value(knob)
        keys = [("sweep_point", cache.scenario_token(sc), slo, per_value) for sc in scenarios]
        search_key = ("sweep_search", cache.scenario_token(scenario), slo) if slo is not None and not per_value \
            else None
        plans.append((j, vals, scenarios, per_value, keys, search_key))
    got: dict = {}
    todo = []  # (order, key, label, compute)
    for j, vals, scenarios, per_value, keys, search_key in plans:
        label, scenario, knob, _, slo = jobs[j]
        if search_key is not None:
            hit = cache.peek(search_key)
            if hit is not None:
                got[search_key] = hit
            else:
                todo.append(((j, -1), search_key, f"{label}: capacity search",
                             lambda sc=scenario, slo=slo: _search(sc, slo)))
        for i, (v, sc, key) in enumerate(zip(vals, scenarios, keys)):
            hit = cache.peek(key)
            if hit is not None:
                got[key] = hit
            elif key not in {t[1] for t in todo}:
                todo.append(((j, i), key, f"{label}, {sp.fmt_value(knob, v)}",
                             lambda sc=sc, slo=slo, pv=per_value: _row(sc, slo, pv)))
    errors: dict = {}
    if todo:
        runs = {key: sc for j, _, scenarios, _, keys, _ in plans for sc, key in zip(scenarios, keys)}
        runs.update({sk: jobs[j][1] for j, _, _, _, _, sk in plans if sk is not None})
        cost = sum(POINT_RUNS * slots.run_cost(runs[key]) for _, key, _, _ in todo)

        def partial() -> dict[int, pd.DataFrame]:
            frames = {}
            for j, vals, _, _, keys, search_key in plans:
                have = [(v, got[k]) for v, k in zip(vals, keys) if k in got]
                if have:
                    _, scenario, knob, _, slo = jobs[j]
                    frame = sweeps.sweep_frame(knob, [v for v, _ in have], [r for _, r in have], slo,
                                               got.get(search_key) if search_key is not None else None)
                    frames[j] = sp.with_readings(frame, scenario, knob)
            return frames

        on_point = None if preview is None else lambda done, total: preview(partial(), done, total)
        _run_points(sorted(todo, key=lambda t: t[0]), got, errors, text, cache.is_light(cost), on_point)
    for j, vals, scenarios, per_value, keys, search_key in plans:
        _, scenario, knob, _, slo = jobs[j]
        bad = [errors[k] for k in [*keys, search_key] if k in errors]
        if bad:
            if j == 0:
                raise bad[0]
            out[j] = str(bad[0])
            continue
        frame = sweeps.sweep_frame(knob, vals, [got[k] for k in keys], slo,
                                   got[search_key] if search_key is not None else None)
        frame = sp.with_readings(frame, scenario, knob)
        cache.small_cached(_frame_key(scenario, knob, vals, slo), lambda f=frame: f,
                           int(frame.memory_usage(deep=True).sum()) + 1024)
        out[j] = frame.copy()
    return out


PREVIEW_S = 1.0  # the shortest interval between two previews of a sweep in progress (each draws figures)


def _run_points(todo: list, got: dict, errors: dict, text: str, light: bool = False,
                on_point: Callable[[int, int], None] | None = None) -> None:
    """Compute the missing points on a pool as wide as the free slots (one held, the others taken without
    waiting), each stored as it ends; the script thread draws the progress and calls ``on_point(done, total)``
    after a point ends (at most every PREVIEW_S; not after the last, which the caller draws whole). ValueErrors
    are kept per key. When the page goes, the points not started are dropped and the running ones stop at their
    next simulation."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    cache.ensure_kernel()
    holder = st.empty()
    total = len(todo)

    def run() -> None:
        extra = _extra_slots(min(total, cache.MAX_CONCURRENT) - 1)
        job = slots.Job()
        try:
            with ThreadPoolExecutor(max_workers=1 + extra) as pool:
                futures = {pool.submit(job.wrap(cache.small_cached, heavy=not light), key, fn): (key, label)
                           for _, key, label, fn in todo}
                try:
                    done, shown = 0, -math.inf
                    holder.progress(0.0, text=f"{text}: 0 of {total} points")
                    for fut in slots.as_completed(futures):
                        key, label = futures[fut]
                        try:
                            got[key] = fut.result()
                        except ValueError as exc:
                            errors[key] = exc
                        done += 1
                        holder.progress(done / total, text=f"{text}: {done} of {total} points (last: {label})")
                        if on_point is not None and done < total and time.monotonic() - shown >= PREVIEW_S:
                            on_point(done, total)
                            shown = time.monotonic()
                except BaseException:  # the page went, or a new rerun stopped this one: the points running stop
                    job.stop()
                    for fut in futures:
                        fut.cancel()
                    raise
        finally:
            for _ in range(extra):
                cache.SLOTS.release()

    try:
        cache.with_slot(lambda: cache.run_in_slot(run, light=light), light)
    finally:
        holder.empty()


def capacity_cached(scenario: Scenario, slo: SLO) -> CapacityResult:
    """``studies.capacity.capacity`` for the scenario's policy through a bounded cache (``cache.SUMMARIES``: a hit
    hashes nothing and unpickles nothing), on cached reduced runs: another SLO re-reads the capacity run and
    every rate already tried (here, on Tune, or by an earlier search); the search and its answer are
    ``capacity``'s. The search does not depend on the target traffic or the price:
    ``studies.planning.plan_capacity`` adds those, so changing them runs nothing."""
    slo.validate()
    key = ("capacity", cache.scenario_token(scenario), slo)
    found = cache.peek(key)
    if found is None:
        light = cache.is_light(POINT_RUNS * slots.run_cost(scenario))
        found = cache.with_slot(lambda: cache.run_in_slot(
            lambda: cache.small_cached(key, lambda: _search(scenario, slo), 16384), light=light,
            background=not light), light)
    # the stored result is shared: each caller gets its own frame (copy-on-write) and class readings
    return replace(found, points=found.points.copy(deep=False), by_priority=deepcopy(found.by_priority))


def split_capacity_cached(scenario: Scenario, slo: SLO, policy=None) -> disagg_capacity.SplitCapacity:
    """``studies.disagg_capacity.disagg_capacity``: the scenario aggregated and split into prefill and decode
    instances, each configuration's search through ``capacity_cached`` (kept per configuration and SLO, on cached
    reduced runs: another SLO re-reads the rates already tried), under a progress bar."""
    return disagg_capacity.disagg_capacity(
        scenario, slo, policy, search=lambda sc: capacity_cached(sc, slo),
        run_all=lambda tasks: cache.run_with_progress(tasks, "Searching each configuration for the highest rate "
                                                             "within the SLOs"))


# ---------------------------------------------------------------- what a page keeps between reruns


@dataclass(frozen=True, eq=False)
class TuneView:
    """The last sweep the Tune page ran, and how it was drawn."""

    study: sp.SweepStudy
    log_x: bool  # log-spaced values: log knob axes
    frontier: str  # the frontier's latency axis (charts.planning.FRONTIER_LATENCY key)


# ---------------------------------------------------------------- the guided checks, drawn


def card_markdown(card: sp.Card) -> str:
    lines = [f"**{card.number} · {card.title}.** {card.text}", "", "Triggered by:"]
    lines += [f"- {t}" for t in card.triggers]
    return "\n".join(lines)


def how_checks_read() -> str:
    """The rules of the three checks, with their thresholds (from ``studies.planning``)."""
    return (
        "Each check reads the sweep at the scenario's configured values (the policy's own cap, the sidebar's "
        "rate, ...), not at values it does not run; a knob the policy does not use fires none.\n\n"
        f"1. **Batch cap too large** (a sweep of {', '.join(sp.CAP_KNOBS)} with a knee): the configured cap is "
        "past the knee, where capacity (within the SLOs, when the sweep has them) grows by less than the knee "
        f"share while peak KV use rises by ≥ {sp.KV_RISE * 100:.0f} points of the cache or preemptions rise. "
        "Suggests the knee.\n"
        f"2. **Batch cap too small**: batch efficiency ≥ {sp.FULL_BATCH * 100:.0f} % at the offered load "
        f"while requests queue (offered load ≥ {sp.AT_CAPACITY * 100:.0f} % of capacity, TTFT P99 ≥ "
        f"{sp.TAIL_RATIO:.0f} × P50, or TTFT P99 ≥ {sp.SWEEP_TAIL_RATIO:.0f} × the sweep's lowest) "
        f"and the GPU has room (sol_util < {sp.ROOM_GPU_UTIL * 100:.0f} %, and in a sweep of the cap a "
        f"larger value adds ≥ {sp.ROOM_CAPACITY_GAIN * 100:.0f} % capacity), at the configured cap or a larger "
        "one. Suggests the smallest larger value that stops the queue, at most the knee.\n"
        f"3. **Batch efficiency below {sp.LOW_EFFICIENCY * 100:.0f} %** (static and dynamic batching): "
        f"batches run under half full while the node keeps up (offered load < "
        f"{sp.AT_CAPACITY * 100:.0f} % of capacity). Suggests a smaller cap or a longer wait.")


def guided_checks(study: sp.SweepStudy) -> None:
    """The checks that fired as warnings (or one success line), and an expander with every check's reading."""
    st.markdown("#### Guided checks")
    for card in study.fired:
        st.warning(card_markdown(card), icon=":material/lightbulb:")
    if not study.fired:
        st.success(sp.NONE_FIRED, icon=":material/check_circle:")
    with st.expander("How the three checks read this sweep"):
        st.markdown(how_checks_read())
        for card in study.cards:
            status = "fired" if card.fired else "did not fire"
            st.markdown(f"**{card.number} · {card.title}: {status}.** " + ("" if card.fired else card.text))
            if card.triggers:
                st.markdown("\n".join(f"- {t}" for t in card.triggers))


# ---------------------------------------------------------------- downloads


def download_row(name: str, files: Sequence[tuple[str, Callable[[], bytes | str], str, str, str]],
                 link: str | None = None, figures: Callable[[], Mapping] | None = None) -> None:
    """Download buttons (label, deferred data, file suffix, MIME type, tooltip), every chart as PNG and SVG
    (``figures``: file stem -> figure, built on the click), then the link to this view.

    The files are made only when a button is clicked, so reruns stay fast.
    """
    from batching.ui.downloads import chart_buttons

    st.subheader("Downloads", divider="gray")
    cols = st.columns(max(4, len(files) + (2 if figures is not None else 0)))
    icons = {"text/csv": ":material/table:", "application/json": ":material/data_object:",
             "text/html": ":material/description:"}
    for col, (label, data, suffix, mime, tip) in zip(cols, files):
        col.download_button(label, data, f"{name}_{suffix}", mime, on_click="ignore", width="stretch",
                            icon=icons.get(mime, ":material/download:"), help=tip)
    if figures is not None:
        chart_buttons(cols[len(files):], name, figures)
    st.markdown("**Link to this view** (the scenario and settings are in the URL):")
    st.code(link or state.current_link(), language=None, wrap_lines=True)
