"""A plain-Python reference of vLLM V1's block pool (test-only oracle for the engine's prefix cache).

The pool follows vllm/v1/core/block_pool.py and kv_cache_manager.py: GPU blocks are objects with a reference count
and an optional name; ONE free queue (kv_cache_utils.FreeKVCacheBlockQueue, here an OrderedDict) starts with every
block in order; an allocation pops the head and drops the name it finds there (_maybe_evict_cached_block); a lookup
takes the longest run of named leading blocks, leaving at least one token to compute (get_computed_blocks); a hit
block nobody holds leaves the queue (touch); a sequence names each block once it is full (cache_full_blocks, when
scheduled); a finished or preempted sequence frees its blocks last first (free: reversed), each joining the queue's
tail once nobody holds it. One difference, which the engine shares: a block named while another block holds its
name is merged into that copy, its own block freed (V1 keeps both copies).

Blocks are named by the workload's ids: request r's j-th block is chain[r][j], and past its chain ("own", r, j),
which no other request names. Nothing here is shared with the engine's code.

``serve`` runs a minimal copy of the engine's continuous scheduler around the pool (chunked prefill, recompute
preemption, one class, no watermark, every step 1 s as tests.test_engine.const_cost prices them), so hits can be
compared request by request and step by step."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BLOCK = 16  # tokens per KV block (specs.KV_BLOCK_TOKENS)


class Block:
    __slots__ = ("idx", "ref", "name")

    def __init__(self, idx: int) -> None:
        self.idx, self.ref, self.name = idx, 0, None


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.queue: OrderedDict[int, Block] = OrderedDict((b.idx, b) for b in self.blocks)
        self.cached: dict[object, Block] = {}

    def free_count(self) -> int:
        return len(self.queue)

    def evictable(self) -> int:
        return sum(1 for b in self.queue.values() if b.name is not None)

    def lookup(self, names: list) -> tuple[int, int]:
        """(m, m0): leading names cached, and how many of those blocks nobody holds."""
        m = m0 = 0
        for name in names:
            blk = self.cached.get(name)
            if blk is None:
                break
            m += 1
            m0 += blk.ref == 0
        return m, m0

    def touch(self, blk: Block) -> None:
        if blk.ref == 0:
            del self.queue[blk.idx]
        blk.ref += 1

    def allocate(self) -> Block:
        _, blk = self.queue.popitem(last=False)
        if blk.name is not None:
            del self.cached[blk.name]
            blk.name = None
        blk.ref = 1
        return blk

    def release(self, blk: Block) -> None:
        blk.ref -= 1
        if blk.ref == 0:
            self.queue[blk.idx] = blk

    def name(self, blocks: list[Block], j: int, name) -> None:
        """blocks[j] is full: name it, or merge it into the block that holds its name already."""
        other = self.cached.get(name)
        if other is None:
            self.cached[name] = blocks[j]
            blocks[j].name = name
        else:
            self.touch(other)
            self.release(blocks[j])
            blocks[j] = other


@dataclass
class Seq:
    r: int
    prompt: int
    output: int
    names: list
    kv: int = 0
    target: int = 0
    gen: int = 0
    sched: int = 0
    named: int = 0
    blocks: list = field(default_factory=list)


def _blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK)


@dataclass
class Served:
    first_hit: list[int]  # tokens served from the cache at each request's first admission
    step_hits: list[int]  # tokens served from the cache per step (first and later admissions)
    step_evictable: list[int]  # blocks only the cache holds, after each step
    preemptions: list[int]


def serve(arrival, prompt, output, chains, *, kv_blocks: int, budget: int, max_seqs: int) -> Served:
    """Requests (sorted by arrival, s) through chunked continuous batching over a pool of kv_blocks blocks."""
    n = len(arrival)
    seqs = []
    for r in range(n):
        limit = (prompt[r] + output[r] - 1) // BLOCK  # blocks it can fill (the last token's KV is never computed)
        names = [chains[r][j] if j < len(chains[r]) else ("own", r, j) for j in range(limit)]
        seqs.append(Seq(r, int(prompt[r]), int(output[r]), names, target=int(prompt[r])))
    pool = BlockPool(kv_blocks)
    first_hit = [0] * n
    preemptions = [0] * n
    admitted = [False] * n
    step_hits: list[int] = []
    step_evictable: list[int] = []
    waiting: list[Seq] = []
    run: list[Seq] = []
    t, a, released = 0.0, 0, 0

    def register(s: Seq, full: int) -> None:
        while s.named < min(full, len(s.names)):
            pool.name(s.blocks, s.named, s.names[s.named])
            s.named += 1

    def preempt(v: int) -> None:
        s = run.pop(v)
        s.sched = 0  # (victims are never scheduled yet in the step)
        for blk in reversed(s.blocks):
            pool.release(blk)
        s.blocks, s.named = [], 0
        preemptions[s.r] += 1
        s.kv, s.target = 0, s.prompt + s.gen
        waiting.insert(0, s)

    def make_room(i: int, need: int) -> bool:
        """Preempt behind run[i] (latest arrival first) until need blocks are free; False if run[i] went."""
        while need > pool.free_count():
            later = range(i + 1, len(run))
            if not later:
                preempt(i)
                return False
            v = max(later, key=lambda k: (arrival[run[k].r], -k))
            preempt(v)
        return True

    while released < n:
        while a < n and arrival[a] <= t:
            waiting.append(seqs[a])
            a += 1
        if not run and not waiting:
            t = float(arrival[a])
            continue
        tokens = 0
        preempted = sum(preemptions)
        hits = 0
        # (1) decodes, in list order
        i = 0
        while i < len(run) and run[i].kv >= run[i].target:
            s = run[i]
            if tokens >= budget:
                i += 1
                continue
            need = _blocks_for(s.kv + 1) - len(s.blocks)
            if need > pool.free_count():
                if not make_room(i, need):
                    continue
            s.blocks += [pool.allocate() for _ in range(need)]
            register(s, (s.kv + 1) // BLOCK)
            s.sched = 1
            tokens += 1
            i += 1
        # (2) prefill chunks under way
        while i < len(run):
            s = run[i]
            c = min(s.target - s.kv, budget - tokens)
            if c <= 0:
                i += 1
                continue
            need = _blocks_for(s.kv + c) - len(s.blocks)
            if need > pool.free_count():
                if not make_room(i, need):
                    continue
            s.blocks += [pool.allocate() for _ in range(need)]
            register(s, (s.kv + c) // BLOCK)
            s.sched = c
            tokens += c
            i += 1
        # (3) waiting requests, unless the step preempted
        if sum(preemptions) == preempted:
            while waiting:
                h = waiting[0]
                m, m0 = pool.lookup(h.names[:(h.target - 1) // BLOCK])
                hit = m * BLOCK
                c = min(h.target - hit, budget - tokens)
                fresh = _blocks_for(hit + c) - m
                if c <= 0 or len(run) >= max_seqs or pool.free_count() - (fresh + m0) < 0:
                    break
                waiting.pop(0)
                run.append(h)
                h.blocks = [pool.cached[name] for name in h.names[:m]]
                for blk in h.blocks:
                    pool.touch(blk)
                h.blocks += [pool.allocate() for _ in range(fresh)]
                h.named, h.kv = m, hit
                if not admitted[h.r]:
                    admitted[h.r] = True
                    first_hit[h.r] = hit
                hits += hit
                register(h, (hit + c) // BLOCK)
                h.sched = c
                tokens += c
        if tokens == 0 and sum(preemptions) == preempted:
            assert not run, "nothing runnable while sequences run (the engine calls this a deadlock)"
            t = float(arrival[a])
            continue
        t += 1.0
        keep = []
        for s in run:
            c, s.sched = s.sched, 0
            done = False
            if c > 0:
                if s.kv >= s.target:
                    s.kv += 1
                    emits = True
                else:
                    s.kv += c
                    emits = s.kv == s.target
                if emits:
                    s.gen += 1
                    done = s.gen == s.output
            if done:
                for blk in reversed(s.blocks):
                    pool.release(blk)
                s.blocks = []
                released += 1
            else:
                keep.append(s)
        run[:] = keep
        step_hits.append(hits)
        step_evictable.append(pool.evictable())
    return Served(first_hit, step_hits, step_evictable, preemptions)
