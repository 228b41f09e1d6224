"""Disaggregation on the dashboard's pages (issue 13 §2): pages that run every preset skip static and dynamic
batching on a disaggregated scenario with one caption (never an error) and run the continuous presets split;
Capacity planning's aggregated-vs-disaggregated view finds the capacity within the SLOs of the scenario served
aggregated and split, side by side; the study behind it (``studies.disagg_capacity``) on a tiny case.

The sidebar's Serving control sets ``Scenario.disagg``; these tests set it by wrapping the sidebar's scenario
builder, so they do not depend on that control's URL keys."""
from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))
from uihelpers import FAST, assert_clean, chart_specs, chart_titles, run_page  # noqa: E402

from batching.sim.topology.disagg import Disagg  # noqa: E402
from batching.sim.policy import PRESETS  # noqa: E402
from batching.sim.simulate import Scenario  # noqa: E402
from batching.sim.workload.requests import workload_preset  # noqa: E402
from batching.studies import disagg_capacity as dc  # noqa: E402
from batching.studies.capacity import SLO, capacity, default_slo  # noqa: E402
from batching.ui import cache, sidebar  # noqa: E402
from batching.ui.safe import unescape  # noqa: E402

SPLIT = Disagg(1, 4, 1, 4)
SKIP_TEXT = ("Skipped on this disaggregated scenario: static and dynamic (static and dynamic batching run each batch "
             "as a whole; disaggregation needs iteration-level batching).")
CONTINUOUS = [n for n, p in PRESETS.items() if p.mode == "continuous"]


@pytest.fixture
def disaggregated(monkeypatch):
    """The sidebar's scenario with the split ``SPLIT`` (as the sidebar's Serving control sets it)."""
    build = sidebar._build
    monkeypatch.setattr(sidebar, "_build", lambda: replace(build(), disagg=SPLIT))
    cache.clear()
    yield
    cache.clear()


def captions(at) -> list[str]:
    return [unescape(c.value) for c in at.caption]


# ---------------------------------------------------------------- the study, no Streamlit


def test_skips_name_static_and_dynamic_only_when_disaggregated():
    agg = Scenario(workload=workload_preset("chat", 1.0, 20, 0))
    keep, skipped = dc.runnable(agg, PRESETS)
    assert list(keep) == list(PRESETS) and skipped == {} and dc.skipped_text(skipped) == ""
    keep, skipped = dc.runnable(replace(agg, disagg=SPLIT), PRESETS)
    assert list(keep) == CONTINUOUS == ["continuous", "chunked", "priority"]
    assert list(skipped) == ["static", "dynamic"]
    assert dc.skipped_text(skipped) == SKIP_TEXT
    spec = replace(PRESETS["continuous"], spec_decode="eagle")
    assert dc.disagg_skips(replace(agg, disagg=SPLIT), {"eagle": spec}) == {}  # the decode instances speculate


def test_the_splits_are_the_deployment_searchs():
    """Issue 39 item 1: the page tried three fixed splits (1 x TP 4 + 1 x TP 4, 2 x TP 2 + 1 x TP 4, 1 x TP 4 +
    2 x TP 2) while the search found 3 x TP 2 + 1 x TP 2 best; both now enumerate search.splits_of."""
    from batching.studies.search import splits_of

    for n in (8, 4, 2):
        assert dc.node_splits(n) == [Disagg(*sp) for sp in splits_of(n)[0]]
    assert len(dc.node_splits(8)) == 28 and Disagg(3, 2, 1, 2) in dc.node_splits(8)
    assert dc.node_splits(1) == []
    sc = Scenario(workload=workload_preset("chat", 1.0, 20, 0))  # Qwen2.5-72B BF16 on 8 x H100: TP 1 does not fit
    configs, refused = dc.configurations(sc)
    splits = [c for c in configs if c.kind == "disaggregated"]
    assert [c.scenario.disagg for c in splits] == [d for d in dc.node_splits(8) if 1 not in (d.prefill_tp, d.decode_tp)]
    assert "3 prefill × TP 2 + 1 decode × TP 2" in [c.label for c in splits]
    assert all(d.prefill_tp == 1 or d.decode_tp == 1 for d in dc.node_splits(8) if dc.split_label(d) in refused)
    # copies per node as the search counts them: a 4-GPU split twice, a 6-GPU split once
    from batching.studies.search import Config

    for d in dc.node_splits(8):
        assert dc.copies_per_node(8, d) == Config("h100-sxm", "bf16", d.decode_tp, "chunked", (),
                                                  (d.prefill_instances, d.prefill_tp, d.decode_instances,
                                                   d.decode_tp)).copies_per_node(8)


