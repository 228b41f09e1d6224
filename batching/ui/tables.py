"""Metric tables: headers with units, number formats and tooltips from ``metrics.DEFINITIONS``."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from ..experiments import COMPARE_COLUMNS
from ..metrics import DEFINITIONS

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


def _column(spec: MetricSpec):
    return st.column_config.NumberColumn(spec.header, help=spec.help, format=spec.fmt)


def summary_frame(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """One row per policy, one column per metric (raw keys), values in display units."""
    rows = {}
    for name, s in summaries.items():
        rows[name] = {k: _scaled(k, s.get(k)) for k in keys}
    return pd.DataFrame.from_dict(rows, orient="index")


def _scaled(key: str, value):
    if value is None:
        return float("nan")
    return value * metric_spec(key).factor


def summary_table(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> None:
    """The classic table, with units in the headers and a tooltip per column."""
    df = summary_frame(summaries, keys)
    config = {"_index": st.column_config.TextColumn("Policy", help="Batching policy preset")}
    config.update({k: _column(metric_spec(k)) for k in keys})
    st.dataframe(df, column_config=config, width="stretch")


def report_frame(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """The same table as text with units, for the HTML report."""
    rows = {name: {metric_spec(k).header: shown(k, s.get(k), small_s_as_ms=False) for k in keys}
            for name, s in summaries.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def class_frame(summaries: Mapping[str, dict], stat: str = "ttft_p99_s") -> pd.DataFrame:
    """One row per policy, one column per priority class: that class's statistic in display units."""
    spec = metric_spec(stat)
    rows: dict[str, dict] = {}
    for name, s in summaries.items():
        row = {}
        for level, cls in sorted(s.get("by_priority", {}).items(), key=lambda kv: int(kv[0])):
            row[f"{cls.get('class_name', level)} (P{level})"] = _scaled(stat, cls.get(stat))
        rows[name] = row
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.attrs["header"] = spec.header
    return df


def definitions(keys: Sequence[str]) -> None:
    """The definition of each metric in these columns, as a compact list."""
    lines = [f"- **{metric_spec(k).header}**: {metric_spec(k).help}" for k in keys]
    st.markdown("\n".join(lines))


def class_table(summaries: Mapping[str, dict], stat: str = "ttft_p99_s") -> None:
    df = class_frame(summaries, stat)
    spec = metric_spec(stat)
    config = {c: st.column_config.NumberColumn(c, help=f"{spec.header} of the class {c} (P0 = highest priority). "
                                                f"{spec.help}", format=spec.fmt) for c in df.columns}
    st.dataframe(df, column_config=config, width="stretch")


def change_frame(summaries: Mapping[str, dict], keys: Sequence[str]) -> pd.DataFrame:
    """Rows = metrics; per policy its value (text) and, after the first, its change against the first (%)."""
    names = list(summaries)
    base = summaries[names[0]] if names else {}
    rows = []
    for k in keys:
        spec = metric_spec(k)
        row = {"Metric": spec.header}
        for i, name in enumerate(names):
            v = summaries[name].get(k)
            row[name] = shown(k, v, small_s_as_ms=False)
            if i:
                b = base.get(k)
                ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (v, b)) and b != 0
                row[f"{name} vs {names[0]}"] = (v - b) / abs(b) * 100 if ok else float("nan")
        row["_lower_is_better"] = spec.lower_is_better
        rows.append(row)
    return pd.DataFrame(rows)


def change_table(summaries: Mapping[str, dict], keys: Sequence[str]) -> pd.DataFrame:
    """Draw the metric-by-metric comparison; green is better than the first policy, red worse."""
    df = change_frame(summaries, keys)
    lower = df.pop("_lower_is_better")
    change_cols = [c for c in df.columns if c.endswith(f" vs {list(summaries)[0]}")]

    def colour(col: pd.Series) -> list[str]:
        out = []
        for v, lo in zip(col, lower):
            if not isinstance(v, float) or not math.isfinite(v) or abs(v) < 0.5:
                out.append("")
            else:
                better = (v < 0) == bool(lo)
                out.append("color: #1E8449; font-weight: 600" if better else "color: #C0392B; font-weight: 600")
        return out

    styler = (df.style.format("{:+.1f} %", subset=change_cols, na_rep="n/a")
              .apply(colour, subset=change_cols).hide(axis="index"))
    config = {c: st.column_config.Column(c, help=f"Change against {list(summaries)[0]}, in % of its value; "
                                              "green is better, red worse") for c in change_cols}
    config["Metric"] = st.column_config.Column("Metric", help="Units in brackets; definitions below the table",
                                               width="medium", pinned=True)
    st.dataframe(styler, column_config=config, width="stretch", hide_index=True, height=36 * (len(df) + 1) + 3)
    return df


def definitions(keys: Sequence[str]) -> None:
    """The definition of each metric in these columns, as a compact list."""
    lines = [f"- **{metric_spec(k).header}**: {metric_spec(k).help}" for k in keys]
    st.markdown("\n".join(lines))
