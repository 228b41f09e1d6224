"""Capacity planning: the highest request rate one node sustains within the SLOs, per policy; the nodes a
target traffic needs and what a million output tokens cost."""
import json

import pandas as pd
import streamlit as st

from batching.charts import policy as charts

from batching import report
from batching.charts import planning as cp
from batching.studies.capacity import SLO
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.ui import cache, page, planning, state, widgets
from batching.ui.params import Param

LAST = "capacity_last"
POLICIES = "policies"
MAX_QUOTED = 40  # characters of unknown policy names a notice quotes
COLUMNS = {  # plan key -> (header with unit, tooltip, format)
    "max_rate_req_s": ("Rate per node (req/s)", "The highest request rate one node sustains with the attainment "
                       "target met: bracketing, then bisecting on the rate (same requests, arrivals rescaled).",
                       "%.3g"),
    "throughput_output_tok_s": ("Throughput (output tok/s)", "Output tokens per second the node serves at that rate.",
                                "%.0f"),
    "goodput_req_s": ("Goodput (req/s)", "Requests per second that meet every SLO at that rate.", "%.3g"),
    "binding_slo": ("Binding SLO", "The SLO most requests miss at the first rate that fails: the one to relax for "
                    "more traffic; none when every rate tried met the SLOs, up to the node's capacity.", None),
    "nodes_needed": ("Nodes needed", "Nodes to serve the target traffic: target / rate per node, rounded up.",
                     "%d"),
    "usd_per_million_output_tokens": ("$ per M output tokens", "Node price (GPUs × $/GPU-hour) / output tokens per "
                                      "second at the sustainable rate, per million tokens.", "$%.2f"),
    "rates_tried": ("Rates simulated", "Request rates the search simulated (one run each).", "%d"),
}

scenario = page.setup(
    "Capacity planning", ":material/dns:",
    "How much traffic one node serves within your SLOs, per batching policy, on the sidebar's model, hardware and "
    "workload (its request rate is what the search varies): nodes needed for a target and cost per token.")


def params() -> list[Param]:
    return [
        Param("ttft_ms", 2000, 0, 3_600_000, label="TTFT SLO (ms)"),
        Param("tpot_ms", 100, 0, 3_600_000, label="TPOT SLO (ms)"),
        Param("e2e_s", 0.0, 0.0, 3600.0, label="E2E SLO (s)"),
        Param("attain", 99.0, 1.0, 100.0, label="attainment target (%)"),
        Param("target", 20.0, 0.01, 1_000_000.0, label="target traffic (req/s)"),
        Param("usd", 2.5, 0.01, 1000.0, label="price per GPU-hour ($)"),
        Param(POLICIES, ",".join(PRESETS), label="policies"),
    ]


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
        st.warning(f"Link value policies: {quoted} {'is not a preset' if len(unknown) == 1 else 'are not presets'} "
                   f"(allowed {', '.join(PRESETS)}); left out.", icon=":material/link:")
        state.set_value(POLICIES, ",".join(chosen))
    return chosen


def _policies_changed() -> None:
    state.set_value(POLICIES, ",".join(p for p in PRESETS if p in st.session_state[state.widget_key(POLICIES)]))
    state.clear_notices()


def _slo() -> SLO:
    v = state.value
    return SLO(ttft_s=v("ttft_ms") / 1e3 if v("ttft_ms") > 0 else None,
               tpot_s=v("tpot_ms") / 1e3 if v("tpot_ms") > 0 else None,
               e2e_s=float(v("e2e_s")) if v("e2e_s") > 0 else None,
               attainment=float(v("attain")) / 100)


def _slo_text(slo: SLO) -> str:
    parts = []
    if slo.ttft_s is not None:
        parts.append(f"TTFT ≤ {slo.ttft_s * 1e3:,.0f} ms")
    if slo.tpot_s is not None:
        parts.append(f"TPOT ≤ {slo.tpot_s * 1e3:,.0f} ms")
    if slo.e2e_s is not None:
        parts.append(f"E2E ≤ {slo.e2e_s:,.3g} s")
    return ", ".join(parts) + f" for {slo.attainment * 100:.3g} % of requests"


