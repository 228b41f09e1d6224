"""Find a deployment in AppTest: renders from a deep link (shared sidebar, inputs from the URL), a search ranks by cost
with units on every number, the Pareto chart marks the chosen point, skipped configurations say why, the link opens
the chosen configuration on Explore (which then runs it), and bad input is a message, not an exception."""
from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from uihelpers import assert_clean, chart, chart_titles, data_traces, run_page

from batching.studies.search import ROUTER_NOTE

PAGE = "pages/find_a_deployment.py"
QUERY = dict(n="100", s_gpus="h100-sxm,a100-80gb", s_precs="bf16,fp8", s_tps="8", target="20", s_serving="agg")


def searched(**query):
    at = run_page(PAGE, **(QUERY | query))
    assert_clean(at)
    [b for b in at.button if b.label == "Search"][0].click()
    at.run()
    assert_clean(at)
    return at


def explore_link(at):
    links = [l.proto for l in at.get("page_link") if l.proto.label.startswith("Open ")]
    assert len(links) == 1
    return links[0]


def test_a_large_grid_waits_for_the_button():
    at = run_page(PAGE, **(QUERY | {"s_tps": "1,2,4,8", "s_policies": "chunked,priority"}))  # 32 configurations
    assert_clean(at)
    assert at.title[0].value == "Find a deployment"
    assert at.multiselect(key="wid:s_gpus").value == ["h100-sxm", "a100-80gb"]
    assert at.multiselect(key="wid:s_tps").value == [1, 2, 4, 8]
    assert at.number_input(key="wid:target").value == 20.0
    assert at.text_input(key="wid:ttft_ms").value == "1000,30000"  # the SLOs Capacity and Tune share
    assert "search_last" not in at.session_state and chart_titles(at) == []
    assert any("Press **Search**" in i.value for i in at.info)


def test_a_small_grid_searches_on_open():
    at = run_page(PAGE, **QUERY)  # 4 configurations: searched as the page opens, from a deep link
    assert_clean(at)
    assert chart_titles(at) == ["Cost against tail latency per configuration"]
    assert at.session_state["search_last"][1]["grid_size"] == 4


def test_search_ranks_marks_and_links():
    at = searched()
    df = at.dataframe[0].value
    # the export's table (report.search_frame): numbers as numbers, so its CSV and the page's agree (issue 39 item 9)
    assert list(df.columns) == ["Rank", "Configuration", "GPU", "Precision", "Serving", "TP", "Shape",
                                "Replicas per node", "Policy", "Knobs", "Rate per copy (req/s)", "Nodes for 20 req/s",
                                "Fleet check", "$ per M output tokens", "Margin (% of capacity used)",
                                "$ per M output tokens at capacity", "Output tok/s per GPU", "P99 TTFT (s)",
                                "P99 TPOT (ms)", "Binding SLO", "Binding class", "Pareto", "Calibrated"]
    assert df["TP"].tolist() == [8] * len(df) and df["$ per M output tokens"].dtype.kind == "f"
    costs = list(df["$ per M output tokens"])
    assert costs == sorted(costs) and len(df) >= 2
    assert df.iloc[0]["GPU"] == "h100-sxm" and df.iloc[0]["Precision"] == "FP8"
    res = at.session_state["search_last"][1]
    assert df.iloc[0]["Rate per copy (req/s)"] == res["configs"][0]["max_rate_req_s"]
    assert any(ROUTER_NOTE in c.value for c in at.caption)
    # issue 39 item 2: the margin (percent of the fleet's capacity the target uses) and the headroom in use
    assert df.iloc[0]["Margin (% of capacity used)"] == pytest.approx(100 * res["configs"][0]["margin"])
    assert any("Headroom 1.25× applies" in c.value for c in at.caption)
    # issue 39 item 5: the summary's P99s say where they were read (one copy at target / copies), never "at that rate"
    summary = next(i.value for i in at.info if "per copy within the SLOs" in i.value)
    assert "at that rate" not in summary and "one copy carrying" in summary and "the target / " in summary
    # the chart: the chosen (cheapest) configuration ringed in both panels
    spec = chart(at, "Cost against tail latency")
    chosen = [t for t in data_traces(spec) if t["name"].startswith("Chosen: ")]
    assert len(chosen) == 2 and chosen[0]["y"] == [res["configs"][0]["usd_per_million_output_tokens"]]
    # why not: A100 in FP8 does not fit
    why = at.dataframe[1].value
    row = why[why["Configuration"] == "a100-80gb fp8 tp8 chunked"].iloc[0]
    assert row["Left out"] == "does not fit" and "not supported on A100" in row["Why"]
    # the link opens the chosen configuration on Explore
    link = explore_link(at)
    q = {k: v[0] for k, v in parse_qs(link.query_string).items()}
    assert link.page == "explore"
    assert q == {"n": "100", "gpu": "h100-sxm", "tp": "8", "precision": "fp8", "policy": "chunked"}
    # choosing another configuration moves the ring and the link
    at.selectbox(key="search_chosen").set_value(1).run()
    assert_clean(at)
    second = at.session_state["search_last"][1]["configs"][1]
    spec = chart(at, "Cost against tail latency")
    ring = [t for t in data_traces(spec) if t["name"].startswith("Chosen: ")][0]
    assert ring["y"] == [second["usd_per_million_output_tokens"]]
    assert f"precision={second['precision']}" in explore_link(at).query_string


