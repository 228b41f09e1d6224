"""Capacity planning: the highest request rate one node sustains with every class within its SLOs, per policy; the
nodes a target traffic needs and what a million output tokens cost (``studies.pricing.price``, at the GPU's default
price from the price table unless the user enters one)."""
import pandas as pd
import streamlit as st

from batching.ui.launch import launch_expander
from batching.charts import policy as charts

from batching import report
from batching.charts import disagg as dis_charts
from batching.charts import planning as cp
from batching.charts.export import scenario_caption
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.studies.capacity import (ATTAINMENT_DEFAULT, HEADROOM_LIMITS, HEADROOM_RANGE, TPOT_UNDERESTIMATE,
                                       class_names, default_price_note, gpu_name, headroom_note,
                                       own_profile, rate_unit, tail_key, tail_label)
from batching.studies.capacity import page_price as default_page_price
from batching.sim.hardware.specs import DEFAULT_GPU, GPUS_PER_NODE
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies import disagg_capacity as dc
from batching.studies.planning import CapacityPlan, plan_capacity
from batching.ui import cache, nav, page, planning, spec_price, state, widgets
from batching.ui.params import Param
from batching.ui.safe import plain
from batching.ui import downloads

LAST = "capacity_last"
LAST_POLICIES = "capacity_last_policies"  # session: the policies of the last plan (the presets, speculating as asked)
SPLIT_LAST = "capacity_split_last"  # session: the last aggregated-vs-disaggregated comparison that ran
POLICIES = "policies"
VIEW, SPLIT_POLICY = "cap_view", "split_policy"
# the page's two views: capacity per policy, or aggregated against disaggregated serving on the same GPUs
VIEWS = {"policies": "Per policy", "disagg": "Aggregated vs disaggregated"}
SPLIT_POLICIES = tuple(n for n, p in PRESETS.items() if dc.skip_reason(p) is None)  # iteration-level presets
MAX_QUOTED = 40  # characters of unknown policy names a notice quotes
COLUMNS = {  # CapacityResult field -> (header with unit, tooltip, format)
    "max_concurrency": ("Clients within the SLOs", "Closed-loop arrivals: the highest number of clients (each sending "
                        "its next request when its previous one completes) whose requests meet the SLOs; one more "
                        "client was simulated and does not.", "%d"),
    "max_rate_req_s": ("Rate per node (req/s)", "The highest request rate one node sustains with the attainment "
                       "target met: bracketing, then bisecting on the rate (same requests, arrivals rescaled).",
                       "%.3g"),
    "steady_output_tok_s": ("Steady throughput (output tok/s)", "Output tokens per second the node serves at that "
                            "rate while requests arrive (the drain after the last arrival not counted): the rate × "
                            "mean output tokens that the $ per M tokens uses.", "%.0f"),
    "goodput_req_s": ("Goodput (req/s)", "Requests per second that meet every SLO at that rate, while requests "
                      "arrive (the drain not counted): the rate × the share within the SLOs.", "%.3g"),
    "binding_slo": ("Binding SLO", "The SLO the binding class's requests miss most at the first rate that fails: "
                    "the one to relax for more traffic; none when every class met its SLOs up to the node's "
                    "capacity.", None),
    "binding_class": ("Binding class", "The priority class furthest below the attainment target at the first rate "
                      "that fails: every class must meet its own SLOs (shown when the workload has several "
                      "classes).", None),
    "nodes_needed": ("Nodes needed", "Nodes to serve the target traffic: target × headroom / rate per node, "
                     "rounded up.", "%d"),
    "usd_per_million_output_tokens": ("$ per M output tokens at target", "The fleet's $ per hour (nodes × GPUs × "
                                      "$/GPU-hour) / the output tokens the target traffic brings per hour (target "
                                      "req/s × mean output tokens × 3,600), per million.", "$%.3f"),
    "usd_per_million_output_tokens_at_capacity": ("$ per M output tokens at capacity", "One node at its rate per "
                                                  "node, no headroom: the floor the price nears as traffic fills "
                                                  "whole nodes.", "$%.3f"),
    "margin": ("Margin (% of capacity used)", "The target / the capacity of the nodes needed (each at its rate per "
               "node): the share of the fleet's capacity the target uses; the rest is room to grow (the headroom "
               "included).", "%.0f %%"),
    "output_tok_s_per_gpu": ("Output tok/s per GPU", "Output tokens per second per GPU at the rate per node: rate × "
                             "mean output tokens / GPUs.", "%.0f"),
    "rates_tried": ("Rates simulated", "Request rates the search simulated (one run each).", "%d"),
}

