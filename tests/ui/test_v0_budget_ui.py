"""Explore's default preset sizes its step budget from the model's context as vLLM V0 does (issue 24, item 9)."""
from __future__ import annotations

from uihelpers import assert_clean, run_page

PAGE = "pages/explore.py"


def test_explore_default_preset_runs_a_2000_token_shared_prompt():
    # failed before: "max_num_batched_tokens=8192 is below the longest prompt" (chat prompts + 2,000 shared tokens)
    at = run_page(PAGE, workload="chat", prefix_tokens="2000", n="300")
    assert_clean(at)
    assert not at.error


def test_explore_budget_moved_by_the_user_still_errors():
    at = run_page(PAGE, workload="chat", prefix_tokens="2000", n="60", budget="1024")
    assert len(at.error) == 1 and "max_num_batched_tokens=1024" in at.error[0].value
