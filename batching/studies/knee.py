"""Where a knob stops paying: the knee of a sweep."""
from __future__ import annotations

import pandas as pd

DEFAULT_SHARE = 0.05  # the knee: throughput grows by less than 5 % past it
SHARE_LIMITS = (0.005, 0.5)  # the knee shares a user may ask for (the CLI's --knee-share, the Tune page)


def check_share(share: float) -> float:
    """The knee share as a float, or ValueError naming the allowed range."""
    low, high = SHARE_LIMITS
    if not (isinstance(share, (int, float)) and low <= share <= high):
        raise ValueError(f"knee share={share!r} is out of range; allowed {low:g} to {high:g}")
    return float(share)


def find_knee(x, throughput, latencies, share: float = DEFAULT_SHARE):
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


def capacity_knee(x, capacity, share: float = DEFAULT_SHARE):
    """The smallest x past which capacity (within the SLOs) grows by less than ``share`` (relative): every
    larger x serves less than (1 + share) times as much. None when it still grows by ``share`` or more at the
    end of the range, or no x serves anything. Points added beyond the knee that stay under that bound leave
    it where it is."""
    import numpy as np

    x = np.asarray(x, float)
    y = np.asarray(capacity, float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    for i in range(len(x) - 1):
        if not np.isfinite(y[i]) or y[i] <= 0:
            continue
        if np.nanmax(y[i + 1:]) < y[i] * (1 + share):
            return float(x[i])
    return None


def falls_past(at: float, past_max: float) -> bool:
    """Whether the measure falls past a knee: every larger value serves less than the knee itself. Such a
    knee is the peak of the range, and a sentence must say so rather than that it "grows by less than 5 %"
    (issue 24 item 12: "15.8 → at most 15.1")."""
    import numpy as np

    return bool(np.isfinite(at) and np.isfinite(past_max) and past_max < at)


def knee_words(at: float, past_max: float, share: float) -> tuple[str, str]:
    """(name, what the measure does past it) for a knee's sentence: ("Peak", "falls") where it falls past it,
    else ("Knee", "grows by less than 5 %")."""
    if falls_past(at, past_max):
        return "Peak", "falls"
    return "Knee", f"grows by less than {share * 100:.0f} %"


def knee_basis(df: pd.DataFrame, knob: str) -> str | None:
    """The column a sweep's knee is read on when the sweep carries SLOs: the capacity within them
    (``max_rate_req_s``), or for the request rate (which that capacity does not depend on) the goodput at the
    offered load; None for a sweep without SLOs."""
    col = "goodput_req_s" if knob == "rate_req_s" else "max_rate_req_s"
    return col if col in df.columns else None


def knee_series(df: pd.DataFrame, knob: str):
    """The values ``capacity_knee`` reads (``knee_basis``): for the request rate, the goodput where the SLOs
    hold for the attainment target (``slo_met``) and 0 where they do not."""
    import numpy as np

    basis = knee_basis(df, knob)
    if basis is None:
        raise ValueError("the sweep carries no SLO columns; run sweeps.sweep(..., slo=...)")
    y = df[basis].to_numpy(float)
    if knob == "rate_req_s" and "slo_met" in df.columns:
        y = np.where(df["slo_met"].to_numpy(bool), y, 0.0)
    return y


def sweep_knee(df: pd.DataFrame, knob: str, share: float = DEFAULT_SHARE):
    """Knee of a sweep. With SLOs (``sweeps.sweep(..., slo=...)``): where the capacity within the SLOs stops
    growing by ``share`` (``capacity_knee`` on ``knee_basis``). Without: for the request rate, the steady
    throughput at the offered load (``steady_output_tok_s``) against P99 TTFT and TPOT; for the other knobs,
    capacity against P99 TTFT and TPOT at the offered load and P99 TPOT at capacity (what a fuller batch costs
    each token)."""
    if knee_basis(df, knob) is not None:
        return capacity_knee(df[knob], knee_series(df, knob), share)
    if knob == "rate_req_s":
        return find_knee(df[knob], df["steady_output_tok_s"], [df["ttft_p99_s"], df["tpot_p99_s"]], share)
    lats = [df["ttft_p99_s"], df["tpot_p99_s"], df["capacity_tpot_p99_s"]]
    return find_knee(df[knob], df["capacity_output_tok_s"], lats, share)
