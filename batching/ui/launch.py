"""The "Launch command" expander of Explore, Capacity and Find a deployment: the vLLM and SGLang commands of what
the page shows (``studies.launch``), in code blocks with a copy button."""
from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from batching.sim.simulate import Scenario
from batching.studies.launch import SGLANG_VERSION, TRTLLM_VERSION, VLLM_VERSION, launch, with_launch

CAPTION = (f"vLLM {VLLM_VERSION} (`vllm serve`) and SGLang {SGLANG_VERSION} (`python -m sglang.launch_server`), and "
           f"TensorRT-LLM {TRTLLM_VERSION} (`trtllm-serve`) when the run used its profile; each flag is cited in "
           "docs/LAUNCH.md. Comment lines say where the simulated policy has no flag in that engine; every value is "
           "shell-quoted, so a set runs as printed.")


def launch_expander(what: Scenario | Mapping | None) -> None:
    """One expander "Launch command": ``what`` is a Scenario, a ``{vllm, sglang[, trtllm]}`` dict, or label ->
    either; one code block per engine, in the dict's order."""
    if not what:
        return
    items = {"": what} if isinstance(what, Scenario) or {"vllm", "sglang"} <= set(what) else dict(what)
    with st.expander("Launch command", icon=":material/terminal:"):
        st.caption(CAPTION)
        for label, cmd in items.items():
            cmd = launch(cmd) if isinstance(cmd, Scenario) else cmd
            if label:
                st.markdown(f"**{label}**")
            for text in cmd.values():
                st.code(text, language="bash")


def with_launch_rows(res: dict, base: Scenario) -> dict:
    """A search result whose rows carry their launch commands (``studies.launch.with_launch``)."""
    with_launch(res["configs"], base)
    return res
