"""The first cards say how full the node is (issue 24 item 10): load (share of capacity), then MFU and MBU, then GPU
busy, each defined in its tooltip, on the showdown and on Explore."""
from __future__ import annotations

from uihelpers import FAST, assert_clean, metric_value, run_page

from batching.charts.formatting import metric_spec
from batching.sim.metrics import DEFINITIONS

LEAD = ["Load (share of capacity)", "MFU", "MBU", "GPU busy"]
KEYS = ["load", "mfu", "mbu", "busy"]


def _check_lead(at) -> None:
    assert_clean(at)
    cards = list(at.metric)
    assert [m.label for m in cards[:4]] == LEAD
    for m, key in zip(cards[:4], KEYS):
        assert m.help == metric_spec(key).help == DEFINITIONS[key][1], key  # each defined in its tooltip
        assert m.value.endswith(" %"), (key, m.value)
    load, busy = metric_value(at, LEAD[0]), metric_value(at, "GPU busy")
    # at the default 1 req/s the node is far from full although the GPU is busy most of the time
    assert 0 < load < 60 and busy > load, (load, busy)
    assert metric_value(at, "MFU") < load


def test_showdown_opens_with_load_then_mfu_mbu_then_busy():
    _check_lead(run_page(**FAST))


def test_explore_opens_with_load_then_mfu_mbu_then_busy():
    _check_lead(run_page("pages/explore.py", **FAST))
