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
