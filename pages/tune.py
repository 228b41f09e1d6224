"""Tune a knob: sweep one knob of a policy (or the traffic mix, the rate, the KV cache), see where it stops
paying within the SLOs (the Capacity page's, one shared default), and read the three classic batching pitfalls
off the sweep's own numbers at the configured values. A second view, the speculation crossover, sweeps the
request rate with speculative decoding on and off and marks the rate where it stops helping."""
import json

import pandas as pd
import streamlit as st

from batching.sim.metrics import saturated_capacity
from batching.charts import policy as charts

from batching import report
from batching.charts import planning as cp
from batching.charts import spec as spec_charts
from batching.sim.metrics import DEFINITIONS
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.studies import planning as sp
from batching.studies.capacity import class_names
from batching.studies.knee import DEFAULT_SHARE, SHARE_LIMITS
from batching.studies import spec_crossover as sx
from batching.studies.sweeps import KNOBS
from batching.ui import cache, knobs, nav, page, planning, state, widgets
from batching.ui.params import Param
from batching.ui.safe import plain
from batching.ui import downloads

PREFIX = "t_"  # the fixed knobs' URL keys (t_seqs, t_budget, ...), apart from Explore's
DEFAULT_PRESET = "continuous"
LAST = "tune_last"
SEEN = "tune_seen"  # (preset, knob) of the previous run: when either changes the range resets to its defaults
FIGURES = "tune_figures"  # session: each chart last drawn and what it was drawn from (building the Plotly figures
# is most of a rerun that runs nothing: a move that changes neither the sweep nor the knee reuses them)
# the page's two views: a knob sweep, or the rate swept with speculative decoding on and off
VIEWS = {"sweep": "Sweep a knob", "spec": "Speculation crossover"}
SPEC_LAST = "tune_spec_last"  # session: the last speculation crossover study drawn
UNITS = {"max_batch_size": "requests", "max_num_seqs": "seqs", "max_wait_s": "s", "max_num_batched_tokens": "tokens",
         "high_share": "0-1", "rate_req_s": "req/s", "kv_cache_tokens": "tokens"}
FRONTIER_LABELS = {"tpot_cap": "P99 TPOT at capacity", "tpot": "P99 TPOT at the offered load",
                   "ttft": "P99 TTFT at the offered load"}
# table columns: sweep column -> (header with unit, factor, format, tooltip)
TABLE = {
    "max_rate_req_s": ("Rate within SLOs (req/s)", 1, "%.3g", "Capacity within the SLOs: the highest request rate "
                       "per node at which the attainment target is met (a capacity search per value); the knee is "
                       "read on it."),
    "slo_attainment": ("SLO attainment (%)", 100, "%.1f", "Share of requests meeting the SLOs of their class at the "
                       "offered load."),
    "steady_output_tok_s": ("Throughput (tok/s)", 1, "%.0f", "Output tokens/s at the offered load while requests "
                            "arrive (the drain after the last arrival not counted): the offered output tok/s while "
                            "the node keeps up."),
    "capacity_output_tok_s": ("Capacity (tok/s)", 1, "%.0f", "Output tokens/s with every request queued at t = 0."),
    "offered_output_tok_s": ("Offered (tok/s)", 1, "%.0f", "Output tokens/s the traffic brings: mean rate × mean "
                             "output length."),
    "ttft_p50_s": ("TTFT P50 (s)", 1, "%.3f", "Median time to first token, queueing included."),
    "ttft_p99_s": ("TTFT P99 (s)", 1, "%.3f", "99th percentile time to first token."),
    "tpot_p50_s": ("TPOT P50 (ms)", 1e3, "%.1f", "Median time per output token after the first."),
    "tpot_p99_s": ("TPOT P99 (ms)", 1e3, "%.1f", "99th percentile time per output token."),
    "capacity_tpot_p99_s": ("TPOT P99 at capacity (ms)", 1e3, "%.1f", "P99 TPOT in the capacity run (batch full)."),
    "gpu_util": ("GPU util (%)", 100, "%.1f", DEFINITIONS["gpu_util"][1]),  # the summary's gpu_util, as it is defined
    "batch_efficiency": ("Batch eff. (%)", 100, "%.1f", "Mean running sequences per step / the batch cap."),
    "kv_pressure": ("Peak KV use (%)", 100, "%.1f", "Most KV blocks in use at once × 16 / KV capacity (tokens)."),
    "preemptions": ("Preemptions", 1, "%d", "Times a running request was evicted."),
}

