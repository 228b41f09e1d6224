"""Speculative decoding on the dashboard: its knobs on Explore and Compare, read from and written to the URL."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "ui"))

from uihelpers import FAST, assert_clean, run_page  # noqa: E402

EXPLORE, COMPARE = "pages/explore.py", "pages/compare.py"


def test_explore_reads_the_speculation_knobs_from_the_link():
    at = run_page(EXPLORE, spec="eagle", spec_k="4", spec_a="70", spec_off="32", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:spec").value == "eagle"
    assert at.slider(key="wid:spec_k").value == 4 and not at.slider(key="wid:spec_k").disabled
    assert at.slider(key="wid:spec_a").value == 70
    assert at.selectbox(key="wid:spec_model").disabled  # only the draft method reads the draft model
    run, _ = at.session_state["explore_last"]
    p = run.policy
    assert (p.spec_decode, p.spec_tokens, p.spec_acceptance, p.spec_disable_batch_size) == ("eagle", 4, 0.7, 32)


def test_explore_writes_the_speculation_knobs_to_the_link():
    at = run_page(EXPLORE, **FAST)
    assert_clean(at)
    assert at.slider(key="wid:spec_k").disabled  # speculation off: its knobs are greyed out
    at.selectbox(key="wid:spec").set_value("draft").run()
    at.slider(key="wid:spec_a").set_value(60).run()
    assert_clean(at)
    assert (at.query_params["spec"], at.query_params["spec_a"]) == ("draft", "60")
    assert not at.selectbox(key="wid:spec_model").disabled
    run, label = at.session_state["explore_last"]
    assert (run.policy.spec_decode, run.policy.spec_acceptance) == ("draft", 0.6) and label.endswith("*")


def test_compare_slot_speculates():
    at = run_page(COMPARE, b_spec="ngram", b_spec_a="50", **FAST)
    assert_clean(at)
    assert at.selectbox(key="wid:b_spec").value == "ngram"
    assert at.query_params["b_spec"] == "ngram"
    # slot A runs dynamic batching (request-level): no speculation knob
    assert "wid:a_spec" not in [e.key for e in at.selectbox]
