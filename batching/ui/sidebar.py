"""The scenario sidebar every page draws: hardware, model, workload, load; values live in the URL."""
from __future__ import annotations

import os
import re
from pathlib import Path

import streamlit as st

from batching.sim.topology.disagg import KV_TRANSFER_FIXED_S, MAX_INSTANCES, Disagg
from batching.sim.topology.fleet import MAX_NODES, ROUTER_HELP, ROUTERS, check_fleet
from batching.sim.simulate import Scenario, admitted
from batching.sim.hardware.engines import DEFAULT_ENGINE, ENGINES, EngineProfile
from batching.sim.hardware.kernel_tables import calibration_status
from batching.sim.hardware.specs import (DEFAULT_GPU, DEFAULT_MODEL, GPUS, GPUS_PER_NODE, MODELS, PRECISIONS, TP_DEGREES,
                                         TWO_NODE_GPUS, deployment)
from batching.sim.workload.requests import (DEFAULT_RATE_REQ_S, MAX_CLIENT_THINK_S, MAX_CONCURRENCY, MAX_DIURNAL_PERIOD_S, MAX_PEAK_TO_TROUGH, MAX_RATE_REQ_S,
                                   WORKLOAD_PRESETS, TraceWorkload, workload_preset)
from batching.ui import nav, state
from batching.ui.params import Param
from batching.ui.safe import plain

APP_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TRACE = APP_ROOT / "assets" / "sample_trace.csv"
TRACE = "trace"
# hosted mode: a cap on simulated requests per run
MAX_REQUESTS = max(10, int(os.environ.get("BATCHING_MAX_REQUESTS", "20000")))
MIN_RATE_REQ_S = 0.1  # the rate input shows one decimal; the top is the workload's own limit
PAGES = nav.PAGES  # (path, title, icon) per page, defined once in batching/ui/nav.py
WORKLOAD_LABELS = {
    "mixed": "mixed: 30 % interactive chat + 70 % batch analysis",
    "chat": "chat (Azure conversation lengths)",
    "code": "code (long prompts, short outputs)",
    "batch": "batch analysis (documents)",
    "sharegpt": "ShareGPT-like (short prompts, ~195-token answers)",
    "article": "article: 512 in / 256 out on average, 20 % high priority (4 req/s in the article section)",
    "chat-sessions": "chat sessions (multi-turn: each turn resends the history)",
    "reasoning": "reasoning (~1k prompt, ~4.7k-token answers)",
    "long-context": "long context (~20k prompt, ~500-token answers)",
    TRACE: "trace: replay a file",
}
# arrival processes (DESIGN §5): URL value -> label; the library's kinds, Poisson first
ARRIVALS = {
    "poisson": "Poisson (independent arrivals)",
    "gamma": "Bursty (Gamma gaps, CV)",
    "onoff": "On/off bursts",
    "diurnal": "Diurnal rate curve (peak : trough)",
}
# the load: an open loop's request rate, or closed-loop clients (vllm bench serve --max-concurrency); URL key "load"
LOADS = {"rate": "Open-loop rate (req/s)", "clients": "Closed-loop clients (concurrency)"}
DEFAULT_CLIENTS = 16
CV_CHOICES = tuple(x / 2 for x in range(2, 17))  # 1, 1.5, ..., 8: the burstiness slider's stops
MAX_SHARED_PREFIX_TOKENS = 16_384
_UPLOAD = "trace_upload"  # session: (file name, bytes) of the uploaded trace
# serving: one engine per replica (aggregated), or prefill/decode disaggregation (batching/sim/topology/disagg.py)
SERVING = {"aggregated": "Aggregated", "disaggregated": "Disaggregated"}
DISAGG_TP = (1, 2, 4, 8)
_DISAGG_DEFAULT = Disagg()
_LAST = "last_valid_scenario"
# engine profiles (batching/sim/hardware/engines.py): a named one, or the profile file uploaded on Model and hardware
# (kept in the session as an EngineProfile; a link cannot carry it, so a link naming it opens with vLLM's)
UPLOADED = "uploaded"
PROFILE_UPLOAD = "engine_profile_upload"
ENGINE_HELP = (
    "What the serving engine adds to the kernels' time and which scheduler defaults it has (docs/CALIBRATION.md, "
    "'Engine profiles'): per-step CPU time, per-sequence CPU time, prefill launch overhead, the client's time "
    "before the queue (HTTP, tokenisation) and after a token, and its kernels' speed relative to vLLM's. TTFT is "
    "what the client sees. A profile fitted to your own benchmark (python -m batching calibrate --bench FILE --fit) "
    "uploads on Model and hardware.")


