"""The DeepSeek serving check (docs/CALIBRATION.md, "MLA and large MoE models"): its frame's figures and the
paragraph that says why the output throughput errs more than TPOT, from the frame's own numbers."""
import pandas as pd
import pytest

from batching.sim.hardware.calibration import deepseek_parts
from batching.sim.simulate import simulate
from batching.studies import deepseek_check as dc


@pytest.fixture(scope="module")
def eight():
    return dc.deepseek_frame(clients=(8,))


def test_the_frame_reads_the_published_run_and_the_first_wave(eight):
    r = eight.iloc[0]
    tpot, out = dc.PUBLISHED[8]
    assert r.clients == 8 and r.published_tpot_ms == pytest.approx(tpot * 1e3)
    assert r.published_ttft_p99_ms == pytest.approx(1975.4)
    # each client sends REQUESTS_PER_CLIENT requests: the first wave (sent at t = 0) is a tenth
    assert r.first_wave_share == pytest.approx(1 / dc.REQUESTS_PER_CLIENT)
    # the first wave queues every client's prompt at once: slower than the rest, and it holds the P99
    assert r.ttft_first_wave_max_ms > 2 * r.ttft_rest_mean_ms
    assert r.ttft_p99_ms <= r.ttft_first_wave_max_ms + 1e-9
    assert r.ttft_rest_mean_ms < r.ttft_mean_ms < r.ttft_first_wave_max_ms
    # a closed-loop client's rate is output / (TTFT + output x TPOT): the TPOT error alone, and TTFT's small rest
    assert r.output_error_from_tpot == pytest.approx(tpot * 1e3 / r.tpot_ms - 1)
    assert 0 < r.output_error_from_tpot < r.output_error < r.output_error_from_tpot + 0.05
    # the paragraph says which way the simulated step errs, from the frame's own sign
    why = deepseek_parts(eight)[3]
    assert ("is too fast" in why) == (r.tpot_error < 0) and ("is too slow" in why) == (r.tpot_error >= 0)


def test_the_simulated_tpot_is_a_mean_over_requests_as_published(eight):
    """The publication's TPOT is sglang.bench_serving's mean over requests of (E2E - TTFT) / (output - 1): the frame
    compares the same figure, recomputed here from the run's requests (not its P50)."""
    r = eight.iloc[0]
    req = simulate(dc.scenario(8)).requests
    per_request = (req["e2e_s"] - req["ttft_s"]) / (req["output_tokens"] - 1)
    assert r.tpot_ms == pytest.approx(per_request.mean() * 1e3, rel=1e-9)
    assert r.tpot_error == pytest.approx(per_request.mean() / dc.PUBLISHED[8][0] - 1, rel=1e-9)
    # the output lengths differ (uniform 819-1,024), so the mean and the median differ: the check is not vacuous
    assert per_request.mean() != pytest.approx(per_request.median(), rel=1e-6)
    # the "before" figures are means too (commit 4defdf7's tpot_mean_s), below that commit's medians
    assert dc.BEFORE[8][0] == pytest.approx(10.125e-3) and dc.BEFORE[8][0] < 10.209e-3


def test_the_why_paragraph_is_the_frame_s_arithmetic():
    frame = pd.DataFrame([{
        "clients": 8, "published_tpot_ms": 12.8, "before_tpot_ms": 10.0, "tpot_ms": 11.0,
        "aiconfigurator_tpot_ms": 12.1,
        "tpot_error_before": 10.0 / 12.8 - 1, "tpot_error": 11.0 / 12.8 - 1, "aiconfigurator_error": 12.1 / 12.8 - 1,
        "published_output_tok_s": 600.0, "output_tok_s": 700.0, "output_error_before": 0.2,
        "output_error": 700 / 600 - 1,
        "output_error_from_tpot": 12.8 / 11.0 - 1, "published_ttft_ms": 330.6, "ttft_p50_ms": 60.0,
        "ttft_mean_ms": 85.0,
        "published_ttft_p99_ms": 1975.4, "ttft_p99_ms": 260.0, "first_wave_share": 0.1,
        "ttft_first_wave_max_ms": 267.0, "ttft_rest_mean_ms": 68.0}])
    why = deepseek_parts(frame)[3]
    assert "the TPOT errors alone make +16.4% of the +16.7%" in why
    assert "Each client sends 10 requests" in why and "10% of the requests" in why
    assert "published 1,975 ms, the simulated first wave's slowest 267 ms" in why
    assert "took 1.71 s longer than its simulated prefill" in why
    # the rest's published mean: (330.6 - 0.1 x 1,975.4) / 0.9 = 147.8 ms, against 68: 80 ms unexplained
    assert "published mean TTFT is about 148 ms against the simulated 68 ms: 80 ms per request" in why
