"""Explore a policy: one preset with every knob of its mode, and what a run looks like inside."""
from dataclasses import replace

import streamlit as st

from batching.ui.launch import launch_expander
from batching.charts import fleet as fleet_charts
from batching.charts import policy as charts

from batching import report
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.studies.compare import with_capacity
from batching.ui import cache, knobs, nav, page, state, tables, widgets
from batching.ui.safe import plain

CARDS = report.POLICY_METRICS
PREFIX_CARDS = ("prefix_hit_rate", "cached_prompt_tokens")  # beside CARDS when the policy caches prefixes
DEFAULT_PRESET = "continuous"
LAST = "explore_last"  # (scenario, label) of the last run that worked: its result stays in the cache, not here

scenario = page.setup(
    nav.EXPLORE,
    "Start from a preset and move its knobs: every chart below is one simulated run of the sidebar's scenario. "
    "Moving a knob reruns only this part of the page.")


@st.fragment
def explore(base: Scenario) -> None:
    st.subheader("Policy", divider="gray")
    left, right = st.columns([1, 3], gap="large")
    with left:
        pp, preset = knobs.preset_select("", DEFAULT_PRESET, "Preset")
        st.caption(f"Preset: {PRESETS[preset].describe()}")
    with right:
        kps, choice = knobs.policy_knobs("", preset, model=base.deployment.model)
    st.markdown("**Traffic mix and memory**")
    sps, sc = knobs.scenario_knobs(base)
    state.publish([pp, *kps, *sps])

    result = None
    if choice.error:
        st.error(f"**These knobs cannot run:** {plain(choice.error)}", icon=":material/error:")
    else:
        run = sc.with_policy(choice.policy)
        result = widgets.guarded(
            lambda: cache.run_with_progress([(choice.label, lambda: cache.simulate_cached(run))], "Simulating")[0],
            "The simulation")
    stale = result is None
    if stale:
        if LAST not in st.session_state:
            return
        last, label = st.session_state[LAST]
        result = widgets.guarded(lambda: cache.simulate_cached(last), "The last run")  # a cache hit, or run again
        if result is None:
            return
        st.caption(f"Showing the last run that worked ({label}).")
    else:
        label = choice.label
        st.session_state[LAST] = (result.scenario, label)
    run = result.scenario
    summary = _with_load(result.summary(), run)
    # everything above the charts whose count varies with the knobs (captions, a row of cards, notes) sits in one
    # container: the charts below keep their places in the page, so the browser redraws them in place rather than
    # mounting them anew (batching/ui/plot.py)
    with st.container():
        if run.router != base.router:
            st.caption(f"{run.policy.mode.capitalize()} batching runs the fleet round-robin: the {base.router} router "
                       "reads each replica's state and is built for the continuous modes.")

        st.subheader(f"Results: {label}", divider="gray")
        baseline = None
        if not stale and run != base.with_policy(PRESETS[preset]):
            try:
                baseline = _with_load(cache.summary_cached(base.with_policy(PRESETS[preset])),
                                      base.with_policy(PRESETS[preset]))
                st.caption(f"Deltas compare with the unchanged '{preset}' preset on the sidebar's scenario.")
            except (ValueError, RuntimeError) as exc:
                st.caption(f"No deltas: the unchanged '{preset}' preset cannot run this scenario ({plain(exc)}).")
        cards = CARDS + (PREFIX_CARDS if run.policy.prefix_caching else ())
        widgets.metric_cards(summary, cards, baseline)
        _disagg_cards(run, summary)
        _prefix_caption(run, summary)

        name = charts.slug("explore", label.replace("*", "-custom"), report.scenario_slug(run))
        # the same figures `python -m batching report` exports, but the timeline within a point budget: the first
        # requests in full and a sample of the rest, said in a note (the exports below draw every request)
        figs = _figures(result, label)

        tl = figs["timeline"][0]
        _, note = charts.timeline_rows(result.requests, max_points=charts.TIMELINE_POINT_BUDGET)
        if note:
            st.info(note, icon=":material/filter_alt:")
    split = ("" if not charts.has_disagg(result.requests) else
             f" Disaggregated: after the first token (on a prefill instance), thick {charts.DISAGG_TRANSFER!r} "
             "segments (a dot until zoomed in) are the prompt's KV moving to a decode instance and dotted "
             f"{charts.DISAGG_WAIT!r} segments the waits there (for its next step, which starts the pull, and "
             "for KV room after it); decode starts when it is admitted "
             "(transfers take well under a millisecond within a node: zoom in).")
    widgets.chart(tl, "Each row is a request in arrival order: dotted = queued, thick = prefill, solid = decode, "
                  "dashed = finished but held until its batch is released. Colour is the priority class; "
                  f"zoom in to see single requests.{split}", f"{name}_timeline")

    c1, c2 = st.columns(2)
    with c1:
        widgets.chart(figs["batch_composition"][0], "Stacked tokens per forward pass over time: orange prompt "
                      "(prefill) tokens, blue decode tokens, grey padded slots computed for nothing.",
                      f"{name}_batch_composition")
    with c2:
        kv_top = ("Top: KV cache held, in % of its capacity: blocks of running sequences (filled) and, stacked on "
                  "them, blocks held only by the prefix cache (evictable, kept for reuse); the rest is free."
                  if charts.KV_CACHED_NAME in {t.name for t in figs["kv_queue"][0].data} else
                  "Top: share of the KV cache in use.")
        split = ("" if run.disagg is None else " With disaggregation both panels average the prefill and decode "
                 "instances together (KV against the sidebar's tensor parallel); the per-instance view below shows "
                 "each instance against its own cache.")
        widgets.chart(figs["kv_queue"][0], f"{kv_top} Bottom: requests waiting for admission and sequences running; "
                      f"a growing queue means the policy is not keeping up.{split}", f"{name}_kv_queue")

    c3, c4 = st.columns(2)
    with c3:
        # only the open tab draws its histogram (a tab click reruns this part, the figures come from the memo)
        for tab, metric in widgets.open_tabs(["TTFT", "TPOT", "E2E"], ("ttft", "tpot", "e2e"), "explore_hist_tab"):
            with tab:
                widgets.chart(figs[f"{metric}_hist"][0], f"Requests per {metric.upper()} bin on a log axis, one "
                              "colour per priority class; dashed and dotted lines mark each class's P50 and P99.",
                              f"{name}_{metric}_hist")
    with c4:
        widgets.chart(figs["itl"][0], "Every gap between two tokens of a request (log axis): a second hump far to "
                      "the right means decodes stalled behind prefills.", f"{name}_itl")

    if int(summary.get("replicas") or run.replicas) > 1:
        _per_replica(result, summary, label, name)

    link = state.current_link()
    policies = {label: result.scenario.policy}
    one = {label: summary}
    keys = cards

    def _report_html() -> str:
        figures = list(report.policy_figures(cache.result_for_download(run)).values())
        return report.html_report(f"Explore a policy: {label}", run, figures=figures,
                                  tables=[("Metrics", tables.report_frame(one, keys))], policies=policies, link=link)

    # the buttons keep the scenario, not the result or its figures (a session may stay open for days): a click
    # takes the result from the cache (or runs it again) and draws the figures then
    widgets.downloads(
        name=name, link=link,
        requests_csv=lambda: report.requests_csv(cache.result_for_download(run)),
        steps_csv=lambda: report.steps_csv(cache.result_for_download(run)),
        summary_json=lambda: report.summary_json(one, run, policies), report_html=_report_html,
        figures=lambda: {f"{name}_{k}": fig for k, (fig, _) in
                         report.policy_figures(cache.result_for_download(run), label).items()})
    launch_expander(run)  # the vLLM and SGLang commands of this run (issue 24)


