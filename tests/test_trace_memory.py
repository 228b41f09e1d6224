"""Memory of a Mooncake upload (issue 22, item 6): an 11.9 MB file of 2,000 rows with 1,954 hash_ids each peaked
at 3.5 GB in the parser (each 512-token hash became 32 int64 engine block ids, 125 million of them). Parsing,
and a simulation of what was parsed, stay within 20 times the file's size.

Measured as resident memory in a fresh process (the kernels compiled and the libraries loaded by a small run
first): the peak (VmHWM, reset just before the file is read in, so a compile's peak before it does not count)
less the memory resident then, so numpy, pandas' Arrow strings and the kernel's own arrays all count, and step
tables that np.empty reserves but a run never touches do not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batching.sim.workload.prefixes import ENGINE_BLOCKS_PER_TRACE_BLOCK, TRACE_BLOCK_TOKENS
from batching.sim.workload.traces import load_trace

LIMIT = 20  # peak resident memory over the file's size
ROOT = Path(__file__).resolve().parents[1]

# run in a fresh interpreter: argv[1] the file, argv[2] "parse" or "simulate"; prints what it measured as JSON
_PROBE = r'''
import json, sys
from pathlib import Path
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario, simulate
from batching.sim.hardware.specs import deployment
from batching.sim.workload.traces import load_trace
from batching.sim.workload.requests import TraceWorkload

def status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

path, what = Path(sys.argv[1]), sys.argv[2]
dep = deployment(model="llama-3.1-8b", tp=1, num_gpus=1)
def run(data, name):
    if what == "parse":
        trace = load_trace(data, filename=name)
        return {"blocks": int(trace.block_len.sum()), "rows": len(trace)}
    summary = simulate(Scenario(deployment=dep, workload=TraceWorkload(data, name), policy=PRESETS["chunked"])).summary()
    return {"cached_prompt_tokens": int(summary["cached_prompt_tokens"])}

warm = b"\n".join(json.dumps({"timestamp": t, "input_length": 1000, "output_length": 4, "hash_ids": [0, 1]}).encode()
                  for t in (0, 1000, 2000))
import batching.sim.engine.state as tables
by_id = tables.DIRECT_IDS_PER_KV_BLOCK, tables.DIRECT_IDS
tables.DIRECT_IDS_PER_KV_BLOCK = tables.DIRECT_IDS = 0
run(warm, "warm.jsonl")  # kernels compiled or loaded (with hashed prefix tables, then by id), libraries loaded
tables.DIRECT_IDS_PER_KV_BLOCK, tables.DIRECT_IDS = by_id
run(warm, "warm.jsonl")
data = path.read_bytes()
before = status_kb("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from what is resident now
out = run(data, path.name)
out["grew_kb"] = status_kb("VmHWM") - before
print(json.dumps(out))
'''


def _rows(rows: int, hashes: list[int], input_length: int, output_length: int = 8) -> bytes:
    """Mooncake JSON lines, all of the same prompt: the first at 0, the others from 60 s on, 250 ms apart."""
    line = {"timestamp": 0, "input_length": input_length, "output_length": output_length, "hash_ids": hashes}
    out = []
    for i in range(rows):
        line["timestamp"] = 0 if i == 0 else 60_000 + 250 * i
        out.append(json.dumps(line))
    return "\n".join(out).encode()


def _pairs(pairs: int, blocks: int) -> bytes:
    """Mooncake JSON lines of pairs of requests: pair p's two share a prompt of ``blocks`` hashes no other pair
    holds, the second arriving 30 s after the first (which has finished by then)."""
    out = []
    for i in range(2 * pairs):
        first = (i // 2) * blocks
        out.append(json.dumps({"timestamp": 30_000 * i, "input_length": blocks * TRACE_BLOCK_TOKENS,
                               "output_length": 8, "hash_ids": list(range(first, first + blocks))}))
    return "\n".join(out).encode()


def _probe(path: Path, what: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(path), what], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_a_12_mb_upload_of_long_shared_prompts_parses_within_20_times_its_size(tmp_path: Path) -> None:
    # the file: 2,000 rows of 1,954 one-digit hashes (3 bytes each), every row the same 1,000,000-token
    # prompt, so every block is shared and kept: 125 M engine blocks
    data = _rows(2000, [0] * 1954, 1_000_000)
    size = len(data)
    assert 11_500_000 < size < 12_500_000
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    out = _probe(path, "parse")
    grew = out["grew_kb"] * 1024
    assert grew <= LIMIT * size, f"parsing peaked at {grew / 1e6:.0f} MB over a {size / 1e6:.1f} MB file"
    assert out["blocks"] == 2000 * 1_000_000 // 16  # each chain holds all full 16-token blocks of its prompt


SHORT_ROWS_LIMIT = 10  # peak over file size parsing many short rows (README, "Uploaded traces": 7.9x measured)


def _short_rows(size: int) -> bytes:
    """Mooncake JSON lines of short prompts (1 to 3 hashes, ~95 bytes a row), each its own blocks, until ``size``
    bytes: the per-row cost, not the hashes, is what such a file's parse holds."""
    out, total, first = [], 0, 0
    for i in range(size):
        n = 1 + i % 3
        line = json.dumps({"timestamp": 17 * i, "input_length": 512 * n - 100 - i % 400, "output_length": 1 + i % 800,
                           "hash_ids": list(range(first, first + n))})
        first += n
        out.append(line)
        total += len(line) + 1
        if total >= size:
            return "\n".join(out).encode()
    raise AssertionError("not reached")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_an_upload_of_many_short_rows_parses_within_10_times_its_size(tmp_path: Path) -> None:
    # issue 39, item 15: 23 MB of such rows peaked at 15.7 times the file in the parser (a dict, 4 key strings and
    # 3 cell strings per row, plus every line held at once), 20.5 times in a server with the upload itself
    data = _short_rows(6_000_000)
    size = len(data)
    path = tmp_path / "short.jsonl"
    path.write_bytes(data)
    out = _probe(path, "parse")
    grew = out["grew_kb"] * 1024
    assert grew <= SHORT_ROWS_LIMIT * size, f"parsing peaked at {grew / size:.1f} times a {size / 1e6:.1f} MB file"
    assert out["rows"] == data.count(b"\n") + 1


