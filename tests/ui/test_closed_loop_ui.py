"""Issue 23 item 1 on the dashboard: the sidebar's arrivals choice (open-loop rate or closed-loop clients) in the
URL (load, conc, think_s), the scenario it builds, and Capacity's "highest concurrency within the SLOs"."""
from __future__ import annotations

import pytest
from uihelpers import assert_clean, run_page

from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import workload_preset
from batching.studies.capacity import SLO, capacity

EXPLORE, CAPACITY = "pages/explore.py", "pages/capacity.py"


def _scenario(at):
    return at.session_state["last_valid_scenario"]


def test_link_opens_closed_loop_clients_on_explore():
    at = run_page(EXPLORE, workload="sharegpt", n="120", load="clients", conc="6", think_s="0.5")
    assert_clean(at)
    assert at.radio(key="wid:load").value == "clients"
    assert (at.number_input(key="wid:conc").value, at.number_input(key="wid:think_s").value) == (6, 0.5)
    wl = _scenario(at).workload
    assert (wl.concurrency, wl.think_time_s, wl.num_requests) == (6, 0.5, 120)
    assert at.selectbox(key="wid:arrivals").disabled  # no arrival process in a closed loop
    assert at.number_input(key="wid:rate").disabled  # nor a rate: the clients set their own pace
    reqs = wl.generate()
    assert reqs.clients == 6 and list(reqs.after[:7]) == [-1] * 6 + [0]


def test_a_link_with_the_command_line_s_names_opens_the_clients():
    """?concurrency=6&think_time_s=0.5, as --concurrency 6 --think-time-s 0.5: the closed loop, the link rewritten
    to the sidebar's keys."""
    at = run_page(EXPLORE, workload="sharegpt", n="120", concurrency="6", think_time_s="0.5")
    assert_clean(at)
    assert at.radio(key="wid:load").value == "clients"
    wl = _scenario(at).workload
    assert (wl.concurrency, wl.think_time_s) == (6, 0.5)
    assert (at.query_params["load"], at.query_params["conc"], at.query_params["think_s"]) == ("clients", "6", "0.5")
    assert "concurrency" not in at.query_params and "think_time_s" not in at.query_params
    # the sidebar's own key wins where a link has both
    at = run_page(EXPLORE, workload="sharegpt", n="120", concurrency="6", load="clients", conc="3")
    assert_clean(at)
    assert _scenario(at).workload.concurrency == 3


def test_the_choice_writes_the_link_and_back():
    at = run_page(EXPLORE, workload="sharegpt", n="120")
    assert_clean(at)
    assert at.radio(key="wid:load").value == "rate" and "load" not in at.query_params
    assert at.number_input(key="wid:conc").disabled and not at.number_input(key="wid:rate").disabled
    assert _scenario(at).workload.concurrency is None
    at.radio(key="wid:load").set_value("clients").run()
    at.number_input(key="wid:conc").set_value(4).run()
    assert_clean(at)
    assert (at.query_params["load"], at.query_params["conc"]) == ("clients", "4")
    assert _scenario(at).workload.concurrency == 4
    at.radio(key="wid:load").set_value("rate").run()
    assert_clean(at)
    assert _scenario(at).workload.concurrency is None and "load" not in at.query_params


@pytest.mark.parametrize("query, needle", [
    (dict(conc="500", n="100"), "500 clients need at least as many requests; the run has 100"),
    (dict(workload="chat-sessions", n="100"), "this workload is multi-turn sessions"),
])
def test_impossible_clients_are_a_message(query, needle):
    at = run_page(EXPLORE, **({"workload": "sharegpt"} | query), load="clients")
    assert not at.exception
    assert any(needle in e.value for e in at.error), [e.value for e in at.error]


def test_bad_link_values_are_clamped_with_a_notice():
    at = run_page(EXPLORE, workload="sharegpt", n="120", load="clients", conc="0", think_s="-3")
    assert_clean(at)
    notes = " ".join(w.value for w in at.warning)
    assert "conc=0" in notes and "out of range (allowed 1 to 10,000)" in notes and "think_s=-3" in notes
    assert _scenario(at).workload.concurrency == 1 and _scenario(at).workload.think_time_s == 0.0


def test_capacity_shows_the_highest_concurrency_within_the_slos():
    at = run_page(CAPACITY, workload="sharegpt", n="240", load="clients", policies="continuous", ttft_ms="200",
                  tpot_ms="30")
    assert_clean(at)
    plan = at.session_state["capacity_last"]
    lib = capacity(Scenario(workload=workload_preset("sharegpt", 1.0, 240, 0).with_concurrency(16)),
                   SLO(ttft_s=0.2, tpot_s=0.03), policy=PRESETS["continuous"])
    # 13 with the vLLM 0.11 profile (14 before it: at 14 clients the P99 TTFT is 205 ms, over the 200 ms SLO)
    assert plan.results["continuous"].max_concurrency == lib.max_concurrency == 13
    df = at.dataframe[0].value
    assert df.loc["continuous", "Clients within the SLOs"] == 13
    assert df.loc["continuous", "Rate per node (req/s)"] == pytest.approx(lib.max_rate_req_s)
    info = " ".join(i.value for i in at.info)
    assert "The highest concurrency within the SLOs" in info and "continuous 13 clients" in info


def test_clients_on_a_disaggregated_split_from_the_link():
    """Closed-loop clients with the serving choice 'disaggregated': Explore runs the split with the clients (each
    sends its next request when the decode instance has streamed the last token), no error, numbers not
    'unbounded'."""
    from batching.sim.simulate import simulate
    from batching.sim.topology.disagg import Disagg

    at = run_page(EXPLORE, workload="sharegpt", n="120", load="clients", conc="8", serving="disaggregated")
    assert_clean(at)
    sc = _scenario(at)
    assert sc.disagg == Disagg() and sc.workload.concurrency == 8
    run = at.session_state["explore_last"][0]
    assert run.disagg == Disagg() and run.workload.concurrency == 8
    req = simulate(run).requests
    client = req["request_id"].to_numpy() % 8
    for c in range(8):  # one request in flight per client: each sent at or after the previous one's release
        mine = req[client == c].sort_values("arrival_s")
        assert (mine["arrival_s"].to_numpy()[1:] >= mine["release_s"].to_numpy()[:-1] - 1e-9).all()
    shown = " ".join(str(m.value) for m in at.metric)
    assert "unbounded" not in shown


def test_capacity_finds_the_highest_concurrency_of_a_split():
    at = run_page(CAPACITY, workload="sharegpt", n="160", load="clients", policies="chunked", ttft_ms="1000",
                  tpot_ms="60", serving="disaggregated")
    assert_clean(at)
    from batching.sim.topology.disagg import Disagg

    plan = at.session_state["capacity_last"]
    assert plan.scenario.disagg == Disagg() and plan.scenario.workload.concurrency is not None
    n = plan.results["chunked"].max_concurrency
    lib = capacity(plan.scenario, SLO(ttft_s=1.0, tpot_s=0.06), policy=PRESETS["chunked"])
    assert n == lib.max_concurrency >= 1
    df = at.dataframe[0].value
    assert df.loc["chunked", "Clients within the SLOs"] == n
