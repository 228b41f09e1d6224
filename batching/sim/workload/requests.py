"""Request streams for the simulator: synthetic workloads and replayed traces.

Both kinds produce a ``Requests`` (per-request arrays sorted by arrival) and are
deterministic: a ``SyntheticWorkload`` for its seed, a ``TraceWorkload`` for its bytes.
Every config is a frozen dataclass whose ``validate()`` raises ``ValueError`` naming the
field, the value and the allowed range.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from batching.sim.checks import check_int, check_range, show
from batching.sim.workload import sessions as _sessions
from batching.sim.workload.prefixes import (ENGINE_BLOCKS_PER_TRACE_BLOCK, expand_chains, offsets, segment_positions,
                                            two_part_chains)
from batching.sim.workload.sessions import SessionSpec
from batching.sim.hardware.specs import KV_BLOCK_TOKENS
from batching.sim.workload.traces import FORMATS, MAX_ABS_TIME_S, MAX_PRIORITY_LEVELS, MAX_TOKENS, TraceData, load_trace

LENGTH_KINDS = ("fixed", "uniform", "lognormal", "empirical")
ARRIVAL_KINDS = ("poisson", "gamma", "constant", "onoff", "diurnal")
# The sidebar's and the CLI's default request rate (the single source). On the default scenario (Qwen2.5-72B
# BF16 on 8xH100, TP 8, the `mixed` workload, 2,000 requests, seed 0) the saturated runs serve static 1.17,
# dynamic 1.29, continuous 8.4, chunked and priority 8.6 req/s. 1 req/s is the round rate every preset carries
# (static 85 %, dynamic 77 % of capacity; neither queue grows over the run), so the showdown compares every
# policy at a load it can sustain; the latency-against-load chart shows what happens past it. At the old 3
# req/s static and dynamic were 2.5x over capacity and their latencies only measured the run's length.
DEFAULT_RATE_REQ_S = 1.0
MAX_RATE_REQ_S = 10_000.0
# Requests one simulation may take. Memory grows with requests and with simulated steps (benchmarks/
# bench_memory.py: ~0.2 KB per request + ~0.3 KB per step on one node; fleets and splits sum their steps over
# replicas and instances, and may hold every request once per engine: sim/topology/sizing.py): about 1 KB per request on
# a saturated node (~2 steps per request), 6.5 KB at the default scenario (~21 steps), ~63 KB when every request
# runs alone (one step per output token). 10^6 requests of the default scenario peak at 6.3 GiB, which leaves room on the
# documented 2-core, 24 GiB host; 10^7 (the old cap) would need ~65 GB.
MAX_NUM_REQUESTS = 1_000_000
# Closed-loop clients (``SyntheticWorkload.concurrency``): up to 10,000, above any --max-concurrency a published
# vLLM, SGLang or genai-perf benchmark run uses (they sweep 1 to 1,024), and at most the run's requests.
MAX_CONCURRENCY = 10_000
MAX_CLIENT_THINK_S = 86_400.0  # a client's think time up to a day
MAX_SPEEDUP = 1000.0
MAX_PERIOD_S = 86_400.0  # on/off period lengths up to a day
MAX_CV = 20.0
MAX_DIURNAL_PERIOD_S = 7 * 86_400.0  # a diurnal cycle up to a week long
MAX_PEAK_TO_TROUGH = 100.0


def _check_arrivals(arrival_s: np.ndarray, cause: str, fix: str) -> None:
    """Refuse arrivals beyond MAX_ABS_TIME_S, where float64 cannot tell two events 1 ms apart (the engine's
    latencies would come out as 0)."""
    last = float(arrival_s[-1]) if arrival_s.size else 0.0
    if not last <= MAX_ABS_TIME_S:
        raise ValueError(
            f"{cause} puts the last arrival at {last:.4g} s; allowed up to {MAX_ABS_TIME_S:.4g} s (2^43 s: "
            f"beyond it float64 cannot tell events 1 ms apart); {fix}"
        )


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(allowed)}")


# ---------------------------------------------------------------- the request arrays


@dataclass(frozen=True, eq=False)
class Requests:
    """What the engine consumes: one entry per request, sorted by arrival."""

    arrival_s: np.ndarray  # float64 seconds, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    priority: np.ndarray  # int64 level, 0 = highest, < len(class_names)
    class_names: tuple[str, ...]  # name of each priority level
    # Prefix sharing (None: no request shares KV with another). Request r's KV blocks, from its first, are
    # block_ids[block_off[r]:block_off[r + 1]]: one id per full 16-token block of its prompt followed by its
    # output, possibly fewer (a chain may stop after its last block any other request shares). Ids are dense
    # from 0; two blocks have the same id exactly when their tokens and every token before them are the same.
    # Grouped (block_group G > 1, a Mooncake trace's 32 engine blocks per 512-token hash): each id names G blocks,
    # request r's j-th is block_ids[block_off[r] + j // G] + j % G, and block_len[r] says how many it has (its last
    # id may name fewer than G), so a trace's chains take one id per trace block, not one per engine block.
    block_off: np.ndarray | None = None  # int64, n + 1 offsets
    block_ids: np.ndarray | None = None  # int64 ids
    # Multi-turn sessions (None: open loop, arrival_s is every request's arrival). after[r] >= 0: request r
    # arrives think_s[r] seconds after request after[r] (an earlier index) is released, so its arrival_s is only a
    # lower bound (the arrival of after[r] + think_s[r]), used for ordering; the engine reports the real arrival.
    after: np.ndarray | None = None  # int64, -1 for a session's first turn and for independent requests
    think_s: np.ndarray | None = None  # float64 seconds
    block_len: np.ndarray | None = None  # int64 blocks per chain (grouped chains; None: diff(block_off))
    block_group: int = 1  # engine blocks per id: 1, or a power of two with block_len set
    # Closed-loop clients (0: none): request r's ``after`` is the same client's previous request; such a request
    # has no history in its prompt, so a saturated copy drops the links (every request at 0, as an open loop's).
    clients: int = 0

    def __post_init__(self) -> None:
        for name, dtype in (
            ("arrival_s", np.float64),
            ("prompt_tokens", np.int64),
            ("output_tokens", np.int64),
            ("priority", np.int64),
        ):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        for name, dtype in (("block_off", np.int64), ("block_ids", np.int64), ("after", np.int64),
                            ("think_s", np.float64), ("block_len", np.int64)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        object.__setattr__(self, "class_names", tuple(self.class_names))

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def validate(self) -> None:
        n = len(self)
        for name in ("prompt_tokens", "output_tokens", "priority"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} has shape {getattr(self, name).shape}; expected ({n},)")
        if not np.all(np.isfinite(self.arrival_s)):
            raise ValueError("arrival_s holds a non-finite value; allowed finite seconds")
        if n > 1 and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrival_s is not sorted; requests must be in arrival order")
        for name in ("prompt_tokens", "output_tokens"):
            values = getattr(self, name)
            if n and (values.min() < 1 or values.max() > MAX_TOKENS):
                raise ValueError(
                    f"{name} holds {show(values.min())}..{show(values.max())}; "
                    f"allowed 1 to {MAX_TOKENS}"
                )
        k = len(self.class_names)
        if not 1 <= k <= MAX_PRIORITY_LEVELS:
            raise ValueError(f"class_names has {k} names; allowed 1 to {MAX_PRIORITY_LEVELS}")
        if n and (self.priority.min() < 0 or self.priority.max() >= k):
            raise ValueError(
                f"priority holds {self.priority.min()}..{self.priority.max()}; allowed 0 to {k - 1}"
            )
        self._validate_chains()
        self._validate_sessions()

    def _validate_chains(self) -> None:
        n = len(self)
        off, ids = self.block_off, self.block_ids
        if (off is None) != (ids is None):
            given, missing = ("block_off", "block_ids") if ids is None else ("block_ids", "block_off")
            raise ValueError(f"{given} is set but {missing} is None; allowed both or neither")
        if off is None:
            return
        if off.shape != (n + 1,):
            raise ValueError(f"block_off has shape {off.shape}; expected ({n + 1},): one offset per request + 1")
        if ids.ndim != 1:
            raise ValueError(f"block_ids has shape {ids.shape}; expected one dimension")
        if off[0] != 0 or off[-1] != ids.size:
            raise ValueError(
                f"block_off runs from {off[0]} to {off[-1]}; allowed 0 to len(block_ids) = {ids.size}"
            )
        lengths = np.diff(off)
        if n and lengths.min() < 0:
            r = int(np.argmax(lengths < 0))
            raise ValueError(f"block_off decreases at request {r} ({off[r]} then {off[r + 1]}); allowed "
                             f"non-decreasing offsets")
        if ids.size and ids.min() < 0:
            raise ValueError(f"block_ids holds {ids.min()}; allowed ids >= 0")
        group = self.block_group
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1 or group & (group - 1):
            raise ValueError(f"block_group={show(group)} is not allowed; allowed a power of two (1, 2, 4, ...)")
        if self.block_len is not None or group > 1:
            lengths = self._grouped_lengths(lengths)
        full = (self.prompt_tokens + self.output_tokens) // KV_BLOCK_TOKENS
        over = lengths > full
        if over.any():
            r = int(np.argmax(over))
            raise ValueError(f"request {r} has {lengths[r]} block ids; allowed 0 to {full[r]}, its full "
                             f"{KV_BLOCK_TOKENS}-token blocks of prompt + output")

    def _grouped_lengths(self, ids_per_chain: np.ndarray) -> np.ndarray:
        """block_len, checked against the ids each chain has (ceil(block_len / block_group) of them)."""
        n, group, lengths = len(self), self.block_group, self.block_len
        if lengths is None:
            raise ValueError(f"block_group={group} needs block_len; allowed block_group 1 without it")
        if lengths.shape != (n,):
            raise ValueError(f"block_len has shape {lengths.shape}; expected ({n},)")
        wrong = (lengths < 0) | (-(-lengths // group) != ids_per_chain)
        if wrong.any():
            r = int(np.argmax(wrong))
            k = int(ids_per_chain[r])
            allowed = f"{group * (k - 1) + 1} to {group * k}" if k else "0"
            raise ValueError(f"block_len[{r}]={lengths[r]} does not fit request {r}'s {k} block ids; allowed "
                             f"{allowed} (each id names {group} blocks)")
        return lengths

    @property
    def block_shift(self) -> int:
        """log2(block_group): the engine's Inputs.chain_shift."""
        return int(self.block_group).bit_length() - 1

    def chain_lengths(self) -> np.ndarray | None:
        """Blocks in each request's chain (None without chains)."""
        if self.block_off is None:
            return None
        return np.diff(self.block_off) if self.block_len is None else self.block_len

    def engine_chains(self) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        """The chains with one id per block (block_group 1), as (block_off, block_ids); (None, None) without."""
        if self.block_off is None or self.block_ids is None:
            return None, None
        return expand_chains(self.block_off, self.block_ids, self.block_len, self.block_group)

    def _validate_sessions(self) -> None:
        n = len(self)
        after, think = self.after, self.think_s
        if (after is None) != (think is None):
            given, missing = ("after", "think_s") if think is None else ("think_s", "after")
            raise ValueError(f"{given} is set but {missing} is None; allowed both or neither")
        if after is None:
            return
        for name, values in (("after", after), ("think_s", think)):
            if values.shape != (n,):
                raise ValueError(f"{name} has shape {values.shape}; expected ({n},)")
        bad = (after < -1) | (after >= np.arange(n))
        if bad.any():
            r = int(np.argmax(bad))
            raise ValueError(
                f"after[{r}]={after[r]} is out of range; allowed -1 or an earlier request, 0 to {r - 1}"
            )
        if n and not (np.all(np.isfinite(think)) and think.min() >= 0):
            r = int(np.argmax(~(np.isfinite(think) & (think >= 0))))
            raise ValueError(f"think_s[{r}]={show(think[r])} is out of range; allowed finite seconds >= 0")

    @property
    def num_block_ids(self) -> int:
        """Max block id + 1 (0 without chains): the size of a table indexed by block id."""
        if self.block_ids is None or self.block_ids.size == 0:
            return 0
        if self.block_group == 1:
            return int(self.block_ids.max()) + 1
        lengths = self.chain_lengths()
        has = lengths > 0
        last = self.block_off[1:][has] - 1  # a chain's last id may name fewer than block_group blocks
        width = lengths[has] - self.block_group * (last - self.block_off[:-1][has])
        return max(int(self.block_ids.max()) + 1, int((self.block_ids[last] + width).max()))

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate_req_s(self) -> float:
        """(n - 1) / span: the mean arrival rate; inf when all arrive at once."""
        if len(self) < 2:
            return 0.0
        span = self.span_s
        return (len(self) - 1) / span if span > 0 else math.inf

    def saturated(self) -> Requests:
        """A copy with every request arriving at 0 (for capacity runs). Session turns keep their order (a turn
        still waits for the previous answer, whose text it contains) but no longer think: think_s is 0."""
        if self.clients:  # closed-loop clients: the engine flat out, not N clients' pace
            return replace(self, arrival_s=np.zeros(len(self)), after=None, think_s=None, clients=0)
        think = None if self.think_s is None else np.zeros(len(self))
        return replace(self, arrival_s=np.zeros(len(self)), think_s=think)

    def subset(self, idx: np.ndarray | slice | list[int]) -> Requests:
        """The requests picked by a boolean mask, indices or a slice, kept in arrival order. Chains are kept
        (ids as they were); a turn whose previous turn is not picked becomes a session's first (after = -1)."""
        rows = np.sort(np.arange(len(self))[idx])
        off = ids = after = think = block_len = None
        if self.block_off is not None and self.block_ids is not None:
            lengths = np.diff(self.block_off)[rows]
            off = offsets(lengths)
            seg, pos = segment_positions(off)
            ids = self.block_ids[self.block_off[rows][seg] + pos]
            block_len = None if self.block_len is None else self.block_len[rows]
        if self.after is not None and self.think_s is not None:
            new_index = np.full(len(self), -1, dtype=np.int64)
            new_index[rows] = np.arange(rows.size)
            prev = self.after[rows]
            after = np.where(prev >= 0, new_index[np.maximum(prev, 0)], -1)
            think = np.where(after >= 0, self.think_s[rows], 0.0)
        return Requests(
            self.arrival_s[rows],
            self.prompt_tokens[rows],
            self.output_tokens[rows],
            self.priority[rows],
            self.class_names,
            off,
            ids,
            after,
            think,
            block_len,
            self.block_group,
            self.clients if after is not None else 0,
        )

    def sessions(self) -> tuple[np.ndarray, np.ndarray]:
        """(session, turn) of each request from ``after``: sessions numbered by their first turn's index order,
        turns from 0. Without sessions every request is its own session, turn 0."""
        n = len(self)
        if self.after is None:
            return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        root = np.arange(n, dtype=np.int64)
        turn = np.zeros(n, dtype=np.int64)
        parent = self.after.copy()
        while True:  # one step back per round: a session of T turns takes T - 1 rounds
            linked = parent >= 0
            if not linked.any():
                break
            turn[linked] += 1
            root[linked] = parent[linked]
            parent[linked] = self.after[parent[linked]]
        first = np.flatnonzero(self.after < 0)
        number = np.full(n, -1, dtype=np.int64)
        number[first] = np.arange(first.size)
        return number[root], turn

    def to_frame(self) -> pd.DataFrame:
        names = np.array(self.class_names, dtype=object)
        columns = {
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "priority": self.priority,
            "class_name": names[self.priority] if len(self) else np.array([], dtype=object),
        }
        if self.after is not None:
            columns["session"], columns["turn"] = self.sessions()
        return pd.DataFrame(columns)

    @classmethod
    def from_trace(cls, trace: TraceData) -> Requests:
        chained = trace.block_off is not None and trace.block_ids is not None
        return cls(
            trace.arrival_s.copy(),
            trace.prompt_tokens.copy(),
            trace.output_tokens.copy(),
            trace.priority.copy(),
            trace.class_names,
            trace.block_off.copy() if chained else None,
            trace.block_ids.copy() if chained else None,
            block_len=trace.block_len.copy() if chained else None,
            block_group=ENGINE_BLOCKS_PER_TRACE_BLOCK if chained else 1,
        )