def params() -> list[Param]:
    workloads = tuple(WORKLOAD_PRESETS) + (TRACE,)
    return [
        Param("gpu", DEFAULT_GPU, choices=tuple(GPUS), label="GPU"),
        Param("model", DEFAULT_MODEL, choices=tuple(MODELS), label="model"),
        Param("tp", 8, choices=TP_DEGREES, label="tensor parallel"),
        Param("precision", "bf16", choices=PRECISIONS, label="precision"),
        Param("engine", DEFAULT_ENGINE, choices=(*ENGINES, UPLOADED), label="engine profile"),
        Param("nodes", 1, low=1, high=MAX_NODES, label="nodes"),
        Param("router", ROUTERS[0], choices=ROUTERS, label="router"),
        Param("serving", "aggregated", choices=tuple(SERVING), label="serving"),
        Param("prefill_instances", _DISAGG_DEFAULT.prefill_instances, low=1, high=MAX_INSTANCES,
              label="prefill instances"),
        Param("prefill_tp", _DISAGG_DEFAULT.prefill_tp, choices=DISAGG_TP, label="prefill tensor parallel"),
        Param("decode_instances", _DISAGG_DEFAULT.decode_instances, low=1, high=MAX_INSTANCES,
              label="decode instances"),
        Param("decode_tp", _DISAGG_DEFAULT.decode_tp, choices=DISAGG_TP, label="decode tensor parallel"),
        Param("workload", "mixed" if "mixed" in workloads else workloads[0], choices=workloads, label="workload"),
        Param("rate", DEFAULT_RATE_REQ_S, low=MIN_RATE_REQ_S, high=MAX_RATE_REQ_S, label="request rate (req/s)"),
        Param("load", "rate", choices=tuple(LOADS), label="arrivals (open-loop rate or closed-loop clients)"),
        Param("conc", DEFAULT_CLIENTS, low=1, high=MAX_CONCURRENCY, label="closed-loop clients (concurrency)"),
        Param("think_s", 0.0, low=0.0, high=MAX_CLIENT_THINK_S, label="client think time (s)"),
        Param("n", 2000, low=10, high=MAX_REQUESTS, label="number of requests"),
        Param("seed", 0, low=0, high=2**31 - 1, label="seed"),
        Param("recorded", True, label="replay at the recorded rate"),
        Param("arrivals", "poisson", choices=tuple(ARRIVALS), label="arrival process"),
        Param("cv", 2.0, choices=CV_CHOICES, label="burstiness (CV of the gaps)"),
        Param("on_s", 10.0, low=0.5, high=3600.0, label="on period (s)"),
        Param("off_s", 10.0, low=0.0, high=3600.0, label="off period (s)"),
        Param("peak", 3.0, low=1.0, high=MAX_PEAK_TO_TROUGH, label="peak : trough ratio"),
        Param("period_s", 0.0, low=0.0, high=MAX_DIURNAL_PERIOD_S, label="rate curve period (s, 0 = the run's length)"),
        Param("prefix_tokens", 0, low=0, high=MAX_SHARED_PREFIX_TOKENS, label="shared system prompt (tokens)"),
    ]


