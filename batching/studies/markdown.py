"""A DataFrame as a Markdown table, for the documents the studies and ``calibrate --report`` write."""
from __future__ import annotations

import pandas as pd


def table(df: pd.DataFrame, formats: dict | None = None) -> str:
    """One row per row of ``df``; ``formats`` maps a column to a format spec (``",.1f"``) or a callable. Missing
    values are empty cells."""
    formats = formats or {}
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, row):
            fmt = formats.get(c)
            if fmt is not None and v is not None and not (isinstance(v, float) and pd.isna(v)):
                cells.append(fmt(v) if callable(fmt) else format(v, fmt))
            else:
                cells.append("" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v))
        lines.append("| " + " | ".join(cells).replace("\n", " ") + " |")
    return "\n".join(lines)
