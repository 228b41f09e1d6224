"""What every command of ``python -m batching`` shares: the parser class, the number validators, the scenario,
policy and custom-spec flags, ``build_scenario``, the output-path checks and ``dispatch`` (parse, run, and turn
any problem with the input into one line on stderr and exit code 2).

Messages name the flag or field, the value (at most ``MAX_SHOWN_CHARS`` characters of it) and the allowed range.
Numbers must be written with ASCII digits: ``１２`` (full-width) is refused with a message saying so, ``1e3`` is
accepted for an integer flag (it is 1000), ``1e30`` is out of range, ``nan`` and ``inf`` are not finite.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.engines import DEFAULT_ENGINE, ENGINES, EngineProfile, parse_profile
from batching.sim.topology.disagg import KV_TRANSFER_FIXED_MAX_S, KV_TRANSFER_FIXED_S, MAX_INSTANCES, Disagg, check_requests
from batching.sim.topology.fleet import MAX_NODES, ROUTER_HELP, ROUTERS
from batching.sim.policy import KNOB_LIMITS, MODES, PREEMPTION_MODES, PRESETS, SPEC_METHODS, preset, with_knobs
from batching.sim.simulate import Scenario, admitted
from batching.sim.engine.speculative import check_spec, default_draft
from batching.sim.engine.spec_table import spec_fields, spec_text, with_default_acceptance
from batching.sim.hardware.specs import (GPUS, GPUS_PER_NODE, HF_ARCHITECTURES, KV_BLOCK_TOKENS, KV_DTYPES, MODELS,
                                         NODE_GPU_COUNTS, NOT_ASCII, PRECISIONS, TP_DEGREES, TWO_NODE_GPUS,
                                         Deployment, deployment, load_json_spec, number_text)
from batching.sim.workload.traces import MAX_TOKENS
from batching.sim.workload.requests import (ARTICLE_RATE_REQ_S, DEFAULT_RATE_REQ_S, MAX_CV, MAX_DIURNAL_PERIOD_S,
                                   MAX_NUM_REQUESTS, MAX_PEAK_TO_TROUGH, MAX_PERIOD_S, MAX_RATE_REQ_S,
                                   MAX_CLIENT_THINK_S, MAX_CONCURRENCY, WORKLOAD_PRESETS, LengthDist, PriorityClass,
                                   SyntheticWorkload, TraceWorkload, workload_preset)
from batching.studies.capacity import ATTAINMENT_DEFAULT, SLO, SLO_MAX_S, class_names, per_class_values

PROG = "python -m batching"
MAX_SHOWN_CHARS = 200  # of what a user typed, a message quotes at most this much
MAX_SEED = 2**63 - 1
DEFAULT_REQUESTS = 2000
DEFAULT_WORKLOAD = "mixed"
FIXED_CLASS = "fixed lengths"  # the one class of --prompt-tokens N --output-tokens M without --workload
SUMMARY_KEYS = ("num_requests", "rejected_requests", "num_steps", "throughput_output_tok_s", "steady_output_tok_s",
                "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "gpu_util", "busy", "mfu", "mbu", "batch_efficiency",
                "preemptions")
# printed and written beside SUMMARY_KEYS when the policy caches prefixes (issue 12)
PREFIX_KEYS = ("prefix_hit_rate", "cached_prompt_tokens")
# printed and written beside SUMMARY_KEYS when the policy speculates (issue 13)
SPEC_KEYS = ("spec_acceptance_rate", "mean_tokens_per_step", "spec_share", "draft_time_share")
SPEC_FLAGS = ("spec_tokens", "spec_acceptance", "spec_acceptance_length", "spec_draft_model",
              "spec_disable_batch_size")
ARRIVAL_FLAGS = ("--burstiness", "--on-off", "--rate-profile")
# printed and written beside SUMMARY_KEYS for a prefill/decode split (issue 13 §2)
DISAGG_KEYS = ("kv_pull_wait_p50_s", "kv_transfer_p50_s", "kv_transfer_p99_s", "decode_cached_tokens",
               "decode_queue_p50_s", "decode_queue_p99_s", "prefill_busy", "decode_busy")
# a split that speculates: the proposer's pass over the prompts, as a share of the prefill instances' forward passes
SPEC_DISAGG_KEYS = ("prefill_draft_time_share",)
# the split's flags (all four together or none) and the Disagg field each sets
DISAGG_FLAGS = {"--prefill-instances": "prefill_instances", "--prefill-tp": "prefill_tp",
                "--decode-instances": "decode_instances", "--decode-tp": "decode_tp"}
KV_LINK_MAX_GBPS = 1e5


class CliError(ValueError):
    """A problem with what the user asked for: ``dispatch`` prints it as one line and exits with code 2."""


def shown(text: object) -> str:
    """``text`` quoted for a message, cut to MAX_SHOWN_CHARS characters (with the full length said)."""
    text = str(text)
    if len(text) <= MAX_SHOWN_CHARS:
        return repr(text)
    return repr(text[:MAX_SHOWN_CHARS]) + f"... ({len(text):,} characters)"


_LONG_QUOTE = re.compile(r"'([^'\n]{%d})[^'\n]+'" % MAX_SHOWN_CHARS)


def one_line(message: str) -> str:
    """A message as one line of at most a few hundred characters: newlines become spaces, long quoted values
    (argparse quotes the whole of an invalid choice) are cut to MAX_SHOWN_CHARS characters."""
    message = " ".join(str(message).split())
    message = _LONG_QUOTE.sub(lambda m: f"'{m.group(1)}...'", message)
    found = message.find("unrecognized arguments: ")
    if found >= 0 and len(message) - found > MAX_SHOWN_CHARS + 24:
        message = message[: found + 24 + MAX_SHOWN_CHARS] + "..."
    return message


class Parser(argparse.ArgumentParser):
    """argparse with one clear line on stderr and exit code 2 for a bad flag."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


# ---------------------------------------------------------------- numbers


def _ascii(text: str) -> str:
    """The text of a number, refused as a link refuses it when it is not ASCII (specs.number_text: one syntax)."""
    try:
        number_text(text)
    except ValueError as exc:
        if str(exc) == NOT_ASCII:
            raise argparse.ArgumentTypeError(f"{shown(text)} {NOT_ASCII}") from None
    return text.strip()


def _typed(text: str) -> str:
    """A number as typed: bare when short, quoted and cut when long."""
    return text if len(text) <= 30 else shown(text)


def _non_finite(text: str) -> str:
    """Why a number that parsed as NaN or infinity is refused: written so, or too large for a float."""
    return "is not a finite number" if text.lower().lstrip("+-") in ("nan", "inf", "infinity") else "is out of range"


def _allowed(low, high, low_open: bool = False) -> str:
    if low is None:
        return "a finite number"
    return f"{'> ' if low_open else ''}{low:g} to {high:g}"


def int_arg(low: int, high: int, choices: tuple[int, ...] | None = None):
    """An argparse type: a whole number from low to high (one of ``choices`` when given). ``1e3`` is 1000."""
    allowed = f"allowed {', '.join(map(str, choices))}" if choices else f"allowed {low} to {high}"

    def parse(text: str) -> int:
        t = _ascii(text)
        try:
            value = int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{shown(text)} is not a number; {allowed}") from None
            if not math.isfinite(f):
                raise argparse.ArgumentTypeError(f"{shown(text)} {_non_finite(t)}; {allowed}") from None
            if not low <= f <= high:  # before int(): 1e30 is whole, and far out of range
                raise argparse.ArgumentTypeError(f"{_typed(t)} is out of range; {allowed}") from None
            if f != int(f):
                raise argparse.ArgumentTypeError(f"{_typed(t)} is not a whole number; {allowed}") from None
            value = int(f)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{_typed(t)} is out of range; {allowed}")
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"{value} is not allowed; {allowed}")
        return value

    return parse


