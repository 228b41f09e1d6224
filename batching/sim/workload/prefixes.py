"""KV block chains: how requests share prefixes, built and measured.

A request's chain names its full 16-token KV blocks (``specs.KV_BLOCK_TOKENS``), prompt first, then output: two
blocks carry the same id exactly when their tokens and every token before them are the same (vLLM V1's block
hashes, SGLang's radix tree). Chains are stored flat, as ``Requests`` holds them: request r's ids are
``ids[off[r]:off[r + 1]]``. This module builds them (shared system prompts, multi-turn histories, Mooncake's
512-token ``hash_ids``) and measures the reuse they allow (``trace_hit_rate_512``, ``ideal_hit_tokens``). Numpy
only; nothing here imports the workload classes, so workload.py and traces.py can both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from batching.sim.hardware.specs import KV_BLOCK_TOKENS

TRACE_BLOCK_TOKENS = 512  # Mooncake's hash_ids: one per 512-token block of the prompt
ENGINE_BLOCKS_PER_TRACE_BLOCK = TRACE_BLOCK_TOKENS // KV_BLOCK_TOKENS  # 32
_CHUNK_IDS = 1 << 23  # ids built per pass (64 MB of int64), so temporaries stay small at 10^8 ids


def offsets(lengths: np.ndarray) -> np.ndarray:
    """Offsets (n + 1, from 0) of segments of the given lengths."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def segment_positions(off: np.ndarray, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For the flat entries off[lo]..off[hi]: (segment index, position within the segment)."""
    hi = len(off) - 1 if hi is None else hi
    lengths = np.diff(off[lo : hi + 1])
    seg = np.repeat(np.arange(lo, hi, dtype=np.int64), lengths)
    pos = np.arange(off[lo], off[hi], dtype=np.int64) - off[seg]
    return seg, pos


def two_part_chains(
    lengths: np.ndarray, shared_len: np.ndarray, shared_base: np.ndarray, own_base: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Chains whose first ``shared_len[r]`` ids are ``shared_base[r] + j`` and the rest ``own_base[r] + j -
    shared_len[r]``: a class's system prompt, then a session's history. Returns (off, ids)."""
    off = offsets(lengths)
    ids = np.empty(int(off[-1]), dtype=np.int64)
    n = len(lengths)
    lo = 0
    while lo < n:  # in slices of about _CHUNK_IDS ids
        hi = int(np.searchsorted(off, off[lo] + _CHUNK_IDS, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        seg, pos = segment_positions(off, lo, hi)
        part = ids[off[lo] : off[hi]]
        np.add(shared_base[seg], pos, out=part)
        own = np.flatnonzero(pos >= shared_len[seg])
        if own.size:
            s = seg[own]
            part[own] = own_base[s] + pos[own] - shared_len[s]
        lo = hi
    return off, ids


def split_chains(off: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    """The chains as one array per request (views into ``ids``)."""
    return [ids[off[r] : off[r + 1]] for r in range(len(off) - 1)]


# ---------------------------------------------------------------- Mooncake's 512-token hash_ids


def trace_block_tokens(hash_off: np.ndarray, input_tokens: np.ndarray) -> np.ndarray:
    """Tokens each 512-token trace block covers: 512, except a request's last block, which holds
    input - 512 * (blocks - 1)."""
    tokens = np.full(int(hash_off[-1]), TRACE_BLOCK_TOKENS, dtype=np.int64)
    counts = np.diff(hash_off)
    has = counts > 0
    last = hash_off[1:][has] - 1
    tokens[last] = input_tokens[has] - TRACE_BLOCK_TOKENS * (counts[has] - 1)
    return tokens


def prefix_keys(hash_off: np.ndarray, hash_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of the trace blocks such that equal ids mean equal hashes AND equal prefixes.

    Mooncake's hash_ids are chain hashes (an id always follows the same id, so it names its whole prefix); then
    this is dense(hash), ranked by hash value. A trace where some hash follows two different ids is keyed
    instead on (key of the previous block, hash), position by position, so the engine never reuses a block
    whose prefix differs. Returns (key per block, number of keys)."""
    n = len(hash_off) - 1
    uniq, dense = np.unique(hash_ids, return_inverse=True)
    dense = dense.astype(np.int64).reshape(-1)
    req = np.repeat(np.arange(n, dtype=np.int64), np.diff(hash_off))
    pos = np.arange(hash_ids.size, dtype=np.int64) - hash_off[req]
    parent = np.where(pos > 0, np.roll(dense, 1), -1)  # the block before, -1 at a chain's start
    pairs = np.unique(dense * (uniq.size + 1) + parent + 1).size
    if pairs == uniq.size:  # every hash has one parent: hashes already name prefixes
        return dense, int(uniq.size)
    keys = np.empty(hash_ids.size, dtype=np.int64)
    order = np.argsort(pos, kind="stable")
    bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2))
    used = 0
    for k in range(len(bounds) - 1):  # position k: key = (key of position k - 1, hash)
        rows = order[bounds[k] : bounds[k + 1]]
        above = keys[rows - 1] if k > 0 else np.zeros(rows.size, dtype=np.int64)
        _, level = np.unique(above * uniq.size + dense[rows], return_inverse=True)
        level = level.astype(np.int64).reshape(-1)
        keys[rows] = used + level
        used += int(level.max()) + 1 if level.size else 0
    return keys, used