def all_pages() -> list[tuple[str, str, str]]:
    """The pages above, then any other page file in pages/ (labelled after its name, as Streamlit would)."""
    known = {path for path, _, _ in PAGES}
    extra = []
    for f in sorted((APP_ROOT / "pages").glob("*.py")):
        rel = f"pages/{f.name}"
        if rel not in known and not f.name.startswith("_"):
            label = re.sub(r"^\d+[_ -]*", "", f.stem).replace("_", " ").strip() or f.stem
            extra.append((rel, label, ":material/article:"))
    return [*PAGES, *extra]


def nav() -> None:
    """Links to every page, carrying the scenario in their query string."""
    query = state.url_params(params())
    for path, label, icon in all_pages():
        st.page_link(path, label=label, icon=icon, query_params=query)


def _reset() -> None:
    state.reset(params())
    st.session_state.pop(_UPLOAD, None)


def _upload_changed() -> None:
    file = st.session_state.get("trace_file")
    if file is None:
        st.session_state.pop(_UPLOAD, None)
    else:
        st.session_state[_UPLOAD] = (file.name, file.getvalue())


def _trace_source() -> tuple[str, bytes]:
    if _UPLOAD in st.session_state:
        return st.session_state[_UPLOAD]
    cached = st.session_state.get("_sample_trace")
    if cached is None:
        cached = (SAMPLE_TRACE.name, SAMPLE_TRACE.read_bytes())
        st.session_state["_sample_trace"] = cached
    return cached


def _draw(ps: list[Param]) -> None:
    st.header("Scenario", divider="gray")
    st.selectbox("GPU (8 per node)", list(GPUS), format_func=lambda k: GPUS[k].name,
                 help="The node: 8 GPUs on NVLink.", **state.bind("gpu"))
    st.selectbox("Model", list(MODELS), format_func=lambda k: MODELS[k].name, **state.bind("model"))
    c1, c2 = st.columns(2)
    c1.selectbox("Tensor parallel", list(TP_DEGREES), help=TP_HELP, **state.bind("tp"))
    c2.selectbox("Precision", list(PRECISIONS), format_func=str.upper, **state.bind("precision"))
    if int(state.value("tp")) > GPUS_PER_NODE:
        st.caption(f"TP {int(state.value('tp'))}: one model replica over two 8-GPU nodes ({TWO_NODE_GPUS} GPUs), its "
                   "all-reduces across the network between them.")
    uploaded = st.session_state.get(PROFILE_UPLOAD)
    engines = [*ENGINES, UPLOADED] if isinstance(uploaded, EngineProfile) else list(ENGINES)
    if state.value("engine") not in engines:  # a link naming an uploaded profile this session does not have
        state.set_value("engine", DEFAULT_ENGINE)
        st.warning(f"The link names an uploaded engine profile, which a link cannot carry; using "
                   f"{ENGINES[DEFAULT_ENGINE].label}. Upload the profile on Model and hardware.",
                   icon=":material/link:")
    st.selectbox("Engine profile", engines, help=ENGINE_HELP, format_func=lambda k: (
        f"{uploaded.label} (uploaded)" if k == UPLOADED else ENGINES[k].label), **state.bind("engine"))
    _fleet(bounds_of(ps, "nodes"))
    _serving(ps)
    workloads = [p for p in ps if p.key == "workload"][0].choices
    st.selectbox("Workload", list(workloads), format_func=lambda k: WORKLOAD_LABELS.get(k, k),
                 **state.bind("workload"))
    is_trace = state.value("workload") == TRACE
    if is_trace:
        st.file_uploader("Trace file (CSV or JSONL)", type=["csv", "jsonl", "json", "ndjson", "txt"],
                         key="trace_file", on_change=_upload_changed,
                         help="Native (arrival_s, prompt_tokens, output_tokens[, priority]), Azure LLM inference, "
                              "BurstGPT or Vidur columns, or Mooncake JSON lines (timestamp in ms, input_length, "
                              "output_length, hash_ids: its shared prefixes are replayed). Without a file the "
                              "project's sample trace is used.")
        st.toggle("Skip bad rows", key="trace_skip_bad", persist_state="session",
                  help="Drop rows that do not parse; the count is shown.")
        st.toggle("Replay at the recorded rate", **state.bind("recorded"))
    bounds = {p.key: p.widget_range() for p in ps if p.low is not None}
    st.radio("Arrivals", list(LOADS), format_func=LOADS.get, horizontal=False, disabled=is_trace,
             help="Open loop: requests arrive at a rate whatever the server does (vllm bench serve --request-rate). "
                  "Closed loop: N clients, each sending its next request when its previous one completes (vllm "
                  "bench serve --max-concurrency, SGLang bench_serving, genai-perf --concurrency); every latency "
                  "is measured from the send. A trace keeps its recorded arrivals.", **state.bind("load"))
    clients = closed_loop(is_trace)  # every input drawn, the one that does not apply disabled (a link's values)
    st.number_input("Request rate (req/s)", **bounds["rate"], step=0.5, format="%.1f",
                    disabled=clients or (is_trace and state.value("recorded")),
                    help="Mean arrival rate, whatever the arrival process below (a trace is sped up or slowed "
                         "down). Closed-loop clients set their own pace.", **state.bind("rate"))
    c1, c2 = st.columns(2)
    c1.number_input("Clients", **bounds["conc"], step=1, disabled=not clients,
                    help=f"Closed loop: concurrent clients (1 to {MAX_CONCURRENCY:,}, at most the number of "
                         "requests).", **state.bind("conc"))
    c2.number_input("Think time (s)", **bounds["think_s"], step=0.5, format="%.1f", disabled=not clients,
                    help="Closed loop: seconds a client waits between a response and its next request.",
                    **state.bind("think_s"))
    _traffic_shape(bounds, is_trace)
    st.number_input("Number of requests", **bounds["n"], step=100,
                    help=f"Requests simulated per run (at most {MAX_REQUESTS:,}); a trace keeps its first N.",
                    **state.bind("n"))
    st.number_input("Seed", **bounds["seed"], step=1, help="Same seed, same requests.",
                    **state.bind("seed"))
    st.button("Reset to defaults", on_click=_reset, icon=":material/restart_alt:", width="stretch")