def _with_load(summary: dict, run: Scenario) -> dict:
    """The run's summary with its capacity run's ``load`` (share of capacity) and overload, as the showdown has them
    (the first card, issue 24 item 10); without them ("–") when the capacity run cannot be made."""
    try:
        return with_capacity(summary, cache.capacity_summary(run))
    except (ValueError, RuntimeError):
        return summary


FIGURES = "explore_figures"  # session: (run, label) -> the figures drawn from it so far, the last run only


class _Figures:
    """``report.policy_figure`` of one run, built when the page first asks for it: each chart is sent to the
    browser before the next one is built (the browser draws while the server works), and a histogram tab nobody
    opened is never built. ``built`` is kept in the session (not the run itself: the cache owns that), so a tab
    click or a knob step that lands on the same run reuses the figures."""

    def __init__(self, result, built: dict) -> None:
        self.result, self.built = result, built

    def __getitem__(self, key: str):
        if key not in self.built:
            self.built[key] = report.policy_figure(self.result, key, timeline_points=charts.TIMELINE_POINT_BUDGET)
        return self.built[key]


def _figures(result, label: str) -> _Figures:
    """The figures of this run (``_Figures``); those of the session's last run are kept."""
    drawn = (result.scenario, label, st.session_state.get(page.CAPTION_LINE))
    memo = st.session_state.get(FIGURES)
    if memo is None or memo[0] != drawn:
        memo = (drawn, {})
        st.session_state[FIGURES] = memo
    return _Figures(result, memo[1])


