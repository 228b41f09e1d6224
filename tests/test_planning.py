"""The planning rules without Streamlit (batching/studies/planning.py): knobs and ranges, the readings of a
sweep, the three guided checks on synthetic sweeps built to trigger each (and on a real one), the knee
sentence, and the capacity plan for a target and a price."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from batching.sim.policy import KNOB_LIMITS, PRESETS, with_knobs
from batching.sim.simulate import Scenario
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.requests import DEFAULT_RATE_REQ_S, MAX_RATE_REQ_S, workload_preset
from batching.studies import planning as sp
from batching.studies.capacity import SLO, CapacityResult, default_slo
from batching.studies.knee import sweep_knee
from batching.studies.sweeps import apply_knob


def mixed(rate: float = 3.0, n: int = 200) -> Scenario:
    return Scenario(workload=workload_preset("mixed", rate, n, 0))



def frame(x, **cols) -> pd.DataFrame:
    n = len(x)
    base = dict(steady_output_tok_s=800.0, capacity_output_tok_s=2000.0, offered_output_tok_s=800.0,
                offered_req_s=3.0, ttft_p50_s=0.1, ttft_p99_s=0.5, tpot_p50_s=0.02, tpot_p99_s=0.03,
                capacity_tpot_p99_s=0.05, sol_util=0.4, batch_efficiency=0.3, preemptions=0, kv_pressure=0.1,
                mean_running=10.0)
    data = {k: np.broadcast_to(np.asarray(cols.get(k, v), float), n).copy() for k, v in base.items()}
    return pd.DataFrame({"x": np.asarray(x, float), **data})


def renamed(df: pd.DataFrame, knob: str) -> pd.DataFrame:
    return df.rename(columns={"x": knob})


def test_card_1_rule():
    x = [16, 32, 64, 128]
    df = renamed(frame(x, capacity_output_tok_s=[1000, 1500, 1600, 1590], kv_pressure=[0.3, 0.5, 0.6, 0.9],
                       preemptions=[0, 0, 0, 40]), "max_num_seqs")
    card = sp.card_cap_too_large(df, "max_num_seqs", 64.0, 0.05, 256.0)
    assert card.fired and card.suggestion == 64.0
    assert card.text.startswith("The configured max_num_seqs = 256 is past the knee")
    assert "Lower max_num_seqs to 64, the knee." in card.text
    assert any("60 %" in t and "90 %" in t for t in card.triggers)
    # same capacity, but nothing rises past the knee: a larger cap costs latency only
    calm = df.assign(kv_pressure=0.6, preemptions=0)
    assert not sp.card_cap_too_large(calm, "max_num_seqs", 64.0, 0.05, 256.0).fired
    # a KV rise under 2 points of the cache does not count; preemptions alone do
    assert not sp.card_cap_too_large(calm.assign(kv_pressure=[0.3, 0.5, 0.6, 0.61]), "max_num_seqs", 64.0,
                                     0.05, 256.0).fired
    assert sp.card_cap_too_large(calm.assign(preemptions=[0, 0, 0, 1]), "max_num_seqs", 64.0, 0.05, 256.0).fired
    # it speaks about the configured cap: at or below the knee (or none) it does not fire, and says why
    for current, why in ((64.0, "the configured max_num_seqs is 64, at or below the knee"),
                         (32.0, "the configured max_num_seqs is 32, at or below the knee"),
                         (None, "the configured max_num_seqs is not set")):
        quiet = sp.card_cap_too_large(df, "max_num_seqs", 64.0, 0.05, current)
        assert not quiet.fired and why in quiet.text and quiet.triggers == card.triggers
    # capacity still growing past the knee value given: not fired; no knee or not a cap: not fired
    grow = df.assign(capacity_output_tok_s=[1000, 1500, 1600, 2000])
    assert not sp.card_cap_too_large(grow, "max_num_seqs", 64.0, 0.05, 256.0).fired
    assert not sp.card_cap_too_large(df, "max_num_seqs", None, 0.05, 256.0).fired
    assert not sp.card_cap_too_large(renamed(frame(x), "rate_req_s"), "rate_req_s", 64.0, 0.05, 3.0).fired
    # a sweep with SLOs reads the capacity within them: flat there while the saturated tok/s still grows
    slo = grow.assign(max_rate_req_s=[2.0, 3.5, 4.0, 4.02])
    within = sp.card_cap_too_large(slo, "max_num_seqs", 64.0, 0.05, 256.0)
    assert within.fired and within.triggers[0].startswith("capacity within the SLOs 4 req/s at the knee (64), at "
                                                          "most 4.02 req/s past it")


def test_card_2_rule():
    pol = PRESETS["continuous"]
    x = [2, 4, 8, 16]
    df = renamed(frame(x, batch_efficiency=[1.0, 0.99, 0.6, 0.3], capacity_output_tok_s=[300, 550, 900, 1300],
                       offered_output_tok_s=800, ttft_p50_s=[50, 20, 0.1, 0.1], ttft_p99_s=[90, 40, 0.5, 0.5]),
                 "max_num_seqs")
    card = sp.card_cap_too_small(df, "max_num_seqs", pol, 4.0)
    assert card.fired and card.suggestion == 8.0 and "≤ 4" in card.text
    assert card.text.startswith("The configured max_num_seqs = 4 is too small")
    assert sp.card_cap_too_small(df, "max_num_seqs", pol, 2.0).fired  # a smaller cap is at least as short
    # the configured cap above the values that are too small: not fired, and it says where the sweep shows it
    above = sp.card_cap_too_small(df, "max_num_seqs", pol, 256.0)
    assert not above.fired and above.text == ("Not fired: at max_num_seqs ≤ 4 every slot is taken while requests "
                                              "wait, but the configured max_num_seqs is 256, above that range.")
    # the GPU has no room: not fired
    assert not sp.card_cap_too_small(df.assign(sol_util=0.95), "max_num_seqs", pol, 4.0).fired
    # batches not full: not fired
    assert not sp.card_cap_too_small(df.assign(batch_efficiency=0.5), "max_num_seqs", pol, 4.0).fired
    # full but no queue (offered load well under capacity, flat TTFT): not fired
    quiet = df.assign(offered_output_tok_s=100, ttft_p50_s=0.1, ttft_p99_s=0.5)
    assert not sp.card_cap_too_small(quiet, "max_num_seqs", pol, 4.0).fired
    # a larger cap adds no capacity (another limit binds): not fired for a sweep of the cap
    stuck = df.assign(capacity_output_tok_s=300)
    assert not sp.card_cap_too_small(stuck, "max_num_seqs", pol, 4.0).fired
    # with SLOs the gain is read on the capacity within them
    assert not sp.card_cap_too_small(df.assign(max_rate_req_s=2.0), "max_num_seqs", pol, 4.0).fired
    # every value still queues but capacity peaks inside the range: suggest the peak, not "raise it further"
    over = df.assign(offered_output_tok_s=5000, batch_efficiency=[1.0, 1.0, 1.0, 0.9],
                     capacity_output_tok_s=[300, 550, 900, 850])
    card = sp.card_cap_too_small(over, "max_num_seqs", pol, 4.0)
    assert card.fired and card.suggestion == 8.0 and "more nodes" in card.text
    # ... and never past the knee: there a larger cap buys less than the knee share
    grows = over.assign(capacity_output_tok_s=[300, 550, 900, 1300])
    assert sp.card_cap_too_small(grows, "max_num_seqs", pol, 4.0).suggestion == 16.0
    capped = sp.card_cap_too_small(grows, "max_num_seqs", pol, 4.0, knee=8.0)
    assert capped.suggestion == 8.0 and "the knee" in capped.text
    # another knob: the check reads the row of the configured value (the sidebar's rate), not the others
    rates = renamed(frame([1, 2, 4, 8], batch_efficiency=[0.3, 0.5, 0.7, 1.0], capacity_output_tok_s=800,
                          offered_output_tok_s=[100, 200, 400, 800], ttft_p50_s=[0.1, 0.1, 0.1, 20],
                          ttft_p99_s=[0.5, 0.5, 0.5, 60]), "rate_req_s")
    hit = sp.card_cap_too_small(rates, "rate_req_s", pol, 256.0, configured=8.0)
    assert hit.fired and hit.text.startswith("At the configured rate_req_s = 8 req/s the batch is full "
                                             "(max_num_seqs = 256)")
    near = sp.card_cap_too_small(rates, "rate_req_s", pol, 256.0, configured=3.0)
    assert not near.fired and near.text.startswith("Not fired at the configured rate_req_s = 3 req/s (nearest value "
                                                   "swept: 4 req/s)")
    assert "at rate_req_s = 8 req/s, values the scenario does not run" in near.text
    out = sp.card_cap_too_small(rates, "rate_req_s", pol, 256.0, configured=20.0)
    assert not out.fired and "lies outside the range swept (1 req/s to 8 req/s)" in out.text


def test_card_3_rule():
    x = [2, 8, 32]
    df = renamed(frame(x, batch_efficiency=[0.8, 0.55, 0.2], capacity_output_tok_s=[200, 300, 400],
                       offered_output_tok_s=90, offered_req_s=0.3, mean_running=[1.6, 4.4, 6.4]), "max_batch_size")
    static = sp.card_efficiency_low(df, "max_batch_size", PRESETS["static"], 32.0)
    assert static.fired and static.suggestion == 8.0 and "dynamic batching" in static.text
    assert static.text.startswith("At the configured max_batch_size = 32 batches run under half full")
    assert any("106.7 s to arrive" in t for t in static.triggers)  # a batch of 32 at 0.3 req/s
    dynamic = sp.card_efficiency_low(df, "max_batch_size", PRESETS["dynamic"], 32.0)
    assert dynamic.fired and "raise max_wait_s from 100 ms" in dynamic.text
    # a larger configured cap than any swept fills no better than the largest: still fired, about that cap
    big = sp.card_efficiency_low(df, "max_batch_size", PRESETS["static"], 64.0)
    assert big.fired and "(nearest value swept: 32)" in big.text and "a cap of 64" in big.text
    # the configured cap fills its batches: not fired, though smaller arrivals would leave a larger cap half empty
    fine = sp.card_efficiency_low(df, "max_batch_size", PRESETS["static"], 8.0)
    assert not fine.fired and "batch efficiency 55 %" in fine.text and "at max_batch_size = 32, values" in fine.text
    assert not sp.card_efficiency_low(df, "max_batch_size", PRESETS["static"], 1.0).fired  # below the range
    # over capacity, low efficiency is not about arrivals
    assert not sp.card_efficiency_low(df.assign(offered_output_tok_s=500), "max_batch_size",
                                      PRESETS["static"], 32.0).fired
    # continuous batching: headroom, never fired
    assert not sp.card_efficiency_low(df, "max_batch_size", PRESETS["continuous"], 32.0).fired


def test_checks_stay_quiet_on_a_knob_the_policy_does_not_use():
    """A continuous policy swept on max_batch_size (which it does not use): every value runs the same, and no check
    speaks about it, whatever the frame shows."""
    sc = mixed().with_policy(PRESETS["continuous"])
    df = renamed(frame([8, 32, 128], batch_efficiency=0.2, offered_output_tok_s=90, offered_req_s=0.3,
                       capacity_output_tok_s=[200, 300, 400]), "max_batch_size")
    checks = sp.cards(df, "max_batch_size", sc, None, 0.05)
    assert [c.fired for c in checks] == [False, False, False]
    assert all("does not use max_batch_size" in c.text for c in checks)
    # the same frame on static batching, whose cap it is, fires check 3 at its configured 32
    assert sp.cards(df, "max_batch_size", sc.with_policy(PRESETS["static"]), None, 0.05)[2].fired


def test_default_ranges_are_valid_for_every_knob():
    sc = Scenario(workload=workload_preset("mixed", 3.0, 200, 0))
    for name, pol in PRESETS.items():
        run = sc.with_policy(pol)
        for knob in sp.knobs_for(pol, run):
            start, stop, points, spacing = sp.default_range(knob, run, capacity_req_s=8.0)
            low, high = sp.bounds(knob, run)
            assert low <= start < stop <= high, (name, knob)
            values = sp.knob_values(knob, start, stop, points, spacing)
            assert len(values) >= 2
    # without chunked prefill the budget range starts at the longest prompt (rounded up to a power of two)
    longest = int(sc.workload.generate().prompt_tokens.max())
    start = sp.default_range("max_num_batched_tokens", sc.with_policy(PRESETS["continuous"]))[0]
    assert start >= longest and start / 2 < longest
    assert sp.knob_values("max_num_seqs", 8, 1024, 8, "log") == [8, 16, 32, 64, 128, 256, 512, 1024]
    with pytest.raises(ValueError, match="start above 0"):
        sp.knob_values("high_share", 0, 1, 5, "log")
    with pytest.raises(ValueError, match="fewer than two"):
        sp.knob_values("max_num_seqs", 1, 1.4, 5, "linear")


# ---------------------------------------------------------------- knobs and ranges


def test_bounds_are_the_policy_and_workload_limits():
    for knob in ("max_batch_size", "max_num_seqs", "max_wait_s", "max_num_batched_tokens"):
        assert sp.KNOB_BOUNDS[knob] == KNOB_LIMITS[knob]
    assert sp.KNOB_BOUNDS["max_num_seqs"] == (1, 4096) and sp.KNOB_BOUNDS["max_num_batched_tokens"] == (16, 1_048_576)
    assert sp.KNOB_BOUNDS["rate_req_s"] == (0.01, MAX_RATE_REQ_S) == (0.01, 10_000.0)
    sc = mixed()
    assert sp.bounds("kv_cache_tokens", sc) == (KV_BLOCK_TOKENS, sc.deployment.kv_capacity_tokens_max)
    assert sp.bounds("high_share", sc) == (0.0, 1.0)
    with pytest.raises(ValueError, match="knob='batch' is unknown"):
        sp.bounds("batch", sc)


def test_knobs_each_policy_can_sweep():
    sc = mixed()
    common = ["high_share", "rate_req_s", "kv_cache_tokens"]
    assert sp.knobs_for(PRESETS["static"], sc) == ["max_batch_size", *common]
    assert sp.knobs_for(PRESETS["dynamic"], sc) == ["max_batch_size", "max_wait_s", *common]
    assert sp.knobs_for(PRESETS["chunked"], sc) == ["max_num_seqs", "max_num_batched_tokens", *common]
    # one priority class: the traffic mix has nothing to move
    chat = Scenario(workload=workload_preset("chat", 3.0, 50, 0))
    assert "high_share" not in sp.knobs_for(PRESETS["continuous"], chat)
    assert sp.default_knob(PRESETS["continuous"]) == "max_num_seqs" == sp.cap_name(PRESETS["priority"])
    assert sp.default_knob(PRESETS["dynamic"]) == "max_batch_size"


def test_current_values():
    sc = mixed(rate=2.5).with_policy(PRESETS["dynamic"])
    assert sp.current_value(sc, "max_batch_size") == 64.0
    assert sp.current_value(sc, "max_wait_s") == 0.1
    assert sp.current_value(sc, "rate_req_s") == 2.5
    assert sp.current_value(sc, "high_share") == pytest.approx(0.3)  # mixed: 30 % interactive chat
    assert sp.current_value(sc, "kv_cache_tokens") == sc.deployment.kv_capacity_tokens


def test_default_rate_range_centres_on_capacity():
    sc = mixed()
    assert sp.default_range("rate_req_s", sc, capacity_req_s=8.0) == (0.8, 12.0, 10, "linear")
    # without a capacity: the scenario's own rate (mixed() sets 3 req/s)
    assert sc.workload.rate_req_s == 3.0
    assert sp.default_range("rate_req_s", sc) == (0.3, 4.5, 10, "linear")
    assert sp.default_range("max_num_seqs", sc) == (8, 1024, 8, "log")
    assert sp.default_range("high_share", sc) == (0.0, 1.0, 6, "linear")
    with pytest.raises(ValueError, match="unknown"):
        sp.default_range("nope", sc)


def test_knob_values():
    assert sp.knob_values("max_wait_s", 0.01, 1.28, 8, "log") == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
    assert sp.knob_values("max_batch_size", 1, 256, 9, "log") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert sp.knob_values("high_share", 0, 1, 6, "linear") == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    # counts are whole numbers, duplicates collapse
    assert sp.knob_values("max_num_seqs", 1, 4, 6, "linear") == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="points=25 is out of range; allowed 2 to 24"):
        sp.knob_values("max_num_seqs", 1, 64, sp.MAX_POINTS + 1, "log")
    with pytest.raises(ValueError, match="spacing='cubic' is not allowed; allowed: log, linear"):
        sp.knob_values("max_num_seqs", 1, 64, 4, "cubic")
    with pytest.raises(ValueError, match="must be below"):
        sp.knob_values("max_num_seqs", 64, 1, 4, "log")


@pytest.mark.parametrize("knob, start, stop, even, spacing", [
    ("max_num_seqs", 8, 1024, 8, "log"), ("max_wait_s", 0.01, 1.28, 8, "log"), ("high_share", 0, 1, 6, "linear"),
    ("rate_req_s", 0.5, 7.5, 10, "linear"), ("kv_cache_tokens", 4096, 262_144, 8, "log"),
])
def test_points_past_the_even_count_keep_the_points_already_there(knob, start, stop, even, spacing):
    """Issue 25 item 3: one more point keeps every value of the sweep (only the new one is simulated), each new one
    halves the widest gap (the leftmost first), and at 2 * even - 1 points the grid is even again."""
    base = sp.knob_values(knob, start, stop, even, spacing)
    assert sp.knob_values(knob, start, stop, even, spacing, even=even) == base  # the default count: unchanged
    prev = base
    for n in range(even + 1, min(2 * even - 1, sp.MAX_POINTS) + 1):
        cur = sp.knob_values(knob, start, stop, n, spacing, even=even)
        added = sorted(set(cur) - set(prev))
        assert set(prev) <= set(cur) and len(added) == 1, (n, prev, cur)
        i = cur.index(added[0])
        lo, hi = cur[i - 1], cur[i + 1]
        middle = np.sqrt(lo * hi) if spacing == "log" else (lo + hi) / 2
        # counts are whole numbers (their neighbours too), the rest keep 4 significant digits
        assert added[0] == pytest.approx(middle, abs=1.0 if knob in sp.INT_KNOBS else 0, rel=1e-3)
        prev = cur
    if 2 * even - 1 <= sp.MAX_POINTS:
        assert prev == sp.knob_values(knob, start, stop, 2 * even - 1, spacing)  # even again
    # the first new point goes into the leftmost gap; fewer points than even are evenly spaced
    assert sp.knob_values(knob, start, stop, even + 1, spacing, even=even)[1] < base[1]
    assert sp.knob_values(knob, start, stop, 3, spacing, even=even) == sp.knob_values(knob, start, stop, 3, spacing)


def test_fmt_value():
    assert sp.fmt_value("max_num_seqs", 256.0) == "256"
    assert sp.fmt_value("kv_cache_tokens", 65536.0) == "65,536 tokens"
    assert sp.fmt_value("max_num_batched_tokens", 2048.0) == "2,048 tokens"
    assert sp.fmt_value("max_wait_s", 0.04) == "40 ms"
    assert sp.fmt_value("max_wait_s", 1.5) == "1.5 s"
    assert sp.fmt_value("high_share", 0.3) == "30 %"
    assert sp.fmt_value("rate_req_s", 3.5) == "3.5 req/s"
    assert sp.fmt_value("rate_req_s", None) == "n/a" == sp.fmt_value("max_num_seqs", float("nan"))


# ---------------------------------------------------------------- readings


def test_with_readings_adds_offered_load_and_kv_pressure():
    sc = mixed()
    df = pd.DataFrame({"rate_req_s": [1.0, 4.0], "max_kv_blocks": [100, 400], "kv_capacity_tokens": [6400, 6400]})
    out = sp.with_readings(df, sc, "rate_req_s")
    assert list(df.columns) == ["rate_req_s", "max_kv_blocks", "kv_capacity_tokens"]  # the input is left alone
    assert out["kv_pressure"].tolist() == [0.25, 1.0]  # 100 blocks x 16 tokens / 6,400
    for i, rate in enumerate((1.0, 4.0)):
        reqs = apply_knob(sc, "rate_req_s", rate).workload.generate()
        assert out["offered_req_s"][i] == pytest.approx(reqs.mean_rate_req_s)
        assert out["offered_output_tok_s"][i] == pytest.approx(reqs.mean_rate_req_s * reqs.output_tokens.mean())
    assert out["offered_req_s"][1] > 3 * out["offered_req_s"][0]
    # a policy knob does not move the offered load: the scenario's own, on every row
    pol = sp.with_readings(df.rename(columns={"rate_req_s": "max_num_seqs"}), sc, "max_num_seqs")
    assert pol["offered_req_s"].tolist() == [sp.offered_load(sc)[0]] * 2
    assert sp.offered_load(sc)[1] == pytest.approx(sp.offered_load(sc)[0] * sc.workload.generate().output_tokens.mean())


def test_knee_sentence():
    df = renamed(frame([16, 32, 64, 128], capacity_output_tok_s=[1000, 1500, 1600, 1590],
                       capacity_tpot_p99_s=[0.02, 0.03, 0.05, 0.09]), "max_num_seqs")
    knee = sweep_knee(df, "max_num_seqs", 0.05)
    assert knee == 64.0
    # capacity falls past 64 (1,600 → 1,590): the peak of the range, never "grows by less than 5 %" (issue 24
    # item 12: "15.8 → at most 15.1")
    assert sp.knee_sentence(df, "max_num_seqs", knee, 0.05) == (
        "Peak at max_num_seqs = 64: past it capacity falls (1,600 tok/s → at most 1,590 tok/s) "
        "while P99 TPOT at capacity rises from 50 ms to 90 ms.")
    flat = df.assign(capacity_output_tok_s=[1000, 1500, 1600, 1610])
    assert sp.knee_sentence(flat, "max_num_seqs", sweep_knee(flat, "max_num_seqs", 0.05), 0.05).startswith(
        "Knee at max_num_seqs = 64: past it capacity grows by less than 5 % (1,600 tok/s → at most 1,610 tok/s)")
    assert sp.knee_sentence(df, "max_num_seqs", None, 0.1).startswith(
        "No knee in this range: capacity grows by 10 % or more past every value")
    assert sp.knee_sentence(renamed(df, "rate_req_s").rename(columns={"max_num_seqs": "rate_req_s"}), "rate_req_s",
                            None, 0.05).startswith("No knee in this range: throughput at the offered load")


def test_read_sweeps_and_the_checks_text():
    sc = mixed().with_policy(PRESETS["continuous"])
    x = [16, 32, 64, 128]
    main = renamed(frame(x, capacity_output_tok_s=[1000, 1500, 1600, 1590], kv_pressure=[0.3, 0.5, 0.6, 0.9],
                         preemptions=[0, 0, 0, 40], capacity_tpot_p99_s=[0.02, 0.03, 0.05, 0.09]), "max_num_seqs")
    other = main.assign(capacity_output_tok_s=[1000, 1500, 1800, 2400])
    study = sp.read_sweeps(sc, "max_num_seqs", x, {"chunked": other, "mine": main}, 0.05, label="mine",
                           policies={"chunked": PRESETS["chunked"]}, skipped={"static": "no max_num_seqs"})
    assert list(study.frames) == ["mine", "chunked"] and study.frame is main
    assert study.values == (16.0, 32.0, 64.0, 128.0)
    assert study.knees == {"mine": 64.0, "chunked": None} and study.knee == 64.0
    assert {k: p.unsized() for k, p in study.policies.items()} == {"mine": PRESETS["continuous"],
                                                                  "chunked": PRESETS["chunked"]}
    assert study.cards == tuple(sp.cards(main, "max_num_seqs", sc, 64.0, 0.05))
    assert [c.fired for c in study.cards] == [True, False, False] and study.fired == [study.cards[0]]
    assert study.cards[0].suggestion == 64.0
    assert study.cards[0].text.startswith("The configured max_num_seqs = 256 is past the knee")
    assert study.slo is None and study.slo_text() == ""  # read without SLOs: the knee of the tok/s capacity
    pts = study.points()
    assert list(pts.columns[:2]) == ["policy", "max_num_seqs"]
    assert pts["policy"].tolist() == ["mine"] * 4 + ["chunked"] * 4
    text = study.checks_text()
    lines = text.splitlines()
    assert lines[0] == study.knee_sentence() and lines[2] == "Guided checks:"
    assert lines[3] == "1 · Batch cap too large: FIRED"
    assert "2 · Batch cap too small (max_num_seqs / max_batch_size): not fired" in lines
    assert "3 · Batch efficiency below 50 %: not fired" in lines
    assert f"  - {study.cards[0].triggers[1]}" in lines and sp.NONE_FIRED not in text
    # a calm sweep: nothing fires, and the text says so
    calm = sp.read_sweeps(sc, "max_num_seqs", x, {"mine": main.assign(kv_pressure=0.6, preemptions=0)})
    assert not calm.fired and calm.checks_text().endswith(sp.NONE_FIRED)
    assert calm.cards[0].to_dict() == {"number": 1, "title": "Batch cap too large", "fired": False,
                                       "text": calm.cards[0].text, "triggers": list(calm.cards[0].triggers),
                                       "suggestion": None, "knob": None}
    with pytest.raises(ValueError, match="knee share=0 is out of range; allowed 0.005 to 0.5"):
        sp.read_sweeps(sc, "max_num_seqs", x, {"mine": main}, share=0)
    with pytest.raises(ValueError, match="frames is empty"):
        sp.read_sweeps(sc, "max_num_seqs", x, {})


def test_sweep_study_runs_and_reads_a_real_sweep():
    # a tiny configured max_num_seqs at 10 req/s: every slot is taken while requests queue (check 2), as on the
    # Tune page; the knee is read on the capacity within the default SLOs
    sc = mixed(rate=10.0).with_policy(with_knobs(PRESETS["continuous"], max_num_seqs=4))
    values = sp.knob_values("max_num_seqs", 1, 8, 4, "log")
    study = sp.sweep_study(sc, "max_num_seqs", values, label="continuous")
    df = study.frame
    assert df["max_num_seqs"].tolist() == [1.0, 2.0, 4.0, 8.0]
    assert set(sp.READING_COLUMNS) <= set(df.columns)
    assert df["offered_req_s"].tolist() == [sp.offered_load(sc)[0]] * 4
    assert df["kv_pressure"].tolist() == pytest.approx((df["max_kv_blocks"] * 16 / df["kv_capacity_tokens"]).tolist())
    assert study.slo == default_slo(2) and study.slo_is_default
    assert study.slo_text() == ("SLOs: TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; TPOT ≤ 100 ms "
                                "for 99 % of each class's requests (the default SLOs: none were given).")
    assert (df["max_rate_req_s"].diff().dropna() > 0).all()  # more sequences, more traffic within the SLOs
    assert study.knee == sweep_knee(df, "max_num_seqs", 0.05) is None
    card = study.cards[1]
    assert card.fired and card.suggestion == 8.0 and card.knob == "max_num_seqs"
    assert card.text.startswith("The configured max_num_seqs = 4 is too small")
    assert not study.cards[2].fired  # continuous batching: low efficiency is headroom
    assert "2 · Batch cap too small (max_num_seqs / max_batch_size): FIRED" in study.checks_text()
    # the same sweep read for the preset's own 256 (above the range): the check does not speak about 1 to 8
    preset = sp.read_sweeps(sc.with_policy(PRESETS["continuous"]), "max_num_seqs", values, {"continuous": df},
                            slo=study.slo)
    assert not preset.cards[1].fired and "the configured max_num_seqs is 256, above that range" in preset.cards[1].text


# ---------------------------------------------------------------- the capacity plan


def result(rate: float, thr: float, binding: str | None = None, tried: int = 3) -> CapacityResult:
    points = pd.DataFrame({"rate_req_s": np.linspace(1, 2, tried), "attainment": 1.0})
    return CapacityResult(rate, thr, rate * 0.99, binding, None, None, points)


def test_capacity_plan_prices_every_search():
    sc = mixed()
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    searches = {"static": result(0.0, 0.0, "ttft_s"), "chunked": result(4.0, 2000.0, "tpot_s", tried=7),
                "continuous": result(2.5, 1500.0)}
    plan = sp.plan_capacity(sc, slo, searches, target_rate_req_s=10.0, gpu_hour_usd=2.5, headroom=1.0)
    assert plan.num_gpus == 8 and plan.slo is slo and plan.scenario is sc
    ch = plan.results["chunked"]
    mean_out = float(sc.requests()[0].output_tokens.mean())
    assert ch.mean_output_tokens == pytest.approx(mean_out)
    assert ch.nodes_needed == 3  # 10 req/s at 4 per node
    # studies.pricing.price: 3 nodes' $/h over the tokens 10 req/s bring an hour; at capacity one node at 4 req/s
    assert ch.usd_per_million_output_tokens == pytest.approx(3 * 8 * 2.5 / (10 * mean_out * 3600) * 1e6)
    assert ch.usd_per_million_output_tokens_at_capacity == pytest.approx(8 * 2.5 / (4 * mean_out * 3600) * 1e6)
    assert ch.rates_tried == 7 and ch.points is searches["chunked"].points
    assert plan.results["continuous"].nodes_needed == 4
    assert plan.results["static"].nodes_needed is None and plan.results["static"].usd_per_million_output_tokens is None
    assert searches["chunked"].nodes_needed is None  # the searches themselves are left as they were
    assert plan.failed() == ["static"]
    assert plan.max_rates() == {"static": 0.0, "chunked": 4.0, "continuous": 2.5}
    assert plan.points()["chunked"] is searches["chunked"].points
    assert plan.verdict() == (f"'chunked' sustains the most traffic within the SLOs: 4 req/s per node, so 3 nodes "
                              f"serve 10 req/s, at ${ch.usd_per_million_output_tokens:,.2f} per million output tokens "
                              f"at that traffic (${ch.usd_per_million_output_tokens_at_capacity:,.2f} at capacity) "
                              "(1× headroom). 'continuous' sustains 2.5 req/s (4 nodes).")
    # no price, no target: the sentence leaves them out
    bare = sp.plan_capacity(sc, slo, {"chunked": searches["chunked"]})
    assert bare.verdict() == "'chunked' sustains the most traffic within the SLOs: 4 req/s per node."
    assert sp.plan_capacity(sc, slo, {"static": searches["static"]}, 10.0, 2.5).verdict() == ""
    with pytest.raises(ValueError, match="target_rate_req_s=0"):
        sp.plan_capacity(sc, slo, searches, target_rate_req_s=0.0)
    with pytest.raises(ValueError, match="give at least one SLO"):
        sp.plan_capacity(sc, SLO(), searches)


def test_the_rules_load_without_streamlit():
    import subprocess
    import sys

    code = ("import sys, batching.studies.planning, batching.charts.planning, batching.__main__; "
            "print('streamlit' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


def test_knee_sentence_within_the_slos():
    df = renamed(frame([16, 32, 64, 128]), "max_num_seqs").assign(max_rate_req_s=[2.0, 3.5, 4.0, 4.02],
                                                                 binding_slo="tpot_s")
    knee = sweep_knee(df, "max_num_seqs", 0.05)
    assert knee == 64.0  # read on max_rate_req_s, not on the tok/s capacity (flat here)
    assert sp.knee_sentence(df, "max_num_seqs", knee, 0.05) == (
        "Knee at max_num_seqs = 64: past it capacity within the SLOs grows by less than 5 % (4 req/s → at most "
        "4.02 req/s per node, bound by TPOT).")
    falls = df.assign(max_rate_req_s=[2.0, 12.0, 15.8, 15.1])
    assert sweep_knee(falls, "max_num_seqs", 0.05) == 64.0
    text = sp.knee_sentence(falls, "max_num_seqs", 64.0, 0.05)
    assert text == ("Peak at max_num_seqs = 64: past it capacity within the SLOs falls (15.8 req/s → at most "
                    "15.1 req/s per node, bound by TPOT).")
    assert "grows" not in text
    assert sp.knee_sentence(falls, "max_num_seqs", 64.0, 0.05, "TP 16 replica (2 nodes)").endswith(
        "15.1 req/s per TP 16 replica (2 nodes), bound by TPOT).")
    grows = df.assign(max_rate_req_s=[1.0, 2.0, 3.0, 4.0])
    assert sweep_knee(grows, "max_num_seqs") is None
    assert sp.knee_sentence(grows, "max_num_seqs", None, 0.05).startswith(
        "No knee in this range: capacity within the SLOs grows by 5 % or more past every value.")
    assert sp.knee_sentence(df.assign(max_rate_req_s=0.0), "max_num_seqs", None, 0.05) == (
        "No knee: no value swept meets the SLOs at any rate. Relax the SLOs or change the scenario.")
    # the request rate: goodput where the SLOs hold for the attainment target, 0 where they fail
    rates = renamed(frame([2, 4, 6, 8]), "rate_req_s").assign(goodput_req_s=[2.0, 3.9, 5.7, 7.2], max_rate_req_s=7.3,
                                                              slo_met=[True, True, True, False])
    assert sweep_knee(rates, "rate_req_s") == 6.0
    assert sp.knee_sentence(rates, "rate_req_s", 6.0, 0.05) == (
        "Knee at rate_req_s = 6 req/s: the highest rate swept at which the SLOs hold (goodput 5.7 req/s); past it "
        "they fail for more requests than the attainment target allows.")


def test_capacity_plan_with_headroom():
    sc = mixed()
    slo = SLO(ttft_s=(1.0, 30.0), tpot_s=0.1)
    searches = {"chunked": result(4.0, 2000.0, "ttft_s"), "priority": result(5.0, 2100.0, "tpot_s")}
    plan = sp.plan_capacity(sc, slo, searches, target_rate_req_s=10.0, gpu_hour_usd=2.5)  # the default headroom
    assert plan.headroom == 1.25
    assert plan.results["chunked"].nodes_needed == 4  # 10 x 1.25 / 4 = 3.1, rounded up
    assert plan.results["priority"].nodes_needed == 3  # 12.5 / 5
    mean_out = float(sc.requests()[0].output_tokens.mean())
    pr = plan.results["priority"]
    assert pr.usd_per_million_output_tokens == pytest.approx(3 * 8 * 2.5 / (10 * mean_out * 3600) * 1e6)
    assert pr.max_rate_req_s == 5.0  # the rate itself is the simulator's
    assert plan.verdict() == (f"'priority' sustains the most traffic within the SLOs: 5 req/s per node, so 3 nodes "
                              f"serve 10 req/s, at ${pr.usd_per_million_output_tokens:,.2f} per million output tokens "
                              f"at that traffic (${pr.usd_per_million_output_tokens_at_capacity:,.2f} at capacity) "
                              "(1.25× headroom). 'chunked' sustains 4 req/s (4 nodes).")
    with pytest.raises(ValueError, match="headroom=0.5 is out of range; allowed 1 to 3"):
        sp.plan_capacity(sc, slo, searches, 10.0, 2.5, headroom=0.5)


def test_verdict_rounds_a_tiny_rate_and_calls_903_nodes_impractical():
    """Issue 24 item 12: "'dynamic' sustains 0.0277 req/s (903 nodes)" read as a plan; the rate now has two
    significant digits and the node count says it is no practical deployment."""
    sc = mixed()
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    searches = {"chunked": result(1.0, 2000.0), "dynamic": result(0.0277, 60.0)}
    plan = sp.plan_capacity(sc, slo, searches, target_rate_req_s=25.0, gpu_hour_usd=2.5, headroom=1.0)
    assert plan.results["dynamic"].nodes_needed == 903  # ceil(25 / 0.0277), the case (headroom 1)
    text = plan.verdict()
    assert "0.0277" not in text
    assert text.endswith("'dynamic' sustains 0.028 req/s (903 nodes, 36× the nodes of 'chunked': not a practical "
                         "deployment).")
    # a few more nodes is a choice, not named impractical
    close = sp.plan_capacity(sc, slo, {"chunked": result(4.0, 2000.0), "continuous": result(2.5, 1500.0)}, 10.0)
    assert "practical" not in close.verdict()
