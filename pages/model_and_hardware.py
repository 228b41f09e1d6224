"""Model and hardware: where a step's time goes, how much KV cache fits, and how the cost model was calibrated."""
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from batching.sim.hardware import calibration as cal
from batching.studies import end_to_end as e2e_check
from batching.charts import costmodel as ccm
from batching.sim.hardware import costmodel as cm
from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import (KV_BLOCK_TOKENS, MODEL_LIMITS, Deployment, GPU_ARCHS, deployment, deployment_figures,
                                gpu_from_dict, gpu_to_dict, model_from_dict, model_to_dict)
from batching.ui import cache, nav, page, profiles, widgets
from batching.ui.safe import plain
from batching import report
from batching.charts.export import scenario_caption, with_caption
from batching.ui import downloads
from dataclasses import replace as dc_replace

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
PROMPT_LENGTHS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768)
KV_LABELS = {"auto": "BF16", "fp8": "FP8"}
CUSTOM = "custom_specs"  # session: (Model, GPU) entered in the form
KNOBS_MOVED = "mh_knobs_moved"  # session: the KV dtype or all-reduce knob moved (set by its on_change)

scenario = page.setup(
    nav.MODEL_AND_HARDWARE,
    "Where a forward pass spends its time for the sidebar's model and node, how much KV cache is left after the "
    "weights, and how the step-time model behind every simulation was calibrated against measured H100 data.")


@st.cache_data(max_entries=32, show_spinner=False, hash_funcs={Scenario: cache.scenario_token})
def mean_lengths(sc: Scenario) -> tuple[float, float]:
    reqs = sc.workload.generate()
    return float(reqs.prompt_tokens.mean()), float(reqs.output_tokens.mean())


@st.cache_data(max_entries=8, show_spinner=False)
def op_frames(key: str) -> dict[int, pd.DataFrame]:
    return {tp: cal.op_comparison(tp, key) for tp in cal.CALIBRATION_TPS}


@st.cache_data(max_entries=8, show_spinner=False)
def allreduce_frame(impl: str) -> pd.DataFrame:
    return cal.allreduce_comparison(impl)


@st.cache_data(max_entries=2, show_spinner=False)
def end_to_end_frame() -> pd.DataFrame:
    return e2e_check.end_to_end_frame()


@st.cache_data(max_entries=2, show_spinner=False)
def summaries() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return (cal.op_error_summary("linear"), cal.op_error_summary("elementwise"), cal.allreduce_error_summary(),
            cal.constants_table())


# The calibration charts: the same measurements and model on every rerun and in every session, so each figure is
# built once per process (a KV-dtype or model move rebuilt all four, 0.2-0.4 s of the script, for charts the
# browser then skipped as unchanged). widgets.chart leaves them as they are (no scenario line: they are not runs
# of the sidebar's scenario, their subtitles say what was measured), so sharing them is safe.
@st.cache_resource(max_entries=4, show_spinner=False)
def op_figure(key: str, title: str) -> go.Figure:
    return ccm.op_calibration(op_frames(key), title)


@st.cache_resource(max_entries=len(cm.ALLREDUCE_IMPLS), show_spinner=False)
def allreduce_figure(impl: str) -> go.Figure:
    return ccm.allreduce_calibration(allreduce_frame(impl), impl)


@st.cache_resource(max_entries=1, show_spinner=False)
def end_to_end_figure() -> go.Figure:
    return ccm.end_to_end(end_to_end_frame())


def _pct_columns(df: pd.DataFrame) -> dict:
    return {c: st.column_config.NumberColumn(c.replace("_", " "), format="percent") for c in df.columns
            if "error" in c}