scenario = page.setup(
    nav.CAPACITY,
    "How much traffic one node serves within your SLOs, per batching policy, on the sidebar's model, hardware and "
    "workload (its request rate, or with closed-loop clients their number, is what the search varies): nodes "
    "needed for a target and cost per token.")


USD_GPU = "capacity_usd_gpu"  # session: the GPU whose price the price input holds


def gpus_text(node) -> str:
    """How many GPUs a priced unit has, in words: a node's, or a TP 16 replica's two nodes."""
    if node.cross_node:
        return f"a TP {node.tp} replica spans two nodes, {node.num_gpus} of them"
    return f"a node has {node.num_gpus} of them"


def page_price(base: Scenario) -> float:
    """The price input's default: the sidebar GPU's row of the price table (a custom GPU: the default GPU's; a price
    table that cannot be read or lacks the GPU: the shipped table's, with a note to enter its own)."""
    return default_page_price(base, DEFAULT_GPU)[0]


def params(base: Scenario) -> list[Param]:
    """The target, the price (its default follows the sidebar's GPU), the headroom and the policies (the SLO inputs
    are ``planning.slo_params``, shared with Tune a knob)."""
    low, high = HEADROOM_LIMITS
    return [
        Param("target", 20.0, 0.01, 1_000_000.0, label="target traffic (req/s)"),
        Param("usd", page_price(base), 0.01, 1000.0, label="price per GPU-hour ($)"),
        Param("headroom", DEFAULT_HEADROOM, low, high, label="headroom factor"),
        Param(POLICIES, ",".join(PRESETS), label="policies"),
    ]


def follow_gpu(base: Scenario) -> None:
    """A changed sidebar GPU gets its own default price: the price input keeps a price only for the GPU it was
    set for (a link's price holds for the link's GPU)."""
    gpu = gpu_name(base) or base.deployment.node.gpu.name
    before = st.session_state.get(USD_GPU)
    if before is not None and before != gpu:
        state.set_value("usd", page_price(base))
    st.session_state[USD_GPU] = gpu


HEADROOM_HELP = (f"The cost model's known error: in the end-to-end check (docs/CALIBRATION.md) its TPOT is "
                 f"{TPOT_UNDERESTIMATE[0] * 100:.0f}–{TPOT_UNDERESTIMATE[1] * 100:.0f} % below published vLLM and "
                 f"SGLang runs, so a real node sustains about that much less: a factor of {HEADROOM_RANGE[0]:g}–"
                 f"{HEADROOM_RANGE[1]:g} (default {DEFAULT_HEADROOM:g}, inside that range). Nodes needed and $ per "
                 "million tokens at the target are multiplied by it; 1 = the simulator's own figures.")


def _chosen() -> list[str]:
    """The policies in the store, in preset order. Unknown names from a link are dropped with a notice
    (quoting at most the start of them) and the store keeps only the known ones."""
    text = str(state.value(POLICIES, ""))
    raw = [p.strip() for p in text.split(",") if p.strip()]
    chosen = [p for p in PRESETS if p in raw]
    unknown = [p for p in raw if p not in PRESETS]
    if unknown:
        quoted = ", ".join(unknown)
        if len(quoted) > MAX_QUOTED:
            quoted = f"{quoted[:MAX_QUOTED]}... ({len(quoted):,} characters)"
        verb = "is not a preset" if len(unknown) == 1 else "are not presets"
        st.warning(f"Link value policies: {plain(quoted)} {verb} (allowed {', '.join(PRESETS)}); left out.",
                   icon=":material/link:")
        state.set_value(POLICIES, ",".join(chosen))
    return chosen


def _policies_changed() -> None:
    state.set_value(POLICIES, ",".join(p for p in PRESETS if p in st.session_state[state.widget_key(POLICIES)]))
    state.clear_notices()


