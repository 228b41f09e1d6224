"""Every metric, defined once (docs/ARCHITECTURE.md "Metrics"). Times in seconds, rates per second."""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e", "queue_delay")

# name -> (label with unit, one-line definition); the dashboard's headers and tooltips
DEFINITIONS: dict[str, tuple[str, str]] = {
    "ttft": ("TTFT (s)", "Time to first token: first token − arrival, queueing included."),
    "tpot": ("TPOT (s)", "Time per output token: (E2E − TTFT) / (output tokens − 1), requests with ≥ 2 output "
             "tokens, as vLLM's benchmark computes it."),
    "itl": ("ITL (s)", "Inter-token latency: every gap between two consecutive tokens of a request."),
    "e2e": ("E2E (s)", "End-to-end latency: release − arrival (a static batch releases all its requests at once)."),
    "queue_delay": ("Queue delay (s)", "First scheduled − arrival."),
    "throughput_output_tok_s": ("Throughput over the run (output tok/s)",
                                "Output tokens / time from the first arrival to the last release, at the offered load: "
                                "the drain after the last arrival included, as vLLM's benchmark reports it."),
    "steady_output_tok_s": ("Steady throughput (output tok/s)",
                            "Output tokens of the requests started (first token) by the last arrival / time from the "
                            "first arrival to the last: the drain not counted; offered rate × mean output tokens "
                            "while the node keeps up."),
    "capacity_output_tok_s": ("Capacity (output tok/s)",
                              "Output tokens / s when the queue never empties: every request arrives at t = 0."),
    "capacity_req_s": ("Capacity (req/s)", "Requests per second when the queue never empties: every request "
                       "arrives at t = 0."),
    "goodput_req_s": ("Goodput (req/s)", "Requests started (first token) by the last arrival that meet every SLO "
                      "given (TTFT, TPOT, E2E) / time from the first arrival to the last: the drain not counted; "
                      "offered rate × share within the SLOs while the node keeps up."),
    "busy": ("Busy (%)", "Share of wall time with a forward pass running: what nvidia-smi's GPU-Util shows; ≈ 100 % "
             "whenever anything decodes, so it cannot tell a batch of 1 from 256."),
    "gpu_util": ("GPU util (%)", "Σ over steps of step time × useful share of its token slots (padded slots and "
                 "finished sequences held in a static batch are waste) / wall time: idle waits and padding lower it."),
    "sol_util": ("SOL util (%)", "Speed of light: roofline time of the useful work (ideal FLOPs or bytes, whichever "
                 "bounds) / wall time; can fall as batches grow, a diagnostic."),
    "mfu": ("MFU (%)", "Model FLOPs utilisation: useful FLOPs / (peak FLOP/s × wall time)."),
    "mbu": ("MBU (%)", "Model bandwidth utilisation: useful bytes moved (weights, KV reads) / (peak HBM bandwidth × "
            "wall time)."),
    "kv_util": ("KV cache in use (%)", "Time-weighted mean share of KV cache blocks held (reserved, for static and "
                "dynamic), idle time counted as empty: vLLM's gpu_cache_usage_perc."),
    "load": ("Load (%)", "Steady throughput at this load (over the arrival window, the run's drain left out) / this "
             "policy's capacity: the share of what it can carry that this traffic uses; at ≈ 100 % the queue grows."),
    "overloaded": ("Overloaded", "Offered request rate ≥ this policy's capacity, or requests in the system grow "
                   "through the run: latencies then measure the run's length, not the policy."),
    "queue_growth_req_s": ("Queue growth (req/s)", "Trend of the waiting queue (arrived, not yet scheduled) over the "
                           "second half of the arrivals (least-squares slope); ≈ 0 when the policy keeps up."),
    "offered_req_s": ("Offered load (req/s)", "Requests / time from the first arrival to the last."),
    "batch_efficiency": ("Batch efficiency (%)",
                         "Mean sequences doing useful work per step / the batch cap (max_batch_size or max_num_seqs); "
                         "how full the batch runs, neither good nor bad by itself."),
    "mean_running": ("Mean running batch", "Mean sequences doing useful work per step."),
    "preemptions": ("Preemptions", "Times a running request was evicted (recompute or swap)."),
    "prefix_hit_rate": ("Prefix cache hit rate (%)", "Prompt tokens served from the prefix cache at each request's "
                        "first admission / prompt tokens (vLLM's prefix cache hit rate, counted once per request)."),
    "cached_prompt_tokens": ("Cached prompt tokens", "Prompt tokens served from the prefix cache (not computed) at "
                             "the requests' first admission."),
    "spec_acceptance_rate": ("Draft acceptance (%)", "Speculative decoding: accepted draft tokens / draft tokens "
                             "proposed and verified."),
    "mean_tokens_per_step": ("Tokens per verification", "Speculative decoding: tokens a speculating sequence emits "
                             "per step (accepted + 1), on average; (1 − A^(K+1)) / (1 − A) expected."),
    "spec_share": ("Speculating decodes (%)", "Speculative decoding: decode sequence-steps that speculated (the rest "
                   "decoded one token: speculation disabled by batch size, the output's last token, the budget)."),
    "draft_time_share": ("Draft time (%)", "Speculative decoding: share of the forward-pass time spent drafting "
                         "(draft model or head passes)."),
}


