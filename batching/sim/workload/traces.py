"""Request-trace import: native CSV/JSONL, Azure LLM inference, BurstGPT, Vidur and Mooncake traces.

Mooncake's JSON lines (FAST'25: ``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``) carry
each prompt's 512-token block hashes: ``hash_ids`` must be a JSON list of ceil(input_length / 512) non-negative
integers, and become KV block chains of the engine's 16-token blocks (``TraceData.block_off``/``block_ids``/
``block_len``, ``prefixes.chains_from_trace_hashes``: one trace block = 32 engine blocks, so no reuse is lost),
held one id per trace block: the engine expands them as it reads them.

Everything is parsed as data (pandas' CSV reader, ``json``); nothing is evaluated (no pickle,
no eval). Text is UTF-8, with or without a byte-order mark; UTF-16 and UTF-32 are read only
when the file starts with their byte-order mark; other encodings (Latin-1 bytes, UTF-16
without a mark) and NUL bytes are refused with the offset of the first bad byte. Text cells
(``class_name``) are kept verbatim, formula-looking ones included; the CSV exports neutralise
them (``report.csv_safe``).

Every problem is a ``ValueError`` naming the 1-based data row (row 1 is the first row after
the header) and the column, e.g. ``row 7, column num_decode_tokens: '-3' is not a positive
integer``. With ``skip_bad_rows=True`` bad rows are dropped and counted in
``TraceData.skipped_rows``; nothing is ever dropped silently (blank lines, or lines of only
spaces and tabs, are not rows). Every line is held to the header's width: a line with more
fields is an error naming the line, never shifted columns. Duplicate timestamps are valid
(arrivals must be non-decreasing); negative ones are shifted with the rest so the first
arrival is at 0. Numeric times are seconds within ±2^43 s (8.8e12 s): beyond that float64
cannot tell two arrivals a millisecond apart, so they are refused rather than turned into
latencies of 0. A header may have up to 1,000 columns (a wider one is refused in time linear
in its length, before pandas builds a frame for it), and error messages quote at most 200
characters of the file. Size: a 10^7-row CSV (about 200 MB) parses in about 20 s and 4.7 GB of
memory on a 2-core machine; the dashboard's upload cap (``server.maxUploadSize``, 50 MB)
keeps uploads to about 2.5 million rows. A Mooncake file's hashes are read row by row into one int64 array
(no Python list per row is kept), so its parse peaks at about 13 times the file (an 11.9 MB file of 2,000
rows of 1,954 hashes: 151 MB resident, 3.4 GB before) and the parsed trace holds about 5 times it.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from batching.sim.workload.prefixes import TRACE_BLOCK_TOKENS, chains_from_trace_hashes, offsets

MAX_TOKENS = 1_000_000  # longest prompt or output accepted from a trace
MAX_PRIORITY_LEVELS = 8  # same bound as SyntheticWorkload's classes
FORMATS = ("auto", "native", "azure", "burstgpt", "vidur", "mooncake")

# format -> (arrival column, prompt column, output column); matched case-insensitively
_FORMAT_COLUMNS: dict[str, tuple[str, str, str]] = {
    "native": ("arrival_s", "prompt_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
}
_EXTRA_COLUMNS: dict[str, tuple[str, ...]] = {"mooncake": ("hash_ids",)}  # required besides the three
_TIME_UNIT_S: dict[str, float] = {"mooncake": 1e-3}  # seconds per unit of the time column (milliseconds)
_DATETIME_FORMATS = ("azure", "burstgpt")  # time column may be wall-clock date-times
_NON_FINITE = {"nan", "inf", "infinity"}
_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
# numeric arrival times beyond ±2^43 s are refused: float64's spacing there is 2^-10 s (under a millisecond), and
# twice that beyond (epoch seconds and epoch milliseconds still fit; epoch microseconds do not)
MAX_ABS_TIME_S = float(2**43)
MAX_COLUMNS = 1000  # header fields; real traces have 3 to 12
MAX_SHOWN_CHARS = 200  # of the file's text an error message quotes


@dataclass(frozen=True, eq=False)
class TraceData:
    """A parsed trace: per-request arrays in file order, arrivals shifted to start at 0."""

    arrival_s: np.ndarray  # float64, non-decreasing, first = 0
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    priority: np.ndarray  # int64, 0 = highest
    class_names: tuple[str, ...]  # name of each priority level
    skipped_rows: int = 0  # bad rows dropped because skip_bad_rows=True
    fmt: str = "native"  # the format that was read
    # KV block chains (Mooncake; None for the other formats), as ``workload.Requests`` holds them with block_group
    # prefixes.ENGINE_BLOCKS_PER_TRACE_BLOCK: one id per kept trace block, request r's j-th 16-token block is
    # block_ids[block_off[r] + j // 32] + j % 32 for j < block_len[r]; equal ids = equal prefixes
    block_off: np.ndarray | None = None
    block_ids: np.ndarray | None = None
    block_len: np.ndarray | None = None
    # the trace's own 512-token block hashes, as read: request r's are hash_ids[hash_off[r]:hash_off[r + 1]]
    hash_off: np.ndarray | None = None
    hash_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def load_trace(
    source: str | Path | bytes,
    fmt: str = "auto",
    filename: str | None = None,
    skip_bad_rows: bool = False,
) -> TraceData:
    """Read a trace from a path or from raw bytes.

    ``fmt`` is one of FORMATS; "auto" recognises the format from the header. ``filename``
    (defaults to the path's name) only serves as a hint: a .json/.jsonl/.ndjson name is read
    as JSON, anything else is sniffed (JSON when the first non-blank character is ``{`` or
    ``[``, CSV otherwise).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a trace format; allowed: {', '.join(FORMATS)}")
    if isinstance(source, (str, Path)):
        path = Path(source)
        data = path.read_bytes()
        filename = filename or path.name
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        raise ValueError(f"source must be a path or bytes, not {type(source).__name__}")
    text = _decode(data)
    stripped = text.lstrip()
    if not stripped:
        raise ValueError("trace is empty")
    as_json = stripped[0] in "{[" or (filename or "").lower().endswith(_JSON_SUFFIXES)
    frame, row_errors, lists = _read_json(text) if as_json else (*_read_csv(text, skip_bad_rows), {})
    del text, stripped
    if len(frame) == 0:
        raise ValueError("trace is empty (no data rows after the header)")
    return _parse(frame, row_errors, _detect_format(list(frame.columns), fmt), skip_bad_rows, lists)


# byte-order marks of the Unicode encodings read besides UTF-8 (UTF-32 first: its LE mark starts with UTF-16's)
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32", "UTF-32"),
    (codecs.BOM_UTF16_LE, "utf-16", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16", "UTF-16"),
)
_SAVE_AS = "save the file as UTF-8 CSV or JSON lines"


def _decode(data: bytes) -> str:
    """UTF-8 (with or without a byte-order mark); UTF-16 or UTF-32 only with their byte-order mark
    (Excel's "Unicode text"). Anything else, and any NUL character, is refused with a clear error."""
    for bom, codec, name in _BOMS:
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"trace starts with a {name} byte-order mark but is not {name} text: bytes at offset "
                    f"{exc.start} cannot be decoded ({exc.reason}); {_SAVE_AS}"
                ) from None
            nul = text.find("\x00")
            if nul >= 0:
                raise ValueError(f"trace contains a NUL character (character {nul} of the {name} text); "
                                 f"{_SAVE_AS}")
            return text
    nul = data.find(b"\x00")
    if nul >= 0:
        head = data[:400]
        looks = ("it looks like UTF-16 or UTF-32 text without a byte-order mark"
                 if head.count(b"\x00") * 4 >= len(head) else "text files have none")
        raise ValueError(f"trace contains a NUL byte at offset {nul} ({looks}); {_SAVE_AS}")
    try:
        return data.decode("utf-8-sig")  # plain UTF-8, with or without a byte-order mark
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1]
        raise ValueError(
            f"trace is not UTF-8 text: byte 0x{bad.hex()} at offset {exc.start} cannot be "
            f"decoded ({exc.reason}); {_SAVE_AS}"
        ) from None


# ---------------------------------------------------------------- readers (text -> str cells)


def _read_csv(text: str, skip_bad_rows: bool) -> tuple[pd.DataFrame, dict[int, str]]:
    start = len(text) - len(text.lstrip())
    end = text.find("\n", start)
    header = text[start:] if end < 0 else text[start:end]
    sep = "\t" if "\t" in header and "," not in header else ","
    _check_width(header, sep)
    # header=None: the header line is read as data, so its width is the width every line is held to (with
    # a header, pandas would silently turn extra leading fields into an index and shift the columns)
    options = dict(sep=sep, dtype=str, keep_default_na=False, skipinitialspace=True, header=None,
                   index_col=False)
    try:
        frame = pd.read_csv(io.StringIO(text), **options)
    except pd.errors.EmptyDataError:
        raise ValueError("trace is empty") from None
    except (pd.errors.ParserError, ValueError) as exc:
        # an unclosed quote swallows the rest of the file: not a bad row that could be skipped
        if not skip_bad_rows or "EOF inside string" in str(exc):
            raise ValueError(f"cannot read the trace as CSV: {_csv_error(exc)}") from None
        frame = _read_csv_padding_bad_lines(text, options)
    return _with_header(frame.fillna("")), {}


_QUOTED = re.compile(r'"[^"]*"')


def _check_width(header: str, sep: str) -> None:
    """Refuse a header of more than MAX_COLUMNS fields, in time linear in its length (pandas would build a
    column per field: about 20 s for 200,000 of them)."""
    if header.count(sep) < MAX_COLUMNS:  # fields <= separators + 1, quoted separators included
        return
    width = _QUOTED.sub("", header).count(sep) + 1  # separators outside quotes (one regex pass)
    if width > MAX_COLUMNS:
        raise ValueError(f"cannot read the trace as CSV: its header has {width:,} columns; allowed up to "
                         f"{MAX_COLUMNS:,} (a trace needs 3 to 5: {_describe_formats()})")


def _with_header(frame: pd.DataFrame) -> pd.DataFrame:
    """The first row as column names (blank ones named by position, repeats numbered as pandas does)."""
    if len(frame) == 0:
        raise ValueError("trace is empty")
    names: list[str] = []
    taken: set[str] = set()
    for i, cell in enumerate(frame.iloc[0]):
        name = str(cell).strip() or f"Unnamed: {i}"
        base, k = name, 0
        while name in taken:
            k += 1
            name = f"{base}.{k}"
        names.append(name)
        taken.add(name)
    body = frame.iloc[1:].reset_index(drop=True)
    body.columns = names
    return body


def _read_csv_padding_bad_lines(text: str, options: dict) -> pd.DataFrame:
    """Re-read with the Python engine, turning lines with too many fields into empty rows.

    Empty rows then fail the value checks like any bad row, so they are counted, and the
    row numbers of the rows after them stay right.
    """
    try:
        width = len(pd.read_csv(io.StringIO(text), nrows=1, **options).columns)
        return pd.read_csv(
            io.StringIO(text), engine="python", on_bad_lines=lambda _: [""] * width, **options
        )
    except (pd.errors.ParserError, ValueError) as exc:
        raise ValueError(f"cannot read the trace as CSV: {_csv_error(exc)}") from None


def _csv_error(exc: Exception) -> str:
    found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
    if found:
        width, line, seen = found.groups()
        return f"line {line} of the file has {seen} fields but the header has {width}"
    found = re.search(r"EOF inside string starting at row (\d+)", str(exc))
    if found:  # pandas counts lines from 0
        return f'a quote (") opened on line {int(found.group(1)) + 1} of the file is never closed'
    return str(exc).replace("Error tokenizing data. C error: ", "").strip()


# a hash_ids list, held as _HashList; its text cell (never shown: its errors are worded from the list)
_LIST_CELL = "[...]"
_HashList = tuple[np.ndarray | None, str]  # (int64 hashes, "") or (None, why the list is not hashes)


def _read_json(text: str) -> tuple[pd.DataFrame, dict[int, str], dict[str, dict[int, _HashList]]]:
    """JSON lines (one object per line) or a JSON array of objects. Lists under a ``hash_ids`` key (any case)
    come back apart, as int64 arrays per column and row, never as text or Python lists (``_hash_array``).

    Cells go straight into one list per column (a key missing from a row: ""), with each key's text interned,
    not into a dict per row: a 23 MB file of 240,000 short Mooncake rows held 4 key strings and a dict per row
    besides its cells (~400 bytes a row) before they became a frame."""
    row_errors: dict[int, str] = {}
    cols: dict[str, list[str]] = {}
    lists: dict[str, dict[int, _HashList]] = {}
    rows = 0
    for i, item in enumerate(_json_items(text, row_errors)):  # each object made text cells before the next is read
        rows = i + 1
        if not isinstance(item, dict):
            row_errors.setdefault(i, f"expected a JSON object, got {type(item).__name__}")
            continue
        if len(item) > MAX_COLUMNS:  # before converting 200,000 cells of one row
            _too_many_keys(len(item))
        for k, v in item.items():
            key = sys.intern(str(k).strip())
            if isinstance(v, list) and key.lower() == "hash_ids":
                lists.setdefault(key, {})[i] = _hash_array(v)
                cell = _LIST_CELL
            else:
                cell = _json_cell(v)
            col = cols.setdefault(key, [])
            if len(col) == i + 1:  # the key again after stripping: the last value wins, as in one object
                col[i] = cell
                continue
            if len(col) < i:
                col.extend([""] * (i - len(col)))
            col.append(cell)
    if rows and len(row_errors) == rows:  # no row to take columns from: say why, not "no columns"
        first = min(row_errors)
        more = f" (and all {rows:,} rows are bad)" if rows > 1 else ""
        raise ValueError(f"row {first + 1}: {row_errors[first]}{more}")
    if len(cols) > MAX_COLUMNS:
        _too_many_keys(len(cols))
    columns = {}
    for key in list(cols):  # each column made a pandas string column, then its list of cells released
        col = cols.pop(key)
        col.extend([""] * (rows - len(col)))
        columns[key] = pd.array(col, dtype=str)
        del col
    # rows of no keys at all make no rows (a frame of no columns has none): "trace is empty", as before
    return pd.DataFrame(columns, index=pd.RangeIndex(rows if columns else 0), copy=False), row_errors, lists


def _json_items(text: str, row_errors: dict[int, str]):
    """The objects of a JSON array or of JSON lines, one at a time (an invalid line: {} and its error in
    row_errors), so that only one row's values exist as Python objects at once (a row's list of 2,000 hashes
    is ~16 KB of them; all of a 12 MB file's rows, hundreds of MB). Lines are found one at a time too (where
    str.splitlines breaks them), not held as a list of every line."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"cannot read the trace as JSON: {_json_error(exc)}") from None
        if not isinstance(items, list):
            raise ValueError("cannot read the trace as JSON: expected an array of objects")
        for i in range(len(items)):
            item, items[i] = items[i], None  # released once turned into text cells
            yield item
        return
    count = 0
    for match in _LINE.finditer(text):
        line = match.group()
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError) as exc:
            row_errors[count] = f"invalid JSON ({_json_error(exc)})"
            item = {}
        count += 1
        yield item


# a line as str.splitlines cuts them: the longest run of characters none of which ends a line
_LINE = re.compile("[^\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+")


def _too_many_keys(count: int) -> None:
    raise ValueError(f"cannot read the trace as JSON: its objects have {count:,} different keys; allowed up to "
                     f"{MAX_COLUMNS:,} (a trace needs 3 to 5: {_describe_formats()})")


def _json_error(exc: Exception) -> str:
    text = str(exc)
    if "integer string conversion" in text:  # Python's guard against huge integer literals
        return f"a number has more than {sys.get_int_max_str_digits():,} digits"
    if isinstance(exc, RecursionError):
        return "objects or arrays nested too deeply"
    return text


def _json_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return json.dumps(value)  # "true"/"false": not a number
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


# ---------------------------------------------------------------- format detection


def _describe_formats() -> str:
    parts = [
        f"{name} ({', '.join(cols + _EXTRA_COLUMNS.get(name, ()))})" for name, cols in _FORMAT_COLUMNS.items()
    ]
    parts[0] = parts[0][:-1] + "[, priority][, class_name])"
    return "; ".join(parts)


def _columns_text(columns: list[str]) -> str:
    """The trace's columns for a message: as many as fit in MAX_SHOWN_CHARS characters, then how many there are."""
    out, used = [], 0
    for c in columns:
        c = repr(str(_Shown(c)))
        if out and used + len(c) > MAX_SHOWN_CHARS:
            break
        out.append(c)
        used += len(c) + 2
    rest = f", ... ({len(columns):,} columns)" if len(out) < len(columns) else ""
    return f"[{', '.join(out)}{rest}]"


def _detect_format(columns: list[str], fmt: str) -> str:
    lower = {c.lower() for c in columns}
    if fmt != "auto":
        needed = _FORMAT_COLUMNS[fmt] + _EXTRA_COLUMNS.get(fmt, ())
        missing = [c for c in needed if c.lower() not in lower]
        if missing:
            raise ValueError(
                f"missing column {missing[0]!r} for the {fmt} format; the trace has "
                f"columns {_columns_text(columns)}; {fmt} needs {', '.join(needed)}"
            )
        return fmt
    scores = {name: sum(c.lower() in lower for c in cols) for name, cols in _FORMAT_COLUMNS.items()}
    best = max(scores, key=lambda name: scores[name])
    if scores[best] == 3:
        return _detect_format(columns, best)  # its extra columns too (Mooncake's hash_ids)
    if scores[best] == 2:  # one column short of a known format: say which
        return _detect_format(columns, best)
    raise ValueError(
        f"cannot recognise the trace format: columns {_columns_text(columns)}; "
        f"expected one of {_describe_formats()}"
    )


def _column(frame: pd.DataFrame, wanted: str) -> str | None:
    for c in frame.columns:
        if c.lower() == wanted.lower():
            return c
    return None


# ---------------------------------------------------------------- value checks


_PLAIN_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")


class _Shown(str):
    """A cell as an error message shows it: long cells cut to their start and their length, so a
    hostile 10 MB cell does not become a 10 MB message."""

    LIMIT = 40

    def __new__(cls, cell: str) -> "_Shown":
        return super().__new__(cls, cell)

    def _cut(self) -> str:
        text = str.__str__(self)
        return text if len(text) <= self.LIMIT else f"{text[:24]}... ({len(text):,} characters)"

    def __str__(self) -> str:
        return self._cut()

    def __format__(self, spec: str) -> str:
        return format(self._cut(), spec)

    def __repr__(self) -> str:
        return repr(self._cut())


@dataclass
class _Checked:
    """One column after conversion: values, which rows are bad, and why."""

    name: str
    raw: np.ndarray  # the cells as text
    values: np.ndarray  # float64 (NaN where unusable)
    bad: np.ndarray  # bool per row
    why: str  # "length" | "priority" | "time" (numeric) | "datetime"
    unit_s: float = 1.0  # seconds per unit of a time column (1e-3: milliseconds)

    def explain(self, i: int) -> str:
        full = self.raw[i]
        if full == "":
            return f"column {self.name}: value is missing"
        word = full.lower().lstrip("+-")
        cell = _Shown(full)
        if word in _NON_FINITE:
            return f"column {self.name}: {cell!r} is not a finite number"
        v = self.values[i]
        huge = bool(not np.isfinite(v) and _PLAIN_NUMBER.match(full))  # beyond what a float holds
        if huge:
            v = -np.inf if full.startswith("-") else np.inf
        if np.isnan(v):
            kind = "a number or a date-time" if self.why == "datetime" else "a number"
            hint = ""
            if not full.isascii() and any(ch.isdigit() for ch in full):
                hint = " (its digits are not ASCII 0-9, e.g. full-width digits)"
            return f"column {self.name}: {cell!r} is not {kind}{hint}"
        if self.why == "length":
            if v > MAX_TOKENS and v == np.floor(v):
                return f"column {self.name}: {cell} tokens is above the limit of {MAX_TOKENS:,}"
            return f"column {self.name}: {cell!r} is not a positive integer"
        if self.why == "priority":
            return (
                f"column {self.name}: {cell!r} is not a priority level; "
                f"allowed integers 0 to {MAX_PRIORITY_LEVELS - 1}"
            )
        if self.why == "time" and (np.isfinite(v) or huge):
            limit = MAX_ABS_TIME_S / self.unit_s
            unit = "seconds" if self.unit_s == 1.0 else "milliseconds"
            return (
                f"column {self.name}: {cell!r} is out of range; allowed -{limit:.4g} to "
                f"{limit:.4g} {unit} (2^43 s: beyond it float64 cannot tell arrivals 1 ms apart)"
            )
        return f"column {self.name}: {cell!r} is not a finite number"


def _text(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].astype(str).str.strip().to_numpy(dtype=object)


def _numbers(raw: np.ndarray) -> np.ndarray:
    return pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan
    )