def breakdown_section(dep: Deployment, allreduce: str, prompt_mean: float, output_mean: float, label: str,
                      key: str, engine=None) -> None:
    costs = cm.cost_model(dep, allreduce, engine=engine)
    context = prompt_mean + output_mean / 2.0
    ridge = cm.ridge_tokens(costs)
    request_tokens = prompt_mean + output_mean
    c = st.columns(5)
    c[0].metric("Weights per GPU", f"{dep.weight_bytes_per_gpu / 2**30:,.1f} GiB", border=True,
                help="Every weight of the model divided over the TP group; FP8 keeps embeddings and LM head in BF16.")
    c[1].metric("KV cache (tokens)", f"{dep.kv_capacity_tokens:,}", border=True,
                help=f"Tokens of KV cache per model replica: (HBM × {dep.gpu_memory_utilization:.0%} − weights − "
                     f"activation reserve) / KV bytes per token, in blocks of {KV_BLOCK_TOKENS} tokens.")
    c[2].metric("Concurrent requests", f"{dep.kv_capacity_tokens / request_tokens:,.0f}", border=True,
                help=f"KV capacity / mean request length of this workload ({prompt_mean:,.0f} prompt + "
                     f"{output_mean:,.0f} output tokens).")
    c[3].metric("Ridge (linear layers)", f"{ridge:,.0f} tokens", border=True,
                help="Tokens per step where the linear layers' compute time equals their weight-read time; "
                     f"as arithmetic intensity {cm.ridge_intensity(costs):,.0f} FLOP/byte at peak.")
    c[4].metric("Decode step, batch 1", f"{cm.step_time(costs, 1, 0, context, 1) * 1e3:,.1f} ms", border=True,
                help="One decode step of a single sequence: the floor of TPOT on this node.")
    figures_row(dep)
    left, right = st.columns(2)
    with left:
        fig = ccm.step_vs_batch(costs, context, BATCH_SIZES, label)
        widgets.chart(fig, "Stacked milliseconds per decode step as the batch grows (log x). Left of the dashed ridge "
                      "the step reads weights and its time barely moves with the batch; right of it the linear "
                      "layers are compute-bound and time grows with every sequence.", f"step_vs_batch_{key}",
                      key=f"batch_{key}")
    with right:
        fig = ccm.step_vs_prompt(costs, PROMPT_LENGTHS, label)
        widgets.chart(fig, "Stacked milliseconds of a step that prefills one whole prompt (log x): linear layers grow "
                      "linearly with the prompt, attention quadratically, so long prompts are attention-heavy.",
                      f"step_vs_prompt_{key}", key=f"prompt_{key}")
    fig = ccm.kv_memory(dep, request_tokens)
    widgets.chart(fig, "Per-GPU memory in GiB: weights, the activation reserve, the KV cache and the share vLLM "
                  "leaves free; the title turns the KV cache into tokens and into concurrent requests of this "
                  "workload's mean length.", f"kv_memory_{key}", key=f"kv_{key}")
    # issue 24 item 11: this breakdown's figures (PNG, SVG), its figures as a table (CSV), JSON and HTML
    figs = {"step_vs_batch": ccm.step_vs_batch(costs, context, BATCH_SIZES, label),
            "step_vs_prompt": ccm.step_vs_prompt(costs, PROMPT_LENGTHS, label), "kv_memory": fig}
    facts = pd.DataFrame([
        ("Weights per GPU (GiB)", dep.weight_bytes_per_gpu / 2**30), ("KV cache (tokens)", dep.kv_capacity_tokens),
        ("Concurrent requests of this workload", dep.kv_capacity_tokens / request_tokens),
        ("Ridge, linear layers (tokens per step)", ridge),
        ("Decode step, batch 1 (ms)", cm.step_time(costs, 1, 0, context, 1) * 1e3)], columns=["figure", "value"])
    here = dc_replace(scenario, deployment=dep)  # the breakdown's own deployment (a custom one too)
    line = scenario_caption(here)
    st.markdown(f"**Downloads: {plain(label)}**")
    downloads.export_buttons(report.view_export(
        f"model_hardware_{key}", f"Model and hardware: {label}", here,
        {k: (with_caption(f, line), "") for k, f in figs.items()}, {"breakdown": facts}), heading=None)


def _billions(n: int) -> str:
    return f"{n / 1e12:,.2f} T" if n >= 1e12 else f"{n / 1e9:,.1f} B"