def float_arg(low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse type: a finite number, from low to high when given (above low when ``low_open``)."""
    allowed = f"allowed {_allowed(low, high, low_open)}"

    def parse(text: str) -> float:
        t = _ascii(text)
        try:
            value = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number; {allowed}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{shown(text)} {_non_finite(t)}; {allowed}")
        if low is not None and not ((low < value) if low_open else (low <= value)) or \
                high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{_typed(t)} is out of range; {allowed}")
        return value

    return parse


MAX_SWEEP_VALUES = 100


def values_arg(text: str) -> list[float]:
    """``--values``: finite numbers separated by commas (1 to MAX_SWEEP_VALUES of them)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("it is empty; give numbers separated by commas, e.g. 16,32,64")
    if len(parts) > MAX_SWEEP_VALUES:
        raise argparse.ArgumentTypeError(f"{len(parts):,} values; allowed 1 to {MAX_SWEEP_VALUES}")
    out = []
    for p in parts:
        if not p.isascii():
            raise argparse.ArgumentTypeError(
                f"{shown(p)} has characters other than ASCII (full-width digits?); write it with 0-9")
        try:
            v = float(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(p)} is not a number; give numbers separated by "
                                             "commas, e.g. 16,32,64") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{shown(p)} {_non_finite(p)}; give finite numbers "
                                             "separated by commas, e.g. 16,32,64")
        out.append(v)
    return out


def _number(flag_part: str, text: str, low: float, high: float, low_open: bool, example: str) -> float:
    """One number of a compound flag value (``--on-off``, ``--rate-profile``), checked against its range."""
    t = text.strip()
    allowed = f"allowed {_allowed(low, high, low_open)}"
    if not t:
        raise argparse.ArgumentTypeError(f"{flag_part} is empty; {allowed} (e.g. {example})")
    if not t.isascii():
        raise argparse.ArgumentTypeError(
            f"{flag_part} {shown(t)} has characters other than ASCII (full-width digits?); write it with 0-9")
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag_part} {shown(t)} is not a number; {allowed} (e.g. {example})") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{flag_part} {shown(t)} {_non_finite(t)}; {allowed}")
    if (v <= low if low_open else v < low) or v > high:
        raise argparse.ArgumentTypeError(f"{flag_part} {_typed(t)} is out of range; {allowed}")
    return v


def on_off_arg(text: str) -> tuple[float, float]:
    """``--on-off ON_S,OFF_S``: seconds of traffic, then seconds of silence, repeated."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not ON_S,OFF_S; give two numbers of seconds separated "
                                         "by a comma, e.g. 10,20")
    on = _number("ON_S", parts[0], 0.0, MAX_PERIOD_S, True, "10,20")
    off = _number("OFF_S", parts[1], 0.0, MAX_PERIOD_S, False, "10,20")
    return on, off


def rate_profile_arg(text: str) -> tuple[float, float | None]:
    """``--rate-profile PEAK:TROUGH[:PERIOD_S]``: a diurnal (sinusoidal) rate whose highest rate is PEAK/TROUGH
    times its lowest, with that period (None when not given: the run's length, see ``profile_period``); the mean
    stays --rate. Returns (peak_to_trough, period_s)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not PEAK:TROUGH[:PERIOD_S]; e.g. 3:1 (peak rate 3 "
                                         "times the trough, one cycle over the run) or 3:1:3600 (an hour's cycle)")
    peak = _number("PEAK", parts[0], 0.0, MAX_RATE_REQ_S, True, "3:1")
    trough = _number("TROUGH", parts[1], 0.0, MAX_RATE_REQ_S, True, "3:1")
    ratio = peak / trough
    if not 1.0 <= ratio <= MAX_PEAK_TO_TROUGH:
        raise argparse.ArgumentTypeError(
            f"PEAK:TROUGH {_typed(parts[0].strip())}:{_typed(parts[1].strip())} is a ratio of {ratio:.4g}; allowed "
            f"1 to {MAX_PEAK_TO_TROUGH:g} (the peak at least the trough)")
    period = None if len(parts) == 2 else _number("PERIOD_S", parts[2], 0.0, MAX_DIURNAL_PERIOD_S, True, "3:1:3600")
    return ratio, period


def profile_period(num_requests: int, rate_req_s: float) -> float:
    """--rate-profile's period when not given: the run's expected length, requests / rate, so the run sees one
    whole cycle (trough, peak, trough) and its mean rate is --rate; within the allowed range."""
    return min(max(num_requests / rate_req_s, 1.0), MAX_DIURNAL_PERIOD_S)


# ---------------------------------------------------------------- SLOs (capacity, sweep)

# flag -> (SLO field, the flag's unit per second)
SLO_FLAGS = {"--slo-ttft-ms": ("ttft_s", 1e3), "--slo-tpot-ms": ("tpot_s", 1e3), "--slo-e2e-s": ("e2e_s", 1.0)}


def slo_list_arg(high: float):
    """An argparse type: one target (every class) or a comma list with one per priority class, class 0 first,
    each above 0 and at most ``high`` in the flag's unit; a tuple of floats."""

    def parse(text: str) -> tuple[float, ...]:
        try:
            return per_class_values(text, high)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_slo_args(p: argparse.ArgumentParser, default_note: str = "") -> None:
    """--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-s (each one value or one per class) and --attainment."""
    g = p.add_argument_group("SLOs" + (f" ({default_note})" if default_note else ""))
    per = "one value for every class, or a comma list with one per priority class, class 0 first"
    g.add_argument("--slo-ttft-ms", type=slo_list_arg(SLO_MAX_S * 1e3), default=None,
                   help=f"time to first token target, ms: {per} (e.g. 1000,30000)")
    g.add_argument("--slo-tpot-ms", type=slo_list_arg(SLO_MAX_S * 1e3), default=None,
                   help=f"time per output token target, ms: {per}")
    g.add_argument("--slo-e2e-s", type=slo_list_arg(SLO_MAX_S), default=None,
                   help=f"end-to-end latency target, s: {per}")
    g.add_argument("--attainment", type=float_arg(0.0, 1.0, low_open=True), default=None,
                   help=f"share of requests that must meet the SLOs of their class (default {ATTAINMENT_DEFAULT:g})")


def slo_from_args(args, scenario: Scenario) -> SLO | None:
    """The SLO the flags give, each list checked against the scenario's priority classes (a CliError naming the
    flag); None when no target flag is given."""
    names = class_names(scenario)
    k = len(names)
    given = {}
    for flag, (field, per_s) in SLO_FLAGS.items():
        values = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if values is None:
            continue
        if len(values) not in (1, k):
            listed = ", ".join(names)
            listed = listed if len(listed) <= 120 else listed[:120] + "..."
            want = "1 value" if k == 1 else f"1 value (every class) or {k}, class 0 first"
            raise CliError(f"{flag}: {len(values)} values for {k} class{'es' if k != 1 else ''} ({listed}); "
                           f"give {want}")
        given[field] = tuple(v / per_s for v in values)
    if not given:
        return None
    attainment = ATTAINMENT_DEFAULT if args.attainment is None else args.attainment
    slo = SLO(**given, attainment=attainment)
    slo.validate(k)
    return slo


# ---------------------------------------------------------------- flags


def add_spec_arguments(group, allreduce: bool = True) -> None:
    """--model-json, --gpu-json, --kv-dtype and (``allreduce``) --allreduce, on the scenario argument group."""
    group.add_argument("--model-json", type=Path, default=None,
                       help="a custom model (overrides --model): JSON with Model's fields, or a Hugging Face "
                            f"config.json of {', '.join(HF_ARCHITECTURES)} (DeepSeek-V2/V3 and Kimi-K2 load with "
                            "multi-head latent attention; other architectures are refused); its context length comes "
                            "from max_position_embeddings (and the RoPE scaling, as vLLM reads them), its MTP "
                            "modules from num_nextn_predict_layers")
    group.add_argument("--gpu-json", type=Path, default=None,
                       help="a custom GPU: JSON with name, memory_gib, hbm_bandwidth_tb_s, peak_bf16_tflops "
                            "[, peak_fp8_tflops, nvlink_gb_s, pcie_gb_s, arch, peak_fp4_tflops] (overrides --gpu)")
    group.add_argument("--kv-dtype", default="auto", choices=list(KV_DTYPES),
                       help="KV cache dtype: auto (= BF16 activations) or fp8 (half the bytes per token)")
    if not allreduce:
        return
    group.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES),
                       help="engine profile: its per-step CPU time, client-side times, kernel factors, all-reduce and "
                            "scheduler defaults (--preset engine): " + "; ".join(
                                f"{k} = {v.label}" for k, v in ENGINES.items()) + " (docs/CALIBRATION.md, 'Engine "
                            "profiles'; default vllm)")
    group.add_argument("--profile", type=Path, default=None, metavar="FILE",
                       help="an engine profile JSON (EngineProfile.to_dict's fields; overrides --engine)")
    group.add_argument("--allreduce", default=None, choices=list(cm.ALLREDUCE_IMPLS),
                       help="measured all-reduce table: vllm_graph (vLLM custom all-reduce in CUDA graphs), "
                            "vllm_eager, nccl, trtllm, vidur_nccl; default: the engine profile's (vllm, sglang: "
                            "vllm_graph; trtllm: trtllm)")