scenario = page.setup(
    nav.TUNE,
    "Sweep one knob over a range on the sidebar's scenario: throughput, capacity, latency and memory against it, "
    "the knee where it stops paying, and three guided checks for the classic batching pitfalls; or the request "
    "rate with speculative decoding on and off, and where it stops helping.")


def _range_params(knob: str, sc: Scenario) -> list[Param]:
    cap_rate = None
    if knob == "rate_req_s":
        try:
            cap_rate = saturated_capacity(cache.capacity_summary(sc))[0]
        except (ValueError, RuntimeError):
            cap_rate = None  # the default range falls back to the sidebar's rate; the sweep reports the error
    start, stop, points, spacing = sp.default_range(knob, sc, cap_rate)
    low, high = sp.bounds(knob, sc)
    kind = int if knob in sp.INT_KNOBS else float
    return [Param("from", kind(start), kind(low), kind(high), label="sweep start"),
            Param("to", kind(stop), kind(low), kind(high), label="sweep stop"),
            Param("points", int(points), 2, sp.MAX_POINTS, label="points"),
            Param("spacing", spacing, choices=sp.SPACINGS, label="spacing")]


def _share_param() -> Param:
    low, high = SHARE_LIMITS
    return Param("share", DEFAULT_SHARE * 100, low * 100, high * 100, label="knee share (%)")


def _frontier_param(knob: str) -> Param:
    return Param("frontier", "ttft" if knob == "rate_req_s" else "tpot_cap", choices=tuple(FRONTIER_LABELS),
                 label="frontier latency")


def _number_kwargs(knob: str, p: Param) -> dict:
    if p.kind is int:
        return {**p.widget_range(), "step": 1, "format": "%d"}
    step = {"max_wait_s": 0.01, "high_share": 0.05, "rate_req_s": 0.5}.get(knob, 0.1)
    return {**p.widget_range(), "step": step, "format": "%.4g"}


def _view_param() -> Param:
    return Param("view", "sweep", choices=tuple(VIEWS), label="view")


