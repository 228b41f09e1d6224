"""Mooncake traces (FAST'25): the shipped files load, their 512-token block hashes become engine chains without
losing reuse (one trace block = 32 engine blocks), the trace's own hit rate is measured, and bad hash_ids are
refused with the row and column."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from batching.sim.workload.prefixes import (ENGINE_BLOCKS_PER_TRACE_BLOCK, expand_chains, ideal_hit_tokens,
                                            split_chains, trace_hit_rate_512)
from batching.sim.workload.traces import FORMATS, TraceData, load_trace
from batching.sim.workload.requests import Requests, TraceWorkload

MOONCAKE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake"
CONVERSATION = MOONCAKE / "conversation_trace.jsonl"
SYNTHETIC = MOONCAKE / "synthetic_trace.jsonl"


@pytest.fixture(scope="module")
def conversation() -> TraceData:
    return load_trace(CONVERSATION)


@pytest.fixture(scope="module")
def raw_rows() -> list[dict]:
    return [json.loads(line) for line in CONVERSATION.read_text().splitlines()]


def engine_chains(trace: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """The trace's chains with one id per 16-token engine block (it holds one per 512-token trace block)."""
    return expand_chains(trace.block_off, trace.block_ids, trace.block_len, ENGINE_BLOCKS_PER_TRACE_BLOCK)


def _hits_by_hand(rows: list[dict]) -> np.ndarray:
    """Per request, tokens of 512-token blocks whose hash an earlier request held (plain Python sets)."""
    seen: set[int] = set()
    hits = []
    for row in rows:
        ids, length = row["hash_ids"], row["input_length"]
        tokens = [512] * (len(ids) - 1) + [length - 512 * (len(ids) - 1)]
        hits.append(sum(t for h, t in zip(ids, tokens) if h in seen))
        seen.update(ids)
    return np.array(hits)


def test_conversation_trace_loads(conversation: TraceData) -> None:
    assert "mooncake" in FORMATS
    assert conversation.fmt == "mooncake" and len(conversation) == 12_031
    assert conversation.arrival_s[-1] == pytest.approx(3536.999)  # timestamps are milliseconds
    assert conversation.prompt_tokens.mean() == pytest.approx(12_035, abs=1)
    assert conversation.output_tokens.mean() == pytest.approx(343, abs=1)
    assert conversation.skipped_rows == 0


def test_the_traces_own_hit_rate(conversation: TraceData, raw_rows: list[dict]) -> None:
    by_hand = _hits_by_hand(raw_rows)
    total = sum(r["input_length"] for r in raw_rows)
    rate = trace_hit_rate_512([r["hash_ids"] for r in raw_rows], [r["input_length"] for r in raw_rows])
    assert rate == pytest.approx(by_hand.sum() / total, rel=1e-12)
    assert rate == pytest.approx(0.37362, abs=1e-5)
    # the same from what load_trace kept
    assert trace_hit_rate_512(split_chains(conversation.hash_off, conversation.hash_ids),
                              conversation.prompt_tokens) == rate


def test_synthetic_trace_hit_rate() -> None:
    trace = load_trace(SYNTHETIC)
    rows = [json.loads(line) for line in SYNTHETIC.read_text().splitlines()]
    assert len(trace) == 3_993
    rate = trace_hit_rate_512(split_chains(trace.hash_off, trace.hash_ids), trace.prompt_tokens)
    assert rate == pytest.approx(_hits_by_hand(rows).sum() / sum(r["input_length"] for r in rows), rel=1e-12)
    assert rate == pytest.approx(0.65124, abs=1e-5)


def test_an_unbounded_cache_serves_the_traces_reuse_to_16_tokens(conversation: TraceData,
                                                                 raw_rows: list[dict]) -> None:
    requests = Requests.from_trace(conversation)
    requests.validate()
    ideal = ideal_hit_tokens(requests)
    trace = _hits_by_hand(raw_rows)
    # the engine counts full 16-token blocks and computes at least one prompt token: per request it serves
    # the trace's reuse less at most 16 tokens
    gap = trace - ideal
    assert gap.min() >= 0 and gap.max() <= 16
    rate = ideal.sum() / requests.prompt_tokens.sum()
    assert rate == pytest.approx(0.37362, abs=2e-5)  # measured 0.373617 against the trace's 0.373624


