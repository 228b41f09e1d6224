"""Find a deployment: the cheapest GPU, precision, tensor-parallel split, policy and knob values that serve a target
traffic within the SLOs, on the sidebar's model and workload; ranked by cost, the top configurations checked as a fleet
behind the sidebar's router, with the Pareto front of cost against P99 TTFT and TPOT, why the others were left out, and
a link that opens the chosen one on Explore."""
import json
import os

import streamlit as st

from batching.ui.launch import launch_expander, with_launch_rows
from batching.charts import policy as charts
from batching.charts.search import pareto_chart
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import GPUS, GPUS_PER_NODE, PRECISIONS
from batching.studies.backends import RAY_TIMEOUT_S, BackendUnavailable, make_backend
from batching.studies.capacity import class_names
from batching.studies.pricing import input_start, price_note, table_path
from batching.studies.search import (AGG_TPS, COST_NOTE, LATENCY_NOTE, MARGIN_NOTE, SERVING, Grid, chosen_sentence,
                                     parse_knobs, router_note, search)
from batching.ui import cache, nav, page, planning, sidebar, slots, state, widgets
from batching.ui.params import Param
from batching.ui.safe import plain
from batching import report  # issue 24 item 11: the page's export (CSV, JSON, HTML, PNG, SVG)
from batching.charts.export import configs_caption
from batching.ui import downloads

LAST = "search_last"
RAY_ADDRESS = os.environ.get("BATCHING_RAY_ADDRESS", "").strip() or None
RAY_MIN_CONFIGS = max(1, int(os.environ.get("BATCHING_RAY_MIN_CONFIGS", "32")))
RAY_TIMEOUT = min(3600.0, max(0.1, float(os.environ.get("BATCHING_RAY_TIMEOUT_S", str(RAY_TIMEOUT_S)))))
AUTO_MAX_CONFIGS = 16  # a grid this small searches as soon as the page opens or an input changes; larger ones wait
# for the Search button
SERVING_LABELS = {"agg": "Aggregated", "disagg": "Disaggregated", "both": "Both (aggregated and disaggregated)"}
KNOB_INPUTS = {"s_seqs": ("max_num_seqs", "max_num_seqs values", "e.g. 128,256,512; empty = each preset's own"),
               "s_budget": ("max_num_batched_tokens", "max_num_batched_tokens values",
                            "e.g. 512,2048,8192; empty = each preset's own")}
# Explore's URL keys for a policy's knobs (batching/ui/knobs.py FIELDS), with the factor from the policy's unit
EXPLORE_KNOBS = {"max_num_seqs": ("seqs", 1), "max_num_batched_tokens": ("budget", 1), "max_batch_size": ("batch", 1),
                 "max_wait_s": ("wait_ms", 1000)}

scenario = page.setup(
    nav.FIND_A_DEPLOYMENT,
    "Which GPU, precision, tensor-parallel split, batching policy and knob values serve your traffic within the "
    "SLOs at the lowest cost, and on how many nodes: one capacity search per configuration, on the sidebar's model "
    "and workload (the sidebar's GPU, TP and precision are replaced by the grid below; its request rate is what "
    "each search varies).")


def params() -> list[Param]:
    return [
        Param("target", 20.0, 0.01, 1_000_000.0, label="target traffic (req/s)"),
        Param("s_gpus", "h100-sxm,h200-sxm", label="GPUs to try"),
        Param("s_precs", "bf16,fp8", label="precisions to try"),
        Param("s_tps", "2,4,8", label="TP degrees to try"),
        Param("s_policies", "chunked", label="policies to try"),
        # aggregated by default here (the CLI's default is both): the page searches a small grid as it opens, and
        # both would add 28 splits per GPU x precision of an 8-GPU node (12 -> 124 configurations by default)
        Param("s_serving", "agg", label="serving to try"),
        *[Param(k, "", label=label) for k, (_, label, _) in KNOB_INPUTS.items()],
        *[Param(f"usd_{g}", input_start(g)[0], 0.01, 1000.0, label=f"price per GPU-hour, {g} ($)")
          for g in GPUS],
    ]