def _check_integer(frame: pd.DataFrame, name: str, low: int, high: int, why: str) -> _Checked:
    raw = _text(frame, name)
    v = _numbers(raw)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(v) & (v == np.floor(v)) & (v >= low) & (v <= high)
    return _Checked(name, raw, v, ~ok, why)


def _check_time(frame: pd.DataFrame, name: str, allow_datetime: bool, unit_s: float = 1.0) -> _Checked:
    raw = _text(frame, name)
    v = _numbers(raw) * unit_s
    filled = raw != ""
    if allow_datetime and np.isnan(v[filled]).sum() * 2 > filled.sum():
        stamps = pd.to_datetime(pd.Series(raw), errors="coerce", utc=True, format="ISO8601")
        valid = stamps.notna().to_numpy()
        # microseconds in the parser's own unit range (years 1 to 9999 fit in int64)
        us = stamps.dt.tz_convert(None).to_numpy().astype("datetime64[us]").astype(np.int64)
        first = us[valid][0] if valid.any() else 0
        v = np.where(valid, (us - first) / 1e6, np.nan)
        return _Checked(name, raw, v, ~valid, "datetime")
    with np.errstate(invalid="ignore"):
        ok = np.abs(v) <= MAX_ABS_TIME_S
    return _Checked(name, raw, v, ~ok, "time", unit_s)


