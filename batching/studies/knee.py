"""Where a knob stops paying: the knee of a sweep."""
from __future__ import annotations

import pandas as pd

def find_knee(x, throughput, latencies, share: float = 0.05):
    """The smallest x past which throughput grows by less than ``share`` (relative) while some
    latency series still rises; None when throughput keeps growing or latency stays flat."""
    import numpy as np

    x = np.asarray(x, float)
    y = np.asarray(throughput, float)
    lats = [np.asarray(lat, float) for lat in latencies]
    order = np.argsort(x, kind="stable")
    x, y, lats = x[order], y[order], [lat[order] for lat in lats]
    for i in range(len(x) - 1):
        if not np.isfinite(y[i]) or y[i] <= 0:
            continue
        gain = np.nanmax(y[i:]) / y[i] - 1.0
        rising = any(np.nanmax(lat[i + 1:]) > lat[i] * (1 + 1e-9) for lat in lats)
        if gain < share and rising:
            return float(x[i])
    return None


def sweep_knee(df: pd.DataFrame, knob: str, share: float = 0.05):
    """Knee of a sweep. For the request rate: throughput at the offered load against P99 TTFT
    and TPOT. For the other knobs: capacity against P99 TTFT and TPOT at the offered load and
    P99 TPOT at capacity (what a fuller batch costs each token)."""
    if knob == "rate_req_s":
        return find_knee(df[knob], df["throughput_output_tok_s"], [df["ttft_p99_s"], df["tpot_p99_s"]], share)
    lats = [df["ttft_p99_s"], df["tpot_p99_s"], df["capacity_tpot_p99_s"]]
    return find_knee(df[knob], df["capacity_output_tok_s"], lats, share)
