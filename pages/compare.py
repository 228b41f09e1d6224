"""Compare policies: two to four presets (customised or not) on the sidebar's scenario, side by side."""
import streamlit as st

from batching.charts import policy as charts

from batching import report
from batching.sim.simulate import Scenario
from batching.ui import cache, knobs, page, state, tables, widgets

# (URL prefix, slot letter, default preset); the first slot is the baseline of every change
SLOTS = (("a_", "A", "dynamic"), ("b_", "B", "continuous"), ("c_", "C", "chunked"), ("d_", "D", knobs.NONE))
KEYS = ("throughput_output_tok_s", "capacity_output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
        "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "queue_delay_p99_s", "gpu_util", "batch_efficiency", "preemptions")
LAST = "compare_last"

scenario = page.setup(
    "Compare policies", ":material/compare_arrows:",
    "Two to four policies on the sidebar's scenario: latency distributions overlaid, and every metric against "
    "policy A. Start each slot from a preset and customise its knobs.")


def _slots() -> tuple[list, dict, list[str]]:
    params, chosen, errors = [], {}, []
    cols = st.columns(len(SLOTS))
    for col, (prefix, letter, default) in zip(cols, SLOTS):
        with col:
            p, preset = knobs.preset_select(prefix, default, f"Policy {letter}", optional=letter not in "AB")
            params.append(p)
            if preset == knobs.NONE:
                st.caption("Pick a preset to add a fourth policy." if letter == "D" else "Pick a preset to add it.")
                continue
            with st.expander("Customise knobs"):
                kps, choice = knobs.policy_knobs(prefix, preset, columns=1)
            params += kps
            if choice.error:
                errors.append(f"Policy {letter}: {choice.error}")
                continue
            st.caption(choice.policy.describe())
            chosen[f"{letter} · {choice.label}"] = choice.policy
    return params, chosen, errors


@st.fragment
def compare(base: Scenario) -> None:
    st.subheader("Policies", divider="gray")
    params, chosen, errors = _slots()
    state.publish(params)
    for err in errors:
        st.error(f"**These knobs cannot run:** {err}", icon=":material/error:")
    summaries = results = None
    if len(chosen) >= 2 and not errors:
        summaries = widgets.guarded(lambda: cache.compare_summaries(base, chosen), "The comparison")
        if summaries is not None:
            results = {k: cache.simulate_cached(base.with_policy(p)) for k, p in chosen.items()}
    elif len(chosen) < 2 and not errors:
        st.warning("Pick at least two policies to compare.", icon=":material/info:")
    if summaries is None:
        if LAST not in st.session_state:
            return
        summaries, results, chosen = st.session_state[LAST]
        st.caption("Showing the last comparison that ran.")
    else:
        st.session_state[LAST] = (summaries, results, chosen)

    colors = {k: charts.SERIES_COLORS[i % len(charts.SERIES_COLORS)] for i, k in enumerate(summaries)}
    first = next(iter(summaries))
    st.subheader("Every metric against the first policy", divider="gray")
    tables.change_table(summaries, KEYS)
    st.caption(f"Values per policy; the '… vs {first}' columns give the change in % of {first}'s value, green "
               "when better (higher throughput, lower latency), red when worse.")
    with st.expander("What the metrics mean"):
        tables.definitions(KEYS)

    name = charts.slug("compare", *[k.split(" · ")[1].replace("*", "-custom") for k in summaries],
                       report.scenario_slug(base))
    figures = []
    st.subheader("Latency distributions", divider="gray")
    for tab, metric in zip(st.tabs(["TTFT", "TPOT", "E2E"]), ("ttft", "tpot", "e2e")):
        values = {k: r.requests[f"{metric}_s"].to_numpy() for k, r in results.items()}
        with tab:
            c1, c2 = st.columns(2)
            with c1:
                cdf = charts.latency_cdf(values, metric, colors)
                widgets.chart(cdf, f"Share of requests with {metric.upper()} at or below x (log axis): a curve to "
                              "the left is faster; where it reaches the P99 line is the tail.", f"{name}_{metric}_cdf")
            with c2:
                hist = charts.latency_hist_overlay(values, metric, colors)
                widgets.chart(hist, f"Requests per {metric.upper()} bin on shared log bins, one colour per "
                              "policy; dashed lines mark P50, dotted lines P99.", f"{name}_{metric}_hist")
            figures += [(cdf, f"{metric.upper()} CDF by policy."), (hist, f"{metric.upper()} histogram by policy.")]

    link = state.current_link()
    change = tables.change_frame(summaries, KEYS).drop(columns="_lower_is_better").round(1)
    widgets.downloads(
        name=name, link=link,
        requests_csv=lambda: report.combined_csv(results, "requests"),
        steps_csv=lambda: report.combined_csv(results, "steps"),
        summary_json=lambda: report.summary_json(summaries, base, chosen),
        report_html=lambda: report.html_report("Compare policies", base, figures=figures,
                                               tables=[("Every metric against the first policy", change)],
                                               policies=chosen, link=link))


if scenario is None:
    st.stop()
compare(scenario)