def test_the_link_runs_on_explore_with_knobs():
    at = searched(s_gpus="h100-sxm", s_precs="fp8", s_seqs="64")
    link = explore_link(at)
    q = {k: v[0] for k, v in parse_qs(link.query_string).items()}
    assert q["seqs"] == "64"
    explore = run_page("pages/explore.py", **q)
    assert_clean(explore)
    assert explore.selectbox(key="wid:policy").value == "chunked"
    assert explore.slider(key="wid:seqs").value == 64
    assert explore.selectbox(key="wid:precision").value == "fp8"


def test_bad_knob_values_are_a_message():
    at = run_page(PAGE, **(QUERY | {"s_seqs": "0"}))
    assert not at.exception
    assert any("max_num_seqs=0 is out of range" in e.value for e in at.error)


def test_an_unreachable_ray_cluster_falls_back_to_the_server(monkeypatch):
    """BATCHING_RAY_ADDRESS names a port nothing listens on: the search runs on the server's own threads, with a
    notice naming the address (it hung in Ray's connection retries)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("BATCHING_RAY_ADDRESS", address)
    monkeypatch.setenv("BATCHING_RAY_MIN_CONFIGS", "1")
    # 4 configurations (searched on open, sent to Ray: at least 1), a target no other test searches (not cached)
    at = run_page(PAGE, **(QUERY | {"target": "23"}))
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    from batching.ui.safe import unescape

    notes = [unescape(w.value) for w in at.warning if "Ray cluster" in unescape(w.value)]
    assert len(notes) == 1 and address in notes[0] and "searching on this server" in notes[0], notes
    res = at.session_state["search_last"][1]
    assert res["grid_size"] == 4 and "in this process" in res["backend"] and res["configs"][0]["meets_slo"]


def test_serving_choice_and_prices_from_the_cited_table():
    """Issue 24: the page offers the search's serving choice (aggregated by default, so the default grid searches
    as it opens; both adds the splits) and its prices default from batching/data/gpu_hour_usd.csv
    (pricing.default_gpu_hour_usd), not a page-local table."""
    query = dict(n="100", s_gpus="h100-sxm,h200-sxm", s_precs="fp8", s_tps="8", target="20")
    at = run_page(PAGE, **query)
    assert_clean(at)
    assert at.radio(key="wid:s_serving").value == "agg"
    assert at.number_input(key="wid:usd_h100-sxm").value == pytest.approx(2.69)
    assert at.number_input(key="wid:usd_h200-sxm").value == pytest.approx(3.59)
    assert any("2 configurations" in c.value for c in at.caption)
    both = run_page(PAGE, **(query | {"s_serving": "both"}))
    assert_clean(both)
    # 2 aggregated + 2 x 28 splits: more than the page searches on open, so it waits for the button
    assert any("58 configurations" in c.value for c in both.caption)
