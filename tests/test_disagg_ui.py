"""Prefill/decode disaggregation on the dashboard: the sidebar's serving choice and split in the URL, the clear
error for a split that does not fit, Explore's timeline segments for the KV transfer and the wait for a decode
slot, the per-instance view labelled by role against each role's own KV cache, and the transfer / decode-queue
figures."""
from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))

from uihelpers import FAST, assert_clean, chart, data_traces, drawn_charts, metric_value, run_page  # noqa: E402

from batching.charts import fleet as fleet_charts  # noqa: E402
from batching.charts import policy as charts  # noqa: E402
from batching.sim.topology.disagg import Disagg  # noqa: E402
from batching.sim.simulate import Scenario, simulate  # noqa: E402
from batching.sim.hardware.specs import deployment  # noqa: E402
from batching.sim.workload.requests import workload_preset  # noqa: E402
from batching.ui import sidebar  # noqa: E402
from batching.ui.safe import unescape  # noqa: E402

EXPLORE = "pages/explore.py"
SPLIT = {"serving": "disaggregated", **FAST}
SPLIT_KEYS = ("prefill_instances", "prefill_tp", "decode_instances", "decode_tp")


def _arr(v) -> np.ndarray:
    """A trace's data array from the chart spec (Plotly sends NumPy arrays base64-encoded)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float)
    return np.asarray([np.nan if x is None else x for x in v], float)


def _named(spec: dict, name: str) -> list[dict]:
    return [t for t in data_traces(spec) if t.get("name") == name]


def _lengths(trace) -> np.ndarray:
    """Each segment's length of a NaN-broken line trace (a figure's or a spec's)."""
    x = _arr(trace["x"]) if isinstance(trace, dict) else np.asarray(trace.x, float)
    return x[1::3] - x[0::3]


@pytest.fixture(scope="module")
def split_run():
    sc = Scenario(deployment=deployment(), workload=workload_preset("mixed", 2.0, 200, 0), disagg=Disagg())
    return simulate(sc)


# ---------------------------------------------------------------- Explore from a link


def test_explore_draws_a_disaggregated_run_from_the_link():
    at = run_page(EXPLORE, **SPLIT)
    assert_clean(at)
    assert at.radio(key="wid:serving").value == "disaggregated"
    assert [at.number_input(key="wid:prefill_instances").value, at.selectbox(key="wid:prefill_tp").value,
            at.number_input(key="wid:decode_instances").value, at.selectbox(key="wid:decode_tp").value] == [1, 4, 1, 4]
    assert at.selectbox(key="wid:router").disabled
    run = at.session_state["explore_last"][0]
    assert run.disagg == Disagg() and run.router == "round-robin"
    # the URL keeps the serving choice, the split's defaults stay out of it
    assert at.query_params["serving"] == "disaggregated"
    assert not any(k in at.query_params for k in SPLIT_KEYS)
    result = simulate(run)  # deterministic: the run the page drew
    req, s = result.requests, result.summary()

    # the timeline: a KV transfer and a decode-slot trace, the transfers adding up to the requests' (all drawn)
    tl = chart(at, "Request timeline")
    assert tl["layout"]["title"]["text"] == "Request timeline: queued, prefill, KV transfer, decode"
    [transfer] = _named(tl, charts.DISAGG_TRANSFER)
    [wait] = _named(tl, charts.DISAGG_WAIT)
    got = np.nansum(_lengths(transfer))
    assert got == pytest.approx(req["kv_transfer_s"].sum(), rel=1e-9, abs=1e-12)
    assert np.nansum(_lengths(wait)) == pytest.approx((req["decode_queue_s"] + req["kv_pull_wait_s"]).sum(),
                                                       rel=1e-9, abs=1e-12)
    assert any("KV transfer" in c.value for c in at.caption)

    # the per-instance view, labelled by role, both panels
    spec = chart(at, fleet_charts.DISAGG_TITLE)
    traces = data_traces(spec)
    assert sorted(t["name"] for t in traces if t["yaxis"] == "y") == ["decode 1", "prefill 0"]
    assert sorted(t["name"] for t in traces if t["yaxis"] == "y2") == ["decode 1", "prefill 0"]
    assert "1 prefill x TP 4" in spec["layout"]["title"]["subtitle"]["text"]
    [kv_decode] = [t for t in traces if t["yaxis"] == "y" and t["name"] == "decode 1"]
    assert 0 < np.nanmax(_arr(kv_decode["y"])) <= 100.0
    assert any(st.value.startswith("Per instance: 1 prefill + 1 decode") for st in at.subheader)

    # the transfer and decode-queue cards, in ms, and the caption's figures
    assert metric_value(at, "KV transfer P50") == pytest.approx(s["kv_transfer_p50_s"], rel=5e-3)
    assert metric_value(at, "Decode queue P99") == pytest.approx(s["decode_queue_p99_s"], rel=5e-3)
    assert metric_value(at, "TTFT P50") > 0 and metric_value(at, "TPOT P50") > 0
    [cap] = [unescape(c.value) for c in at.caption if "kv_transfer_p50" in unescape(c.value)]
    shown = re.search(r"kv_transfer_p50 ([0-9.,]+) ms", cap)
    assert shown and float(shown.group(1).replace(",", "")) == pytest.approx(s["kv_transfer_p50_s"] * 1e3, rel=1e-2)
    assert "decode_queue_p99" in cap and "1 prefill x TP 4 + 1 decode x TP 4" in cap