def test_the_verdict_ranks_per_node_as_the_search_does():
    """A split on 4 GPUs at 2 req/s is two copies per node: 4 req/s per node beats an aggregated node at 3 req/s,
    though a 6-GPU split at 3.3 req/s has more per GPU it runs on (0.55) and a node holds only one of it."""
    import pandas as pd

    rows = [("aggregated: 4 × TP 2", "aggregated", 8, 3.0, 1),
            ("1 prefill × TP 2 + 1 decode × TP 2", "disaggregated", 4, 2.0, 2),
            ("1 prefill × TP 4 + 1 decode × TP 2", "disaggregated", 6, 3.3, 1)]
    frame = pd.DataFrame([{"configuration": c, "kind": k, "gpus": g, "capacity_req_s": r, "copies_per_node": n,
                           "req_s_per_node": r * n, "req_s_per_gpu": r / g, "binding_slo": None, "ttft_p99_s": 0.5,
                           "tpot_p99_s": 0.03, "rates_tried": 5} for c, k, g, r, n in rows], columns=list(dc.COLUMNS))
    study = dc.SplitCapacity(frame, {}, SLO(ttft_s=1.0, tpot_s=0.05), PRESETS["chunked"], {}, 8)
    assert study.best()["configuration"] == "1 prefill × TP 2 + 1 decode × TP 2"
    assert study.verdict().startswith("Most traffic per node within these SLOs: 1 prefill × TP 2 + 1 decode × TP 2, "
                                      "2 req/s on 4 GPUs, 2 copies per node: 4 req/s per node (0.5 req/s per GPU of "
                                      "the node), 1.3× the best aggregated configuration (aggregated: 4 × TP 2).")
    # a configuration within the searches' tolerance of the best is named as tied, not silently outranked
    frame.loc[2, ["capacity_req_s", "req_s_per_node"]] = 3.98
    tie = dc.SplitCapacity(frame, {}, SLO(ttft_s=1.0, tpot_s=0.05), PRESETS["chunked"], {}, 8, 0.01).verdict()
    assert ("Within the searches' tolerance (1 %) of it: 1 prefill × TP 4 + 1 decode × TP 2 (3.98 req/s per node)."
            in tie)


def test_configurations_keep_the_scenario_split_first_and_refuse_what_does_not_fit():
    sc = Scenario(workload=workload_preset("chat", 1.0, 20, 0), disagg=Disagg(1, 2, 1, 2))
    configs, refused = dc.configurations(sc)
    assert [c.label for c in configs][:2] == ["aggregated: TP 8", "1 prefill × TP 2 + 1 decode × TP 2"]
    # then the other aggregated TPs (TP 1 cannot hold Qwen2.5-72B: refused), then the search's splits
    assert [c.label for c in configs][2:4] == ["aggregated: 2 × TP 4", "aggregated: 4 × TP 2"]
    assert [c.gpus for c in configs] == [8, 4, 8, 8, 8, 8, 8, 8, 8, 8] and list(refused)[0] == "aggregated: 8 × TP 1"
    assert [c.label for c in configs].count("1 prefill × TP 2 + 1 decode × TP 2") == 1  # the sidebar's, once
    assert all(c.scenario.policy == PRESETS["chunked"] for c in configs)  # the default policy
    assert configs[0].scenario.disagg is None and configs[0].kind == "aggregated"
    # TP 1 cannot hold Qwen2.5-72B: a 2 x TP 1 prefill split of a 4-GPU quarter is refused with the reason
    _, refused = dc.configurations(sc, splits=[Disagg(2, 1, 1, 4)], agg_tps=(8,))
    assert list(refused) == ["2 prefill × TP 1 + 1 decode × TP 4"]
    assert "the prefill instances (TP 1)" in refused["2 prefill × TP 1 + 1 decode × TP 4"]
    # a request-level policy falls back to the chunked preset
    configs, _ = dc.configurations(sc, PRESETS["static"])
    assert configs[0].scenario.policy == PRESETS["chunked"]


