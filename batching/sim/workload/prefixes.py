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


def own_block_ids(tokens: np.ndarray, chain_ids: np.ndarray, chain_len: np.ndarray,
                  shift: int = 0) -> tuple[np.ndarray, int]:
    """Ids for the blocks past each chain: a request's own blocks, which no other request shares (vLLM V1 names
    every full block, hashing its tokens and all before it). Request r's block j >= chain_len[r] is own_base[r] + j
    - chain_len[r], up to its last full block, (tokens[r] - 1) // 16 (tokens: prompt + output; the last output
    token's KV is never computed). The ids follow the chains' (each chain id naming 2^shift blocks). Returns
    (own_base, number of ids in all)."""
    first = int(chain_ids.max()) + (1 << shift) if len(chain_ids) else 0
    own = np.maximum((np.asarray(tokens, np.int64) - 1) // KV_BLOCK_TOKENS - chain_len, 0)
    base = offsets(own)
    return base[:-1] + first, first + int(base[-1])


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


def _index_dtype(size: int) -> type:
    """int32 for indices into arrays of up to 2^31 - 1 entries (half the memory of int64), else int64."""
    return np.int32 if size < 2**31 else np.int64


def _ranks(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the distinct values (ascending, from 0), and how many there are. Values >= 0; when
    they are small (Mooncake numbers its hashes from 0) a presence table ranks them without np.unique's sort
    and its five arrays of len(values) int64."""
    dtype = _index_dtype(values.size)
    top = int(values.max())
    if top < 2 * values.size + 1024:
        present = np.zeros(top + 1, dtype=np.bool_)
        present[values] = True
        rank = np.cumsum(present, dtype=dtype)
        del present
        rank -= 1
        return rank[values], int(rank[-1]) + 1
    uniq, inverse = np.unique(values, return_inverse=True)
    return inverse.astype(dtype).reshape(-1), int(uniq.size)


def prefix_keys(hash_off: np.ndarray, hash_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of the trace blocks such that equal ids mean equal hashes AND equal prefixes.

    Mooncake's hash_ids are chain hashes (an id always follows the same id, so it names its whole prefix); then
    this is dense(hash), ranked by hash value. A trace where some hash follows two different ids is keyed
    instead on (key of the previous block, hash), position by position, so the engine never reuses a block
    whose prefix differs. Returns (key per block: int32 below 2^31 blocks, number of keys). Hashes >= 0; no
    array of len(hash_ids) int64 is made besides what ``_ranks`` needs for sparse hashes."""
    if hash_ids.size == 0:
        return np.zeros(0, dtype=np.int32), 0
    dense, count = _ranks(hash_ids)
    starts = hash_off[:-1][np.diff(hash_off) > 0]  # each chain's first block
    parent = np.roll(dense, 1)  # the block before; -1 at a chain's start
    parent[starts] = -1
    low = np.full(count, count, dtype=dense.dtype)
    high = np.full(count, -2, dtype=dense.dtype)
    np.minimum.at(low, dense, parent)
    np.maximum.at(high, dense, parent)
    del parent
    if np.array_equal(low, high):  # every hash has one parent: hashes already name prefixes
        return dense, count
    del low, high
    keys = np.empty_like(dense)
    counts = np.diff(hash_off)
    order = np.argsort(-counts, kind="stable")  # requests by block count, longest first
    holders = counts.size - np.cumsum(np.bincount(counts))  # holders[k]: requests with more than k blocks
    used = 0
    for k in range(int(counts.max())):  # position k: key = (key of position k - 1, hash)
        rows = hash_off[order[: holders[k]]] + k
        combo = dense[rows].astype(np.int64)
        if k > 0:
            combo += keys[rows - 1].astype(np.int64) * count
        _, level = np.unique(combo, return_inverse=True)
        keys[rows] = used + level.reshape(-1)
        used += int(level.max()) + 1
    return keys, used


def chains_from_trace_hashes(
    hash_off: np.ndarray, hash_ids: np.ndarray, input_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Engine chains (16-token blocks) from a trace's 512-token block hashes, without losing reuse, kept one id
    per trace block (``expand_chains`` with group ENGINE_BLOCKS_PER_TRACE_BLOCK turns them into engine blocks).

    Trace block k of a request is engine blocks 32k .. 32k + 31 (fewer for the last block: only its full
    16-token blocks). Engine id = base[dense(hash)] + j, j the engine block within the trace block, where
    base[h] = 32 * dense(h) when every block is full, the gaps left by hashes seen only as a short last block
    closed so ids stay dense. Each chain stops after its last trace block that another request also holds
    (the rest is unique: no request can reuse it). Mooncake's hashes are chain hashes (an id always follows
    the same id), so equal engine ids mean equal prefixes; a trace where they are not is keyed on prefixes
    (``prefix_keys``). Returns (off, ids, lengths): request r's chain is the engine blocks ids[off[r] + j // 32]
    + j % 32 for j < lengths[r]. Memory: a few bytes per trace block, never one id per engine block (a 12 MB
    file of 2,000 one-million-token prompts holds 125 M engine blocks)."""
    n = len(input_tokens)
    group = ENGINE_BLOCKS_PER_TRACE_BLOCK
    counts = np.diff(hash_off)
    if hash_ids.size == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(n, dtype=np.int64)
    keys, count = prefix_keys(hash_off, hash_ids)
    # a key is held by one request at most once (its position is part of it), so two holders = shared
    shared = (np.bincount(keys, minlength=count) >= 2)[keys]
    flat = np.flatnonzero(shared)
    del shared
    last = np.full(n, -1, dtype=np.int64)  # each request's last shared trace block (flat index)
    np.maximum.at(last, np.searchsorted(hash_off, flat, side="right") - 1, flat)
    del flat
    kept = np.where(last >= 0, last - hash_off[:-1] + 1, 0)  # trace blocks kept per request
    # the last trace block holds input - 512 * (blocks - 1) tokens: its full 16-token blocks, at most 32
    tail = np.minimum((input_tokens - TRACE_BLOCK_TOKENS * (counts - 1)) // KV_BLOCK_TOKENS, group)
    ends = (kept == counts) & (counts > 0)  # chains that keep the request's last trace block
    kept -= ends & (tail == 0)  # a last block of under 16 tokens names no engine block
    short = ends & (tail > 0)
    lengths = group * kept - np.where(short, group - tail, 0)
    off = offsets(kept)
    mask = np.zeros(hash_ids.size + 1, dtype=np.int8)  # +1 where a chain's kept blocks start, -1 where they end
    np.add.at(mask, hash_off[:-1], 1)
    np.add.at(mask, hash_off[:-1] + kept, -1)
    take = np.cumsum(mask[:-1], dtype=np.int8).view(np.bool_)
    del mask
    entry_keys = keys[take]
    del take, keys
    # engine blocks per key: 32, or the most a short last block of it holds when it is only ever one
    width = np.zeros(count, dtype=np.int64)
    entry_width = np.full(entry_keys.size, group, dtype=np.int64)
    entry_width[off[1:][short] - 1] = tail[short]
    np.maximum.at(width, entry_keys, entry_width)
    del entry_width
    ids = offsets(width)[:-1][entry_keys]
    return off, ids, lengths.astype(np.int64)


def expand_chains(
    off: np.ndarray, ids: np.ndarray, lengths: np.ndarray | None = None, group: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Chains held ``group`` engine blocks per id (request r's block j is ids[off[r] + j // group] + j % group,
    lengths[r] blocks) as one id per engine block: (off, ids). With group 1 and no lengths, the chains as given."""
    if group == 1 and lengths is None:
        return off, ids
    if lengths is None:
        lengths = np.diff(off) * group
    flat_off = offsets(lengths)
    seg, j = segment_positions(flat_off)
    return flat_off, ids[off[:-1][seg] + j // group] + j % group


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
    block_len: np.ndarray | None
    block_group: int

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
    off, ids = expand_chains(requests.block_off, requests.block_ids, requests.block_len, requests.block_group)
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
