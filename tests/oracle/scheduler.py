"""vLLM V1's scheduler in plain Python, over the oracle's KV-cache manager (kv_manager.py).

Written from vllm/v1/core/sched/scheduler.py (Scheduler.schedule, _preempt_request, update_from_output) and
vllm/v1/core/sched/request_queue.py (FCFSRequestQueue, PriorityRequestQueue). The rules that are not V1's are
switches read from the policy (``Rules.from_policy``), each named where the engine's profile names it and
defaulting to V1: ``prefill_only_steps``, ``preempt_for_waiting``, ``watermark``. Swap preemption (V1 has none) follows
vLLM V0's vllm/core/scheduler.py (Scheduler._schedule_running swaps a victim out when preemption_mode is SWAP;
_schedule_swapped brings swapped groups back, oldest first, only in a step that preempted nobody, while the
budget, max_num_seqs and free blocks allow, stopping at the first that does not fit), with the host space bound
of DESIGN.md §2 (a victim that does not fit in it is recomputed).

Time is not modelled: the caller says when each step starts and ends (tests/oracle/harness.py takes the engine's
own step times), so only scheduling is compared.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from tests.oracle.kv_manager import BLOCK, KVCacheManager, cdiv


class Request:
    """vllm/v1/request.py Request, reduced to what scheduling reads: num_computed_tokens, num_tokens (prompt +
    output so far), spec_token_ids (here: how many draft tokens it carries), priority, arrival_time."""

    def __init__(self, rid: int, prompt: int, output: int, prio: int, hashes: list) -> None:
        self.rid = rid
        self.prompt = prompt
        self.max_tokens = output
        self.priority = prio
        self.arrival_time = float("nan")  # set when it arrives (a session turn's once its predecessor is released)
        self.hashes = hashes  # the name of each block it can fill
        self.num_computed_tokens = 0
        self.gen = 0  # output tokens so far
        self.spec = 0  # draft tokens proposed for its next step
        self.spec_scheduled = 0  # of the tokens scheduled in this step, draft tokens to verify
        self.target = prompt  # tokens to prefill before it decodes (prompt, + generated ones after a recompute)
        self.num_preemptions = 0
        self.first_cached = None  # tokens its first admission found in the cache
        self.host_tokens = 0  # KV tokens held in host memory while swapped out

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.gen

    def block_hash(self, j: int):
        return self.hashes[j]

    def prefilling(self) -> bool:
        return self.num_computed_tokens < self.target

    def __repr__(self) -> str:
        return f"R{self.rid}(p={self.prompt}, out={self.gen}/{self.max_tokens}, kv={self.num_computed_tokens})"


@dataclass(frozen=True)
class Rules:
    """What the oracle reads of the policy. V1's defaults: no prefill-only steps, no preemption for a waiting
    request, no watermark."""

    budget: int
    max_num_seqs: int
    chunked: bool
    priority: bool
    preemption: str  # recompute | swap
    swap_cap_tokens: int
    kv_blocks: int
    prefix_caching: bool
    spec_k: int = 0  # draft tokens proposed per decode (0: no speculation)
    spec_accept: float = 1.0  # 1.0: every draft token accepted; 0.0: none
    lookahead: int = 0  # num_lookahead_tokens: K with a proposer that keeps KV (draft model, EAGLE, MTP), else 0
    watermark_blocks: int = 0
    prefill_only_steps: bool = False
    preempt_for_waiting: bool = False
    merge_duplicate_blocks: bool = False  # the engine's block-pool rule (block_pool.py's note); V1 keeps copies

    @classmethod
    def from_policy(cls, policy, kv_blocks: int, swap_cap_tokens: int) -> "Rules":
        """The policy's knobs, and its named non-V1 rules through getattr with V1's default (the fields may not
        exist yet: the engine's profile is gaining them)."""
        spec_k = int(policy.spec_tokens) if getattr(policy, "spec_decode", "off") != "off" else 0
        if spec_k and policy.spec_acceptance not in (0.0, 1.0):
            raise ValueError(f"spec_acceptance={policy.spec_acceptance}: the oracle replays only 0.0 and 1.0")
        return cls(budget=int(policy.max_num_batched_tokens), max_num_seqs=int(policy.max_num_seqs),
                   chunked=bool(policy.chunked_prefill), priority=bool(policy.priority), preemption=policy.preemption,
                   swap_cap_tokens=int(swap_cap_tokens), kv_blocks=int(kv_blocks),
                   prefix_caching=bool(policy.prefix_caching), spec_k=spec_k,
                   spec_accept=float(policy.spec_acceptance),
                   lookahead=spec_k if getattr(policy, "spec_decode", "off") in ("draft", "eagle", "mtp") else 0,
                   watermark_blocks=int(getattr(policy, "watermark", 0.0) * kv_blocks),
                   prefill_only_steps=bool(getattr(policy, "prefill_only_steps", False)),
                   preempt_for_waiting=bool(getattr(policy, "preempt_for_waiting", False)))


@dataclass
class Step:
    """One step as the engine's step table records it (engine.state S_* columns)."""

    prefill: int = 0  # S_PREFILL
    decode: int = 0  # S_DECODE
    running: int = 0  # S_RUNNING: requests in the running list after scheduling
    preempted: int = 0  # S_PREEMPTED
    admitted: int = 0  # S_ADMITTED: taken from the waiting queue
    cached: int = 0  # S_CACHED_TOKENS: tokens the admissions found in the cache
    kv_blocks: int = 0  # S_KV_BLOCKS: blocks in use after the step
    swapped: int = 0  # S_SWAPPED: requests in host memory after the step
    swap_tokens: int = 0  # S_SWAP_TOKENS: KV tokens copied out and in
    cache_blocks: int = 0  # S_CACHE_BLOCKS: cached blocks nobody uses (in the free queue, evictable), after the step
    victim_cached: int = 0  # of ``cached``, tokens found by re-admitted preempted requests (not a column)
    spec_tokens: int = 0  # draft tokens verified (not compared: the engine's are in Spec.steps_i)
    who: dict = field(default_factory=dict)  # request -> tokens scheduled (for messages)
    events: list = field(default_factory=list)  # preemptions, swaps and admissions, in order (for messages)

    COLUMNS = ("prefill", "decode", "running", "preempted", "admitted", "cached", "kv_blocks", "swapped",
               "swap_tokens", "cache_blocks")


class WaitingQueue:
    """request_queue.FCFSRequestQueue (a deque: add_request appends, prepend_request puts a preempted request
    first) or PriorityRequestQueue (a heap of requests ordered by Request.__lt__: priority, arrival_time, then
    request_id; prepend_request is add_request, so a preempted request takes its place by arrival among its
    class). Request ids here are the request indices, in arrival order."""

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self._items: list = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self._items, (req.priority, req.arrival_time, req.rid, req))
        else:
            self._items.append(req)

    def prepend(self, req: Request) -> None:
        if self.priority:
            self.add(req)
        else:
            self._items.insert(0, req)

    def peek(self) -> Request:
        return self._items[0][-1] if self.priority else self._items[0]

    def pop(self) -> Request:
        return heapq.heappop(self._items)[-1] if self.priority else self._items.pop(0)


