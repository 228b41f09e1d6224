"""Issue 23 item 4 on the dashboard: TP 16 over two nodes from the sidebar (and a link), DeepSeek-V3 on 2 x 8 H100
with its not-calibrated note, the captions naming the two nodes, and a split that keeps its instances on 8-GPU
nodes."""
from __future__ import annotations

import json

from uihelpers import assert_clean, chart_specs, run_page

EXPLORE, CAPACITY = "pages/explore.py", "pages/capacity.py"


def _scenario(at):
    return at.session_state["last_valid_scenario"]


def test_deepseek_on_two_h100_nodes_runs_and_says_it_is_not_calibrated():
    at = run_page(EXPLORE, workload="sharegpt", n="80", model="deepseek-v3", gpu="h100-sxm", precision="fp8",
                  tp="16")
    assert_clean(at)
    assert at.selectbox(key="wid:tp").value == 16
    node = _scenario(at).deployment.node
    assert (node.num_gpus, node.tp, node.physical_nodes) == (16, 16, 2)
    notes = [i.value for i in at.info if "Not calibrated" in i.value]
    assert notes and "TP 16 spans two nodes" in notes[0]
    assert any("one model replica over two 8-GPU nodes (16 GPUs)" in c.value for c in at.sidebar.caption)
    captioned = [t for t in (json.dumps(s, ensure_ascii=False) for s in chart_specs(at)) if "Simulated:" in t]
    assert captioned and all("16× H100 SXM 80GB" in s and "TP 16 over two nodes" in s for s in captioned)


def test_one_node_cannot_hold_deepseek_on_h100_and_the_sidebar_says_where_it_fits():
    at = run_page(EXPLORE, workload="sharegpt", n="80", model="deepseek-v3", gpu="h100-sxm", precision="fp8",
                  tp="8")
    assert not at.exception
    errors = " ".join(e.value for e in at.error)
    assert "does not fit on H100 SXM 80GB with tp=8" in errors and "tp=16 over two nodes" in errors


def test_a_split_keeps_its_instances_on_eight_gpu_nodes():
    at = run_page(EXPLORE, workload="sharegpt", n="80", tp="16", serving="disaggregated")
    assert_clean(at)
    sc = _scenario(at)
    assert sc.disagg is not None and sc.deployment.node.num_gpus == 8


def test_capacity_prices_two_nodes_of_gpus():
    at = run_page(CAPACITY, workload="sharegpt", n="80", tp="16")
    assert_clean(at)
    assert _scenario(at).deployment.node.num_gpus == 16
    helps = [n.help or "" for n in at.number_input]
    assert any("a TP 16 replica spans two nodes, 16 of them" in h for h in helps)
    df = at.dataframe[0].value  # the rate is the replica's; its nodes are 8-GPU nodes, two per replica
    assert "Rate per TP 16 replica (2 nodes) (req/s)" in df.columns
    nodes = [int(v) for v in df["Nodes needed"] if v != "–"]
    assert nodes and all(n % 2 == 0 for n in nodes)


def test_the_search_page_says_how_to_search_the_sidebars_two_nodes():
    at = run_page("pages/find_a_deployment.py", workload="sharegpt", n="80", tp="16")
    assert_clean(at)
    assert any("The sidebar's TP 16 over two nodes is searched only with 16 among the Tensor parallel degrees"
               in c.value for c in at.caption)
    assert "16" in at.multiselect(key="wid:s_tps").options