def figures_row(dep: Deployment) -> None:
    """Parameters, active parameters, KV bytes per token and the node's KV capacity: the figures of
    ``python -m batching specs`` (one source, ``deployment_figures``)."""
    f = deployment_figures(dep)
    m = dep.model
    c = st.columns(5)
    c[0].metric("Parameters", _billions(f["parameters"]), border=True,
                help="Every weight in memory: attention, MLP or every expert, embeddings, LM head and norms.")
    moe = (f"{m.experts_per_token} of {m.num_experts} routed experts"
           + (f" plus {m.shared_experts} shared" if m.shared_experts else "")) if m.is_moe else ""
    c[1].metric("Active parameters", _billions(f["active_parameters"]), border=True,
                help=("What one token runs through, the input embedding included: " + moe + " per layer with "
                      "experts." if m.is_moe else "A dense model: every parameter is active."))
    if m.is_mla:
        kv_help = (f"Multi-head latent attention caches one latent of {m.kv_lora_rank} and a shared RoPE key of "
                   f"{m.qk_rope_head_dim} per token and layer: ({m.kv_lora_rank} + {m.qk_rope_head_dim}) × "
                   f"{m.num_layers} layers × {dep.kv_bytes_per_element:g} B, whatever the number of heads. Every "
                   "TP rank holds the whole latent.")
    else:
        kv_help = (f"K and V of {m.num_kv_heads} KV heads of {m.head_dim} per layer: 2 × {m.num_kv_heads} × "
                   f"{m.head_dim} × {m.num_layers} layers × {dep.kv_bytes_per_element:g} B for the whole model; "
                   f"{f['kv_bytes_per_token_per_gpu']:,.0f} B on each GPU.")
    c[2].metric(f"KV per token ({f['attention']})", f"{f['kv_bytes_per_token']:,.0f} B", border=True, help=kv_help)
    c[3].metric("KV cache per GPU", f"{f['kv_cache_gib_per_gpu']:,.1f} GiB", border=True,
                help=f"Of {f['usable_gib_per_gpu']:,.1f} GiB usable per GPU, after the weights and the activation "
                     "reserve.")
    c[4].metric("KV cache per node (tokens)", f"{f['kv_capacity_tokens_node']:,}", border=True,
                help=f"{f['kv_capacity_tokens']:,} tokens per replica × {f['replicas']} replica"
                     f"{'s' if f['replicas'] != 1 else ''} (num_gpus / TP).")