def test_chains_map_each_trace_block_to_32_engine_blocks(conversation: TraceData) -> None:
    off, ids = engine_chains(conversation)
    # held one id per kept trace block: ids[block_off[r] + j // 32] + j % 32 is engine block j
    assert conversation.block_off[-1] == np.ceil(np.diff(off) / 32).sum()
    hash_off, hashes = conversation.hash_off, conversation.hash_ids
    lengths = np.diff(off)
    req = np.repeat(np.arange(len(conversation)), lengths)
    pos = np.arange(ids.size) - off[req]
    trace_block = hashes[hash_off[req] + pos // 32]  # engine block j lies in trace block j // 32
    pair = trace_block * 32 + pos % 32
    # (trace hash, engine block within it) <-> engine id, one to one; ids dense from 0
    size = int(ids.max()) + 1
    assert np.all(np.bincount(ids, minlength=size) > 0)
    low = np.full(size, np.iinfo(np.int64).max)
    high = np.full(size, -1)
    np.minimum.at(low, ids, pair)
    np.maximum.at(high, ids, pair)
    np.testing.assert_array_equal(low, high)  # each id: one (hash, j)
    assert np.unique(low).size == size  # each (hash, j): one id
    # only full 16-token blocks of the prompt
    assert np.all(lengths <= conversation.prompt_tokens // 16)
    # each chain stops after its last block another request shares
    counts = np.bincount(ids)
    ends = off[1:][lengths > 0] - 1
    assert np.all(counts[ids[ends]] >= 2)
    # requests 0 and 1 share their first trace block (hash 0): exactly 32 engine blocks
    c0, c1 = split_chains(off, ids)[:2]
    assert raw_common(hashes[hash_off[0]:hash_off[1]], hashes[hash_off[1]:hash_off[2]]) == 1
    assert raw_common(c0, c1) == 32


def raw_common(a: np.ndarray, b: np.ndarray) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def test_small_trace_exact_ids() -> None:
    data = "\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 1500, "input_length": 1030, "output_length": 5, "hash_ids": [7, 8, 3]},
        {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [7, 4]},
        {"timestamp": 4000, "input_length": 40, "output_length": 5, "hash_ids": [5]},
    ]).encode()
    trace = load_trace(data, filename="t.jsonl")
    np.testing.assert_allclose(trace.arrival_s, [0, 1.5, 1.5, 4.0])
    # hash 7 is everyone's first block (32 engine blocks, ids 0-31), 8 is the second block of requests 0 and
    # 1 (ids 32-63); the rest is held by one request each: chains stop there
    chains = split_chains(*engine_chains(trace))
    np.testing.assert_array_equal(chains[0], np.arange(64))
    np.testing.assert_array_equal(chains[1], np.arange(64))
    np.testing.assert_array_equal(chains[2], np.arange(32))
    assert chains[3].size == 0
    assert trace_hit_rate_512(split_chains(trace.hash_off, trace.hash_ids), trace.prompt_tokens) == pytest.approx(
        (1024 + 512) / (1100 + 1030 + 700 + 40))
    np.testing.assert_array_equal(ideal_hit_tokens(Requests.from_trace(trace)), [0, 1024, 512, 0])


def test_short_last_blocks_keep_ids_dense() -> None:
    # hash 6 is only ever a short last block (100 tokens: 6 full engine blocks)
    data = b"\n".join(json.dumps(r).encode() for r in [
        {"timestamp": 0, "input_length": 612, "output_length": 1, "hash_ids": [1, 6]},
        {"timestamp": 0, "input_length": 612, "output_length": 1, "hash_ids": [1, 6]},
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
    ])
    trace = load_trace(data)
    off, ids = engine_chains(trace)
    assert np.diff(off).tolist() == trace.block_len.tolist() == [38, 38, 64, 64]
    assert set(ids.tolist()) == set(range(32 + 6 + 32))


