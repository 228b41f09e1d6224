"""The engine's vocabulary (DESIGN §2): its integer enums and table columns, in one place, and
the NamedTuples its stages share instead of long argument lists.

Everything here is plain data: the jitted code in kernel.py and stages.py reads these
constants at compile time (so this file is one of kernel_cache.KERNEL_SOURCES), and
policy.py names the mode and preemption codes from them.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# --- enums ----------------------------------------------------------------------------
# batching modes (policy.MODE_CODE names them)
MODE_STATIC = 0
MODE_DYNAMIC = 1
MODE_CONTINUOUS = 2
# preemption kinds (policy.PREEMPTION_CODE names them)
PREEMPT_OFF = 0
PREEMPT_RECOMPUTE = 1
PREEMPT_SWAP = 2
# return codes of run_nb
OK = 0
OUT_OF_STEPS = -1
DEADLOCK = -2

# --- per-step output columns: int64 table (steps_i) and float64 table (steps_f) -------
S_PREFILL = 0  # useful prompt tokens computed
S_DECODE = 1  # useful decode tokens computed
S_PADDED = 2  # padded / finished slots computed for nothing
S_RUNNING = 3  # sequences in the batch
S_WAITING = 4  # arrived requests not yet admitted (after the step)
S_KV_BLOCKS = 5  # KV blocks held (reserved, for request-level modes), after the step
S_SWAPPED = 6  # sequences whose KV sits in host memory, after the step
S_LM = 7  # sequences that emitted a useful token
S_SWAP_TOKENS = 8  # KV tokens copied over PCIe in this step (out and in)
S_PREEMPTED = 9  # sequences preempted in this step
S_ADMITTED = 10  # requests taken from the waiting queue into the batch (first time, or again after recompute)
S_STALLED = 11  # sequences past their prefill that got no token in this step (generation stalls)
S_CACHED_TOKENS = 12  # prompt tokens served from the prefix cache at this step's admissions (not computed)
S_CACHE_BLOCKS = 13  # KV blocks held only by the prefix cache (no running user; evictable), after the step
NUM_SI = 14
F_START = 0
F_DURATION = 1
F_ATTN_WORK = 2  # useful sum of chunk * (context + chunk / 2)
F_DECODE_CTX = 3  # useful sum of decode contexts read
NUM_SF = 4
# speculative decoding's own per-step tables (Spec.steps_i / steps_f, allocated only when it is on: wider rows in
# the main tables would slow every run). A speculating decode verifies its k proposed draft tokens plus one; it
# emits its accepted ones plus one (S_DECODE), the rejected ones are computed for nothing (S_PADDED)
SP_SEQS = 0  # decoding sequences that speculated (verified k >= 1 draft tokens) in this step
SP_PROPOSED = 1  # draft tokens proposed (and verified) in this step
SP_ACCEPTED = 2  # of those, accepted
NUM_SPI = 3
SPF_CTX = 0  # sum of the contexts of the speculating sequences (the draft reads its own KV)
SPF_DRAFT_S = 1  # seconds of the step spent drafting (draft model or head passes), included in F_DURATION
NUM_SPF = 2

# --- per-request output columns (float64 table) -----------------------------------------
R_FIRST_SCHED = 0
R_FIRST_TOKEN = 1
R_FINISH = 2
R_RELEASE = 3
R_MAX_ITL = 4
R_ARRIVAL = 5  # when it joined the waiting queue: arrival_s, or for a session's later turn its predecessor's release + think time
NUM_RF = 6

# --- a continuous run's scalars between calls of engine.advance_nb (Run.c) ---------------
C_A = 0  # next open-loop request to arrive (n in a fleet: the router hands requests over)
C_RELEASED = 1  # requests released
C_STEP = 2  # steps written
NUM_C = 3
# --- what a fleet's router reads of a replica (fleet.py): its state at its last scheduling pass ---------
V_OUTSTANDING = 0  # requests running, waiting or swapped (those the step in flight finishes still count)
V_KV = 1  # KV blocks held
NUM_V = 2

# --- inter-token-latency histogram: fixed log-spaced bins --------------------------------
ITL_BINS = 120
ITL_LO_S = 1e-3
ITL_HI_S = 1e2
# bin of a gap = (log(gap) - ITL_LOG_LO) * ITL_BINS_PER_LOG (compile-time constants)
ITL_LOG_LO = float(np.log(ITL_LO_S))
ITL_BINS_PER_LOG = float(ITL_BINS / (np.log(ITL_HI_S) - np.log(ITL_LO_S)))

# --- counters of the continuous engine's batch (Batch.n) ---------------------------------
B_RUNNING = 0  # sequences in the running list, run[:n[B_RUNNING]]
B_SWAPPED = 1  # sequences whose KV sits in host memory, swapped[:n[B_SWAPPED]]
B_WAITING = 2  # requests in the waiting queues
B_FREE = 3  # GPU KV blocks no running sequence uses (the evictable cached ones included)
B_SWAP_USED = 4  # KV tokens held in host memory
B_EVICTABLE = 5  # cached blocks no running sequence uses (counted in B_FREE too: reclaimed, LRU first, when needed)
B_LATER = 6  # session turns in the heap of arrivals not yet due (Later)
NUM_B = 7


def itl_bin_edges() -> np.ndarray:
    """Edges of the inter-token-latency histogram (s); gaps outside fall in the end bins."""
    return np.logspace(np.log10(ITL_LO_S), np.log10(ITL_HI_S), ITL_BINS + 1)


# --- NamedTuples (numba passes them to jitted functions as typed tuples) -------------------
class Inputs(NamedTuple):
    """Per-request inputs, sorted by arrival."""

    arrival: np.ndarray  # float64, seconds
    prompt: np.ndarray  # int64 tokens
    output: np.ndarray  # int64 tokens
    prio: np.ndarray  # int64 class, 0 highest
    after: np.ndarray  # int64: -1, or the request whose release starts this one's think time (sessions)
    think: np.ndarray  # float64 seconds from that release to this arrival
    chain_off: np.ndarray  # int64 (n + 1): request r's KV block ids are named by chain_ids[chain_off[r]:chain_off[r + 1]]
    chain_ids: np.ndarray  # int64 dense block ids (prefix caching), each naming 2^chain_shift blocks: id, id + 1, ...
    ready: np.ndarray  # int64: prompt tokens whose KV arrives with the request (a decode instance of a disaggregated
    #                    deployment: the prefill instance computed them), held from its first admission on; 0 otherwise
    chain_len: np.ndarray  # int64: blocks in request r's chain; its j-th is chain_ids[chain_off[r] + (j >> chain_shift)]
    #                        + j % 2^chain_shift (engine_stages.chain_id_nb): a Mooncake trace's 512-token hashes
    #                        name 32 blocks each (chain_shift 5), held once, not as 32 ids
    chain_shift: int
    own_base: np.ndarray  # int64: the id of request r's block j past its chain (its own blocks, prompt then output:
    #                       no other request names them) is own_base[r] + j - chain_len[r] (engine_stages.block_id_nb)
    n_ids: int  # ids the blocks of all requests name: chain ids, then every request's own ones (kernel.inputs)


class Knobs(NamedTuple):
    """The policy and the cache, as scalars."""

    mode: int  # MODE_*
    n_classes: int
    max_batch: int  # static / dynamic
    max_wait_s: float  # dynamic
    max_seqs: int  # continuous: sequences per step
    budget: int  # continuous: tokens per step
    chunked: bool
    use_prio: bool
    preempt: int  # PREEMPT_*
    swap_cap_tokens: int  # host swap space, in KV tokens
    watermark_blocks: int  # blocks kept free when admitting (vLLM V0's watermark; V1 keeps none)
    kv_blocks: int  # GPU KV capacity
    prefill_only: bool = False  # without chunked prefill, a step that admits prompts is prefill-only (vLLM V0, SGLang)
    wait_preempt: bool = False  # vLLM V0's rule with priority: preempt lower classes so a waiting request can be admitted


class Cost(NamedTuple):
    """Cost-model coefficients and the all-reduce table (costmodel.CostModel)."""

    coef: np.ndarray
    ar_x: np.ndarray
    ar_y: np.ndarray


class Outputs(NamedTuple):
    """What the engine writes: preallocated by engine.run, trimmed after."""

    req_f: np.ndarray  # (n, NUM_RF) seconds; R_FIRST_SCHED .. R_RELEASE start at -1
    req_pre: np.ndarray  # (n,) preemptions per request
    req_cached: np.ndarray  # (n,) prompt tokens served from the prefix cache at its first admission
    steps_i: np.ndarray  # (room, NUM_SI)
    steps_f: np.ndarray  # (room, NUM_SF)
    hist: np.ndarray  # (classes, ITL_BINS) inter-token gaps


class Seqs(NamedTuple):
    """Working state per request (continuous batching)."""

    cls: np.ndarray  # queue class: the priority class with priority on, else 0
    kv: np.ndarray  # tokens whose KV is stored (GPU or host)
    target: np.ndarray  # tokens to prefill before decoding (prompt, + generated after a recompute)
    gen: np.ndarray  # output tokens produced
    blocks: np.ndarray  # GPU blocks held (shared cached blocks included)
    pb: np.ndarray  # of those, the leading blocks it holds as named, cached blocks (prefix caching): every full one
    plim: np.ndarray  # blocks it may name: all it can fill, (prompt + output - 1) // 16 (the last token's KV is never computed)
    sched: np.ndarray  # tokens scheduled in the current step
    last_tok: np.ndarray  # time of the last token (float64)


class Queues(NamedTuple):
    """Waiting requests: one FIFO per class (one in all without priority), ring buffers in one array."""

    buf: np.ndarray
    off: np.ndarray  # start of class k's ring in buf
    cap: np.ndarray  # its size
    head: np.ndarray
    len: np.ndarray


class Batch(NamedTuple):
    """The running and swapped sequences, and the counters of the KV cache (B_*)."""

    run: np.ndarray  # running list: past their prefill first, then prefills under way; each in admission order
    swapped: np.ndarray  # sequences whose KV sits in host memory (unordered)
    n: np.ndarray  # int64 counters, indexed by B_*
    done: np.ndarray  # the sequences the last step finished (for the prefix cache and sessions: finish_nb)


class Prefix(NamedTuple):
    """The prefix cache as vLLM V1's block pool (vllm/v1/core/block_pool.py, kv_cache_utils.FreeKVCacheBlockQueue):
    every full block a request computed is named (Inputs: its chain id, or an id of its own), and a named block
    counts how many running sequences hold it. The free blocks form ONE queue, allocation taking its head: the
    named ones nobody holds (evictable: allocation drops the name) in a doubly linked list, the anonymous ones
    (never used, a request's partial last block) as counts, ``gap[s]`` of them just before named slot s and
    ends[4] after the tail, so the queue keeps V1's order without one entry per physical block. The state is kept
    per slot (engine_stages' prefix cache section): slot = id when ``index`` is empty, else a slot found through
    the hash table ``index`` (``prefix_tables``)."""

    ref: np.ndarray  # int32 per slot: running sequences holding its block; -d for a queued dead run of d finished
    #                 own blocks (engine_stages' note on lazy naming)
    cached: np.ndarray  # bool per slot: a GPU block holds it (the direct tables' membership test)
    prev: np.ndarray  # int32 per slot: free-queue neighbours among the named blocks (-1 none)
    next: np.ndarray
    ends: np.ndarray  # int64 (6,): queue head and tail named slots (-1 when none), the hash's shift, free slots left,
    #                   anonymous free blocks after the tail, anonymous free blocks in all
    key: np.ndarray  # int32 per slot: the block id it holds, -1 when free (hashed tables; empty for direct ones)
    index: np.ndarray  # int32 per bucket, a power of two of them: a slot, or -1 (empty); empty for direct tables
    free: np.ndarray  # int32: the free slots, ends[3] of them (hashed tables)
    hashed: np.ndarray  # empty int8, 1-D for hashed tables, 2-D for tables by id: a flag in the type (numba makes
    #                     ndim a constant), so each kind of tables compiles without the other's code
    gap: np.ndarray  # int32 per slot: anonymous free blocks queued just before it (while it is queued)


# prefix tables are indexed by block id up to this many ids per GPU block, or DIRECT_IDS ids over all instances
DIRECT_IDS_PER_KV_BLOCK = 16
DIRECT_IDS = 1 << 22


def prefix_tables(n_ids: int, kv_blocks: int, instances: int | None = None) -> Prefix:
    """Prefix-cache tables for blocks named 0 .. n_ids - 1 (Inputs.n_ids: chain ids and every request's own ones) on
    a GPU cache of kv_blocks blocks (one set, or ``instances`` stacked: row i is instance i's). Indexed by id (17
    bytes an id) while there are at most DIRECT_IDS_PER_KV_BLOCK ids per GPU block or DIRECT_IDS in all; past that
    a hash table with a slot per block that can be named at once: at most kv_blocks (a name is held by one GPU
    block, in use or queued; 2 x kv_blocks are allocated), 64-80 bytes a GPU block however many ids the requests
    name (the shipped Mooncake trace's own blocks alone name ~13 M). Both give the same runs; the hashed ones are
    up to ~25 % slower where lookups dominate."""
    lead = () if instances is None else (instances,)
    direct = n_ids <= DIRECT_IDS_PER_KV_BLOCK * kv_blocks or n_ids * (instances or 1) <= DIRECT_IDS
    slots = n_ids if direct else 2 * kv_blocks + 64
    buckets = 0 if direct else 1 << (2 * slots - 1).bit_length()  # a power of two >= 2 x slots: half full at most
    index_dt = np.int32 if max(slots, n_ids) < 2**31 else np.int64
    ends = np.full(lead + (6,), -1, np.int64)
    ends[..., 2] = 64 - (buckets.bit_length() - 1) if buckets else 0  # bucket: the hash's top log2(buckets) bits
    ends[..., 3] = 0 if direct else slots
    ends[..., 4] = kv_blocks  # every block free, never used: anonymous, in the queue (V1 starts it with all blocks)
    ends[..., 5] = kv_blocks
    return Prefix(np.zeros(lead + (slots,), index_dt), np.zeros(lead + (slots,), np.bool_),
                  np.empty(lead + (slots,), index_dt), np.empty(lead + (slots,), index_dt), ends,
                  np.full(lead + ((0 if direct else slots),), -1, index_dt), np.full(lead + (buckets,), -1, index_dt),
                  np.empty(lead + ((0 if direct else slots),), index_dt) if direct else  # slot 0 taken first
                  np.broadcast_to(np.arange(slots - 1, -1, -1, dtype=index_dt), lead + (slots,)).copy(),
                  np.empty(lead + ((0, 0) if direct else (0,)), np.int8), np.zeros(lead + (slots,), np.int32))


class Spec(NamedTuple):
    """Speculative decoding (speculative.spec_for builds it; None when off, and the kernels are then compiled
    without it). Each step, a decoding sequence proposes k = min(K, budget left - 1) draft tokens while fewer than
    ``disable_at`` sequences run (as vLLM V1, whatever it still owes: what is accepted past its output is dropped);
    acceptance per token with probability A."""

    k: int  # K, draft tokens proposed per sequence and step
    inv_log_a: float  # 1 / ln A (accepted = floor(ln U / ln A) capped at k, U uniform on (0, 1]: P(>= j) = A^j)
    disable_at: int  # speculate only while fewer than this many sequences run (vLLM speculative_disable_by_batch_size)
    seed: int  # np.random.seed of the run: sampled acceptance is deterministic for a seed
    drafts: bool  # whether proposing costs draft passes (draft model, EAGLE head, MTP module; not n-gram lookup)
    draft_tab: np.ndarray  # seconds of one draft pass by the number of tokens it runs over (0 .. budget + max
    #                        seqs): its fixed cost (launch, sampling), linear layers, element-wise ops and all-reduces
    #                        (the draft cost model's token_time_nb + speculative.DRAFT_PASS_FIXED_S for n >= 1)
    draft_ctx_s: float  # seconds per context token a draft pass reads (its own KV cache: layers x bytes / bandwidth)
    draft_lm_flops_s: float  # seconds per sequence of the draft's LM head at its compute roofline
    draft_lm_bytes_s: float  # seconds of the draft's LM head weight read
    draft_attn_s: float  # seconds per unit of prompt attention work (F_ATTN_WORK) in the draft's first pass
    emit: np.ndarray  # int64 per request: tokens the current step emits for it when it speculates (accepted + 1)
    req_acc: np.ndarray  # int64 per request: accepted draft tokens over the run (an output)
    steps_i: np.ndarray  # (room, NUM_SPI) int64, SP_* columns (an output, trimmed like Outputs.steps_i)
    steps_f: np.ndarray  # (room, NUM_SPF) float64, SPF_* columns


class Run(NamedTuple):
    """A continuous run's working state, kept between calls of engine.advance_nb (one per replica in a fleet)."""

    seqs: Seqs
    q: Queues
    b: Batch
    tab: np.ndarray  # float64: step time by token count
    c: np.ndarray  # int64 (NUM_C,): C_* scalars
    t: np.ndarray  # float64 (1,): the clock, the end of the last step


class Handoff(NamedTuple):
    """The requests the instances of one role of a split released, in order, and when (a prefill instance hands
    them over to decode instances; a decode instance's release starts a closed-loop client's think time), and for
    prefill instances the blocks each still holds for them: a released request keeps its KV blocks until the
    time the split's loop pushes into its instance's min-heap of hold ends (when a decode instance has taken it in).
    A decode role's heaps have no room (``ht`` of width 0): its releases free their blocks at once."""

    r: np.ndarray  # int64 request
    t: np.ndarray  # float64 release time
    n: np.ndarray  # int64 (1,): entries written
    ht: np.ndarray  # float64 (instances, room): per instance, the heap of hold ends (room 0: no holds)
    hr: np.ndarray  # int64 (instances, requests): the request of each entry
    hn: np.ndarray  # int64 (instances,): entries in each instance's heap
    i: np.ndarray  # int64 (1,): the instance being advanced (engine.kernel.advance_nb reads its row)


class Later(NamedTuple):
    """Session turns whose arrival time is known but not yet due: a binary min-heap on time."""

    t: np.ndarray  # float64
    r: np.ndarray  # int64 request
    nxt: np.ndarray  # int64 per request: the session turn its release starts the think time of, or -1