def _chosen(key: str, options: list, kind=str) -> list:
    """The options stored under ``key`` (a comma list in the URL), in the options' order; unknown ones dropped."""
    raw = [p.strip() for p in str(state.value(key, "")).split(",") if p.strip()]
    picked = []
    for p in raw:
        try:
            v = kind(p)
        except ValueError:
            continue
        if v in options and v not in picked:
            picked.append(v)
    out = [o for o in options if o in picked]
    if len(out) != len(raw):
        state.set_value(key, ",".join(map(str, out)))
    return out


def _multi(key: str, label: str, options: list, kind=str, fmt=str, help: str | None = None, col=st) -> list:
    chosen = _chosen(key, options, kind)
    st.session_state[state.widget_key(key)] = chosen

    def changed() -> None:
        state.set_value(key, ",".join(str(o) for o in options if o in st.session_state[state.widget_key(key)]))
        state.clear_notices()

    col.multiselect(label, options, key=state.widget_key(key), on_change=changed, format_func=fmt, help=help)
    return chosen


def _backend(size: int, tasks: int):
    """Ray when the host configured a cluster (BATCHING_RAY_ADDRESS) and the grid is large; else (or when the
    cluster does not answer within BATCHING_RAY_TIMEOUT_S, with a notice) threads in this process, as many as free
    simulation slots and ``tasks`` allow (the kernel releases the GIL while it runs)."""
    if RAY_ADDRESS and size >= RAY_MIN_CONFIGS:
        try:
            return make_backend("ray", RAY_ADDRESS, tasks=tasks, timeout_s=RAY_TIMEOUT), 0
        except BackendUnavailable as exc:
            st.warning(f"The Ray cluster is not available ({plain(exc)}); searching on this server.",
                       icon=":material/cloud_off:")
    extra = 0
    # only while nobody waits for a slot
    while extra < min(cache.MAX_CONCURRENT, tasks) - 1 and cache.SLOTS.take_extra():
        extra += 1
    return make_backend("threads", workers=1 + extra), extra


def _run(base: Scenario, slo, target: float, prices: dict, grid: Grid, router: str) -> dict:
    holder = st.empty()
    size = grid.size()

    def progress(done: int, total: int, text: str) -> None:
        holder.progress(done / max(total, 1), text=f"Searching {size:,} configurations: {done} of {total} steps "
                                                   f"(last: {text})")

    def go() -> dict:
        taken = [0]  # the extra slots the threads took (none when nothing fits or on Ray)

        def open_backend(tasks: int):
            backend, taken[0] = _backend(size, tasks)
            return slots.StoppableBackend(backend)  # closed on the way out: a closed page's tasks stop there

        try:  # search closes the backend it made
            return with_launch_rows(search(base, slo, target, prices, grid, backend=open_backend, progress=progress,
                                           router=router), base)
        finally:
            for _ in range(taken[0]):
                cache.SLOTS.release()

    cache.ensure_kernel()
    try:
        return cache.with_slot(lambda: cache.run_in_slot(go))
    finally:
        holder.empty()


def explore_link_params(cfg: dict) -> dict:
    """The URL parameters that open ``cfg`` (a search row) on Explore: the sidebar's scenario with this GPU, TP and
    precision, the policy preset and its knob values."""
    query = state.url_params(sidebar.params())
    query.update({"gpu": cfg["gpu"], "tp": str(cfg["tp"]), "precision": cfg["precision"], "policy": cfg["policy"]})
    for name, value in cfg["knobs"].items():
        key, factor = EXPLORE_KNOBS[name]
        v = value * factor
        query[key] = str(int(v)) if float(v).is_integer() else f"{v:g}"
    return query