_MAX_BLOCK_HASH = 2**63 - 1


@dataclass
class _Hashes:
    """Mooncake's hash_ids column: each good row's 512-token block hashes (int64), bad rows and why."""

    arrays: list[np.ndarray | None]  # None for bad rows
    bad: np.ndarray
    why: dict[int, str]


def _check_hash_ids(frame: pd.DataFrame, name: str, input_tokens: np.ndarray, usable: np.ndarray,
                    lists: dict[int, _HashList]) -> _Hashes:
    """Each cell must be a JSON list of ceil(input_length / 512) integers from 0 to 2^63 - 1 (parsed with
    ``json``, never evaluated; ``lists``: the rows whose list the JSON reader took apart). Rows already bad
    elsewhere (``usable`` False) are not read."""
    raw = frame[name].to_numpy(dtype=object)
    n = len(raw)
    arrays: list[np.ndarray | None] = [None] * n
    bad = np.zeros(n, dtype=bool)
    why: dict[int, str] = {}
    for i in np.flatnonzero(usable):
        if int(i) in lists:
            ids, reason = lists.pop(int(i))
            if not reason:
                reason = _hash_count_error(ids.size, int(input_tokens[i]))
        else:
            ids, reason = _hash_list(str(raw[i]).strip(), int(input_tokens[i]))
        if reason:
            bad[i] = True
            why[i] = f"column {name}: {reason}"
        else:
            arrays[i] = ids
    return _Hashes(arrays, bad, why)