def custom_form(dep: Deployment) -> tuple | None:
    """The custom model / GPU form; returns (Model, GPU) once submitted and valid."""
    m = st.session_state.get(CUSTOM, (dep.model, dep.node.gpu))
    md, gd = model_to_dict(m[0]), gpu_to_dict(m[1])
    with st.form("custom_specs_form"):
        st.markdown("**Architecture** (a model's `config.json`)")
        a = st.columns(4)
        name = a[0].text_input("Model name", md["name"])
        layers = a[1].number_input("Layers", 1, 1000, md["num_layers"])
        hidden = a[2].number_input("Hidden size", 64, 65536, md["hidden_size"], step=128)
        ffn = a[3].number_input("FFN width (per expert)", 64, 1 << 20, md["ffn_size"], step=128)
        b = st.columns(4)
        heads = b[0].number_input("Attention heads", 1, 1024, md["num_heads"])
        kv_heads = b[1].number_input("KV heads", 1, 1024, md["num_kv_heads"])
        head_dim = b[2].number_input("Head dim", 16, 1024, md["head_dim"], step=16)
        vocab = b[3].number_input("Vocabulary", 1, 1 << 22, md["vocab_size"], step=1024)
        c = st.columns(4)
        experts = c[0].number_input("Experts (0 = dense)", 0, 1024, md["num_experts"])
        topk = c[1].number_input("Experts per token", 0, 1024, md["experts_per_token"])
        tied = c[2].checkbox("Tied embeddings", md["tied_embeddings"])
        bias = c[3].checkbox("QKV bias", md["qkv_bias"])
        f = st.columns(4)
        shared = f[0].number_input("Shared experts", 0, 64, md["shared_experts"],
                                   help="Experts every token runs besides its top-k (DeepSeek's n_shared_experts).")
        first_dense = f[1].number_input("First dense layers", 0, 1000, md["first_dense_layers"],
                                        help="Leading layers with a dense MLP (DeepSeek's first_k_dense_replace).")
        dense_ffn = f[2].number_input("Dense FFN width (0 = FFN width)", 0, 1 << 20, md["dense_ffn_size"], step=128,
                                      help="Those layers' MLP width (DeepSeek's intermediate_size).")
        context = f[3].number_input("Context length (tokens, 0 = no limit)", 0, MODEL_LIMITS["max_context_tokens"][1],
                                    md["max_context_tokens"], step=1024,
                                    help="The longest prompt + output the model serves (max_position_embeddings): "
                                         "longer requests are rejected, not simulated, as vLLM rejects them.")
        st.markdown("**Multi-head latent attention** (DeepSeek-V2/V3, Kimi-K2; KV LoRA rank 0 = none; head dim = "
                    "no-RoPE part + RoPE part)")
        g = st.columns(4)
        kv_lora = g[0].number_input("KV LoRA rank", 0, 65536, md["kv_lora_rank"], step=64)
        q_lora = g[1].number_input("Query LoRA rank (0 = none)", 0, 65536, md["q_lora_rank"], step=64)
        rope = g[2].number_input("RoPE head dim", 0, 1024, md["qk_rope_head_dim"], step=16)
        v_dim = g[3].number_input("Value head dim", 0, 1024, md["v_head_dim"], step=16)
        mtp = st.number_input("Multi-token-prediction modules (0 = none)", 0, MODEL_LIMITS["mtp_layers"][1],
                              md["mtp_layers"], help="DeepSeek-V3's num_nextn_predict_layers: speculative decoding "
                                                     "'mtp' runs them, and needs at least one.")
        st.markdown("**GPU** (datasheet figures)")
        d = st.columns(4)
        gname = d[0].text_input("GPU name", gd["name"])
        mem = d[1].number_input("Memory (GiB)", 1.0, 1024.0, float(round(gd["memory_gib"], 2)))
        bw = d[2].number_input("HBM bandwidth (TB/s)", 0.1, 100.0, float(gd["hbm_bandwidth_tb_s"]))
        bf16 = d[3].number_input("BF16 dense peak (TFLOP/s)", 1.0, 100000.0, float(gd["peak_bf16_tflops"]))
        e = st.columns(4)
        fp8 = e[0].number_input("FP8 dense peak (TFLOP/s, 0 = none)", 0.0, 100000.0, float(gd["peak_fp8_tflops"]))
        nvl = e[1].number_input("NVLink per direction (GB/s)", 1.0, 10000.0, float(gd["nvlink_gb_s"]))
        pcie = e[2].number_input("Host link (GB/s)", 0.1, 1000.0, float(gd["pcie_gb_s"]))
        arch = e[3].selectbox("Kernel family", GPU_ARCHS, index=GPU_ARCHS.index(gd["arch"]) if gd["arch"] in GPU_ARCHS
                              else 0, format_func=lambda s: s or "other (smooth fit only)",
                              help="'hopper' applies the measured H100 tile factors to 70B-class shapes.")
        submitted = st.form_submit_button("Use these specs", icon=":material/check:")
    if not submitted:
        return st.session_state.get(CUSTOM)
    try:
        model = model_from_dict({"name": name, "num_layers": int(layers), "hidden_size": int(hidden),
                                 "num_heads": int(heads), "num_kv_heads": int(kv_heads), "head_dim": int(head_dim),
                                 "ffn_size": int(ffn), "vocab_size": int(vocab), "tied_embeddings": bool(tied),
                                 "qkv_bias": bool(bias), "num_experts": int(experts),
                                 "experts_per_token": int(topk), "shared_experts": int(shared),
                                 "first_dense_layers": int(first_dense), "dense_ffn_size": int(dense_ffn),
                                 "kv_lora_rank": int(kv_lora), "q_lora_rank": int(q_lora) if kv_lora else 0,
                                 "qk_rope_head_dim": int(rope) if kv_lora else 0,
                                 "qk_nope_head_dim": int(head_dim) - int(rope) if kv_lora else 0,
                                 "v_head_dim": int(v_dim) if kv_lora else 0,
                                 "max_context_tokens": int(context), "mtp_layers": int(mtp)})
        gpu = gpu_from_dict({"name": gname, "memory_gib": mem, "hbm_bandwidth_tb_s": bw, "peak_bf16_tflops": bf16,
                             "peak_fp8_tflops": fp8, "nvlink_gb_s": nvl, "pcie_gb_s": pcie, "arch": arch})
    except ValueError as exc:
        st.error(f"**These specs are not valid:** {plain(exc)}", icon=":material/error:")
        return None
    st.session_state[CUSTOM] = (model, gpu)
    return model, gpu


def page_body(sc: Scenario) -> None:
    step_section(sc)
    profiles.profile_section(sc.profile)
    custom_section(sc)
    calibration_sections(sc)