@st.fragment
def search_view(base: Scenario) -> None:
    names = widgets.guarded(lambda: class_names(base), "The workload's classes")
    if names is None:
        return
    sps = planning.load_slo_params(names)
    ps = params()
    state.load_with_notices(ps)
    st.subheader("Service-level objectives and traffic", divider="gray")
    st.caption("Each target takes one value for every class, or one per class separated by commas, class 0 first: "
               + "; ".join(f"{i} = {plain(n)}" for i, n in enumerate(names)) + ". The same SLOs as on Capacity "
               "planning and Tune a knob.")
    planning.slo_inputs(names)
    r = {p.key: p.widget_range() for p in ps if p.low is not None}
    st.number_input("Target traffic (req/s)", **r["target"], step=5.0, format="%.4g",
                    help="The total traffic to serve: nodes needed = ⌈target / rate per node⌉, then the cheapest "
                         "few are simulated as a fleet behind the sidebar's router (a node added while the SLOs "
                         "fail).", **state.bind("target"))

    st.subheader("Configurations to try", divider="gray")
    c = st.columns(4, gap="medium")
    gpus = _multi("s_gpus", "GPUs", list(GPUS), fmt=lambda k: GPUS[k].name, col=c[0],
                  help="8 GPUs per node (the sidebar's node size).")
    precs = _multi("s_precs", "Precisions", list(PRECISIONS), fmt=str.upper, col=c[1],
                   help="FP8 halves the weights' bytes; the A100 has no FP8 (skipped, with why).")
    tps = _multi("s_tps", "Tensor parallel", list(AGG_TPS), kind=int, col=c[2],
                 help="GPUs per replica; 8 / TP replicas share a node's load. 16: one replica over two nodes (a "
                      "copy is two nodes; not calibrated: its cross-node all-reduce is composed, not measured). "
                      "A prefill/decode split's instances stay within a node (TP 1 to 8).")
    pols = _multi("s_policies", "Policies", list(PRESETS), col=c[3], help="Batching policy presets.")
    serving = st.radio("Serving", list(SERVING), format_func=SERVING_LABELS.get, horizontal=True,
                       help="Aggregated: each node's GPUs as GPUs / TP replicas that prefill and decode. "
                            "Disaggregated: every split of a node into prefill and decode instances "
                            "(P × TP + D × TP; a split leaving GPUs idle beside the same copies per node is dominated and not run; "
                            "iteration-level presets only). Both: the only way to answer which is cheaper (the "
                            "CLI's default, `search --serving both`); aggregated is the page's default so that the "
                            "default grid searches as the page opens.", **state.bind("s_serving"))
    k = st.columns(2, gap="medium")
    for col, (key, (_, label, hint)) in zip(k, KNOB_INPUTS.items()):
        col.text_input(label, placeholder=hint, help=f"Comma-separated values to try ({hint}); varied only for "
                       "the iteration-level presets (continuous, chunked, priority).", **state.bind(key))
    if gpus:
        pc = st.columns(len(gpus), gap="medium")
        for col, g in zip(pc, gpus):
            why = input_start(g)[1]  # None: the price table's row for g
            col.number_input(f"{GPUS[g].name} ($ per GPU-hour)", **r[f"usd_{g}"], step=0.25, format="%.2f",
                             help=f"Default {price_note(g)} ({table_path().name})." if why is None else plain(why),
                             **state.bind(f"usd_{g}"))
            if why is not None:  # the table cannot be read or has no row for g: say so, search at the input's price
                col.warning(plain(why[0].upper() + why[1:]), icon=":material/warning:")
    state.publish([*sps, *ps])

    if not (gpus and precs and tps and pols):
        st.warning("Pick at least one GPU, precision, TP degree and policy.", icon=":material/info:")
        return
    slo, problem = planning.slo_from_state(names)
    if slo is None:
        st.error(f"**These SLOs cannot be searched:** {plain(problem)}.", icon=":material/error:")
        return
    items = [f"{KNOB_INPUTS[key][0]}={str(state.value(key)).strip()}" for key in KNOB_INPUTS
             if str(state.value(key, "")).strip()]
    try:
        grid = Grid(tuple(gpus), tuple(precs), tuple(tps), tuple(pols), parse_knobs(items),
                    serving if serving in SERVING else "both", min(base.deployment.node.num_gpus, GPUS_PER_NODE))
        grid.validate()
    except ValueError as exc:
        st.error(f"**This grid cannot be searched:** {plain(exc)}", icon=":material/error:")
        return
    if base.deployment.node.cross_node and base.deployment.node.tp not in tps:
        st.caption(f"The sidebar's TP {base.deployment.node.tp} over two nodes is searched only with "
                   f"{base.deployment.node.tp} among the Tensor parallel degrees above (nodes of {GPUS_PER_NODE} "
                   "GPUs).")
    target = float(state.value("target"))
    prices = {g: float(state.value(f"usd_{g}")) for g in gpus}
    router = base.router  # the sidebar's: the fleet check of the top configurations runs behind it
    inputs = (cache.scenario_token(base), slo, target, tuple(sorted(prices.items())), grid, router)
    size = grid.size()
    where = (f"on the Ray cluster ({plain(RAY_ADDRESS)})" if RAY_ADDRESS and size >= RAY_MIN_CONFIGS else
             "on this server")
    st.caption(f"{size:,} configurations; each fitting one runs a capacity search (about 7 simulations, fewer "
               f"with warm starts and pruning) {where}; then the cheapest few run as a fleet behind the "
               f"sidebar's router ({plain(router)}) at the target.")
    key = ("deployment_search",) + inputs
    found = cache.peek(key)  # the same search by any session: answered from the cache
    auto = size <= AUTO_MAX_CONFIGS
    pressed = st.button("Search", type="primary", icon=":material/search:",
                        help=None if auto else f"More than {AUTO_MAX_CONFIGS} configurations: the search waits for "
                                              "this button.")
    if found is None and (pressed or auto):
        found = widgets.guarded(lambda: _run(base, slo, target, prices, grid, router), "The search")
        if found is not None:
            cache.small_cached(key, lambda: found, len(json.dumps(found, default=str)) + 1024)
    if found is not None:
        st.session_state[LAST] = (inputs, found, slo.describe(names))
    last = st.session_state.get(LAST)
    if last is None:
        st.info("Press **Search** to rank the configurations.", icon=":material/search:")
        return
    if last[0] != inputs:
        st.caption("The inputs changed since this search: press **Search** to run it again.")
    _results(last[1], last[2])


