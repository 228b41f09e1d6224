"""Trace import: real traces, every format, every malformed case, TraceWorkload replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.sim.workload.traces import load_trace
from batching.sim.workload.requests import LengthDist, TraceWorkload, workload_preset

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces"  # shipped with the project (data/README.md)
NATIVE = b"arrival_s,prompt_tokens,output_tokens\n"


def _real(name: str) -> Path:
    path = TRACES / name
    assert path.is_file(), f"{path} is missing; the project ships it (data/README.md)"
    return path


# ---------------------------------------------------------------- the real Azure traces


@pytest.mark.parametrize(
    "name, rows, prompt_mean, output_mean, span_s",
    [
        ("azure_conv_2023.csv", 19_366, 1155, 211, 3502),
        ("azure_code_2023.csv", 8_819, 2048, 28, 3436),
    ],
)
def test_real_traces(
    name: str, rows: int, prompt_mean: float, output_mean: float, span_s: float
) -> None:
    path = _real(name)
    trace = load_trace(path)  # its load time is benchmarks/bench_traces.py's figure, not a test's
    assert trace.fmt == "vidur"
    assert len(trace) == rows and trace.skipped_rows == 0
    assert trace.prompt_tokens.mean() == pytest.approx(prompt_mean, abs=1)
    assert trace.output_tokens.mean() == pytest.approx(output_mean, abs=1)
    assert trace.arrival_s[0] == 0 and trace.arrival_s[-1] == pytest.approx(span_s, abs=1)
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.class_names == ("priority 0",) and np.all(trace.priority == 0)


def test_real_trace_workload_with_rate_and_empirical_lengths() -> None:
    path = _real("azure_conv_2023.csv")
    w = TraceWorkload.from_path(path)
    assert w.filename == "azure_conv_2023.csv" and w.num_requests == 19_366
    assert w.rate_req_s == pytest.approx(5.53, abs=0.01)
    fast = w.with_rate(20.0)
    assert fast.rate_req_s == pytest.approx(20.0, rel=1e-9)
    assert fast.speedup == pytest.approx(20.0 / 5.5301, rel=1e-3)
    d = LengthDist.from_trace(path, which="prompt")
    assert (
        d.kind == "empirical" and len(d.values) == 19_366 and d.mean == pytest.approx(1155, abs=1)
    )


# ---------------------------------------------------------------- each format


def test_native_csv_with_priority_and_shift() -> None:
    data = b"arrival_s,prompt_tokens,output_tokens,priority\n5.0,10,3,1\n5.5,20,4,0\n7,30,5,1\n"
    t = load_trace(data)
    assert t.fmt == "native"
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.5, 2.0])
    assert t.prompt_tokens.tolist() == [10, 20, 30] and t.output_tokens.tolist() == [3, 4, 5]
    assert t.priority.tolist() == [1, 0, 1]
    assert t.class_names == ("priority 0", "priority 1")
    assert t.arrival_s.dtype == np.float64 and t.prompt_tokens.dtype == np.int64


def test_native_class_names_with_and_without_priority() -> None:
    with_priority = (
        NATIVE[:-1] + b",priority,class_name\n0,1,1,1,bulk\n1,1,1,0,chat\n2,1,1,1,bulk\n"
    )
    t = load_trace(with_priority)
    assert t.class_names == ("chat", "bulk") and t.priority.tolist() == [1, 0, 1]
    names_only = NATIVE[:-1] + b",class_name\n0,1,1,chat\n1,1,1,bulk\n2,1,1,chat\n"
    t = load_trace(names_only)
    assert t.class_names == ("chat", "bulk") and t.priority.tolist() == [0, 1, 0]


def test_native_jsonl_and_json_array() -> None:
    rows = [
        {"arrival_s": 1.0, "prompt_tokens": 100, "output_tokens": 10, "priority": 0},
        {"arrival_s": 2.5, "prompt_tokens": 200, "output_tokens": 20, "priority": 1},
    ]
    jsonl = ("\n".join(json.dumps(r) for r in rows) + "\n\n").encode()
    for data in (jsonl, json.dumps(rows).encode()):
        t = load_trace(data)
        np.testing.assert_allclose(t.arrival_s, [0.0, 1.5])
        assert t.prompt_tokens.tolist() == [100, 200] and t.priority.tolist() == [0, 1]


def test_azure_wall_clock_timestamps() -> None:
    data = (
        b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
        b"2023-11-16 18:15:46.6805900,374,44\n"
        b"2023-11-16 18:15:50.9951690,396,109\n"
        b"2023-11-16 18:16:46.6805900,879,25\n"
    )
    t = load_trace(data)
    assert t.fmt == "azure"
    np.testing.assert_allclose(t.arrival_s, [0.0, 4.314579, 60.0], atol=1e-6)
    assert t.prompt_tokens.tolist() == [374, 396, 879] and t.output_tokens.tolist() == [44, 109, 25]


def test_azure_numeric_timestamps_and_bom() -> None:
    data = "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n100.5,1,2\n101.0,3,4\n".encode()
    t = load_trace(data)
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.5])


def test_burstgpt_ignores_other_columns() -> None:
    data = (
        b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        b"5,ChatGPT,472,18,490,Conversation log\n"
        b"45,GPT-4,1087,230,1317,Conversation log\n"
    )
    t = load_trace(data)
    assert t.fmt == "burstgpt"
    assert t.arrival_s.tolist() == [0.0, 40.0]
    assert t.prompt_tokens.tolist() == [472, 1087] and t.output_tokens.tolist() == [18, 230]


def test_vidur_and_explicit_fmt() -> None:
    data = b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4808,10\n0.052,3180,8\n"
    t = load_trace(data, fmt="vidur")
    assert t.fmt == "vidur" and t.prompt_tokens.tolist() == [4808, 3180]
    with pytest.raises(ValueError, match="missing column 'arrival_s' for the native format"):
        load_trace(data, fmt="native")


def test_sample_trace_matches_its_generator() -> None:
    t = load_trace(ROOT / "assets" / "sample_trace.csv")
    r = workload_preset("mixed", rate_req_s=2.0, num_requests=500, seed=7).generate()
    assert len(t) == 500 and t.class_names == ("interactive chat", "batch analysis")
    np.testing.assert_array_equal(t.prompt_tokens, r.prompt_tokens)
    np.testing.assert_array_equal(t.priority, r.priority)
    np.testing.assert_allclose(t.arrival_s, r.arrival_s, atol=1e-6)


# ---------------------------------------------------------------- malformed input


def _rows(*lines: str, header: bytes = NATIVE) -> bytes:
    return header + "".join(line + "\n" for line in lines).encode()


GOOD = "0,10,5"
JSON_ROW_1 = b'{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n'


@pytest.mark.parametrize(
    "data, message",
    [
        (
            _rows(GOOD, GOOD, "2,10,-3"),
            "row 3, column output_tokens: '-3' is not a positive integer",
        ),
        (_rows(GOOD, "1,abc,5"), "row 2, column prompt_tokens: 'abc' is not a number"),
        (_rows(GOOD, "1,10,0"), "row 2, column output_tokens: '0' is not a positive integer"),
        (_rows(GOOD, "1,10.5,5"), "row 2, column prompt_tokens: '10.5' is not a positive integer"),
        (_rows("nan,10,5"), "row 1, column arrival_s: 'nan' is not a finite number"),
        (_rows(GOOD, "1,inf,5"), "row 2, column prompt_tokens: 'inf' is not a finite number"),
        (_rows(GOOD, "1,,5"), "row 2, column prompt_tokens: value is missing"),
        (_rows(GOOD, "1,10"), "row 2, column output_tokens: value is missing"),
        (
            _rows("4.1,10,5", "3.2,10,5"),
            "row 2, column arrival_s: 3.2 is earlier than the previous row's 4.1; "
            "sort the trace by arrival",
        ),
        (
            _rows(GOOD, "1e300,10,5"),
            "row 2, column arrival_s: '1e300' is out of range; allowed -8.796e+12 to 8.796e+12 seconds",
        ),
        (
            _rows(GOOD, "1,2000000,5"),
            "row 2, column prompt_tokens: 2000000 tokens is above the limit",
        ),
        (
            _rows("0,10,5,-1", header=NATIVE[:-1] + b",priority\n"),
            "row 1, column priority: '-1' is not a priority level; allowed integers 0 to 7",
        ),
        (
            _rows("0,10,5,0,a", "1,10,5,0,b", header=NATIVE[:-1] + b",priority,class_name\n"),
            "row 2, column class_name: 'b' differs from 'a' given earlier for priority 0",
        ),
        (
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\nyesterday,1,1\n",
            "row 2, column TIMESTAMP: 'yesterday' is not a number or a date-time",
        ),
        (
            b"Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,10,0\n",
            "row 1, column Response tokens: '0' is not a positive integer",
        ),
        (
            b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,1,1\n2,1,1\n3,1,1\n4,1,1\n"
            b"5,1,1\n6,1,-3\n",
            "row 7, column num_decode_tokens: '-3' is not a positive integer",
        ),
        (
            JSON_ROW_1 + b'{"arrival_s": 1, "prompt_tokens": "x", "output_tokens": 1}\n',
            "row 2, column prompt_tokens: 'x' is not a number",
        ),
        (
            JSON_ROW_1 + b'{"arrival_s": 1,\n',
            "row 2: invalid JSON",
        ),
        (
            JSON_ROW_1 + b'{"arrival_s": 1, "prompt_tokens": 1}\n',
            "row 2, column output_tokens: value is missing",
        ),
        (
            JSON_ROW_1 + b"[1, 2]\n",
            "row 2: expected a JSON object, got list",
        ),
    ],
)
def test_bad_rows_name_row_and_column(data: bytes, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trace(data)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "trace is empty"),
        (b"  \n\n", "trace is empty"),
        (NATIVE, "trace is empty"),
        (
            b"foo,bar\n1,2\n",
            "cannot recognise the trace format: columns ['foo', 'bar']; expected one of native",
        ),
        (b"arrival_s,prompt_tokens,bar\n1,2,3\n", "missing column 'output_tokens'"),
        (
            b"arrival_s,prompt_tokens,output_tokens\n\xff\xfe,1,1\n",
            "not UTF-8 text: byte 0xff at offset 38",
        ),
        (_rows(GOOD, "1,10,5,7"), "line 3 of the file has 4 fields but the header has 3"),
    ],
)
def test_whole_file_problems(data: bytes, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trace(data)
    assert message in str(info.value)


def test_unknown_fmt_is_rejected() -> None:
    with pytest.raises(ValueError, match="fmt='parquet' is not a trace format"):
        load_trace(_rows(GOOD), fmt="parquet")


def test_skip_bad_rows_counts_them() -> None:
    data = _rows("0,10,5", "1,10,0", "2,abc,5", "3,10,5,9", "4,,5", "5,20,6", "nan,1,1")
    with pytest.raises(ValueError):
        load_trace(data)
    t = load_trace(data, skip_bad_rows=True)
    assert t.skipped_rows == 5
    assert t.prompt_tokens.tolist() == [10, 20] and t.arrival_s.tolist() == [0.0, 5.0]


def test_skip_bad_rows_burstgpt_failures_and_shift() -> None:
    data = b"Timestamp,Request tokens,Response tokens\n3,10,0\n5,10,4\n9,8,0\n10,7,2\n"
    t = load_trace(data, skip_bad_rows=True)
    assert t.skipped_rows == 2 and t.arrival_s.tolist() == [0.0, 5.0]
    assert TraceWorkload(data, skip_bad_rows=True).skipped_rows == 2


def test_skip_bad_rows_still_refuses_unsorted_and_all_bad() -> None:
    with pytest.raises(
        ValueError, match="row 3, column arrival_s: 1 is earlier than the previous row's 2"
    ):
        load_trace(_rows("2,1,1", "x,1,1", "1,1,1"), skip_bad_rows=True)
    with pytest.raises(ValueError, match="no valid rows: all 2 rows are bad"):
        load_trace(_rows("0,0,1", "1,0,1"), skip_bad_rows=True)


# ---------------------------------------------------------------- TraceWorkload


def _trace(n: int = 10, gap_s: float = 2.0) -> bytes:
    return NATIVE + "".join(f"{i * gap_s},{100 + i},{i + 1}\n" for i in range(n)).encode()


def test_trace_workload_speedup() -> None:
    w = TraceWorkload(_trace(), speedup=4.0)
    r = w.generate()
    np.testing.assert_allclose(r.arrival_s, np.arange(10) * 0.5)
    assert r.prompt_tokens.tolist() == list(range(100, 110))
    assert w.rate_req_s == pytest.approx(2.0)
    r.validate()


def test_trace_workload_truncation() -> None:
    assert TraceWorkload(_trace(), max_requests=3).num_requests == 3
    assert len(TraceWorkload(_trace(), max_requests=30).generate()) == 10
    # arrivals 0, 2, 4, ... ; "first 5 seconds" keeps 0, 2, 4
    assert TraceWorkload(_trace(), max_duration_s=5.0).num_requests == 3
    # after a 2x speed-up arrivals are 0, 1, 2, ...: 0..4 are before 5 s
    assert TraceWorkload(_trace(), speedup=2.0, max_duration_s=5.0).num_requests == 5
    w = TraceWorkload(_trace(), max_requests=2, max_duration_s=100.0)
    assert w.generate().output_tokens.tolist() == [1, 2]


def test_trace_workload_with_rate() -> None:
    w = TraceWorkload(_trace())  # 0.5 req/s
    fast = w.with_rate(3.0)
    assert fast.speedup == pytest.approx(6.0)
    assert fast.rate_req_s == pytest.approx(3.0)
    assert w.with_num_requests(4).num_requests == 4 and w.with_seed(9) is w
    with pytest.raises(
        ValueError, match=r"rate_req_s=1000 is 2,000x the trace's recorded mean rate of 0.5 req/s; allowed up to "
                          r"1,000x it, 500 req/s"
    ):
        w.with_rate(1000.0)
    with pytest.raises(ValueError, match="all arrive at once"):
        TraceWorkload(_rows("0,1,1", "0,1,1")).with_rate(1.0)


def test_trace_workload_validate_hash_and_repr() -> None:
    with pytest.raises(ValueError, match=r"speedup=0 is out of range; allowed > 0 to 1000"):
        TraceWorkload(_trace(), speedup=0.0).generate()
    with pytest.raises(ValueError, match=r"max_requests=0 is out of range"):
        TraceWorkload(_trace(), max_requests=0).validate()
    a, b = TraceWorkload(_trace()), TraceWorkload(_trace())
    assert a == b and hash(a) == hash(b) and a != TraceWorkload(_trace(11))
    assert "data" not in repr(a)


def test_trace_workload_generate_returns_writable_copies() -> None:
    w = TraceWorkload(_trace())
    r = w.generate()
    r.prompt_tokens[0] = 1
    assert w.generate().prompt_tokens[0] == 100


# ---------------------------------------------------------------- fuzzing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_value_error(data: bytes) -> None:
    try:
        t = load_trace(data)
    except ValueError:
        return
    assert len(t) >= 1 and np.all(t.prompt_tokens >= 1)


_cells = st.one_of(
    st.integers(-5, 2_000_000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "x", "1e3", " 7 ", '"3"', "2023-11-16 18:15:46"]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            NATIVE,
            b"Timestamp,Request tokens,Response tokens\n",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n",
        ]
    ),
    st.lists(st.lists(_cells, min_size=2, max_size=4), min_size=1, max_size=8),
    st.booleans(),
)
def test_random_rows_give_valid_traces_or_value_error(
    header: bytes, rows: list[list[str]], skip: bool
) -> None:
    data = header + "\n".join(",".join(r) for r in rows).encode()
    try:
        t = load_trace(data, skip_bad_rows=skip)
    except ValueError as exc:
        assert str(exc)
        return
    assert len(t) + t.skipped_rows == len(rows)
    assert t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) >= 0)
    assert np.all(t.prompt_tokens >= 1) and np.all(t.output_tokens <= 1_000_000)


# ---------------------------------------------------------------- times float64 cannot resolve, odd digits


def test_arrival_times_beyond_millisecond_resolution_are_refused_with_the_limit() -> None:
    """At 1e15 s float64's spacing is 0.125 s: two arrivals 1 ms apart would merge and latencies read 0."""
    from batching.sim.workload.traces import MAX_ABS_TIME_S

    below = np.nextafter(MAX_ABS_TIME_S, 0)
    assert MAX_ABS_TIME_S == 2.0**43 and np.spacing(below) < 1e-3 <= np.spacing(MAX_ABS_TIME_S)
    with pytest.raises(ValueError) as info:
        load_trace(NATIVE + b"1e15,10,5\n1000000000000000.001,10,5\n")
    assert str(info.value) == ("row 1, column arrival_s: '1e15' is out of range; allowed -8.796e+12 to 8.796e+12 "
                               "seconds (2^43 s: beyond it float64 cannot tell arrivals 1 ms apart)")
    # just inside the limit a millisecond survives the shift to 0
    t = load_trace(NATIVE + b"8700000000000,10,5\n8700000000000.001,10,5\n8700000000000.002,10,5\n")
    np.testing.assert_allclose(np.diff(t.arrival_s), [1e-3, 1e-3], atol=5e-4)
    # negative and positive times within the limit whose span is beyond it
    with pytest.raises(ValueError, match=r"column arrival_s: the arrivals span 1\.6e\+13 seconds; allowed up to "
                                         r"8\.796e\+12"):
        load_trace(NATIVE + b"-8e12,10,5\n8e12,10,5\n")
    # the same limit holds for the requests a workload replays or generates
    with pytest.raises(ValueError, match=r"puts the last arrival at 8\.6e\+15 s; allowed up to 8\.796e\+12 s"):
        TraceWorkload(NATIVE + b"0,10,5\n8.6e12,10,5\n", speedup=1e-3).generate()
    with pytest.raises(ValueError, match=r"rate_req_s=1e-12 with num_requests=100 puts the last arrival at "
                                         r"[0-9.e+]+ s; allowed up to 8\.796e\+12 s .*higher rate"):
        workload_preset("chat", 1e-12, 100).generate()


@pytest.mark.parametrize("cell, message", [
    ("１２", "'１２' is not a number (its digits are not ASCII 0-9, e.g. full-width digits)"),
    ("٣", "'٣' is not a number (its digits are not ASCII 0-9"),
    ("1e30", "1e30 tokens is above the limit of 1,000,000"),
    ("2.5", "'2.5' is not a positive integer"),
])
def test_oddly_written_lengths_say_what_is_wrong(cell: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trace(NATIVE + f"0,{cell},5\n".encode())
    assert str(info.value) == f"row 1, column prompt_tokens: {message}" or \
        str(info.value).startswith(f"row 1, column prompt_tokens: {message}")
    with pytest.raises(ValueError, match=r"row 1, column arrival_s: '１' is not a number \(its digits are not ASCII"):
        load_trace(NATIVE + "１,10,5\n".encode())