def _per_replica(result, summary: dict, label: str, name: str) -> None:
    """The fleet's replicas side by side: KV cache in use and requests waiting over time, one line per replica (at
    most ``fleet_charts.MAX_LINES``), and a table of each replica's share of the work and its latencies."""
    run = result.scenario
    if run.disagg is not None:
        _per_instance(result, summary, label, name)
        return
    per_node = run.deployment.node.replicas
    st.subheader(f"Per replica: {run.replicas} replicas behind {run.router}", divider="gray")
    fig = _figures(result, label)["per_replica"][0]
    reps = fleet_charts.shown_replicas(run.replicas)
    which = fleet_charts.shown_text(reps, run.replicas)
    widgets.chart(fig, "Top: KV blocks held by each replica's running sequences, in % of that replica's own KV "
                  "cache. Bottom: requests waiting in each replica's queue. One colour per replica (click a legend "
                  "entry to hide it in both panels); a router that balances well keeps the lines together. Each "
                  f"line is drawn at screen resolution: at most {fleet_charts.MAX_POINTS:,} time bins, the "
                  "replica's time-weighted mean in each." + (f" {which}" if which else ""),
                  f"{name}_per_replica")
    by_replica = summary.get("by_replica") or {}
    if by_replica:
        st.dataframe(fleet_charts.replica_frame(by_replica, per_node), width="stretch",
                     height=min(38 + 35 * len(by_replica), 600))
        st.caption("Per replica: requests the router sent it, their output tokens per second of the fleet's wall "
                   "time, their TTFT and TPOT P50 and P99, the share of the time the replica ran a forward pass "
                   "(busy), and the most requests it had waiting after a step.")


def _per_instance(result, summary: dict, label: str, name: str) -> None:
    """A disaggregated run's instances side by side: KV cache in use (each in % of its own role's cache) and
    requests waiting over time, one line per instance named by its role ("prefill 0", "decode 1")."""
    run = result.scenario
    dis = run.disagg
    total = dis.prefill_instances + dis.decode_instances
    st.subheader(f"Per instance: {dis.prefill_instances} prefill + {dis.decode_instances} decode", divider="gray")
    fig = _figures(result, label)["per_instance"][0]
    reps = fleet_charts.shown_replicas(total)
    which = fleet_charts.shown_text(reps, total).replace("replicas", "instances").replace("the fleet", "them")
    caps = {role: dis.deployment(run.deployment, role).kv_capacity_tokens for role in ("prefill", "decode")}
    widgets.chart(fig, "Top: KV blocks held by each instance's running sequences, in % of its own KV cache "
                  f"({caps['prefill']:,} tokens per prefill instance at TP {dis.prefill_tp}, {caps['decode']:,} per "
                  f"decode instance at TP {dis.decode_tp}). A prefill instance frees a prompt's blocks when its "
                  "first token is out (the step's end), so its line shows only prompts still part-way through a "
                  "chunked prefill. Bottom: requests waiting in each instance's queue (on a decode instance: KV "
                  "arrived, waiting for room). Prefill instances in orange, decode in blue (click a legend entry to "
                  f"hide it in both panels); each line is at most {fleet_charts.MAX_POINTS:,} time bins, the "
                  "instance's time-weighted mean in each." + (f" {which}" if which else ""),
                  f"{name}_per_instance")


