"""Benchmark result files a serving engineer already has, read into one form and held against the simulator
(issue 23 item 8, ``python -m batching calibrate --bench FILE``).

Formats (``parse_bench`` tells them apart by their keys):

- ``vllm``: ``vllm bench serve --save-result`` (and benchmarks/benchmark_serving.py) JSON: ``model_id``,
  ``num_prompts``, ``request_rate`` ("inf" or a number), ``burstiness``, ``max_concurrency``, ``completed``,
  ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``, ``output_throughput``,
  ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms``, optionally ``input_lens`` / ``output_lens``.
- ``sglang``: ``python -m sglang.bench_serving --output-file`` JSONL, one run a line (the last one by default):
  the same throughput keys, ``{mean,median,std,pNN}_{ttft,tpot,itl}_ms`` and ``*_e2e_latency_ms``.
- ``genai-perf``: ``profile_export_genai_perf.json``: ``time_to_first_token``, ``inter_token_latency``,
  ``request_latency`` objects (``avg``, ``p50``, ``p99``, ``std``... in their ``unit``, ms by default),
  ``request_throughput`` / ``output_token_throughput`` (``avg``), ``input_sequence_length`` /
  ``output_sequence_length`` (``avg``), ``input_config`` (``model``, ``concurrency``, ``request_rate``).
  genai-perf's inter-token latency is per request, (request latency − TTFT) / (output tokens − 1): vLLM's TPOT,
  so it is compared with the simulated TPOT.

Every figure becomes a ``metric`` key in SI units (seconds, req/s, tok/s): ``ttft_mean_s``, ``tpot_p99_s``,
``e2e_median_s``, ``request_throughput_req_s``, ``output_throughput_tok_s``... A bad file is a ValueError of one
line naming the file, the key and what was expected. Nothing here is fitted: ``compare`` puts the simulated value
of each metric beside the measured one.
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from batching.sim.hardware.engines import engine_profile
from batching.sim.hardware.specs import MODELS, Deployment
from batching.sim.metrics import hist_percentile
from batching.sim.policy import BatchingPolicy
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import (DEFAULT_CLASSES, MAX_CONCURRENCY, MAX_NUM_REQUESTS, ArrivalProcess,
                                            LengthDist, SyntheticWorkload)
from batching.sim.workload.traces import MAX_TOKENS
from batching.studies.launch import HF_IDS

FORMATS = ("vllm", "sglang", "genai-perf")
LATENCIES = ("ttft", "tpot", "itl", "e2e")
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
THROUGHPUTS = {"request_throughput_req_s": ("request throughput", "req/s"),
               "output_throughput_tok_s": ("output throughput", "tok/s"),
               "total_token_throughput_tok_s": ("total token throughput", "tok/s")}
_STAT = r"(mean|median|std|p\d+(?:\.\d+)?)"
_VLLM_KEY = re.compile(rf"^{_STAT}_(ttft|tpot|itl|e2el)_ms$")
_SGLANG_KEY = re.compile(rf"^{_STAT}_(ttft|tpot|itl|e2e_latency)_ms$")
_GENAI = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2e"}
_GENAI_UNITS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class BenchFile:
    """One measured run: its setting and its figures (SI units), as read from the file."""

    fmt: str
    name: str  # the file's name, for messages
    model_id: str | None
    num_requests: int
    request_rate: float  # req/s; inf: all at once (or as fast as the clients send)
    max_concurrency: int | None
    burstiness: float  # vLLM's Gamma shape; 1 = Poisson
    mean_input_tokens: float
    mean_output_tokens: float
    metrics: dict = field(default_factory=dict)  # metric key -> measured value (s, req/s, tok/s)
    input_lens: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()
    arrivals: str = "poisson"  # genai-perf's request-rate mode sends evenly spaced: "constant"


def _fail(name: str, key: str, expected: str, got=None) -> ValueError:
    shown = "" if got is None else f", got {str(got)[:60]!r}"
    return ValueError(f"--bench {name!r}: key {key!r}: expected {expected}{shown}")


def _number(d: dict, name: str, key: str, low: float = 0.0, high: float = math.inf, inf_ok: bool = False,
            required: bool = True) -> float | None:
    if key not in d or d[key] is None:
        if required:
            raise _fail(name, key, f"a number from {low:g} to {high:g} (missing)")
        return None
    v = d[key]
    if inf_ok and isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(name, key, "a number" + (" or \"inf\"" if inf_ok else ""), v)
    v = float(v)
    if math.isnan(v) or (math.isinf(v) and not inf_ok) or not (low <= v <= high or (inf_ok and v == math.inf)):
        raise _fail(name, key, f"a number from {low:g} to {high:g}" + (" or inf" if inf_ok else ""), v)
    return v


def _lens(d: dict, name: str, key: str, n: int | None) -> tuple[int, ...]:
    v = d.get(key)
    if v is None:
        return ()
    if (not isinstance(v, list) or not v
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_TOKENS for x in v)):
        raise _fail(name, key, f"a list of token counts from 0 to {MAX_TOKENS:,}")
    return tuple(x for x in v if x > 0)  # vLLM writes 0 for a failed request's output


def _stat(s: str, name: str = "", key: str = "") -> str:
    """A statistic's name as a metric has it (p50 is the median); a percentile above 100 (``p150_ttft_ms``) is
    refused naming the file and key, before anything is simulated."""
    if s.startswith("p") and not 0.0 <= float(s[1:]) <= 100.0:
        raise _fail(name, key, "a percentile from p0 to p100 (as p50, p99, p99.9)")
    return "median" if s == "p50" else s


def _concurrency(d: dict, name: str, key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= MAX_CONCURRENCY:
        raise _fail(name, key, f"an integer from 1 to {MAX_CONCURRENCY:,} or null", v)
    return int(v)


def _common(d: dict, name: str, fmt: str, key_re: re.Pattern, rename: dict) -> BenchFile:
    """vLLM's and SGLang's flat result dicts (the same throughput and token keys)."""
    completed = _number(d, name, "completed", 1, MAX_NUM_REQUESTS)
    if completed != int(completed):
        raise _fail(name, "completed", "a whole number of requests", d["completed"])
    n = int(completed)
    tin = _number(d, name, "total_input_tokens", 1, MAX_TOKENS * n)
    tout = _number(d, name, "total_output_tokens", 1, MAX_TOKENS * n)
    metrics: dict = {}
    for key, v in d.items():
        m = key_re.match(key)
        if m is None:
            continue
        val = _number(d, name, key, 0.0)
        metrics[f"{rename[m.group(2)]}_{_stat(m.group(1), name, key)}_s"] = val * 1e-3
    for key, metric in (("request_throughput", "request_throughput_req_s"),
                        ("output_throughput", "output_throughput_tok_s"),
                        ("total_token_throughput", "total_token_throughput_tok_s")):
        v = _number(d, name, key, 0.0, required=False)
        if v is not None:
            metrics[metric] = v
    rate = _number(d, name, "request_rate", 0.0, inf_ok=True, required=False)
    if rate is None:
        rate = math.inf  # both tools' default: every request at once
    if rate == 0.0:
        raise _fail(name, "request_rate", "a rate above 0 req/s or \"inf\"", d["request_rate"])
    burst = _number(d, name, "burstiness", 1e-3, 1e3, required=False) or 1.0
    model = d.get("model_id") or d.get("model") or d.get("model_path") or d.get("tokenizer_id")
    ins, outs = _lens(d, name, "input_lens", n), _lens(d, name, "output_lens", n)
    return BenchFile(fmt, name, str(model) if model else None, n, rate, _concurrency(d, name, "max_concurrency"),
                     burst, tin / n, tout / n, metrics, ins, outs)


def _genai(d: dict, name: str) -> BenchFile:
    metrics: dict = {}
    for key, lat in _GENAI.items():
        obj = d.get(key)
        if obj is None:
            continue
        if not isinstance(obj, dict):
            raise _fail(name, key, "an object of statistics (avg, p50, p99 ...)", obj)
        unit = obj.get("unit", "ms")
        if not isinstance(unit, str) or unit not in _GENAI_UNITS:
            raise _fail(name, f"{key}.unit", f"one of {', '.join(_GENAI_UNITS)}", unit)
        for stat, v in obj.items():
            if stat == "unit":
                continue
            s = {"avg": "mean", "p50": "median"}.get(stat, stat)
            if s not in ("mean", "median", "std") and not re.fullmatch(r"p\d+(?:\.\d+)?", s):
                continue  # min, max
            s = _stat(s, name, f"{key}.{stat}")
            metrics[f"{lat}_{s}_s"] = _number({f"{key}.{stat}": v}, name, f"{key}.{stat}", 0.0) * _GENAI_UNITS[unit]
    for key, metric in (("request_throughput", "request_throughput_req_s"),
                        ("output_token_throughput", "output_throughput_tok_s")):
        obj = d.get(key)
        if obj is not None:
            if not isinstance(obj, dict):
                raise _fail(name, key, "an object with avg", obj)
            metrics[metric] = _number({f"{key}.avg": obj.get("avg")}, name, f"{key}.avg", 0.0)
    lens = {}
    for key in ("input_sequence_length", "output_sequence_length"):
        obj = d.get(key)
        if not isinstance(obj, dict) or "avg" not in obj:
            raise _fail(name, f"{key}.avg", "the mean tokens per request (missing)")
        lens[key] = _number({f"{key}.avg": obj["avg"]}, name, f"{key}.avg", 1.0, MAX_TOKENS)
    cfg = d.get("input_config") or {}
    if not isinstance(cfg, dict):
        raise _fail(name, "input_config", "an object", cfg)
    model = cfg.get("model") or cfg.get("model_names")
    if isinstance(model, list):
        model = model[0] if model else None
    analyzer = cfg.get("perf_analyzer")
    if analyzer is not None and not isinstance(analyzer, dict):
        raise _fail(name, "input_config.perf_analyzer", "an object", analyzer)
    stim = (analyzer or {}).get("stimulus")
    if stim is not None and not isinstance(stim, dict):
        raise _fail(name, "input_config.perf_analyzer.stimulus", "an object (concurrency or request_rate)", stim)
    stim = stim or {}
    conc = cfg.get("concurrency", stim.get("concurrency"))
    rate = cfg.get("request_rate", stim.get("request_rate"))
    if rate is not None:
        r = _number({"input_config.request_rate": rate}, name, "input_config.request_rate", 0.0, inf_ok=True)
        if r == 0.0:
            raise _fail(name, "input_config.request_rate", "a rate above 0 req/s", rate)
        conc_v = None
    else:
        r = math.inf
        conc_v = _concurrency({"input_config.concurrency": conc if conc is not None else 1}, name,
                              "input_config.concurrency")
    n_obj = d.get("request_count") or {}
    n = None
    if isinstance(n_obj, dict) and "avg" in n_obj:
        n = _number({"request_count.avg": n_obj["avg"]}, name, "request_count.avg", 1, MAX_NUM_REQUESTS)
    if n is None:
        n = cfg.get("request_count")
    if n is None or isinstance(n, bool) or not isinstance(n, (int, float)) or not 1 <= n <= MAX_NUM_REQUESTS:
        n = 0  # genai-perf measures for a time window; the command sets the count (--requests)
    return BenchFile("genai-perf", name, str(model) if model else None, int(n), r, conc_v, 1.0,
                     lens["input_sequence_length"], lens["output_sequence_length"], metrics,
                     arrivals="constant" if rate is not None else "poisson")


def parse_bench(data: bytes, name: str, line: int | None = None) -> BenchFile:
    """The run in a vLLM, SGLang or genai-perf result file (``line``: which run of a JSONL file, 1-based; default
    the last). A ValueError of one line for anything the file lacks or has wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--bench {name!r}: not UTF-8 text; expected a JSON result file") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        try:
            docs = [json.loads(text)] if text.strip() else []
        except json.JSONDecodeError:
            try:
                docs = [json.loads(ln) for ln in lines]
            except json.JSONDecodeError as exc:
                raise ValueError(f"--bench {name!r}: not JSON or JSON lines ({exc.msg} at line {exc.lineno}); "
                                 "expected a vllm bench serve, sglang.bench_serving or genai-perf result file") from None
    except RecursionError:  # arrays or objects nested thousands deep overflow the decoder's stack
        raise ValueError(f"--bench {name!r}: not a result file: its JSON nests arrays or objects too deeply") from None
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
        raise ValueError(f"--bench {name!r}: not a result file: a number has more than "
                         f"{sys.get_int_max_str_digits():,} digits") from None
    if not docs:
        raise ValueError(f"--bench {name!r}: empty; expected a vllm bench serve, sglang.bench_serving or genai-perf "
                         "result file")
    if line is not None and not 1 <= line <= len(docs):
        raise ValueError(f"--bench-line {line}: the file {name!r} holds {len(docs)} run(s); allowed 1 to {len(docs)}")
    d = docs[(line or len(docs)) - 1]
    if not isinstance(d, dict):
        raise ValueError(f"--bench {name!r}: a JSON {type(d).__name__}; expected an object of results")
    if "time_to_first_token" in d or "input_sequence_length" in d:
        return _genai(d, name)
    sglang = "input_throughput" in d or any(k.endswith("_e2e_latency_ms") for k in d)  # vLLM writes neither
    if sglang and any(_SGLANG_KEY.match(k) for k in d):
        return _common(d, name, "sglang", _SGLANG_KEY,
                       {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e_latency": "e2e"})
    if any(_VLLM_KEY.match(k) for k in d):
        return _common(d, name, "vllm", _VLLM_KEY, {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"})
    raise ValueError(f"--bench {name!r}: key 'mean_ttft_ms' (vLLM, SGLang) or 'time_to_first_token' (genai-perf): "
                     "expected one of them; this is not a result file of vllm bench serve, sglang.bench_serving or "
                     "genai-perf")


# ---------------------------------------------------------------- the model


def _norm(model_id: str) -> str:
    """A HuggingFace id or a local path, as the model's family: 'meta-llama/Meta-Llama-3.1-8B-Instruct' and
    '/models/Llama-3.1-8B-Instruct' both give 'llama-3.1-8b'."""
    base = model_id.strip().rstrip("/").split("/")[-1].lower()
    base = re.sub(r"^meta-", "", base)
    return re.sub(r"-instruct.*$", "", base)


def preset_for(model_id: str | None, name: str) -> str:
    """The preset key (MODELS) whose HuggingFace id (launch.HF_IDS) the file's model names."""
    if not model_id:
        raise ValueError(f"--bench {name!r}: key 'model_id': the file names no model; give --model (one of "
                         f"{', '.join(MODELS)})")
    want = _norm(model_id)
    for key, m in MODELS.items():
        if want in (_norm(HF_IDS.get(m.name, m.name)), key):
            return key
    raise ValueError(f"--bench {name!r}: model {model_id!r} is not a preset ({', '.join(MODELS)}); give --model "
                     "with the preset of the same shape")


# ---------------------------------------------------------------- the same setting, simulated


def bench_workload(b: BenchFile, num_requests: int | None = None, seed: int = 0) -> SyntheticWorkload:
    """The file's traffic: its lengths (per-request lists resampled, else fixed at the means), its request count
    (or ``num_requests``), its rate or its clients (closed loop) or all at once."""
    n = num_requests or b.num_requests
    if not n:
        raise ValueError(f"--bench {b.name!r}: the file gives no request count; give --requests N")

    def dist(values: tuple[int, ...], mean: float) -> LengthDist:
        if values:
            return LengthDist("empirical", low=min(values), high=max(values), values=values)
        t = max(1, round(mean))
        return LengthDist("fixed", mean=t, low=1, high=t)

    cls = replace(DEFAULT_CLASSES[0], name="bench", priority=0, share=1.0, prompt=dist(b.input_lens,
                  b.mean_input_tokens), output=dist(b.output_lens, b.mean_output_tokens), slo_ttft_s=None,
                  slo_tpot_s=None)
    rate = b.request_rate if math.isfinite(b.request_rate) else 1.0
    wl = SyntheticWorkload(ArrivalProcess("poisson", rate), (cls,), n, seed)
    if b.max_concurrency is not None and not math.isfinite(b.request_rate):
        wl = wl.with_concurrency(b.max_concurrency, 0.0)
    elif math.isfinite(b.request_rate):
        if b.arrivals == "constant":
            wl = wl.with_arrivals("constant")
        elif b.burstiness != 1.0:
            wl = wl.with_arrivals("gamma", cv=1.0 / math.sqrt(b.burstiness))
    wl.validate()
    return wl


def saturated(b: BenchFile) -> bool:
    """All requests at once: rate inf and no client cap (vLLM's and SGLang's default)."""
    return not math.isfinite(b.request_rate) and b.max_concurrency is None


def bench_scenario(b: BenchFile, dep: Deployment, policy: BatchingPolicy | None, num_requests: int | None = None,
                   seed: int = 0, allreduce: str | None = None, engine=None) -> Scenario:
    """The file's setting on ``dep`` run by ``engine`` (a name or profile; default vLLM) with ``policy`` (None: the
    engine's own scheduler defaults)."""
    wl = bench_workload(b, num_requests, seed)
    prof = engine_profile(engine)
    policy = prof.policy if policy is None else policy
    pol = policy.sized_for(dep.model.max_context_tokens, int(max(b.input_lens or (round(b.mean_input_tokens),))))
    sc = Scenario(dep, wl, pol, allreduce, engine=prof.name if engine is None or isinstance(engine, str) else prof)
    sc.validate()
    return sc


def simulated_metrics(res) -> dict:
    """Every metric key a bench file can hold, from a SimResult (requests table, step table, ITL histogram)."""
    s = res.summary()
    req = res.requests
    wall = s["num_requests"] / s["throughput_req_s"] if s.get("throughput_req_s") else float("nan")
    out = {"request_throughput_req_s": s["throughput_req_s"], "output_throughput_tok_s": s["throughput_output_tok_s"],
           "total_token_throughput_tok_s": s["throughput_total_tok_s"], "_wall_s": wall}
    cols = {"ttft": req["ttft_s"], "tpot": req["tpot_s"].dropna(), "e2e": req["e2e_s"]}
    for lat, col in cols.items():
        out[f"{lat}_mean_s"] = float(col.mean())
        out[f"{lat}_median_s"] = float(col.median())
        out[f"{lat}_std_s"] = float(col.std(ddof=0))
        out[f"_{lat}_values"] = col.to_numpy()
    gaps = (req["output_tokens"] - 1).clip(lower=0)
    out["itl_mean_s"] = float((req["e2e_s"] - req["ttft_s"])[gaps > 0].sum() / gaps.sum()) if gaps.sum() else math.nan
    out["_itl_hist"] = (res.itl_hist.sum(axis=0), res.itl_edges)
    return out


def sim_value(sim: dict, metric: str) -> float | None:
    if metric in sim:
        return sim[metric]
    if metric == "itl_median_s":
        metric = "itl_p50_s"
    m = re.fullmatch(r"(ttft|tpot|itl|e2e)_p(\d+(?:\.\d+)?)_s", metric)
    if m is None:
        return None
    lat, q = m.group(1), float(m.group(2))
    if lat == "itl":
        counts, edges = sim["_itl_hist"]
        return hist_percentile(counts, edges, q) if counts.sum() else math.nan
    vals = sim[f"_{lat}_values"]
    return float(np.percentile(vals, q)) if len(vals) else math.nan


def _order(metric: str) -> tuple:
    if metric in THROUGHPUTS:
        return (1, list(THROUGHPUTS).index(metric), 0.0)
    lat, stat = metric.split("_")[0], metric.split("_")[1]
    fixed = {"mean": -3.0, "median": -2.0, "std": 1000.0}
    rank = fixed[stat] if stat in fixed else float(stat[1:])
    return (0, LATENCIES.index(lat), rank)


def metric_label(metric: str) -> str:
    if metric in THROUGHPUTS:
        label, unit = THROUGHPUTS[metric]
        return f"{label} ({unit})"
    lat, stat = metric.split("_")[0], metric.split("_")[1]
    stat = {"p50": "median"}.get(stat, stat)
    return f"{LATENCY_NAMES[lat]} {stat.upper() if stat.startswith('p') else stat} (ms)"


def error(measured: float, simulated: float) -> float:
    """(simulated − measured) / measured; NaN when nothing was measured."""
    return simulated / measured - 1.0 if measured else math.nan


def compare(b: BenchFile, res) -> pd.DataFrame:
    """metric | label | unit | measured | simulated | error: every metric of the file the simulator gives, in the
    file's units (ms, req/s, tok/s)."""
    sim = simulated_metrics(res)
    rows = []
    for metric in sorted(b.metrics, key=_order):
        v = sim_value(sim, metric)
        if v is None:
            continue
        scale = 1.0 if metric in THROUGHPUTS else 1e3
        unit = THROUGHPUTS[metric][1] if metric in THROUGHPUTS else "ms"
        meas = b.metrics[metric] * scale
        simv = v * scale
        rows.append({"metric": metric, "label": metric_label(metric), "unit": unit, "measured": meas,
                     "simulated": simv, "error": error(meas, simv)})
    return pd.DataFrame(rows, columns=["metric", "label", "unit", "measured", "simulated", "error"])
