"""Multi-turn chat sessions: how many turns, how long users think, how long their next message is, and the
request arrays a set of sessions becomes (closed-loop order, growing prompts, chains that reuse the history).

Turn k's prompt is the whole history (every earlier prompt and answer) plus a new message; it arrives a think
time after turn k - 1's answer is released (``Requests.after`` / ``think_s``). Numpy only: workload.py builds
``SyntheticWorkload`` sessions from these pieces.

Sources of the default ``SessionSpec`` (round figures; the shapes, geometric turns and log-normal times and
lengths, are modelling choices, not measured fits):

- Turns per conversation: 2.0 on average in LMSYS-Chat-1M (1M real conversations with 25 LLMs, Zheng et al.,
  ICLR 2024, Table 1 / the dataset card, https://huggingface.co/datasets/lmsys/lmsys-chat-1m); Magpie's
  comparison table (Xu et al., ICLR 2025, arXiv 2406.08464, Table 4) counts 2.01 for LMSYS-Chat-1M, 2.52 for
  WildChat and 4.79 for ShareGPT, whose users kept the longer conversations.
- New-message length: 69.5 tokens per user prompt, 214.5 per answer in LMSYS-Chat-1M (same Table 1); the only
  published spread is Magpie's per-turn 260 +- 347 tokens (CV ~1.3) for the same data.
- Think time (answer released -> next turn sent): in a production chatbot trace (Alibaba Bailian, qwen3-max
  chat, 42,228 inter-turn gaps over 32,262 multi-turn sessions) p25 4.9 s, p50 7.2 s, p75 8.2 s, p90 15 s,
  p99 43 s, as measured in the gahow/agentic-kvc repository (commit 876d09db83, "Add chatbot T_external CDF").
  A log-normal through p50 ~7 s and p90 ~15 s has mean ~8.5 s and CV ~0.6 (its p99, ~27 s, is lighter than the
  trace's 43 s).
- Context cap: 32,768 tokens, Qwen2.5-72B-Instruct's context (``max_position_embeddings`` in its config.json),
  the default model: a session ends before a turn whose prompt + answer would pass it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batching.sim.checks import check_int, check_range
from batching.sim.workload.prefixes import two_part_chains
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.traces import MAX_TOKENS

SESSION_CONTEXT_CAP_TOKENS = 32_768  # Qwen2.5-72B-Instruct's context length (the default model)
MAX_MEAN_TURNS = 100.0
MAX_TURNS = 1000
MAX_THINK_S = 86_400.0  # a day
MAX_SESSION_CV = 20.0


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    """n log-normal draws with that mean and coefficient of variation (all equal to mean when cv = 0)."""
    sigma = math.sqrt(math.log1p(cv**2))
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, size=n)


@dataclass(frozen=True)
class SessionSpec:
    """The shape of multi-turn sessions (see the module docstring for the sources of the defaults).

    Turns per session: geometric with mean ``mean_turns`` (P(1 turn) = 1 / mean_turns), cut at ``max_turns``.
    Think time: log-normal, mean ``think_mean_s``, CV ``think_cv``. New messages after the first turn:
    log-normal tokens, mean ``message_mean_tokens``, CV ``message_cv``, rounded and clipped to
    [message_low, message_high]; the first turn's prompt and every answer come from the request's class.
    A session stops before a turn whose prompt + answer would pass ``context_cap_tokens``.
    """

    mean_turns: float = 2.0  # LMSYS-Chat-1M
    max_turns: int = 64
    think_mean_s: float = 8.5  # production chatbot: p50 ~7 s, p90 ~15 s
    think_cv: float = 0.6
    message_mean_tokens: float = 70.0  # LMSYS-Chat-1M: 69.5 tokens per user prompt
    message_cv: float = 1.3  # Magpie's 260 +- 347 tokens per LMSYS-Chat-1M turn
    message_low: int = 1
    message_high: int = 4096
    context_cap_tokens: int = SESSION_CONTEXT_CAP_TOKENS

    def validate(self) -> None:
        check_range("mean_turns", self.mean_turns, 1, MAX_MEAN_TURNS)
        check_int("max_turns", self.max_turns, 1, MAX_TURNS)
        check_range("think_mean_s", self.think_mean_s, 0, MAX_THINK_S)
        check_range("think_cv", self.think_cv, 0, MAX_SESSION_CV)
        check_range("message_mean_tokens", self.message_mean_tokens, 1, MAX_TOKENS)
        check_range("message_cv", self.message_cv, 0, MAX_SESSION_CV)
        check_int("message_low", self.message_low, 1, MAX_TOKENS)
        check_int("message_high", self.message_high, int(self.message_low), MAX_TOKENS)
        check_int("context_cap_tokens", self.context_cap_tokens, 2, MAX_TOKENS)

    def sample_turns(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Turns wanted by n sessions (before the context cap), int64 in 1..max_turns."""
        turns = rng.geometric(1.0 / self.mean_turns, size=n) if self.mean_turns > 1 else np.ones(n)
        return np.minimum(turns, self.max_turns).astype(np.int64)

    def sample_think_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.think_mean_s == 0:
            return np.zeros(n)
        return _lognormal(rng, self.think_mean_s, self.think_cv, n)

    def sample_message_tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = np.rint(_lognormal(rng, self.message_mean_tokens, self.message_cv, n))
        return np.clip(raw, self.message_low, self.message_high).astype(np.int64)