def view_params() -> list[Param]:
    """The view and the policy of the aggregated-vs-disaggregated view."""
    return [Param(VIEW, "policies", choices=tuple(VIEWS), label="view"),
            Param(SPLIT_POLICY, dc.DEFAULT_POLICY, choices=SPLIT_POLICIES,
                  label="policy (aggregated vs disaggregated)")]


@st.fragment
def plan_view(base: Scenario) -> None:
    names = widgets.guarded(lambda: class_names(base), "The workload's classes")
    if names is None:
        return
    vps = view_params()
    state.load_with_notices(vps)
    st.radio("View", list(VIEWS), format_func=VIEWS.get, horizontal=True,
             help="Per policy: the rate each batching policy sustains within the SLOs, nodes and cost. Aggregated "
                  "vs disaggregated: the same GPUs serving every phase together or split into prefill and decode "
                  "instances, each configuration's rate within the SLOs side by side.", **state.bind(VIEW))
    if state.value(VIEW) == "disagg":
        split_view(base, names, vps)
        return
    sps = planning.load_slo_params(names)
    ps = params(base)
    state.load_with_notices(ps)
    xps = spec_price.params()
    state.load_with_notices(xps)
    follow_gpu(base)
    r = {p.key: p.widget_range() for p in ps if p.key != POLICIES}
    st.subheader("Service-level objectives and the plan", divider="gray")
    st.caption("Each target takes one value for every class, or one per class separated by commas, class 0 (the "
               "highest priority) first: " + "; ".join(f"{i} = {plain(n)}" for i, n in enumerate(names)) +
               ". A request meets the SLOs of its own class. The same SLOs constrain the knee on Tune a knob.")
    planning.slo_inputs(names)
    c = st.columns(3, gap="medium")
    c[0].number_input("Target traffic (req/s)", **r["target"], step=5.0, format="%.4g",
                      help="The total traffic to plan for: the nodes needed are target × headroom / rate per node.",
                      **state.bind("target"))
    c[1].number_input("Price ($ per GPU-hour)", **r["usd"], step=0.25, format="%.2f",
                      help=f"What one GPU costs per hour; {gpus_text(base.deployment.node)}. "
                           f"Default: {default_price_note(base)}; another GPU in the sidebar brings its own.",
                      **state.bind("usd"))
    why = default_page_price(base, DEFAULT_GPU)[1]
    if why is not None and gpu_name(base) is not None:  # the table is broken or lacks this GPU: say so, go on
        c[1].warning(plain(why[0].upper() + why[1:]), icon=":material/warning:")
    c[2].number_input("Headroom factor", **r["headroom"], step=0.05, format="%.2f", help=HEADROOM_HELP,
                      **state.bind("headroom"))
    chosen = _chosen()
    st.session_state[state.widget_key(POLICIES)] = chosen
    st.multiselect("Policies", list(PRESETS), key=state.widget_key(POLICIES), on_change=_policies_changed,
                   help="The presets to plan with; each one's search runs about 7 simulations.")
    spec_price.controls(st.columns(3, gap="medium"))  # speculation priced through the same search (issue 39 item 4)
    state.publish([*sps, *ps, *vps, *xps])
    spec = spec_price.Speculation.from_state()
    pols = widgets.guarded(lambda: {n: spec.apply(PRESETS[n], base) for n in chosen}, "Speculative decoding")
    if pols is None:
        return
    # a disaggregated scenario runs iteration-level batching only: the others are skipped, with one caption
    chosen = list(cache.runnable_policies(base, pols))

    if not chosen:
        st.warning("Pick at least one policy to plan with." if base.disagg is None else
                   "Pick at least one policy with iteration-level batching (continuous, chunked, priority) to plan "
                   "with on this disaggregated scenario.", icon=":material/info:")
        return
    slo, problem = planning.slo_from_state(names)
    if slo is None:
        st.error(f"**These SLOs cannot be searched:** {plain(problem)}. Set the TTFT, TPOT or E2E SLO above 0: one "
                 "value, or one per class.", icon=":material/error:")
        return
    target, usd = float(state.value("target")), float(state.value("usd"))
    headroom = float(state.value("headroom"))
    tasks = [(name, lambda name=name: planning.capacity_cached(base.with_policy(pols[name]), slo))
             for name in chosen]
    found = widgets.guarded(lambda: cache.run_with_progress(tasks, "Searching for the highest rate within the "
                                                                   "SLOs"), "The capacity search")
    if found is None:
        plan = st.session_state.get(LAST)
        if plan is None:
            return
        st.caption("Showing the last plan that ran.")
    else:
        plan = plan_capacity(base, slo, dict(zip(chosen, found)), target, usd, headroom)
        st.session_state[LAST] = plan
        st.session_state[LAST_POLICIES] = {n: pols[n] for n in chosen}
    _results(plan)