def _ms(seconds) -> str:
    """A short time in ms ("0.243 ms", "12.5 ms"); "–" when missing."""
    try:
        v = float(seconds) * 1e3
    except (TypeError, ValueError):
        return "–"
    if v != v:
        return "–"
    return f"{v:,.3f} ms" if v < 1 else f"{v:,.2f} ms" if v < 10 else f"{v:,.1f} ms"


DISAGG_CARDS = (
    ("KV transfer P50", "kv_transfer_p50_s", "Median time to move a request's prompt KV from its prefill instance "
     "to its decode instance (a fixed time to post the transfer + prompt tokens x KV bytes per token / the link)."),
    ("KV transfer P99", "kv_transfer_p99_s", "99th percentile of the KV transfer time."),
    ("Decode queue P50", "decode_queue_p50_s", "Median wait on the decode instance after the transfer, for KV room "
     "to admit the request."),
    ("Decode queue P99", "decode_queue_p99_s", "99th percentile of the wait for a decode slot."),
)


def _disagg_cards(run: Scenario, summary: dict) -> None:
    """A disaggregated run's transfer and decode-queue percentiles (ms) and each role's busy share."""
    if not summary.get("disaggregated"):
        return
    for col, (title, key, text) in zip(st.columns(len(DISAGG_CARDS) + 1), DISAGG_CARDS):
        col.metric(title, _ms(summary.get(key)), help=text, border=True)
    busy = [f"{role} {tables.shown('busy', summary.get(f'{role}_busy'))}" for role in ("prefill", "decode")]
    what = plain(summary["disaggregated"])
    st.caption(f"{what[:1].upper()}{what[1:]} ({int(summary.get('gpus') or 0)} GPUs). TTFT is what the "
               "client sees: the prefill, the wait for the decode instance's next step (it starts the pull then), "
               "the KV transfer, the wait for a decode slot and the decode instance's first step, which sends the "
               f"first token (kv_pull_wait_p50 {_ms(summary.get('kv_pull_wait_p50_s'))}, kv_transfer_p50 "
               f"{_ms(summary.get('kv_transfer_p50_s'))}, decode_queue_p99 "
               f"{_ms(summary.get('decode_queue_p99_s'))}). Busy: {', '.join(busy)}."
               + (f" The decode instances' prefix caches held {int(summary['decode_cached_tokens']):,} prompt tokens "
                  "of the requests they took in: those did not move." if summary.get("decode_cached_tokens") else ""))


def _prefix_caption(run: Scenario, summary: dict) -> None:
    """What the prefix-caching toggle does to this run: with caching on and prompt tokens served from the cache,
    the same run with it off (one more cached simulation) and how TTFT and throughput differ; otherwise why the
    toggle changes nothing here."""
    if run.policy.mode != "continuous":
        return
    hit = summary.get("prefix_hit_rate")
    if not run.policy.prefix_caching:
        st.caption("Prefix caching is off: every prompt token is computed, shared system prompts and conversation "
                   "history included. Turn it on to reuse their KV blocks.")
        return
    if hit is None:
        return
    if hit <= 0:
        st.caption("Prefix caching is on, but no prompt shared a prefix with one still in the KV cache (hit rate "
                   "0 %): the toggle changes nothing here. A shared system prompt (sidebar) or the chat-sessions "
                   "workload gives it something to reuse.")
        return
    text = (f"Prefix caching served {tables.shown('prefix_hit_rate', hit)} of prompt tokens "
            f"({int(summary.get('cached_prompt_tokens') or 0):,}) from the KV cache: no step computed them.")
    try:
        off = cache.summary_cached(run.with_policy(replace(run.policy, prefix_caching=False)))
    except (ValueError, RuntimeError):
        st.caption(text)
        return
    parts = [f"{metric} {tables.shown(k, off.get(k))} → {tables.shown(k, summary.get(k))}"
             for metric, k in (("TTFT P50", "ttft_p50_s"), ("TTFT P99", "ttft_p99_s"))]
    parts.append(f"throughput {tables.shown('throughput_output_tok_s', off.get('throughput_output_tok_s'))} → "
                 f"{tables.shown('throughput_output_tok_s', summary.get('throughput_output_tok_s'))}")
    st.caption(f"{text} The same run with the toggle off → on: {', '.join(parts)}.")


if scenario is None:
    st.stop()
explore(scenario)