@st.fragment
def tune(base: Scenario) -> None:
    vp = _view_param()
    state.load_with_notices([vp])
    st.radio("View", list(VIEWS), format_func=VIEWS.get, horizontal=True,
             help="Sweep a knob: one knob over a range, its knee and the guided checks. Speculation crossover: the "
                  "request rate swept with speculative decoding on and off, and the rate where it stops helping.",
             **state.bind("view"))
    if state.value("view") == "spec":
        crossover(base, vp)
        return
    st.subheader("What to sweep", divider="gray")
    cols = st.columns([1.1, 1.6, 1, 1, 0.7, 1.1], gap="medium")
    with cols[0]:
        pp, preset = knobs.preset_select(PREFIX, DEFAULT_PRESET, "Policy preset")
    fixed = st.expander("Knobs held fixed while sweeping (from the preset; the swept knob overrides its own)")
    with fixed:
        kps, choice = knobs.policy_knobs(PREFIX, preset, model=base.deployment.model)
        st.markdown("**Traffic mix and memory**")
        sps, sc = knobs.scenario_knobs(base)
    policy = choice.policy or PRESETS[preset]
    run = sc.with_policy(policy)

    kp = Param("knob", sp.default_knob(policy), choices=tuple(sp.knobs_for(policy, run)), label="knob")
    state.load_with_notices([kp])
    with cols[1]:
        st.selectbox("Knob to sweep", list(kp.choices), format_func=lambda k: KNOBS[k],
                     help="The knobs this preset's mode uses, plus the traffic and memory: max batch size and max "
                          "wait for request-level batching, max_num_seqs and the token budget for continuous "
                          "batching; priority mix, request rate and KV cache size for every policy.",
                     **state.bind("knob"))
    knob = state.value("knob")
    rps = widgets.guarded(lambda: _range_params(knob, run), "The default range")
    if rps is None:
        return
    extra = [_share_param(), Param("others", True, label="other presets"), _frontier_param(knob)]
    seen = st.session_state.get(SEEN)
    if seen is not None and seen != (preset, knob):
        for p in [*rps, extra[2]]:  # a new knob or preset: its own sensible range
            state.set_value(p.key, p.default)
    st.session_state[SEEN] = (preset, knob)
    state.load_with_notices([*rps, *extra])
    for p in rps[:3]:  # the stored value takes the kind of this knob's range (int or float)
        state.set_value(p.key, p.kind(state.value(p.key)))
    unit = UNITS[knob]
    with cols[2]:
        st.number_input(f"From ({unit})", help=f"First value of the sweep: {cp.knob_axis(knob)}.",
                        **_number_kwargs(knob, rps[0]), **state.bind("from"))
    with cols[3]:
        st.number_input(f"To ({unit})", help=f"Last value of the sweep: {cp.knob_axis(knob)}.",
                        **_number_kwargs(knob, rps[1]), **state.bind("to"))
    with cols[4]:
        st.number_input("Points", **rps[2].widget_range(), step=1,
                        help=f"Values between From and To (2 to {sp.MAX_POINTS}); each is two simulations, one "
                             "at the offered load and one for capacity, and a capacity search within the SLOs "
                             "(about seven more). Evenly spaced, but on the knob's default range each point past "
                             f"{rps[2].default} halves the widest gap (the leftmost first): one more point keeps the "
                             "points already simulated and runs only the new one.", **state.bind("points"))
    with cols[5]:
        st.radio("Spacing", list(sp.SPACINGS), horizontal=True, help="Log spacing (powers of two for counts) suits "
                 "caps and memory; linear suits shares and rates.", **state.bind("spacing"))
    c1, c2, c3 = st.columns([1.1, 2.2, 3.2], gap="medium")
    with c1:
        st.number_input("Knee threshold (%)", step=0.5, format="%.1f", **extra[0].widget_range(),
                        help="The knee is the smallest value past which the capacity within the SLOs (for the "
                             "request rate: the goodput within them) grows by less than this share.",
                        **state.bind("share"))
    others_ok = [n for n, p in PRESETS.items() if sp.knob_applies(knob, p, run)
                 and not (n == preset and not choice.customised)]
    with c2:
        st.toggle(f"Add the other presets to the frontier ({len(others_ok)})" if others_ok else
                  "Add the other presets to the frontier (none use this knob)", disabled=not others_ok,
                  help="Sweep the same range with the other presets that use this knob, unmodified, and draw "
                       "them on the throughput-latency frontier.", **state.bind("others"))
    with c3:
        st.selectbox("Frontier latency axis", list(FRONTIER_LABELS), format_func=FRONTIER_LABELS.get,
                     help="Which P99 latency the frontier plots against throughput (capacity for every knob but the "
                          "request rate, where it is the throughput at the offered load).", **state.bind("frontier"))
    names = widgets.guarded(lambda: class_names(run), "The workload's classes")
    if names is None:
        return
    slo_ps = planning.load_slo_params(names)
    with st.expander("Service-level objectives: the knee is where the capacity within them stops growing (shared "
                     "with Capacity planning)"):
        st.caption("One value for every class, or one per class separated by commas, class 0 first: " +
                   "; ".join(f"{i} = {plain(n)}" for i, n in enumerate(names)) + ".")
        planning.slo_inputs(names)
    state.publish([vp, pp, *kps, *sps, kp, *rps, *extra, *slo_ps])

    if choice.error:
        st.error(f"**These knobs cannot run:** {plain(choice.error)}", icon=":material/error:")
        _show_last()
        return
    slo, problem = planning.slo_from_state(names)
    if slo is None:
        st.error(f"**These SLOs cannot be read:** {plain(problem)}. Set the TTFT, TPOT or E2E SLO above 0: one "
                 "value, or one per class.", icon=":material/error:")
        _show_last()
        return
    slo_default = all(state.value(p.key) == p.default for p in slo_ps)
    # on the knob's own range, points past its default count refine the grid (one more point runs one new value);
    # on a range of the user's, every count is evenly spaced, as asked
    own_range = all(state.value(p.key) == p.default for p in (rps[0], rps[1], rps[3]))
    values = widgets.guarded(lambda: sp.knob_values(knob, state.value("from"), state.value("to"),
                                                    int(state.value("points")), state.value("spacing"),
                                                    even=rps[2].default if own_range else None),
                             "The range")
    if values is None:
        _show_last()
        return
    label = choice.label
    others = others_ok if state.value("others") else []
    jobs = [(label, run, knob, values, slo)]
    jobs += [(name, sc.with_policy(PRESETS[name]), knob, values, slo) for name in others]
    live = st.empty()  # the points as they finish, replaced by the results once every one has
    preview = _preview(live, knob, [j[0] for j in jobs], state.value("spacing") == "log", state.value("frontier"))
    try:
        done = widgets.guarded(lambda: planning.sweeps_cached(jobs, f"Sweeping {len(values)} values, each with a "
                                                                    "capacity search within the SLOs", preview),
                               "The sweep")
    finally:
        live.empty()
    if done is None:
        _show_last()
        return
    share = float(state.value("share")) / 100
    dfs = {label: done[0]}
    skipped = {}
    for name, out in zip(others, done[1:]):
        if isinstance(out, str):
            skipped[name] = out
        else:
            dfs[name] = out
    study = sp.read_sweeps(run, knob, values, dfs, share, label,
                           policies={n: PRESETS[n] for n in dfs if n != label}, skipped=skipped, slo=slo,
                           slo_is_default=slo_default)
    view = planning.TuneView(study, log_x=state.value("spacing") == "log", frontier=state.value("frontier"))
    st.session_state[LAST] = view
    _results(view)