def _columns(plan: CapacityPlan) -> dict:
    """COLUMNS, without the binding class when the workload has one class; a replica over two nodes is what its rate
    is per (its nodes still count 8-GPU nodes, two per replica)."""
    several = len(class_names(plan.scenario)) > 1
    closed = getattr(plan.scenario.workload, "concurrency", None) is not None  # the sidebar's closed-loop clients
    cols = {k: v for k, v in COLUMNS.items()
            if (several or k != "binding_class") and (closed or k != "max_concurrency")}
    unit = rate_unit(plan.scenario)
    if unit != "node":
        _, tip, fmt = cols["max_rate_req_s"]
        cols["max_rate_req_s"] = (f"Rate per {unit} (req/s)", tip.replace("one node", f"one {unit}"), fmt)
        _, tip, fmt = cols["nodes_needed"]
        n = plan.scenario.deployment.node.physical_nodes
        cols["nodes_needed"] = ("Nodes needed", f"{GPUS_PER_NODE}-GPU nodes to serve the target traffic: "
                                f"⌈target × headroom / rate per replica⌉ replicas × {n} nodes.", fmt)
    return cols


def _frame(plan: CapacityPlan) -> pd.DataFrame:
    rows = {}
    for name, result in plan.results.items():
        row = {}
        for key, (header, _, _) in _columns(plan).items():
            v = getattr(result, key)
            if key == "binding_slo":
                v = cp.binding_text(v)
            elif key == "binding_class":
                v = v if v is not None else "none (node at capacity)"
            elif v is None:
                v = float("nan")
            elif key == "margin":
                v = 100 * v
            row[header] = v
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def _plan_policies(plan: CapacityPlan) -> dict:
    """The policies the plan searched: the presets, speculating as the control asked when it ran."""
    last = st.session_state.get(LAST_POLICIES) or {}
    return {n: last.get(n, PRESETS.get(n)) for n in plan.results if n in last or n in PRESETS}


# per-class table: by_priority key -> (header, factor, format, tooltip)
CLASS_COLUMNS = {
    "attainment": ("Attainment (%)", 100, "%.1f", "Share of the class's requests that meet its SLOs."),
    "goodput_req_s": ("Goodput (req/s)", 1, "%.3g", "The class's requests per second that meet its SLOs, while "
                      "requests arrive (the drain not counted)."),
    "ttft_p50_s": ("TTFT P50 (s)", 1, "%.3f", "Median time to first token of the class, queueing included."),
    "ttft_p99_s": ("TTFT P99 (s)", 1, "%.3f", "99th percentile time to first token of the class."),
    "tpot_p50_s": ("TPOT P50 (ms)", 1e3, "%.1f", "Median time per output token of the class."),
    "tpot_p99_s": ("TPOT P99 (ms)", 1e3, "%.1f", "99th percentile time per output token of the class."),
}


def _slo_cell(targets: dict) -> str:
    parts = []
    for name, v in targets.items():
        label = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}[name]
        parts.append(f"{label} ≤ {v * 1e3:,.0f} ms" if name != "e2e_s" and v < 10 else f"{label} ≤ {v:,.3g} s")
    return ", ".join(parts)


def class_columns(attainment: float) -> dict:
    """CLASS_COLUMNS with the tail at the percentile the attainment target reads (P90 for 0.9; P99 by default)."""
    if attainment == ATTAINMENT_DEFAULT:
        return CLASS_COLUMNS
    tail = tail_label(attainment)
    out = {}
    for key, (header, factor, fmt, tip) in CLASS_COLUMNS.items():
        if key.endswith("_p99_s"):
            key, header = tail_key(key[:4], attainment), header.replace("P99", tail)
            tip = tip.replace("99th percentile", f"{tail} ({attainment * 100:.4g}th percentile)")
        out[key] = (header, factor, fmt, tip)
    return out


