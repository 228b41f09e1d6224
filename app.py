"""Home: the strategy showdown, the five batching presets on the sidebar's scenario."""
import streamlit as st

from batching.charts import policy as charts
from batching.charts import load as load_charts

from batching import report
from batching.studies.compare import COMPARE_COLUMNS, verdict
from batching.studies import article, load_curve
from batching.sim.policy import PRESETS
from batching.ui import cache, nav, page, state, tables, widgets
from batching.ui.safe import plain

scenario = page.setup(
    nav.HOME,
    "Five batching policies serve the same traffic on the simulated node in the sidebar: throughput at this "
    "load and capacity, latency (TTFT, TPOT), GPU use. Change the scenario on the left; the link keeps it.")
if scenario is None:
    st.stop()

# a disaggregated scenario runs the continuous presets only: one caption says which were skipped and why
policies = cache.runnable_policies(scenario, PRESETS)
summaries = widgets.guarded(lambda: cache.compare_summaries(scenario, policies), "The showdown")
if summaries is None:
    summaries = st.session_state.get("home_last")
    if summaries is None:
        st.stop()
    st.caption("Showing the last showdown that ran.")
st.session_state["home_last"] = summaries
name = charts.slug("showdown", report.scenario_slug(scenario))


def _cached_summary(sc, saturated: bool) -> dict:
    # the showdown's own cached runs: capacity runs are shared with the table, reruns cost nothing
    return cache.capacity_summary(sc) if saturated else cache.summary_cached(sc, False)


def _load_curve():
    with st.spinner(f"Simulating each policy at {load_curve.POINTS} rates up to its capacity…", show_time=True):
        return load_curve.load_curve(scenario, policies, summarize=_cached_summary)


rate = float(scenario.workload.rate_req_s)
# the first cards say how full the node is (issue 24 item 10): load (share of capacity), then MFU and MBU, then GPU
# busy, of the policy with the highest capacity; every policy's figures are in the classic table below
lead = max(summaries, key=lambda k: summaries[k]["capacity_output_tok_s"])
st.markdown(f"**How full the node is** under '{plain(lead)}', the policy with the highest capacity, at "
            f"{rate:g} req/s (every policy's figures are in the table below; hover a card for its definition)")
widgets.metric_cards(summaries[lead], (*report.LOAD_CARDS, "capacity_output_tok_s"))

st.subheader("Latency against load", divider="gray")
# drawn here, computed last: the load curve takes more runs than everything below it (17 s of a 20,000-request
# link against 5 s for the rest), so the table and bars below appear first and the curve fills this place after
curve_slot = st.container()

sentence = verdict(summaries)
st.info(sentence, icon=":material/emoji_events:")

st.subheader("The classic table", divider="gray")
tables.summary_table(summaries)
_over = [k for k, s in summaries.items() if s.get("overloaded")]
st.caption("One row per preset. Throughput is measured at the sidebar's request rate, capacity with every request "
           "queued at t = 0; Load is the first over the second. GPU util charges idle waits, padded slots and "
           "finished sequences held in a batch; Busy is what nvidia-smi shows. Hover a header for its definition."
           + (f" Greyed: overloaded at this rate ({', '.join(_over)}): the queue grows through the run, so their "
              "latencies measure the run's length and read as unbounded." if _over else ""))
# drawn only while open (opening it reruns the page from the cache): a closed expander's table would be built,
# sent and laid out by the browser on every move of a sidebar knob
with st.expander("What the columns mean, and diagnostics", key="home_diagnostics", on_change="rerun") as diag:
    if diag.open:
        tables.definitions(list(COMPARE_COLUMNS) + list(tables.DIAGNOSTICS))
        tables.summary_table(summaries, tables.DIAGNOSTICS)

bars = charts.showdown_bars(summaries)
widgets.chart(bars, "Left: throughput at this load (light) against capacity (dark); the gap is headroom. Middle "
              "and right: P50 and P99 latency on log scales, lower is better.", f"{name}_bars")

st.subheader("Per priority class", divider="gray")
cls_fig = charts.class_ttft_bars(summaries)
widgets.chart(cls_fig, "P99 TTFT of each priority class per policy (log scale): with priority scheduling the "
              "high class should sit lower than the rest.", f"{name}_class_ttft")
tables.class_stats_table(summaries)
st.caption("P50 and P99 TTFT and TPOT of each class at the sidebar's rate; classes come from the workload (a "
           "single-class workload has one set of columns).")


def _summary_json() -> bytes:
    return report.summary_json(summaries, scenario, policies)


