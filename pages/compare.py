"""Compare policies: two to four presets (customised or not) on the sidebar's scenario, side by side."""
import streamlit as st

from batching.charts import policy as charts

from batching import report
from batching.charts.export import scenario_caption
from batching.sim.simulate import Scenario
from batching.ui import cache, knobs, nav, page, state, tables, widgets
from batching.ui.safe import plain

# (URL prefix, slot letter, default preset); the first slot is the baseline of every change
SLOTS = (("a_", "A", "dynamic"), ("b_", "B", "continuous"), ("c_", "C", "chunked"), ("d_", "D", knobs.NONE))
KEYS = ("throughput_output_tok_s", "capacity_output_tok_s", "load", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
        "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "queue_delay_p99_s", "gpu_util", "busy", "mfu", "mbu", "kv_util",
        "sol_util", "batch_efficiency", "preemptions", "prefix_hit_rate", "cached_prompt_tokens")
LAST = "compare_last"  # (summaries, policies) of the last comparison that ran: the results stay in the cache
METRICS = ("ttft", "tpot", "e2e")

scenario = page.setup(
    nav.COMPARE,
    "Two to four policies on the sidebar's scenario: latency distributions overlaid, and every metric against "
    "policy A. Start each slot from a preset and customise its knobs.")


def _slots(base: Scenario) -> tuple[list, dict, list[str]]:
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
                kps, choice = knobs.policy_knobs(prefix, preset, columns=1, model=base.deployment.model)
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
    params, chosen, errors = _slots(base)
    state.publish(params)
    for err in errors:
        st.error(f"**These knobs cannot run:** {plain(err)}", icon=":material/error:")
    # a disaggregated scenario runs iteration-level batching only: the others are skipped, with one caption
    chosen = cache.runnable_policies(base, chosen)
    summaries = None
    if len(chosen) >= 2 and not errors:
        summaries = widgets.guarded(lambda: cache.compare_summaries(base, chosen), "The comparison")
    elif len(chosen) < 2 and not errors:
        st.warning("Pick at least two policies to compare." if base.disagg is None else
                   "Pick at least two policies with iteration-level batching (continuous, chunked, priority) to "
                   "compare on this disaggregated scenario.", icon=":material/info:")
    if summaries is None:
        if LAST not in st.session_state:
            return
        summaries, chosen = st.session_state[LAST]
        st.caption("Showing the last comparison that ran.")
    else:
        st.session_state[LAST] = (summaries, chosen)
    # copy-on-write views of the cached runs, for this script run only (a session keeps the policies, not these)
    latencies = widgets.guarded(lambda: _latencies(_results(base, chosen)), "The comparison")
    if latencies is None:
        return

    first = next(iter(summaries))
    st.subheader("Every metric against the first policy", divider="gray")
    shown_sums = _without_cache_figures(summaries, chosen)
    tables.change_table(shown_sums, KEYS)
    over = [k for k, s in summaries.items() if s.get("overloaded")]
    st.caption(f"Values per policy; the '… vs {first}' columns give the change in % of {first}'s value, green "
               "when better (higher throughput, lower latency), red when worse, uncoloured when neither (busy, load, "
               "KV cache in use, batch efficiency)."
               + (f" Overloaded at this rate: {', '.join(plain(k) for k in over)}: the queue grows through the run, "
                  "so latencies read as unbounded and are not compared (–)." if over else "")
               + _caching_note(summaries, chosen))
    with st.expander("What the metrics mean"):
        tables.definitions(KEYS)

    name = charts.slug("compare", *[k.split(" · ")[1].replace("*", "-custom") for k in summaries],
                       report.scenario_slug(base))
    st.subheader("Latency distributions", divider="gray")
    # only the open tab builds and draws its two charts (a tab click reruns this part)
    for tab, metric in widgets.open_tabs(["TTFT", "TPOT", "E2E"], METRICS, "compare_latency_tab"):
        cdf, hist = _shown_figures(base, chosen, latencies, metric)
        with tab:
            c1, c2 = st.columns(2)
            with c1:
                widgets.chart(cdf, f"Share of requests with {metric.upper()} at or below x (log axis): a curve to "
                              "the left is faster; where it reaches the P99 line is the tail.", f"{name}_{metric}_cdf")
            with c2:
                widgets.chart(hist, f"Requests per {metric.upper()} bin on shared log bins, one colour per "
                              "policy; dashed lines mark P50, dotted lines P99.", f"{name}_{metric}_hist")

    link = state.current_link()
    change = tables.change_frame(shown_sums, KEYS).drop(columns="_lower_is_better").round(1)

    def _report_html() -> str:
        figures = []
        values = _latencies(_results(base, chosen, download=True))
        for metric in METRICS:
            cdf, hist = _latency_figures(values[metric], metric)
            figures += [(cdf, f"{metric.upper()} CDF by policy."), (hist, f"{metric.upper()} histogram by policy.")]
        return report.html_report("Compare policies", base, figures=figures,
                                  tables=[("Every metric against the first policy", change)], policies=chosen,
                                  link=link)

    # the buttons keep the scenario and policies, not the runs or figures: a click takes the runs from the cache
    widgets.downloads(
        name=name, link=link,
        requests_csv=lambda: report.combined_csv(_results(base, chosen, download=True), "requests"),
        steps_csv=lambda: report.combined_csv(_results(base, chosen, download=True), "steps"),
        summary_json=lambda: report.summary_json(summaries, base, chosen), report_html=_report_html,
        figures=lambda: {f"{name}_{k}": fig for k, (fig, _) in report.compare_figures(
            _results(base, chosen, download=True), scenario_caption(base)).items()})