def engine_from_args(args) -> str | EngineProfile:
    """The engine --engine names, or the profile --profile FILE holds (a CliError naming the file and field)."""
    path = getattr(args, "profile", None)
    if path is None:
        return getattr(args, "engine", None) or DEFAULT_ENGINE
    data = _input_file("--profile", path)  # its errors name the flag and the file already
    try:
        return parse_profile(data)
    except ValueError as exc:
        raise CliError(f"--profile {shown(path)}: {exc}") from None


def add_layout_args(g) -> None:
    """--ep and --dp-attention: how a mixture of experts is laid out over the tensor-parallel group."""
    g.add_argument("--ep", type=int_arg(1, TWO_NODE_GPUS, choices=TP_DEGREES), default=1,
                   help="expert parallelism: 1 (experts split by tensor parallelism, default) or = --tp (whole "
                        "experts spread over the group's GPUs, as vLLM --enable-expert-parallel)")
    g.add_argument("--dp-attention", action="store_true", default=False,
                   help="data-parallel attention (SGLang --enable-dp-attention, dp = tp): each GPU runs attention "
                        "for its own sequences with every head and holds only their KV cache; the experts stay "
                        "shared")


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario")
    g.add_argument("--gpu", default="h100-sxm", choices=list(GPUS))
    g.add_argument("--num-gpus", type=int_arg(1, TWO_NODE_GPUS, choices=NODE_GPU_COUNTS), default=None,
                   help=f"GPUs in the node (1-{GPUS_PER_NODE}; default {GPUS_PER_NODE}), or {TWO_NODE_GPUS}: two "
                        f"nodes serving --tp {TWO_NODE_GPUS} (the default with --tp {TWO_NODE_GPUS})")
    g.add_argument("--model", default="qwen2.5-72b", choices=list(MODELS))
    g.add_argument("--tp", type=int_arg(1, TWO_NODE_GPUS, choices=TP_DEGREES), default=None,
                   help="tensor parallel degree {1,2,4,8,16} (default: the largest that divides --num-gpus, 8 on a "
                        f"full node); {TWO_NODE_GPUS}: one replica over two nodes, its all-reduces across the "
                        "network between them (not calibrated: docs/CALIBRATION.md)")
    g.add_argument("--precision", default="bf16", choices=list(PRECISIONS),
                   help="weights: bf16, fp8, or nvfp4 (4-bit with FP8 block scales and an FP8 KV cache; B200 only)")
    add_layout_args(g)
    g.add_argument("--nodes", "--num-nodes", dest="nodes", type=int_arg(1, MAX_NODES), default=1,
                   help=f"identical nodes in the fleet (1-{MAX_NODES}), each with num-gpus / tp replicas; with a "
                        "prefill/decode split, the nodes its instances spread over")
    g.add_argument("--router", default="round-robin", choices=list(ROUTERS),
                   help="how each arriving request picks a replica: " + "; ".join(
                       f"{k}: {v}" for k, v in ROUTER_HELP.items()))
    g.add_argument("--workload", default=None, choices=list(WORKLOAD_PRESETS),
                   help=f"a workload preset (default {DEFAULT_WORKLOAD}); with --prompt-tokens and --output-tokens "
                        f"and no --workload: one class, '{FIXED_CLASS}', of those lengths")
    g.add_argument("--rate", type=float_arg(0.0, MAX_RATE_REQ_S, low_open=True), default=None,
                   help=f"requests per second (default {DEFAULT_RATE_REQ_S:g}; "
                        f"{ARTICLE_RATE_REQ_S:g} for --workload article, the article's setting)")
    g.add_argument("--requests", type=int_arg(1, MAX_NUM_REQUESTS), default=None,
                   help=f"number of requests (default {DEFAULT_REQUESTS}, at most {MAX_NUM_REQUESTS:,})")
    g.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0)
    g.add_argument("--trace", type=Path, default=None,
                   help="replay a trace file: native CSV/JSONL, Azure, BurstGPT, Vidur, or Mooncake JSON lines "
                        "(timestamp ms, input_length, output_length, hash_ids: its shared prefixes are replayed)")
    g.add_argument("--prompt-tokens", type=int_arg(1, MAX_TOKENS), default=None,
                   help="fixed prompt length; with --output-tokens and no --workload, every request has these two "
                        "lengths (one class); beside a --workload, or alone, it replaces the prompt length of each "
                        "of the preset's classes, which keep their shares, SLOs and output lengths")
    g.add_argument("--output-tokens", type=int_arg(1, MAX_TOKENS), default=None,
                   help="fixed output length (as --prompt-tokens, for the output)")
    g.add_argument("--kv-cache-tokens", type=int_arg(KV_BLOCK_TOKENS, 2**40), default=None,
                   help="shrink the KV cache to this many tokens")
    g.add_argument("--shared-prefix-tokens", type=int_arg(0, MAX_TOKENS), default=None,
                   help="every request of every class starts with the same system prompt of this many tokens "
                        "(counted in its prompt; prefix caching computes it once)")
    add_spec_arguments(g)
    add_disagg_args(p)
    c = p.add_argument_group("closed-loop clients (synthetic workloads; instead of --rate)")
    c.add_argument("--concurrency", type=int_arg(1, MAX_CONCURRENCY), default=None, metavar="N",
                   help=f"N clients (1-{MAX_CONCURRENCY:,}, at most --requests), each sending its next request when "
                        "its previous one completes, as vllm bench serve --max-concurrency, SGLang bench_serving "
                        "--max-concurrency and genai-perf --concurrency; latencies are measured from each send; "
                        "capacity then searches the highest concurrency within the SLOs")
    c.add_argument("--think-time-s", type=float_arg(0.0, MAX_CLIENT_THINK_S), default=None, metavar="S",
                   help="with --concurrency: seconds a client waits between a response and its next request "
                        "(default 0)")
    a = p.add_argument_group("arrivals (synthetic workloads; default Poisson at --rate; one of these at most)")
    x = a.add_mutually_exclusive_group()
    x.add_argument("--burstiness", type=float_arg(0.0, MAX_CV, low_open=True), default=None, metavar="CV",
                   help="Gamma inter-arrival times with this coefficient of variation at the same mean rate: 1 is "
                        "Poisson, above 1 burstier (requests bunch up), below 1 more regular. vLLM's "
                        "benchmark --burstiness B is the Gamma shape, i.e. CV = 1/sqrt(B)")
    x.add_argument("--on-off", type=on_off_arg, default=None, metavar="ON_S,OFF_S",
                   help="bursts: Poisson traffic for ON_S seconds, then nothing for OFF_S seconds, repeated; the mean "
                        "rate stays --rate (the rate while on is --rate x (ON_S + OFF_S) / ON_S)")
    x.add_argument("--rate-profile", type=rate_profile_arg, default=None, metavar="PEAK:TROUGH[:PERIOD_S]",
                   help="a diurnal rate curve: a sinusoid from a trough (at t = 0) up to a peak PEAK/TROUGH times "
                        "higher and back over PERIOD_S seconds (default: the run's length, --requests / --rate, so "
                        "the run sees one whole cycle; 86400 is a day, and a run shorter than its period sees "
                        "less than --rate); the mean over whole periods is --rate")