def bounds_of(ps: list[Param], key: str) -> dict:
    return [p for p in ps if p.key == key][0].widget_range()


def router_help() -> str:
    """The router selectbox's tooltip: one line per router (library text), and where they apply."""
    lines = "\n".join(f"- **{name}**: {text}" for name, text in ROUTER_HELP.items())
    return (f"How each arriving request picks its replica in the fleet:\n\n{lines}\n\nThe routers other than "
            "round-robin read every replica's state at each arrival and run with the continuous modes (continuous, "
            "chunked, priority) only; pages that compare static and dynamic batching run those two round-robin. With "
            "one replica in all, the router changes nothing.")


TP_HELP = (f"GPUs per model replica; 8 / TP replicas share the load. {TWO_NODE_GPUS}: one replica over two nodes "
           f"(its all-reduces cross the network: modelled, not measured; docs/CALIBRATION.md, 'Two nodes'). A "
           f"prefill/decode split sets its own TP per instance instead.")


def _fleet(nodes_range: dict) -> None:
    """Nodes and router: the fleet of identical nodes behind one router."""
    tp = int(state.value("tp"))
    if tp > GPUS_PER_NODE:
        text = (f"Identical serving units behind the router (at most {MAX_NODES}). With TP {tp} each unit is two "
                f"8-GPU nodes holding one model replica, so the fleet has as many replicas as units and twice as "
                f"many physical nodes.")
    else:
        per_node = GPUS_PER_NODE // tp
        text = (f"Identical nodes behind the router (at most {MAX_NODES}). Each node has num_gpus / TP model "
                f"replicas (now 8 / {tp} = {per_node}), so the fleet has nodes x {per_node} replicas.")
    st.number_input("Nodes", **nodes_range, step=1, help=text, **state.bind("nodes"))
    split = disaggregated()
    st.selectbox("Router", list(ROUTERS), help=router_help(), disabled=split, **state.bind("router"))
    if state.value("router") != ROUTERS[0] and not split:
        st.caption(f"{state.value('router')} runs with the continuous modes only: pages that compare static and "
                   "dynamic batching run those two round-robin.")