# ---------------------------------------------------------------- distributions


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution of prompts or outputs.

    fixed: always round(mean). uniform: integers in [low, high]. lognormal: that mean and
    coefficient of variation, rounded and clipped to [low, high]. empirical: ``values``
    resampled uniformly with replacement, clipped to [low, high].
    """

    kind: str = "lognormal"
    mean: float = 1000
    cv: float = 1.0
    low: int = 1
    high: int = 8192
    values: tuple[int, ...] = field(default=(), repr=False)

    def validate(self) -> None:
        _check_choice("kind", self.kind, LENGTH_KINDS)
        check_int("low", self.low, 1, MAX_TOKENS)
        check_int("high", self.high, self.low, MAX_TOKENS)
        if self.kind in ("fixed", "lognormal"):
            check_range("mean", self.mean, 1, MAX_TOKENS)
        if self.kind == "lognormal":
            check_range("cv", self.cv, 0, MAX_CV)
        if self.kind == "empirical":
            if not self.values:
                raise ValueError(
                    "values=() is empty; an empirical distribution needs 1 or more lengths"
                )
            v = np.asarray(self.values)
            if v.dtype.kind not in "iu" or v.min() < 1 or v.max() > MAX_TOKENS:
                raise ValueError(f"values must be integers from 1 to {MAX_TOKENS}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths as int64."""
        if self.kind == "fixed":
            return np.full(n, round(self.mean), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        if self.kind == "lognormal":
            sigma = math.sqrt(math.log1p(self.cv**2))
            mu = math.log(self.mean) - sigma**2 / 2  # so that E[X] = mean
            raw = np.rint(rng.lognormal(mu, sigma, size=n))
        elif self.kind == "empirical":
            raw = np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]
        else:
            raise ValueError(
                f"kind={self.kind!r} is not allowed; allowed: {', '.join(LENGTH_KINDS)}"
            )
        return np.clip(raw, self.low, self.high).astype(np.int64)

    @classmethod
    def from_trace(
        cls,
        path_or_requests: str | Path | bytes | Requests | TraceData,
        which: str = "prompt",
        low: int = 1,
        high: int | None = None,
    ) -> LengthDist:
        """An empirical distribution of a trace's prompt or output lengths (high: its max)."""
        _check_choice("which", which, ("prompt", "output"))
        source = path_or_requests
        if not isinstance(source, (Requests, TraceData)):
            source = load_trace(source)
        values = source.prompt_tokens if which == "prompt" else source.output_tokens
        if values.size == 0:
            raise ValueError("the trace has no requests to take lengths from")
        dist = cls(
            kind="empirical",
            mean=float(values.mean()),
            cv=float(values.std() / values.mean()),
            low=low,
            high=int(values.max()) if high is None else high,
            values=tuple(int(v) for v in values),
        )
        dist.validate()
        return dist