def request_latencies(df: pd.DataFrame) -> pd.DataFrame:
    """Add ttft_s, tpot_s, e2e_s, queue_delay_s columns to a per-request table (a new table)."""
    arrival = df["arrival_s"].to_numpy()
    out_tok = df["output_tokens"].to_numpy()
    ttft = df["first_token_s"].to_numpy() - arrival
    e2e = df["release_s"].to_numpy() - arrival
    tpot = np.where(out_tok >= 2, (e2e - ttft) / np.maximum(out_tok - 1, 1), np.nan)
    return df.assign(ttft_s=ttft, e2e_s=e2e, queue_delay_s=df["first_scheduled_s"].to_numpy() - arrival, tpot_s=tpot)


def percentiles(values, qs) -> list[float]:
    """The ``qs`` percentiles of the values that are not NaN (one sort); NaN each when none is."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return [float(x) for x in np.percentile(v, qs)] if v.size else [float("nan")] * len(qs)


def percentile(values, q: float) -> float:
    return percentiles(values, (q,))[0]


def hist_percentile(counts: np.ndarray, edges: np.ndarray, q: float) -> float:
    """Percentile of a log-binned histogram (geometric bin centre)."""
    total = counts.sum()
    if total == 0:
        return float("nan")
    idx = int(np.searchsorted(np.cumsum(counts), q / 100.0 * total))
    idx = min(idx, len(counts) - 1)
    return float(np.sqrt(edges[idx] * edges[idx + 1]))


SUMMARY_COLUMNS = ("output_tokens", "prompt_tokens", "max_itl_s", "preemptions", "cached_prompt_tokens",
                   *(f"{name}_s" for name in LATENCIES))  # what latency_summary reads


def summary_columns(req: pd.DataFrame) -> dict[str, np.ndarray]:
    """The per-request columns ``latency_summary`` reads, as arrays (read once for a run and all its classes)."""
    return {c: req[c].to_numpy() for c in SUMMARY_COLUMNS if c in req}


def latency_summary(cols: dict[str, np.ndarray], itl_counts: np.ndarray, itl_edges: np.ndarray,
                    wall_s: float) -> dict:
    """Latency and throughput figures of a set of requests (their ``summary_columns``) over a wall time. Means
    skip missing values (NaN: a one-token answer's TPOT) as pandas does."""
    n = len(cols["output_tokens"])
    s: dict = {"num_requests": int(n)}
    out_tok = float(cols["output_tokens"].sum())
    prompt = float(cols["prompt_tokens"].sum())
    all_tok = out_tok + prompt
    s["throughput_output_tok_s"] = out_tok / wall_s if wall_s > 0 else float("nan")
    s["throughput_total_tok_s"] = all_tok / wall_s if wall_s > 0 else float("nan")
    s["throughput_req_s"] = n / wall_s if wall_s > 0 else float("nan")
    for name in LATENCIES:
        v = np.asarray(cols[f"{name}_s"], dtype=float)
        missing = np.isnan(v)
        count = v.size - int(missing.sum())
        # pandas' skip-NaN mean: the sum with NaN as 0 over the count (the same additions, the same last bit)
        s[f"{name}_mean_s"] = float(np.where(missing, 0.0, v).sum() / count) if count else float("nan")
        for q, value in zip(PERCENTILES, percentiles(v, PERCENTILES)):
            s[f"{name}_p{q}_s"] = value
    for q in PERCENTILES:
        s[f"itl_p{q}_s"] = hist_percentile(itl_counts, itl_edges, q)
    s["max_itl_s"] = float(np.nanmax(cols["max_itl_s"])) if n and not np.all(np.isnan(cols["max_itl_s"])) \
        else float("nan")
    s["preemptions"] = int(cols["preemptions"].sum())
    cached = int(cols["cached_prompt_tokens"].sum()) if "cached_prompt_tokens" in cols else 0
    s["cached_prompt_tokens"] = cached
    s["prefix_hit_rate"] = cached / prompt if prompt > 0 else float("nan")
    return s


def replica_summary(req: pd.DataFrame, steps: pd.DataFrame, wall_s: float, replicas: int, per_node: int) -> dict:
    """Per replica of a fleet (keyed by its index as a string): its node, the requests the router sent it, their
    output throughput over the fleet's wall time and latency percentiles, its busy share, and the peak KV blocks
    held and requests waiting after a step."""
    out: dict = {}
    by_req = dict(tuple(req.groupby("replica"))) if len(req) else {}
    by_step = dict(tuple(steps.groupby("replica"))) if len(steps) else {}
    for rep in range(replicas):
        sub = by_req.get(rep, req.iloc[:0])
        st = by_step.get(rep)
        d: dict = {"node": rep // per_node, "num_requests": int(len(sub))}
        d["throughput_output_tok_s"] = float(sub["output_tokens"].sum()) / wall_s if wall_s > 0 else float("nan")
        for name in ("ttft", "tpot"):
            for q in (50, 99):
                d[f"{name}_p{q}_s"] = percentile(sub[f"{name}_s"], q)
        has = st is not None and len(st) > 0
        d["busy"] = min(1.0, float(st["duration_s"].sum()) / wall_s) if has and wall_s > 0 else 0.0
        d["peak_kv_blocks"] = int(st["kv_blocks"].max()) if has else 0
        d["peak_waiting"] = int(st["waiting"].max()) if has else 0
        out[str(rep)] = d
    return out


def wall_time(req: pd.DataFrame) -> float:
    return float(req["release_s"].max() - req["arrival_s"].min()) if len(req) else 0.0


# Steady figures: over the arrival window [first arrival, last arrival], not the run's wall time. The wall time ends
# at the last release, so it holds the drain (the tail of long answers after the last arrival, while the batch
# empties: 14 s after a 22 s window in a 400-request chat run), and figures over it fall below the rate × mean
# output that $ per M tokens uses. Counting the requests started by the last arrival (their whole output) over the
# window gives, while the node keeps up, the offered load (every request starts within a TTFT of arriving); past
# capacity, the requests the node took in (its waiting requests are not counted, its running batch's unfinished
# tokens are), above what it serves by that batch's share, which falls as the run lengthens: 4,902 tok/s at
# 60 req/s where the saturated twin (its own drain included) reads 3,981, Llama-3.1-70B FP8 chat on 8xH200,
# 2,000 requests.
def arrival_window(req: pd.DataFrame) -> float:
    """Last arrival − first arrival (0 for fewer than two requests)."""
    return float(req["arrival_s"].max() - req["arrival_s"].min()) if len(req) else 0.0


def steady_rate(req: pd.DataFrame, values=None, mask=None) -> float:
    """Σ ``values`` (1 per request when None: requests/s) over the requests started (first token) by the last
    arrival, and in ``mask`` when given, / the arrival window (``arrival_window``); NaN when it is 0."""
    window = arrival_window(req)
    if not window > 0:
        return float("nan")
    arrival = req["arrival_s"].to_numpy(dtype=float)
    started = arrival + req["ttft_s"].to_numpy(dtype=float) <= arrival.max()  # first token by the last arrival
    if mask is not None:
        started &= np.asarray(mask, dtype=bool)
    v = np.ones(len(req)) if values is None else np.asarray(values, dtype=float)
    return float(v[started].sum()) / window


def goodput(req: pd.DataFrame, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
            slo_e2e_s: float | None = None) -> tuple[float, float]:
    """(requests/s meeting every SLO given over the arrival window (``steady_rate``), share of requests meeting
    them)."""
    ok = slo_mask(req, slo_ttft_s, slo_tpot_s, slo_e2e_s)
    return steady_rate(req, mask=ok), float(ok.mean()) if len(ok) else float("nan")


def slo_mask(req: pd.DataFrame, slo_ttft_s=None, slo_tpot_s=None, slo_e2e_s=None) -> np.ndarray:
    ok = np.ones(len(req), dtype=bool)
    if slo_ttft_s is not None:
        ok &= req["ttft_s"].to_numpy() <= slo_ttft_s
    if slo_tpot_s is not None:
        tpot = req["tpot_s"].to_numpy()
        ok &= np.isnan(tpot) | (tpot <= slo_tpot_s)
    if slo_e2e_s is not None:
        ok &= req["e2e_s"].to_numpy() <= slo_e2e_s
    return ok


# "Useful" token slots of a step: prompt tokens (recomputation after a preemption included: the
# step table cannot tell them apart) and decode tokens (with speculative decoding, the tokens emitted:
# accepted draft tokens + 1 per speculating sequence; its rejected draft tokens are ``padded_tokens``, computed
# for nothing, so gpu_util falls with the rejection rate). Padded prompt tokens of a static or
# dynamic batch and the slots of finished sequences the batch still carries (``padded_tokens``)
# are computed for nothing. A step's useful share = useful tokens / all token slots it computed;
# a step that computes no token (nothing but a swap-in copy) has share 0.
def useful_share(steps: pd.DataFrame) -> np.ndarray:
    useful = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(dtype=float)
    slots = useful + steps["padded_tokens"].to_numpy(dtype=float)
    return np.divide(useful, slots, out=np.zeros_like(useful), where=slots > 0)


def node_summary(steps: pd.DataFrame, wall_s: float, replicas: int, batch_cap: int, peak_flops: float,
                 peak_bw: float, kv_capacity_blocks: int | None = None) -> dict:
    """Node-level use figures from the per-step table (needs useful_flops, useful_bytes per GPU).

    busy      Σ step durations / (wall × replicas)
    gpu_util  Σ step duration × useful share (``useful_share``) / (wall × replicas): the article's
              "GPU util"; idle waits, padding and finished-but-held slots lower it
    sol_util  Σ roofline time of the useful work (max of FLOPs / peak, bytes / bandwidth) / (wall ×
              replicas): a diagnostic; it can fall as batches grow
    mfu, mbu  useful FLOPs / peak FLOPs, useful bytes / peak bandwidth, over wall × replicas
    kv_util   Σ step duration × KV blocks held at the step's end / (blocks per replica × wall ×
              replicas): time-weighted mean share of the cache in use, idle gaps counted as empty
              (nothing is held while nothing runs)
    """
    denom = wall_s * replicas
    if denom <= 0 or len(steps) == 0:
        return {"busy": float("nan"), "gpu_util": float("nan"), "sol_util": float("nan"), "mfu": float("nan"),
                "mbu": float("nan"), "kv_util": float("nan"), "batch_efficiency": float("nan"),
                "mean_running": float("nan"), "batch_cap": int(batch_cap), "num_steps": int(len(steps))}
    dur = steps["duration_s"].to_numpy(dtype=float)
    # Steps never overlap, so their time is at most the wall time, and useful work at most its
    # step's time; float sums can still land an ulp or so above (busy 1.0000000000000078 in a
    # saturated run), so the shares are clamped: busy <= 1, the others <= busy.
    t_flops = np.minimum(steps["useful_flops"].to_numpy(dtype=float) / peak_flops, dur)
    t_bytes = np.minimum(steps["useful_bytes"].to_numpy(dtype=float) / peak_bw, dur)
    busy = min(1.0, float(dur.sum() / denom))
    kv_util = float("nan")
    if kv_capacity_blocks:
        held = np.minimum(steps["kv_blocks"].to_numpy(dtype=float) / kv_capacity_blocks, 1.0)
        kv_util = min(busy, float((dur * held).sum() / denom))
    return {
        "num_steps": int(len(steps)),
        "busy": busy,
        "gpu_util": min(busy, float((dur * useful_share(steps)).sum() / denom)),
        "sol_util": min(busy, float(np.maximum(t_flops, t_bytes).sum() / denom)),
        "mfu": min(busy, float(t_flops.sum() / denom)),
        "mbu": min(busy, float(t_bytes.sum() / denom)),
        "kv_util": kv_util,
        "batch_efficiency": float(steps["running"].mean() / batch_cap),
        "mean_running": float(steps["running"].mean()),
        "batch_cap": int(batch_cap),
        "max_kv_blocks": int(steps["kv_blocks"].max()),
    }


QUEUE_SAMPLES = 256  # points of the in-system count the growth trend is fitted to


def queue_growth(req: pd.DataFrame) -> tuple[float, float]:
    """(offered request rate, growth of the waiting queue), both req/s.

    Offered rate = (n − 1) / (last arrival − first arrival). Growth = least-squares slope of the
    waiting queue (requests arrived and not yet scheduled for the first time), sampled at
    ``QUEUE_SAMPLES`` even times over the second half of the arrivals (from half-way between the
    first and last arrival to the last, past the warm-up): ≈ 0 when the policy keeps up, ≈ offered
    rate − capacity when it does not. Requests that are running are not counted, so a batch that
    is still filling with long requests is not mistaken for a growing queue. NaN for a single
    request or when all arrive at once.
    """
    if len(req) < 2:
        return float("nan"), float("nan")
    arr = np.sort(req["arrival_s"].to_numpy(dtype=float))
    sched = np.sort(req["first_scheduled_s"].to_numpy(dtype=float))
    span = arr[-1] - arr[0]
    if span <= 0:
        return float("inf"), float("nan")
    t = np.linspace(arr[0] + span / 2, arr[-1], QUEUE_SAMPLES)
    waiting = np.searchsorted(arr, t, "right") - np.searchsorted(sched, t, "right")
    slope = float(np.polyfit(t - t[0], waiting.astype(float), 1)[0])
    return float((len(req) - 1) / span), slope


def spec_summary(steps: pd.DataFrame) -> dict:
    """Speculative decoding figures from the step table (spec_seqs, spec_proposed, spec_accepted, draft_s).

    spec_acceptance_rate  accepted draft tokens / proposed (and verified) ones
    mean_tokens_per_step  tokens a speculating sequence emits per verification: (accepted + seqs) / seqs
    spec_share            decode sequence-steps that speculated / all decode sequence-steps (a decode emitting
                          one token counts one; speculating ones are counted from spec_seqs)
    draft_time_share      drafting seconds / forward-pass seconds
    """
    if len(steps) == 0 or "spec_seqs" not in steps:
        return {"spec_acceptance_rate": float("nan"), "mean_tokens_per_step": float("nan"),
                "spec_share": float("nan"), "draft_time_share": float("nan")}
    seqs = float(steps["spec_seqs"].sum())
    prop = float(steps["spec_proposed"].sum())
    acc = float(steps["spec_accepted"].sum())
    # decode sequence-steps: speculating ones, and plain decodes (decode tokens beyond the speculating ones' emits)
    plain = float(steps["decode_tokens"].sum()) - (acc + seqs)
    dur = float(steps["duration_s"].sum())
    return {
        "spec_acceptance_rate": acc / prop if prop > 0 else float("nan"),
        "mean_tokens_per_step": (acc + seqs) / seqs if seqs > 0 else float("nan"),
        "spec_share": seqs / (seqs + plain) if seqs + plain > 0 else float("nan"),
        "draft_time_share": float(steps["draft_s"].sum()) / dur if dur > 0 else float("nan"),
    }


# ---------------------------------------------------------------- a split's capacity in steady state (issue 39 item 1)

# a decode step runs at the instance's full batch when it holds this share of the largest batch the instance ran
FULL_BATCH = 0.9


def split_steady_capacity(req: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """The requests/s a prefill/decode split carries in steady state, from its saturated run (every request at
    t = 0): the slower of its two tiers, each measured while it has a backlog, so neither the pipeline's fill (the
    decode batch grows while prefill runs ahead) nor the drain (the last long outputs decoding in a small batch)
    counts. N / (first arrival to last release) counts both and grows with N.

    prefill  each prefill instance's requests / its busy span (first step start to last step end: every prompt is
             queued at 0, so it has work until its last prompt), summed over instances.
    decode   each decode instance's tokens emitted (decodes and the first token of each request) per second over
             its steps at full batch (``FULL_BATCH`` of the largest batch it ran: the batch cap or its KV cache when
             it is the bottleneck; the batch its prefill feed keeps when it is not, whose rate is then the feed's),
             summed over instances, / the mean output tokens per request.
    Returns prefill_capacity_req_s, decode_capacity_req_s, steady_capacity_req_s, steady_capacity_output_tok_s."""
    nan = float("nan")
    out = dict.fromkeys(("prefill_capacity_req_s", "decode_capacity_req_s", "steady_capacity_req_s",
                         "steady_capacity_output_tok_s"), nan)
    mean_out = float(req["output_tokens"].mean()) if len(req) else nan
    pre, dec = steps[steps["role"] == "prefill"], steps[steps["role"] == "decode"]
    if pre.empty or dec.empty or not mean_out > 0:
        return out
    prefill = 0.0  # each instance's prompts over its own busy span, summed: one that ends later is not a pause
    for inst, st in pre.groupby("replica"):
        span = float((st["start_s"] + st["duration_s"]).max() - st["start_s"].min())
        prefill += int((req["replica"] == inst).sum()) / span if span > 0 else 0.0
    prefill = prefill if prefill > 0 else nan
    rates = []
    for _, inst in dec.groupby("replica"):
        full = inst[inst["running"] >= FULL_BATCH * float(inst["running"].max())]
        t = float(full["duration_s"].sum())
        if t > 0:
            rates.append(float(full["decode_tokens"].sum() + full["prefill_tokens"].sum()) / t)
    decode = sum(rates) / mean_out if rates else nan
    tiers = [r for r in (prefill, decode) if math.isfinite(r)]
    cap = min(tiers) if tiers else nan
    out.update(prefill_capacity_req_s=prefill, decode_capacity_req_s=decode, steady_capacity_req_s=cap,
               steady_capacity_output_tok_s=cap * mean_out)
    return out


def saturated_capacity(saturated_summary: Mapping) -> tuple[float, float]:
    """(requests/s, output tokens/s) a saturated run serves flat out: a split's steady state
    (``split_steady_capacity``), otherwise its throughput over the whole run."""
    s = saturated_summary
    req_s = s.get("steady_capacity_req_s")
    if isinstance(req_s, (int, float)) and math.isfinite(req_s) and req_s > 0:
        return float(req_s), float(s["steady_capacity_output_tok_s"])
    return float(s.get("throughput_req_s", float("nan"))), float(s.get("throughput_output_tok_s", float("nan")))