DISAGG_HELP = (
    "**Aggregated**: every replica prefills and decodes its own requests (tensor parallel above).\n\n"
    "**Disaggregated** (DistServe, Splitwise): the GPUs split into prefill instances and decode instances, each "
    "with its own tensor-parallel degree. A request is prefilled on the prefill instance with the fewest "
    "outstanding requests (one token, max_tokens=1, as vLLM's disaggregated serving runs it); its prompt's KV then "
    "moves to the decode instance with the most free KV blocks, over NVLink within a node or 400 Gb/s per GPU across "
    f"nodes, after {KV_TRANSFER_FIXED_S * 1e3:g} ms of posting the transfer (vLLM's NixlConnector, measured), and "
    "waits there for KV room. The "
    "decode instance computes the last prompt token again and streams every token to the client, so TTFT includes "
    "the transfer and the wait. With speculative decoding the decode instances speculate and the prefill "
    "instances run the draft's pass over the prompt (its KV moves with the target's), as SGLang serves MTP with "
    "PD.\n\n"
    "A prefill instance keeps each request's KV blocks until a decode instance has taken it in (its transfer, "
    "then any wait for room there). Closed-loop clients and sessions "
    "send their next request when the decode instance has streamed the last token. Not modelled: request-level "
    "batching (static, dynamic: they cannot run a split) and prefix caching on the decode side (each request's "
    "whole prompt moves). The split replaces the tensor parallel and router above; its "
    "instances must fit the nodes' GPUs.")


def disaggregated(v=state.value) -> bool:
    return v("serving") == "disaggregated"


def disagg_choice(v=state.value) -> Disagg | None:
    """The sidebar's prefill/decode split, or None when serving is aggregated."""
    if not disaggregated(v):
        return None
    return Disagg(prefill_instances=int(v("prefill_instances")), prefill_tp=int(v("prefill_tp")),
                  decode_instances=int(v("decode_instances")), decode_tp=int(v("decode_tp")))


def _serving(ps: list[Param]) -> None:
    """Aggregated or disaggregated serving and the split's four inputs (drawn disabled while aggregated, so a
    link's values always have their widget)."""
    split = disaggregated()
    with st.expander("Prefill/decode disaggregation", expanded=split, icon=":material/call_split:"):
        st.radio("Serving", list(SERVING), format_func=SERVING.get, horizontal=True, help=DISAGG_HELP,
                 **state.bind("serving"))
        split = disaggregated()
        c1, c2 = st.columns(2)
        c1.number_input("Prefill instances", **bounds_of(ps, "prefill_instances"), step=1, disabled=not split,
                        help="Instances that prefill prompts and produce each request's first token.",
                        **state.bind("prefill_instances"))
        c2.selectbox("Prefill TP", list(DISAGG_TP), disabled=not split,
                     help="GPUs per prefill instance (tensor parallel).", **state.bind("prefill_tp"))
        c3, c4 = st.columns(2)
        c3.number_input("Decode instances", **bounds_of(ps, "decode_instances"), step=1, disabled=not split,
                        help="Instances that take a request's KV after its first token and generate the rest.",
                        **state.bind("decode_instances"))
        c4.selectbox("Decode TP", list(DISAGG_TP), disabled=not split,
                     help="GPUs per decode instance (tensor parallel).", **state.bind("decode_tp"))
        if split:
            dis = disagg_choice()
            nodes = int(state.value("nodes"))
            st.caption(f"The split uses {dis.gpus} of the {8 * nodes} GPUs of {nodes} node"
                       f"{'s' if nodes != 1 else ''}; it replaces the tensor parallel and router above. Continuous "
                       "modes only (continuous, chunked, priority).")
        else:
            st.caption("Every replica prefills and decodes its own requests. Disaggregated splits the GPUs into "
                       "prefill and decode instances (see the help).")


