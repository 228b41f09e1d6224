"""The scenario sidebar every page draws: hardware, model, workload, load; values live in the URL."""
from __future__ import annotations

import os
import re
from pathlib import Path

import streamlit as st

from batching.sim.simulate import Scenario
from batching.sim.specs import DEFAULT_GPU, DEFAULT_MODEL, GPUS, MODELS, PRECISIONS, deployment
from batching.sim.workload import (DEFAULT_RATE_REQ_S, MAX_RATE_REQ_S, WORKLOAD_PRESETS, TraceWorkload,
                                   workload_preset)
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
    TRACE: "trace: replay a file",
}
_UPLOAD = "trace_upload"  # session: (file name, bytes) of the uploaded trace
_LAST = "last_valid_scenario"


def params() -> list[Param]:
    workloads = tuple(WORKLOAD_PRESETS) + (TRACE,)
    return [
        Param("gpu", DEFAULT_GPU, choices=tuple(GPUS), label="GPU"),
        Param("model", DEFAULT_MODEL, choices=tuple(MODELS), label="model"),
        Param("tp", 8, choices=(1, 2, 4, 8), label="tensor parallel"),
        Param("precision", "bf16", choices=PRECISIONS, label="precision"),
        Param("workload", "mixed" if "mixed" in workloads else workloads[0], choices=workloads, label="workload"),
        Param("rate", DEFAULT_RATE_REQ_S, low=MIN_RATE_REQ_S, high=MAX_RATE_REQ_S, label="request rate (req/s)"),
        Param("n", 2000, low=10, high=MAX_REQUESTS, label="number of requests"),
        Param("seed", 0, low=0, high=2**31 - 1, label="seed"),
        Param("recorded", True, label="replay at the recorded rate"),
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
    c1.selectbox("Tensor parallel", [1, 2, 4, 8], help="GPUs per model replica; 8 / TP replicas share the load.",
                 **state.bind("tp"))
    c2.selectbox("Precision", list(PRECISIONS), format_func=str.upper, **state.bind("precision"))
    workloads = [p for p in ps if p.key == "workload"][0].choices
    st.selectbox("Workload", list(workloads), format_func=lambda k: WORKLOAD_LABELS.get(k, k),
                 **state.bind("workload"))
    is_trace = state.value("workload") == TRACE
    if is_trace:
        st.file_uploader("Trace file (CSV or JSONL)", type=["csv", "jsonl", "json", "ndjson", "txt"],
                         key="trace_file", on_change=_upload_changed,
                         help="Native (arrival_s, prompt_tokens, output_tokens[, priority]), Azure LLM inference, "
                              "BurstGPT or Vidur columns. Without a file the project's sample trace is used.")
        st.toggle("Skip bad rows", key="trace_skip_bad", persist_state="session",
                  help="Drop rows that do not parse; the count is shown.")
        st.toggle("Replay at the recorded rate", **state.bind("recorded"))
    bounds = {p.key: p.widget_range() for p in ps if p.key in ("rate", "n", "seed")}
    st.number_input("Request rate (req/s)", **bounds["rate"], step=0.5, format="%.1f",
                    disabled=is_trace and state.value("recorded"),
                    help="Mean arrival rate (Poisson for the presets; a trace is sped up or slowed down).",
                    **state.bind("rate"))
    st.number_input("Number of requests", **bounds["n"], step=100,
                    help=f"Requests simulated per run (at most {MAX_REQUESTS:,}); a trace keeps its first N.",
                    **state.bind("n"))
    st.number_input("Seed", **bounds["seed"], step=1, help="Same seed, same requests.",
                    **state.bind("seed"))
    st.button("Reset to defaults", on_click=_reset, icon=":material/restart_alt:", width="stretch")


def _build() -> Scenario:
    """The scenario the sidebar describes; ValueError says what to change."""
    v = state.value
    dep = deployment(gpu=v("gpu"), model=v("model"), tp=int(v("tp")), precision=v("precision"))
    if v("workload") == TRACE:
        name, data = _trace_source()
        wl = TraceWorkload(data=data, filename=name, skip_bad_rows=bool(st.session_state.get("trace_skip_bad")))
        try:
            wl.load()
            wl = wl.with_num_requests(int(v("n")))
            if not v("recorded"):
                wl = wl.with_rate(float(v("rate")))
            wl.generate()  # the request cap and the time range too, before the caption replays it
        except ValueError as exc:
            raise ValueError(f"trace {name}: {exc}. Fix the file, turn on 'Skip bad rows', or pick a preset "
                             "workload.") from None
    else:
        wl = workload_preset(v("workload"), float(v("rate")), int(v("n")), int(v("seed")))
    return Scenario(deployment=dep, workload=wl)


def _trace_caption(wl: TraceWorkload) -> str:
    reqs = wl.generate()
    text = f"Trace **{plain(wl.filename)}**: {len(reqs):,} requests at {reqs.mean_rate_req_s:.2f} req/s"
    if wl.skipped_rows:
        text += f"; {wl.skipped_rows:,} bad rows skipped"
    if _UPLOAD in st.session_state:
        text += ". An uploaded file is not part of the link; a link opens with the sample trace."
    return text


def scenario_sidebar(page_id: str = "") -> Scenario | None:
    """Draw the sidebar; return the scenario to show (the last valid one after an error, or None)."""
    if st.session_state.get("_notices_page") != page_id:  # a link's corrections belong to the page it opened
        state.clear_notices()
        st.session_state["_notices_page"] = page_id
    ps = params()
    state.load(ps)
    with st.sidebar:
        nav()
        _draw(ps)
    state.publish(ps)
    for note in state.notices():
        st.warning(plain(note), icon=":material/link:")  # quotes the link: plain text
    try:
        scenario = _build()
    except (ValueError, RuntimeError) as exc:
        st.error(f"**This scenario cannot run:** {plain(exc)}", icon=":material/error:")
        last = st.session_state.get(_LAST)
        if last is not None:
            st.caption("Showing the last scenario that ran.")
        return last
    if isinstance(scenario.workload, TraceWorkload):
        st.sidebar.caption(_trace_caption(scenario.workload))
    st.session_state[_LAST] = scenario
    return scenario
