"""The utilisation and overload figures (docs/ARCHITECTURE.md "Metrics", DESIGN §4): busy, gpu_util (useful share
of each step's token slots), sol_util, MFU, MBU, kv_util, load, overloaded and the queue's growth."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batching.charts.formatting import MISSING, cell_text, change_frame, report_frame, shown
from batching.sim.metrics import DEFINITIONS, useful_share
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.requests import TraceWorkload, workload_preset
from batching.studies.compare import compare, verdict

ROOT = Path(__file__).resolve().parents[1]
SHARES = ("busy", "gpu_util", "sol_util", "mfu", "mbu", "kv_util")


def _run(policy: str, rate: float, n: int = 2000, saturated: bool = False) -> dict:
    sc = Scenario(workload=workload_preset("mixed", rate, n, 0), policy=PRESETS[policy])
    return simulate(sc, saturated=saturated).summary()


def _trace(rows: list[tuple[float, int, int]]) -> TraceWorkload:
    text = "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows)
    return TraceWorkload(text.encode())


@pytest.mark.parametrize("policy, rates", [("static", (0.25, 0.5, 0.75, 1.0)), ("continuous", (0.25, 0.5, 1.0))])
def test_gpu_util_rises_with_rate_below_capacity(policy, rates):
    """Same requests (same seed, arrivals rescaled), a fixed policy, rates below its capacity (static carries
    ~1.2 req/s, continuous ~8): more useful work per second, a higher GPU util."""
    runs = [_run(policy, r) for r in rates]
    util = [s["gpu_util"] for s in runs]
    assert all(b > a for a, b in zip(util, util[1:])), util
    assert all(s["throughput_output_tok_s"] > 0 for s in runs)


def test_padding_lowers_gpu_util_against_continuous_at_the_same_load():
    static, cont = _run("static", 1.0), _run("continuous", 1.0)
    # the two carry the same traffic ...
    assert static["throughput_output_tok_s"] == pytest.approx(cont["throughput_output_tok_s"], rel=0.05)
    # ... static pads prompts to the longest and carries finished sequences until the batch's longest ends
    assert static["gpu_util"] < 0.5 * cont["gpu_util"]
    assert static["gpu_util"] < static["busy"]
    # continuous batching computes no padded slot: every step's work is useful
    assert cont["gpu_util"] == pytest.approx(cont["busy"], rel=1e-12)


@pytest.mark.parametrize("policy", list(PRESETS))
@pytest.mark.parametrize("rate, saturated", [(0.5, False), (3.0, False), (3.0, True)])
def test_shares_between_zero_and_one(policy, rate, saturated):
    s = _run(policy, rate, n=300, saturated=saturated)
    for k in SHARES:
        assert 0.0 <= s[k] <= 1.0, (k, s[k])
    for k in ("gpu_util", "sol_util", "mfu", "mbu", "kv_util"):
        assert s[k] <= s["busy"], k
    assert s["mean_running"] == pytest.approx(s["batch_efficiency"] * s["batch_cap"])


def test_kv_util_and_gpu_util_by_hand_on_a_tiny_static_scenario():
    """Static batches of two: requests 0 and 1 arrive together (prompts 100 and 300, outputs 5 and 40), request 2
    alone after a long idle gap (a batch of one, flushed as the last). A batch reserves, for each of its slots,
    the blocks of its longest prompt + longest output, from its launch to its release; the idle gap holds none."""
    wl = _trace([(0.0, 100, 5), (0.0, 300, 40), (30.0, 50, 20)])
    sc = Scenario(workload=wl, policy=BatchingPolicy(mode="static", max_batch_size=2))
    res = simulate(sc)
    req, s = res.requests, res.summary()
    cap = sc.deployment.kv_capacity_blocks
    blocks_a = 2 * math.ceil((300 + 40) / KV_BLOCK_TOKENS)
    blocks_b = math.ceil((50 + 20) / KV_BLOCK_TOKENS)
    held_a = req.loc[1, "release_s"] - req.loc[0, "first_scheduled_s"]
    held_b = req.loc[2, "release_s"] - req.loc[2, "first_scheduled_s"]
    wall = req["release_s"].max() - req["arrival_s"].min()
    assert s["kv_util"] == pytest.approx((blocks_a * held_a + blocks_b * held_b) / (cap * wall), rel=1e-9)
    # the idle gap is most of the run: busy and GPU util well below 1
    assert s["busy"] < 0.5

    # GPU util: batch A's prefill computes 2 x 300 prompt slots of which 400 are real; its decode steps carry
    # request 0's slot after its 5th token (held, finished) until request 1's 40th; batch B has no waste
    steps = res.steps
    assert len(steps) == 40 + 20  # 1 prefill + 39 decode steps, 1 prefill + 19 decode steps
    share = np.concatenate([[400 / 600], [1.0] * 4, [0.5] * 35, [1.0] * 20])
    np.testing.assert_allclose(useful_share(steps), share)
    by_hand = float((steps["duration_s"].to_numpy() * share).sum()) / wall
    assert s["gpu_util"] == pytest.approx(by_hand, rel=1e-12)
    assert s["gpu_util"] < s["busy"]


@pytest.fixture(scope="module")
def at_3_req_s():
    """3 req/s of the mixed workload: static carries ~1.2 req/s, chunked prefill ~8.5."""
    sc = Scenario(workload=workload_preset("mixed", 3.0, 2000, 0))
    return compare(sc, {k: PRESETS[k] for k in ("static", "continuous", "chunked")}).summaries()


def test_overloaded_static_at_3_req_s_not_chunked(at_3_req_s):
    st, ch = at_3_req_s["static"], at_3_req_s["chunked"]
    assert st["overloaded"] is True and ch["overloaded"] is False
    assert st["offered_req_s"] > st["capacity_req_s"]
    # static's queue grows at about the offered rate minus its capacity; chunked's does not grow
    assert st["queue_growth_req_s"] == pytest.approx(st["offered_req_s"] - st["capacity_req_s"], rel=0.25)
    assert abs(ch["queue_growth_req_s"]) < 0.05
    # load: throughput at this load / capacity; static runs at its capacity, chunked at about a third of it
    assert st["load"] > 0.95
    assert 0.25 < ch["load"] < 0.45
    # a busy GPU is not a full one: chunked is busy nearly all the time at a third of its capacity
    assert ch["busy"] > 0.95 and ch["load"] < 0.5


def test_verdict_names_the_overloaded_and_never_praises_their_latency(at_3_req_s):
    text = verdict(at_3_req_s)
    assert "Overloaded at this rate: 'static'" in text
    assert "Lowest P99 TTFT: 'continuous'" in text or "Lowest P99 TTFT: 'chunked'" in text
    ttft = at_3_req_s["static"]["ttft_p99_s"]
    assert f"{ttft:.2f}" not in text and f"{ttft:,.1f} s" not in text


def test_tables_show_unbounded_latencies_and_no_none(at_3_req_s):
    st, ch = at_3_req_s["static"], at_3_req_s["chunked"]
    assert cell_text("ttft_p99_s", st).startswith("unbounded: queue grows (+")
    assert cell_text("ttft_p99_s", st).endswith(" req/s)")
    assert cell_text("ttft_p99_s", ch).endswith(" ms")  # below 10 s: ms
    assert cell_text("batch_efficiency", ch).endswith(" of 256)")
    frame = report_frame(at_3_req_s)
    assert frame.attrs["overloaded"] == ["static"]
    assert {"Load", "GPU util", "Busy", "MFU", "MBU", "KV cache in use"} <= set(frame.columns)
    cells = frame.to_numpy().ravel()
    assert not any("None" in c or "nan" in c.lower() for c in cells)
    # Compare: no change against an overloaded policy's latency (no -100 %), and none for an overloaded one
    for first in ("static", "chunked"):
        other = "chunked" if first == "static" else "static"
        ch_frame = change_frame({first: at_3_req_s[first], other: at_3_req_s[other]},
                                ["ttft_p99_s", "gpu_util", "batch_efficiency"]).set_index("Metric")
        change = ch_frame[f"{other} vs {first}"]
        assert math.isnan(change["TTFT P99"])
        assert math.isfinite(change["GPU util"])
        assert ch_frame.loc["Batch efficiency", "_lower_is_better"] is None  # never coloured


def test_missing_figures_read_as_a_dash():
    assert shown("tpot_p99_s", float("nan")) == MISSING
    assert shown("kv_util", None) == MISSING
    assert shown("ttft_p99_s", 0.412) == "412 ms" and shown("ttft_p99_s", 12.5) == "12.50 s"
    for k in ("busy", "gpu_util", "sol_util", "mfu", "mbu", "kv_util", "load", "overloaded"):
        assert DEFINITIONS[k][1], k


def test_compare_json_has_the_overload_and_utilisation_keys(tmp_path):
    out = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "batching", "compare", "--requests", "300", "--rate", "3",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    c = json.loads(out.read_text())
    assert list(c) == list(PRESETS)
    for name, s in c.items():
        for k in ("overloaded", "load", "queue_growth_req_s", "busy", "gpu_util", "sol_util", "mfu", "mbu",
                  "kv_util", "capacity_output_tok_s"):
            assert k in s, (name, k)
        assert isinstance(s["overloaded"], bool)
    assert c["static"]["overloaded"] and not c["chunked"]["overloaded"]
    assert "Overloaded at this rate: 'static'" in proc.stdout
