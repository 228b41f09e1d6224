"""Bring your own measurement (issue 23 item 8): ``python -m batching calibrate --bench FILE`` reads a vllm bench
serve, sglang.bench_serving or genai-perf result file, simulates the same setting and prints simulated against
measured. One small file in each format, built from a published run (the numbers kept as published; the sources
below), read field by field, run end to end, and the bad files' one-line errors."""
from __future__ import annotations

import json
import math

import pytest

from batching.cli.main import main
from batching.studies import bench_files as bf

# vllm-project/vllm pull request #18566 (mgoin, 2025-05-22), the `vllm bench serve` output in its description:
# meta-llama/Llama-3.1-8B-Instruct, ShareGPT (Aeala/ShareGPT_Vicuna_unfiltered), 1,000 prompts, request rate inf
# (the default), no max concurrency; the GPU is not stated there (the tests simulate an H100 at TP 1). Every number
# as published, in `vllm bench serve --save-result`'s keys.
VLLM_PR_18566 = {
    "date": "20250522-000000", "backend": "openai-chat", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 1000, "request_rate": "inf",
    "burstiness": 1.0, "max_concurrency": None, "duration": 30.85, "completed": 1000,
    "total_input_tokens": 229711, "total_output_tokens": 203068, "request_throughput": 32.42,
    "output_throughput": 6582.87, "total_token_throughput": 14029.44,
    "mean_ttft_ms": 9626.13, "median_ttft_ms": 9459.70, "p99_ttft_ms": 12666.73,
    "mean_tpot_ms": 77.86, "median_tpot_ms": 48.84, "p99_tpot_ms": 211.21,
    "mean_itl_ms": 38.13, "median_itl_ms": 25.44, "p99_itl_ms": 214.35,
}

# sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang v0.3.0), "Llama 3.1 70B Instruct 4 x H100 80G",
# `sglang.bench_serving --backend sglang --dataset-name sharegpt --num-prompts 1200 --request-rate 4`: the medians as
# published (E2E 3005.24, TTFT 53.94, TPOT 25.03, ITL 21.67 ms). The table gives no token totals; they come from
# published ShareGPT figures: 229.711 prompt tokens per request (PR #18566 above: 229,711 / 1,000, the Llama-3
# tokenizer) and 194.35 output tokens per request (the same README's offline SGLang run: 3,856.01 / 19.84), times 1,200.
SGLANG_V030_70B_4RPS = {
    "backend": "sglang", "dataset_name": "sharegpt", "request_rate": 4.0, "max_concurrency": None,
    "completed": 1200, "total_input_tokens": round(229.711 * 1200), "total_output_tokens": round(3856.01 / 19.84 * 1200),
    "median_e2e_latency_ms": 3005.24, "median_ttft_ms": 53.94, "median_tpot_ms": 25.03, "median_itl_ms": 21.67,
}

# The same README, vLLM v0.6.0 serving Llama 3.1 70B Instruct on 4 x H100 at 8 req/s (2,400 prompts): median E2E
# 3752.38, TTFT 207.12, TPOT 29.15 ms, written as genai-perf's profile_export_genai_perf.json (genai-perf's
# inter_token_latency is per request: vLLM's TPOT). Mean lengths as above (229.711 prompt; 3,700.64 / 19.04 = 194.36
# output tokens per request from the README's offline vLLM run).
GENAI_VLLM060_70B_8RPS = {
    "time_to_first_token": {"unit": "ms", "p50": 207.12},
    "inter_token_latency": {"unit": "ms", "p50": 29.15},
    "request_latency": {"unit": "ms", "p50": 3752.38},
    "input_sequence_length": {"unit": "tokens", "avg": 229.711},
    "output_sequence_length": {"unit": "tokens", "avg": 3700.64 / 19.04},
    "input_config": {"model": ["meta-llama/Llama-3.1-70B-Instruct"], "request_rate": 8.0, "concurrency": None,
                     "request_count": 2400},
}


def _write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


# ---------------------------------------------------------------- parsing


def test_vllm_file_every_field():
    b = bf.parse_bench(json.dumps(VLLM_PR_18566).encode(), "v.json")
    assert (b.fmt, b.model_id, b.num_requests, b.max_concurrency, b.burstiness) == (
        "vllm", "meta-llama/Llama-3.1-8B-Instruct", 1000, None, 1.0)
    assert math.isinf(b.request_rate) and bf.saturated(b)
    assert b.mean_input_tokens == pytest.approx(229.711) and b.mean_output_tokens == pytest.approx(203.068)
    want = {"ttft_mean_s": 9.62613, "ttft_median_s": 9.45970, "ttft_p99_s": 12.66673, "tpot_mean_s": 0.07786,
            "tpot_median_s": 0.04884, "tpot_p99_s": 0.21121, "itl_mean_s": 0.03813, "itl_median_s": 0.02544,
            "itl_p99_s": 0.21435, "request_throughput_req_s": 32.42, "output_throughput_tok_s": 6582.87,
            "total_token_throughput_tok_s": 14029.44}
    assert b.metrics == pytest.approx(want)
    assert bf.preset_for(b.model_id, "v.json") == "llama-3.1-8b"