def _knobs_moved() -> None:
    st.session_state[KNOBS_MOVED] = True


def _knobs(sc: Scenario) -> tuple[str, str]:
    """(KV cache dtype, all-reduce) as the step section's knobs stand: the custom section prices with them too."""
    return (st.session_state.get("mh_kv_dtype", sc.deployment.kv_dtype) or "auto",
            st.session_state.get("mh_allreduce", sc.allreduce))


# A fragment: moving the KV dtype or the all-reduce reruns this section only, not the custom form, the
# calibration and the constants below (their inputs, charts, tables and tabs were rebuilt, sent and re-rendered
# by the browser on every move). The custom section also prices with the two knobs: once the user has entered a
# model or GPU there, a move reruns the whole page.
@st.fragment
def step_section(sc: Scenario) -> None:
    """Where a step's time goes for the sidebar's deployment, with the KV dtype and all-reduce knobs."""
    dep = sc.deployment
    prompt_mean, output_mean = mean_lengths(sc)

    st.subheader("Where a step's time goes", divider="gray")
    o = st.columns([2, 2, 3])
    kv_dtype = o[0].segmented_control("KV cache dtype", list(KV_LABELS), default=dep.kv_dtype,
                                      format_func=lambda k: KV_LABELS[k], key="mh_kv_dtype", on_change=_knobs_moved,
                                      help="BF16 = the activations' dtype (vLLM's 'auto'). An FP8 KV cache holds twice "
                                           "the tokens and halves decode attention reads.")
    allreduce = o[1].selectbox("All-reduce implementation", list(cm.ALLREDUCE_IMPLS),
                               index=list(cm.ALLREDUCE_IMPLS).index(sc.allreduce), key="mh_allreduce",
                               on_change=_knobs_moved,
                               help="Which measured H100 table prices the two all-reduces per layer. At TP 16 "
                                    "(two nodes) every choice runs as NCCL across the nodes: the 8-GPU NCCL table "
                                    "plus the network (docs/CALIBRATION.md, 'Two nodes (TP 16)'; not measured).")
    o[2].caption(f"{plain(dep.model.name)} in {dep.precision.upper()} on {dep.node.num_gpus}× "
                 f"{plain(dep.node.gpu.name)}, TP {dep.node.tp} ({dep.node.replicas} "
                 f"replica{'s' if dep.node.replicas > 1 else ''}). Decode steps "
                 f"read {prompt_mean + output_mean / 2:,.0f} tokens of context per sequence: this workload's mean "
                 f"prompt plus half its mean output.")
    view = widgets.guarded(lambda: deployment(dep.node.gpu, dep.model, dep.node.tp, dep.node.num_gpus, dep.precision,
                                              kv_dtype=kv_dtype or "auto"), "This deployment")
    if view is not None:
        breakdown_section(view, allreduce, prompt_mean, output_mean, "", "scenario", engine=sc.profile)
        if not cm.tile_factors_apply(view):
            st.caption("This model or GPU has no measured tile factors: its linear layers use the smooth fitted "
                       "roofline (see the calibration below for its error on the measured shapes).")
    if st.session_state.pop(KNOBS_MOVED, False) and st.session_state.get(CUSTOM) is not None:
        st.rerun()  # the custom section below is priced with the knobs just moved


def custom_section(sc: Scenario) -> None:
    """The user's own model or GPU: the form, then its step breakdown with the step section's knobs."""
    dep = sc.deployment
    prompt_mean, output_mean = mean_lengths(sc)
    kv_dtype, allreduce = _knobs(sc)
    st.subheader("Your own model or GPU", divider="gray")
    st.caption("Enter an architecture (the numbers of a model's config.json) or a GPU (datasheet figures). They are "
               "priced with the sidebar's TP degree and precision; the JSON below feeds the command line "
               "(`--model-json`, `--gpu-json`).")
    custom = custom_form(dep)
    if custom is not None:
        model, gpu = custom
        cdep = widgets.guarded(lambda: deployment(gpu, model, dep.node.tp, dep.node.num_gpus, dep.precision,
                                                  kv_dtype=kv_dtype), f"{model.name} on {gpu.name}")
        if cdep is not None:
            breakdown_section(cdep, allreduce, prompt_mean, output_mean, f"{model.name} on {gpu.name}", "custom",
                              engine=sc.profile)
        d = st.columns(2)
        d[0].download_button("Model JSON (--model-json)", json.dumps(model_to_dict(model), indent=1),
                             "model.json", "application/json", on_click="ignore", icon=":material/data_object:")
        d[1].download_button("GPU JSON (--gpu-json)", json.dumps(gpu_to_dict(gpu), indent=1), "gpu.json",
                             "application/json", on_click="ignore", icon=":material/data_object:")


