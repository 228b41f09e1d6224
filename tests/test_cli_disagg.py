"""The prefill/decode disaggregation flags of the CLI (issue 13 §2): --prefill-instances, --prefill-tp,
--decode-instances, --decode-tp (all four or none), --kv-link-gbps and --num-nodes reach the Scenario; run, compare and
capacity print and write the split's figures; bad values or combinations are one line naming the flag, never a
traceback."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from batching.cli.args import DISAGG_KEYS, build_scenario
from batching.cli.main import main, make_parser
from batching.sim.topology.disagg import CROSS_NODE_GBPS, KV_TRANSFER_FIXED_S, Disagg
from batching.sim.hardware.specs import GPUS

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ["--prefill-instances", "1", "--prefill-tp", "4", "--decode-instances", "1", "--decode-tp", "4"]
SPLIT16 = ["--prefill-instances", "2", "--prefill-tp", "4", "--decode-instances", "2", "--decode-tp", "4"]
SMALL = ["--requests", "200", "--rate", "2"]
NVLINK_BPS = GPUS["h100-sxm"].nvlink_Bps


def _run_json(tmp_path, *argv) -> dict:
    out = tmp_path / "s.json"
    assert main(["run", *SMALL, *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _refused(capsys, argv) -> str:
    """The one stderr line of a command refused in-process (dispatch's exit code 2, or argparse's)."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: a bad value of one flag
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m batching"), err
    return err[0]


# ---------------------------------------------------------------- run


def test_run_with_the_split_prints_and_writes_its_figures(tmp_path, capsys):
    s = _run_json(tmp_path, "--preset", "chunked", *SPLIT)
    text = capsys.readouterr().out
    assert "# disaggregated: 1 prefill x TP 4 + 1 decode x TP 4, 8 GPUs on 1 node" in text
    for k in DISAGG_KEYS:
        assert f"\n{k} " in text, k
        assert k in s, k
    assert s["kv_transfer_p50_s"] > 0 and s["kv_transfer_p99_s"] >= s["kv_transfer_p50_s"]
    assert 0 < s["decode_busy"] <= 1 and 0 < s["prefill_busy"] <= 1
    assert s["decode_queue_p99_s"] >= s["decode_queue_p50_s"] >= 0
    assert s["disaggregated"] == "disaggregated: 1 prefill x TP 4 + 1 decode x TP 4"
    assert (s["gpus"], s["nodes"], s["replicas"]) == (8, 1, 2)
    assert s["num_requests"] == 200 and s["throughput_output_tok_s"] > 0
    assert "by_replica" not in s


def test_run_without_the_split_has_none_of_its_keys(tmp_path, capsys):
    s = _run_json(tmp_path)
    assert not set(s) & {*DISAGG_KEYS, "disaggregated", "gpus"}
    assert "# disaggregated" not in capsys.readouterr().out


def test_the_flags_reach_the_scenario():
    args = make_parser().parse_args(["run", *SPLIT16, "--num-nodes", "2", "--kv-link-gbps", "200"])
    sc = build_scenario(args)
    assert sc.disagg == Disagg(2, 4, 2, 4, kv_link_gbps=200.0)
    assert sc.nodes == 2
    assert build_scenario(make_parser().parse_args(["run"])).disagg is None
    assert make_parser().parse_args(["run", "--num-nodes", "3"]).nodes == 3  # the alias of --nodes


def test_num_nodes_2_carries_a_16_gpu_split_and_its_transfers_cross_the_network(tmp_path, capsys):
    one = _run_json(tmp_path, *SPLIT)
    two = _run_json(tmp_path, *SPLIT16, "--num-nodes", "2")
    assert "# disaggregated: 2 prefill x TP 4 + 2 decode x TP 4, 16 GPUs on 2 nodes" in capsys.readouterr().out
    assert (two["gpus"], two["nodes"], two["replicas"]) == (16, 2, 4)
    assert two["num_requests"] == 200 and 0 < two["decode_busy"] <= 1
    # the same prompts (same seed): across nodes 400 Gb/s per GPU instead of NVLink, on the same 4 GPU pairs
    # (after the fixed time per transfer, the same on both)
    fixed = KV_TRANSFER_FIXED_S
    assert two["kv_transfer_p50_s"] - fixed == pytest.approx(
        (one["kv_transfer_p50_s"] - fixed) * NVLINK_BPS / (CROSS_NODE_GBPS / 8 * 1e9), rel=1e-9)


