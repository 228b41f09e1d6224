"""The acceptance as engines report it on the dashboard (issue 23 item 3): a "mean acceptance length" input beside
the per-token acceptance A, read from and written to the link (spec_len), that sets the policy's
spec_acceptance_length, greys A out while it is given, and refuses a length outside 1 .. K + 1 in one line."""
from __future__ import annotations

import pytest
from uihelpers import FAST, assert_clean, run_page

from batching.sim.engine.speculative import acceptance_rate

EXPLORE, COMPARE = "pages/explore.py", "pages/compare.py"


def _policy(at):
    run, _ = at.session_state["explore_last"]
    return run.policy


def test_explore_reads_the_acceptance_length_from_the_link():
    at = run_page(EXPLORE, spec="eagle", spec_k="3", spec_len="2.5", **FAST)
    assert_clean(at)
    box = at.number_input(key="wid:spec_len")
    assert box.value == 2.5 and not box.disabled
    assert at.slider(key="wid:spec_a").disabled  # the length sets A
    p = _policy(at)
    assert (p.spec_decode, p.spec_tokens, p.spec_acceptance_length) == ("eagle", 3, 2.5)
    # the A it stands for: (1 - A^4) / (1 - A) = 2.5
    a = acceptance_rate(p)
    assert (1 - a ** 4) / (1 - a) == pytest.approx(2.5, rel=1e-9)


def test_explore_writes_the_acceptance_length_to_the_link_and_zero_gives_a_back():
    at = run_page(EXPLORE, spec="eagle", spec_k="1", **FAST)
    assert at.number_input(key="wid:spec_len").value == 0.0 and not at.slider(key="wid:spec_a").disabled
    at.number_input(key="wid:spec_len").set_value(1.8).run()
    assert_clean(at)
    assert at.query_params["spec_len"] == "1.8"
    assert _policy(at).spec_acceptance_length == 1.8
    at.number_input(key="wid:spec_len").set_value(0.0).run()
    assert "spec_len" not in at.query_params and _policy(at).spec_acceptance_length == 0.0


def test_a_length_beyond_k_plus_one_is_one_clear_error():
    at = run_page(EXPLORE, spec="eagle", spec_k="3", spec_len="6", **FAST)
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert "spec_acceptance_length=6 is out of range for spec_tokens=3" in err and "1 to 4" in err


def test_speculation_off_greys_the_length_out():
    at = run_page(EXPLORE, **FAST)
    assert_clean(at)
    assert at.number_input(key="wid:spec_len").disabled


def test_compare_slot_takes_the_length():
    at = run_page(COMPARE, b_spec="eagle", b_spec_len="2", **FAST)
    assert_clean(at)
    assert at.number_input(key="wid:b_spec_len").value == 2.0 and at.query_params["b_spec_len"] == "2"


def test_explore_runs_a_split_that_speculates_from_the_link():
    """Speculation on a prefill/decode split (issue 23 item 3): no refusal, the run's decode instances speculate at
    the acceptance length given, every chart draws."""
    at = run_page(EXPLORE, serving="disaggregated", spec="eagle", spec_k="3", spec_len="2.5", **FAST)
    assert_clean(at)
    run, _ = at.session_state["explore_last"]
    assert run.disagg is not None and run.policy.spec_acceptance_length == 2.5
    from batching.ui import cache

    s = cache.simulate_cached(run).summary()
    assert s["mean_tokens_per_step"] == pytest.approx(2.5, rel=0.15) and s["prefill_draft_time_share"] > 0