def _preview(live, knob: str, labels: list[str], log_x: bool, frontier: str):
    """``planning.sweeps_cached``'s preview: the throughput chart of the first sweep and the frontier of every
    sweep, drawn in ``live`` from the points done so far (no knee yet: it needs every point)."""
    def draw(frames: dict, done: int, total: int) -> None:
        with live.container():
            st.caption(f"{done} of {total} points done: the charts fill in as each point's runs end; the knee, the "
                       "guided checks and the table follow when every point has.")
            c1, c2 = st.columns(2)
            if 0 in frames:
                with c1:
                    widgets.chart(cp.sweep_throughput(frames[0], knob, None, log_x, labels[0]),
                                  "Light: output tokens/s at the sidebar's load; dark: capacity with the queue "
                                  "full; dashed grey: the load offered.", "tune_preview_throughput")
            with c2:
                widgets.chart(cp.sweep_frontier({labels[j]: f for j, f in sorted(frames.items())}, knob, frontier),
                              "Each line is a policy through its knob values done so far.", "tune_preview_frontier")
    return draw


def _show_last() -> None:
    view = st.session_state.get(LAST)
    if view is not None:
        st.caption("Showing the last sweep that ran.")
        _results(view)


def _results(view: planning.TuneView) -> None:
    study, log_x = view.study, view.log_x
    knob, label, df, knee, run = study.knob, study.label, study.frame, study.knee, study.scenario
    st.subheader(f"Results: {label}, {KNOBS[knob].split(' (')[0].lower()} from "
                 f"{sp.fmt_value(knob, study.values[0])} to {sp.fmt_value(knob, study.values[-1])}",
                 divider="gray")
    st.info(study.knee_sentence(), icon=":material/ssid_chart:")
    if study.slo is not None:
        st.caption(plain(study.slo_text()) + (" Set them under Service-level objectives above, or on Capacity "
                                              "planning." if study.slo_is_default else ""))
    planning.guided_checks(study)

    name = charts.slug("tune", label.replace("*", "-custom"), knob, report.scenario_slug(run))
    # what the figures are drawn from: the sweeps are fixed by the scenario, knob, values, SLOs and policies
    drawn = (cache.scenario_token(run), knob, label, study.values, study.slo, tuple(study.frames),
             st.session_state.get(page.CAPTION_LINE))
    figures = []
    c1, c2 = st.columns(2)
    with c1:
        thr = _figure("throughput", drawn + (knee, log_x), lambda: cp.sweep_throughput(df, knob, knee, log_x, label))
        widgets.chart(thr, "Light: output tokens/s served at the sidebar's load; dark: capacity with the queue "
                      "full; dashed grey: the load offered. Past the dashed knee line more of the knob buys little.",
                      f"{name}_throughput")
        figures.append((thr, "Throughput and capacity against the knob."))
    with c2:
        frontier = _figure("frontier", drawn + (view.frontier, tuple(study.knees.items())),
                           lambda: cp.sweep_frontier(study.frames, knob, view.frontier, study.knees))
        widgets.chart(frontier, "Each line is a policy through its knob values (labels); a point up and to the "
                      "left serves more at lower latency; stars mark each policy's knee, the dashed line the best "
                      "trade-offs over every point.", f"{name}_frontier")
        figures.append((frontier, "Throughput against P99 latency across the values and policies."))
    for name_, why in study.skipped.items():
        st.caption(f"'{name_}' is not on the frontier: {plain(why)}")
    lat = _figure("latency", drawn + (knee, log_x), lambda: cp.sweep_latency(df, knob, knee, log_x))
    widgets.chart(lat, "Left: time to first token, P50 and P99, queueing included. Right: time per output token; "
                  "dotted is P99 TPOT with the batch full, what a larger batch costs every token.", f"{name}_latency")
    use = _figure("utilisation", drawn + (knee, log_x), lambda: cp.sweep_utilisation(df, knob, knee, log_x))
    widgets.chart(use, "Left: GPU util (step time × useful share of its token slots / wall time), batch efficiency "
                  "(running / cap) and peak KV cache use, in %. Right: preemptions; rising preemptions mean the KV "
                  "cache is too small for the batch.", f"{name}_utilisation")
    figures += [(lat, "Latency against the knob."), (use, "GPU use, batch fill, KV use and preemptions.")]

    st.subheader("Every point", divider="gray")
    table = _table(df, knob)
    config = {knob: st.column_config.NumberColumn(cp.knob_axis(knob), help=KNOBS[knob], format="%.4g")}
    config.update({TABLE[k][0]: st.column_config.NumberColumn(TABLE[k][0], help=TABLE[k][3], format=TABLE[k][2])
                   for k in TABLE if TABLE[k][0] in table})
    st.dataframe(table, column_config=config, width="stretch", hide_index=True)
    st.caption(f"One row per value for '{label}', at the sidebar's load (capacity columns: every request at "
               "t = 0). Hover a header for its definition.")

    link = state.current_link()
    points = study.points()

    def _json() -> bytes:
        doc = {"knob": knob, "values": list(study.values), "knee_share": study.share,
               "knees": study.knees, "slo": study.slo.to_dict() if study.slo is not None else None,
               "slo_default": study.slo_is_default, "scenario": dict(report.scenario_rows(run)),
               "policies": {n: p.describe() for n, p in study.policies.items()},
               "cards": [c.to_dict() for c in study.cards],
               "points": points.to_dict(orient="records")}
        return json.dumps(report.jsonable(doc), indent=2, allow_nan=False).encode()

    def _html() -> str:
        notes = [study.slo_text(), study.knee_sentence()] if study.slo is not None else [study.knee_sentence()]
        notes += [f"{c.number} · {c.title}: {c.text}" for c in study.fired]
        return report.html_report(f"Tune a knob: {KNOBS[knob]} ({label})", run, figures=figures,
                                  tables=[(f"Every point ({label})", table.round(4))], policies=study.policies,
                                  link=link, notes=notes)

    planning.download_row(name, [
        ("Sweep (CSV)", lambda: points.to_csv(index=False).encode(), "sweep.csv", "text/csv",
         "One row per policy and value: every metric of the sweep (seconds, tok/s, shares 0-1)."),
        ("Sweep (JSON)", _json, "sweep.json", "application/json",
         "The values, knees, guided checks and every point, with the scenario."),
        ("Report (HTML)", _html, "report.html", "text/html",
         "A standalone page with the scenario, the charts and the table; opens offline."),
    ], link, figures=lambda: {f"{name}_{k}": f for k, (f, _) in zip(("throughput", "frontier", "latency", "utilisation"), figures)})


