"""Tune a knob: sweep one knob of a policy (or the traffic mix, the rate, the KV cache), see where it stops
paying, and read the three classic batching pitfalls off the sweep's own numbers."""
import json

import pandas as pd
import streamlit as st

from batching.charts import policy as charts

from batching import report
from batching.charts import planning as cp
from batching.studies.sweeps import KNOBS
from batching.studies.knee import sweep_knee
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.ui import cache, knobs, page, planning, state, widgets
from batching.ui.params import Param

PREFIX = "t_"  # the fixed knobs' URL keys (t_seqs, t_budget, ...), apart from Explore's
DEFAULT_PRESET = "continuous"
LAST = "tune_last"
SEEN = "tune_seen"  # (preset, knob) of the previous run: when either changes the range resets to its defaults
SPACINGS = ("log", "linear")
UNITS = {"max_batch_size": "requests", "max_num_seqs": "seqs", "max_wait_s": "s", "max_num_batched_tokens": "tokens",
         "high_share": "0-1", "rate_req_s": "req/s", "kv_cache_tokens": "tokens"}
FRONTIER_LABELS = {"tpot_cap": "P99 TPOT at capacity", "tpot": "P99 TPOT at the offered load",
                   "ttft": "P99 TTFT at the offered load"}
# table columns: sweep column -> (header with unit, factor, format, tooltip)
TABLE = {
    "throughput_output_tok_s": ("Throughput (tok/s)", 1, "%.0f", "Output tokens/s at the offered load."),
    "capacity_output_tok_s": ("Capacity (tok/s)", 1, "%.0f", "Output tokens/s with every request queued at t = 0."),
    "offered_output_tok_s": ("Offered (tok/s)", 1, "%.0f", "Output tokens/s the traffic brings: mean rate × mean "
                             "output length."),
    "ttft_p50_s": ("TTFT P50 (s)", 1, "%.3f", "Median time to first token, queueing included."),
    "ttft_p99_s": ("TTFT P99 (s)", 1, "%.3f", "99th percentile time to first token."),
    "tpot_p50_s": ("TPOT P50 (ms)", 1e3, "%.1f", "Median time per output token after the first."),
    "tpot_p99_s": ("TPOT P99 (ms)", 1e3, "%.1f", "99th percentile time per output token."),
    "capacity_tpot_p99_s": ("TPOT P99 at capacity (ms)", 1e3, "%.1f", "P99 TPOT in the capacity run (batch full)."),
    "gpu_util": ("GPU util (%)", 100, "%.1f", "Roofline time of the useful work / wall time."),
    "batch_efficiency": ("Batch eff. (%)", 100, "%.1f", "Mean running sequences per step / the batch cap."),
    "kv_pressure": ("Peak KV use (%)", 100, "%.1f", "Most KV blocks in use at once × 16 / KV capacity (tokens)."),
    "preemptions": ("Preemptions", 1, "%d", "Times a running request was evicted."),
}

scenario = page.setup(
    "Tune a knob", ":material/show_chart:",
    "Sweep one knob over a range on the sidebar's scenario: throughput, capacity, latency and memory against it, "
    "the knee where it stops paying, and three guided checks for the classic batching pitfalls.")


def _range_params(knob: str, sc: Scenario) -> list[Param]:
    cap_rate = None
    if knob == "rate_req_s":
        try:
            cap_rate = cache.capacity_summary(sc)["throughput_req_s"]
        except (ValueError, RuntimeError):
            cap_rate = None  # the default range falls back to the sidebar's rate; the sweep reports the error
    start, stop, points, spacing = planning.default_range(knob, sc, cap_rate)
    low, high = planning.bounds(knob, sc)
    kind = int if knob in planning.INT_KNOBS else float
    return [Param("from", kind(start), kind(low), kind(high), label="sweep start"),
            Param("to", kind(stop), kind(low), kind(high), label="sweep stop"),
            Param("points", int(points), 2, planning.MAX_POINTS, label="points"),
            Param("spacing", spacing, choices=SPACINGS, label="spacing")]


def _frontier_param(knob: str) -> Param:
    return Param("frontier", "ttft" if knob == "rate_req_s" else "tpot_cap", choices=tuple(FRONTIER_LABELS),
                 label="frontier latency")


def _number_kwargs(knob: str, p: Param) -> dict:
    if p.kind is int:
        return {"min_value": int(p.low), "max_value": int(p.high), "step": 1, "format": "%d"}
    step = {"max_wait_s": 0.01, "high_share": 0.05, "rate_req_s": 0.5}.get(knob, 0.1)
    return {"min_value": float(p.low), "max_value": float(p.high), "step": step, "format": "%.4g"}


def _sweep_other(sc: Scenario, knob: str, values: list[float]) -> pd.DataFrame | str:
    try:
        return planning.sweep_cached(sc, knob, values)
    except ValueError as exc:  # this preset cannot run this range: say why, keep the others
        return str(exc)


