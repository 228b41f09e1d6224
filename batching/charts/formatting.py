"""Metric names, units and number formats for tables and reports, from ``metrics.DEFINITIONS``
(no Streamlit here: the dashboard's tables and the command line's reports share them)."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batching.studies.compare import COMPARE_COLUMNS, is_unbounded, unbounded_text
from batching.sim.metrics import DEFINITIONS

SHARES = {"gpu_util", "sol_util", "busy", "mfu", "mbu", "kv_util", "load", "batch_efficiency", "prefix_hit_rate"}
# counts shown as whole numbers: key -> lower is better (None: neither)
COUNTS = {"preemptions": True, "cached_prompt_tokens": False}
# the prefix cache's figures (issue 12), defined in metrics.DEFINITIONS once the engine reports them; these
# stand in until then, so a table never shows a raw key
_PREFIX_DEFINITIONS = {
    "prefix_hit_rate": ("Prefix cache hit rate",
                        "Prompt tokens served from the prefix cache / prompt tokens: their KV blocks were already "
                        "cached (a shared system prompt, a conversation's history), so no step computed them."),
    "cached_prompt_tokens": ("Cached prompt tokens",
                             "Prompt tokens served from the prefix cache instead of computed."),
}
PREFIX_KEYS = tuple(_PREFIX_DEFINITIONS)
# shares that are neither better nor worse when higher (never coloured in Compare's deltas)
NEUTRAL = {"busy", "kv_util", "load", "batch_efficiency", "mean_running", "offered_req_s", "queue_growth_req_s"}
MS_METRICS = {"tpot", "itl"}
MS_BELOW_S = 10.0  # latencies in seconds below this read in ms (E2E, whole answers: below 1 s)
MISSING = "–"  # a figure the run does not have; the table's footnote says why
_LATENCY = re.compile(r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>p\d+|mean)_s$")
SHORT_HEADERS = {  # narrow enough for the showdown table to fit; the tooltips say "output tokens"
    "throughput_output_tok_s": "Throughput (tok/s)",
    "capacity_output_tok_s": "Capacity (tok/s)",
}
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "itl": "ITL", "queue_delay": "Queue delay"}


@dataclass(frozen=True)
class MetricSpec:
    key: str  # summary key
    header: str  # column header with unit
    factor: float  # summary value -> shown value
    fmt: str  # st.column_config.NumberColumn format
    unit: str  # unit text after a shown value
    lower_is_better: bool | None  # None: neither (never coloured as better or worse)
    help: str

    @property
    def label(self) -> str:
        """The header without its unit, for text tables whose cells carry their units."""
        return self.header.split(" (")[0]


def _definition(key: str, fallback: str | None = None) -> tuple[str, str]:
    if key in DEFINITIONS:
        return DEFINITIONS[key]
    return _PREFIX_DEFINITIONS.get(key, (fallback or key, ""))


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
        label, definition = _definition(key)
        return MetricSpec(key, SHORT_HEADERS.get(key, label), 100.0, "%.1f%%", "%",
                          None if key in NEUTRAL else False, definition)
    if key in COUNTS:
        label, definition = _definition(key)
        return MetricSpec(key, label, 1.0, "%d", "", COUNTS[key], definition)
    if key == "mean_running":
        label, definition = DEFINITIONS.get(key, (key, ""))
        return MetricSpec(key, label, 1.0, "%.1f", "", None, definition)
    if key == "overloaded":
        label, definition = DEFINITIONS.get(key, (key, ""))
        return MetricSpec(key, label, 1.0, "%s", "", None, definition)
    if key.startswith(("throughput", "steady", "capacity", "goodput", "offered", "queue_growth")):
        label, definition = DEFINITIONS.get(key, (COMPARE_COLUMNS.get(key, key), ""))
        header = SHORT_HEADERS.get(key, COMPARE_COLUMNS.get(key, label))
        unit = "req/s" if key.endswith("req_s") else "tok/s"
        return MetricSpec(key, header, 1.0, "%.0f", unit, None if key in NEUTRAL else False, definition)
    label, definition = DEFINITIONS.get(key, (COMPARE_COLUMNS.get(key, key), ""))
    return MetricSpec(key, COMPARE_COLUMNS.get(key, label), 1.0, "%.3g", "", True, definition)


def shown(key: str, value: float | None, small_s_as_ms: bool = True) -> str:
    """A summary value as text with its unit ("570 ms", "12.40 s", "26.2 ms", "41.7 %", "2,454 tok/s"; "–" if none).

    Seconds under ``MS_BELOW_S`` (10 s) read as ms unless ``small_s_as_ms`` is off.
    """
    spec = metric_spec(key)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    v = value * spec.factor
    if spec.unit == "%":
        return f"{v:.1f} %"
    if spec.fmt == "%d":
        return f"{int(v):,}"
    if key == "mean_running":
        return f"{v:,.1f}"
    if key == "queue_growth_req_s":
        return f"{v:+.2f} req/s"
    if spec.unit in ("tok/s", "req/s"):
        return f"{v:,.0f} {spec.unit}" if abs(v) >= 10 else f"{v:.2f} {spec.unit}"
    if spec.unit == "ms":
        return f"{v:,.1f} ms"
    if spec.unit == "s":
        if small_s_as_ms and v < (1.0 if key.startswith("e2e") else MS_BELOW_S):
            return f"{v * 1e3:,.0f} ms" if v >= 0.1 else f"{v * 1e3:,.1f} ms"
        return f"{v:,.2f} s"
    return f"{v:.3g}"


def sig_text(value: float, digits: int = 3) -> str:
    """A number to ``digits`` significant digits, never in exponent notation and with thousands separators:
    4.71174 -> "4.71", 0.0277 -> "0.0277" (3) or "0.028" (2), 15.83 -> "15.8", 1234.5 -> "1,234", 0.5 -> "0.5"
    (no trailing zeros); "–" if none."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return MISSING
    v = float(value)
    if v == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{round(v, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def rate_text(rate_req_s: float, digits: int = 3) -> str:
    """A request rate with its unit at ``digits`` significant digits: "4.71 req/s", "0.0277 req/s"."""
    return f"{sig_text(rate_req_s, digits)} req/s"


def change_text(value: float | None) -> str:
    """A change against the first policy as a table cell: "+12.3 %", "−4.0 %"; "–" where there is none (never
    "None" or "nan": a dataframe draws a missing number as "None")."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return MISSING
    return f"{value:+.1f} %"


def cell_text(key: str, summary: Mapping) -> str:
    """A summary's figure as a table cell: its value with unit; "unbounded: queue grows (+x.x req/s)" for a
    latency of an overloaded run; batch efficiency with the mean running batch ("5.5 % (14 of 256)")."""
    if is_unbounded(key, summary):
        return unbounded_text(summary)
    text = shown(key, summary.get(key))
    if key == "batch_efficiency" and text != MISSING:
        running, cap = summary.get("mean_running"), summary.get("batch_cap")
        if isinstance(running, (int, float)) and math.isfinite(running) and cap:
            text += f" ({running:,.0f} of {int(cap):,})"
    return text


MISSING_REASONS = {
    "prefix_hit_rate": "no prefix cache in this run (static and dynamic batching, or prefix caching off)",
    "cached_prompt_tokens": "no prefix cache in this run (static and dynamic batching, or prefix caching off)",
    "tpot": "no request has 2 or more output tokens",
    "capacity": "no capacity run (every request at t = 0) for this row",
    "load": "no capacity run (every request at t = 0) for this row",
    "kv_util": "the KV cache size is unknown",
}


def missing_notes(summaries: Mapping[str, Mapping], keys: Sequence[str]) -> list[str]:
    """One line per figure shown as "–", saying why."""
    notes = []
    uncached = []  # runs without a prefix cache: one note for all of them
    for name, s in summaries.items():
        for k in keys:
            if not is_unbounded(k, s) and shown(k, s.get(k)) == MISSING:
                if k in PREFIX_KEYS:
                    if name not in uncached:
                        uncached.append(name)
                    continue
                reason = next((r for p, r in MISSING_REASONS.items() if k.startswith(p)), "not measured in this run")
                notes.append(f"{MISSING} {metric_spec(k).label} of {name}: {reason}.")
    if uncached:
        what = " and ".join(metric_spec(k).label.lower() if i else metric_spec(k).label
                            for i, k in enumerate(k for k in PREFIX_KEYS if k in keys))
        notes.append(f"{MISSING} {what} of {', '.join(map(str, uncached))}: {MISSING_REASONS['prefix_hit_rate']}.")
    return notes


def _scaled(key: str, value):
    if value is None:
        return float("nan")
    return value * metric_spec(key).factor


def report_frame(summaries: Mapping[str, dict], keys: Sequence[str] = tuple(COMPARE_COLUMNS)) -> pd.DataFrame:
    """The table as text with units in the cells (headers without units), for the dashboard and the HTML report;
    an overloaded run's latencies read "unbounded: queue grows (+x.x req/s)", a missing figure "–". The frame's
    ``attrs["overloaded"]`` lists the rows of overloaded runs."""
    rows = {name: {metric_spec(k).label: cell_text(k, s) for k in keys} for name, s in summaries.items()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.attrs["overloaded"] = [name for name, s in summaries.items() if s.get("overloaded")]
    return df


def class_frame(summaries: Mapping[str, dict], stat: str = "ttft_p99_s") -> pd.DataFrame:
    """One row per policy, one column per priority class: that class's statistic in display units (the home
    page's per-class table; ``ui.tables.class_table`` draws it)."""
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


CLASS_STATS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def class_stats_frame(summaries: Mapping[str, dict], stats: Sequence[str] = CLASS_STATS) -> pd.DataFrame:
    """One row per policy; per priority class its P50 and P99 TTFT and TPOT as text with units ("unbounded" for an
    overloaded run's latency, "–" where the class has no such figure)."""
    rows: dict[str, dict] = {}
    for name, s in summaries.items():
        row = {}
        for level, cls in sorted(s.get("by_priority", {}).items(), key=lambda kv: int(kv[0])):
            for stat in stats:
                header = f"{cls.get('class_name', level)} (P{level}) · {metric_spec(stat).label}"
                row[header] = "unbounded" if s.get("overloaded") else shown(stat, cls.get(stat))
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def change_frame(summaries: Mapping[str, dict], keys: Sequence[str]) -> pd.DataFrame:
    """Rows = metrics; per policy its value (text) and, after the first, its change against the first (%), with a
    ``_lower_is_better`` column (None: never coloured). No change is given for a latency of an overloaded run
    (it measures the run's length), so an overloaded policy never shows a −100 % delta (Compare's table;
    ``ui.tables.change_table`` draws it)."""
    names = list(summaries)
    base = summaries[names[0]] if names else {}
    rows = []
    for k in keys:
        spec = metric_spec(k)
        row = {"Metric": spec.label}
        for i, name in enumerate(names):
            s = summaries[name]
            v = s.get(k)
            row[name] = cell_text(k, s)
            if i:
                b = base.get(k)
                ok = (all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (v, b))
                      and b != 0 and not is_unbounded(k, s) and not is_unbounded(k, base))
                row[f"{name} vs {names[0]}"] = (v - b) / abs(b) * 100 if ok else float("nan")
        row["_lower_is_better"] = spec.lower_is_better
        rows.append(row)
    return pd.DataFrame(rows)