def test_the_study_returns_aggregated_and_split_capacities_for_a_tiny_case():
    sc = Scenario(workload=workload_preset("code", 1.0, 150, 0))
    slo = SLO(ttft_s=5.0, tpot_s=0.05)
    study = dc.disagg_capacity(sc, slo, splits=[SPLIT], rel_tol=0.05, agg_tps=(8,))
    f = study.frame
    assert list(f.columns) == list(dc.COLUMNS)
    assert list(f["configuration"]) == ["aggregated: TP 8", "1 prefill × TP 4 + 1 decode × TP 4"]
    assert list(f["kind"]) == ["aggregated", "disaggregated"] and list(f["gpus"]) == [8, 8]
    assert (f["capacity_req_s"] > 0).all() and study.failed == {}
    # each row is capacity() on that configuration
    for label, split in (("aggregated: TP 8", None), ("1 prefill × TP 4 + 1 decode × TP 4", SPLIT)):
        lib = capacity(replace(sc, policy=PRESETS["chunked"], disagg=split), slo, rel_tol=0.05)
        r = f[f["configuration"] == label].iloc[0].to_dict()
        assert r["capacity_req_s"] == pytest.approx(lib.max_rate_req_s)
        assert r["req_s_per_gpu"] == pytest.approx(lib.max_rate_req_s / 8)
        assert r["copies_per_node"] == 1 and r["req_s_per_node"] == pytest.approx(lib.max_rate_req_s)
        assert (r["binding_slo"] if isinstance(r["binding_slo"], str) else None) == lib.binding_slo
        at = lib.points.loc[(lib.points["rate_req_s"] - lib.max_rate_req_s).abs().idxmin()]
        assert r["tpot_p99_s"] == pytest.approx(at["tpot_p99_s"]) and r["ttft_p99_s"] == pytest.approx(at["ttft_p99_s"])
    # at the rate found each meets the SLOs it was searched for
    assert (f["tpot_p99_s"] <= 0.05 * 1.5).all()
    assert study.verdict().startswith("Most traffic per node within these SLOs: ")


def test_a_tight_tpot_slo_favours_the_split_and_a_loose_one_aggregation_and_the_verdict_says_so():
    """tests/test_disagg.py's finding read through the study: code traffic, TTFT <= 5 s; TPOT <= 50 ms: the
    split wins per GPU and aggregation is held back by TPOT; TPOT <= 200 ms: aggregation wins, the splits are
    held back by TTFT."""
    sc = Scenario(workload=workload_preset("code", 1.0, 1000, 0))
    tight = dc.disagg_capacity(sc, SLO(ttft_s=5.0, tpot_s=0.05), splits=[SPLIT], rel_tol=0.03, agg_tps=(8,))
    loose = dc.disagg_capacity(sc, SLO(ttft_s=5.0, tpot_s=0.2), splits=[SPLIT], rel_tol=0.03, agg_tps=(8,))
    t, lo = tight.frame.set_index("kind"), loose.frame.set_index("kind")
    assert t.loc["disaggregated", "capacity_req_s"] > 1.5 * t.loc["aggregated", "capacity_req_s"]
    assert lo.loc["aggregated", "capacity_req_s"] > lo.loc["disaggregated", "capacity_req_s"]
    assert t.loc["aggregated", "binding_slo"] == "tpot_s" and lo.loc["disaggregated", "binding_slo"] == "ttft_s"
    assert tight.best()["kind"] == "disaggregated" and loose.best()["kind"] == "aggregated"
    assert "Aggregated serving is held back by TPOT" in tight.verdict()
    assert "The splits are held back by TTFT" in loose.verdict()