def closed_loop(is_trace: bool = False, v=state.value) -> bool:
    """Whether the sidebar's load is closed-loop clients (never for a trace)."""
    return not is_trace and v("load") == "clients"


def _traffic_shape(bounds: dict, is_trace: bool) -> None:
    """The arrival process and its parameters, and the shared system prompt. Every input is drawn (disabled when
    it does not apply), so a link's values always have their widget."""
    changed = state.value("arrivals") != "poisson" or state.value("prefix_tokens") != 0
    with st.expander("Arrivals and shared prompt", expanded=changed and not is_trace, icon=":material/timeline:"):
        if is_trace:
            st.caption("A trace keeps its recorded arrivals and prompts.")
        if closed_loop(is_trace):
            st.caption("Closed-loop clients send when their previous request completes: no arrival process.")
        st.selectbox("Arrival process", list(ARRIVALS), format_func=ARRIVALS.get, disabled=is_trace or closed_loop(),
                     help="How requests arrive at the same mean rate: Poisson (independent), bursty (Gamma gaps "
                          "whose coefficient of variation is the burstiness; vLLM bench's --burstiness B is CV "
                          "1/sqrt(B)), on/off bursts, or a rate that swings between a peak and a trough.",
                     **state.bind("arrivals"))
        kind = "trace" if is_trace or closed_loop() else state.value("arrivals")
        st.select_slider("Burstiness (CV of the gaps)", options=list(CV_CHOICES), disabled=kind != "gamma",
                         format_func=lambda v: f"{v:g}",
                         help="Coefficient of variation of the time between arrivals: 1 is Poisson, 4 sends "
                              "requests in tight bunches separated by long gaps.", **state.bind("cv"))
        c1, c2 = st.columns(2)
        c1.number_input("On (s)", **bounds["on_s"], step=5.0, format="%.1f", disabled=kind != "onoff",
                        help="Seconds of traffic in each burst (at the rate that keeps the mean).",
                        **state.bind("on_s"))
        c2.number_input("Off (s)", **bounds["off_s"], step=5.0, format="%.1f", disabled=kind != "onoff",
                        help="Seconds without any arrival between bursts.", **state.bind("off_s"))
        c3, c4 = st.columns(2)
        c3.number_input("Peak : trough", **bounds["peak"], step=0.5, format="%.1f", disabled=kind != "diurnal",
                        help="The highest rate of the curve over its lowest; the mean stays the request rate.",
                        **state.bind("peak"))
        c4.number_input("Period (s)", **bounds["period_s"], step=600.0, format="%.0f", disabled=kind != "diurnal",
                        help="Length of one cycle of the rate curve, from the trough at t = 0 up to the peak and "
                             "back. 0: the run's length (requests / rate), so the run sees one whole cycle at the "
                             "mean rate; 86,400 s is a day, and a run shorter than its period sees less than the "
                             "mean.", **state.bind("period_s"))
        st.number_input("Shared system prompt (tokens)", **bounds["prefix_tokens"], step=256, disabled=is_trace,
                        help="Every request starts with the same system prompt of this many tokens (part of its "
                             "prompt). With prefix caching on, the engine computes it once and reuses its KV "
                             "blocks.", **state.bind("prefix_tokens"))


