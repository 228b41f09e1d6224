"""Metric tables: headers with units, number formats and tooltips from ``metrics.DEFINITIONS``."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import streamlit as st

from batching.studies.compare import COMPARE_COLUMNS
from batching.charts.formatting import (  # noqa: F401  (re-exported: pages use tables.report_frame etc.)
    MS_METRICS,
    SHARES,
    SHORT_HEADERS,
    MetricSpec,
    _scaled,
    metric_spec,
    report_frame,
    shown,
)


def _column(spec: MetricSpec):
    return st.column_config.NumberColumn(spec.header, help=spec.help, format=spec.fmt)


def summary_frame(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """One row per policy, one column per metric (raw keys), values in display units."""
    rows = {}
    for name, s in summaries.items():
        rows[name] = {k: _scaled(k, s.get(k)) for k in keys}
    return pd.DataFrame.from_dict(rows, orient="index")


def summary_table(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> None:
    """The classic table, with units in the headers and a tooltip per column."""
    df = summary_frame(summaries, keys)
    config = {"_index": st.column_config.TextColumn("Policy", help="Batching policy preset")}
    config.update({k: _column(metric_spec(k)) for k in keys})
    st.dataframe(df, column_config=config, width="stretch")


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