def _hash_list(cell: str, input_tokens: int) -> tuple[np.ndarray | None, str]:
    """A hash_ids cell's hashes (int64), or why it is unusable for a prompt of input_tokens tokens ("" when
    fine)."""
    if cell == "":
        return None, "value is missing"
    try:
        ids = json.loads(cell)
    except (ValueError, RecursionError):
        ids = None
    if not isinstance(ids, list):
        return None, f"{_Shown(cell)!r} is not a JSON list of block hashes (integers)"
    hashes, reason = _hash_array(ids)
    if not reason:
        reason = _hash_count_error(hashes.size, input_tokens)
    return (None, reason) if reason else (hashes, "")


def _hash_count_error(count: int, input_tokens: int) -> str:
    """Why ``count`` hashes do not fit a prompt of input_tokens tokens ("" when they do)."""
    expected = -(-input_tokens // TRACE_BLOCK_TOKENS)
    if count == expected:
        return ""
    plural = "" if count == 1 else "es"
    return (f"{count:,} block hash{plural} for input_length {input_tokens:,}; expected ceil({input_tokens:,} / "
            f"{TRACE_BLOCK_TOKENS}) = {expected:,}, one per {TRACE_BLOCK_TOKENS}-token block")


def _hash_array(ids: list) -> _HashList:
    """A JSON list as int64 hashes, or why not: the first element that is not an integer from 0 to 2^63 - 1.
    Vectorised: numpy makes int64 only of Python ints and bools within int64 (floats, strings, None, lists and
    larger integers give another dtype or an error), and the bools are found by type."""
    if not ids:
        return np.zeros(0, dtype=np.int64), ""
    hashes = None
    if bool not in map(type, ids):
        try:
            hashes = np.array(ids)
        except (ValueError, TypeError, OverflowError):
            hashes = None
    if hashes is not None and hashes.dtype == np.int64 and hashes.ndim == 1 and hashes.min() >= 0:
        return hashes, ""
    wrong = next((k for k, x in enumerate(ids) if type(x) is not int or not 0 <= x <= _MAX_BLOCK_HASH), None)
    if wrong is None:  # not reached: numpy refused only what the loop finds
        return np.array(ids, dtype=np.int64), ""
    x = ids[wrong]
    shown = _Shown(repr(x) if isinstance(x, str) else json.dumps(x))
    return None, f"element {wrong + 1} ({shown}) is not a block hash; allowed integers 0 to 2^63 - 1"


def _check_class_names(
    raw: np.ndarray, priority: np.ndarray | None, usable: np.ndarray
) -> tuple[np.ndarray, dict[int, str], np.ndarray, dict[int, str]]:
    """Bad-row mask and messages for the class_name column, the name of each level, and
    the priorities (given, or numbered by first appearance when no priority column)."""
    bad = raw == ""
    why = {}
    ok = usable & ~bad
    if priority is None:
        codes, uniques = pd.factorize(pd.Series(np.where(ok, raw, None), dtype=object))
        too_many = ok & (codes >= MAX_PRIORITY_LEVELS)
        if too_many.any():
            i = int(np.argmax(too_many))
            why[i] = (
                f"column class_name: {_Shown(raw[i])!r} would be class number "
                f"{MAX_PRIORITY_LEVELS + 1}; at most {MAX_PRIORITY_LEVELS} classes are allowed"
            )
        bad |= too_many
        names = {level: str(n) for level, n in enumerate(uniques[:MAX_PRIORITY_LEVELS])}
        return bad, why, np.where(ok & ~too_many, codes, 0).astype(np.int64), names
    pairs = pd.DataFrame({"p": priority[ok], "name": raw[ok]})
    first = pairs.drop_duplicates("p").set_index("p")["name"]
    expected = first.reindex(priority).to_numpy(dtype=object)
    clash = ok & (raw != expected)
    if clash.any():
        i = int(np.argmax(clash))
        why[i] = (
            f"column class_name: {_Shown(raw[i])!r} differs from {_Shown(expected[i])!r} given earlier "
            f"for priority {int(priority[i])}"
        )
    names = {int(p): str(n) for p, n in first.items()}
    return bad | clash, why, priority, names


# ---------------------------------------------------------------- assembly


def _parse(
    frame: pd.DataFrame, row_errors: dict[int, str], fmt: str, skip_bad_rows: bool,
    lists: dict[str, dict[int, _HashList]],
) -> TraceData:
    n = len(frame)
    time_col, prompt_col, output_col = (_column(frame, c) for c in _FORMAT_COLUMNS[fmt])
    checks = [
        _check_time(frame, time_col, fmt in _DATETIME_FORMATS, _TIME_UNIT_S.get(fmt, 1.0)),
        _check_integer(frame, prompt_col, 1, MAX_TOKENS, "length"),
        _check_integer(frame, output_col, 1, MAX_TOKENS, "length"),
    ]
    priority_col = _column(frame, "priority") if fmt == "native" else None
    if priority_col is not None:
        checks.append(_check_integer(frame, priority_col, 0, MAX_PRIORITY_LEVELS - 1, "priority"))
    structural = np.zeros(n, dtype=bool)
    structural[list(row_errors)] = True
    bad = structural | np.logical_or.reduce([c.bad for c in checks])
    hashes = None
    if fmt == "mooncake":
        name = _column(frame, "hash_ids")
        hashes = _check_hash_ids(frame, name, checks[1].values, ~bad, lists.pop(name, {}))
        bad |= hashes.bad

    names: dict[int, str] = {}
    priority = checks[3].values if priority_col is not None else None
    if priority is not None:
        priority = np.where(bad, 0, priority).astype(np.int64)
    name_col = _column(frame, "class_name") if fmt == "native" else None
    name_why: dict[int, str] = {}
    if name_col is not None:
        name_bad, name_why, priority, names = _check_class_names(
            _text(frame, name_col), priority, ~bad
        )
        bad |= name_bad

    if bad.any() and not skip_bad_rows:
        i = int(np.argmax(bad))
        if i in row_errors:
            raise ValueError(f"row {i + 1}: {row_errors[i]}")
        failing = [c for c in checks if c.bad[i]]
        reason = failing[0].explain(i) if failing else name_why.get(i, "")
        if not failing and hashes is not None and hashes.bad[i]:
            reason = hashes.why[i]
        raise ValueError(f"row {i + 1}, {reason or f'column {name_col}: value is missing'}")
    keep = ~bad
    if not keep.any():
        raise ValueError(f"trace has no valid rows: all {n} rows are bad")

    rows = np.flatnonzero(keep)
    arrival = checks[0].values[keep]
    back = np.diff(arrival) < 0
    if back.any():
        j = int(np.argmax(back)) + 1
        raw = checks[0].raw
        raise ValueError(
            f"row {rows[j] + 1}, column {time_col}: {_Shown(raw[rows[j]])} is earlier than the "
            f"previous row's {_Shown(raw[rows[j - 1]])}; sort the trace by arrival"
        )
    if arrival[-1] - arrival[0] > MAX_ABS_TIME_S:
        raise ValueError(
            f"column {time_col}: the arrivals span {arrival[-1] - arrival[0]:.4g} seconds; allowed up to "
            f"{MAX_ABS_TIME_S:.4g} (2^43 s: beyond it float64 cannot tell arrivals 1 ms apart)"
        )
    if priority is None:
        priority = np.zeros(n, dtype=np.int64)
    priority = priority[keep]
    levels = int(priority.max()) + 1
    class_names = tuple(names.get(p, f"priority {p}") for p in range(levels))
    prompt_tokens = checks[1].values[keep].astype(np.int64)
    chains: dict[str, np.ndarray] = {}
    if hashes is not None:
        kept_arrays = [hashes.arrays[r] for r in rows]
        del hashes
        hash_off = offsets(np.array([h.size for h in kept_arrays], dtype=np.int64))
        hash_ids = np.concatenate(kept_arrays) if kept_arrays else np.zeros(0, dtype=np.int64)
        del kept_arrays
        block_off, block_ids, block_len = chains_from_trace_hashes(hash_off, hash_ids, prompt_tokens)
        chains = dict(block_off=block_off, block_ids=block_ids, block_len=block_len, hash_off=hash_off,
                      hash_ids=hash_ids)
    return TraceData(
        arrival_s=np.ascontiguousarray(arrival - arrival[0], dtype=np.float64),
        prompt_tokens=prompt_tokens,
        output_tokens=checks[2].values[keep].astype(np.int64),
        priority=np.ascontiguousarray(priority, dtype=np.int64),
        class_names=class_names,
        skipped_rows=int(bad.sum()),
        fmt=fmt,
        **chains,
    )
