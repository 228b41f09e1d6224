"""Issue 23 items 2 and 8 on the dashboard: the sidebar's engine profile in the URL (engine=), the scenario it builds,
every figure caption naming it, and Model and hardware's profile table, upload (a file calibrate --bench --fit
writes) and download."""
from __future__ import annotations

import json
from dataclasses import replace

from uihelpers import assert_clean, chart_specs, run_page

from batching.sim.hardware.engines import ENGINES
from batching.ui import profiles, sidebar, state

EXPLORE, MH = "pages/explore.py", "pages/model_and_hardware.py"


def _scenario(at):
    return at.session_state["last_valid_scenario"]


def test_the_link_names_the_engine_and_the_run_uses_it():
    at = run_page(EXPLORE, workload="sharegpt", n="120", engine="trtllm")
    assert_clean(at)
    assert at.selectbox(key="wid:engine").value == "trtllm"
    sc = _scenario(at)
    assert sc.engine == "trtllm" and sc.profile.label == "TensorRT-LLM 1.0" and sc.allreduce == "trtllm"
    # every chart of the run carries the caption line naming the profile (a legend title, joined by <br>)
    specs = [json.dumps(s) for s in chart_specs(at)]
    captioned = [s for s in specs if "Simulated:" in s]
    assert captioned and all("TensorRT-LLM 1.0 profile" in s for s in captioned)
    at.selectbox(key="wid:engine").set_value("vllm").run()
    assert_clean(at)
    assert _scenario(at).engine == "vllm" and "engine" not in at.query_params  # the default stays out of the link


def test_an_unknown_engine_in_the_link_is_a_notice():
    at = run_page(EXPLORE, workload="sharegpt", n="120", engine="tgi")
    assert not at.exception
    assert _scenario(at).engine == "vllm"
    assert any("engine=" in w.value and "vllm, sglang, trtllm" in w.value for w in at.warning), \
        [w.value for w in at.warning]


def test_model_and_hardware_shows_the_profile_and_takes_an_upload():
    at = run_page(MH, engine="sglang")
    assert_clean(at)
    assert "Engine profile" in [s.value for s in at.subheader]
    table = [d.value for d in at.dataframe if "field" in d.value.columns][0]
    row = table.set_index("field")
    assert row.loc["step_s", "value"] == "0" and row.loc["attn_eff", "value"] == f"{ENGINES['sglang'].attn_eff:,.4g}"
    # an upload (what calibrate --bench --fit writes) becomes the sidebar's profile
    fitted = replace(ENGINES["vllm"], name="vllm-fit", label="vLLM 0.11, fitted to run.json", step_s=3.5e-3)
    at.session_state[sidebar.PROFILE_UPLOAD] = profiles.read_profile(fitted.to_json().encode(), "p.json")
    at.session_state[state.store_key("engine")] = sidebar.UPLOADED  # what the upload's callback sets
    at.run()
    assert_clean(at)
    assert _scenario(at).profile == fitted
    assert at.selectbox(key="wid:engine").value == sidebar.UPLOADED


def test_a_bad_profile_file_names_the_field():
    bad = dict(ENGINES["vllm"].to_dict(), step_s=5.0)
    try:
        profiles.read_profile(json.dumps(bad).encode(), "p.json")
    except ValueError as exc:
        assert str(exc) == "profile file p.json: step_s=5 is out of range; allowed 0 to 1"
    else:
        raise AssertionError("a step time of 5 s was accepted")
    try:
        profiles.read_profile(b"{not json", "p.json")
    except ValueError as exc:
        assert str(exc).startswith("profile file p.json: not JSON")
    else:
        raise AssertionError("a broken file was accepted")


def test_a_link_naming_an_uploaded_profile_opens_with_vllm_and_says_so():
    at = run_page(EXPLORE, workload="sharegpt", n="120", engine="uploaded")
    assert not at.exception
    assert _scenario(at).engine == "vllm"
    assert any("uploaded engine profile, which a link cannot carry" in w.value for w in at.warning)


def test_an_uncalibrated_combination_says_so_on_the_page():
    """Issue 23 item 4: Mixtral (an MoE model with no measured expert table) is a roofline estimate; the page says
    so with the reason, as the summary's calibrated/calibration_note do. A dense model on H100 says nothing."""
    at = run_page(EXPLORE, workload="sharegpt", n="120", model="mixtral-8x7b", tp="2")
    assert not at.exception
    notes = [i.value for i in at.info if "Not calibrated" in i.value]
    assert notes and "a roofline where a kernel table is missing" in notes[0]
    at = run_page(EXPLORE, workload="sharegpt", n="120")
    assert not [i.value for i in at.info if "Not calibrated" in i.value]