@st.fragment
def plan_view(base: Scenario) -> None:
    ps = params()
    state.load_with_notices(ps)
    st.subheader("Service-level objectives and the plan", divider="gray")
    c = st.columns(6, gap="medium")
    c[0].number_input("TTFT SLO (ms)", min_value=0, max_value=3_600_000, step=100,
                      help="Time to first token, queueing included, that a request must not exceed; 0 = no TTFT SLO.",
                      **state.bind("ttft_ms"))
    c[1].number_input("TPOT SLO (ms)", min_value=0, max_value=3_600_000, step=5,
                      help="Time per output token after the first (mean per request); 0 = no TPOT SLO.",
                      **state.bind("tpot_ms"))
    c[2].number_input("E2E SLO (s)", min_value=0.0, max_value=3600.0, step=1.0, format="%.1f",
                      help="End-to-end latency, arrival to release; 0 = no E2E SLO.", **state.bind("e2e_s"))
    c[3].number_input("Attainment target (%)", min_value=1.0, max_value=100.0, step=0.5, format="%.1f",
                      help="Share of requests that must meet every SLO given (99 % reads as 'P99 within the SLOs').",
                      **state.bind("attain"))
    c[4].number_input("Target traffic (req/s)", min_value=0.01, max_value=1_000_000.0, step=5.0, format="%.4g",
                      help="The total traffic to plan for: the nodes needed are target / rate per node.",
                      **state.bind("target"))
    c[5].number_input("Price ($ per GPU-hour)", min_value=0.01, max_value=1000.0, step=0.25, format="%.2f",
                      help="What one GPU costs per hour; a node has 8 of them.", **state.bind("usd"))
    chosen = _chosen()
    st.session_state[state.widget_key(POLICIES)] = chosen
    st.multiselect("Policies", list(PRESETS), key=state.widget_key(POLICIES), on_change=_policies_changed,
                   help="The presets to plan with; each one's search runs about 10 simulations.")
    state.publish(ps)

    if not chosen:
        st.warning("Pick at least one policy to plan with.", icon=":material/info:")
        return
    slo = _slo()
    try:
        slo.validate()
    except ValueError as exc:
        st.error(f"**These SLOs cannot be searched:** {exc}. Set the TTFT, TPOT or E2E SLO above 0.",
                 icon=":material/error:")
        return
    target, usd = float(state.value("target")), float(state.value("usd"))
    tasks = [(name, lambda name=name: planning.capacity_cached(base.with_policy(PRESETS[name]), slo))
             for name in chosen]
    found = widgets.guarded(lambda: cache.run_with_progress(tasks, "Searching for the highest rate within the "
                                                                   "SLOs"), "The capacity search")
    if found is None:
        res = st.session_state.get(LAST)
        if res is None:
            return
        st.caption("Showing the last plan that ran.")
    else:
        results = dict(zip(chosen, found))
        plans = {n: planning.plan(r, base.with_policy(PRESETS[n]), target, usd) for n, r in results.items()}
        res = {"slo": slo, "target": target, "usd": usd, "plans": plans, "scenario": base,
               "points": {n: r.points for n, r in results.items()}}
        st.session_state[LAST] = res
    _results(res)


def _verdict(plans: dict, target: float) -> str:
    ok = {n: p for n, p in plans.items() if p["max_rate_req_s"] > 0}
    if not ok:
        return ""
    best = max(ok, key=lambda n: ok[n]["max_rate_req_s"])
    b = ok[best]
    text = (f"'{best}' sustains the most traffic within the SLOs: {b['max_rate_req_s']:,.3g} req/s per node, so "
            f"{b['nodes_needed']:,} node{'s' if b['nodes_needed'] != 1 else ''} serve {target:,.4g} req/s")
    if b["usd_per_million_output_tokens"] is not None:
        text += f", at ${b['usd_per_million_output_tokens']:,.2f} per million output tokens"
    worst = min(ok, key=lambda n: ok[n]["max_rate_req_s"])
    if worst != best:
        w = ok[worst]
        text += (f". '{worst}' sustains {w['max_rate_req_s']:,.3g} req/s ({w['nodes_needed']:,} node"
                 f"{'s' if w['nodes_needed'] != 1 else ''})")
    return text + "."