# ---------------------------------------------------------------- the pages


def test_capacity_side_by_side_view_shows_aggregated_and_split_rows():
    at = run_page("pages/capacity.py", **FAST, cap_view="disagg")
    assert_clean(at)
    assert at.radio(key="wid:cap_view").value == "disagg"
    assert at.selectbox(key="wid:split_policy").value == "chunked"
    df = at.dataframe[0].value
    assert list(df.columns) == ["Configuration", "GPUs", "Capacity (req/s)", "Copies per node", "req/s per node",
                                "req/s per GPU", "Binding SLO", "P99 TTFT (s)", "P99 TPOT (ms)"]
    assert df["Configuration"].iloc[0] == "aggregated: TP 8"
    splits = df[df["Configuration"].str.contains("prefill")]
    assert len(splits) >= 1
    assert (df["Capacity (req/s)"] > 0).all()
    assert df["req/s per GPU"].to_numpy() == pytest.approx((df["Capacity (req/s)"] / df["GPUs"]).to_numpy())
    assert chart_titles(at) == [
        "Aggregated vs disaggregated capacity within the SLOs"]
    assert df["req/s per node"].to_numpy() == pytest.approx((df["Capacity (req/s)"] * df["Copies per node"]).to_numpy())
    assert at.info and at.info[0].value.startswith("Most traffic per node")
    # the rows are the library's: the default SLOs on the sidebar's scenario (mixed, 200 requests, 3 req/s)
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    lib = dc.disagg_capacity(sc, default_slo(2), splits=[])
    assert df["Capacity (req/s)"].iloc[0] == pytest.approx(lib.frame["capacity_req_s"].iloc[0])
    # the per-policy view is still the default
    back = run_page("pages/capacity.py", **FAST, policies="chunked")
    assert_clean(back)
    assert chart_titles(back)[0] == "Capacity per policy within the SLOs"


def test_capacity_side_by_side_marks_the_sidebar_split(disaggregated):
    at = run_page("pages/capacity.py", **FAST, cap_view="disagg", split_policy="continuous")
    assert_clean(at)
    df = at.dataframe[0].value
    assert list(df["Configuration"][:2]) == ["aggregated: TP 8", "1 prefill × TP 4 + 1 decode × TP 4 (sidebar)"]
    assert (df["Capacity (req/s)"] > 0).all()
    assert any(c.startswith("Policy continuous in every configuration") for c in captions(at))


def test_capacity_per_policy_skips_static_and_dynamic_on_a_split(disaggregated):
    at = run_page("pages/capacity.py", **FAST, policies="static,dynamic,chunked")
    assert_clean(at)
    assert SKIP_TEXT in captions(at)
    assert list(at.dataframe[0].value.index) == ["chunked"]
    only = run_page("pages/capacity.py", **FAST, policies="static")
    assert_clean(only)
    assert SKIP_TEXT.replace("static and dynamic (", "static (") in captions(only)
    assert any("iteration-level batching" in w.value for w in only.warning)