# ---------------------------------------------------------------- the speculation crossover view


def _points_param() -> Param:
    return Param("x_points", sx.POINTS, 2, sx.MAX_POINTS, label="crossover rates")


def crossover(base: Scenario, vp: Param) -> None:
    """The request rate swept with speculative decoding on and off (the policy's own speculation, or EAGLE K = 3 at
    the published acceptance of the model's family when it has none): capacity within the SLOs with and without it
    first, then TPOT P50 and throughput against the rate, and where speculation stops helping."""
    st.subheader("Speculation crossover", divider="gray")
    cols = st.columns([1.1, 1, 3.9], gap="medium")
    with cols[0]:
        pp, preset = knobs.preset_select(PREFIX, DEFAULT_PRESET, "Policy preset")
    pts = _points_param()
    state.load_with_notices([pts])
    with cols[1]:
        st.number_input("Rates", **pts.widget_range(), step=1,
                        help=f"Request rates from {sx.LOW * 100:.0f} % to {sx.HIGH * 100:.0f} % of the capacity "
                             f"without speculation (2 to {sx.MAX_POINTS}); each is two runs, with and without "
                             "speculation.", **state.bind("x_points"))
    with st.expander("Policy knobs: speculative decoding (method, K, A) is read from here; off compares EAGLE, "
                     "K = 3 at the published acceptance of the model's family (batching/data/spec_acceptance.csv)"):
        kps, choice = knobs.policy_knobs(PREFIX, preset, model=base.deployment.model)
        st.markdown("**Traffic mix and memory**")
        sps, sc = knobs.scenario_knobs(base)
    names = widgets.guarded(lambda: class_names(sc), "The workload's classes")
    if names is None:
        return
    slo_ps = planning.load_slo_params(names)
    with st.expander("Service-level objectives: the verdict is the capacity within them with and without "
                     "speculation (shared with Capacity planning)"):
        st.caption("One value for every class, or one per class separated by commas, class 0 first: " +
                   "; ".join(f"{i} = {plain(n)}" for i, n in enumerate(names)) + ".")
        planning.slo_inputs(names)
    state.publish([vp, pp, *kps, *sps, pts, *slo_ps])
    if choice.error:
        st.error(f"**These knobs cannot run:** {plain(choice.error)}", icon=":material/error:")
        return
    policy = choice.policy or PRESETS[preset]
    label = choice.label
    if policy.mode != "continuous":
        st.caption(f"'{plain(preset)}' batches whole requests, which cannot speculate: the crossover runs the "
                   f"'{DEFAULT_PRESET}' preset.")
        policy, label = PRESETS[DEFAULT_PRESET], DEFAULT_PRESET
    slo, problem = planning.slo_from_state(names)
    if slo is None:
        st.warning(f"**No capacity within the SLOs:** {plain(problem)}; the crossover compares TPOT only. Set the "
                   "TTFT, TPOT or E2E SLO above 0.", icon=":material/warning:")
    study = widgets.guarded(lambda: _crossover_study(sc.with_policy(policy), int(state.value("x_points")), slo),
                            "The speculation crossover")
    if study is None:
        return
    st.session_state[SPEC_LAST] = study
    _crossover_results(study, label)