def add_disagg_args(p: argparse.ArgumentParser) -> None:
    """--prefill-instances, --prefill-tp, --decode-instances, --decode-tp (all four or none) and --kv-link-gbps."""
    d = p.add_argument_group(
        "prefill/decode disaggregation (all four of the first flags together, or none; iteration-level batching: "
        "the presets continuous, chunked, priority)",
        "The GPUs split into prefill instances and decode instances, each with its own tensor-parallel degree "
        "(--tp is then not used by them): P x T + D x U GPUs, at most --num-gpus x --num-nodes. A prompt's KV moves "
        "from its prefill instance to the decode instance with the most free KV over NVLink within a node, or the "
        "network across nodes.")
    d.add_argument("--prefill-instances", type=int_arg(1, MAX_INSTANCES), default=None, metavar="P",
                   help=f"prefill instances (1-{MAX_INSTANCES})")
    d.add_argument("--prefill-tp", type=int_arg(1, 8, choices=(1, 2, 4, 8)), default=None, metavar="T",
                   help="tensor-parallel degree of each prefill instance {1,2,4,8}")
    d.add_argument("--decode-instances", type=int_arg(1, MAX_INSTANCES), default=None, metavar="D",
                   help=f"decode instances (1-{MAX_INSTANCES})")
    d.add_argument("--decode-tp", type=int_arg(1, 8, choices=(1, 2, 4, 8)), default=None, metavar="U",
                   help="tensor-parallel degree of each decode instance {1,2,4,8}")
    d.add_argument("--kv-link-gbps", type=float_arg(1.0, KV_LINK_MAX_GBPS), default=None, metavar="G",
                   help="KV transfer bandwidth per GPU, Gb/s (1 to 100000; only with the split). Default: the "
                        "GPU's NVLink when the split fits one node, 400 Gb/s per GPU across nodes")
    d.add_argument("--kv-transfer-fixed-ms", type=float_arg(0.0, KV_TRANSFER_FIXED_MAX_S * 1e3), default=None,
                   metavar="MS", help=f"fixed time per KV transfer before its bytes move, ms (0 to "
                                      f"{KV_TRANSFER_FIXED_MAX_S * 1e3:g}; only with the split). Default "
                                      f"{KV_TRANSFER_FIXED_S * 1e3:g} ms: vLLM's NixlConnector posting a transfer, "
                                      "measured (docs/CALIBRATION.md)")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy")
    g.add_argument("--preset", default="continuous", choices=list(PRESETS) + ["engine"],
                   help="a policy preset, or engine: the chosen engine profile's own scheduler defaults (vLLM 0.11: "
                        "chunked prefill, 8,192 tokens, 1,024 seqs; SGLang 0.5: 16,384-token prefill steps, 4,096 "
                        "seqs; TensorRT-LLM 1.0: 8,192 tokens, 2,048 seqs). Default continuous")
    g.add_argument("--mode", choices=list(MODES), default=None)
    g.add_argument("--max-batch-size", type=int_arg(*KNOB_LIMITS["max_batch_size"]), default=None)
    low, high = KNOB_LIMITS["max_wait_s"]
    g.add_argument("--max-wait-ms", type=float_arg(low * 1e3, high * 1e3), default=None)
    g.add_argument("--max-num-seqs", type=int_arg(*KNOB_LIMITS["max_num_seqs"]), default=None)
    g.add_argument("--max-num-batched-tokens",
                   type=int_arg(*KNOB_LIMITS["max_num_batched_tokens"]), default=None)
    g.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--priority", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--preemption", choices=list(PREEMPTION_MODES), default=None)
    add_prefix_caching_arg(g)
    add_spec_decode_args(g)


def add_spec_decode_args(g) -> None:
    """--spec-decode and its knobs (speculative decoding; iteration-level batching only)."""
    g.add_argument("--spec-decode", choices=list(SPEC_METHODS), default=None,
                   help="speculative decoding: draft (a smaller model of the family, --spec-draft-model), eagle "
                        "(EAGLE draft head), ngram (prompt lookup, no draft compute), mtp (the model's own "
                        "multi-token-prediction modules: DeepSeek-V3); default off")
    g.add_argument("--spec-tokens", type=int_arg(*KNOB_LIMITS["spec_tokens"]), default=None, metavar="K",
                   help="draft tokens proposed per sequence and step (default 3)")
    low, high = KNOB_LIMITS["spec_acceptance"]
    g.add_argument("--spec-acceptance", type=float_arg(low, high), default=None, metavar="A",
                   help="per-token acceptance probability; a verification emits (1 - A^(K+1)) / (1 - A) tokens on "
                        "average (default: the published acceptance of the method on the model's family, "
                        "batching/data/spec_acceptance.csv, or 0.8 where it has no row; the output says which)")
    g.add_argument("--spec-acceptance-length", type=float_arg(1.0, KNOB_LIMITS["spec_acceptance_length"][1]),
                   default=None,
                   metavar="L", help="acceptance as vLLM and SGLang report it: mean tokens per verification step, the "
                                     "bonus token included (1 to K + 1); replaces --spec-acceptance by the A with "
                                     "(1 - A^(K+1)) / (1 - A) = L")
    g.add_argument("--spec-draft-model", choices=list(MODELS), default=None,
                   help="the draft model of --spec-decode draft: a smaller model of the target's vocabulary (default: "
                        "the smallest such preset, qwen2.5-7b for the Qwen2.5 models, llama-3.1-8b for Llama 3.1)")
    g.add_argument("--spec-disable-batch-size", type=int_arg(*KNOB_LIMITS["spec_disable_batch_size"]), default=None,
                   metavar="N", help="speculation off while N or more sequences run (vLLM's "
                                     "speculative_disable_by_batch_size; default 0: never off; 1 is refused)")


def add_prefix_caching_arg(g, every_preset: bool = False) -> None:
    """--prefix-caching/--no-prefix-caching; ``every_preset``: for commands that run the five presets."""
    which = ("in the iteration-level presets (continuous, chunked, priority; static and dynamic batching have "
             "none). Default: each preset's own (on)" if every_preset else
             "Default: the preset's (on for continuous, chunked, priority; static and dynamic batching have none)")
    g.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="automatic prefix caching (vLLM V1, SGLang RadixAttention): prompt blocks already in the KV "
                        f"cache are not computed again, {which}")


def presets_with_caching(prefix_caching: bool | None) -> dict:
    """The five presets; --prefix-caching/--no-prefix-caching turns the cache on or off in the iteration-level
    ones (static and dynamic batching have none, either way)."""
    if prefix_caching is None:
        return dict(PRESETS)
    return {k: replace(p, prefix_caching=prefix_caching) if p.mode == "continuous" else p
            for k, p in PRESETS.items()}


POLICY_DEFAULTS = dict(preset="continuous", mode=None, max_batch_size=None, max_wait_ms=None, max_num_seqs=None,
                       max_num_batched_tokens=None, chunked_prefill=None, priority=None, preemption=None,
                       prefix_caching=None, spec_decode=None, spec_tokens=None, spec_acceptance=None,
                       spec_acceptance_length=None, spec_draft_model=None, spec_disable_batch_size=None)


# ---------------------------------------------------------------- the scenario