@st.fragment
def tune(base: Scenario) -> None:
    st.subheader("What to sweep", divider="gray")
    cols = st.columns([1.1, 1.6, 1, 1, 0.7, 1.1], gap="medium")
    with cols[0]:
        pp, preset = knobs.preset_select(PREFIX, DEFAULT_PRESET, "Policy preset")
    fixed = st.expander("Knobs held fixed while sweeping (from the preset; the swept knob overrides its own)")
    with fixed:
        kps, choice = knobs.policy_knobs(PREFIX, preset)
        st.markdown("**Traffic mix and memory**")
        sps, sc = knobs.scenario_knobs(base)
    policy = choice.policy or PRESETS[preset]
    run = sc.with_policy(policy)

    kp = Param("knob", planning.default_knob(policy), choices=tuple(planning.knobs_for(policy, run)), label="knob")
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
    extra = [Param("share", 5.0, 0.5, 50.0, label="knee share (%)"), Param("others", True, label="other presets"),
             _frontier_param(knob)]
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
        st.number_input("Points", min_value=2, max_value=planning.MAX_POINTS, step=1,
                        help=f"Values between From and To (2 to {planning.MAX_POINTS}); each is two simulations, one "
                             "at the offered load and one for capacity.", **state.bind("points"))
    with cols[5]:
        st.radio("Spacing", list(SPACINGS), horizontal=True, help="Log spacing (powers of two for counts) suits "
                 "caps and memory; linear suits shares and rates.", **state.bind("spacing"))
    c1, c2, c3 = st.columns([1.1, 2.2, 3.2], gap="medium")
    with c1:
        st.number_input("Knee threshold (%)", step=0.5, format="%.1f", min_value=0.5, max_value=50.0,
                        help="The knee is the smallest value past which capacity (throughput, for the request rate) "
                             "grows by less than this share while P99 TTFT or TPOT still rises.",
                        **state.bind("share"))
    others_ok = [n for n, p in PRESETS.items() if planning.knob_applies(knob, p, run)
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
    state.publish([pp, *kps, *sps, kp, *rps, *extra])

    if choice.error:
        st.error(f"**These knobs cannot run:** {choice.error}", icon=":material/error:")
        _show_last()
        return
    values = widgets.guarded(lambda: planning.knob_values(knob, state.value("from"), state.value("to"),
                                                          int(state.value("points")), state.value("spacing")),
                             "The range")
    if values is None:
        _show_last()
        return
    label = choice.label
    tasks = [(f"{label}", lambda: planning.sweep_cached(run, knob, values))]
    others = others_ok if state.value("others") else []
    for name in others:
        tasks.append((name, lambda name=name: _sweep_other(sc.with_policy(PRESETS[name]), knob, values)))
    done = widgets.guarded(lambda: cache.run_with_progress(tasks, f"Sweeping {len(values)} values"), "The sweep")
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
    knees = {name: sweep_knee(df, knob, share) for name, df in dfs.items()}
    res = {"label": label, "knob": knob, "values": values, "dfs": dfs, "knees": knees, "skipped": skipped,
           "scenario": run, "share": share, "log_x": state.value("spacing") == "log",
           "frontier": state.value("frontier"),
           "cards": planning.cards(dfs[label], knob, run, knees[label], share),
           "policies": {label: policy, **{n: PRESETS[n] for n in dfs if n != label}}}
    st.session_state[LAST] = res
    _results(res)


def _show_last() -> None:
    res = st.session_state.get(LAST)
    if res is not None:
        st.caption("Showing the last sweep that ran.")
        _results(res)


def _card_markdown(card: planning.Card) -> str:
    lines = [f"**{card.number} · {card.title}.** {card.text}", "", "Triggered by:"]
    lines += [f"- {t}" for t in card.triggers]
    return "\n".join(lines)


def _results(res: dict) -> None:
    knob, label, df = res["knob"], res["label"], res["dfs"][res["label"]]
    knee, share, log_x, run = res["knees"][label], res["share"], res["log_x"], res["scenario"]
    st.subheader(f"Results: {label}, {KNOBS[knob].split(' (')[0].lower()} from "
                 f"{planning.fmt_value(knob, res['values'][0])} to {planning.fmt_value(knob, res['values'][-1])}",
                 divider="gray")
    st.info(planning.knee_sentence(df, knob, knee, share), icon=":material/ssid_chart:")

    st.markdown("#### Guided checks")
    fired = [c for c in res["cards"] if c.fired]
    for card in fired:
        st.warning(_card_markdown(card), icon=":material/lightbulb:")
    if not fired:
        st.success("None of the three pitfalls shows in this sweep: no batch cap past its knee filling the KV "
                   "cache, no full batch with a queue and idle GPUs, no request-level batch running under half "
                   "full while the node keeps up.", icon=":material/check_circle:")
    with st.expander("How the three checks read this sweep"):
        st.markdown(
            f"1. **Batch cap too large** (a sweep of {', '.join(planning.CAP_KNOBS)} with a knee): past the knee "
            f"capacity grows by less than the knee share while peak KV use rises by ≥ {planning.KV_RISE * 100:.0f} "
            "points of the cache or preemptions rise. Suggests the knee.\n"
            f"2. **Batch cap too small**: batch efficiency ≥ {planning.FULL_BATCH * 100:.0f} % at the offered load "
            f"while requests queue (offered load ≥ {planning.AT_CAPACITY * 100:.0f} % of capacity, TTFT P99 ≥ "
            f"{planning.TAIL_RATIO:.0f} × P50, or TTFT P99 ≥ {planning.SWEEP_TAIL_RATIO:.0f} × the sweep's lowest) "
            f"and the GPU has room (gpu_util < {planning.ROOM_GPU_UTIL * 100:.0f} %, and in a sweep of the cap a "
            f"larger value adds ≥ {planning.ROOM_CAPACITY_GAIN * 100:.0f} % capacity). Suggests the smallest larger "
            "value that stops the queue.\n"
            f"3. **Batch efficiency below {planning.LOW_EFFICIENCY * 100:.0f} %** (static and dynamic batching): "
            f"batches run under half full while the node keeps up (offered load < "
            f"{planning.AT_CAPACITY * 100:.0f} % of capacity). Suggests a smaller cap or a longer wait.")
        for card in res["cards"]:
            status = "fired" if card.fired else "did not fire"
            st.markdown(f"**{card.number} · {card.title}: {status}.** " + ("" if card.fired else card.text))
            if card.triggers:
                st.markdown("\n".join(f"- {t}" for t in card.triggers))

    name = charts.slug("tune", label.replace("*", "-custom"), knob, report.scenario_slug(run))
    figures = []
    c1, c2 = st.columns(2)
    with c1:
        thr = cp.sweep_throughput(df, knob, knee, log_x, label)
        widgets.chart(thr, "Light: output tokens/s served at the sidebar's load; dark: capacity with the queue "
                      "full; dashed grey: the load offered. Past the dashed knee line more of the knob buys little.",
                      f"{name}_throughput")
        figures.append((thr, "Throughput and capacity against the knob."))
    with c2:
        frontier = cp.sweep_frontier(res["dfs"], knob, res["frontier"], res["knees"])
        widgets.chart(frontier, "Each line is a policy through its knob values (labels); a point up and to the "
                      "left serves more at lower latency; stars mark each policy's knee, the dashed line the best "
                      "trade-offs over every point.", f"{name}_frontier")
        figures.append((frontier, "Throughput against P99 latency across the values and policies."))
    for name_, why in res["skipped"].items():
        st.caption(f"'{name_}' is not on the frontier: {why}")
    lat = cp.sweep_latency(df, knob, knee, log_x)
    widgets.chart(lat, "Left: time to first token, P50 and P99, queueing included. Right: time per output token; "
                  "dotted is P99 TPOT with the batch full, what a larger batch costs every token.", f"{name}_latency")
    use = cp.sweep_utilisation(df, knob, knee, log_x)
    widgets.chart(use, "Left: GPU util (roofline time of useful work), batch efficiency (running / cap) and peak KV "
                  "cache use, in %. Right: preemptions; rising preemptions mean the KV cache is too small for the "
                  "batch.", f"{name}_utilisation")
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
    points = pd.concat([d.assign(policy=n) for n, d in res["dfs"].items()], ignore_index=True)
    points = points[["policy", *[c for c in points.columns if c != "policy"]]]

    def _json() -> bytes:
        doc = {"knob": knob, "values": res["values"], "knee_share": share,
               "knees": res["knees"], "scenario": dict(report.scenario_rows(run)),
               "policies": {n: p.describe() for n, p in res["policies"].items()},
               "cards": [{"number": c.number, "title": c.title, "fired": c.fired, "text": c.text,
                          "triggers": list(c.triggers), "suggestion": c.suggestion, "knob": c.knob}
                         for c in res["cards"]],
               "points": points.to_dict(orient="records")}
        return json.dumps(report.jsonable(doc), indent=2, allow_nan=False).encode()

    def _html() -> str:
        notes = [planning.knee_sentence(df, knob, knee, share)]
        notes += [f"{c.number} · {c.title}: {c.text}" for c in res["cards"] if c.fired]
        return report.html_report(f"Tune a knob: {KNOBS[knob]} ({label})", run, figures=figures,
                                  tables=[(f"Every point ({label})", table.round(4))], policies=res["policies"],
                                  link=link, notes=notes)

    planning.download_row(name, [
        ("Sweep (CSV)", lambda: points.to_csv(index=False).encode(), "sweep.csv", "text/csv",
         "One row per policy and value: every metric of the sweep (seconds, tok/s, shares 0-1)."),
        ("Sweep (JSON)", _json, "sweep.json", "application/json",
         "The values, knees, guided checks and every point, with the scenario."),
        ("Report (HTML)", _html, "report.html", "text/html",
         "A standalone page with the scenario, the charts and the table; opens offline."),
    ], link)


def _table(df: pd.DataFrame, knob: str) -> pd.DataFrame:
    out = pd.DataFrame({knob: df[knob]})
    for key, (header, factor, _, _) in TABLE.items():
        if key in df:
            out[header] = df[key] * factor
    return out


if scenario is None:
    st.stop()
tune(scenario)