def test_split_inputs_round_trip_through_the_url_and_back_to_aggregated():
    ps = {p.key: p for p in sidebar.params()}
    assert ps["serving"].default == "aggregated" and ps["serving"].choices == ("aggregated", "disaggregated")
    assert [ps[k].default for k in SPLIT_KEYS] == [1, 4, 1, 4]
    value, note = ps["prefill_tp"].parse("3")
    assert value in (2, 4) and "prefill_tp=3" in note
    at = run_page(EXPLORE, **SPLIT, prefill_instances="2", prefill_tp="2", decode_instances="1", decode_tp="4")
    assert_clean(at)
    run = at.session_state["explore_last"][0]
    assert run.disagg == Disagg(prefill_instances=2, prefill_tp=2, decode_instances=1, decode_tp=4)
    spec = chart(at, fleet_charts.DISAGG_TITLE)
    assert [t["name"] for t in data_traces(spec) if t["yaxis"] == "y"] == ["prefill 0", "prefill 1", "decode 2"]
    # the widgets back to the defaults: out of the URL
    at.number_input(key="wid:prefill_instances").set_value(1).run()
    at.selectbox(key="wid:prefill_tp").set_value(4).run()
    assert_clean(at)
    assert at.query_params["serving"] == "disaggregated"
    assert not any(k in at.query_params for k in SPLIT_KEYS)
    assert at.session_state["explore_last"][0].disagg == Disagg()
    # aggregated: no split, no transfer segments, no per-replica view (one replica at TP 8)
    at.radio(key="wid:serving").set_value("aggregated").run()
    assert_clean(at)
    assert "serving" not in at.query_params
    assert at.session_state["explore_last"][0].disagg is None
    tl = chart(at, "Request timeline")
    assert not _named(tl, charts.DISAGG_TRANSFER) and not _named(tl, charts.DISAGG_WAIT)
    assert not [x for x in drawn_charts(at)
                if fleet_charts.TITLE in x.spec or fleet_charts.DISAGG_TITLE in x.spec]
    assert not [m for m in at.metric if m.label == "KV transfer P50"]


def test_a_split_that_needs_more_gpus_than_the_node_has_is_a_clear_error():
    at = run_page(EXPLORE, **SPLIT, prefill_instances="2", decode_instances="2")
    assert not at.exception, [e.value for e in at.exception]
    [err] = [unescape(e.value) for e in at.error]
    assert "This scenario cannot run" in err and "needs 16 GPUs" in err and "1 node of 8 GPUs have 8" in err
    # two nodes hold it
    at2 = run_page(EXPLORE, **SPLIT, prefill_instances="2", decode_instances="2", nodes="2")
    assert_clean(at2)
    assert at2.session_state["explore_last"][0].disagg.gpus == 16


def test_request_level_batching_with_a_split_is_a_clear_error():
    at = run_page(EXPLORE, **SPLIT, policy="static")
    assert not at.exception, [e.value for e in at.exception]
    assert any("iteration-level batching" in unescape(e.value) for e in at.error)


# ---------------------------------------------------------------- figure builders