def arrival_choice(v=state.value) -> tuple[str, dict] | None:
    """(kind, params) for ``SyntheticWorkload.with_arrivals`` from the sidebar's values; None for Poisson."""
    kind = v("arrivals")
    if kind == "gamma":
        return "gamma", {"cv": float(v("cv"))}
    if kind == "onoff":
        return "onoff", {"on_s": float(v("on_s")), "off_s": float(v("off_s"))}
    if kind == "diurnal":
        period = float(v("period_s")) or min(max(int(v("n")) / float(v("rate")), 1.0), MAX_DIURNAL_PERIOD_S)
        return "diurnal", {"peak_to_trough": float(v("peak")), "period_s": period}
    return None


def clients_workload(wl, clients: int, think_s: float):
    """``wl`` sent by closed-loop clients; ValueError saying what to change (the sidebar's words)."""
    if wl.sessions is not None:
        raise ValueError("closed-loop clients send independent requests; this workload is multi-turn sessions (their "
                         "own closed loop). Pick another workload, or the open-loop rate.")
    if clients > wl.num_requests:
        raise ValueError(f"{clients:,} clients need at least as many requests; the run has {wl.num_requests:,}. Raise "
                         f"the number of requests or lower the clients (1 to {min(MAX_CONCURRENCY, wl.num_requests):,}).")
    wl = wl.with_arrivals("poisson").with_concurrency(clients, think_s)
    wl.validate()
    return wl


def _build() -> Scenario:
    """The scenario the sidebar describes; ValueError says what to change."""
    v = state.value
    tp = int(v("tp"))
    if disaggregated(v) and tp > GPUS_PER_NODE:  # the split's instances set their own TP on 8-GPU nodes
        tp = GPUS_PER_NODE
    dep = deployment(gpu=v("gpu"), model=v("model"), tp=tp, precision=v("precision"))
    if v("workload") == TRACE:
        name, data = _trace_source()
        wl = TraceWorkload(data=data, filename=name, skip_bad_rows=bool(st.session_state.get("trace_skip_bad")))
        try:
            wl.load()
            wl = wl.with_num_requests(int(v("n")))
            wl.generate()  # the request cap and the time range too, before the caption replays it
        except ValueError as exc:
            raise ValueError(f"trace {name}: {exc}. Fix the file, turn on 'Skip bad rows', or pick a preset "
                             "workload.") from None
        if not v("recorded"):  # a rate the file cannot be replayed at: the rate is what to change, not the file
            try:
                wl = wl.with_rate(float(v("rate")))
                wl.generate()
            except ValueError as exc:
                raise ValueError(f"trace {name} at a request rate of {float(v('rate')):,g} req/s: {exc}. Choose "
                                 "another request rate, or replay the recorded arrival times.") from None
    else:
        wl = workload_preset(v("workload"), float(v("rate")), int(v("n")), int(v("seed")))
        arrivals = arrival_choice(v)
        if arrivals is not None:
            wl = wl.with_arrivals(arrivals[0], **arrivals[1])
        if int(v("prefix_tokens")) > 0:
            wl = wl.with_shared_prefix(int(v("prefix_tokens")))
        if closed_loop(v=v):
            wl = clients_workload(wl, int(v("conc")), float(v("think_s")))
        wl.validate()
    nodes, router = int(v("nodes")), str(v("router"))
    check_fleet(nodes, router, "continuous")  # the range and name; the policy's mode is checked where it is set
    dis = disagg_choice(v)
    if dis is not None:
        try:
            dis.validate(dep, nodes)
        except ValueError as exc:
            raise ValueError(f"disaggregated serving: {exc}. Change the split, or add nodes if it needs more "
                             "GPUs.") from None
        router = ROUTERS[0]  # the split routes by itself (prefill: fewest outstanding, decode: most free KV)
    return Scenario(deployment=dep, workload=wl, nodes=nodes, router=router, disagg=dis, engine=engine_choice(v))


