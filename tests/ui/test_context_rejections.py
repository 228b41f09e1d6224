"""Requests beyond the model's context are rejected, not simulated, and the pages say how many (issue 22, item 10):
a trace whose long prompts pass Qwen2.5-72B's 32,768 tokens runs the rest, with a note on every page."""
from __future__ import annotations

from uihelpers import assert_clean, run_page

from batching.ui.safe import unescape

# 40 requests, every tenth with a 40,000-token prompt (beyond 32,768): 4 rejected, all of its one class
LONG = b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(
    f"{i * 0.5:.2f},{40_000 if i % 10 == 3 else 300 + 17 * i},{40 + i}\n".encode() for i in range(40))


def _upload(page: str):
    at = run_page(page, workload="trace", n="200")
    at.file_uploader(key="trace_file").set_value(("long.csv", LONG, "text/csv")).run()
    assert_clean(at)
    return at


def _note(at) -> str:
    notes = [unescape(i.value) for i in at.info if "rejected" in i.value]
    assert len(notes) == 1, [i.value for i in at.info]
    return notes[0]


def test_explore_runs_the_served_requests_and_says_how_many_were_rejected():
    at = _upload("pages/explore.py")
    note = _note(at)
    assert note.startswith("4 of 40 requests are rejected, not simulated (priority 0: 4)"), note
    assert "Qwen2.5-72B's context of 32,768 tokens" in note
    run, _ = at.session_state["explore_last"]
    from batching.sim.simulate import simulate

    s = simulate(run).summary()  # the page's run: 36 served, 4 rejected
    assert (s["num_requests"], s["rejected_requests"]) == (36, 4)


def test_the_home_page_says_so_too():
    note = _note(_upload("app.py"))
    assert note.startswith("4 of 40 requests are rejected") and "32,768" in note
