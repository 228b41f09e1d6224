"""Metric names, units and number formats for tables and reports, from ``metrics.DEFINITIONS``
(no Streamlit here: the dashboard's tables and the command line's reports share them)."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from batching.studies.compare import COMPARE_COLUMNS
from batching.sim.metrics import DEFINITIONS

SHARES = {"gpu_util", "busy", "mfu", "mbu", "batch_efficiency"}
MS_METRICS = {"tpot", "itl"}
_LATENCY = re.compile(r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>p\d+|mean)_s$")
SHORT_HEADERS = {  # narrow enough for the showdown table to fit; the tooltips say "output tokens"
    "throughput_output_tok_s": "Throughput (tok/s)",
    "capacity_output_tok_s": "Capacity (tok/s)",
    "batch_efficiency": "Batch eff. (%)",
}
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "itl": "ITL", "queue_delay": "Queue delay"}


@dataclass(frozen=True)
class MetricSpec:
    key: str  # summary key
    header: str  # column header with unit
    factor: float  # summary value -> shown value
    fmt: str  # st.column_config.NumberColumn format
    unit: str  # unit text after a shown value
    lower_is_better: bool
    help: str


def metric_spec(key: str) -> MetricSpec:
    m = _LATENCY.match(key)
    if m:
        metric, stat = m["metric"], m["stat"]
        label, definition = DEFINITIONS.get(metric, (metric, ""))
        ms = metric in MS_METRICS
        unit = "ms" if ms else "s"
        name = _NAMES.get(metric, label.split(" (")[0])
        stat_text = stat.upper() if stat != "mean" else "mean"
        return MetricSpec(key, f"{name} {stat_text} ({unit})", 1e3 if ms else 1.0, "%.1f" if ms else "%.2f", unit,
                          True, f"{stat_text} of {label.split(' (')[0]}. {definition}".strip())
    if key in SHARES:
        label, definition = DEFINITIONS.get(key, (key, ""))
        return MetricSpec(key, SHORT_HEADERS.get(key, label), 100.0, "%.1f%%", "%", False, definition)
    if key == "preemptions":
        label, definition = DEFINITIONS.get(key, (key, ""))
        return MetricSpec(key, label, 1.0, "%d", "", True, definition)
    if key.startswith(("throughput", "capacity", "goodput")):
        label, definition = DEFINITIONS.get(key, (COMPARE_COLUMNS.get(key, key), ""))
        header = SHORT_HEADERS.get(key, COMPARE_COLUMNS.get(key, label))
        unit = "req/s" if key.endswith("req_s") else "tok/s"
        return MetricSpec(key, header, 1.0, "%.0f", unit, False, definition)
    label, definition = DEFINITIONS.get(key, (COMPARE_COLUMNS.get(key, key), ""))
    return MetricSpec(key, COMPARE_COLUMNS.get(key, label), 1.0, "%.3g", "", True, definition)


def shown(key: str, value: float | None, small_s_as_ms: bool = True) -> str:
    """A summary value as text with its unit ("0.57 s", "26.2 ms", "41.7 %", "2,454 tok/s").

    Seconds under 0.1 read as ms unless ``small_s_as_ms`` is off (rows whose header says "(s)").
    """
    spec = metric_spec(key)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    v = value * spec.factor
    if spec.unit == "%":
        return f"{v:.1f} %"
    if spec.fmt == "%d":
        return f"{int(v):,}"
    if spec.unit in ("tok/s", "req/s"):
        return f"{v:,.0f} {spec.unit}" if v >= 10 else f"{v:.2f} {spec.unit}"
    if spec.unit == "ms":
        return f"{v:,.1f} ms"
    if spec.unit == "s":
        if v >= 0.1:
            return f"{v:,.2f} s"
        return f"{v * 1e3:,.1f} ms" if small_s_as_ms else f"{v:.3g} s"
    return f"{v:.3g}"


def _scaled(key: str, value):
    if value is None:
        return float("nan")
    return value * metric_spec(key).factor


def report_frame(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """The same table as text with units, for the HTML report."""
    rows = {name: {metric_spec(k).header: shown(k, s.get(k), small_s_as_ms=False) for k in keys}
            for name, s in summaries.items()}
    return pd.DataFrame.from_dict(rows, orient="index")
