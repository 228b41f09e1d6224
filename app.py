"""Home: the strategy showdown, the five batching presets on the sidebar's scenario."""
import streamlit as st

from batching.charts import policy as charts

from batching import report
from batching.studies.compare import COMPARE_COLUMNS, verdict
from batching.sim.policy import PRESETS
from batching.ui import cache, page, state, tables, widgets

scenario = page.setup(
    "Strategy showdown", ":material/leaderboard:",
    "Five batching policies serve the same traffic on the simulated node in the sidebar: throughput at this "
    "load and capacity, latency (TTFT, TPOT), GPU use. Change the scenario on the left; the link keeps it.")
if scenario is None:
    st.stop()

summaries = widgets.guarded(lambda: cache.compare_summaries(scenario, PRESETS), "The showdown")
if summaries is None:
    summaries = st.session_state.get("home_last")
    if summaries is None:
        st.stop()
    st.caption("Showing the last showdown that ran.")
st.session_state["home_last"] = summaries
name = charts.slug("showdown", report.scenario_slug(scenario))

sentence = verdict(summaries)
st.info(sentence, icon=":material/emoji_events:")

st.subheader("The classic table", divider="gray")
tables.summary_table(summaries)
st.caption("One row per preset. Throughput is measured at the sidebar's request rate, capacity with every request "
           "queued at t = 0. Hover a header for its definition.")
with st.expander("What the columns mean"):
    tables.definitions(list(COMPARE_COLUMNS))

bars = charts.showdown_bars(summaries)
widgets.chart(bars, "Left: throughput at this load (light) against capacity (dark); the gap is headroom. Middle "
              "and right: P50 and P99 latency on log scales, lower is better.", f"{name}_bars")

st.subheader("Per priority class", divider="gray")
left, right = st.columns([3, 2])
with left:
    cls_fig = charts.class_ttft_bars(summaries)
    widgets.chart(cls_fig, "P99 TTFT of each priority class per policy (log scale): with priority scheduling the "
                  "high class should sit lower than the rest.", f"{name}_class_ttft")
with right:
    tables.class_table(summaries)
    st.caption("P99 TTFT (s) of each class; classes come from the workload (a single-class workload has one "
               "column).")


def _summary_json() -> bytes:
    return report.summary_json(summaries, scenario, PRESETS)


def _report_html() -> str:
    return report.html_report(
        "Strategy showdown", scenario, figures=[(bars, "Throughput vs capacity, TTFT and TPOT by policy."),
                                                 (cls_fig, "P99 TTFT per priority class.")],
        tables=[("The classic table", tables.report_frame(summaries)),
                ("P99 TTFT by class (s)", tables.class_frame(summaries).round(3))],
        policies=PRESETS, verdict=sentence, link=link)


def _runs_csv(table: str) -> bytes:
    runs = {k: cache.simulate_cached(scenario.with_policy(p)) for k, p in PRESETS.items()}
    return report.combined_csv(runs, table)


link = state.current_link()
widgets.downloads(name=name, summary_json=_summary_json, report_html=_report_html, link=link,
                  requests_csv=lambda: _runs_csv("requests"), steps_csv=lambda: _runs_csv("steps"))