def class_frame(plan: CapacityPlan) -> pd.DataFrame:
    """One row per policy and class: the rate read, the class's SLOs, attainment, goodput, TTFT and TPOT (the tail
    at the attainment target's percentile: ``class_columns``)."""
    rows = []
    for name, result in plan.results.items():
        rate = result.max_rate_req_s if result.max_rate_req_s > 0 else float(result.points["rate_req_s"].min())
        for cls in result.by_priority.values():
            row = {"Policy": name, "Class": cls["class_name"], "At rate (req/s)": rate, "SLOs": _slo_cell(cls["slo"]),
                   "Within its SLOs": "yes" if cls.get("meets_slo") else "no"}
            for key, (header, factor, _, _) in class_columns(plan.slo.attainment).items():
                row[header] = cls[key] * factor
            rows.append(row)
    return pd.DataFrame(rows)


def _results(plan: CapacityPlan) -> None:
    slo, target, usd, base = plan.slo, plan.target_rate_req_s, plan.gpu_hour_usd, plan.scenario
    names = class_names(base)
    slo_text = slo.describe(names)
    st.subheader(f"Per policy: {plain(slo_text)}", divider="gray")
    if getattr(base.workload, "concurrency", None) is not None:
        st.info("The highest concurrency within the SLOs (closed-loop clients" + (
            f", think {base.workload.think_time_s:g} s" if base.workload.think_time_s else "") + "): " + "; ".join(
            f"{plain(n)} {r.max_concurrency:,} client{'s' if r.max_concurrency != 1 else ''} ({r.max_rate_req_s:,.3g} "
            "req/s)" for n, r in plan.results.items()) + ". Rate per node is the requests per second those clients "
            "send.", icon=":material/group:")
    sentence = plan.verdict()
    if sentence:
        st.info(sentence, icon=":material/dns:")
    failed = plan.failed()
    if failed:
        binding = {cp.binding_text(plan.results[n].binding_slo) for n in failed}
        st.warning(f"{', '.join(failed)}: no rate tried meets these SLOs, even the lowest; relax the "
                   f"{' or '.join(sorted(binding))} SLO or lower the attainment target.", icon=":material/warning:")
    df = _frame(plan)
    columns = _columns(plan)
    config = {"_index": st.column_config.TextColumn("Policy", help="Batching policy preset")}
    for key, (header, tip, fmt) in columns.items():
        if key in ("nodes_needed", "usd_per_million_output_tokens", "usd_per_million_output_tokens_at_capacity"):
            # text cells: a policy that meets no rate has no nodes and no cost, shown as "–", never None
            if header in df:
                df[header] = [fmt % v if pd.notna(v) else "–" for v in df[header]]
            header_shown = f"Nodes for {target:,.4g} req/s" if key == "nodes_needed" else header
            config[header] = st.column_config.TextColumn(header_shown, help=tip + " – : no rate met the SLOs.")
        elif fmt is None:
            config[header] = st.column_config.TextColumn(header, help=tip)
        else:
            config[header] = st.column_config.NumberColumn(header, help=tip, format=fmt)
    st.dataframe(df, column_config=config, width="stretch")
    policies = _plan_policies(plan)
    spec_line = spec_price.Speculation.caption(policies)
    if spec_line:
        st.caption(plain(spec_line))
    launch_expander({n: base.with_policy(p) for n, p in policies.items()})
    room = f" {headroom_note(plan.headroom, own_profile(base))} The rate per node is the simulator's own."
    where = report.price_source(plan)
    start, why = default_page_price(base, DEFAULT_GPU)
    if why is not None:  # a custom GPU, or a price table that cannot be read or has no row for the GPU
        where = f" ({why})" if usd == start else f" (the price entered; {why})"
    else:
        where = f" ({where[len('default: '):]})" if where.startswith("default: ") else " (the price entered)"
    mean_out = next(iter(plan.results.values())).mean_output_tokens
    node = base.deployment.node
    st.caption(f"One row per policy. Rate per {rate_unit(base)}: the highest rate at which "
               f"{slo.attainment * 100:.3g} % of each class's requests meet that class's SLOs; cost at ${usd:,.2f} per "
               f"GPU-hour{plain(where)} × {node.num_gpus // node.physical_nodes} GPUs per node × the nodes, over "
               f"{target:,.4g} req/s × {mean_out:,.1f} mean output tokens per request.{room} Hover a header for its "
               "definition.")
    per_class = class_frame(plan)
    if len(names) > 1:
        st.markdown("**Per class at each policy's rate**")
        cfg = {h: st.column_config.NumberColumn(h, help=tip, format=fmt)
               for h, _, fmt, tip in class_columns(slo.attainment).values()}
        cfg["At rate (req/s)"] = st.column_config.NumberColumn("At rate (req/s)", format="%.3g",
                                                               help="The policy's rate per node (or, when no rate "
                                                                    "met the SLOs, the lowest rate tried).")
        st.dataframe(per_class, column_config=cfg, width="stretch", hide_index=True)
        st.caption(f"Attainment and {tail_label(slo.attainment)} TTFT and TPOT of each class at the rate in the table "
                   f"above, against that class's own SLOs: a rate counts only if every class has {slo.attainment * 100:.3g} % of its "
                   "requests within them; the binding class is the one that falls short first.")

    name = charts.slug("capacity", report.scenario_slug(base, rate=False))
    line = scenario_caption(base, rate="rate searched")  # as the exported figures say (report --page capacity)
    drawn = (base, slo, tuple(plan.results), plan.headroom, tuple(policies.values()))
    bars = _figure("bars", (*drawn, target, usd), lambda: report.capacity_bars(plan))
    widgets.chart(bars, "Left: requests per second one node sustains with every class within its SLOs (higher is "
                  "better). Middle: nodes for the target traffic. Right: dollars per million output tokens at the "
                  f"target traffic (lower is better); both with the {plan.headroom:g}× headroom.", f"{name}_bars",
                  scenario_line=line)
    # the same searches draw the same curves: a target, price or headroom move keeps this chart as it was
    curves = _figure("goodput", drawn, lambda: cp.goodput_curves(plan.points(), plan.max_rates(), slo.attainment))
    widgets.chart(curves, "Top: requests per second within every SLO while requests arrive (the drain after the "
                  "last arrival not counted), against the rate asked: the run's own arrival rate × its share within "
                  "the SLOs, so it lies on the dashed diagonal (every request within them) up to the chance "
                  "difference between a finite run's arrival rate and the rate asked, and falls below it as the "
                  "SLOs start to fail. Bottom: the worst class's share of its requests "
                  "within its own SLOs; each policy's dotted line is where it last stays above the dashed target.",
                  f"{name}_goodput",
                  scenario_line=line)

    link = state.current_link()
    points = pd.concat([p.assign(policy=n) for n, p in plan.points().items()], ignore_index=True)
    points = points[["policy", *[c for c in points.columns if c != "policy"]]]

    def _json() -> bytes:  # the same document as `report --page capacity` writes
        return report.capacity_json(plan)

    def _html() -> str:
        shown = df.copy()
        shown.columns = [f"Nodes for {target:,.4g} req/s" if c == COLUMNS["nodes_needed"][0] else c
                         for c in shown.columns]
        tables = [("Per policy", shown)]
        if len(names) > 1:
            tables.append(("Per class at each policy's rate", per_class.round(4)))
        return report.html_report(f"Capacity planning: {slo_text}", base,
                                  figures=[(bars, "Rate per node, nodes needed and cost per policy."),
                                           (curves, "Goodput (requests within every SLO per second "
                                                    "while requests arrive, the drain not counted) and SLO "
                                                    "attainment against the request rate.")],
                                  tables=tables, policies=policies,
                                  verdict=sentence, link=link, rate="rate searched")

    table_csv = df.rename_axis("policy").reset_index()
    planning.download_row(name, [
        ("Plan (CSV)", lambda: table_csv.to_csv(index=False).encode(), "plan.csv", "text/csv",
         "One row per policy: rate per node, steady throughput, goodput, binding SLO, nodes, $ per M tokens."),
        ("Rates tried (CSV)", lambda: points.to_csv(index=False).encode(), "rates.csv", "text/csv",
         "Every rate each search simulated: attainment, goodput, steady throughput, P99 TTFT and TPOT."),
        ("Plan (JSON)", _json, "plan.json", "application/json",
         "The SLOs, target, price, headroom, each policy's result (per class too) and every rate tried, with the "
         "scenario."),
        ("Report (HTML)", _html, "report.html", "text/html",
         "A standalone page with the scenario, the tables and the charts; opens offline."),
    ], link, figures=lambda: {f"{name}_bars": bars, f"{name}_goodput": curves})  # + PNG and SVG (issue 24)

