"""The engine profile on Model and hardware: what the sidebar's profile holds, an upload of a profile file (one
``calibrate --bench FILE --fit`` writes) and a download of the current one (issue 23 items 2 and 8)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from batching.sim.hardware.engines import EngineProfile, parse_profile
from batching.ui import sidebar, state
from batching.ui.safe import plain

MAX_PROFILE_BYTES = 64 * 1024  # a profile is a few hundred bytes of JSON
# field -> (what it is, unit and scale for the table)
FIELDS = {
    "step_s": ("CPU time per step: scheduling, input preparation, launch gaps", "ms", 1e3),
    "graph_step_saving_s": ("of that, saved by a pure-decode step replayed as one CUDA graph", "ms", 1e3),
    "seq_s": ("CPU time per sequence emitting a token, per step", "µs", 1e6),
    "prefill_step_s": ("launch overhead of a step holding prompt tokens", "ms", 1e3),
    "in_fixed_s": ("client → engine queue: HTTP, request parsing", "ms", 1e3),
    "in_per_token_s": ("client → engine queue: tokenisation per prompt token", "ns", 1e9),
    "out_s": ("token computed → client: detokenise, stream", "ms", 1e3),
    "dispatch_per_layer_s": ("before the first token, per model layer", "ms", 1e3),
    "gemm_eff": ("linear layers' speed relative to vLLM's kernels (BF16)", "×", 1.0),
    "gemm_fp8_eff": ("FP8 GEMMs' speed relative to vLLM's", "×", 1.0),
    "attn_eff": ("prompt attention's speed relative to vLLM's", "×", 1.0),
    "kv_eff": ("decode attention's (KV reads) speed relative to vLLM's", "×", 1.0),
}


def profile_frame(prof: EngineProfile) -> pd.DataFrame:
    """One row per profile field: what it is, its value and unit."""
    rows = [{"field": k, "what": what, "value": f"{getattr(prof, k) * scale:,.4g}", "unit": unit}
            for k, (what, unit, scale) in FIELDS.items()]
    rows.append({"field": "allreduce", "what": "all-reduce table", "value": prof.allreduce, "unit": ""})
    rows.append({"field": "policy", "what": "scheduler defaults (preset 'engine')", "value": prof.policy.describe(),
                 "unit": ""})
    return pd.DataFrame(rows)


def read_profile(data: bytes, name: str) -> EngineProfile:
    """An uploaded profile file as a profile; ValueError naming the file and the field."""
    if len(data) > MAX_PROFILE_BYTES:
        raise ValueError(f"profile file {name}: {len(data):,} bytes; a profile is at most {MAX_PROFILE_BYTES:,}")
    try:
        return parse_profile(data)
    except ValueError as exc:
        raise ValueError(f"profile file {name}: {exc}") from None


def _uploaded() -> None:
    file = st.session_state.get("profile_file")
    st.session_state.pop("profile_error", None)
    if file is None:
        return
    try:
        st.session_state[sidebar.PROFILE_UPLOAD] = read_profile(file.getvalue(), file.name)
        state.set_value("engine", sidebar.UPLOADED)
    except ValueError as exc:
        st.session_state["profile_error"] = str(exc)


def profile_section(prof: EngineProfile) -> None:
    """The sidebar's profile as a table, the upload and the download."""
    st.subheader("Engine profile", divider="gray")
    st.caption(f"The runs on every page use **{plain(prof.label)}** ({plain(prof.name)}): what the engine adds to "
               "the kernels' time and its scheduler defaults. Every constant of the built-in profiles is cited in "
               "docs/CALIBRATION.md ('Engine profiles'). Fit one to your own benchmark with `python -m batching "
               "calibrate --bench FILE --fit --fit-out profile.json` and upload it here; the sidebar then offers it "
               "(a link cannot carry an uploaded profile).")
    st.dataframe(profile_frame(prof), hide_index=True, width="stretch")
    c = st.columns(2)
    c[0].file_uploader("Upload a profile (JSON)", type=["json"], key="profile_file", on_change=_uploaded,
                       help="A file written by calibrate --bench --fit, or EngineProfile.to_dict's fields.")
    err = st.session_state.get("profile_error")
    if err:
        c[0].error(f"**This profile cannot be used:** {plain(err)}", icon=":material/error:")
    c[1].download_button("Download this profile (JSON)", prof.to_json().encode(), f"{prof.name}_profile.json",
                         "application/json", on_click="ignore", icon=":material/data_object:",
                         help="The profile the runs use, as a file --profile FILE reads.")