def test_timeline_transfer_and_wait_segments_add_up_to_the_requests(split_run):
    req = split_run.requests
    assert charts.has_disagg(req)
    fig = charts.request_timeline(req, split_run.class_names)
    [transfer] = [t for t in fig.data if t.name == charts.DISAGG_TRANSFER]
    [wait] = [t for t in fig.data if t.name == charts.DISAGG_WAIT]
    dec = req["decode_replica"] >= 0
    assert len(_lengths(transfer)) == int((req["kv_transfer_s"] > 0).sum()) == int(dec.sum())
    assert np.nansum(_lengths(transfer)) == pytest.approx(req["kv_transfer_s"].sum(), rel=1e-9, abs=1e-12)
    assert np.nansum(_lengths(wait)) == pytest.approx((req["decode_queue_s"] + req["kv_pull_wait_s"]).sum(),
                                                       rel=1e-9, abs=1e-12)
    # each transfer starts at its decode instance's next step after its prefill instance's token; the decode
    # segments start at the admission on the decode instance (after the transfer and the wait), so no two segments
    # of a row overlap
    pulls = (req["prefill_done_s"] + req["kv_pull_wait_s"])[dec].to_numpy()
    assert np.allclose(np.sort(np.asarray(transfer.x, float)[0::3]), np.sort(pulls), rtol=0, atol=1e-9)
    decode_x0 = np.sort(np.concatenate([np.asarray(t.x, float)[0::3] for t in fig.data
                                        if t.name.endswith("· decode")]))
    start = (req["decode_arrival_s"] + req["decode_queue_s"])[dec & (req["finish_s"] > req["decode_arrival_s"])]
    assert np.allclose(decode_x0, np.sort(start.to_numpy()), rtol=0, atol=1e-3)
    # every point the figure draws is counted by the point-budget logic
    drawn = sum(len(t.x) for t in fig.data)
    assert drawn == 3 * int(charts._segment_counts(req).sum())


def test_timeline_point_budget_counts_the_split_segments(split_run):
    req = split_run.requests
    budget = 3 * int(charts._segment_counts(req.iloc[:120]).sum())  # room for the first 100 and a few more
    df, note = charts.timeline_rows(req, max_points=budget)
    assert note and len(df) < len(req)
    fig = charts.request_timeline(req, split_run.class_names, max_points=budget)
    assert sum(len(t.x) for t in fig.data) == 3 * int(charts._segment_counts(df).sum()) <= budget
    assert [t for t in fig.data if t.name == charts.DISAGG_TRANSFER]


def test_an_aggregated_run_has_no_transfer_traces():
    res = simulate(Scenario(workload=workload_preset("mixed", 2.0, 200, 0)))
    assert not charts.has_disagg(res.requests) and charts.disagg_times(res.requests) is None
    fig = charts.request_timeline(res.requests, res.class_names)
    names = {t.name for t in fig.data}
    assert charts.DISAGG_TRANSFER not in names and charts.DISAGG_WAIT not in names
    assert fig.layout.title.text == "Request timeline: queued, prefill, decode"
    assert sum(len(t.x) for t in fig.data) == 3 * int(charts._segment_counts(res.requests).sum())


def test_per_instance_lines_use_each_roles_own_kv_capacity():
    dep = deployment()
    dis = Disagg(prefill_instances=2, prefill_tp=2, decode_instances=1, decode_tp=4)
    roles = fleet_charts.disagg_roles(dis, dep)
    cap_p = dis.deployment(dep, "prefill").kv_capacity_blocks
    cap_d = dis.deployment(dep, "decode").kv_capacity_blocks
    assert cap_p != cap_d
    assert roles == {0: ("prefill 0", cap_p), 1: ("prefill 1", cap_p), 2: ("decode 2", cap_d)}
    # each instance holds a quarter of its own cache for 10 back-to-back 1-s steps
    rows = []
    for rep, (_, cap) in roles.items():
        for k in range(10):
            rows.append({"replica": rep, "start_s": float(k), "duration_s": 1.0, "kv_blocks": cap // 4,
                         "waiting": rep + 1})
    fig = fleet_charts.replica_kv_queue(pd.DataFrame(rows), 1, 3, roles=roles)
    kv = {t.name: np.asarray(t.y, float) for t in fig.data if t.yaxis == "y"}
    assert list(kv) == ["prefill 0", "prefill 1", "decode 2"]
    for name, (_, cap) in zip(kv, roles.values()):
        assert np.allclose(kv[name], (cap // 4) / cap * 100.0, atol=0.01)
    waiting = {t.name: np.asarray(t.y, float) for t in fig.data if t.yaxis == "y2"}
    assert np.allclose(waiting["decode 2"], 3.0)
    colors = {t.name: t.line.color for t in fig.data if t.yaxis == "y"}
    assert colors["prefill 0"] != colors["prefill 1"] != colors["decode 2"]
    assert "instance" in fig.layout.annotations[0].text and fig.layout.title.text == fleet_charts.DISAGG_TITLE
    # without roles: the fleet's names and the one capacity, as before
    plain = fleet_charts.replica_kv_queue(pd.DataFrame(rows), cap_d * 16, 3)
    assert [t.name for t in plain.data if t.yaxis == "y"] == ["replica 0", "replica 1", "replica 2"]
    assert "replica" in plain.layout.annotations[0].text and plain.layout.title.text == fleet_charts.TITLE