# what the exports take from parts of the page drawn further down (the load curve, the article's runs): a download
# is made on its click, after the whole page has run
drawn: dict = {}


def _figures() -> dict:
    """The page's figures in page order, latency against load first (issue 24 item 11)."""
    return report.showdown_figures(summaries, scenario, drawn.get("curve"), rate)


def _report_html() -> str:
    return report.html_report(
        "Strategy showdown", scenario, figures=list(_figures().values()),
        tables=report.showdown_tables(summaries, drawn.get("article")), policies=policies, verdict=sentence,
        link=link)


def _runs_csv(table: str) -> bytes:
    runs = {k: cache.simulate_cached(scenario.with_policy(p)) for k, p in policies.items()}
    return report.combined_csv(runs, table)


link = state.current_link()
widgets.downloads(name=name, summary_json=_summary_json, report_html=_report_html, link=link,
                  requests_csv=lambda: _runs_csv("requests"), steps_csv=lambda: _runs_csv("steps"),
                  figures=lambda: {f"{name}_{k}": fig for k, (fig, _) in _figures().items()})


def _draw_load_curve() -> None:
    try:
        curve = _load_curve()
        st.session_state["home_last_curve"] = curve
    except (ValueError, RuntimeError):  # the showdown above has said why (ServerBusy is a RuntimeError)
        curve = st.session_state.get("home_last_curve")
        if curve is not None:
            st.caption("Showing the last curve that ran.")
    if curve is not None:
        drawn["curve"] = curve
        load_fig = load_charts.latency_vs_load(curve, load_curve.slo_targets(scenario), rate)
        caps = curve.groupby("policy", sort=False)["capacity_req_s"].first()
        _loads = {k: (summaries[k].get("load") if summaries[k].get("load") is not None else rate / caps[k])
                  for k in summaries if k in caps}
        _overloaded = [k for k in summaries if summaries[k].get("overloaded", _loads.get(k, 0) >= 1)]
        widgets.chart(load_fig, "How to read it: each line is one policy's P99 latency as the offered request rate "
                      f"rises ({load_curve.POINTS} rates, {load_curve.LOW:.0%}-{load_curve.HIGH:.0%} of that policy's "
                      "capacity); the × ends the line at its capacity, past "
                      "which its queue grows without bound. Dashed: the workload's SLOs; dotted: the sidebar's rate, "
                      "where the table below is read. A line further right carries more load; lower is faster.",
                      f"{name}_latency_vs_load")
        st.caption(f"At {rate:g} req/s each policy runs at this share of its capacity: "
                   + ", ".join(f"{k} {v:.0%}" for k, v in _loads.items()) + ". "
                   + (f"Overloaded here (their latencies grow with the run, not with the policy): "
                      f"{', '.join(_overloaded)}." if _overloaded else
                      "Every policy carries this load, so the table compares them on equal terms."))


with curve_slot:
    _draw_load_curve()

# ---------------------------------------------------------------- the article's table, side by side
st.subheader("The article's table", divider="gray")
art_sc = article.article_scenario(scenario.workload.num_requests, getattr(scenario.workload, "seed", 0))
art = widgets.guarded(lambda: cache.compare_summaries(art_sc, article.article_policies()), "The article's table")
if art is not None:
    drawn["article"] = art
    st.markdown(f"**As published** ({article.SOURCE}): a cited measurement; latencies are TTFT.")
    st.dataframe(article.article_table(), width="stretch", column_config={
        "Throughput (output tok/s)": st.column_config.NumberColumn(format="%,.0f"),
        "TTFT P99 (ms)": st.column_config.NumberColumn(format="%,.0f"),
        "GPU util (%)": st.column_config.NumberColumn(format="%.0f")})
    st.markdown(f"**The simulator** on the same setting: Qwen2.5-72B BF16 on 8xH100 (TP 8), workload `article` "
                f"(20 % interactive, 80 % batch; prompts 384-640, outputs 128-384 tokens), "
                f"{article.ARTICLE_RATE_REQ_S:g} req/s, {art_sc.workload.num_requests:,} requests, seed "
                f"{art_sc.workload.seed} (the sidebar's count and seed).")
    st.dataframe(article.simulator_table(art).round(1), width="stretch", column_config={
        c: st.column_config.NumberColumn(format="%,.0f") for c in article.simulator_table(art).columns
        if c not in ("TTFT P50 (ms)", "TTFT P99 high / low (ms)")})
    notes = article.explanations(art)
    st.markdown("**Why they differ**\n\n" + "\n".join(
        f"- **{row.label}:** {notes[row.policy]}" for row in article.ARTICLE_ROWS if row.policy in notes))
