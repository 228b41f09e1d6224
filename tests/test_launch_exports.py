"""The launch commands in the CLI's and the report's JSON (issue 24, item 7)."""
import json

from batching import report
from batching.cli.main import main
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.studies.launch import launch


def test_capacity_json_has_the_launch_commands(tmp_path):
    out = tmp_path / "c.json"
    assert main(["capacity", "--preset", "chunked", "--slo-ttft-ms", "2000", "--requests", "60", "--json",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["launch"]) == {"vllm", "sglang"}
    assert "vllm serve Qwen/Qwen2.5-72B-Instruct" in doc["launch"]["vllm"]
    assert "--max-num-batched-tokens 2048 \\\n  --enable-chunked-prefill" in doc["launch"]["vllm"]
    assert "--chunked-prefill-size 2048" in doc["launch"]["sglang"]


def test_search_json_rows_have_the_launch_commands(tmp_path):
    out = tmp_path / "s.json"
    rc = main(["search", "--slo-ttft-ms", "2000", "--target-rate", "5", "--gpu-hour-usd", "2", "--requests", "40",
               "--gpus", "h100-sxm", "--precisions", "bf16", "--tp", "4,8", "--policies", "chunked", "--workers", "1",
               "--fleet-top", "0", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["configs"]
    assert rows and all(set(r["launch"]) == {"vllm", "sglang"} for r in rows)
    agg = [r for r in rows if r["split"] is None]
    splits = [r for r in rows if r["split"] is not None]  # --serving both (the default): prefill/decode splits too
    assert agg and splits
    for r in agg:
        assert f"--tensor-parallel-size {r['tp']}" in r["launch"]["vllm"]
        assert f"--tp-size {r['tp']}" in r["launch"]["sglang"]
        assert ("--data-parallel-size 2" in r["launch"]["vllm"]) == (r["tp"] == 4)
    for r in splits:  # one command per side of the split, each at its own TP, joined over NIXL
        s = r["split"]
        vllm, sglang = r["launch"]["vllm"], r["launch"]["sglang"]
        assert "NixlConnector" in vllm and "--disaggregation-mode prefill" in sglang
        assert f"--tensor-parallel-size {s['prefill_tp']}" in vllm and f"--tensor-parallel-size {s['decode_tp']}" in vllm
        assert f"--tp-size {s['prefill_tp']}" in sglang and f"--tp-size {s['decode_tp']}" in sglang


def test_the_summary_json_export_carries_each_policys_commands():
    sc = Scenario()
    doc = json.loads(report.summary_json({}, sc, {"continuous": PRESETS["continuous"], "chunked": PRESETS["chunked"]}))
    assert doc["launch"]["chunked"] == launch(sc.with_policy(PRESETS["chunked"]))
    assert "--max-num-batched-tokens 32768" in doc["launch"]["continuous"]["vllm"]