def apply_custom_specs(args, dep: Deployment) -> Deployment:
    """``dep`` with the GPU and model of --gpu-json / --model-json and --kv-dtype, validated
    (a model too big for the node is a ValueError that says what would fit)."""
    gpu_json = getattr(args, "gpu_json", None)
    model_json = getattr(args, "model_json", None)
    kv_dtype = getattr(args, "kv_dtype", None) or dep.kv_dtype
    node = dep.node if gpu_json is None else replace(dep.node, gpu=load_json_spec(gpu_json, "gpu"))
    model = dep.model if model_json is None else load_json_spec(model_json, "model")
    out = replace(dep, node=node, model=model, kv_dtype=kv_dtype)
    out.validate()
    return out


def deployment_from_args(args) -> Deployment:
    """What ``deployment(args.gpu, args.model, args.tp, args.num_gpus, args.precision,
    kv_cache_tokens=args.kv_cache_tokens)`` builds, with the custom specs applied before the
    memory check (so a custom model replaces a preset that would not fit)."""
    gpu = load_json_spec(args.gpu_json, "gpu") if getattr(args, "gpu_json", None) else args.gpu
    model = load_json_spec(args.model_json, "model") if getattr(args, "model_json", None) else args.model
    tp = args.tp  # default: the largest degree dividing --num-gpus; deployment() sizes the node from tp without it
    if tp is None:
        tp = max(t for t in TP_DEGREES if (args.num_gpus or GPUS_PER_NODE) % t == 0)
    return deployment(gpu, model, tp, args.num_gpus, args.precision,
                      kv_dtype=getattr(args, "kv_dtype", None) or "auto",
                      kv_cache_tokens=getattr(args, "kv_cache_tokens", None), ep=getattr(args, "ep", 1) or 1,
                      dp_attention=bool(getattr(args, "dp_attention", False)))


def _input_file(flag: str, path: Path) -> bytes:
    """The bytes of an input file, or a CliError saying why it cannot be read."""
    where = f"{flag} {shown(path)}"
    try:
        if path.is_dir():
            raise CliError(f"{where}: a folder, not a file")
        if not path.exists():
            raise CliError(f"{where}: no such file")
        if not path.is_file():
            raise CliError(f"{where}: not a regular file")
        return path.read_bytes()
    except PermissionError:
        raise CliError(f"{where}: cannot be read (permission denied)") from None
    except OSError as exc:
        raise CliError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})") from None


def trace_workload(path: Path, max_requests: int | None, rate: float | None) -> TraceWorkload:
    """The trace at ``path``, parsed and checked now (before any simulation); errors name the file."""
    wl = TraceWorkload(data=_input_file("--trace", path), filename=path.name, max_requests=max_requests)
    try:
        wl.generate()  # every row, the request cap and the time range checked
    except ValueError as exc:
        raise CliError(f"--trace {shown(path)}: {exc}") from None
    if rate is not None:  # a rate the file cannot be replayed at is the flag's problem, not the file's
        try:
            wl = wl.with_rate(rate)
            wl.generate()
        except ValueError as exc:
            msg = re.sub(r"^rate_req_s=\S+ ", "", str(exc)).replace("rate_req_s", "--rate")
            raise CliError(f"--rate {rate:g}: {msg} (replaying {shown(path.name)})") from None
    return wl


def arrival_flag(args) -> tuple[str, object] | None:
    """(flag, value) of the arrival flag given (they are mutually exclusive), or None."""
    for flag in ARRIVAL_FLAGS:
        v = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if v is not None:
            return flag, v
    return None


def arrival_params(args, num_requests: int = DEFAULT_REQUESTS, rate_req_s: float = DEFAULT_RATE_REQ_S
                   ) -> tuple[str, dict] | None:
    """(kind, params) for ``SyntheticWorkload.with_arrivals`` from --burstiness, --on-off or --rate-profile; None
    for Poisson (no flag, or --burstiness 1: a Gamma of CV 1 is the exponential gap, so the same requests)."""
    given = arrival_flag(args)
    if given is None:
        return None
    flag, v = given
    if flag == "--burstiness":
        return None if v == 1.0 else ("gamma", {"cv": float(v)})
    if flag == "--on-off":
        return "onoff", {"on_s": float(v[0]), "off_s": float(v[1])}
    period = v[1] if v[1] is not None else profile_period(num_requests, rate_req_s)
    return "diurnal", {"peak_to_trough": float(v[0]), "period_s": float(period)}


def synthetic_workload(args):
    """The preset workload of --workload with --rate, --requests, --seed, the fixed lengths, the arrival flag and
    --shared-prefix-tokens applied (errors name the flag)."""
    name = workload_name(args)
    default_rate = ARTICLE_RATE_REQ_S if name == "article" else DEFAULT_RATE_REQ_S
    wl = workload_preset(name, args.rate if args.rate is not None else default_rate,
                         args.requests or DEFAULT_REQUESTS, args.seed)
    if args.prompt_tokens and args.output_tokens and args.workload is None:  # the lengths given, and nothing else
        wl = replace(wl, classes=(PriorityClass(
            FIXED_CLASS, 0, 1.0, LengthDist("fixed", mean=args.prompt_tokens, low=1, high=args.prompt_tokens),
            LengthDist("fixed", mean=args.output_tokens, low=1, high=args.output_tokens)),))
    elif args.prompt_tokens or args.output_tokens:
        classes = []
        for c in wl.classes:
            if args.prompt_tokens:
                c = replace(c, prompt=LengthDist("fixed", mean=args.prompt_tokens, low=1, high=args.prompt_tokens))
            if args.output_tokens:
                c = replace(c, output=LengthDist("fixed", mean=args.output_tokens, low=1, high=args.output_tokens))
            classes.append(c)
        wl = replace(wl, classes=tuple(classes))
    arrivals = arrival_params(args, wl.num_requests, wl.rate_req_s)
    if arrivals is not None:
        flag = arrival_flag(args)[0]
        try:
            wl = wl.with_arrivals(arrivals[0], **arrivals[1])
            wl.validate()
        except ValueError as exc:
            raise CliError(f"{flag}: {exc}") from None
    prefix = getattr(args, "shared_prefix_tokens", None)
    if prefix:
        try:
            wl = wl.with_shared_prefix(prefix)
            wl.validate()
        except ValueError as exc:
            raise CliError(f"--shared-prefix-tokens {prefix}: {exc}") from None
    return closed_loop(args, wl)


def workload_name(args) -> str:
    """The --workload preset, ``DEFAULT_WORKLOAD`` when none is given."""
    return getattr(args, "workload", None) or DEFAULT_WORKLOAD


def closed_loop(args, wl: SyntheticWorkload) -> SyntheticWorkload:
    """``wl`` sent by --concurrency closed-loop clients (with --think-time-s); refuses --rate, the arrival flags and
    a sessions preset beside it, and --think-time-s without it."""
    n, think = getattr(args, "concurrency", None), getattr(args, "think_time_s", None)
    if n is None:
        if think is not None:
            raise CliError(f"--think-time-s {think:g}: needs --concurrency N (closed-loop clients); an open loop's "
                           "requests arrive at --rate")
        return wl
    if args.rate is not None:
        raise CliError(f"--concurrency {n} and --rate {args.rate:g} are exclusive: closed-loop clients send when "
                       "their previous request completes, an open loop at a rate; give one of them")
    given = arrival_flag(args)
    if given is not None:
        raise CliError(f"{given[0]} and --concurrency {n} are exclusive: the arrival flags shape an open loop's "
                       "arrivals; closed-loop clients send when their previous request completes")
    if wl.sessions is not None:
        raise CliError(f"--concurrency {n}: --workload {workload_name(args)} is multi-turn sessions (their own closed "
                       "loop, each turn after the previous answer); use another --workload")
    try:
        wl = wl.with_concurrency(n, think or 0.0)
        wl.validate()
    except ValueError as exc:
        raise CliError(f"--concurrency {n}: {exc}") from None
    return wl


