"""The fleet in the dashboard: nodes and router in the sidebar and the URL, Explore's per-replica view, the clear
error for a router the policy cannot use, the report's fleet rows, and the per-replica figure builder."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from batching import report
from batching.charts import fleet as fleet_charts
from batching.sim.topology.fleet import MAX_NODES, ROUTERS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.requests import workload_preset
from batching.ui import sidebar
from batching.ui.safe import unescape

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import chart_specs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXPLORE = "pages/explore.py"
FAST = {"n": "200"}
PER_REPLICA = fleet_charts.TITLE


def _run(page: str = EXPLORE, **query: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = str(v)
    at.switch_page(page)
    at.run()
    return at


def _specs(at: AppTest) -> list[dict]:
    return chart_specs(at)


def _titled(at: AppTest, title: str) -> list[dict]:
    return [s for s in _specs(at) if s["layout"]["title"]["text"] == title]


def _data(spec: dict) -> list[dict]:
    from batching.charts.export import CAPTION_LEGEND

    return [t for t in spec["data"] if t.get("legend") != CAPTION_LEGEND]


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# ---------------------------------------------------------------- Explore


def test_explore_shows_each_replica_of_a_two_node_fleet():
    at = _run(**FAST, nodes="2", router="least-outstanding")
    _clean(at)
    # the sidebar shows the link's fleet and the run used it
    assert at.number_input(key="wid:nodes").value == 2
    assert at.selectbox(key="wid:router").value == "least-outstanding"
    run = at.session_state["explore_last"][0]
    assert (run.nodes, run.router, run.replicas) == (2, "least-outstanding", 2)
    assert at.query_params["nodes"] == "2" and at.query_params["router"] == "least-outstanding"
    # the per-replica chart: one line per replica in each panel, named after it, within the point budget
    [spec] = _titled(at, PER_REPLICA)
    traces = _data(spec)
    assert len(traces) == 4
    assert sorted(t["name"] for t in traces if t["yaxis"] == "y") == ["replica 0", "replica 1"]
    assert sorted(t["name"] for t in traces if t["yaxis"] == "y2") == ["replica 0", "replica 1"]
    assert "least-outstanding" in spec["layout"]["title"]["subtitle"]["text"]
    assert any(c.value.startswith("Top: KV blocks held by each replica") for c in at.caption)
    # the per-replica table: both replicas, their requests adding up to the run's, latencies with units
    [table] = at.dataframe
    df = table.value
    assert list(df.index) == [0, 1] and list(df["Node"]) == [0, 1]
    assert sum(int(v.replace(",", "")) for v in df["Requests"]) == 200
    assert all(v.endswith((" ms", " s")) for v in df["TTFT P99"])
    assert all(v.endswith(" %") for v in df["Busy"]) and all(v.endswith(" tok/s") for v in df["Output throughput"])
    # the six charts of a one-replica run are still there
    assert len(_specs(at)) == 6


def test_one_replica_runs_show_no_per_replica_view():
    at = _run(**FAST)
    _clean(at)
    assert at.session_state["explore_last"][0].replicas == 1
    assert _titled(at, PER_REPLICA) == [] and len(_specs(at)) == 5 and len(at.dataframe) == 0
    assert "nodes" not in at.query_params and "router" not in at.query_params  # defaults stay out of the link


def test_static_batching_with_least_kv_runs_round_robin_and_says_so():
    at = _run(**FAST, policy="static", nodes="2", router="least-kv")
    _clean(at)
    assert at.session_state["explore_last"][0].router == "round-robin"
    assert any("Static batching runs the fleet round-robin: the least-kv router" in c.value for c in at.caption)
    assert len(_data(_titled(at, PER_REPLICA)[0])) == 4  # 2 replicas x 2 panels
    assert any("least-kv runs with the continuous modes only" in c.value for c in at.sidebar.caption)
    # the same fleet with a continuous preset runs
    at.selectbox(key="wid:policy").set_value("chunked").run()
    _clean(at)
    assert len(_data(_titled(at, PER_REPLICA)[0])) == 4


# ---------------------------------------------------------------- URL


def test_nodes_and_router_round_trip_through_the_url():
    ps = {p.key: p for p in sidebar.params()}
    nodes, router = ps["nodes"], ps["router"]
    assert (nodes.default, nodes.low, nodes.high) == (1, 1, MAX_NODES)
    assert router.default == "round-robin" and router.choices == ROUTERS
    for n in (1, 2, MAX_NODES):
        assert nodes.parse(nodes.encode(n)) == (n, None)
    for r in ROUTERS:
        assert router.parse(router.encode(r)) == (r, None)
    value, note = nodes.parse("999")
    assert value == MAX_NODES and "nodes=999" in note
    value, note = router.parse("random")
    assert value == "round-robin" and "router=random" in note
    # widget -> URL, and back to the defaults -> out of the URL
    at = _run(**FAST)
    at.number_input(key="wid:nodes").set_value(3).run()
    at.selectbox(key="wid:router").set_value("prefix-affinity").run()
    _clean(at)
    assert at.query_params["nodes"] == "3" and at.query_params["router"] == "prefix-affinity"
    run = at.session_state["explore_last"][0]
    assert (run.nodes, run.router, run.replicas) == (3, "prefix-affinity", 3)
    assert len(_data(_titled(at, PER_REPLICA)[0])) == 6
    at.number_input(key="wid:nodes").set_value(1).run()
    at.selectbox(key="wid:router").set_value("round-robin").run()
    _clean(at)
    assert "nodes" not in at.query_params and "router" not in at.query_params
    assert _titled(at, PER_REPLICA) == []


# ---------------------------------------------------------------- figure and table builders


def _steps(replicas: int, kv_share: float, cap_blocks: int) -> pd.DataFrame:
    """Each replica: 10 back-to-back 1-s steps holding kv_share of its blocks and r + 1 requests waiting."""
    rows = []
    for r in range(replicas):
        for i in range(10):
            rows.append({"replica": r, "start_s": float(i), "duration_s": 1.0,
                         "kv_blocks": int(kv_share * cap_blocks), "waiting": r + 1})
    return pd.DataFrame(rows)


def test_figure_has_one_trace_per_replica_per_panel_within_capacity():
    cap_blocks = 1000
    fig = fleet_charts.replica_kv_queue(_steps(3, 0.5, cap_blocks), cap_blocks * KV_BLOCK_TOKENS, 3)
    kv = [t for t in fig.data if t.yaxis == "y"]
    queue = [t for t in fig.data if t.yaxis == "y2"]
    assert [t.name for t in kv] == [t.name for t in queue] == ["replica 0", "replica 1", "replica 2"]
    for r, (k, q) in enumerate(zip(kv, queue)):
        assert len(k.x) <= fleet_charts.MAX_POINTS
        assert np.allclose(k.y, 50.0)  # half of each replica's KV cache, every bin
        assert np.allclose(q.y, r + 1)
    # replicas per node: the node is named
    two = fleet_charts.replica_kv_queue(_steps(4, 0.2, cap_blocks), cap_blocks * KV_BLOCK_TOKENS, 4, per_node=2)
    assert two.data[-1].name == "replica 3 (node 1)"


def test_figure_caps_lines_and_points_on_a_large_fleet():
    res = simulate(Scenario(workload=workload_preset("chat", 30.0, 400, 0), nodes=20, router="least-kv"))
    summary = res.summary()
    cap = summary["kv_capacity_tokens"]
    fig = fleet_charts.replica_kv_queue(res.steps, cap, res.scenario.replicas, max_points=300)
    kv = [t for t in fig.data if t.yaxis == "y"]
    assert len(kv) == fleet_charts.MAX_LINES and len(fig.data) == 2 * fleet_charts.MAX_LINES
    shown = fleet_charts.shown_replicas(20)
    assert shown[0] == 0 and shown[-1] == 19 and len(shown) == 16
    assert [t.name for t in kv] == [f"replica {r}" for r in shown]
    assert fleet_charts.shown_text(shown, 20).startswith("16 of 20 replicas have a line")
    assert fleet_charts.shown_text(fleet_charts.shown_replicas(2), 2) == ""
    peak = max(d["peak_kv_blocks"] for d in summary["by_replica"].values())
    for t in kv:
        assert len(t.x) <= 300
        assert 0.0 <= float(np.max(t.y)) <= min(100.0, peak * KV_BLOCK_TOKENS / cap * 100.0 + 1e-3)
    assert any(float(np.max(t.y)) > 0 for t in kv)
    # the table lists every replica, its requests adding up to the run's
    df = fleet_charts.replica_frame(summary["by_replica"])
    assert len(df) == 20 and sum(int(v.replace(",", "")) for v in df["Requests"]) == 400


# ---------------------------------------------------------------- report


def test_report_names_nodes_and_router_only_for_a_fleet():
    base = Scenario()
    assert [k for k, _ in report.scenario_rows(base) if k in ("Nodes", "Router")] == []
    rows = dict(report.scenario_rows(Scenario(nodes=2, router="least-outstanding")))
    assert rows["Nodes"] == "2 x 1 replica (2 replicas in all)"
    assert rows["Router"].startswith("least-outstanding: ")
    keys = [k for k, _ in report.scenario_rows(Scenario(nodes=2))]
    assert keys.index("Nodes") == keys.index("Tensor parallel") + 1 and "Router" in keys
    assert dict(report.scenario_rows(Scenario(router="least-kv")))["Nodes"].startswith("1 x 1 replica")
    html = report.html_report("t", Scenario(nodes=4, router="prefix-affinity"))
    assert "Router" in html and "prefix-affinity" in html and "4 replicas in all" in html
    assert report.scenario_slug(Scenario(nodes=4, router="least-kv")).endswith("_4nodes_least-kv")
    assert "nodes" not in report.scenario_slug(base)
