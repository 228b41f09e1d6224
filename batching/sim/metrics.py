"""Every metric, defined once (docs/ARCHITECTURE.md "Metrics"). Times in seconds, rates per second."""
from __future__ import annotations

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
    "throughput_output_tok_s": ("Throughput (output tok/s)",
                                "Output tokens / time from the first arrival to the last release, at the offered load."),
    "capacity_output_tok_s": ("Capacity (output tok/s)",
                              "Output tokens / s when the queue never empties: every request arrives at t = 0."),
    "goodput_req_s": ("Goodput (req/s)", "Requests per second that meet every SLO given (TTFT, TPOT, E2E)."),
    "busy": ("Busy (%)", "Share of wall time with a forward pass running (what nvidia-smi shows)."),
    "gpu_util": ("GPU util (%)", "Roofline time of the useful work (ideal FLOPs or bytes, whichever bounds) / wall "
                 "time: idle gaps, padding, stalls and overheads lower it."),
    "mfu": ("MFU (%)", "Useful FLOPs / (peak FLOP/s × wall time)."),
    "mbu": ("MBU (%)", "Useful bytes moved (weights, KV reads) / (peak HBM bandwidth × wall time)."),
    "batch_efficiency": ("Batch efficiency (%)",
                         "Mean sequences doing useful work per step / the batch cap (max_batch_size or max_num_seqs)."),
    "preemptions": ("Preemptions", "Times a running request was evicted (recompute or swap)."),
}


def request_latencies(df: pd.DataFrame) -> pd.DataFrame:
    """Add ttft_s, tpot_s, e2e_s, queue_delay_s columns to a per-request table."""
    out = df.copy()
    out["ttft_s"] = out["first_token_s"] - out["arrival_s"]
    out["e2e_s"] = out["release_s"] - out["arrival_s"]
    out["queue_delay_s"] = out["first_scheduled_s"] - out["arrival_s"]
    multi = out["output_tokens"] >= 2
    out["tpot_s"] = np.where(multi, (out["e2e_s"] - out["ttft_s"]) / (out["output_tokens"] - 1).clip(lower=1), np.nan)
    return out


def percentile(values, q: float) -> float:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if v.size else float("nan")


def hist_percentile(counts: np.ndarray, edges: np.ndarray, q: float) -> float:
    """Percentile of a log-binned histogram (geometric bin centre)."""
    total = counts.sum()
    if total == 0:
        return float("nan")
    idx = int(np.searchsorted(np.cumsum(counts), q / 100.0 * total))
    idx = min(idx, len(counts) - 1)
    return float(np.sqrt(edges[idx] * edges[idx + 1]))


def latency_summary(req: pd.DataFrame, itl_counts: np.ndarray, itl_edges: np.ndarray, wall_s: float) -> dict:
    """Latency and throughput figures of a set of requests over a wall time."""
    s: dict = {"num_requests": int(len(req))}
    out_tok = float(req["output_tokens"].sum())
    all_tok = out_tok + float(req["prompt_tokens"].sum())
    s["throughput_output_tok_s"] = out_tok / wall_s if wall_s > 0 else float("nan")
    s["throughput_total_tok_s"] = all_tok / wall_s if wall_s > 0 else float("nan")
    s["throughput_req_s"] = len(req) / wall_s if wall_s > 0 else float("nan")
    for name in LATENCIES:
        col = req[f"{name}_s"]
        s[f"{name}_mean_s"] = float(col.mean()) if col.notna().any() else float("nan")
        for q in PERCENTILES:
            s[f"{name}_p{q}_s"] = percentile(col, q)
    for q in PERCENTILES:
        s[f"itl_p{q}_s"] = hist_percentile(itl_counts, itl_edges, q)
    s["max_itl_s"] = float(req["max_itl_s"].max()) if len(req) else float("nan")
    s["preemptions"] = int(req["preemptions"].sum())
    return s


def wall_time(req: pd.DataFrame) -> float:
    return float(req["release_s"].max() - req["arrival_s"].min()) if len(req) else 0.0


def goodput(req: pd.DataFrame, wall_s: float, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
            slo_e2e_s: float | None = None) -> tuple[float, float]:
    """(requests/s meeting every SLO given, share of requests meeting them)."""
    ok = slo_mask(req, slo_ttft_s, slo_tpot_s, slo_e2e_s)
    return (float(ok.sum()) / wall_s if wall_s > 0 else float("nan"), float(ok.mean()) if len(ok) else float("nan"))


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


def node_summary(steps: pd.DataFrame, wall_s: float, replicas: int, batch_cap: int, peak_flops: float,
                 peak_bw: float) -> dict:
    """Node-level use figures from the per-step table (needs useful_flops, useful_bytes per GPU)."""
    denom = wall_s * replicas
    if denom <= 0 or len(steps) == 0:
        return {"busy": float("nan"), "gpu_util": float("nan"), "mfu": float("nan"), "mbu": float("nan"),
                "batch_efficiency": float("nan"), "num_steps": int(len(steps))}
    dur = steps["duration_s"].to_numpy(dtype=float)
    # Steps never overlap, so their time is at most the wall time, and useful work at most its
    # step's time; float sums can still land an ulp or so above (busy 1.0000000000000078 in a
    # saturated run), so the shares are clamped: busy <= 1, the others <= busy.
    t_flops = np.minimum(steps["useful_flops"].to_numpy(dtype=float) / peak_flops, dur)
    t_bytes = np.minimum(steps["useful_bytes"].to_numpy(dtype=float) / peak_bw, dur)
    busy = min(1.0, float(dur.sum() / denom))
    return {
        "num_steps": int(len(steps)),
        "busy": busy,
        "gpu_util": min(busy, float(np.maximum(t_flops, t_bytes).sum() / denom)),
        "mfu": min(busy, float(t_flops.sum() / denom)),
        "mbu": min(busy, float(t_bytes.sum() / denom)),
        "batch_efficiency": float(steps["running"].mean() / batch_cap),
        "mean_running": float(steps["running"].mean()),
        "max_kv_blocks": int(steps["kv_blocks"].max()),
    }