# ---------------------------------------------------------------- aggregated vs disaggregated (issue 13 §2)

SPLIT_COLUMNS = {  # frame column -> (header with unit, tooltip, factor, format)
    "gpus": ("GPUs", "GPUs the configuration runs on (aggregated: replicas × TP; a split: prefill + decode "
             "instances × their TP).", 1, "%d"),
    "capacity_req_s": ("Capacity (req/s)", "The highest request rate at which the attainment target of requests "
                       "meet the SLOs and the queues keep up (the same search as the per-policy view).", 1, "%.3g"),
    "copies_per_node": ("Copies per node", "Copies of the configuration one node holds (an aggregated node: 1; a "
                        "split: the node's GPUs // its GPUs), as the deployment search counts them.", 1, "%d"),
    "req_s_per_node": ("req/s per node", "Capacity × copies per node: what a node carries, the ranking (nodes are "
                       "what a deployment buys; a split that leaves GPUs idle pays for them).", 1, "%.3g"),
    "req_s_per_gpu": ("req/s per GPU", "Capacity / the GPUs the configuration runs on.", 1, "%.3g"),
    "binding_slo": ("Binding SLO", "The SLO most requests miss at the first rate that fails: TTFT binds where "
                    "prefill is short of GPUs, TPOT where decodes wait behind prompts; none: the node's capacity "
                    "binds.", None, None),
    "ttft_p99_s": ("P99 TTFT (s)", "99th percentile time to first token at that rate (the lowest rate tried when "
                   "none met the SLOs).", 1, "%.3f"),
    "tpot_p99_s": ("P99 TPOT (ms)", "99th percentile time per output token at that rate; with a split it "
                   "includes the KV transfer and the wait for a decode slot.", 1e3, "%.1f"),
}