class Scheduler:
    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.kv = KVCacheManager(rules.kv_blocks, rules.prefix_caching, rules.merge_duplicate_blocks)
        self.waiting = WaitingQueue(rules.priority)
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.swap_used = 0
        self.scheduled: dict[int, int] = {}
        self.step: Step | None = None
        self._reqs: dict[int, Request] = {}

    def add_request(self, req: Request) -> None:
        self._reqs[req.rid] = req
        self.waiting.add(req)

    def has_work(self) -> bool:
        return bool(self.running or len(self.waiting) or self.swapped)

    # --- preemption ---------------------------------------------------------------------------------
    def _preempt(self, req: Request) -> None:
        """Scheduler._preempt_request: the request gives its blocks back (KVCacheManager.free), forgets its draft
        tokens and its computed tokens, and goes back to the waiting queue's front (FCFS) or its place by
        priority. With swap (V0: Scheduler._preempt_by_swap) its KV is copied to host memory instead, while the
        host space holds it."""
        st = self.step
        st.preempted += 1
        st.events.append(f"preempt r{req.rid}")
        req.num_preemptions += 1
        req.spec = 0
        kv_tokens = req.num_computed_tokens
        self.kv.free(req)
        if self.rules.preemption == "swap" and self.swap_used + kv_tokens <= self.rules.swap_cap_tokens:
            self.swap_used += kv_tokens
            req.host_tokens = kv_tokens
            st.swap_tokens += kv_tokens
            self.swapped.append(req)
            return
        req.num_computed_tokens = 0
        req.target = req.num_tokens
        self.waiting.prepend(req)

    def _allocate_running(self, req: Request, n: int, budget: int, i: int) -> tuple[bool, int, int]:
        """Scheduler.schedule's allocation loop for a running request: allocate_slots, and while it fails
        preempt: with priority max(running, key=(priority, arrival_time)) over the whole running list, giving
        back the tokens already granted to it in this step; otherwise self.running.pop(), the last one. When the
        victim is the request itself it is not scheduled. Every running request's allocation holds
        num_lookahead_tokens more slots (Scheduler.__init__: num_spec_tokens when the proposer is a draft model or
        EAGLE-style, use_eagle covering MTP; 0 for n-gram lookup); a waiting request's first admission holds none
        (effective_lookahead_tokens is 0 while num_computed_tokens is 0). Returns (scheduled, budget, i)."""
        while True:
            if self.kv.allocate_slots(req, n, num_lookahead_tokens=self.rules.lookahead) is not None:
                return True, budget, i
            if self.rules.priority:
                victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                pos = self.running.index(victim)
                self.running.remove(victim)
                if victim.rid in self.scheduled:
                    budget += self.scheduled.pop(victim.rid)
                if pos < i:
                    i -= 1
            else:
                victim = self.running.pop()
            self._preempt(victim)
            if victim is req:
                return False, budget, i

    # --- one scheduler pass -------------------------------------------------------------------------
    def schedule(self) -> Step:
        self.step = st = Step()
        self.scheduled = {}
        budget = self.rules.budget
        if self.rules.prefill_only_steps:
            # V0 (vllm/core/scheduler.py, Scheduler._schedule_default): waiting prompts first, unless swapped
            # groups wait; a step that admits prompts is prefill-only. Otherwise decodes, then swapped back.
            budget = self._schedule_waiting(budget)
            if st.admitted == 0:
                budget = self._schedule_running(budget)
                if st.preempted == 0:
                    self._swap_in(budget)
        else:
            budget = self._schedule_running(budget)
            # "Next, schedule the WAITING requests": only in a step that preempted nobody
            if st.preempted == 0:
                budget = self._swap_in(budget)
                self._schedule_waiting(budget)
        st.running = len(self.running)
        st.who = dict(self.scheduled)
        return st

    def _schedule_running(self, budget: int) -> int:
        """Scheduler.schedule, "First, schedule the RUNNING requests": in list order while the budget lasts,
        each its num_tokens_with_spec - num_computed_tokens (a prefill's next chunk, or a decode's token and its
        draft tokens), at most the budget left; a request that cannot get blocks ends the loop."""
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            # ("Make sure the input position does not exceed the max model len": max_model_len - 1 - computed)
            n = min(req.num_tokens + req.spec - req.num_computed_tokens, budget,
                    self.kv.max_model_len - 1 - req.num_computed_tokens)
            ok, budget, i = self._allocate_running(req, n, budget, i)
            if not ok:
                break
            self.scheduled[req.rid] = n
            budget -= n
            req.spec_scheduled = max(0, n - (req.num_tokens - req.num_computed_tokens))
            req.spec = 0  # "request.spec_token_ids = []": new ones are proposed after the step
            i += 1
        return budget

    def _swap_in(self, budget: int) -> int:
        """V0's Scheduler._schedule_swapped: swapped requests come back oldest first (by priority first with
        priority on: the policy's sort_by_priority), each needing a sequence slot, its blocks (its KV + the tokens
        it is given) and a token of the budget at least; the first that does not fit stops it. One that decodes
        runs its decode in this step; one swapped out mid-prefill takes its next chunk (the budget left; without
        chunked prefill all of its prompt, or it waits). V0 then rebuilds
        its running queue (Scheduler._schedule_chunked_prefill: self.running.extend, swapped-in decodes first,
        then swapped-in prefills, running decodes, running prefills, new prefills): a swapped-in decode goes to
        the front of the running list, in the order they came back; a swapped-in prefill goes after every
        decode, before the running prefills (the engine keeps decodes ahead of prefills, as V0's chunked
        prefill prioritizes decodes; V0 would put it before the running decodes)."""
        st = self.step
        front = 0  # decodes swapped in so far
        pre = sum(1 for r in self.running if not r.prefilling())  # where the next swapped-in prefill goes
        for req in sorted(self.swapped, key=lambda r: (r.priority if self.rules.priority else 0, r.arrival_time)):
            if len(self.running) >= self.rules.max_num_seqs or budget <= 0:
                break
            kv_tokens = req.host_tokens
            n = min(req.num_tokens - kv_tokens, budget) if req.prefilling() else 1
            if not self.rules.chunked and req.prefilling() and n < req.num_tokens - kv_tokens:
                break
            if cdiv(kv_tokens + n, BLOCK) > self.kv.pool.get_num_free_blocks():
                break
            self.swapped.remove(req)
            st.events.append(f"swap in r{req.rid}")
            self.swap_used -= kv_tokens
            req.host_tokens = 0
            st.swap_tokens += kv_tokens
            self.kv.allocate_slots(req, n)
            if req.prefilling():
                self.running.insert(pre, req)
            else:
                self.running.insert(front, req)
                front += 1
            pre += 1
            self.scheduled[req.rid] = n
            req.spec_scheduled = 0
            budget -= n
        return budget

    def _fits_watermark(self, req, n, hit_tokens, hit_blocks) -> bool:
        """V0's BlockSpaceManager.can_allocate: admission keeps ``watermark`` of the blocks free (V1 has no
        watermark: 0). As the engine's profile states it, only while something runs (V0 would refuse, NEVER, a
        prompt that cannot leave the watermark free on an empty cache)."""
        wm = self.rules.watermark_blocks
        if wm <= 0 or not self.running:
            return True
        need = self.kv.free_blocks_needed(req, n, hit_tokens, hit_blocks)
        return self.kv.pool.get_num_free_blocks() - need >= wm

    def _schedule_waiting(self, budget: int) -> int:
        """Scheduler.schedule, "Next, schedule the WAITING requests": while the budget lasts and fewer than
        max_num_seqs run, the queue's head takes its cache hit (get_computed_blocks) and the rest of its tokens
        (without chunked prefill all of them or it waits: "we can stop the scheduling here"); the first that
        allocate_slots refuses ends admission. Requests swapped out of its class or a higher one come back first
        (V0: Scheduler._schedule_default schedules prefills only while nothing is swapped)."""
        st = self.step
        while len(self.waiting) and budget > 0:
            req = self.waiting.peek()
            if any((s.priority if self.rules.priority else 0) <= (req.priority if self.rules.priority else 0)
                   for s in self.swapped):
                break
            hit_blocks, hit_tokens = self.kv.get_computed_blocks(req)
            n = req.num_tokens - hit_tokens
            if not self.rules.chunked and n > budget:
                break
            n = min(n, budget)
            if (len(self.running) >= self.rules.max_num_seqs or not self._fits_watermark(req, n, hit_tokens, hit_blocks)
                    or self.kv.allocate_slots(req, n, hit_tokens, hit_blocks) is None):
                if self.rules.preempt_for_waiting and self.rules.priority and st.admitted == 0:
                    self._preempt_for(req, n, hit_tokens, hit_blocks)
                break
            self.waiting.pop()
            self.running.append(req)
            req.num_computed_tokens = hit_tokens
            req.target = req.num_tokens
            req.spec_scheduled = 0
            self.scheduled[req.rid] = n
            budget -= n
            st.admitted += 1
            st.events.append(f"admit r{req.rid} (hit {hit_tokens})")
            st.cached += hit_tokens
            if req.num_preemptions:
                st.victim_cached += hit_tokens
            if req.first_cached is None:
                req.first_cached = hit_tokens
        return budget

    def _preempt_for(self, req, n, hit_tokens, hit_blocks) -> None:
        """``preempt_for_waiting`` (V0: Scheduler._schedule_priority_preemption; SGLang alike): running requests of
        a lower class than the waiting head are preempted, lowest class and latest arrival first, until it would
        fit (a sequence slot, its blocks, the watermark), or none is left; nobody is admitted in that step."""
        while True:
            fits = (len(self.running) < self.rules.max_num_seqs and self._fits_watermark(req, n, hit_tokens, hit_blocks)
                    and self.kv.free_blocks_needed(req, n, hit_tokens, hit_blocks)
                    <= self.kv.pool.get_num_free_blocks())
            lower = [r for r in self.running if r.priority > req.priority]
            if fits or not lower:
                return
            victim = max(lower, key=lambda r: (r.priority, r.arrival_time))
            self.running.remove(victim)
            self.scheduled.pop(victim.rid, None)
            self._preempt(victim)

    # --- the step's outcome -------------------------------------------------------------------------
    def update(self) -> list[Request]:
        """Scheduler.update_from_output: each scheduled request's tokens are computed. A prefill chunk advances
        num_computed_tokens and, when it completes, samples a token; a decode samples one token plus its accepted
        draft tokens (the rejected ones are taken off num_computed_tokens), at most up to max_tokens (the request
        stops there). After the step the proposer gives every request that sampled and goes on spec_k draft
        tokens. Finished requests free their blocks (_free_request). Returns them."""
        st = self.step
        done = []
        for rid, n in self.scheduled.items():
            req = self._reqs[rid]
            sampled = 0
            if req.prefilling():
                req.num_computed_tokens += n
                st.prefill += n
                if req.num_computed_tokens >= req.target:
                    sampled = 1
            else:
                k = req.spec_scheduled
                st.spec_tokens += k
                accepted = k if self.rules.spec_accept >= 1.0 else 0
                req.num_computed_tokens += n - (k - accepted)
                sampled = min(1 + accepted, req.max_tokens - req.gen)
                st.decode += sampled
            req.gen += sampled
            if req.gen >= req.max_tokens:
                self.running.remove(req)
                self.kv.free(req)
                done.append(req)
            elif sampled and self.rules.spec_k:
                req.spec = self.rules.spec_k
        if self.rules.preemption == "swap":
            # V0 (vllm/core/scheduler.py, _schedule_chunked_prefill) rebuilds its running queue by kind every step,
            # decodes first under chunked prefill: a request swapped back in mid-prefill that finishes its prefill
            # ahead of a running prefill goes before it from the next step on
            self.running = ([r for r in self.running if not r.prefilling()]
                            + [r for r in self.running if r.prefilling()])
        st.kv_blocks = self.kv.pool.blocks_in_use()
        st.cache_blocks = self.kv.pool.cached_free_blocks()
        st.swapped = len(self.swapped)
        return done