def workload_from_args(args) -> SyntheticWorkload | TraceWorkload:
    """The workload of --trace (refusing the flags that shape synthetic traffic) or of the synthetic flags."""
    if args.trace is None:
        return synthetic_workload(args)
    given = arrival_flag(args)
    if given is not None:
        raise CliError(f"{given[0]}: shapes the arrivals of a synthetic workload; a --trace keeps its recorded "
                       "arrival times (--rate speeds it up or slows it down)")
    if getattr(args, "concurrency", None) is not None or getattr(args, "think_time_s", None) is not None:
        raise CliError("--concurrency/--think-time-s: closed-loop clients send a synthetic workload; a --trace keeps "
                       "its recorded arrival times")
    if getattr(args, "shared_prefix_tokens", None):
        raise CliError("--shared-prefix-tokens: applies to synthetic workloads; a --trace carries its own "
                       "prefixes (Mooncake's hash_ids) or none")
    return trace_workload(args.trace, args.requests, args.rate)


def build_scenario(args) -> Scenario:
    """The Scenario the scenario and policy flags describe, validated (nothing simulated yet)."""
    dep = deployment_from_args(args)
    wl = workload_from_args(args)
    engine = engine_from_args(args)
    prof = ENGINES[engine] if isinstance(engine, str) else engine
    base = prof.policy if args.preset == "engine" else preset(args.preset)
    caching = getattr(args, "prefix_caching", None)
    if caching and (args.mode or base.mode) != "continuous":
        raise CliError(f"--prefix-caching: needs iteration-level batching (mode continuous: the presets continuous, "
                       f"chunked, priority); {args.mode or args.preset} batching runs each batch as a whole and has "
                       "no prefix cache")
    if caching is None and args.mode is not None and args.mode != "continuous":
        caching = False  # --mode static/dynamic on a caching preset: request-level modes have no prefix cache
    spec = _spec_knobs(args, args.mode or base.mode)
    if spec["spec_decode"] == "draft" and spec["spec_draft_model"] is None:  # the target's own family
        spec["spec_draft_model"] = default_draft(dep.model)
        if spec["spec_draft_model"] is None:
            raise CliError(f"--spec-decode draft: no preset model drafts for {dep.model.name}: a draft needs its "
                           f"vocabulary ({dep.model.vocab_size:,} tokens) and fewer parameters; use eagle or ngram")
    pol = with_knobs(base, mode=args.mode, max_batch_size=args.max_batch_size,
                     max_wait_s=None if args.max_wait_ms is None else args.max_wait_ms / 1e3,
                     max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     chunked_prefill=args.chunked_prefill, priority=args.priority, preemption=args.preemption,
                     prefix_caching=caching, **spec)
    # no acceptance given: the published row for the method, the model's family and the workload (or the flat default,
    # said as such): engine/spec_table.py, batching/data/spec_acceptance.csv
    if spec["spec_acceptance"] is None and spec["spec_acceptance_length"] is None:
        pol = with_default_acceptance(pol, dep.model, None if args.trace is not None else workload_name(args))
    if args.router != "round-robin" and pol.mode != "continuous":
        raise CliError(f"--router {args.router}: reads each replica's state at every arrival and is built for "
                       f"iteration-level batching (mode continuous); {pol.mode} batching runs with --router round-robin")
    if all(getattr(args, field, None) is None for field in DISAGG_FLAGS.values()):
        _check_spec(pol, dep)  # (a split checks the proposer on each role's deployment: _disagg)
    try:
        reqs, _ = admitted(wl.generate(), dep.model)  # requests beyond the context are rejected, not all of them
    except ValueError as exc:
        raise CliError(f"{_workload_flag(args)}: {exc}") from None
    pol = pol.sized_for(dep.model.max_context_tokens, int(reqs.prompt_tokens.max()) if len(reqs) else 0)  # as vLLM V0
    dis = _disagg(args, dep, reqs, pol)
    sc = Scenario(dep, wl, pol, args.allreduce, nodes=args.nodes, router=args.router, disagg=dis, engine=engine)
    sc.validate()
    return sc


def spec_line(policy) -> str | None:
    """'# speculation: EAGLE, K = 3, A = 0.743 (2.71 tokens per verification); acceptance published: ...' (None: the
    policy does not speculate): what every command that runs speculation prints (issue 39 item 4)."""
    text = spec_text(policy)
    return f"# speculation: {text}" if text else None


def spec_json(policy) -> dict:
    """{"speculation": method, K, acceptance, tokens per verification, its source} for a command's JSON ({} without
    speculation)."""
    d = spec_fields(policy)
    return {"speculation": d} if d else {}


def _workload_flag(args) -> str:
    """The flag that sets the requests' lengths, for a message about them."""
    if args.trace is not None:
        return f"--trace {shown(args.trace)}"
    if getattr(args, "prompt_tokens", None) or getattr(args, "output_tokens", None):
        return "--prompt-tokens/--output-tokens"
    return f"--workload {workload_name(args)}"


_SPEC_FIELD = re.compile(r"^(spec_decode|spec_draft_model)='([^']*)':? (.*)$")


def _check_spec(pol, dep: Deployment) -> None:
    """``speculative.check_spec`` with the flag named: '--spec-draft-model qwen2.5-7b: cannot draft for ...'."""
    try:
        check_spec(pol, dep)
    except ValueError as exc:
        m = _SPEC_FIELD.match(str(exc))
        if m is None:
            raise
        raise CliError(f"--{m.group(1).replace('_', '-')} {m.group(2)}: {m.group(3)}") from None