# ---------------------------------------------------------------- arrays of a set of sessions


def turn_positions(turns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flattened turns, session by session: (session of each turn, its turn number from 0)."""
    session = np.repeat(np.arange(turns.size, dtype=np.int64), turns)
    starts = np.zeros(turns.size, dtype=np.int64)
    np.cumsum(turns[:-1], out=starts[1:])
    return session, np.arange(session.size, dtype=np.int64) - starts[session]


def grow_prompts(
    first_prompt: np.ndarray, turns: np.ndarray, output: np.ndarray, message: np.ndarray, cap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of every wanted turn (flattened by session) and the turns that fit under the cap.

    prompt[0] = first_prompt; prompt[k] = prompt[k - 1] + output[k - 1] + message[k]. A session keeps its turns
    up to the first whose prompt + output passes ``cap``. Returns (prompt per wanted turn, kept mask, turns
    kept per session)."""
    session, k = turn_positions(turns)
    step = output + np.where(k > 0, message, 0)  # tokens turn k adds to the context: its message and answer
    context = np.cumsum(step)  # running total over all sessions
    before = context[np.flatnonzero(k == 0)] - step[k == 0]  # the total before each session's first turn
    total = first_prompt[session] + context - before[session]  # prompt + output of each turn
    prompt = total - output
    kept = total <= cap
    # a session ends at its first turn past the cap (totals only grow, so no later turn fits either)
    first_past = np.full(turns.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_past, session[~kept], k[~kept])
    kept &= k < first_past[session]
    kept_turns = np.minimum(turns, first_past)
    return prompt, kept, kept_turns


@dataclass(frozen=True, eq=False)
class SessionArrays:
    """The requests of a set of sessions, in their final order (by lower-bound arrival)."""

    arrival_s: np.ndarray  # lower bound: session start + think times (the engine adds the service times)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    level: np.ndarray  # priority level (the session's class)
    after: np.ndarray  # index of the previous turn, -1 for a first turn
    think_s: np.ndarray  # 0 for a first turn
    block_off: np.ndarray
    block_ids: np.ndarray


def assemble(
    start_s: np.ndarray,
    turns: np.ndarray,
    session_level: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    think_s: np.ndarray,
    shared_blocks: np.ndarray,
) -> SessionArrays:
    """Order the turns of sessions (flattened session by session, turns[s] of session s) by lower-bound
    arrival, link each to its previous turn, and build their chains.

    Lower bound of turn k = start + the think times of turns 1..k; ties go to the earlier session, then the
    earlier turn, so a predecessor always comes first. Chains: a session's blocks are its class's
    ``shared_blocks[level]`` system-prompt ids, then ids of its own; turn k's chain covers its prompt and
    answer, (prompt + output) // 16 blocks, the first (prompt + output of turn k - 1) // 16 of them turn k - 1's
    chain. A session's last turn keeps only what earlier turns hold (the rest is unique), and a lone turn only
    the system prompt."""
    session, k = turn_positions(turns)
    n = session.size
    think = np.where(k > 0, think_s, 0.0)
    waited = np.cumsum(think)
    waited -= (waited - think)[np.flatnonzero(k == 0)][session]  # think time since the session's first turn
    lower = start_s[session] + waited
    level = session_level[session]

    full = (prompt + output) // KV_BLOCK_TOKENS  # full blocks of prompt then answer
    last = np.zeros(n, dtype=bool)
    last[np.cumsum(turns) - 1] = True
    previous = np.concatenate(([0], full[:-1]))
    length = np.where(last, np.where(k > 0, previous, shared_blocks[level]), full)
    # ids: each present class's system prompt, then each session's own blocks
    present = np.zeros(shared_blocks.size, dtype=bool)
    present[level] = True
    class_blocks = np.where(present, shared_blocks, 0)
    class_base = np.concatenate(([0], np.cumsum(class_blocks)[:-1]))
    own = np.zeros(turns.size, dtype=np.int64)
    np.maximum.at(own, session, length - shared_blocks[level])  # blocks a session holds beyond the prompt
    own_base = int(class_blocks.sum()) + np.concatenate(([0], np.cumsum(own)[:-1]))

    order = np.lexsort((k, session, lower))
    index = np.empty(n, dtype=np.int64)
    index[order] = np.arange(n, dtype=np.int64)
    after = np.where(k > 0, index[np.maximum(np.arange(n) - 1, 0)], -1)
    off, ids = two_part_chains(
        length[order], shared_blocks[level][order], class_base[level][order], own_base[session][order]
    )
    return SessionArrays(
        arrival_s=lower[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        level=level[order],
        after=after[order],
        think_s=think[order],
        block_off=off,
        block_ids=ids,
    )
