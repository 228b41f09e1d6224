"""Closed-loop clients (issue 23 item 1): --concurrency N sends each client's next request when its previous one
is released (think_time_s later), as vllm bench serve --max-concurrency, SGLang bench_serving and genai-perf's
concurrency mode do; every latency is the client's, measured from the send."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from batching.sim.hardware.specs import deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, admitted, simulate
from batching.sim.workload.requests import MAX_CONCURRENCY, workload_preset


def _scenario(n_clients: int, requests: int = 240, think: float = 0.0, workload: str = "sharegpt") -> Scenario:
    wl = workload_preset(workload, 1.0, requests, 0).with_concurrency(n_clients, think)
    return Scenario(deployment(), wl, PRESETS["continuous"])


def _client_of(res) -> np.ndarray:
    return res.requests["request_id"].to_numpy() % res.scenario.workload.concurrency


# ---------------------------------------------------------------- the workload


def test_requests_are_the_open_loops_sent_by_n_clients():
    open_loop = workload_preset("mixed", 1.0, 50, 3)
    closed = open_loop.with_concurrency(4, 2.0).generate()
    base = open_loop.generate()
    np.testing.assert_array_equal(closed.prompt_tokens, base.prompt_tokens)  # same lengths and classes
    np.testing.assert_array_equal(closed.output_tokens, base.output_tokens)
    np.testing.assert_array_equal(closed.priority, base.priority)
    np.testing.assert_array_equal(closed.after, np.r_[[-1] * 4, np.arange(46)])
    np.testing.assert_array_equal(closed.think_s, np.r_[[0.0] * 4, [2.0] * 46])
    np.testing.assert_array_equal(closed.arrival_s[:4], 0.0)  # the first N sent at once
    assert closed.clients == 4
    closed.validate()
    sat = closed.saturated()  # the engine flat out: no client links
    assert sat.after is None and sat.clients == 0 and not sat.arrival_s.any()


@pytest.mark.parametrize("kw, message", [
    (dict(concurrency=0), "concurrency=0 is out of range; allowed 1 to 50"),
    (dict(concurrency=51), "concurrency=51 is out of range; allowed 1 to 50 (at most num_requests=50"),
    (dict(concurrency=2.5), "concurrency=2.5 is not an integer; allowed 1 to 50"),
    (dict(concurrency=True), "concurrency=True is not an integer"),
    (dict(concurrency=4, think_time_s=-1.0), "think_time_s=-1 is out of range; allowed 0 to 86400"),
    (dict(concurrency=4, think_time_s=float("nan")), "think_time_s=nan is out of range"),
    (dict(think_time_s=1.0), "think_time_s=1 needs concurrency"),
])
def test_bad_concurrency_is_one_line_naming_field_value_and_range(kw, message):
    wl = replace(workload_preset("mixed", 1.0, 50, 0), **kw)
    with pytest.raises(ValueError) as err:
        wl.validate()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_concurrency_cap_and_sessions_are_exclusive():
    big = workload_preset("mixed", 1.0, 20_000, 0)
    with pytest.raises(ValueError, match=f"allowed 1 to {MAX_CONCURRENCY}"):
        big.with_concurrency(MAX_CONCURRENCY + 1).validate()
    with pytest.raises(ValueError, match="with sessions: allowed one of them"):
        workload_preset("chat-sessions", 1.0, 50, 0).with_concurrency(4).validate()


def test_a_rejected_request_does_not_end_its_client():
    """A request over the context is refused at once (vLLM's 400); the client sends its next one, which stays
    linked to the client's last admitted request instead of becoming an extra client."""
    wl = workload_preset("mixed", 1.0, 12, 0).with_concurrency(3, 1.0)
    reqs = wl.generate()
    prompt = reqs.prompt_tokens.copy()
    prompt[4] = 40_000  # client 1's second request: over Qwen2.5-72B's 32,768 tokens
    kept, rejected = admitted(replace(reqs, prompt_tokens=prompt), deployment().model)
    assert len(kept) == 11 and rejected.sum() == 1
    # old 7 (client 1's third, now 6) follows old 1 (its first); the rest keep their client, renumbered
    np.testing.assert_array_equal(kept.after, [-1, -1, -1, 0, 2, 3, 1, 4, 5, 6, 7])
    assert kept.clients == 3


# ---------------------------------------------------------------- as the engine runs it


@pytest.fixture(scope="module")
def eight():
    return simulate(_scenario(8, 480, think=0.5))


def test_every_request_runs_once_and_each_client_has_one_in_flight(eight):
    req = eight.requests
    assert len(req) == 480 and req["request_id"].is_unique
    assert np.isfinite(req["release_s"]).all() and (req["release_s"] >= req["arrival_s"]).all()
    client = _client_of(eight)
    for c in range(8):
        mine = req[client == c].sort_values("arrival_s")
        send, done = mine["arrival_s"].to_numpy(), mine["release_s"].to_numpy()
        assert len(mine) == 60
        # the next send is think_time_s after the previous release: never two in flight
        np.testing.assert_allclose(send[1:], done[:-1] + 0.5, rtol=0, atol=1e-9)
        assert (send[1:] > done[:-1]).all()
    # at any moment at most 8 requests are in flight (sent, not released)
    events = np.r_[req["arrival_s"].to_numpy(), req["release_s"].to_numpy()]
    moves = np.r_[np.ones(len(req)), -np.ones(len(req))]
    order = np.lexsort((moves, events))  # a release before a send at the same instant
    assert np.cumsum(moves[order]).max() <= 8


def test_ttft_is_measured_from_the_send(eight):
    req = eight.requests
    np.testing.assert_allclose(req["ttft_s"], req["first_token_s"] - req["arrival_s"], rtol=0, atol=1e-12)
    later = req["request_id"] >= 8
    assert req.loc[later, "arrival_s"].min() > 0.5  # later sends are at their client's release + think, not 0
    assert req["ttft_s"].max() < 1.0  # 8 clients never queue behind a backlog (an open loop at t = 0 would)
    s = eight.summary()
    assert s["concurrency"] == 8 and s["think_time_s"] == 0.5


def test_littles_law(eight):
    """N = throughput x (mean E2E + think) over the window where every client is still sending (measured 7.91 for
    8 clients: the window's end cuts each client's cycle in flight, ~1 % of the 60 each completes)."""
    req = eight.requests
    client = _client_of(eight)
    end = min(req.loc[client == c, "release_s"].max() for c in range(8))  # the first client's last release
    done = req[req["release_s"] <= end]
    throughput = len(done) / end
    e2e = float((done["release_s"] - done["arrival_s"]).mean())
    assert throughput * (e2e + 0.5) == pytest.approx(8, rel=0.03)


def test_throughput_grows_with_clients_then_saturates():
    thr = {}
    for n in (1, 2, 48, 96):
        s = simulate(_scenario(n, 288)).summary()
        thr[n] = s["throughput_output_tok_s"]
    assert thr[2] / thr[1] > 1.8  # two clients: the batch of two costs little more than one
    assert thr[96] / thr[48] < 1.5  # the node is near its capacity
    ceiling = simulate(_scenario(96, 288), saturated=True).summary()["throughput_output_tok_s"]
    assert thr[48] < thr[96] <= ceiling * 1.05


def test_same_seed_same_run():
    a, b = simulate(_scenario(4, 60, 0.2)), simulate(_scenario(4, 60, 0.2))
    np.testing.assert_array_equal(a.requests["release_s"], b.requests["release_s"])
    np.testing.assert_array_equal(a.requests["arrival_s"], b.requests["arrival_s"])


def test_a_saturating_closed_loop_is_not_called_overloaded():
    """200 clients send 20.4 req/s, at the saturated run's 20.2 req/s: the open-loop rule (offered >= capacity)
    would mark its latencies unbounded, but 200 clients keep at most 200 requests in the system, so TTFT and TPOT
    are what a --max-concurrency 200 benchmark measures."""
    from batching.studies.compare import compare, is_unbounded

    wl = workload_preset("sharegpt", 1.0, 400, 0).with_concurrency(200)
    s = compare(Scenario(workload=wl, policy=PRESETS["chunked"]), {"chunked": PRESETS["chunked"]}).summaries()["chunked"]
    assert s["offered_req_s"] >= s["capacity_req_s"] and s["load"] > 0.8
    assert s["overloaded"] is False and not is_unbounded("ttft_p99_s", s)


# ---------------------------------------------------------------- capacity: the highest concurrency


def test_capacity_searches_the_highest_concurrency_within_the_slos():
    from batching.studies.capacity import SLO, capacity, meets_slo, slo_point

    sc = _scenario(1, 240)
    slo = SLO(ttft_s=0.2, tpot_s=0.03)
    found = capacity(sc, slo, gpu_hour_usd=2.69, target_rate_req_s=10.0)
    n = found.max_concurrency
    # measured with the vllm engine profile (its FlashAttention-3 prompt and decode-attention factors, tokenisation):
    # 13 clients send 3.72 req/s with P99 TTFT 179 ms; 14 clients reach 205 ms (196 ms before the profiles)
    assert n == 13
    at_n = slo_point(sc.with_workload(sc.workload.with_concurrency(n)), slo)
    above = slo_point(sc.with_workload(sc.workload.with_concurrency(n + 1)), slo)
    assert meets_slo(at_n, slo) and not meets_slo(above, slo)
    assert found.max_rate_req_s == pytest.approx(at_n["offered_req_s"])  # the rate N clients send, priced
    assert found.binding_slo == "ttft_s" and found.nodes_needed >= 1
    assert found.to_dict()["max_concurrency"] == n
    assert list(found.points["concurrency"]) == sorted(found.points["concurrency"])
    none = capacity(sc, SLO(ttft_s=0.001))  # not even one client's first token in 1 ms
    assert none.max_concurrency == 0 and none.max_rate_req_s == 0.0


def test_captions_say_clients_not_a_rate():
    from batching.charts.export import scenario_caption
    from batching.report import describe_workload

    sc = _scenario(8, 240, think=0.5)
    line = scenario_caption(sc)
    assert "8 clients (closed loop, think 0.5 s)" in line and "req/s" not in line
    assert "concurrency searched" in scenario_caption(sc, rate="rate searched")
    assert describe_workload(sc.workload).startswith("8 clients (closed loop, think 0.5 s); classes: sharegpt")