def _disagg(args, dep: Deployment, reqs, pol) -> Disagg | None:
    """The prefill/decode split the flags give (None without them), checked against the deployment, the node count,
    the policy and the requests the model serves; one-line errors naming the flag."""
    given = {flag: getattr(args, field, None) for flag, field in DISAGG_FLAGS.items()}
    link = getattr(args, "kv_link_gbps", None)
    fixed_ms = getattr(args, "kv_transfer_fixed_ms", None)
    if all(v is None for v in given.values()):
        for flag, v in (("--kv-link-gbps", link), ("--kv-transfer-fixed-ms", fixed_ms)):
            if v is not None:
                raise CliError(f"{flag}: sets the KV transfer of a prefill/decode split; add "
                               "--prefill-instances, --prefill-tp, --decode-instances and --decode-tp")
        return None
    missing = [flag for flag, v in given.items() if v is None]
    if missing:
        have = [flag for flag, v in given.items() if v is not None]
        raise CliError(f"{', '.join(have)}: a prefill/decode split needs all four flags; missing "
                       f"{' and '.join(missing) if len(missing) <= 2 else ', '.join(missing)}")
    split = "--prefill-instances/--decode-instances"
    if pol.mode != "continuous":
        raise CliError(f"{split}: prefill/decode disaggregation needs iteration-level batching (mode continuous: the "
                       f"presets continuous, chunked, priority); {pol.mode} batching runs each batch as a whole")
    if args.router != "round-robin":
        raise CliError(f"--router {args.router}: a prefill/decode split routes by itself (prefill: least outstanding, "
                       "decode: most free KV); leave out --router")
    dis = Disagg(**{field: given[flag] for flag, field in DISAGG_FLAGS.items()}, kv_link_gbps=link,
                 kv_transfer_fixed_s=KV_TRANSFER_FIXED_S if fixed_ms is None else fixed_ms / 1e3)
    try:
        dis.validate(dep, args.nodes)
    except ValueError as exc:
        msg = str(exc)
        for flag, field in (*DISAGG_FLAGS.items(), ("--kv-link-gbps", "kv_link_gbps")):
            if msg.startswith(f"{field}="):
                raise CliError(f"{flag} {getattr(dis, field)}: {msg.split(' ', 1)[1]}") from None
        if msg.startswith("the split needs"):
            more = -(-dis.gpus // dep.node.num_gpus)
            fix = (f"or --num-nodes {more}" if more <= MAX_NODES else
                   f"a fleet has at most --num-nodes {MAX_NODES} ({MAX_NODES * dep.node.num_gpus:,} GPUs)")
            raise CliError(f"--prefill-instances/--prefill-tp/--decode-instances/--decode-tp: {msg}; use fewer or "
                           f"smaller instances, {fix}") from None
        role = "--prefill-tp" if msg.startswith("the prefill") else "--decode-tp"
        raise CliError(f"{role}: {msg}") from None
    try:  # the proposer must fit beside the model on each role's GPUs (both hold it: disagg.py)
        dis.check_spec(pol, dep)
    except ValueError as exc:
        raise CliError(f"--spec-decode {pol.spec_decode}: {exc}") from None
    try:
        check_requests(reqs, dis, dep, pol)
    except ValueError as exc:
        msg = str(exc)
        if "prefill instance" in msg or "decode instance" in msg:
            flag = f"--prefill-tp {dis.prefill_tp}" if "prefill instance" in msg else f"--decode-tp {dis.decode_tp}"
            if getattr(args, "kv_cache_tokens", None):
                flag += f" with --kv-cache-tokens {args.kv_cache_tokens}"
        elif "max_num_batched_tokens" in msg:
            flag = "--max-num-batched-tokens"
        elif "session" in msg:
            flag = "--trace" if args.trace is not None else f"--workload {workload_name(args)}"
        else:
            flag = split
        raise CliError(f"{flag}: {msg}") from None
    return dis


def _spec_knobs(args, mode: str) -> dict:
    """The speculative-decoding knobs the flags set; one-line errors for knobs without the method they tune."""
    method = getattr(args, "spec_decode", None)
    knobs = {k: getattr(args, k, None) for k in SPEC_FLAGS}
    given = [k for k, v in knobs.items() if v is not None]
    if method in (None, "off") and given:
        flag = "--" + given[0].replace("_", "-")
        raise CliError(f"{flag}: tunes speculative decoding; add --spec-decode draft, eagle, ngram or mtp")
    if knobs["spec_acceptance"] is not None and knobs["spec_acceptance_length"] is not None:
        raise CliError("--spec-acceptance-length: gives the acceptance as tokens per verification step; drop "
                       "--spec-acceptance (the per-token rate it replaces)")
    if knobs["spec_draft_model"] is not None and method != "draft":
        raise CliError(f"--spec-draft-model: is the draft model of --spec-decode draft (--spec-decode is {method})")
    if method not in (None, "off") and mode != "continuous":
        raise CliError(f"--spec-decode {method}: needs iteration-level batching (mode continuous: the presets "
                       f"continuous, chunked, priority); {mode} batching runs each batch as a whole")
    return {"spec_decode": method, **knobs}


# ---------------------------------------------------------------- outputs (checked before any simulation)

# the flags that name a file a command reads (argparse dest); an output is never one of them (issue 39 item 10)
INPUT_FLAGS = {"--trace": "trace", "--bench": "bench", "--profile": "profile", "--model-json": "model_json",
               "--gpu-json": "gpu_json"}
# the flags that name one file a command writes (specs --json - is stdout); --csv and --out name folders
OUTPUT_FILE_FLAGS = {"--json": "json", "--fit-out": "fit_out"}
_INPUTS: list[tuple[str, Path]] = []  # (flag, path) of the command running: set by dispatch (``note_inputs``)


def note_inputs(args) -> list[tuple[str, Path]]:
    """Remember the files the parsed command reads, for ``check_not_input``; returns them."""
    _INPUTS[:] = [(flag, Path(v)) for flag, dest in INPUT_FLAGS.items()
                  if (v := getattr(args, dest, None)) is not None]
    return list(_INPUTS)


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: os.path.samefile when both exist (a hard link, a symlink, another spelling),
    else the same path once relative parts and symlinks are resolved."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):  # an unreadable folder on the way, a NUL in the path: not provably the same
        return False


def check_not_input(flag: str, path: Path, why: str = "writing it would replace what the command reads: give "
                                                     "another path") -> None:
    """Refuse to write ``path`` when it is a file the command reads (``note_inputs``): one line naming both flags
    and the path, before anything is written (``write_files`` checks every file it writes; the commands check their
    outputs before simulating, too)."""
    for in_flag, in_path in _INPUTS:
        if same_file(path, in_path):
            same = "" if str(path) == str(in_path) else f" (the file {in_flag} {shown(in_path)} names)"
            raise CliError(f"{flag} {shown(path)}: is the input file of {in_flag}{same}; {why}")


def check_folder_inputs(flag: str, folder: Path | None, writes, why: str | None = None) -> None:
    """Before simulating: no input file sits in ``folder`` under a name the command will write there (``writes``:
    a name -> bool predicate, or a collection of names); ``why``: the message's reason, when it is not that exact
    name that will be written."""
    if folder is None:
        return
    wanted = writes if callable(writes) else (lambda name, names=frozenset(writes): name in names)
    for _, in_path in _INPUTS:
        try:
            names = {in_path.name, Path(os.path.realpath(in_path)).name}
        except (OSError, ValueError):
            names = {in_path.name}
        for name in sorted(names):
            if wanted(name):
                check_not_input(flag, Path(folder) / name, *(() if why is None else (why,)))



def _probe_folder(flag: str, path: Path, folder: Path) -> None:
    """Create ``folder`` (and its parents) if missing and write a scratch file in it, or raise a CliError."""
    where = f"{flag} {shown(path)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CliError(f"{where}: cannot create the folder {shown(folder)}: a file of that name exists") from None
    except OSError as exc:
        raise CliError(f"{where}: cannot create the folder {shown(folder)} "
                       f"({exc.strerror or type(exc).__name__})") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise CliError(f"{where}: cannot write in the folder {shown(folder)} "
                       f"({exc.strerror or type(exc).__name__})") from None


def check_output_folder(flag: str, path: Path | None) -> None:
    """``--csv``/``--out``: a folder that exists or can be created, and can be written in (created now)."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CliError(f"{flag} {shown(path)}: a file, not a folder; give a folder for the output files")
    _probe_folder(flag, path, path)


def check_output_file(flag: str, path: Path | None) -> None:
    """``--json``: not a folder, in a folder that exists or can be created and can be written in; an existing
    file must be writable (it is replaced)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise CliError(f"{flag} {shown(path)}: a folder, not a file; give a file name, e.g. "
                       f"{shown(path / 'summary.json')}")
    check_not_input(flag, path)
    _probe_folder(flag, path, path.parent if str(path.parent) else Path("."))
    if path.exists() and not os.access(path, os.W_OK):
        raise CliError(f"{flag} {shown(path)}: the file exists and cannot be written (permission denied)")


def write_files(flag: str, folder: Path, files: dict[str, bytes]) -> list[Path]:
    """Write ``files`` (name -> bytes) into ``folder``, all or nothing: each goes to a temporary file in the folder,
    then every one is renamed over its name (os.replace: a file or a symlink of that name is replaced, never
    followed, so nothing outside the folder is written). A failure names the file, removes the temporary files and
    leaves the folder as it was (a CliError: one line, exit code 2). Returns the paths written."""
    folder = Path(folder)
    for name in files:
        target = folder / name
        check_not_input(flag, target)  # before any file is written: an input is never replaced
        if target.is_dir() and not target.is_symlink():
            raise CliError(f"{flag} {shown(folder)}: {name} in it is a folder, and the output has a file of that name; "
                           "remove it or choose another folder")
    mask = os.umask(0)
    os.umask(mask)
    temps: dict[str, str] = {}

    def discard() -> None:
        for tmp in temps.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass

    name = ""
    try:
        for name, data in files.items():
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name[:100]}.", suffix=".part")
            temps[name] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~mask)  # the permissions a new file gets, not mkstemp's 0600
    except OSError as exc:
        discard()
        raise CliError(f"{flag} {shown(folder)}: cannot write {name} ({exc.strerror or type(exc).__name__}); "
                       "nothing was written") from None
    done: list[Path] = []
    for name, tmp in list(temps.items()):
        try:
            os.replace(tmp, folder / name)
        except OSError as exc:  # the folder changed under us since the check: say what was written
            discard()
            raise CliError(f"{flag} {shown(folder)}: cannot write {name} ({exc.strerror or type(exc).__name__}); "
                           f"{len(done)} of {len(files)} files written") from None
        del temps[name]
        done.append(folder / name)
    return done