def test_sglang_jsonl_reads_the_last_run_or_the_one_asked():
    first = dict(SGLANG_V030_70B_4RPS, request_rate=2.0)
    data = (json.dumps(first) + "\n" + json.dumps(SGLANG_V030_70B_4RPS) + "\n").encode()
    b = bf.parse_bench(data, "s.jsonl")
    assert (b.fmt, b.model_id, b.num_requests, b.request_rate, b.max_concurrency) == ("sglang", None, 1200, 4.0, None)
    assert b.mean_input_tokens == pytest.approx(229.711, abs=1e-3)
    assert b.mean_output_tokens == pytest.approx(194.35, abs=1e-2)
    assert b.metrics == pytest.approx({"e2e_median_s": 3.00524, "ttft_median_s": 0.05394, "tpot_median_s": 0.02503,
                                       "itl_median_s": 0.02167})
    assert bf.parse_bench(data, "s.jsonl", line=1).request_rate == 2.0


def test_genai_perf_file_every_field():
    b = bf.parse_bench(json.dumps(GENAI_VLLM060_70B_8RPS).encode(), "g.json")
    assert (b.fmt, b.model_id, b.num_requests, b.request_rate, b.max_concurrency, b.arrivals) == (
        "genai-perf", "meta-llama/Llama-3.1-70B-Instruct", 2400, 8.0, None, "constant")
    assert b.metrics == pytest.approx({"ttft_median_s": 0.20712, "tpot_median_s": 0.02915, "e2e_median_s": 3.75238})
    assert b.mean_output_tokens == pytest.approx(194.36, abs=1e-2)
    assert bf.preset_for(b.model_id, "g.json") == "llama-3.1-70b"
    conc = dict(GENAI_VLLM060_70B_8RPS, input_config={"model": "x", "concurrency": 16})
    b2 = bf.parse_bench(json.dumps(conc).encode(), "g.json")
    assert (b2.max_concurrency, math.isinf(b2.request_rate)) == (16, True)
    wl = bf.bench_workload(b2, 40)
    assert (wl.concurrency, wl.num_requests) == (16, 40)