def split_view(base: Scenario, names: tuple[str, ...], vps: list[Param]) -> None:
    """The scenario served aggregated and split into prefill and decode instances: capacity within the SLOs of
    each, side by side."""
    sps = planning.load_slo_params(names)
    st.subheader("Aggregated or disaggregated, within your SLOs", divider="gray")
    gpus = base.deployment.node.num_gpus
    st.caption(f"The sidebar's model, hardware and workload served two ways on the same GPUs: aggregated (every "
               f"replica prefills and decodes; the sidebar's TP and every other TP that divides the node) and "
               f"disaggregated (prefill instances hand each prompt's KV cache to decode instances): the sidebar's "
               f"split if it has one, and every split of the node's {gpus} GPUs that Find a deployment enumerates "
               "and that fits the model. Each configuration's highest rate within the SLOs is searched as in the "
               "per-policy view; they are ranked by requests/s per node, as Find a deployment ranks them. The SLOs "
               "are the page's (shared with Tune a knob).")
    planning.slo_inputs(names)
    st.selectbox("Policy", list(SPLIT_POLICIES), help="The batching policy every configuration runs: iteration-level "
                 "presets only (static and dynamic batching run each batch as a whole; disaggregation needs "
                 "iteration-level batching). Chunked prefill is the default.", **state.bind(SPLIT_POLICY))
    state.publish([*sps, *vps])
    slo, problem = planning.slo_from_state(names)
    if slo is None:
        st.error(f"**These SLOs cannot be searched:** {plain(problem)}. Set the TTFT, TPOT or E2E SLO above 0: one "
                 "value, or one per class.", icon=":material/error:")
        return
    policy = PRESETS[str(state.value(SPLIT_POLICY))]
    study = widgets.guarded(lambda: planning.split_capacity_cached(base, slo, policy),
                            "The aggregated vs disaggregated search")
    if study is not None:
        st.session_state[SPLIT_LAST] = (base, study)
    elif SPLIT_LAST in st.session_state:
        st.caption("Showing the last comparison that ran.")
    else:
        return
    _split_results(*st.session_state[SPLIT_LAST])


