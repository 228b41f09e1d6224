"""The trace workload: the sample trace from a link, an uploaded trace, a malformed upload."""
from __future__ import annotations

from uihelpers import assert_clean, chart_specs, run_page

GOOD = b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(
    f"{i * 0.5:.2f},{200 + 37 * i % 900},{20 + 13 * i % 150}\n".encode() for i in range(60))
BAD = b"arrival_s,prompt_tokens,output_tokens\n0.0,120,30\n0.5,abc,40\n1.0,100,-3\n"


def test_link_with_trace_workload_uses_the_sample_trace():
    at = run_page(workload="trace", n="200")
    assert_clean(at)
    assert at.selectbox(key="wid:workload").value == "trace"
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "sample_trace.csv" in captions and "200 requests" in captions


def test_uploaded_trace_runs_and_bad_upload_shows_an_error():
    at = run_page(workload="trace", n="200")
    at.sidebar.get("file_uploader")  # the uploader is on screen
    uploader = at.file_uploader(key="trace_file")
    uploader.set_value(("mine.csv", GOOD, "text/csv")).run()
    assert_clean(at)
    assert "mine.csv" in " ".join(c.value for c in at.sidebar.caption)
    table = at.dataframe[0].value
    charts = len(chart_specs(at))
    at.file_uploader(key="trace_file").set_value(("broken.csv", BAD, "text/csv")).run()
    assert not at.exception
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "broken.csv" in msg and "row 2" in msg and "prompt_tokens" in msg and "Skip bad rows" in msg
    # the last valid showdown stays
    assert at.dataframe[0].value.equals(table) and len(chart_specs(at)) == charts
    # skipping bad rows runs what is left and says how many were dropped
    at.toggle(key="trace_skip_bad").set_value(True).run()
    assert_clean(at)
    assert "2 bad rows skipped" in " ".join(c.value for c in at.sidebar.caption)
