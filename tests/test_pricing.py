"""The one pricing rule (studies/pricing.py): $ per million output tokens at the target traffic from the fleet's
$ per hour and the target's steady-state tokens, and at capacity from one copy at its highest rate."""
from __future__ import annotations

import pytest

from batching.studies import pricing


def test_price_at_the_target_is_the_fleets_dollars_over_the_targets_tokens():
    # 20 req/s, 205.6 output tokens each, a node sustains 6 req/s within the SLOs, headroom 1.25
    p = pricing.price(6.0, 8, 8, 20.0, 2.5, 205.6, headroom=1.25)
    assert p.nodes == 5  # ceil(20 x 1.25 / 6) = ceil(4.17)
    assert p.usd_per_hour == pytest.approx(5 * 8 * 2.5)
    assert p.usd_per_million_output_tokens == pytest.approx(100.0 / (20 * 205.6 * 3600) * 1e6)
    assert p.usd_per_million_output_tokens_at_capacity == pytest.approx(20.0 / (6 * 205.6 * 3600) * 1e6)
    assert p.usd_per_million_output_tokens > p.usd_per_million_output_tokens_at_capacity


def test_copies_smaller_than_a_node_are_counted_in_whole_nodes():
    # a TP 2 replica carries 1.5 req/s: 14 replicas x 2 GPUs = 28 GPUs -> 4 nodes of 8
    p = pricing.price(1.5, 2, 8, 20.0, 2.5, 100.0, headroom=1.0)
    assert p.nodes == 4
    p = pricing.price(1.5, 2, 8, 20.0, 2.5, 100.0, headroom=1.0, nodes=6)  # a fleet check added nodes
    assert p.nodes == 6 and p.usd_per_hour == pytest.approx(6 * 8 * 2.5)


def test_no_sustainable_rate_has_no_nodes_and_no_price():
    p = pricing.price(0.0, 8, 8, 20.0, 2.5, 100.0)
    assert p.nodes is None and p.usd_per_million_output_tokens is None
    assert p.usd_per_million_output_tokens_at_capacity is None


def test_the_price_table_covers_every_gpu_preset_with_a_date_and_a_source():
    from batching.sim.hardware.specs import GPUS

    table = pricing.price_table()
    assert set(GPUS) <= set(table)
    for row in table.values():
        assert row.usd_per_gpu_hour > 0 and len(row.as_of) == 10 and "http" in row.source


def test_a_price_file_in_the_environment_replaces_the_table(tmp_path, monkeypatch):
    f = tmp_path / "prices.csv"
    f.write_text("gpu,usd_per_gpu_hour,as_of,source\nh100-sxm,1.11,2026-11-30,our contract\n")
    monkeypatch.setenv(pricing.PRICES_ENV, str(f))
    assert pricing.default_gpu_hour_usd("h100-sxm") == 1.11
    with pytest.raises(ValueError, match=r"gpu='b200' has no default price; priced: h100-sxm"):
        pricing.default_gpu_hour_usd("b200")
    f2 = tmp_path / "bad.csv"
    f2.write_text("gpu,usd_per_gpu_hour,as_of,source\nh100-sxm,-3,2026-11-30,x\n")
    monkeypatch.setenv(pricing.PRICES_ENV, str(f2))
    with pytest.raises(ValueError, match=r"bad.csv': row 2: usd_per_gpu_hour='-3' is out of range"):
        pricing.price_table()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, 2e6])
def test_prices_out_of_range_are_named(bad):
    with pytest.raises(ValueError, match=r"gpu_hour_usd=.* is out of range; allowed > 0 to 1e\+06"):
        pricing.price(6.0, 8, 8, 20.0, bad, 100.0)