def calibration_sections(sc: Scenario) -> None:
    """The step-time model against measurements, and its constants with their sources."""
    st.subheader("Calibration: model vs measurement", divider="gray")
    lin_sum, el_sum, ar_sum, consts = summaries()
    tabs = st.tabs(["Linear layers", "Element-wise ops", "All-reduce", "End to end"])
    with tabs[0]:
        widgets.chart(op_figure("linear", "Linear layers"),
                      "Per-layer time of QKV + O + gate/up + down on one H100 (log-log) for Llama-2-70B at TP 1-8: "
                      "dots measured by Vidur, steps the calibrated model (smooth roofline × tile factor); bottom, the "
                      "model's error per token count inside the ±10 % band.", "calibration_linear", key="cal_lin",
                      scenario_line="")
        st.dataframe(lin_sum, hide_index=True, column_config=_pct_columns(lin_sum))
        st.caption("Smooth = the p-norm roofline alone (what other model shapes get); hold-out = both parts refitted "
                   "on every other token count, error at the others.")
    with tabs[1]:
        widgets.chart(op_figure("elementwise", "Element-wise ops"),
                      "RMSNorms, RoPE, SiLU-and-mul and the residual add per layer on one H100: dots measured, steps "
                      "the model (a launch-bound floor and a per-token slope, times a fitted factor); bottom, error.",
                      "calibration_elementwise", key="cal_el", scenario_line="")
        st.dataframe(el_sum, hide_index=True, column_config=_pct_columns(el_sum))
    with tabs[2]:
        impl = st.selectbox("Table", list(cm.ALLREDUCE_IMPLS), index=list(cm.ALLREDUCE_IMPLS).index(sc.allreduce),
                            key="mh_cal_allreduce")
        widgets.chart(allreduce_figure(impl),
                      "All-reduce latency against message size on H100 for 2, 4 and 8 GPUs (log-log): dots the "
                      "measured medians, lines the model's interpolation; bottom, its error at measured sizes (dots) "
                      "and at sizes left out of the table (open circles) against the ±15 % band.", f"calibration_allreduce_{impl}",
                      key="cal_ar", scenario_line="")
        st.dataframe(ar_sum, hide_index=True, column_config=_pct_columns(ar_sum))
    with tabs[3]:
        with st.spinner("Simulating the published runs (three simulations)…"):
            e2e = widgets.guarded(end_to_end_frame, "The end-to-end check")
        if e2e is not None:
            widgets.chart(end_to_end_figure(),
                          "Median TPOT at 4 and 8 req/s and offline output throughput of Llama-3.1-70B on 4×H100 "
                          "(TP 4): the simulation with the calibrated model beside the published SGLang and vLLM runs; "
                          "whiskers mark ±20 % of each published value.", "calibration_end_to_end", key="cal_e2e",
                          scenario_line="")
            st.dataframe(e2e, hide_index=True, column_config=_pct_columns(e2e))
            st.caption(f"Source: {e2e_check.PUBLISHED_SOURCE}. Continuous batching as vLLM V0 ran it (prefill-only steps, 1 % watermark), ShareGPT-like lengths "
                       "(prompts mean ≈ 231 tokens, outputs ≈ 195); see docs/CALIBRATION.md for why.")

    st.subheader("Constants and sources", divider="gray")
    shown = consts.assign(value=consts["value"].map(lambda v: f"{v:.4g}" if isinstance(v, (float, np.floating))
                                                     else str(v)))
    st.dataframe(shown, hide_index=True, width="stretch",
                 column_config={"source": st.column_config.TextColumn("source", width="large")})
    st.caption("Every constant of the step-time model with its value and where it comes from. "
               "`python -m batching calibrate --report` regenerates docs/CALIBRATION.md from the same code.")


if scenario is None:
    st.info("Pick a scenario that fits in the sidebar to see its cost model.", icon=":material/info:")
    st.stop()
page_body(scenario)