def split_frame(study: dc.SplitCapacity, base: Scenario) -> pd.DataFrame:
    """The table as shown: one row per configuration, the sidebar's own split marked."""
    f = study.frame
    own = dc.split_label(base.disagg) if base.disagg is not None else None
    out = pd.DataFrame({"Configuration": [c + (" (sidebar)" if c == own else "") for c in f["configuration"]]})
    for key, (header, _, factor, _) in SPLIT_COLUMNS.items():
        out[header] = [cp.binding_text(v if isinstance(v, str) else None) for v in f[key]] if factor is None \
            else f[key].to_numpy() * factor
    return out


def _refusal(why: str) -> str:
    """A configuration's refusal without the role it names ('the prefill instances (TP 1): model ... does not fit'
    -> 'TP 1: model ... does not fit'), so the splits one cause refuses share a line."""
    for role in ("the prefill instances ", "the decode instances "):
        if why.startswith(role):
            return why[len(role):].lstrip("(").replace(")", "", 1)
    return why


def _split_results(base: Scenario, study: dc.SplitCapacity) -> None:
    names = class_names(base)
    slo_text = study.slo.describe(names)
    pol = next((n for n, p in PRESETS.items() if p == study.policy.unsized()), study.policy.describe())
    st.subheader(f"Aggregated vs disaggregated: {plain(slo_text)}", divider="gray")
    sentence = study.verdict()
    st.info(plain(sentence), icon=":material/call_split:")
    df = split_frame(study, base)
    config = {"Configuration": st.column_config.TextColumn("Configuration", help="Aggregated: the sidebar's TP "
                                                           "first, then every other TP that divides the node, "
                                                           "replicas filling it. A split: prefill instances × TP + "
                                                           "decode instances × TP.")}
    for key, (header, tip, _, fmt) in SPLIT_COLUMNS.items():
        config[header] = st.column_config.TextColumn(header, help=tip) if fmt is None else \
            st.column_config.NumberColumn(header, help=tip, format=fmt)
    st.dataframe(df, column_config=config, width="stretch", hide_index=True)
    note = ""
    if study.failed:  # one reason, its configurations together (a model too big for TP 1 refuses many splits)
        by: dict[str, list[str]] = {}
        for k, v in study.failed.items():
            by.setdefault(_refusal(v), []).append(k)
        note = " Not run: " + "; ".join(f"{', '.join(plain(k) for k in ks)} ({plain(v)})" for v, ks in by.items()) + "."
    st.caption(f"Policy {plain(pol)} in every configuration. Capacity: the highest rate at which "
               f"{study.slo.attainment * 100:.3g} % of requests meet the SLOs of their class; P99 TTFT and TPOT are "
               "read at that rate. A split's TTFT is its prefill instance's; its TPOT includes the KV transfer and "
               "the wait for a decode slot." + note)
    name = charts.slug("capacity", "disagg", report.scenario_slug(base, rate=False))
    line = scenario_caption(base, rate="rate searched")
    fig = _figure("split_bars", (base, study.slo, pol, tuple(study.frame["configuration"]),
                                 tuple(study.frame["capacity_req_s"])),
                  lambda: dis_charts.split_capacity_bars(study.frame, pol))
    widgets.chart(fig, "Left: requests per second each configuration sustains within the SLOs (higher is better). "
                  "Right: the same per node (times the copies of it a node holds), the ranking. Blue: aggregated; "
                  "orange: prefill/decode splits.", f"{name}_bars",
                  scenario_line=line)
    downloads.export_buttons(report.view_export(  # issue 24 item 11: CSV, JSON, HTML, PNG and SVG
        "capacity_disagg", "Capacity: aggregated against prefill/decode splits", base, {"bars": (fig, "")}, {"disagg": df}), name)


FIGURES = "capacity_figures"  # session: kind -> (what it was drawn from, the figure), the last one per kind


def _figure(kind: str, drawn: tuple, build):
    """The chart of this kind drawn from ``drawn``: the session's last one when it was drawn from the same, else
    ``build()`` (as Tune a knob keeps its charts)."""
    memo = st.session_state.setdefault(FIGURES, {})
    hit = memo.get(kind)
    if hit is None or hit[0] != drawn:
        hit = memo[kind] = (drawn, build())
    return hit[1]


if scenario is None:
    st.stop()
plan_view(scenario)
