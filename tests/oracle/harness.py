"""Random small scenarios run through the engine and through the oracle (scheduler.py), compared step by step.

The oracle does not price steps: its clock is the engine's (each step starts at the engine's F_START and ends at
F_START + F_DURATION), so a request is waiting at a step if it arrived at or before that step's start, and a
session's next turn arrives its think time after the end of the step that finished its predecessor. Every step
is 1 s (tests.test_engine.const_cost) unless it swaps.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np

from batching.sim.engine import kernel as eng
from batching.sim.policy import BatchingPolicy
from tests.oracle.kv_manager import BLOCK, cdiv
from tests.oracle.scheduler import Request, Rules, Scheduler, Step

# scheduling classes: the policy each draws from (the rest of its knobs drawn per scenario)
CLASSES = {
    "chunked": dict(chunked_prefill=True),
    "whole": dict(chunked_prefill=False),
    "priority": dict(chunked_prefill=True, priority=True),
    "swap": dict(chunked_prefill=True, preemption="swap"),
    "prefix_shared": dict(chunked_prefill=True, prefix_caching=True),
    "prefix_own": dict(chunked_prefill=True, prefix_caching=True),
    "sessions": dict(chunked_prefill=True, prefix_caching=True),
    "spec": dict(chunked_prefill=True, spec_decode="ngram"),
    # an engine profile's named non-V1 rules (V0 / SGLang): run only once BatchingPolicy has the fields
    "v0_rules": dict(chunked_prefill=False, priority=True, prefill_only_steps=True, preempt_for_waiting=True,
                     watermark=0.1),
}
V0_FIELDS = ("prefill_only_steps", "preempt_for_waiting")


@dataclass
class Scenario:
    cls: str
    seed: int
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prio: np.ndarray
    chains: list  # per request, the ids of its leading blocks (shared prompts, session history)
    after: np.ndarray  # -1, or the request whose release starts this turn's think time
    think: np.ndarray
    policy: BatchingPolicy
    kv_blocks: int
    swap_cap_tokens: int

    def describe(self) -> str:
        p = self.policy
        lines = [f"class {self.cls!r}, seed {self.seed}: {len(self.prompt)} requests, kv_blocks={self.kv_blocks}, "
                 f"budget={p.max_num_batched_tokens}, max_num_seqs={p.max_num_seqs}, chunked={p.chunked_prefill}, "
                 f"priority={p.priority}, preemption={p.preemption} (swap cap {self.swap_cap_tokens} tokens), "
                 f"prefix_caching={p.prefix_caching}, spec={p.spec_decode} K={p.spec_tokens} "
                 f"A={p.spec_acceptance}, watermark={p.watermark}"]
        for r in range(len(self.prompt)):
            turn = f" turn after {self.after[r]} +{self.think[r]:g}s" if self.after[r] >= 0 else ""
            chain = f" chain {self.chains[r][:6]}{'...' if len(self.chains[r]) > 6 else ''}" if self.chains[r] else ""
            lines.append(f"  r{r}: arrival {self.arrival[r]:g} prompt {self.prompt[r]} output {self.output[r]} "
                         f"class {self.prio[r]}{turn}{chain}")
        return "\n".join(lines)


def available(cls: str) -> bool:
    """Whether the policy has the fields a class sets (the V0 rules are being added to BatchingPolicy)."""
    fields = BatchingPolicy.__dataclass_fields__
    return all(k in fields for k in CLASSES[cls])


def scenario(cls: str, seed: int) -> Scenario:
    """A random small scenario of class ``cls``: 3-30 requests of short prompts and outputs, a KV cache from the
    largest request's blocks to three times that (so preemption happens), a small budget and max_num_seqs."""
    rng = np.random.default_rng([seed, list(CLASSES).index(cls)])
    n = int(rng.integers(3, 31))
    arrival = np.cumsum(rng.choice([0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 4.0], n))
    prompt = rng.integers(1, 200, n)
    output = rng.integers(1, 40, n)
    prio = rng.integers(0, 3, n) if cls in ("priority", "v0_rules") else np.zeros(n, np.int64)
    chains: list[list[int]] = [[] for _ in range(n)]
    after = np.full(n, -1, np.int64)
    think = np.zeros(n)
    if cls == "prefix_shared":
        for r in range(n):  # three families of system prompts of 1 to 8 blocks (a prompt under 16 tokens: none)
            fam = int(rng.integers(0, 3))
            chains[r] = [1000 * fam + j for j in range(min(int(rng.integers(1, 9)), int(prompt[r]) // BLOCK))]
    if cls == "sessions":
        next_id = 10_000
        for r in range(1, n):
            p = int(rng.integers(0, r))
            if rng.random() < 0.6 and p not in after:
                after[r] = p
                think[r] = float(rng.choice([0.0, 0.5, 1.0, 3.0]))
                full = int(prompt[p] + output[p]) // BLOCK  # the previous turn's prompt and answer, named for both
                while len(chains[p]) < full:
                    chains[p].append(next_id)
                    next_id += 1
                prompt[r] = prompt[p] + output[p] + int(rng.integers(1, 60))
                chains[r] = chains[p][:full]
    spec_k = int(rng.integers(1, 4))
    need = int(np.max(cdiv(prompt + output, BLOCK))) + (cdiv(spec_k, BLOCK) if cls == "spec" else 0)
    kv_blocks = int(rng.integers(need + 1, 3 * need + 2))
    longest = int(np.max(prompt + output))
    chunked = CLASSES[cls]["chunked_prefill"]
    # without chunked prefill every prompt (and a recompute victim's prompt + output) fits one step's budget
    budget = int(rng.integers(16, 257)) if chunked else int(rng.integers(longest, longest + 300))
    kw = dict(watermark=0.0)  # V1 has none; the V0 class sets its own
    kw.update(CLASSES[cls])
    if cls == "spec":
        kw.update(spec_tokens=spec_k, spec_acceptance=float(rng.choice([0.0, 1.0])))
        # the proposer: n-gram lookup (no KV of its own) or an EAGLE head (K lookahead slots), from a stream of its
        # own so the scenario's other draws stay as they were
        kw.update(spec_decode=str(np.random.default_rng([seed, list(CLASSES).index(cls), 1]).choice(
            ["ngram", "eagle"])))
    policy = BatchingPolicy(mode="continuous", max_num_seqs=int(rng.integers(1, 9)), max_num_batched_tokens=budget,
                            **kw)
    swap_cap = int(rng.integers(0, 2 * longest)) if cls == "swap" else 0
    return Scenario(cls, seed, arrival, prompt.astype(np.int64), output.astype(np.int64), prio.astype(np.int64),
                    chains, after, think, policy, kv_blocks, swap_cap)


def run_engine(sc: Scenario) -> eng.EngineOutput:
    from batching.sim.engine.speculative import spec_for
    from batching.sim.hardware.specs import deployment
    from tests.test_engine import const_cost
    from tests.test_engine_prefix_sessions import chains as csr

    n = len(sc.prompt)
    off, ids = csr(sc.chains)
    sessions = bool((sc.after >= 0).any())
    inp = eng.inputs(sc.arrival, sc.prompt, sc.output, sc.prio, chain_off=off, chain_ids=ids,
                     after=sc.after if sessions else None, think_s=sc.think if sessions else None)
    n_classes = int(sc.prio.max()) + 1 if sc.policy.priority else 1
    knobs = sc.policy.knobs(n_classes, sc.kv_blocks, sc.swap_cap_tokens)
    spec = spec_for(sc.policy, deployment(), seed=sc.seed) if sc.policy.spec_decode != "off" else None
    assert n > 0
    return eng.run(inp, knobs, eng.Cost(*const_cost()), prefix_caching=sc.policy.prefix_caching, spec=spec)


ENGINE_COLUMNS = {"prefill": eng.S_PREFILL, "decode": eng.S_DECODE, "running": eng.S_RUNNING,
                  "preempted": eng.S_PREEMPTED, "admitted": eng.S_ADMITTED, "cached": eng.S_CACHED_TOKENS,
                  "kv_blocks": eng.S_KV_BLOCKS, "swapped": eng.S_SWAPPED, "swap_tokens": eng.S_SWAP_TOKENS,
                  "cache_blocks": eng.S_CACHE_BLOCKS}


@dataclass
class Outcome:
    """How a scenario went: ``mismatch`` is None when engine and oracle agree on every step."""

    mismatch: str | None
    steps: int
    preemptions: int = 0
    cached: int = 0  # tokens served from the cache, every admission
    victim_hits: int = 0  # of those, at re-admissions of preempted requests
    swaps: int = 0
    engine: eng.EngineOutput | None = None


def _row(si: np.ndarray, k: int) -> dict:
    return {c: int(si[k, j]) for c, j in ENGINE_COLUMNS.items()}


def requests(sc: Scenario) -> list[Request]:
    """The oracle's requests: block j of request r is named by its chain, past it by ("own", r, j)."""
    reqs = []
    for r in range(len(sc.prompt)):
        limit = int(sc.prompt[r] + sc.output[r]) // BLOCK + 1
        hashes = [sc.chains[r][j] if j < len(sc.chains[r]) else ("own", r, j) for j in range(limit)]
        reqs.append(Request(r, int(sc.prompt[r]), int(sc.output[r]), int(sc.prio[r]), hashes))
    return reqs


def run_alone(sc: Scenario, step_s: float = 1.0, max_steps: int = 100_000) -> tuple[list[Step], list[Request]]:
    """The oracle on its own clock (every step ``step_s``; idle until the next arrival): for tests of the oracle
    itself."""
    sched = Scheduler(Rules.from_policy(sc.policy, sc.kv_blocks, sc.swap_cap_tokens))
    reqs = requests(sc)
    nxt = {int(sc.after[r]): r for r in range(len(reqs)) if sc.after[r] >= 0}
    due = [(float(sc.arrival[r]), 1, r) for r in range(len(reqs)) if sc.after[r] < 0]
    heapq.heapify(due)
    steps: list[Step] = []
    t = 0.0
    while (due or sched.has_work()) and len(steps) < max_steps:
        while due and due[0][0] <= t:
            at, _, r = heapq.heappop(due)
            reqs[r].arrival_time = at
            sched.add_request(reqs[r])
        if not sched.has_work():
            t = due[0][0]
            continue
        st = sched.schedule()
        done = sched.update()
        t += step_s
        steps.append(st)
        for req in done:
            if req.rid in nxt:
                heapq.heappush(due, (t + float(sc.think[nxt[req.rid]]), 0, nxt[req.rid]))
    return steps, reqs


def compare(sc: Scenario) -> Outcome:
    """Run both and compare step by step; the first disagreement is described with the scenario, the step, and
    both sides' values."""
    out = run_engine(sc)
    si, sf = out.steps_i, out.steps_f
    # the engine's deliberate difference from V1, run by the oracle too: one cached copy per block name
    rules = replace(Rules.from_policy(sc.policy, sc.kv_blocks, sc.swap_cap_tokens), merge_duplicate_blocks=True)
    sched = Scheduler(rules)
    n = len(sc.prompt)
    reqs = requests(sc)
    nxt = {int(sc.after[r]): r for r in range(n) if sc.after[r] >= 0}
    due = [(float(sc.arrival[r]), 1, r) for r in range(n) if sc.after[r] < 0]  # (time, later turns first, r)
    heapq.heapify(due)
    o = Outcome(None, len(si), engine=out)

    def fail(k: int, what: str, st: Step | None = None) -> Outcome:
        lines = [f"engine and oracle disagree at step {k}: {what}"]
        if k < len(si):
            lines.append(f"  step {k} starts at t={sf[k, eng.F_START]:g}")
            lines.append(f"  engine: {_row(si, k)}")
        if st is not None:
            lines.append(f"  oracle: { {c: getattr(st, c) for c in Step.COLUMNS} }")
            lines.append(f"  oracle scheduled (request: tokens): {st.who}; {', '.join(st.events) or 'no events'}")
        if k > 0:
            lines.append(f"  engine step {k - 1}: {_row(si, k - 1)}")
        lines.append(sc.describe())
        o.mismatch = "\n".join(lines)
        return o

    for k in range(len(si)):
        t = float(sf[k, eng.F_START])
        while due and due[0][0] <= t:
            at, _, r = heapq.heappop(due)
            reqs[r].arrival_time = at
            sched.add_request(reqs[r])
        if not sched.has_work():
            return fail(k, "the oracle has nothing to run at this step's start")
        st = sched.schedule()
        done = sched.update()
        end = t + float(sf[k, eng.F_DURATION])
        for req in done:
            if req.rid in nxt:
                r = nxt[req.rid]
                heapq.heappush(due, (end + float(sc.think[r]), 0, r))
        o.preemptions += st.preempted
        o.cached += st.cached
        o.victim_hits += st.victim_cached
        o.swaps += st.swap_tokens > 0
        for c, j in ENGINE_COLUMNS.items():
            if int(si[k, j]) != getattr(st, c):
                return fail(k, f"{c}: engine {int(si[k, j])}, oracle {getattr(st, c)}", st)
    if sched.has_work() or due:
        return fail(len(si), f"the engine finished after {len(si)} steps; the oracle still has requests: running "
                             f"{sched.running}, waiting {len(sched.waiting)}, swapped {sched.swapped}")
    for r, req in enumerate(reqs):
        if req.num_preemptions != int(out.req_preemptions[r]):
            return fail(len(si), f"request {r} preempted {int(out.req_preemptions[r])} times by the engine, "
                                 f"{req.num_preemptions} by the oracle")
        if (req.first_cached or 0) != int(out.req_cached[r]):
            return fail(len(si), f"request {r}'s first admission found {int(out.req_cached[r])} cached tokens in "
                                 f"the engine, {req.first_cached} in the oracle")
    return o


def chunked_v1(arrival, prompt, output, chains, *, kv_blocks: int, budget: int, max_seqs: int,
               prefix_caching: bool = True) -> Scenario:
    """A given trace (one class, no sessions) under V1's chunked prefill and recompute preemption."""
    n = len(prompt)
    policy = BatchingPolicy(mode="continuous", chunked_prefill=True, max_num_batched_tokens=budget,
                            max_num_seqs=max_seqs, watermark=0.0, prefix_caching=prefix_caching)
    return Scenario("given", 0, np.asarray(arrival, float), np.asarray(prompt, np.int64),
                    np.asarray(output, np.int64), np.zeros(n, np.int64), [list(map(int, c)) for c in chains],
                    np.full(n, -1, np.int64), np.zeros(n), policy, int(kv_blocks), 0)