def test_compare_skips_static_and_dynamic_on_a_split(disaggregated):
    # the default slots: A dynamic, B continuous, C chunked
    at = run_page("pages/compare.py", **FAST)
    assert_clean(at)
    skipped = [c for c in captions(at) if c.startswith("Skipped on this disaggregated scenario")]
    assert skipped == ["Skipped on this disaggregated scenario: A · dynamic (static and dynamic batching run each "
                       "batch as a whole; disaggregation needs iteration-level batching)."]
    summaries, chosen = at.session_state["compare_last"]
    assert list(summaries) == ["B · continuous", "C · chunked"]
    for s in summaries.values():
        assert s["disaggregated"] == SPLIT.describe() and s["gpus"] == 8 and s["kv_transfer_p50_s"] > 0
    assert len(chart_specs(at)) == 2  # the open tab's CDF and histogram


def test_home_showdown_runs_the_continuous_presets_split(disaggregated):
    at = run_page("app.py", **FAST)
    assert_clean(at)
    assert SKIP_TEXT in captions(at)
    summaries = at.session_state["home_last"]
    assert list(summaries) == CONTINUOUS
    for s in summaries.values():
        assert s["disaggregated"] == SPLIT.describe() and s["capacity_req_s"] > 0
        assert math.isfinite(s["ttft_p99_s"]) and s["decode_busy"] > 0
    curve = at.session_state["home_last_curve"]
    assert isinstance(curve, pd.DataFrame) and set(curve["policy"]) == set(CONTINUOUS)
    assert chart_titles(at)[0] == "Latency against load"
    assert not at.warning


def test_the_sidebar_s_split_from_the_link_reaches_every_page():
    """The same, with the split set the way a user sets it: the sidebar's Serving control (in the link)."""
    cache.clear()
    link = dict(FAST, serving="disaggregated")
    home = run_page("app.py", **link)
    assert_clean(home)
    assert SKIP_TEXT in captions(home) and list(home.session_state["home_last"]) == CONTINUOUS
    cmp = run_page("pages/compare.py", **link)
    assert_clean(cmp)
    assert list(cmp.session_state["compare_last"][0]) == ["B · continuous", "C · chunked"]
    cap = run_page("pages/capacity.py", **link, cap_view="disagg")
    assert_clean(cap)
    df = cap.dataframe[0].value
    assert df["Configuration"].iloc[0] == "aggregated: TP 8"
    assert "1 prefill × TP 4 + 1 decode × TP 4 (sidebar)" in list(df["Configuration"])
    assert (df["Capacity (req/s)"] > 0).all()


def test_compare_summaries_leaves_out_what_a_split_cannot_run():
    sc = Scenario(workload=workload_preset("chat", 1.0, 30, 0), disagg=SPLIT)
    got = cache.compare_summaries(sc, {"static": PRESETS["static"], "chunked": PRESETS["chunked"]})
    assert list(got) == ["chunked"] and got["chunked"]["gpus"] == 8


def test_split_capacity_bars_draw_capacity_and_per_node():
    from batching.charts.disagg import AGGREGATED_COLOR, DISAGGREGATED_COLOR, split_capacity_bars

    frame = pd.DataFrame([
        {"configuration": "aggregated: TP 8", "kind": "aggregated", "gpus": 8, "capacity_req_s": 1.4,
         "req_s_per_node": 1.4},
        {"configuration": "1 prefill × TP 2 + 1 decode × TP 2", "kind": "disaggregated", "gpus": 4,
         "capacity_req_s": 2.0, "req_s_per_node": 4.0}])
    fig = split_capacity_bars(frame, "chunked")
    assert fig.layout.title.text == "Aggregated vs disaggregated capacity within the SLOs"
    assert [list(t.y) for t in fig.data] == [[1.4, 2.0], [1.4, 4.0]]
    assert list(fig.data[0].marker.color) == [AGGREGATED_COLOR, DISAGGREGATED_COLOR]
    assert fig.data[0].x[1] == "1 prefill × TP 2 +<br>1 decode × TP 2"
    empty = split_capacity_bars(frame.iloc[:0])
    assert not empty.data and empty.layout.annotations[-1].text == "No data to show"
