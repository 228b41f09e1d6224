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
    cell_text,
    change_frame,
    change_text,
    class_frame,
    class_stats_frame,
    metric_spec,
    missing_notes,
    report_frame,
    shown,
)
from batching.ui.safe import plain

# figures beside the classic table, in its "diagnostics" expander
DIAGNOSTICS = ("sol_util", "offered_req_s", "capacity_req_s", "queue_growth_req_s", "mean_running")
GREY = "color: #8A8F98; background-color: #F2F3F5"  # an overloaded run's row


def summary_table(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """The classic table as text with units in the cells and a tooltip per column (the metric's definition).

    An overloaded run's row is greyed and its latencies read "unbounded: queue grows (+x.x req/s)"; a figure a
    run does not have reads "–", with the reason in a footnote. Returns the text frame drawn."""
    df = report_frame(summaries, keys)
    over = set(df.attrs.get("overloaded", []))
    config = {"_index": st.column_config.TextColumn("Policy", help="Batching policy preset; a greyed row is "
                                                    "overloaded: the offered load is at or above its capacity")}
    for k in keys:
        spec = metric_spec(k)
        config[spec.label] = st.column_config.TextColumn(spec.label, help=spec.help)
    styler = df.style.apply(lambda row: [GREY if row.name in over else ""] * len(row), axis=1)
    st.dataframe(styler, column_config=config, width="stretch")
    notes = missing_notes(summaries, keys)
    if notes:
        st.caption(plain(" ".join(notes)))
    return df


def definitions(keys: Sequence[str]) -> None:
    """The definition of each metric in these columns, as a compact list."""
    lines = [f"- **{metric_spec(k).label}**: {metric_spec(k).help}" for k in keys]
    st.markdown("\n".join(lines))


def class_stats_table(summaries: Mapping[str, dict]) -> pd.DataFrame:
    """P50 and P99 TTFT and TPOT of each priority class per policy, with units; greyed rows for overloaded runs."""
    df = class_stats_frame(summaries)
    config = {c: st.column_config.TextColumn(c, help=f"{plain(c)}: the class's percentile (P0 = highest "
                                             "priority); 'unbounded' where the policy is overloaded") for c in df.columns}
    over = [name for name, s in summaries.items() if s.get("overloaded")]
    styler = df.style.apply(lambda row: [GREY if row.name in over else ""] * len(row), axis=1)
    st.dataframe(styler, column_config=config, width="stretch")
    return df


def change_table(summaries: Mapping[str, dict], keys: Sequence[str]) -> pd.DataFrame:
    """Draw the metric-by-metric comparison; green is better than the first policy, red worse."""
    df = change_frame(summaries, keys)
    lower = df.pop("_lower_is_better")
    change_cols = [c for c in df.columns if c.endswith(f" vs {list(summaries)[0]}")]

    def colour(col: pd.Series) -> list[str]:
        out = []
        for v, lo in zip(df[col.name], lower):  # the numbers behind the text cells
            # lo None: neither better nor worse (batch efficiency, busy, load, KV in use)
            if lo is None or not isinstance(v, float) or not math.isfinite(v) or abs(v) < 0.5:
                out.append("")
            else:
                better = (v < 0) == bool(lo)
                out.append("color: #1E8449; font-weight: 600" if better else "color: #C0392B; font-weight: 600")
        return out

    first = list(summaries)[0]
    # an overloaded policy's columns (its values and its change) are greyed, as its row is in the classic table
    grey = [c for c in df.columns for k, v in summaries.items()
            if v.get("overloaded") and c in (k, f"{k} vs {first}")]
    # the changes as text ("+12.3 %", "–"): a missing number would be drawn as "None" by the dataframe, whatever
    # the styler's na_rep says (issue 24 item 12)
    cells = df.assign(**{c: df[c].map(change_text) for c in change_cols})
    styler = cells.style.apply(colour, subset=change_cols).hide(axis="index")
    if grey:
        styler = styler.apply(lambda col: [GREY] * len(col), subset=grey)
    config = {c: st.column_config.Column(c, help=f"Change against {plain(list(summaries)[0])}, in % of its value; "
                                              "green is better, red worse, uncoloured when neither; – where a "
                                              "latency is unbounded (an overloaded policy) or a figure is missing")
              for c in change_cols}
    config["Metric"] = st.column_config.Column("Metric", help="Units in the cells; definitions below the table",
                                               width="medium", pinned=True)
    st.dataframe(styler, column_config=config, width="stretch", hide_index=True, height=36 * (len(df) + 1) + 3)
    notes = missing_notes(summaries, keys)
    if notes:
        st.caption(plain(" ".join(notes)))
    return cells