def _crossover_study(run: Scenario, points: int, slo=None) -> sx.SpecCrossover:
    """``studies.spec_crossover.spec_crossover`` on cached runs (each rate's run, and the capacity runs, cached on
    their own: another number of rates reruns only the new ones), with the capacity within ``slo`` searched with
    and without speculation through Capacity planning's cached search, under a progress bar."""
    cache.ensure_kernel()
    holder = st.empty()

    def progress(done: int, total: int, label: str) -> None:
        holder.progress(done / total, text=f"Speculation crossover: {done} of {total} runs (last: {label})")

    def summarize(sc: Scenario, saturated: bool) -> dict:
        return cache.capacity_summary(sc) if saturated else cache.summary_cached(sc, False)

    try:
        with st.spinner("Sweeping the request rate with speculation on and off…", show_time=True):
            return sx.spec_crossover(run, points=points, summarize=summarize, progress=progress, slo=slo,
                                     slo_capacity=lambda sc: planning.capacity_cached(sc, slo).max_rate_req_s,
                                     workload=state.value("workload", None))  # the sidebar's preset: its dataset
    finally:
        holder.empty()


# the crossover table: study column -> (header with unit, factor, format, tooltip)
CROSSOVER_TABLE = {
    "rate_req_s": ("Offered rate (req/s)", 1, "%.3g", "Requests per second offered to the node."),
    "load": ("Load (% of capacity without)", 100, "%.0f", "The rate over the capacity without speculation."),
    "tpot_p50_s_on": ("TPOT P50 with (ms)", 1e3, "%.1f", "Median time per output token, with speculation."),
    "tpot_p50_s_off": ("TPOT P50 without (ms)", 1e3, "%.1f", "Median time per output token, without speculation."),
    "tpot_gain": ("TPOT gain (×)", 1, "%.2f", "TPOT P50 without / with speculation: above 1, speculation helps."),
    "throughput_output_tok_s_on": ("Throughput with (tok/s)", 1, "%.0f", "Output tokens/s with speculation."),
    "throughput_output_tok_s_off": ("Throughput without (tok/s)", 1, "%.0f", "Output tokens/s without speculation."),
}