def test_trace_workload_carries_chains() -> None:
    w = TraceWorkload.from_path(CONVERSATION, max_requests=500)
    r = w.generate()
    r.validate()
    trace = w.load()
    assert len(r) == 500
    np.testing.assert_array_equal(r.block_off, trace.block_off[:501])
    np.testing.assert_array_equal(r.block_ids, trace.block_ids[: trace.block_off[500]])
    np.testing.assert_array_equal(r.block_len, trace.block_len[:500])
    assert r.block_group == 32 and r.chain_lengths() is r.block_len
    fast = w.with_rate(10.0).generate()
    assert fast.mean_rate_req_s == pytest.approx(10.0)
    np.testing.assert_array_equal(fast.block_ids, r.block_ids)
    r.block_ids[0] = 99  # a copy: the cached trace stays as read
    assert w.load().block_ids[0] == 0 and not w.load().block_ids.flags.writeable


def test_csv_and_explicit_format() -> None:
    data = b'timestamp,input_length,output_length,hash_ids\n0,600,5,"[1, 2]"\n2000,520,5,"[1, 3]"\n'
    trace = load_trace(data)
    assert trace.fmt == "mooncake" and trace.arrival_s.tolist() == [0.0, 2.0]
    assert engine_chains(load_trace(data, fmt="mooncake"))[1].tolist() == list(range(32)) * 2


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("[0]", r"row 2, column hash_ids: 1 block hash for input_length 600; expected ceil\(600 / 512\) = 2"),
        ("[0, 1, 2]", r"row 2, column hash_ids: 3 block hashes for input_length 600; expected"),
        ("[0, -1]", r"row 2, column hash_ids: element 2 \(-1\) is not a block hash; allowed integers 0 to 2\^63"),
        ("[0, true]", r"row 2, column hash_ids: element 2 \(true\) is not a block hash"),
        ("[0, 1.0]", r"row 2, column hash_ids: element 2 \(1.0\) is not a block hash"),
        ('[0, "1"]', r"row 2, column hash_ids: element 2 \('1'\) is not a block hash"),
        ("[0, [1]]", r"row 2, column hash_ids: element 2 \(\[1\]\) is not a block hash"),
        ("[0, 9223372036854775808]", r"row 2, column hash_ids: element 2 \(9223372036854775808\) is not a"),
        ('"0,1"', r"row 2, column hash_ids: '0,1' is not a JSON list of block hashes"),
        ('{"a": 1}', r"row 2, column hash_ids: '\{\"a\": 1\}' is not a JSON list"),
        ("null", r"row 2, column hash_ids: value is missing"),
        ("[" + "0, " * 5000 + "0]", r"row 2, column hash_ids: 5,001 block hashes for input_length 600"),
    ],
)
def test_bad_hash_ids_name_row_and_column(cell: str, message: str) -> None:
    bad = '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": %s}' % cell
    data = f"{GOOD}\n{bad}\n{GOOD}".encode()
    with pytest.raises(ValueError, match=message):
        load_trace(data)
    trace = load_trace(data, skip_bad_rows=True)
    assert trace.skipped_rows == 1 and len(trace) == 2
    assert trace.hash_off.tolist() == [0, 2, 4] and trace.hash_ids.tolist() == [0, 1, 0, 1]


def test_whole_file_problems() -> None:
    with pytest.raises(ValueError, match=r"missing column 'hash_ids' for the mooncake format; .* mooncake needs "
                                         r"timestamp, input_length, output_length, hash_ids"):
        load_trace(b'{"timestamp": 0, "input_length": 600, "output_length": 5}')
    with pytest.raises(ValueError, match=r"row 1, column timestamp: '1e\+30' is out of range; allowed "
                                         r"-8.796e\+15 to 8.796e\+15 milliseconds"):
        load_trace(b'{"timestamp": 1e30, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}')
    with pytest.raises(ValueError, match=r"row 2, column input_length: '0' is not a positive integer"):
        load_trace(f'{GOOD}\n{{"timestamp": 1, "input_length": 0, "output_length": 5, "hash_ids": []}}'.encode())
    with pytest.raises(ValueError, match=r"row 2, column timestamp: 5 is earlier than the previous row's 9"):
        load_trace(f'{GOOD.replace("0,", "9,", 1)}\n{GOOD.replace("0,", "5,", 1)}'.encode())


def test_other_formats_have_no_chains() -> None:
    trace = load_trace(b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,5\n")
    assert trace.block_off is None and trace.hash_ids is None
    assert Requests.from_trace(trace).block_off is None
    assert math.isclose(trace_hit_rate_512([[1], [1]], [100, 100]), 0.5)