@pytest.mark.parametrize("model_id, preset", [("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                              ("/models/Qwen2.5-72B-Instruct/", "qwen2.5-72b"),
                                              ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
                                              ("deepseek-ai/DeepSeek-V3", "deepseek-v3")])
def test_model_ids_map_to_presets(model_id, preset):
    assert bf.preset_for(model_id, "f") == preset


def test_workload_is_the_files_setting():
    b = bf.parse_bench(json.dumps(dict(VLLM_PR_18566, request_rate=5.0, burstiness=4.0)).encode(), "v.json")
    wl = bf.bench_workload(b, 30)
    r = wl.generate()
    assert set(r.prompt_tokens) == {230} and set(r.output_tokens) == {203}
    assert wl.arrivals.kind == "gamma" and wl.arrivals.cv == pytest.approx(0.5) and wl.arrivals.rate_req_s == 5.0
    lists = dict(VLLM_PR_18566, input_lens=[100, 300], output_lens=[50, 0, 70])  # vLLM: 0 for a failed request
    r2 = bf.bench_workload(bf.parse_bench(json.dumps(lists).encode(), "v.json"), 50).generate()
    assert set(r2.prompt_tokens) <= {100, 300} and set(r2.output_tokens) <= {50, 70}


def test_error_is_simulated_over_measured_minus_one():
    assert bf.error(200.0, 150.0) == pytest.approx(-0.25)
    assert bf.error(10.0, 12.0) == pytest.approx(0.2)
    assert math.isnan(bf.error(0.0, 1.0))


# ---------------------------------------------------------------- end to end


def _rows(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        if line.startswith("#") or line.startswith("-") or line.startswith("metric"):
            continue
        parts = line.rsplit(None, 4)
        rows[parts[0]] = (float(parts[1].replace(",", "")), float(parts[2].replace(",", "")), float(parts[3]))
    return rows


def test_vllm_file_end_to_end(tmp_path, capsys):
    path = _write(tmp_path, "vllm.json", VLLM_PR_18566)
    out_json = tmp_path / "o.json"
    assert main(["calibrate", "--bench", path, "--tp", "1", "--requests", "200", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "meta-llama/Llama-3.1-8B-Instruct -> Llama-3.1-8B, 1x H100" in out
    assert "200 requests, 230 prompt / 203 output tokens (the file's means), all requests at once" in out
    rows = _rows(out)
    assert set(rows) == {"TTFT mean (ms)", "TTFT median (ms)", "TTFT P99 (ms)", "TPOT mean (ms)", "TPOT median (ms)",
                         "TPOT P99 (ms)", "ITL mean (ms)", "ITL median (ms)", "ITL P99 (ms)",
                         "request throughput (req/s)", "output throughput (tok/s)", "total token throughput (tok/s)"}
    for label, (meas, sim, err) in rows.items():
        assert err == pytest.approx((sim / meas - 1) * 100, abs=0.06), label  # printed rounded
    assert rows["TTFT mean (ms)"][0] == 9626.13
    data = json.loads(out_json.read_text())
    assert data["model"] == "Llama-3.1-8B" and data["num_requests"] == 200 and data["request_rate"] == "inf"
    m = {r["metric"]: r for r in data["metrics"]}
    assert m["output_throughput_tok_s"]["measured"] == 6582.87
    sim = m["output_throughput_tok_s"]["simulated"]
    assert m["request_throughput_req_s"]["simulated"] * 203 == pytest.approx(sim, rel=1e-9)  # 203 tokens a request
    assert m["ttft_p99_s"]["error"] == pytest.approx(m["ttft_p99_s"]["simulated"] / 12666.73 - 1)


def test_sglang_file_end_to_end_needs_a_model(tmp_path, capsys):
    path = _write(tmp_path, "sglang.jsonl", json.dumps(SGLANG_V030_70B_4RPS) + "\n")
    assert main(["calibrate", "--bench", path]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'sglang.jsonl': key 'model_id': the file names no model; give --model" in err
    assert main(["calibrate", "--bench", path, "--model", "llama-3.1-70b", "--tp", "4", "--requests", "200"]) == 0
    out = capsys.readouterr().out
    assert "sglang result" in out and "4x H100" in out and "4 req/s (Poisson)" in out
    rows = _rows(out)
    assert set(rows) == {"TTFT median (ms)", "TPOT median (ms)", "ITL median (ms)", "E2E median (ms)"}
    assert rows["TPOT median (ms)"][0] == 25.03
    assert 10 < rows["TPOT median (ms)"][1] < 40  # a 70B decode step at TP 4, ms per token


def test_genai_perf_file_end_to_end(tmp_path, capsys):
    path = _write(tmp_path, "profile_export_genai_perf.json", GENAI_VLLM060_70B_8RPS)
    assert main(["calibrate", "--bench", path, "--tp", "4", "--requests", "200"]) == 0
    out = capsys.readouterr().out
    assert "genai-perf result" in out and "Llama-3.1-70B" in out and "8 req/s (evenly spaced)" in out
    rows = _rows(out)
    assert set(rows) == {"TTFT median (ms)", "TPOT median (ms)", "E2E median (ms)"}
    assert rows["E2E median (ms)"][0] == 3752.38


# ---------------------------------------------------------------- bad files


@pytest.mark.parametrize("doc, message", [
    ("", "'f.json': empty; expected a vllm bench serve"),
    ("{not json", "'f.json': not JSON or JSON lines"),
    ("[1, 2]", "'f.json': a JSON list; expected an object of results"),
    ({"foo": 1}, "'f.json': key 'mean_ttft_ms' (vLLM, SGLang) or 'time_to_first_token' (genai-perf)"),
    ({k: v for k, v in VLLM_PR_18566.items() if k != "completed"}, "key 'completed': expected a number from 1 to"),
    (dict(VLLM_PR_18566, total_input_tokens="many"), "key 'total_input_tokens': expected a number, got 'many'"),
    (dict(VLLM_PR_18566, mean_ttft_ms=-3), "key 'mean_ttft_ms': expected a number from 0 to inf, got '-3.0'"),
    (dict(VLLM_PR_18566, request_rate=0), "key 'request_rate': expected a rate above 0 req/s"),
    (dict(VLLM_PR_18566, max_concurrency=2.5), "key 'max_concurrency': expected an integer from 1 to"),
    (dict(VLLM_PR_18566, model_id="acme/Foo-13B"), "model 'acme/Foo-13B' is not a preset (qwen2.5-72b,"),
    ({k: v for k, v in GENAI_VLLM060_70B_8RPS.items() if k != "output_sequence_length"},
     "key 'output_sequence_length.avg': expected the mean tokens per request"),
    (dict(GENAI_VLLM060_70B_8RPS, time_to_first_token={"unit": "fortnights", "p50": 1}),
     "key 'time_to_first_token.unit': expected one of ms, s"),
])
def test_bad_files_are_one_line_errors(tmp_path, capsys, doc, message):
    path = _write(tmp_path, "f.json", doc)
    assert main(["calibrate", "--bench", path, "--tp", "1", "--requests", "20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err, err


def test_bench_flags_need_bench_and_a_missing_file(tmp_path, capsys):
    assert main(["calibrate", "--tp", "1", "--no-end-to-end"]) == 2
    assert "--tp: applies to --bench FILE" in capsys.readouterr().err
    assert main(["calibrate", "--bench", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["calibrate", "--bench", _write(tmp_path, "s.jsonl", json.dumps(SGLANG_V030_70B_4RPS)),
                 "--bench-line", "3", "--model", "llama-3.1-70b"]) == 2
    assert "--bench-line 3: the file 's.jsonl' holds 1 run(s); allowed 1 to 1" in capsys.readouterr().err