def _results(res: dict, slo_text: str) -> None:
    target = res["target_rate_req_s"]
    tail = res.get("tail", "P99")  # the percentile the attainment target reads
    ok = [c for c in res["configs"] if c["meets_slo"]]
    st.subheader(f"Ranked by cost: {plain(slo_text)}", divider="gray")
    st.caption(f"Searched {res['searched']} of {res['grid_size']} configurations ({len(res['skipped'])} skipped, "
               f"{len(res['pruned'])} pruned, {len(res['failed'])} failed) with {res['simulations']:,} simulations "
               f"in {res['seconds']:,.1f} s ({plain(res['backend'])}).")
    if not ok:
        st.warning("No configuration meets these SLOs; see why below.", icon=":material/warning:")
    else:
        labels = [c["label"] for c in ok]
        pick = st.selectbox("Chosen configuration", range(len(ok)), format_func=lambda i: f"{i + 1}. {labels[i]}",
                            key="search_chosen", help="The cheapest by default; the chart marks it.")
        pick = pick if pick is not None and pick < len(ok) else 0
        best = ok[pick]
        st.info(f"**{plain(best['label'])}**: {plain(chosen_sentence(best, target, res['headroom'], tail))}",
                icon=":material/dns:")
        if best.get("split") is None:
            st.page_link(nav.EXPLORE.path, label=f"Open {best['label']} on Explore", icon=":material/open_in_new:",
                         query_params=explore_link_params(best))
        else:
            st.caption("A prefill/decode split: set its split in the sidebar's disaggregation inputs to open it on "
                       "Explore.")
        if not best.get("calibrated", True):
            st.warning(f"**Not calibrated:** {plain(best['calibration_note'])}.", icon=":material/science:")
        launch_expander(best.get("launch"))
        # numbers as numbers, units in the headers (no "$" or "%" in a cell): the table's own CSV download, the
        # page's CSV and `report --page search` hold the same values (report.search_frame)
        cfg = {"Rate per copy (req/s)": st.column_config.NumberColumn(format="%.3g"),
               "$ per M output tokens": st.column_config.NumberColumn(format="%.3f"),
               "Margin (% of capacity used)": st.column_config.NumberColumn(
                   format="%.0f", help="The target / the capacity of the fleet deployed: the share of it the "
                                       "target uses."),
               "$ per M output tokens at capacity": st.column_config.NumberColumn(
                   format="%.3f", help="One copy at its highest rate within the SLOs, no headroom."),
               "Output tok/s per GPU": st.column_config.NumberColumn(format="%.0f", help="At that rate."),
               f"{tail} TTFT (s)": st.column_config.NumberColumn(format="%.3f"),
               f"{tail} TPOT (ms)": st.column_config.NumberColumn(format="%.1f")}
        st.dataframe(report.search_frame(ok, target, tail), column_config=cfg, hide_index=True, width="stretch")
        if res.get("rounding_note"):
            st.warning(plain(res["rounding_note"]), icon=":material/calculate:")
        st.caption(f"{router_note(res.get('router', 'least-outstanding'), res.get('fleet_top', 3))} {COST_NOTE} "
                   f"{LATENCY_NOTE} {MARGIN_NOTE} {plain(res.get('headroom_note') or '')} The binding SLO is the one "
                   "most requests miss at the first rate that fails.")
        bests = [(k, b) for key, k in (("best_by_gpu", "gpu"), ("best_by_serving", "serving"))
                 if len(res.get(key) or []) > 1 for b in res[key]]
        if bests:
            st.caption("Best of each: " + "; ".join(
                f"{plain(b[k])}: " + (f"#{b['rank']} {plain(b['label'])}" if b["label"] else "none")
                + (f" ({plain(b['why_not_best'])})" if b["why_not_best"] else " (the answer)") for k, b in bests)
                + ".")
        notes = [f"{plain(c['label'])}: {plain(c['fleet_note'])}" for c in ok if c.get("fleet_note")]
        if notes:
            st.caption("Fleet check: " + "; ".join(notes) + ".")
        uncal: dict[str, list[str]] = {}
        for c in ok:
            if not c.get("calibrated", True):
                uncal.setdefault(c["calibration_note"], []).append(c["label"])
        for why, labels in uncal.items():
            st.caption(f"Not calibrated ({len(labels)} row{'s' if len(labels) != 1 else ''}: "
                       f"{plain(', '.join(labels[:3]))}{', ...' if len(labels) > 3 else ''}): {plain(why)}.")
        widgets.chart(pareto_chart(res["configs"], pick, res.get("slo"), target), "Each point is a configuration at "
                      "its highest rate within the SLOs: lower is cheaper, further left is faster. Coloured points "
                      "are the Pareto front: none is beaten on cost, P99 TTFT, P99 TPOT and the fleet's capacity at once.",
                      charts.slug("search", "pareto"), scenario_line=configs_caption(res["configs"], scenario))
    with st.expander(f"Why not the others ({len(res['skipped'])} skipped, {len(res['pruned'])} pruned, "
                     f"{len(res['failed'])} failed)", expanded=not ok):
        why = report.left_out_frame(res)
        if len(why):
            st.dataframe(why, hide_index=True, width="stretch")
        else:
            st.caption("Every configuration was searched.")
    downloads.export_buttons(report.search_export(res, scenario, pick if ok else None), "search")  # CSV JSON HTML PNG SVG


if scenario is None:
    st.stop()
search_view(scenario)