@dataclass(frozen=True)
class ArrivalProcess:
    """When requests arrive. Mean rate is rate_req_s for every kind.

    poisson: exponential gaps. gamma: gamma gaps with coefficient of variation ``cv``
    (cv > 1 is burstier than Poisson; vLLM bench's ``--burstiness`` is the gamma shape 1 / cv^2).
    constant: evenly spaced. onoff: Poisson at rate_req_s * (on_s + off_s) / on_s during on
    periods and nothing during off periods. diurnal: a Poisson process whose rate follows a
    sinusoid between a trough and a peak ``peak_to_trough`` times higher, period ``period_s``,
    starting at the trough (night) and peaking half a period later; its mean over whole periods is
    rate_req_s. Runs shorter than a period see less than the mean rate: set ``period_s`` to the
    span to simulate, e.g. one day compressed into an hour.
    """

    kind: str = "poisson"
    rate_req_s: float = DEFAULT_RATE_REQ_S
    cv: float = 2.0  # gamma only
    on_s: float = 10.0  # onoff only
    off_s: float = 10.0  # onoff only
    peak_to_trough: float = 3.0  # diurnal only: peak rate / trough rate
    period_s: float = 86_400.0  # diurnal only: one day

    def validate(self) -> None:
        _check_choice("kind", self.kind, ARRIVAL_KINDS)
        check_range("rate_req_s", self.rate_req_s, 0, MAX_RATE_REQ_S, low_open=True)
        if self.kind == "gamma":
            check_range("cv", self.cv, 0, MAX_CV, low_open=True)
        if self.kind == "onoff":
            check_range("on_s", self.on_s, 0, MAX_PERIOD_S, low_open=True)
            check_range("off_s", self.off_s, 0, MAX_PERIOD_S)
        if self.kind == "diurnal":
            check_range("peak_to_trough", self.peak_to_trough, 1, MAX_PEAK_TO_TROUGH)
            check_range("period_s", self.period_s, 0, MAX_DIURNAL_PERIOD_S, low_open=True)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n sorted arrival times in seconds, the first at 0.

        Gaps are standard variates divided by the rate, so the same seed at another rate
        gives the same stream rescaled in time. diurnal maps a unit-rate Poisson stream through
        the inverse of the cumulative rate (time rescaling): the same seed gives the same unit
        stream at any rate.
        """
        if n <= 0:
            return np.zeros(0)
        if self.kind == "constant":
            return np.arange(n, dtype=np.float64) / self.rate_req_s
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2
            gaps = rng.standard_gamma(shape, size=n - 1) / (shape * self.rate_req_s)
            return np.concatenate(([0.0], np.cumsum(gaps)))
        if self.kind == "poisson":
            return np.concatenate(
                ([0.0], np.cumsum(rng.standard_exponential(n - 1) / self.rate_req_s))
            )
        if self.kind == "onoff":
            on_rate = self.rate_req_s * (self.on_s + self.off_s) / self.on_s
            busy = np.concatenate(([0.0], np.cumsum(rng.standard_exponential(n - 1) / on_rate)))
            return busy + np.floor(busy / self.on_s) * self.off_s  # insert the off periods
        if self.kind == "diurnal":
            unit = np.concatenate(([0.0], np.cumsum(rng.standard_exponential(n - 1))))
            return _diurnal_times(unit / self.rate_req_s, self.peak_to_trough, self.period_s)
        raise ValueError(f"kind={self.kind!r} is not allowed; allowed: {', '.join(ARRIVAL_KINDS)}")


def _diurnal_times(x: np.ndarray, peak_to_trough: float, period_s: float) -> np.ndarray:
    """Times t with t - A sin(w t) = x, A = a / w: the inverse of the cumulative rate (divided by the mean) of
    rate(t) = mean * (1 - a cos(w t)), w = 2 pi / period, a = (peak/trough - 1) / (peak/trough + 1).

    The left side rises with t (slope 1 - a cos >= 1 - a > 0) and stays within A of t, so t lies in
    [x - A, x + A]: bisection there, 60 halvings (an interval of at most period / (2 pi) s, ~1e-14 s at the
    end)."""
    a = (peak_to_trough - 1.0) / (peak_to_trough + 1.0)
    if a == 0.0:
        return x.copy()
    w = 2.0 * math.pi / period_s
    amp = a / w
    lo, hi = x - amp, x + amp
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = mid - amp * np.sin(w * mid) < x
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    t = np.maximum(0.5 * (lo + hi), 0.0)
    t[0] = 0.0
    return np.maximum.accumulate(t)


# ---------------------------------------------------------------- classes and presets


@dataclass(frozen=True)
class PriorityClass:
    """A kind of traffic: its share of requests, its lengths and its latency targets."""

    name: str
    priority: int  # 0 = highest
    share: float  # fraction of requests, classes sum to 1
    prompt: LengthDist
    output: LengthDist
    slo_ttft_s: float | None = None  # time-to-first-token target
    slo_tpot_s: float | None = None  # time-per-output-token target
    # every request of the class starts with the same system prompt of this many tokens, prepended to its
    # sampled prompt (prompt_tokens = shared_prefix_tokens + sampled); its full 16-token blocks are shared
    shared_prefix_tokens: int = 0

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 64:
            raise ValueError(f"name={self.name!r} is not allowed; allowed 1 to 64 characters")
        check_int("priority", self.priority, 0, MAX_PRIORITY_LEVELS - 1)
        check_range("share", self.share, 0, 1)
        for part in (self.prompt, self.output):
            part.validate()
        check_int("shared_prefix_tokens", self.shared_prefix_tokens, 0, MAX_TOKENS)
        if self.shared_prefix_tokens + self.prompt.high > MAX_TOKENS:
            raise ValueError(
                f"shared_prefix_tokens={self.shared_prefix_tokens} with prompt.high={self.prompt.high} makes "
                f"prompts of up to {self.shared_prefix_tokens + self.prompt.high:,} tokens; allowed up to "
                f"{MAX_TOKENS:,} (shared_prefix_tokens 0 to {MAX_TOKENS - self.prompt.high:,} with this prompt)"
            )
        for name in ("slo_ttft_s", "slo_tpot_s"):
            value = getattr(self, name)
            if value is not None:
                check_range(name, value, 0, 3600, low_open=True)


# Length figures: the Azure LLM inference traces 2023 (data/traces/, data/README.md, and
# measured on those files: conv prompt mean 1155 CV 0.96, output mean 211 CV 0.77;
# code prompt mean 2048 CV 0.96, output mean 28 CV 2.1).
INTERACTIVE_CHAT = PriorityClass(
    name="interactive chat",
    priority=0,
    share=0.3,  # design choice: a minority of latency-sensitive traffic on a shared node
    # round figures close to Azure conv 2023 (prompt mean 1155, CV 0.96)
    prompt=LengthDist("lognormal", mean=1000, cv=1.0, low=16, high=8192),
    # Azure conv 2023 output: mean 211, CV 0.77
    output=LengthDist("lognormal", mean=250, cv=0.8, low=8, high=2048),
    slo_ttft_s=1.0,  # chat first token within a second
    slo_tpot_s=0.1,  # 10 tokens/s, faster than reading speed
)
BATCH_ANALYSIS = PriorityClass(
    name="batch analysis",
    priority=1,
    share=0.7,
    # document-sized prompts: Azure code 2023 prompt mean 2048, with a wider spread
    prompt=LengthDist("lognormal", mean=2048, cv=1.2, low=64, high=8192),
    # summaries/extractions: a little longer than Azure conv outputs (mean 211, CV 0.77)
    output=LengthDist("lognormal", mean=300, cv=0.8, low=16, high=2048),
)
DEFAULT_CLASSES: tuple[PriorityClass, ...] = (INTERACTIVE_CHAT, BATCH_ANALYSIS)

# The setting of the seed blog post on batching strategies ("your GPU is slacking", its results table in §3):
# Qwen 72B on 8xH100, which is the default node. The post gives no length distribution; these are narrow,
# plausible ones (its table's ~2.7x continuous/static ratio needs lengths that vary little: with the
# heavy-tailed `mixed` lengths the simulator gives ~7x). Prompts uniform 384-640 (mean 512, the post's
# "512 in"), outputs uniform 128-384 (mean 256, "256 out"): +-25 % and +-50 % around the mean, so static
# batches still wait for their longest output, as in any real traffic.
ARTICLE_PROMPT = LengthDist("uniform", mean=512, low=384, high=640)
ARTICLE_OUTPUT = LengthDist("uniform", mean=256, low=128, high=384)
ARTICLE_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass(
        name="interactive",
        priority=0,
        # the post's "+ priority" row has a high and a low class; 20 % interactive is a design choice (a
        # minority of latency-sensitive traffic, like `mixed`'s 30 %)
        share=0.2,
        prompt=ARTICLE_PROMPT,
        output=ARTICLE_OUTPUT,
        slo_ttft_s=1.0,  # first token within a second, as `mixed`'s chat class
        slo_tpot_s=0.1,  # 10 tokens/s, faster than reading speed
    ),
    PriorityClass(name="batch", priority=1, share=0.8, prompt=ARTICLE_PROMPT, output=ARTICLE_OUTPUT),
)
# The article workload's rate: on the default node its saturated runs serve static 5.4, dynamic 8.6,
# continuous 19, chunked 21 req/s (1,405 / 2,222 / 4,947 / 5,428 output tok/s, 2,000 requests, seed 0). 4 req/s
# is ~73 % of static's capacity, so no policy of the post's table is overloaded and their latencies compare.
ARTICLE_RATE_REQ_S = 4.0

WORKLOAD_PRESETS: dict[str, tuple[PriorityClass, ...]] = {
    "mixed": DEFAULT_CLASSES,
    "chat": (
        PriorityClass(
            name="chat",
            priority=0,
            share=1.0,
            # Azure conv 2023: prompt mean 1155 (CV 0.96), output mean 211 (CV 0.77)
            prompt=LengthDist("lognormal", mean=1155, cv=1.0, low=16, high=8192),
            output=LengthDist("lognormal", mean=211, cv=1.0, low=8, high=2048),
        ),
    ),
    "code": (
        PriorityClass(
            name="code",
            priority=0,
            share=1.0,
            # Azure code 2023: prompt mean 2048 (CV 0.96), output mean 28 (CV 2.1; the
            # preset uses 1.5, a lighter tail)
            prompt=LengthDist("lognormal", mean=2048, cv=1.0, low=16, high=8192),
            output=LengthDist("lognormal", mean=28, cv=1.5, low=1, high=1024),
        ),
    ),
    "batch": (replace(BATCH_ANALYSIS, share=1.0, priority=0),),
    # What `sglang.bench_serving --dataset-name sharegpt` (and vLLM's benchmark_serving) send:
    # the first human turn and GPT reply of ShareGPT_V3 conversations, prompts of 4-1,024
    # tokens. Published runs of that sampler count 224-230 prompt and 194-203 output tokens
    # per request (sglang issue #2805: 369,103 / 326,408 tokens over 1,648 requests; vLLM PR
    # #18566: 229,711 / 203,068 over 1,000; the v0.6.0 comparison's offline run: 3,700.64
    # output tok/s at 19.04 req/s = 194). Lognormal, heavy-tailed as chat prompts are (median
    # ~145, mean ~231 after the clip); outputs mean ~195.
    "sharegpt": (
        PriorityClass(
            name="sharegpt",
            priority=0,
            share=1.0,
            prompt=LengthDist("lognormal", mean=250, cv=1.4, low=4, high=1024),
            output=LengthDist("lognormal", mean=198, cv=1.0, low=4, high=1024),
        ),
    ),
    "article": ARTICLE_CLASSES,
    # Multi-turn chat (WORKLOAD_SESSIONS below): LMSYS-Chat-1M's 69.5 tokens per user prompt and 214.5 per
    # answer (Zheng et al., ICLR 2024, Table 1), with the CV ~1.3 of Magpie's 260 +- 347 tokens per turn of the
    # same data; later turns resend the whole history, so prompts grow (sessions.py has the sources).
    "chat-sessions": (
        PriorityClass(
            name="chat",
            priority=0,
            share=1.0,
            prompt=LengthDist("lognormal", mean=70, cv=1.3, low=1, high=4096),
            output=LengthDist("lognormal", mean=215, cv=1.3, low=1, high=4096),
        ),
    ),
    # Reasoning models (long output): DeepSeek-R1 wrote 4,717.5 tokens per answer on average on 30 hard MATH problems
    # (Evstafev, "Token-Hungry, Yet Precise", arXiv 2501.18576, 2025), most of it the reasoning trace. Outputs
    # lognormal around that mean with a wide spread (CV 0.8, a design choice: trace length varies with the problem),
    # cut at 16,384 so that prompt + output fit a 32k context (Qwen2.5's 32,768); prompts as `chat`'s (a question).
    "reasoning": (
        PriorityClass(
            name="reasoning",
            priority=0,
            share=1.0,
            prompt=LengthDist("lognormal", mean=1000, cv=1.0, low=16, high=8192),
            output=LengthDist("lognormal", mean=4700, cv=0.8, low=256, high=16384),
        ),
    ),
    # Long context (long prompt, short answer: documents, retrieval over many chunks, long agent histories). The
    # Mooncake traces this project ships (data/README.md, measured on the files) average 12,035 and 15,325 prompt
    # tokens for 343 and 149 output tokens; this preset goes further, prompts around 20,000 (CV 0.4, 4,096 to
    # 30,000 so that every request fits a 32k context) and answers around 500 (CV 0.8, 16 to 2,048): a design choice
    # for planning long-context serving, not a measured distribution.
    "long-context": (
        PriorityClass(
            name="long context",
            priority=0,
            share=1.0,
            prompt=LengthDist("lognormal", mean=20000, cv=0.4, low=4096, high=30000),
            output=LengthDist("lognormal", mean=500, cv=0.8, low=16, high=2048),
        ),
    ),
}
# Presets whose requests are the turns of multi-turn sessions (their classes are in WORKLOAD_PRESETS).
WORKLOAD_SESSIONS: dict[str, SessionSpec] = {"chat-sessions": SessionSpec()}


# ---------------------------------------------------------------- workloads


@dataclass(frozen=True)
class SyntheticWorkload:
    """num_requests requests: arrivals from ``arrivals``, each request's class drawn by
    share, its lengths from its class. Same seed, same requests; the arrival, class and
    per-class length streams are independent, so changing the rate keeps the lengths.

    A class with ``shared_prefix_tokens`` prepends its system prompt to every prompt and the requests carry
    block chains. With ``sessions`` the requests are the turns of multi-turn sessions (num_requests counts
    turns): each session draws its class, its first prompt and every answer from the class, later messages
    and think times from the ``SessionSpec``; sessions start by ``arrivals`` at rate_req_s / (turns per
    session), so rate_req_s stays the mean request rate and ``with_rate`` scales the whole process.

    With ``concurrency`` N the requests come from N closed-loop clients, as ``vllm bench serve --max-concurrency``,
    SGLang's ``bench_serving --max-concurrency`` and genai-perf's concurrency mode send them: request i belongs to
    client i mod N; the first N are sent at t = 0 and each later one ``think_time_s`` after its client's previous
    request is released (``Requests.after`` / ``think_s``), so every latency is measured from its send. The
    lengths and classes are the open loop's of the same seed (no history in the prompt, unlike sessions);
    ``arrivals`` is not used."""

    arrivals: ArrivalProcess = ArrivalProcess()
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    num_requests: int = 2000
    seed: int = 0
    sessions: SessionSpec | None = None
    concurrency: int | None = None  # closed-loop clients (None: open loop, arrivals by ``arrivals``)
    think_time_s: float = 0.0  # closed loop: a client's wait between a release and its next send

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    def validate(self) -> None:
        self.arrivals.validate()
        k = len(self.classes)
        if not 1 <= k <= MAX_PRIORITY_LEVELS:
            raise ValueError(f"classes has {k} classes; allowed 1 to {MAX_PRIORITY_LEVELS}")
        for c in self.classes:
            c.validate()
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"shares sum to {total:.10g}; allowed 1 (within 1e-6)")
        levels = sorted(c.priority for c in self.classes)
        if levels != list(range(k)):
            raise ValueError(f"priorities are {levels}; allowed each of 0 to {k - 1} exactly once")
        names = [c.name for c in self.classes]
        if len(set(names)) != k:
            raise ValueError(f"class names {names} repeat; allowed unique names")
        check_int("num_requests", self.num_requests, 1, MAX_NUM_REQUESTS)
        check_int("seed", self.seed, 0, 2**63 - 1)
        if self.sessions is not None:
            if not isinstance(self.sessions, SessionSpec):
                raise ValueError(f"sessions must be a SessionSpec or None, not {type(self.sessions).__name__}")
            if self.concurrency is not None:
                raise ValueError(f"concurrency={show(self.concurrency)} with sessions: allowed one of them (closed-loop "
                                 f"clients send independent requests; sessions send conversations' turns)")
            self.sessions.validate()
            cap = self.sessions.context_cap_tokens
            for c in self.classes:  # a first turn always fits, so every session has one
                longest = c.shared_prefix_tokens + c.prompt.high + c.output.high
                if longest > cap:
                    raise ValueError(
                        f"class {c.name!r}: shared_prefix_tokens + prompt.high + output.high = {longest:,} tokens "
                        f"passes sessions.context_cap_tokens={cap:,}; allowed up to the cap (lower the lengths' "
                        f"high or raise the cap)"
                    )

        self._validate_clients()

    def _validate_clients(self) -> None:
        if self.concurrency is None:
            if self.think_time_s != 0:
                raise ValueError(f"think_time_s={show(self.think_time_s)} needs concurrency (closed-loop clients); "
                                 f"allowed 0 in an open loop")
            return
        high = min(MAX_CONCURRENCY, self.num_requests)
        try:
            check_int("concurrency", self.concurrency, 1, high)
        except ValueError as exc:
            if high < MAX_CONCURRENCY and isinstance(self.concurrency, (int, np.integer)) \
                    and not isinstance(self.concurrency, bool) and self.concurrency > high:
                raise ValueError(f"{exc} (at most num_requests={self.num_requests:,}: each client sends one or "
                                 f"more requests)") from None
            raise
        check_range("think_time_s", self.think_time_s, 0, MAX_CLIENT_THINK_S)

    @property
    def load_text(self) -> str:
        """The load in words: "8 clients (closed loop)" (", think 0.5 s" with one) or the open loop's "1 req/s"."""
        if self.concurrency is None:
            return f"{self.rate_req_s:.4g} req/s"
        think = f", think {self.think_time_s:g} s" if self.think_time_s else ""
        return f"{self.concurrency:,} client{'s' if self.concurrency != 1 else ''} (closed loop{think})"

    @property
    def rate_req_s(self) -> float:
        """The arrival process's mean rate (an open loop's offered load; a closed loop has none: see concurrency)."""
        return self.arrivals.rate_req_s

    def generate(self) -> Requests:
        self.validate()
        if self.sessions is not None:
            return self._generate_sessions(self.sessions)
        if self.concurrency is not None:
            return self._closed_loop(self._open_loop())
        return self._open_loop()

    def _closed_loop(self, reqs: Requests) -> Requests:
        """The open loop's requests sent by ``concurrency`` clients: request i is client i mod N's (i // N)-th,
        after its request i - N; lower-bound arrival (i // N) x think_time_s (non-decreasing in i)."""
        n, clients = len(reqs), int(self.concurrency)
        i = np.arange(n, dtype=np.int64)
        after = np.where(i >= clients, i - clients, -1)
        think = np.where(i >= clients, float(self.think_time_s), 0.0)
        lower = (i // clients) * float(self.think_time_s)
        _check_arrivals(lower, f"think_time_s={show(self.think_time_s)} with num_requests={n}",
                        "use a shorter think time or fewer requests")
        return replace(reqs, arrival_s=lower, after=after, think_s=think, clients=clients)

    def _open_loop(self) -> Requests:
        n = self.num_requests
        streams = np.random.SeedSequence(self.seed).spawn(2 + MAX_PRIORITY_LEVELS)
        arrival_s = self.arrivals.times(np.random.default_rng(streams[0]), n)
        _check_arrivals(arrival_s, f"rate_req_s={show(self.rate_req_s)} with num_requests={n}",
                        "use a higher rate or fewer requests")
        classes = sorted(self.classes, key=lambda c: c.priority)
        shares = np.array([c.share for c in classes])
        level = np.random.default_rng(streams[1]).choice(
            len(classes), size=n, p=shares / shares.sum()
        )
        prompt = np.empty(n, dtype=np.int64)
        output = np.empty(n, dtype=np.int64)
        for c in classes:
            rows = np.flatnonzero(level == c.priority)
            rng = np.random.default_rng(streams[2 + c.priority])
            prompt[rows] = c.prompt.sample(rng, rows.size)
            output[rows] = c.output.sample(rng, rows.size)
        names = tuple(c.name for c in classes)
        shared = np.array([c.shared_prefix_tokens for c in classes], dtype=np.int64)
        if not shared.any():
            return Requests(arrival_s, prompt, output, level, names)
        prompt += shared[level]
        # one chain per request: its class's system-prompt blocks (the rest of a prompt is its own: left out)
        blocks = shared // KV_BLOCK_TOKENS
        present = np.bincount(level, minlength=len(classes)) > 0
        base = offsets(np.where(present, blocks, 0))[:-1]
        zeros = np.zeros(n, dtype=np.int64)
        off, ids = two_part_chains(blocks[level], blocks[level], base[level], zeros)
        return Requests(arrival_s, prompt, output, level, names, off, ids)

    def _generate_sessions(self, spec: SessionSpec) -> Requests:
        """Sessions of turns until num_requests turns (the last session cut short to fit)."""
        n = self.num_requests
        streams = np.random.SeedSequence(self.seed).spawn(2 + MAX_PRIORITY_LEVELS + 2)
        rng_class = np.random.default_rng(streams[1])
        rng_length = [np.random.default_rng(streams[2 + p]) for p in range(len(self.classes))]
        rng_turns = np.random.default_rng(streams[2 + MAX_PRIORITY_LEVELS])
        rng_think = np.random.default_rng(streams[3 + MAX_PRIORITY_LEVELS])
        classes = sorted(self.classes, key=lambda c: c.priority)
        shares = np.array([c.share for c in classes])
        shared = np.array([c.shared_prefix_tokens for c in classes], dtype=np.int64)
        parts: list[tuple[np.ndarray, ...]] = []
        total = 0
        batch = max(64, math.ceil(1.2 * n / spec.mean_turns))
        while total < n:  # draw sessions by batches until they hold n turns
            level = rng_class.choice(len(classes), size=batch, p=shares / shares.sum())
            wanted = spec.sample_turns(rng_turns, batch)
            session, _ = _sessions.turn_positions(wanted)
            first = np.empty(batch, dtype=np.int64)
            output = np.empty(session.size, dtype=np.int64)
            for c in classes:
                rows = np.flatnonzero(level == c.priority)
                turn_rows = np.flatnonzero(level[session] == c.priority)
                first[rows] = c.shared_prefix_tokens + c.prompt.sample(rng_length[c.priority], rows.size)
                output[turn_rows] = c.output.sample(rng_length[c.priority], turn_rows.size)
            message = spec.sample_message_tokens(rng_turns, session.size)
            think = spec.sample_think_s(rng_think, session.size)
            prompt, kept, turns = _sessions.grow_prompts(first, wanted, output, message,
                                                         spec.context_cap_tokens)
            parts.append((level, turns, prompt[kept], output[kept], think[kept]))
            total += int(turns.sum())
        level, turns, prompt, output, think = (np.concatenate(p) for p in zip(*parts))
        # keep the sessions that hold the first n turns, the last one cut short
        sessions = int(np.searchsorted(np.cumsum(turns), n)) + 1
        level, turns = level[:sessions], turns[:sessions].copy()
        turns[-1] -= int(turns.sum()) - n
        prompt, output, think = prompt[:n], output[:n], think[:n]
        # session starts: the arrival process at the session rate that makes the request rate rate_req_s
        starts = replace(self.arrivals, rate_req_s=self.rate_req_s * sessions / n)
        start_s = starts.times(np.random.default_rng(streams[0]), sessions)
        arrays = _sessions.assemble(start_s, turns, level, prompt, output, think,
                                    shared // KV_BLOCK_TOKENS)
        _check_arrivals(arrays.arrival_s, f"rate_req_s={show(self.rate_req_s)} with num_requests={n}",
                        "use a higher rate or fewer requests")
        return Requests(arrays.arrival_s, arrays.prompt_tokens, arrays.output_tokens, arrays.level,
                        tuple(c.name for c in classes), arrays.block_off, arrays.block_ids, arrays.after,
                        arrays.think_s)

    def with_rate(self, rate_req_s: float) -> SyntheticWorkload:
        """The same workload at another mean request rate. Poisson, gamma and constant arrivals (and sessions'
        starts) are the same stream rescaled in time; a diurnal curve's period is rescaled with them (the same
        requests cover the same part of the cycle, so the run's mean rate is the rate asked for); on/off
        periods stay in seconds (bursts keep their length and hold more or fewer requests)."""
        arrivals = replace(self.arrivals, rate_req_s=rate_req_s)
        old = self.arrivals
        if old.kind == "diurnal" and rate_req_s != old.rate_req_s:
            check_range("rate_req_s", rate_req_s, 0, MAX_RATE_REQ_S, low_open=True)
            period = old.period_s * old.rate_req_s / rate_req_s
            if period > MAX_DIURNAL_PERIOD_S:
                raise ValueError(
                    f"rate_req_s={show(rate_req_s)} stretches the diurnal period_s={show(old.period_s)} (at "
                    f"{show(old.rate_req_s)} req/s) to {period:,.0f} s; allowed up to "
                    f"{MAX_DIURNAL_PERIOD_S:,.0f} s (a week): use a shorter period_s"
                )
            arrivals = replace(arrivals, period_s=period)
        return replace(self, arrivals=arrivals)

    def with_arrivals(self, kind: str, **params: float) -> SyntheticWorkload:
        """The same workload with another arrival process at the same mean rate, e.g.
        ``with_arrivals("gamma", cv=4)`` or ``with_arrivals("diurnal", peak_to_trough=3, period_s=3600)``."""
        unknown = sorted(set(params) - {"cv", "on_s", "off_s", "peak_to_trough", "period_s"})
        if unknown:
            raise ValueError(f"with_arrivals got {', '.join(unknown)}; allowed: cv, on_s, off_s, peak_to_trough, "
                             f"period_s")
        arrivals = replace(self.arrivals, kind=kind, **params)
        arrivals.validate()
        return replace(self, arrivals=arrivals)

    def with_shared_prefix(self, tokens: int) -> SyntheticWorkload:
        """Every class starts its prompts with its own system prompt of ``tokens`` tokens (0: none)."""
        workload = replace(self, classes=tuple(replace(c, shared_prefix_tokens=tokens) for c in self.classes))
        for c in workload.classes:
            c.validate()
        return workload

    def with_concurrency(self, concurrency: int | None, think_time_s: float | None = None) -> SyntheticWorkload:
        """The same requests sent by ``concurrency`` closed-loop clients (None: the open loop of ``arrivals``);
        ``think_time_s`` None keeps the current one (0 in an open loop)."""
        think = self.think_time_s if think_time_s is None else think_time_s
        return replace(self, concurrency=concurrency, think_time_s=think if concurrency is not None else 0.0)

    def with_sessions(self, spec: SessionSpec | None) -> SyntheticWorkload:
        """The same classes and arrivals as multi-turn sessions shaped by ``spec`` (None: independent requests)."""
        return replace(self, sessions=spec)

    def with_num_requests(self, n: int) -> SyntheticWorkload:
        return replace(self, num_requests=n)

    def with_seed(self, s: int) -> SyntheticWorkload:
        return replace(self, seed=s)

    def with_high_share(self, share_high: float) -> SyntheticWorkload:
        """Priority-0 class gets share_high; the others share the rest in their old ratio."""
        check_range("share_high", share_high, 0, 1)
        if len(self.classes) < 2:
            raise ValueError("with_high_share needs 2 or more classes; this workload has 1")
        others = sum(c.share for c in self.classes if c.priority != 0)
        count = len(self.classes) - 1

        def new_share(c: PriorityClass) -> float:
            if c.priority == 0:
                return float(share_high)
            ratio = c.share / others if others > 0 else 1.0 / count
            return (1.0 - share_high) * ratio

        return replace(self, classes=tuple(replace(c, share=new_share(c)) for c in self.classes))


# parsed traces kept for reuse: at most this many bytes (a file and its arrays), the latest one whatever its size
TRACE_CACHE_BYTES = 256 * 2**20


def _trace_arrays(trace: TraceData) -> list[np.ndarray]:
    return [a for a in (trace.arrival_s, trace.prompt_tokens, trace.output_tokens, trace.priority, trace.block_off,
                        trace.block_ids, trace.block_len, trace.hash_off, trace.hash_ids) if a is not None]


class _TraceCache:
    """Parsed traces by (bytes, format, file name, skip_bad_rows), least recently used out once the files and
    their arrays pass TRACE_CACHE_BYTES; the latest is always kept (every look at a TraceWorkload reads it). Not
    by count: eight 50 MB uploads of long Mooncake prompts would hold 2.6 GB."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple, tuple[TraceData, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, data: bytes, fmt: str, filename: str, skip_bad_rows: bool) -> TraceData:
        key = (data, fmt, filename, skip_bad_rows)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        trace = load_trace(data, fmt=fmt, filename=filename, skip_bad_rows=skip_bad_rows)
        arrays = _trace_arrays(trace)
        for a in arrays:
            a.flags.writeable = False  # shared by every caller of the cache
        with self._lock:
            self._items[key] = (trace, len(data) + sum(a.nbytes for a in arrays))
            self._items.move_to_end(key)
            while len(self._items) > 1 and sum(size for _, size in self._items.values()) > TRACE_CACHE_BYTES:
                self._items.popitem(last=False)
        return trace

    def cache_clear(self) -> None:
        with self._lock:
            self._items.clear()


_load_cached = _TraceCache()


@dataclass(frozen=True)
class TraceWorkload:
    """A trace replayed as recorded, held as bytes so the workload is hashable.

    Arrivals are divided by ``speedup``; then only the first ``max_requests`` requests and
    those arriving before ``max_duration_s`` (after the speed-up) are kept.
    """

    data: bytes = field(repr=False)
    filename: str = "trace.csv"
    fmt: str = "auto"
    speedup: float = 1.0
    max_requests: int | None = None
    max_duration_s: float | None = None
    skip_bad_rows: bool = False

    def validate(self) -> None:
        if not isinstance(self.data, bytes):
            raise ValueError(f"data must be bytes, not {type(self.data).__name__}")
        _check_choice("fmt", self.fmt, FORMATS)
        check_range("speedup", self.speedup, 0, MAX_SPEEDUP, low_open=True)
        if self.max_requests is not None:
            check_int("max_requests", self.max_requests, 1, MAX_NUM_REQUESTS)
        if self.max_duration_s is not None:
            check_range("max_duration_s", self.max_duration_s, 0, 1e9, low_open=True)

    @classmethod
    def from_path(cls, path: str | Path, **kw: object) -> TraceWorkload:
        path = Path(path)
        return cls(data=path.read_bytes(), filename=kw.pop("filename", path.name), **kw)

    def load(self) -> TraceData:
        """The parsed trace before speed-up and truncation (cached; arrays read-only)."""
        self.validate()
        return _load_cached(self.data, self.fmt, self.filename, self.skip_bad_rows)

    def _kept(self, trace: TraceData) -> int:
        n = len(trace)
        if self.max_requests is not None:
            n = min(n, self.max_requests)
        if self.max_duration_s is not None:
            n = min(
                n, int(np.searchsorted(trace.arrival_s / self.speedup, self.max_duration_s, "left"))
            )
        return max(n, 1)

    def generate(self) -> Requests:
        trace = self.load()
        m = self._kept(trace)
        if m > MAX_NUM_REQUESTS:
            raise ValueError(
                f"the trace has {m:,} requests; allowed up to {MAX_NUM_REQUESTS:,} per simulation: set "
                f"max_requests (--requests) to replay its first {MAX_NUM_REQUESTS:,} or fewer"
            )
        with np.errstate(over="ignore"):
            arrival_s = trace.arrival_s[:m] / self.speedup
        _check_arrivals(arrival_s, f"speedup={show(self.speedup)} (the trace's last arrival at "
                                   f"{show(float(trace.arrival_s[m - 1]))} s)", "use a larger speedup")
        off = ids = lengths = None
        if trace.block_off is not None and trace.block_ids is not None:  # the first m chains
            off = trace.block_off[: m + 1].copy()
            ids = trace.block_ids[: off[-1]].copy()
            lengths = trace.block_len[:m].copy()
        return Requests(
            arrival_s,
            trace.prompt_tokens[:m].copy(),
            trace.output_tokens[:m].copy(),
            trace.priority[:m].copy(),
            trace.class_names,
            off,
            ids,
            block_len=lengths,
            block_group=ENGINE_BLOCKS_PER_TRACE_BLOCK if off is not None else 1,
        )

    @property
    def num_requests(self) -> int:
        return self._kept(self.load())

    @property
    def skipped_rows(self) -> int:
        return self.load().skipped_rows

    @property
    def rate_req_s(self) -> float:
        """Mean arrival rate of the requests replayed."""
        return self.generate().mean_rate_req_s

    def with_rate(self, rate_req_s: float) -> TraceWorkload:
        """A copy whose speed-up makes the mean rate of the first max_requests requests
        (the whole trace when unset) equal rate_req_s."""
        check_range("rate_req_s", rate_req_s, 0, MAX_RATE_REQ_S, low_open=True)
        trace = self.load()
        m = len(trace) if self.max_requests is None else min(len(trace), self.max_requests)
        span = float(trace.arrival_s[m - 1] - trace.arrival_s[0])
        if m < 2 or span <= 0:
            raise ValueError("rate_req_s cannot be set: the trace's requests all arrive at once")
        recorded = (m - 1) / span
        speedup = rate_req_s / recorded
        if not 0 < speedup <= MAX_SPEEDUP:
            raise ValueError(
                f"rate_req_s={show(rate_req_s)} is {speedup:,.4g}x the trace's recorded mean rate of "
                f"{recorded:,.4g} req/s; allowed up to {MAX_SPEEDUP:,.0f}x it, {MAX_SPEEDUP * recorded:,.4g} req/s"
            )
        kept = replace(self, speedup=speedup)._kept(trace)
        with np.errstate(over="ignore"):
            last = trace.arrival_s[kept - 1: kept] / speedup
        _check_arrivals(last, f"rate_req_s={show(rate_req_s)}", "use a higher rate_req_s")
        return replace(self, speedup=speedup)

    def with_num_requests(self, n: int) -> TraceWorkload:
        return replace(self, max_requests=n)

    def with_seed(self, s: int) -> TraceWorkload:
        """A trace has no randomness: the same workload (for a uniform interface)."""
        return self


def workload_preset(
    name: str, rate_req_s: float = DEFAULT_RATE_REQ_S, num_requests: int = 2000, seed: int = 0
) -> SyntheticWorkload:
    """A Poisson workload with the named preset's classes (and its sessions, for the WORKLOAD_SESSIONS
    presets: session starts are then the Poisson process)."""
    if name not in WORKLOAD_PRESETS:
        raise ValueError(
            f"workload preset {name!r} is unknown; allowed: {', '.join(WORKLOAD_PRESETS)}"
        )
    workload = SyntheticWorkload(
        ArrivalProcess("poisson", rate_req_s), WORKLOAD_PRESETS[name], num_requests, seed,
        WORKLOAD_SESSIONS.get(name),
    )
    workload.validate()
    return workload