def _crossover_results(study: sx.SpecCrossover, label: str) -> None:
    run = study.scenario_on
    st.subheader(f"Results: {label}, speculation ({study.method()}) on and off", divider="gray")
    st.info(study.sentence(), icon=":material/ssid_chart:")
    st.caption(f"Speculation: {plain(study.acceptance_text())}.")
    if study.slo_capacity_off_req_s is not None:
        c = st.columns(3)
        c[0].metric("Capacity within the SLOs, with (req/s)", f"{study.slo_capacity_on_req_s:,.3g}",
                    help="The highest rate with every class within its SLOs, speculating (Capacity planning's "
                         "search).")
        c[1].metric("Without (req/s)", f"{study.slo_capacity_off_req_s:,.3g}")
        gain = study.slo_gain
        c[2].metric("With / without", f"{gain:.2f}×" if gain == gain else "n/a",
                    help="Above 1, speculation serves more traffic within the SLOs; the TPOT curves below are the "
                         "second view.")
    name = charts.slug("tune", label.replace("*", "-custom"), "spec_crossover", report.scenario_slug(run))
    drawn = (cache.scenario_token(study.scenario_on), cache.scenario_token(study.scenario_off), study.rates,
             st.session_state.get(page.CAPTION_LINE))
    fig = _figure("spec_crossover", drawn, lambda: spec_charts.crossover_chart(study))
    widgets.chart(fig, "Left: median time per output token (log axis); right: output tokens/s served; pink with "
                  "speculation, blue without, against the offered rate. Left of the dashed crossover line "
                  "speculation cuts TPOT, right of it the larger batches make verification compute-bound and it "
                  "costs more than it saves.", f"{name}_spec_crossover")
    st.caption(f"Each point is one run of {study.num_requests:,} requests (the sidebar's count, at most "
               f"{sx.MAX_REQUESTS:,} in this view to keep it quick), at rates from {sx.LOW * 100:.0f} % to "
               f"{sx.HIGH * 100:.0f} % of the capacity without speculation ({study.capacity_off_req_s:,.3g} req/s: "
               "every request queued at once).")
    table = pd.DataFrame({head: study.frame[col] * factor for col, (head, factor, _, _) in CROSSOVER_TABLE.items()})
    config = {head: st.column_config.NumberColumn(head, help=tip, format=fmt)
              for head, _, fmt, tip in CROSSOVER_TABLE.values()}
    st.dataframe(table, column_config=config, width="stretch", hide_index=True)
    downloads.export_buttons(report.view_export(  # issue 24 item 11: CSV, JSON, HTML, PNG and SVG
        "tune_spec", "Speculation crossover", run, {"spec_crossover": (fig, "")}, {"spec_crossover": study.frame}), name)


def _figure(kind: str, drawn: tuple, build):
    """The chart of this kind drawn from ``drawn``: the session's last one when it was drawn from the same, else
    ``build()`` (one figure kept per kind)."""
    memo = st.session_state.setdefault(FIGURES, {})
    hit = memo.get(kind)
    if hit is None or hit[0] != drawn:
        hit = memo[kind] = (drawn, build())
    return hit[1]


def _table(df: pd.DataFrame, knob: str) -> pd.DataFrame:
    out = pd.DataFrame({knob: df[knob]})
    for key, (header, factor, _, _) in TABLE.items():
        if key in df:
            out[header] = df[key] * factor
    return out


if scenario is None:
    st.stop()
tune(scenario)
