"""Issue 39 item 5: the search's summary says where each P99 was read. Its P99s were said to be "at that rate" beside
the rate per copy, though one copy was run at target / copies; and a fleet check's P99 (the whole fleet at target x
headroom, 40.3 ms) sat beside the per-copy one (29.4 ms) in one sentence with nothing to tell them apart."""
from __future__ import annotations

from batching.studies.search import chosen_sentence

ROW = {"label": "h200-sxm fp8 tp4 chunked", "max_rate_req_s": 28.3, "nodes_needed": 2, "nodes_per_copy": 1,
       "usd_per_million_output_tokens": 2.265, "rate_per_copy_at_target_req_s": 15.0, "ttft_p99_s": 0.296,
       "tpot_p99_s": 0.0294, "fleet_checked": True, "fleet_verified": True, "router": "least-outstanding",
       "fleet_ttft_p99_s": 0.395, "fleet_tpot_p99_s": 0.0403, "fleet_nodes_tried": [{"nodes": 2}]}


def test_each_p99_says_where_it_was_read():
    text = chosen_sentence(ROW, 30.0, 1.25)
    assert "at that rate" not in text
    assert ("Fleet check: 2 nodes behind least-outstanding met the SLOs at 37.5 req/s (the target × 1.25 headroom), "
            "the whole fleet's P99 TTFT 0.395 s and P99 TPOT 40.3 ms there") in text
    assert ("At the target without headroom, one copy carrying 15 req/s (the target / 2 copies, perfect balance): "
            "P99 TTFT 0.296 s, P99 TPOT 29.4 ms") in text


def test_a_row_not_checked_as_a_fleet_or_not_verified_says_so():
    plain = chosen_sentence(ROW | {"fleet_checked": False}, 30.0, 1.25)
    assert "perfect load balancing assumed: not simulated as a fleet" in plain and "Fleet check" not in plain
    missed = chosen_sentence(ROW | {"fleet_verified": False, "nodes_needed": 6, "fleet_nodes_tried": [{"nodes": 5}]},
                             30.0, 1.25)
    assert "Fleet check: 5 nodes behind least-outstanding still missed the SLOs at 37.5 req/s" in missed
