"""vLLM V1's block pool, in plain Python (the oracle's lowest layer).

Written from vllm/v1/core/block_pool.py (class BlockPool) and vllm/v1/core/kv_cache_utils.py (KVCacheBlock,
FreeKVCacheBlockQueue). A block's "hash" here is the name the workload gives it: a chain id shared by requests
with the same leading tokens, or ("own", request, index) for a block no other request can produce; vLLM hashes the
block's tokens and its parent's hash, which names equal prefixes alike in the same way.

One simplification: vLLM takes one block out of the pool as its null block at start-up (BlockPool.__init__); the
oracle's pool has exactly the blocks the engine's KV capacity counts.

One named rule that is not V1's, ``merge_duplicates`` (off by default; tests/oracle/harness.py turns it on to compare
with the engine): a block that becomes full while another block already holds its hash is merged into that copy:
the request takes a reference to the cached copy in its place and gives its own block back, without a hash, to
the free queue's tail. V1 keeps both copies (block_pool.py, BlockPool.cache_full_blocks: "We currently don't
de-duplicate", so block tables stay append-only; get_cached_block returns the first copy). The engine merges on
purpose, as vLLM V0's prefix-caching block allocator does (vllm/core/block/prefix_caching_block.py,
PrefixCachingBlockAllocator.promote_to_immutable_block: a block whose content hash is already cached is replaced
by the cached block id and its own is freed) and SGLang's radix cache does (python/sglang/srt/mem_cache/
radix_cache.py, RadixCache.cache_finished_req: the KV indices of the part insert finds already in the tree are
freed, the tree's kept): one cached copy per name keeps its tables indexed by block name (docs/ARCHITECTURE.md, Prefix
caching, "One difference from V1"). The difference shows as one more free block per merge while both copies
would be held, and in which copy a later lookup finds.
"""
from __future__ import annotations

from collections import OrderedDict


class Block:
    """kv_cache_utils.KVCacheBlock: an id, a reference count and, once full and cached, a hash."""

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeQueue:
    """kv_cache_utils.FreeKVCacheBlockQueue: every block nobody references, in eviction order. It starts with all
    blocks in id order (__init__); popleft takes the head (the next to be reused), remove takes a block out of the
    middle when a cache hit claims it (BlockPool.touch), append puts a freed block at the tail. An OrderedDict by
    block id gives the same order as vLLM's doubly linked list."""

    def __init__(self, blocks: list[Block]) -> None:
        self._q: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._q)

    def popleft(self) -> Block:
        return self._q.popitem(last=False)[1]

    def remove(self, block: Block) -> None:
        del self._q[block.block_id]

    def append(self, block: Block) -> None:
        self._q[block.block_id] = block

    def blocks(self) -> list[Block]:
        return list(self._q.values())


class BlockPool:
    """block_pool.BlockPool: the GPU blocks, the free queue and the hash -> cached blocks index."""

    def __init__(self, num_blocks: int, enable_caching: bool, merge_duplicates: bool = False) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.merge_duplicates = merge_duplicates  # the engine's rule (the module's note); V1: False
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeQueue(self.blocks)
        # BlockPool.cached_block_hash_to_block: a hash maps to EVERY block that holds it (block id -> block).
        # cache_full_blocks does not de-duplicate: two requests that computed the same block at once keep
        # their own copies (block tables stay append-only), and a lookup takes any one of them.
        self.cached: dict[object, dict[int, Block]] = {}

    def get_num_free_blocks(self) -> int:
        """BlockPool.get_num_free_blocks: the free queue's length (cached blocks nobody uses included)."""
        return len(self.free_queue)

    def get_cached_block(self, block_hash) -> Block | None:
        """BlockPool.get_cached_block: a block holding this hash, or None (the first of its copies)."""
        copies = self.cached.get(block_hash)
        if not copies:
            return None
        return next(iter(copies.values()))

    def cache_full_blocks(self, blocks: list[Block], hashes: list, num_cached: int, num_full: int) -> None:
        """BlockPool.cache_full_blocks: blocks[num_cached:num_full] have just become full: each takes its hash and
        enters the index beside any other copy of it. With ``merge_duplicates`` (the engine's rule, the module's
        note) a block whose hash another block holds is replaced in ``blocks`` (the request's block list) by that
        copy, touched, and its own block goes back to the free queue's tail without a hash."""
        for j in range(num_cached, num_full):
            blk = blocks[j]
            if blk.block_hash is not None:  # (a block taken from the cache by get_computed_blocks)
                continue
            if self.merge_duplicates:
                copy = self.get_cached_block(hashes[j])
                if copy is not None:
                    self.touch([copy])
                    blocks[j] = copy
                    self.free_blocks([blk])
                    continue
            blk.block_hash = hashes[j]
            self.cached.setdefault(hashes[j], {})[blk.block_id] = blk

    def _maybe_evict_cached_block(self, blk: Block) -> None:
        """BlockPool._maybe_evict_cached_block: a reused block loses its hash and leaves the index."""
        h = blk.block_hash
        if h is None:
            return
        copies = self.cached[h]
        del copies[blk.block_id]
        if not copies:
            del self.cached[h]
        blk.block_hash = None

    def get_new_blocks(self, n: int) -> list[Block]:
        """BlockPool.get_new_blocks: n blocks from the free queue's head; with caching on each drops the hash it
        held (evicted); each gets a reference."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot get {n} free blocks from the pool ({len(self.free_queue)} free)")
        out = []
        for _ in range(n):
            blk = self.free_queue.popleft()
            if self.enable_caching:
                self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def touch(self, blocks: list[Block]) -> None:
        """BlockPool.touch: a cache hit takes a reference; a block nobody held leaves the free queue (it is no
        longer a candidate for eviction)."""
        for blk in blocks:
            if blk.ref_cnt == 0:
                self.free_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered: list[Block]) -> None:
        """BlockPool.free_blocks: drop one reference from each block, in the order given (the caller passes a
        request's blocks last first); those nobody holds any more join the free queue's tail in that order, so a
        chain's tail is evicted before its head. Their hashes stay: a later lookup can still hit them."""
        for blk in ordered:
            blk.ref_cnt -= 1
        for blk in ordered:
            if blk.ref_cnt == 0:
                self.free_queue.append(blk)

    def blocks_in_use(self) -> int:
        """Blocks some request references (the engine's S_KV_BLOCKS)."""
        return self.num_blocks - len(self.free_queue)

    def cached_free_blocks(self) -> int:
        """Blocks in the free queue that still hold a hash (evictable cache: the engine's S_CACHE_BLOCKS)."""
        return sum(1 for b in self.free_queue.blocks() if b.block_hash is not None)