def test_the_parsed_trace_keeps_one_id_per_trace_block() -> None:
    data = _rows(200, [0] * 1954, 1_000_000)
    trace = load_trace(data, filename="big.jsonl")
    assert len(trace) == 200 and trace.hash_ids.size == 200 * 1954
    np.testing.assert_array_equal(trace.block_len, np.full(200, 1_000_000 // 16))
    assert trace.block_off[-1] == 200 * 1954  # held as one id per 512-token block, not 32 per block
    # what the dashboard keeps of the last 8 files parsed is a few times the file
    held = sum(a.nbytes for a in (trace.block_off, trace.block_ids, trace.block_len, trace.hash_off, trace.hash_ids))
    assert held < 6 * len(data)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_an_upload_parsed_and_simulated_stays_within_20_times_its_size(tmp_path: Path) -> None:
    # 3,000 requests of one 128,000-token prompt (250 chain hashes), the first alone (its blocks are cached before
    # the others come), on one GPU: 3.7 MB; the engine sees 8,000 blocks per request, 24 M in all
    blocks = 250
    data = _rows(3000, list(range(blocks)), blocks * TRACE_BLOCK_TOKENS)
    size = len(data)
    path = tmp_path / "turns.jsonl"
    path.write_bytes(data)
    out = _probe(path, "simulate")
    grew = out["grew_kb"] * 1024
    assert grew <= LIMIT * size, f"parse + simulate peaked at {grew / 1e6:.0f} MB over a {size / 1e6:.1f} MB file"
    # every request after the first is served from the cache but its last block (>= 1 token is computed)
    per_request = blocks * ENGINE_BLOCKS_PER_TRACE_BLOCK * 16 - 16
    assert out["cached_prompt_tokens"] == 2999 * per_request


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_a_trace_of_many_distinct_shared_blocks_simulates_within_20_times_its_size(tmp_path: Path) -> None:
    # 1,000 pairs of 128,000-token prompts, each pair its own 250 hashes: 4.1 MB naming 8 M distinct engine blocks,
    # each shared by two requests. Prefix tables indexed by block id took 33 bytes a block (264 MB), 13 as int32
    # (104 MB); the hash-indexed tables follow the GPU cache's 28,000 blocks (~3 MB)
    data = _pairs(1000, 250)
    size = len(data)
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(data)
    out = _probe(path, "simulate")
    grew = out["grew_kb"] * 1024
    assert grew <= LIMIT * size, f"parse + simulate peaked at {grew / 1e6:.0f} MB over a {size / 1e6:.1f} MB file"
    # the second of each pair is served its pair's whole prompt but the last block
    assert out["cached_prompt_tokens"] == 1000 * (250 * ENGINE_BLOCKS_PER_TRACE_BLOCK * 16 - 16)


def test_parsed_traces_are_kept_within_a_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from batching.sim.workload import requests as workload

    cache = workload._TraceCache()
    files = [_rows(50, [k] * 20, 20 * TRACE_BLOCK_TOKENS) for k in range(3)]
    first = cache(files[0], "auto", "a.jsonl", False)
    size = len(files[0]) + sum(a.nbytes for a in workload._trace_arrays(first))
    monkeypatch.setattr(workload, "TRACE_CACHE_BYTES", 2 * size)
    cache(files[1], "auto", "b.jsonl", False)
    assert cache(files[0], "auto", "a.jsonl", False) is first  # both fit: a hit
    cache(files[2], "auto", "c.jsonl", False)  # three do not: the least recently used (b) goes
    assert [k[2] for k in cache._items] == ["a.jsonl", "c.jsonl"]
    monkeypatch.setattr(workload, "TRACE_CACHE_BYTES", 1)
    latest = cache(files[1], "auto", "b.jsonl", False)
    assert list(cache._items) == [(files[1], "auto", "b.jsonl", False)]  # the latest stays, whatever its size
    assert cache(files[1], "auto", "b.jsonl", False) is latest and not latest.block_ids.flags.writeable
