"""Request streams for the simulator: synthetic workloads and replayed traces.

Both kinds produce a ``Requests`` (per-request arrays sorted by arrival) and are
deterministic: a ``SyntheticWorkload`` for its seed, a ``TraceWorkload`` for its bytes.
Every config is a frozen dataclass whose ``validate()`` raises ``ValueError`` naming the
field, the value and the allowed range.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from batching.sim.traces import FORMATS, MAX_ABS_TIME_S, MAX_PRIORITY_LEVELS, MAX_TOKENS, TraceData, load_trace

LENGTH_KINDS = ("fixed", "uniform", "lognormal", "empirical")
ARRIVAL_KINDS = ("poisson", "gamma", "constant", "onoff")
# The sidebar's and the CLI's default request rate (the single source). On the default scenario (Qwen2.5-72B
# BF16 on 8xH100, TP 8, the `mixed` workload, 2,000 requests, seed 0) the saturated runs serve static 1.17,
# dynamic 1.29, continuous 8.4, chunked and priority 8.6 req/s. 1 req/s is the round rate every preset carries
# (static 85 %, dynamic 77 % of capacity; neither queue grows over the run), so the showdown compares every
# policy at a load it can sustain; the latency-against-load chart shows what happens past it. At the old 3
# req/s static and dynamic were 2.5x over capacity and their latencies only measured the run's length.
DEFAULT_RATE_REQ_S = 1.0
MAX_RATE_REQ_S = 10_000.0
# Requests one simulation may take. Memory grows with requests and with simulated steps (benchmarks/
# bench_memory.py: ~0.2 KB per request + ~0.3 KB per step): about 1 KB per request on a saturated node (~2
# steps per request), 6.5 KB at the default scenario (~21 steps), ~63 KB when every request runs alone (one
# step per output token). 10^6 requests of the default scenario peak at 6.3 GiB, which leaves room on the
# documented 2-core, 24 GiB host; 10^7 (the old cap) would need ~65 GB.
MAX_NUM_REQUESTS = 1_000_000
MAX_SPEEDUP = 1000.0
MAX_PERIOD_S = 86_400.0  # on/off period lengths up to a day
MAX_CV = 20.0


def _show(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return repr(value)
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.10g}"
    return str(value)


def _check(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    """Raise unless low <= value <= high (low < value when low_open)."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    )
    ok = is_number and (low < value if low_open else low <= value) and value <= high
    if not ok:
        allowed = f"> {_show(low)}" if low_open else _show(low)
        raise ValueError(
            f"{name}={_show(value)} is out of range; allowed {allowed} to {_show(high)}"
        )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name}={_show(value)} is not an integer; allowed {low} to {high}")
    _check(name, value, low, high)


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
    block_off: np.ndarray | None = None  # int64, n + 1 offsets
    block_ids: np.ndarray | None = None  # int64 ids
    # Multi-turn sessions (None: open loop, arrival_s is every request's arrival). after[r] >= 0: request r
    # arrives think_s[r] seconds after request after[r] (an earlier index) is released, so its arrival_s is only a
    # lower bound (the arrival of after[r] + think_s[r]), used for ordering; the engine reports the real arrival.
    after: np.ndarray | None = None  # int64, -1 for a session's first turn and for independent requests
    think_s: np.ndarray | None = None  # float64 seconds

    def __post_init__(self) -> None:
        for name, dtype in (
            ("arrival_s", np.float64),
            ("prompt_tokens", np.int64),
            ("output_tokens", np.int64),
            ("priority", np.int64),
        ):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        for name, dtype in (("block_off", np.int64), ("block_ids", np.int64), ("after", np.int64),
                            ("think_s", np.float64)):
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
                    f"{name} holds {_show(values.min())}..{_show(values.max())}; "
                    f"allowed 1 to {MAX_TOKENS}"
                )
        k = len(self.class_names)
        if not 1 <= k <= MAX_PRIORITY_LEVELS:
            raise ValueError(f"class_names has {k} names; allowed 1 to {MAX_PRIORITY_LEVELS}")
        if n and (self.priority.min() < 0 or self.priority.max() >= k):
            raise ValueError(
                f"priority holds {self.priority.min()}..{self.priority.max()}; allowed 0 to {k - 1}"
            )

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
        """A copy with every request arriving at 0 (for capacity runs)."""
        return replace(self, arrival_s=np.zeros(len(self)))

    def subset(self, idx: np.ndarray | slice | list[int]) -> Requests:
        """The requests picked by a boolean mask, indices or a slice, kept in arrival order."""
        rows = np.sort(np.arange(len(self))[idx])
        return Requests(
            self.arrival_s[rows],
            self.prompt_tokens[rows],
            self.output_tokens[rows],
            self.priority[rows],
            self.class_names,
        )

    def to_frame(self) -> pd.DataFrame:
        names = np.array(self.class_names, dtype=object)
        return pd.DataFrame(
            {
                "arrival_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "priority": self.priority,
                "class_name": names[self.priority] if len(self) else np.array([], dtype=object),
            }
        )

    @classmethod
    def from_trace(cls, trace: TraceData) -> Requests:
        return cls(
            trace.arrival_s.copy(),
            trace.prompt_tokens.copy(),
            trace.output_tokens.copy(),
            trace.priority.copy(),
            trace.class_names,
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
        _check_int("low", self.low, 1, MAX_TOKENS)
        _check_int("high", self.high, self.low, MAX_TOKENS)
        if self.kind in ("fixed", "lognormal"):
            _check("mean", self.mean, 1, MAX_TOKENS)
        if self.kind == "lognormal":
            _check("cv", self.cv, 0, MAX_CV)
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
    (cv > 1 is burstier than Poisson). constant: evenly spaced. onoff: Poisson at
    rate_req_s * (on_s + off_s) / on_s during on periods and nothing during off periods.
    """

    kind: str = "poisson"
    rate_req_s: float = DEFAULT_RATE_REQ_S
    cv: float = 2.0  # gamma only
    on_s: float = 10.0  # onoff only
    off_s: float = 10.0  # onoff only

    def validate(self) -> None:
        _check_choice("kind", self.kind, ARRIVAL_KINDS)
        _check("rate_req_s", self.rate_req_s, 0, MAX_RATE_REQ_S, low_open=True)
        if self.kind == "gamma":
            _check("cv", self.cv, 0, MAX_CV, low_open=True)
        if self.kind == "onoff":
            _check("on_s", self.on_s, 0, MAX_PERIOD_S, low_open=True)
            _check("off_s", self.off_s, 0, MAX_PERIOD_S)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n sorted arrival times in seconds, the first at 0.

        Gaps are standard variates divided by the rate, so the same seed at another rate
        gives the same stream rescaled in time.
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
        raise ValueError(f"kind={self.kind!r} is not allowed; allowed: {', '.join(ARRIVAL_KINDS)}")


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

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 64:
            raise ValueError(f"name={self.name!r} is not allowed; allowed 1 to 64 characters")
        _check_int("priority", self.priority, 0, MAX_PRIORITY_LEVELS - 1)
        _check("share", self.share, 0, 1)
        for part in (self.prompt, self.output):
            part.validate()
        for name in ("slo_ttft_s", "slo_tpot_s"):
            value = getattr(self, name)
            if value is not None:
                _check(name, value, 0, 3600, low_open=True)


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
}


# ---------------------------------------------------------------- workloads


@dataclass(frozen=True)
class SyntheticWorkload:
    """num_requests requests: arrivals from ``arrivals``, each request's class drawn by
    share, its lengths from its class. Same seed, same requests; the arrival, class and
    per-class length streams are independent, so changing the rate keeps the lengths."""

    arrivals: ArrivalProcess = ArrivalProcess()
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    num_requests: int = 2000
    seed: int = 0

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
        _check_int("num_requests", self.num_requests, 1, MAX_NUM_REQUESTS)
        _check_int("seed", self.seed, 0, 2**63 - 1)

    @property
    def rate_req_s(self) -> float:
        return self.arrivals.rate_req_s

    def generate(self) -> Requests:
        self.validate()
        n = self.num_requests
        streams = np.random.SeedSequence(self.seed).spawn(2 + MAX_PRIORITY_LEVELS)
        arrival_s = self.arrivals.times(np.random.default_rng(streams[0]), n)
        _check_arrivals(arrival_s, f"rate_req_s={_show(self.rate_req_s)} with num_requests={n}",
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
        return Requests(arrival_s, prompt, output, level, tuple(c.name for c in classes))

    def with_rate(self, rate_req_s: float) -> SyntheticWorkload:
        return replace(self, arrivals=replace(self.arrivals, rate_req_s=rate_req_s))

    def with_num_requests(self, n: int) -> SyntheticWorkload:
        return replace(self, num_requests=n)

    def with_seed(self, s: int) -> SyntheticWorkload:
        return replace(self, seed=s)

    def with_high_share(self, share_high: float) -> SyntheticWorkload:
        """Priority-0 class gets share_high; the others share the rest in their old ratio."""
        _check("share_high", share_high, 0, 1)
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


@functools.lru_cache(maxsize=8)
def _load_cached(data: bytes, fmt: str, filename: str, skip_bad_rows: bool) -> TraceData:
    trace = load_trace(data, fmt=fmt, filename=filename, skip_bad_rows=skip_bad_rows)
    for a in (trace.arrival_s, trace.prompt_tokens, trace.output_tokens, trace.priority):
        a.flags.writeable = False  # shared by every caller of the cache
    return trace


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
        _check("speedup", self.speedup, 0, MAX_SPEEDUP, low_open=True)
        if self.max_requests is not None:
            _check_int("max_requests", self.max_requests, 1, MAX_NUM_REQUESTS)
        if self.max_duration_s is not None:
            _check("max_duration_s", self.max_duration_s, 0, 1e9, low_open=True)

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
        _check_arrivals(arrival_s, f"speedup={_show(self.speedup)} (the trace's last arrival at "
                                   f"{_show(float(trace.arrival_s[m - 1]))} s)", "use a larger speedup")
        return Requests(
            arrival_s,
            trace.prompt_tokens[:m].copy(),
            trace.output_tokens[:m].copy(),
            trace.priority[:m].copy(),
            trace.class_names,
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
        _check("rate_req_s", rate_req_s, 0, MAX_RATE_REQ_S, low_open=True)
        trace = self.load()
        m = len(trace) if self.max_requests is None else min(len(trace), self.max_requests)
        span = float(trace.arrival_s[m - 1] - trace.arrival_s[0])
        if m < 2 or span <= 0:
            raise ValueError("rate_req_s cannot be set: the trace's requests all arrive at once")
        speedup = rate_req_s / ((m - 1) / span)
        if not 0 < speedup <= MAX_SPEEDUP:
            raise ValueError(
                f"rate_req_s={_show(rate_req_s)} needs speedup={_show(speedup)}, which is out "
                f"of range; allowed > 0 to {_show(MAX_SPEEDUP)}"
            )
        return replace(self, speedup=speedup)

    def with_num_requests(self, n: int) -> TraceWorkload:
        return replace(self, max_requests=n)

    def with_seed(self, s: int) -> TraceWorkload:
        """A trace has no randomness: the same workload (for a uniform interface)."""
        return self


def workload_preset(
    name: str, rate_req_s: float = DEFAULT_RATE_REQ_S, num_requests: int = 2000, seed: int = 0
) -> SyntheticWorkload:
    """A Poisson workload with the named preset's classes."""
    if name not in WORKLOAD_PRESETS:
        raise ValueError(
            f"workload preset {name!r} is unknown; allowed: {', '.join(WORKLOAD_PRESETS)}"
        )
    workload = SyntheticWorkload(
        ArrivalProcess("poisson", rate_req_s), WORKLOAD_PRESETS[name], num_requests, seed
    )
    workload.validate()
    return workload
