"""Exported bars mark an overloaded policy "unbounded" instead of plotting its run-length latency (issue 24 item 8)."""
import math

from batching.charts import policy as charts


def _summary(overloaded: bool, ttft: float) -> dict:
    return {"throughput_output_tok_s": 1000.0, "capacity_output_tok_s": 1200.0, "ttft_p50_s": ttft / 2,
            "ttft_p99_s": ttft, "tpot_p50_s": 0.02, "tpot_p99_s": 0.03, "overloaded": overloaded, "load": 0.9,
            "offered_req_s": 5.0, "capacity_req_s": 4.0, "queue_growth_req_s": 1.0,
            "by_priority": {"0": {"class_name": "chat", "ttft_p99_s": ttft}}}


SUMS = {"continuous": _summary(False, 0.4), "static": _summary(True, 512.0)}


def _unbounded_at(fig) -> set[tuple[str, str]]:
    return {(a.x, a.xref) for a in fig.layout.annotations if a.text == charts.UNBOUNDED_TEXT}


def test_showdown_bars_write_unbounded_for_an_overloaded_policy():
    fig = charts.showdown_bars(SUMS)
    for tr in fig.data:
        if tr.xaxis in ("x2", "x3"):  # the latency panels
            y = dict(zip(tr.x, tr.y))
            assert math.isnan(y["static"]), tr.name  # no ~500 s bar
            assert not math.isnan(y["continuous"])
        else:  # throughput and capacity stay: they are bounded
            assert not math.isnan(dict(zip(tr.x, tr.y))["static"])
    assert _unbounded_at(fig) == {("static", "x2"), ("static", "x3")}
    # the log axis is ranged on the bounded bars only: 512 s is nowhere near it
    assert max(fig.layout.yaxis2.tickvals) < 100


def test_class_bars_write_unbounded_for_an_overloaded_policy():
    fig = charts.class_ttft_bars(SUMS)
    y = dict(zip(fig.data[0].x, fig.data[0].y))
    assert math.isnan(y["static"]) and y["continuous"] == 0.4
    assert _unbounded_at(fig) == {("static", "x")}