def _frame(plans: dict) -> pd.DataFrame:
    rows = {}
    for name, p in plans.items():
        row = {}
        for key, (header, _, _) in COLUMNS.items():
            v = p.get(key)
            if key == "binding_slo":
                v = cp.binding_text(v)
            elif v is None:
                v = float("nan")
            row[header] = v
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def _results(res: dict) -> None:
    plans, slo, target, usd, base = res["plans"], res["slo"], res["target"], res["usd"], res["scenario"]
    st.subheader(f"Per policy: {_slo_text(slo)}", divider="gray")
    sentence = _verdict(plans, target)
    if sentence:
        st.info(sentence, icon=":material/dns:")
    failed = [n for n, p in plans.items() if p["max_rate_req_s"] <= 0]
    if failed:
        binding = {cp.binding_text(plans[n]["binding_slo"]) for n in failed}
        st.warning(f"{', '.join(failed)}: no rate tried meets these SLOs, even the lowest; relax the "
                   f"{' or '.join(sorted(binding))} SLO or lower the attainment target.", icon=":material/warning:")
    df = _frame(plans)
    config = {"_index": st.column_config.TextColumn("Policy", help="Batching policy preset")}
    for key, (header, tip, fmt) in COLUMNS.items():
        if key == "nodes_needed":
            header_shown = f"Nodes for {target:,.4g} req/s"
            config[header] = st.column_config.NumberColumn(header_shown, help=tip, format=fmt)
        elif fmt is None:
            config[header] = st.column_config.TextColumn(header, help=tip)
        else:
            config[header] = st.column_config.NumberColumn(header, help=tip, format=fmt)
    st.dataframe(df, column_config=config, width="stretch")
    st.caption(f"One row per policy. Rate per node: the highest rate at which {slo.attainment * 100:.3g} % of "
               f"requests meet every SLO; cost at ${usd:,.2f} per GPU-hour × {base.deployment.node.num_gpus} GPUs. "
               "Hover a header for its definition.")

    name = charts.slug("capacity", report.scenario_slug(base))
    bars = cp.capacity_bars(plans, target, usd)
    widgets.chart(bars, "Left: requests per second one node sustains within the SLOs (higher is better). Middle: "
                  "nodes for the target traffic. Right: dollars per million output tokens at that rate (lower is "
                  "better).", f"{name}_bars")
    curves = cp.goodput_curves(res["points"], {n: p["max_rate_req_s"] for n, p in plans.items()}, slo.attainment)
    widgets.chart(curves, "Top: requests per second within every SLO against the rate offered; it follows the "
                  "dashed diagonal until the SLOs start to fail. Bottom: share of requests within the SLOs; each "
                  "policy's dotted line is where it last stays above the dashed target.", f"{name}_goodput")

    link = state.current_link()
    points = pd.concat([p.assign(policy=n) for n, p in res["points"].items()], ignore_index=True)
    points = points[["policy", *[c for c in points.columns if c != "policy"]]]
    slo_doc = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s, "attainment": slo.attainment}

    def _json() -> bytes:
        doc = {"slo": slo_doc, "target_rate_req_s": target, "gpu_hour_usd": usd,
               "scenario": dict(report.scenario_rows(base)),
               "policies": {n: {"description": PRESETS[n].describe(), **p} for n, p in plans.items()},
               "points": points.to_dict(orient="records")}
        return json.dumps(report.jsonable(doc), indent=2, allow_nan=False).encode()

    def _html() -> str:
        shown = df.copy()
        shown.columns = [f"Nodes for {target:,.4g} req/s" if c == COLUMNS["nodes_needed"][0] else c
                         for c in shown.columns]
        return report.html_report(f"Capacity planning: {_slo_text(slo)}", base,
                                  figures=[(bars, "Rate per node, nodes needed and cost per policy."),
                                           (curves, "Goodput and SLO attainment against the request rate.")],
                                  tables=[("Per policy", shown)], policies={n: PRESETS[n] for n in plans},
                                  verdict=sentence, link=link)

    table_csv = df.rename_axis("policy").reset_index()
    planning.download_row(name, [
        ("Plan (CSV)", lambda: table_csv.to_csv(index=False).encode(), "plan.csv", "text/csv",
         "One row per policy: rate per node, throughput, goodput, binding SLO, nodes, $ per M tokens."),
        ("Rates tried (CSV)", lambda: points.to_csv(index=False).encode(), "rates.csv", "text/csv",
         "Every rate each search simulated: attainment, goodput, throughput, P99 TTFT and TPOT."),
        ("Plan (JSON)", _json, "plan.json", "application/json",
         "The SLOs, target, price, each policy's result and every rate tried, with the scenario."),
        ("Report (HTML)", _html, "report.html", "text/html",
         "A standalone page with the scenario, the table and the charts; opens offline."),
    ], link)


if scenario is None:
    st.stop()
plan_view(scenario)