def _without_cache_figures(summaries: dict, chosen: dict) -> dict:
    """The summaries as the table shows them: a policy without a prefix cache reads "–" for its hit rate and cached
    tokens (the footnote says why), not 0 %."""
    out = {}
    for k, s in summaries.items():
        pol = chosen.get(k)
        uncached = pol is not None and not pol.prefix_caching
        out[k] = {**s, "prefix_hit_rate": None, "cached_prompt_tokens": None} if uncached else s
    return out


def _caching_note(summaries: dict, chosen: dict) -> str:
    """A sentence when the policies differ in prefix caching and the cache served prompt tokens: part of their
    difference is the cache, not the batching."""
    on = [k for k, p in chosen.items() if p.prefix_caching and k in summaries]
    off = [k for k, p in chosen.items() if not p.prefix_caching and k in summaries]
    served = {k: h for k in on if isinstance(h := summaries[k].get("prefix_hit_rate"), (int, float)) and h > 0}
    if not served or not off:  # the cache reused nothing, or every policy has it: the toggle explains no gap
        return ""
    with_cache = ", ".join(plain(k) + (f" ({tables.shown('prefix_hit_rate', served[k])} of prompt tokens from the "
                                       "cache)" if k in served else "") for k in on)
    return (f" Prefix caching differs: on for {with_cache}, off for {', '.join(plain(k) for k in off)}; part of "
            "their difference in TTFT and capacity is "
            "the prefill the cache saved, not the batching. To compare the batching alone, turn Prefix caching off "
            "under Customise knobs in every slot that has it (static and dynamic batching have no prefix cache).")


def _results(base: Scenario, chosen: dict, download: bool = False) -> dict:
    """The run of each policy, from the cache (views; ``download``: from a button's callable, no messages)."""
    get = cache.result_for_download if download else cache.simulate_cached
    return {k: get(base.with_policy(p)) for k, p in chosen.items()}


def _latencies(results: dict) -> dict[str, dict]:
    """metric -> policy -> its per-request latencies (s), read-only views of the runs' columns."""
    return {m: {k: r.requests[f"{m}_s"].to_numpy() for k, r in results.items()} for m in METRICS}


FIGURES = "compare_figures"  # session: (scenario, policies, metric) -> the CDF and histogram drawn, last few


def _shown_figures(base: Scenario, chosen: dict, latencies: dict, metric: str) -> tuple:
    """The open tab's two figures, kept per metric for the session's last comparison: a tab click back, or a
    knob step that lands on the same policies, reuses them."""
    drawn = (base, tuple(chosen.items()), metric, st.session_state.get(page.CAPTION_LINE))
    memo = st.session_state.setdefault(FIGURES, {})
    hit = memo.get(metric)
    if hit is None or hit[0] != drawn:
        hit = memo[metric] = (drawn, _latency_figures(latencies[metric], metric))
    return hit[1]


def _latency_figures(values: dict, metric: str) -> tuple:
    """CDF and histogram; each policy in its own colour (charts.colors), by name, as on every page."""
    return charts.latency_cdf(values, metric), charts.latency_hist_overlay(values, metric)


if scenario is None:
    st.stop()
compare(scenario)