def engine_choice(v=None) -> str | EngineProfile:
    """The engine the sidebar names: a profile's name, or the uploaded EngineProfile."""
    v = v or state.value
    name = str(v("engine"))
    if name == UPLOADED:
        uploaded = st.session_state.get(PROFILE_UPLOAD)
        return uploaded if isinstance(uploaded, EngineProfile) else DEFAULT_ENGINE
    return name if name in ENGINES else DEFAULT_ENGINE


def _trace_caption(wl: TraceWorkload) -> str:
    reqs = wl.generate()
    text = f"Trace **{plain(wl.filename)}**: {len(reqs):,} requests at {reqs.mean_rate_req_s:.2f} req/s"
    if wl.skipped_rows:
        text += f"; {wl.skipped_rows:,} bad rows skipped"
    if _UPLOAD in st.session_state:
        text += ". An uploaded file is not part of the link; a link opens with the sample trace."
    return text


# the command line's names a link may use for a sidebar value: (link key, the value it also sets, or None)
CLI_LINK_NAMES = {"concurrency": ("conc", ("load", "clients")), "think_time_s": ("think_s", None)}


def _cli_link_names() -> None:
    """A link written with the command line's names (``?concurrency=16``, as ``--concurrency 16``) opens what the
    sidebar's own keys would (``?load=clients&conc=16``); the link is rewritten to those keys."""
    qp = st.query_params
    for cli, (key, also) in CLI_LINK_NAMES.items():
        if cli in qp:
            raw = qp[cli]
            del qp[cli]
            if key not in qp:
                qp[key] = raw
                if also is not None and also[0] not in qp:
                    qp[also[0]] = also[1]


def scenario_sidebar(page_id: str = "") -> Scenario | None:
    """Draw the sidebar; return the scenario to show (the last valid one after an error, or None)."""
    if st.session_state.get("_notices_page") != page_id:  # a link's corrections belong to the page it opened
        state.clear_notices()
        st.session_state["_notices_page"] = page_id
    ps = params()
    _cli_link_names()
    state.load(ps)
    with st.sidebar:
        nav()
        _draw(ps)
    state.publish(ps)
    for note in state.notices():
        st.warning(plain(note), icon=":material/link:")  # quotes the link: plain text
    try:
        scenario = _build()
        context_note = _context_note(scenario)  # an error when every request passes the model's context
    except (ValueError, RuntimeError) as exc:
        st.error(f"**This scenario cannot run:** {plain(exc)}", icon=":material/error:")
        last = st.session_state.get(_LAST)
        if last is not None:
            st.caption("Showing the last scenario that ran.")
        return last
    if isinstance(scenario.workload, TraceWorkload):
        st.sidebar.caption(_trace_caption(scenario.workload))
    if context_note:
        st.info(plain(context_note), icon=":material/block:")  # quotes class names: plain text
    calibrated, why = calibration_status(scenario)
    if not calibrated:  # a term with no measurement behind it: the figures are an estimate (DESIGN §3)
        st.info(f"**Not calibrated:** {plain(why)}. No measurement stands behind that part of this model, GPU or "
                "layout, so its figures are an estimate (a roofline where a kernel table is missing; "
                "docs/CALIBRATION.md).", icon=":material/science:")
    st.session_state[_LAST] = scenario
    return scenario


def _context_note(sc: Scenario) -> str | None:
    """What the engine rejects of the scenario's requests (prompt + output beyond the model's context), per class;
    None when it serves them all. Every request rejected is a ValueError."""
    reqs = sc.workload.generate()
    _, rejected = admitted(reqs, sc.deployment.model)
    n = int(rejected.sum())
    if not n:
        return None
    m = sc.deployment.model
    classes = ", ".join(f"{reqs.class_names[k]}: {int(c):,}" for k, c in enumerate(rejected) if c)
    return (f"{n:,} of {len(reqs):,} requests are rejected, not simulated ({classes}): their prompt plus output "
            f"passes {m.name}'s context of {m.max_context_tokens:,} tokens, and an engine (vLLM) rejects such a "
            "request and serves the rest. Every result on this page is of the requests served.")