def test_kv_transfer_fixed_ms_sets_the_fixed_time_of_every_transfer(tmp_path):
    """The default 6.7 ms (vLLM's NixlConnector posting a transfer, issue #50913) or the flag's value, added to each
    transfer's bytes over the link; the client's TTFT carries the difference."""
    default = _run_json(tmp_path, *SPLIT)
    none = _run_json(tmp_path, *SPLIT, "--kv-transfer-fixed-ms", "0")
    assert default["kv_transfer_p50_s"] - none["kv_transfer_p50_s"] == pytest.approx(KV_TRANSFER_FIXED_S, rel=1e-9)
    assert KV_TRANSFER_FIXED_S == 6.7e-3
    assert default["ttft_p50_s"] > none["ttft_p50_s"]


def test_kv_link_gbps_sets_the_transfer_bandwidth(tmp_path):
    nvlink = _run_json(tmp_path, *SPLIT)
    slow = _run_json(tmp_path, *SPLIT, "--kv-link-gbps", "100")
    fixed = KV_TRANSFER_FIXED_S  # per transfer, whatever the link
    for key in ("kv_transfer_p50_s", "kv_transfer_p99_s"):
        assert slow[key] - fixed == pytest.approx((nvlink[key] - fixed) * NVLINK_BPS / 12.5e9, rel=1e-9)


# ---------------------------------------------------------------- errors: one line naming the flag


@pytest.mark.parametrize("given, missing", [
    (["--prefill-instances", "1"], "missing --prefill-tp, --decode-instances, --decode-tp"),
    (["--prefill-instances", "1", "--prefill-tp", "4"], "missing --decode-instances and --decode-tp"),
    (["--prefill-instances", "1", "--prefill-tp", "4", "--decode-instances", "1"], "missing --decode-tp"),
    (["--decode-tp", "4"], "missing --prefill-instances, --prefill-tp, --decode-instances"),
])
def test_a_missing_partner_flag_is_one_line_naming_it(capsys, given, missing):
    line = _refused(capsys, ["run", *SMALL, *given])
    assert "a prefill/decode split needs all four flags" in line and line.endswith(missing)


@pytest.mark.parametrize("argv, needle", [
    (SPLIT16, "--prefill-instances/--prefill-tp/--decode-instances/--decode-tp: the split needs 16 GPUs (prefill 2 x "
              "TP 4 + decode 2 x TP 4) but 1 node of 8 GPUs have 8; use fewer or smaller instances, or --num-nodes 2"),
    ([*SPLIT16, "--num-gpus", "4", "--tp", "4", "--num-nodes", "2"], "the split needs 16 GPUs (prefill 2 x TP 4 + "
                                                                     "decode 2 x TP 4) but 2 nodes of 4 GPUs have 8"),
    (["--kv-link-gbps", "100"], "--kv-link-gbps: sets the KV transfer of a prefill/decode split; add "
                                "--prefill-instances, --prefill-tp, --decode-instances and --decode-tp"),
    (["--kv-transfer-fixed-ms", "5"], "--kv-transfer-fixed-ms: sets the KV transfer of a prefill/decode split; add "
                                      "--prefill-instances, --prefill-tp, --decode-instances and --decode-tp"),
    ([*SPLIT, "--kv-transfer-fixed-ms", "-1"], "argument --kv-transfer-fixed-ms: -1 is out of range; allowed 0 to "
                                               "10000"),
    ([*SPLIT, "--kv-link-gbps", "0.5"], "argument --kv-link-gbps: 0.5 is out of range; allowed 1 to 100000"),
    ([*SPLIT, "--prefill-instances", "0"], "argument --prefill-instances: 0 is out of range; allowed 1 to 64"),
    ([*SPLIT, "--decode-tp", "3"], "argument --decode-tp: 3 is not allowed; allowed 1, 2, 4, 8"),
    ([*SPLIT[:2], "--prefill-tp", "8", *SPLIT[4:], "--num-gpus", "4", "--tp", "4"],
     "--prefill-tp 8: is not allowed; allowed: 1, 2, 4, 8, at most the node's 4 GPUs"),
    ([*SPLIT[:2], "--prefill-tp", "1", *SPLIT[4:]], "--prefill-tp: the prefill instances (TP 1): model Qwen2.5-72B"),
    ([*SPLIT, "--preset", "static"], "disaggregation needs iteration-level batching (mode continuous"),
    ([*SPLIT, "--mode", "dynamic"], "dynamic batching runs each batch as a whole"),
    # speculation runs on a split (tests/test_spec_disagg.py); what no instance could run is refused by role
    ([*SPLIT, "--spec-decode", "mtp"], "--spec-decode mtp: the prefill instances (TP 4): spec_decode='mtp' needs "
                                       "multi-token-prediction modules"),
    ([*SPLIT, "--router", "least-kv"], "--router least-kv: a prefill/decode split routes by itself"),
    ([*SPLIT, "--kv-cache-tokens", "2000"], "--prefill-tp 4 with --kv-cache-tokens 2000: request"),
    ([*SPLIT, "--no-chunked-prefill", "--max-num-batched-tokens", "512"],
     "--max-num-batched-tokens: max_num_batched_tokens=512 is below the longest prompt"),
])
def test_bad_splits_are_one_line_naming_the_flag(capsys, argv, needle):
    assert needle in _refused(capsys, ["run", *SMALL, *argv])