def write_json(path: Path | None, data, flag: str = "--json") -> None:
    """``data`` as JSON at ``path`` (written whole or not at all; a symlink there is replaced, not followed)."""
    if path is not None:
        path = Path(path)
        write_files(flag, path.parent if str(path.parent) else Path("."),
                    {path.name: json.dumps(data, indent=2).encode()})


# ---------------------------------------------------------------- printing


def summary_keys(prefix_caching: bool = False, spec_decode: bool = False, disagg: bool = False) -> tuple[str, ...]:
    """The documented summary keys (README, Command line): with prefix caching, its hit rate and cached tokens too;
    with speculative decoding, its acceptance rate, tokens per verification, speculating share and draft time; with
    a prefill/decode split, the KV transfer and decode-queue percentiles and each role's busy share."""
    return (SUMMARY_KEYS + (PREFIX_KEYS if prefix_caching else ()) + (SPEC_KEYS if spec_decode else ())
            + (DISAGG_KEYS if disagg else ()) + (SPEC_DISAGG_KEYS if spec_decode and disagg else ()))


def pick(summary: dict, prefix_caching: bool = False, spec_decode: bool = False) -> dict:
    """The documented summary keys (README, Command line), ``by_priority`` per class; ``prefix_caching``: with
    ``prefix_hit_rate`` and ``cached_prompt_tokens`` (where the summary has them); ``spec_decode``: with SPEC_KEYS;
    a disaggregated run's summary: with DISAGG_KEYS, ``disaggregated`` (the split in words) and ``gpus``."""
    split = "disaggregated" in summary
    keys = summary_keys(prefix_caching, spec_decode)
    split_keys = DISAGG_KEYS + (SPEC_DISAGG_KEYS if spec_decode else ()) if split else ()
    out = {k: summary[k] for k in keys + split_keys if k in summary}
    out["by_priority"] = {lvl: {k: v[k] for k in keys if k in v} | {"class_name": v["class_name"]}
                          for lvl, v in summary["by_priority"].items()}
    out.update({k: summary[k] for k in ("engine", "engine_label") if k in summary})  # the profile it ran with
    if "concurrency" in summary:  # closed-loop clients: the load is N, not a rate
        out.update({k: summary[k] for k in ("concurrency", "think_time_s")})
    if summary.get("calibrated") is False:  # no measurement behind a term of this model/GPU/precision: say why
        out.update({k: summary[k] for k in ("calibrated", "calibration_note")})
    if summary.get("rejected_requests"):  # the context they passed
        out["max_context_tokens"] = summary["max_context_tokens"]
    if split:
        out.update({k: summary[k] for k in ("disaggregated", "gpus", "nodes", "replicas", "router")})
    elif summary.get("replicas", 1) > 1:  # a fleet: its shape and each replica's share
        out.update({k: summary[k] for k in ("nodes", "physical_nodes", "replicas", "router", "by_replica")
                    if k in summary})
    return out


def calibration_line(summary: dict) -> str | None:
    """"# not calibrated: <why>" for a summary whose model/GPU/precision has no measurement behind a term, else None."""
    if summary.get("calibrated", True):
        return None
    return f"# not calibrated: {summary.get('calibration_note', '')}"


def disagg_line(summary: dict) -> str | None:
    """"# disaggregated: 1 prefill x TP 4 + 1 decode x TP 4, 8 GPUs on 1 node" for a split's summary, else None."""
    if "disaggregated" not in summary:
        return None
    nodes = summary.get("nodes", 1)
    return f"# {summary['disaggregated']}, {summary['gpus']} GPUs on {nodes} node{'s' if nodes > 1 else ''}"


def fleet_lines(summary: dict, most: int = 16) -> list[str]:
    """One line per replica of a fleet (the first ``most``, then how many more), or nothing for one replica or a
    prefill/decode split (``disagg_line``)."""
    if summary.get("replicas", 1) <= 1 or "by_replica" not in summary:
        return []
    each = summary.get("physical_nodes", summary["nodes"]) // summary["nodes"]  # servers per node unit (TP 16: 2)
    if each > 1:
        lines = [f"# fleet: {summary['replicas']} replicas over {summary['physical_nodes']} nodes ({each} each), "
                 f"router {summary['router']}"]
    else:
        lines = [f"# fleet: {summary['nodes']} node{'s' if summary['nodes'] > 1 else ''}, {summary['replicas']} "
                 f"replicas, router {summary['router']}"]
    for rep, v in list(summary["by_replica"].items())[:most]:
        where = f"node {v['node']}" if each == 1 else f"nodes {v['node'] * each}-{v['node'] * each + each - 1}"
        lines.append(f"replica {rep} ({where}): {v['num_requests']} requests, "
                     f"{v['throughput_output_tok_s']:,.1f} output tok/s, TTFT P99 {v['ttft_p99_s']:.3f} s, "
                     f"busy {100 * v['busy']:.1f} %, peak waiting {v['peak_waiting']}")
    if summary["replicas"] > most:
        lines.append(f"... and {summary['replicas'] - most} more replicas (all of them in --json's by_replica)")
    return lines


def arrivals_text(workload) -> str | None:
    """The arrival process of a synthetic workload in words ("Gamma gaps, CV 4"), None for Poisson or a trace."""
    if getattr(workload, "concurrency", None) is not None:
        return workload.load_text
    a = getattr(workload, "arrivals", None)
    if a is None or a.kind == "poisson":
        return None
    if a.kind == "gamma":
        return f"Gamma gaps, CV {a.cv:g}"
    if a.kind == "onoff":
        return f"on/off bursts, {a.on_s:g} s on, {a.off_s:g} s off"
    if a.kind == "diurnal":
        return f"diurnal rate curve, peak {a.peak_to_trough:g}x the trough, period {a.period_s:,.0f} s"
    return a.kind


def prefix_line(summary: dict, lead: str = "") -> str:
    """"41.3 % of prompt tokens from the prefix cache (123,456 tokens)" (after ``lead``), or "" when the summary
    has no prefix-cache figures."""
    rate, tokens = summary.get("prefix_hit_rate"), summary.get("cached_prompt_tokens")
    if rate is None:
        return ""
    text = f"{rate * 100:.1f} % of prompt tokens from the prefix cache"
    if tokens is not None:
        text += f" ({int(tokens):,} tokens)"
    return lead + text


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def progress(done: int, total: int, msg: str) -> None:
    print(f"[{done}/{total}] {msg}", file=sys.stderr)


# ---------------------------------------------------------------- running a command


MEMORY_HINT = ("a simulation takes about 0.5 KB per request plus 0.46 KB per simulated step summed over its replicas "
               "or instances, and 0.13 KB per request per replica behind a state-reading --router or instance of a "
               "split (README, Command line): use fewer --requests or --nodes")


def dispatch(parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv`` and run the command. Any problem with the input (a ValueError, CliError included, from
    the flags, the files or the library's validation), running out of memory or failing to write an output
    becomes one line on stderr and exit code 2, never a traceback."""
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"{parser.prog}: error: {one_line(message)}", file=sys.stderr)
        return 2

    try:
        note_inputs(args)  # no output may be one of them (check_not_input)
        for flag, dest in OUTPUT_FILE_FLAGS.items():
            out = getattr(args, dest, None)
            if out is not None and str(out) != "-":  # specs --json - writes to stdout
                check_not_input(flag, Path(out))
        return args.func(args)
    except ValueError as exc:
        return fail(str(exc))
    except MemoryError:
        return fail(f"out of memory: {MEMORY_HINT}")
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more on stdout
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:  # writing an output after the checks: disk full, file removed meanwhile...
        name = f" {shown(exc.filename)}" if exc.filename else ""
        return fail(f"cannot write{name}: {exc.strerror or type(exc).__name__}")
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
