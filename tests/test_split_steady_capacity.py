"""A prefill/decode split's capacity from its saturated run is its steady state (issue 39 item 1): the slower tier
while it is full, not N / (first arrival to last release), which counts the pipeline's fill and the drain of the last
long outputs and so grew with the run's length (70B FP8 3 x TP 2 + 1 x TP 2 on H200: 23.4 req/s at 2,000 requests,
31.2 at 8,000)."""
from dataclasses import replace

from batching.sim.hardware.specs import deployment
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.topology.disagg import Disagg
from batching.sim.workload.requests import workload_preset
from batching.studies.compare import with_capacity

SPLIT = Disagg(3, 1, 1, 1)  # Llama-3.1-8B: three prefill instances feed one decode instance, which binds


def _split(n: int) -> Scenario:
    return Scenario(deployment(model="llama-3.1-8b"), workload_preset("chat", 1.0, n, 0), PRESETS["chunked"],
                    disagg=SPLIT)


def test_a_splits_capacity_does_not_depend_on_the_runs_length():
    short, long = (simulate(_split(n), saturated=True).summary() for n in (300, 1200))
    # what run and compare print (with_capacity), the ceiling the capacity searches start from (saturated_capacity)
    (cap_s, tok_s), (cap_l, tok_l) = ((c["capacity_req_s"], c["capacity_output_tok_s"])
                                      for c in (with_capacity(s, s) for s in (short, long)))
    assert abs(cap_s / cap_l - 1) < 0.10, (cap_s, cap_l)
    assert abs(tok_s / tok_l - 1) < 0.12, (tok_s, tok_l)
    # the whole run's throughput (fill and drain counted) is what it replaced: it doubles from 300 to 1,200
    assert short["throughput_req_s"] < 0.6 * long["throughput_req_s"]
    # the decode instance binds: its tier is the slower, and the capacity is it
    assert long["decode_capacity_req_s"] < long["prefill_capacity_req_s"]
    assert cap_l == long["steady_capacity_req_s"] == long["decode_capacity_req_s"]
    from batching.sim.metrics import saturated_capacity

    assert (cap_l, tok_l) == saturated_capacity(long)


def test_run_at_a_rate_the_split_sustains_is_not_called_overloaded():
    sat = simulate(_split(1200), saturated=True).summary()
    cap = with_capacity(sat, sat)["capacity_req_s"]
    rate = 0.85 * cap
    sc = replace(_split(300), workload=workload_preset("chat", rate, 300, 0))
    s = with_capacity(simulate(sc).summary(), simulate(sc, saturated=True).summary())
    assert abs(s["capacity_req_s"] / cap - 1) < 0.10
    assert not s["overloaded"], (rate, s["capacity_req_s"], s["queue_growth_req_s"])


def test_aggregated_capacity_is_the_whole_runs_throughput():
    from batching.sim.metrics import saturated_capacity
    sc = replace(_split(200), disagg=None)
    s = simulate(sc, saturated=True).summary()
    assert "steady_capacity_req_s" not in s
    assert saturated_capacity(s) == (s["throughput_req_s"], s["throughput_output_tok_s"])


def test_a_splits_nodes_are_whole_copies_per_node_as_the_search_counts_them():
    """capacity's split lines: a 6-GPU split is one copy per 8-GPU node (a copy never straddles two nodes), so 4
    copies need 4 nodes, as search.copies_at_target counts them (3 before: 4 x 6 GPUs packed into 24 / 8)."""
    from batching.studies.capacity import plan_price
    from batching.studies.search import copies_at_target

    for split, copies_per_node in ((Disagg(1, 4, 1, 2), 1), (Disagg(1, 1, 1, 1), 4), (Disagg(1, 2, 1, 1), 2)):
        sc = replace(_split(10), disagg=split)
        for usd in (None, 2.5):
            got = plan_price(sc, 10.0, 35.0, usd, headroom=1.0, mean_output=200.0)
            nodes = copies_at_target(10.0, 35.0, 1.0, copies_per_node)[0]
            assert got["nodes_needed"] == nodes, (split, usd, got["nodes_needed"], nodes)
            assert got["fleet_capacity_req_s"] == nodes * copies_per_node * 10.0
            if usd is not None:
                assert got["usd_per_hour"] == nodes * 8 * usd