def test_errors_from_the_shell_have_no_traceback():
    for argv in (["--prefill-instances", "1", "--decode-tp", "4"], SPLIT16):
        p = subprocess.run([sys.executable, "-m", "batching", "run", *SMALL, *argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m batching: error: --"), lines


# ---------------------------------------------------------------- capacity, compare, search


def test_capacity_of_the_split_is_a_positive_rate_and_plans_its_gpus(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["capacity", *SMALL, "--preset", "chunked", *SPLIT16, "--num-nodes", "2", "--slo-tpot-ms", "50",
                 "--target-rate", "20", "--gpu-hour-usd", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# engine: vLLM 0.11 profile (vllm)\n# disaggregated: 2 prefill x TP 4 + 2 decode x TP 4, "
                           "16 GPUs on 2 nodes")
    c = json.loads(out.read_text())
    assert c["max_rate_req_s"] > 0 and c["steady_output_tok_s"] > 0
    assert (c["gpus"], c["nodes"]) == (16, 2) and c["disaggregated"].startswith("disaggregated: 2 prefill")
    copies = math.ceil(20 * 1.25 / c["max_rate_req_s"] - 1e-9)  # the default headroom
    assert c["headroom"] == 1.25
    assert c["nodes_needed"] == math.ceil(copies * 16 / 8)  # the nodes that many copies of the split fill
    # studies.pricing.price: the nodes' $/h over the tokens 20 req/s bring an hour; at capacity: the split's 16 GPUs
    per_hour = 20 * c["mean_output_tokens"] * 3600
    assert c["usd_per_million_output_tokens"] == pytest.approx(c["nodes_needed"] * 8 * 2 / per_hour * 1e6)
    assert c["usd_per_million_output_tokens_at_capacity"] == pytest.approx(
        16 * 2 / (c["max_rate_req_s"] * c["mean_output_tokens"] * 3600) * 1e6)
    assert any(p["rate_req_s"] > c["max_rate_req_s"] for p in c["points"])  # a higher rate was tried and failed


def test_compare_with_the_split_runs_the_iteration_level_presets(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", *SMALL, *SPLIT, "--json", str(out)]) == 0
    assert "# disaggregated: 1 prefill x TP 4 + 1 decode x TP 4, 8 GPUs on 1 node (the iteration-level presets " \
           "continuous, chunked, priority" in capsys.readouterr().out
    c = json.loads(out.read_text())
    assert list(c) == ["continuous", "chunked", "priority"]
    for s in c.values():
        assert s["kv_transfer_p50_s"] > 0 and 0 < s["decode_busy"] <= 1 and s["capacity_req_s"] > 0
        assert s["disaggregated"] == "disaggregated: 1 prefill x TP 4 + 1 decode x TP 4"


def test_search_refuses_the_split_and_nodes_flags_in_one_line(capsys):
    """The search's grid is aggregated nodes and it sizes the nodes itself: the flags are refused, not ignored."""
    base = ["search", "--target-rate", "5", "--gpu-hour-usd", "2", "--slo-tpot-ms", "50", "--gpus", "h100-sxm"]
    for extra, msg in ((SPLIT, "--prefill-instances: the search enumerates the prefill/decode splits itself (--serving disagg or both)"),
                       (["--num-nodes", "2"], "--nodes: the search finds the nodes needed itself")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

def test_closed_loop_clients_run_on_a_split(tmp_path, capsys):
    """--concurrency N with a split (as Dynamo's and llm-d's published disaggregated runs use): the summary names
    the clients, and a closed loop's latencies are printed as numbers, never 'unbounded'."""
    out = tmp_path / "s.json"
    assert main(["run", *SPLIT, "--requests", "64", "--concurrency", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    s = json.loads(out.read_text())
    assert s["concurrency"] == 16 and s["overloaded"] is False and s["disaggregated"].startswith("disaggregated")
    assert "unbounded" not in printed and s["ttft_p50_s"] > s["kv_transfer_p50_s"] > 0
