"""vLLM V1's KV-cache manager for one full-attention group, in plain Python.

Written from vllm/v1/core/kv_cache_manager.py (KVCacheManager: get_computed_blocks, allocate_slots, free) and
vllm/v1/core/single_type_kv_cache_manager.py (SingleTypeKVCacheManager: get_num_blocks_to_allocate,
save_new_computed_blocks, allocate_new_blocks, cache_blocks, free; FullAttentionManager.find_longest_cache_hit).
"""
from __future__ import annotations

from tests.oracle.block_pool import Block, BlockPool

BLOCK = 16  # tokens per KV block (the engine's specs.KV_BLOCK_TOKENS, vLLM's default block_size)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, enable_caching: bool, merge_duplicates: bool = False) -> None:
        self.enable_caching = enable_caching
        # max_model_len: allocate_slots holds at most this many slots per request (num_tokens_need_slot); a server's
        # cache must hold it (V1 refuses to start otherwise): here the cache's capacity, as the engine takes it
        self.max_model_len = num_blocks * BLOCK
        self.pool = BlockPool(num_blocks, enable_caching, merge_duplicates)
        self.req_to_blocks: dict[int, list[Block]] = {}
        self.num_cached_block: dict[int, int] = {}

    def get_computed_blocks(self, req) -> tuple[list[Block], int]:
        """KVCacheManager.get_computed_blocks: the longest run of the request's leading blocks found in the cache,
        and the tokens they hold. The hit may cover at most num_tokens - 1 tokens (max_cache_hit_length): the last
        token is always computed to get its logits. A recompute victim's num_tokens includes what it generated.
        With caching off nothing is found."""
        if not self.enable_caching:
            return [], 0
        max_hit = req.num_tokens - 1
        hit: list[Block] = []
        # FullAttentionManager.find_longest_cache_hit: walk the block hashes in order, stop at the first miss
        for j in range(max_hit // BLOCK):
            blk = self.pool.get_cached_block(req.block_hash(j))
            if blk is None:
                break
            hit.append(blk)
        return hit, len(hit) * BLOCK

    def allocate_slots(self, req, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[Block] | None = None, num_lookahead_tokens: int = 0):
        """KVCacheManager.allocate_slots: blocks for the request's computed tokens, the cache hit, the new tokens
        and the lookahead slots; None (nothing changed) when the free queue has too few. The blocks a hit takes
        that nobody holds count against the free blocks too (get_num_blocks_to_allocate: they leave the free
        queue). On success the hit blocks are touched, new blocks come from the queue's head, and the blocks full
        after this step's tokens (not the speculative ones) are cached (cache_blocks, min(computed + new,
        num_tokens))."""
        new_computed_blocks = new_computed_blocks or []
        num_new_blocks, evictable_hits = self._blocks_to_allocate(req, num_new_tokens, num_new_computed_tokens,
                                                                  new_computed_blocks, num_lookahead_tokens)
        if num_new_blocks + evictable_hits > self.pool.get_num_free_blocks():
            return None
        held = self.req_to_blocks.setdefault(req.rid, [])
        num_computed_tokens = req.num_computed_tokens + num_new_computed_tokens
        if new_computed_blocks:  # save_new_computed_blocks
            self.pool.touch(new_computed_blocks)
            held.extend(new_computed_blocks)
            self.num_cached_block[req.rid] = len(held)
        new_blocks = self.pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        held.extend(new_blocks)
        if self.enable_caching:
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, req.num_tokens)
            self.cache_blocks(req, num_tokens_to_cache)
        return new_blocks

    def _blocks_to_allocate(self, req, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                            num_lookahead_tokens) -> tuple[int, int]:
        """SingleTypeKVCacheManager.get_num_blocks_to_allocate: (new blocks, hit blocks nobody holds)."""
        held = self.req_to_blocks.get(req.rid, ())
        need_slots = min(req.num_computed_tokens + num_new_computed_tokens + num_new_tokens + num_lookahead_tokens,
                         self.max_model_len)
        num_new_blocks = cdiv(need_slots, BLOCK) - len(held) - len(new_computed_blocks)
        return max(num_new_blocks, 0), sum(1 for b in new_computed_blocks if b.ref_cnt == 0)

    def free_blocks_needed(self, req, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=(),
                           num_lookahead_tokens=0) -> int:
        """Free blocks allocate_slots would take (for a rule that checks before allocating: V0's watermark)."""
        return sum(self._blocks_to_allocate(req, num_new_tokens, num_new_computed_tokens, list(new_computed_blocks),
                                            num_lookahead_tokens))

    def cache_blocks(self, req, num_tokens: int) -> None:
        """SingleTypeKVCacheManager.cache_blocks: the request's blocks that are full below num_tokens and not yet
        cached get their hashes."""
        held = self.req_to_blocks[req.rid]
        done = self.num_cached_block.get(req.rid, 0)
        full = num_tokens // BLOCK
        if full <= done:
            return
        self.pool.cache_full_blocks(held, [req.block_hash(j) for j in range(full)], done, full)
        self.num_cached_block[req.rid] = full

    def free(self, req) -> None:
        """KVCacheManager.free / SingleTypeKVCacheManager.free: the request's blocks go back last first
        (reversed), so its tail is evicted first; nothing is freed for a request that holds none."""
        held = self.req_to_blocks.pop(req.rid, [])
        self.num_cached_block.pop(req.rid, None)
        self.pool.free_blocks(list(reversed(held)))

    def num_blocks_held(self, req) -> int:
        return len(self.req_to_blocks.get(req.rid, ()))