def chains_from_trace_hashes(
    hash_off: np.ndarray, hash_ids: np.ndarray, input_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Engine chains (16-token blocks) from a trace's 512-token block hashes, without losing reuse.

    Trace block k of a request is engine blocks 32k .. 32k + 31 (fewer for the last block: only its full
    16-token blocks). Engine id = base[dense(hash)] + j, j the engine block within the trace block, where
    base[h] = 32 * dense(h) when every block is full, the gaps left by hashes seen only as a short last block
    closed so ids stay dense. Each chain stops after its last trace block that another request also holds
    (the rest is unique: no request can reuse it). Mooncake's hashes are chain hashes (an id always follows
    the same id), so equal engine ids mean equal prefixes; a trace where they are not is keyed on prefixes
    (``prefix_keys``). Returns (off, ids)."""
    n = len(input_tokens)
    if hash_ids.size == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    dense, count = prefix_keys(hash_off, hash_ids)
    req = np.repeat(np.arange(n, dtype=np.int64), np.diff(hash_off))
    # requests holding each hash: shared when a second request holds it
    first_req = np.full(count, n, dtype=np.int64)
    np.minimum.at(first_req, dense, req)
    last_req = np.full(count, -1, dtype=np.int64)
    np.maximum.at(last_req, dense, req)
    shared = (first_req != last_req)[dense]
    pos = np.arange(hash_ids.size, dtype=np.int64) - hash_off[req]
    keep_blocks = np.zeros(n, dtype=np.int64)
    np.maximum.at(keep_blocks, req[shared], pos[shared] + 1)  # trace blocks kept per request
    # engine blocks per kept trace block: 32, or the last block's full 16-token blocks
    engine = np.minimum(trace_block_tokens(hash_off, input_tokens) // KV_BLOCK_TOKENS,
                        ENGINE_BLOCKS_PER_TRACE_BLOCK)
    kept = pos < keep_blocks[req]
    width = np.zeros(count, dtype=np.int64)
    np.maximum.at(width, dense[kept], engine[kept])
    base = offsets(width)[:-1]
    k_dense, k_engine, k_req = dense[kept], engine[kept], req[kept]
    lengths = np.bincount(k_req, weights=k_engine, minlength=n).astype(np.int64)
    off = offsets(lengths)
    block_off = offsets(k_engine)
    block_seg, j = segment_positions(block_off)
    ids = base[k_dense][block_seg] + j
    return off, ids


def trace_hit_rate_512(
    hash_ids_per_request: Sequence[Sequence[int]], input_lengths: Sequence[int] | np.ndarray
) -> float:
    """The trace's own prefix reuse: tokens of 512-token blocks whose hash appeared in an earlier request,
    over all input tokens (a request's last block counts its real token count, input - 512 * (blocks - 1)).

    What a prefix cache that never evicts serves, served in trace order, counted at the trace's 512-token
    granularity (the engine, with 16-token blocks and at least one prompt token computed, serves a little
    less: see ``ideal_hit_tokens``)."""
    lengths = np.asarray(input_lengths, dtype=np.int64)
    if len(hash_ids_per_request) != lengths.size:
        raise ValueError(f"hash_ids_per_request has {len(hash_ids_per_request)} requests but input_lengths "
                         f"has {lengths.size}")
    counts = np.array([len(h) for h in hash_ids_per_request], dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return 0.0
    flat = (np.concatenate([np.asarray(h, dtype=np.int64) for h in hash_ids_per_request])
            if counts.sum() else np.zeros(0, dtype=np.int64))
    hash_off = offsets(counts)
    req = np.repeat(np.arange(lengths.size, dtype=np.int64), counts)
    uniq, dense = np.unique(flat, return_inverse=True)
    first_req = np.full(uniq.size, lengths.size, dtype=np.int64)
    np.minimum.at(first_req, dense.reshape(-1), req)
    seen = first_req[dense.reshape(-1)] < req
    tokens = trace_block_tokens(hash_off, lengths)
    return float(tokens[seen].sum()) / total


# ---------------------------------------------------------------- what an unbounded cache serves


class ChainedRequests(Protocol):
    """What ``ideal_hit_tokens`` reads of a ``workload.Requests`` (which imports this module)."""

    prompt_tokens: np.ndarray
    block_off: np.ndarray | None
    block_ids: np.ndarray | None

    def __len__(self) -> int: ...


def ideal_hit_tokens(requests: ChainedRequests) -> np.ndarray:
    """Per request, the prompt tokens an unbounded prefix cache serves when requests run one after another
    in index order: 16 x the number of the chain's LEADING blocks some earlier request registered (at any
    position of its chain: prompt or output), capped at (prompt_tokens - 1) // 16, since at least one prompt
    token is always computed (as vLLM does). Zeros when the requests carry no chains."""
    n = len(requests)
    hits = np.zeros(n, dtype=np.int64)
    if requests.block_off is None or requests.block_ids is None or requests.block_ids.size == 0:
        return hits
    off, ids = requests.block_off, requests.block_ids
    lengths = np.diff(off)
    req = np.repeat(np.arange(n, dtype=np.int64), lengths)
    first_req = np.full(int(ids.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first_req, ids, req)
    cached = first_req[ids] < req
    pos = np.arange(ids.size, dtype=np.int64) - off[req]
    # leading cached blocks = position of the first uncached block (the chain's length when none)
    first_miss = lengths.copy()
    np.minimum.at(first_miss, req[~cached], pos[~cached])
    cap = (requests.prompt_tokens - 1) // KV_BLOCK_TOKENS
    return np.minimum(first_miss, cap) * KV_BLOCK_TOKENS
