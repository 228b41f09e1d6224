"""``python -m batching search``: the cheapest deployment (GPU, precision, aggregated TP or a prefill/decode split
(--serving agg/disagg/both), policy, knob values) that serves a target traffic within the SLOs: per configuration
the capacity within the SLOs per copy, the nodes needed and $ per million output tokens (``studies.pricing``; prices
default per GPU from its table), ranked by cost then by P99 TTFT and TPOT at the target traffic, with the Pareto
front of cost against them and the best of every GPU type and serving mode with why it lost; the top
configurations are then checked as a fleet of that many nodes behind --router (nodes added while the SLOs fail);
configurations that do not fit or meet no rate are listed with why. Runs on a local process pool or on Ray
(--backend)."""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from batching.cli.args import (DISAGG_FLAGS, CliError, engine_from_args, add_prefix_caching_arg, add_scenario_args, add_slo_args,
                               check_output_file, float_arg, fmt, shown, slo_from_args, workload_from_args,
                               write_json)
from batching.sim.topology.fleet import ROUTER_HELP, ROUTERS
from batching.sim.policy import PRESETS, BatchingPolicy
from batching.sim.simulate import Scenario, check_run
from batching.sim.hardware.specs import (GPUS, GPUS_PER_NODE, MODELS, PRECISIONS, TWO_NODE_GPUS, Deployment, Node,
                                         load_json_spec)
from batching.studies.backends import (BACKENDS, RAY_TIMEOUT_LIMITS_S, RAY_TIMEOUT_S, WORKERS_PER_CPU, make_backend,
                                       worker_cap)
from batching.studies.capacity import HEADROOM_LIMITS, class_names, headroom_note
from batching.studies.pricing import DEFAULT_HEADROOM, price_table, table_problem
from batching.studies.launch import with_launch
from batching.studies.search import (COST_NOTE, FLEET_EXTRA_NODES, FLEET_TOP, MAX_GPU_HOUR_USD, ROUTER_DEFAULT,
                                     ROUTER_NOTE, SEARCH_KNOBS, SERVING, TPS, AGG_TPS, Grid, chosen_sentence,
                                     parse_knobs, search)

MAX_TARGET_RATE_REQ_S = 1e9
CUSTOM_GPU = "custom"  # the grid's name for the GPU of --gpu-json


def _list_arg(name: str, allowed: tuple, kind=str, example: str = ""):
    """An argparse type: a comma list of values from ``allowed`` (checked later when ``allowed`` is empty)."""

    def parse(text: str) -> tuple:
        parts = [p.strip() for p in str(text).split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"it is empty; give {name} separated by commas, e.g. {example}")
        out = []
        for p in parts:
            if not p:
                raise argparse.ArgumentTypeError(f"an empty value in {shown(text)}; e.g. {example}")
            try:
                v = kind(p)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{shown(p)} is not allowed; allowed: "
                                                 f"{', '.join(map(str, allowed))}") from None
            if allowed and v not in allowed:
                raise argparse.ArgumentTypeError(f"{shown(p)} is not allowed; allowed: "
                                                 f"{', '.join(map(str, allowed))}")
            out.append(v)
        return tuple(dict.fromkeys(out))

    return parse


def prices_arg(text: str) -> dict | float:
    """``--gpu-hour-usd h100-sxm=2.5,h200-sxm=3.5`` (per GPU) or ``2.5`` (every GPU)."""
    allowed = f"allowed > 0 to {MAX_GPU_HOUR_USD:g}"
    text = str(text).strip()
    if "=" not in text:
        return float_arg(0.0, MAX_GPU_HOUR_USD, low_open=True)(text)
    out = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise argparse.ArgumentTypeError(f"{shown(part)} is not GPU=USD; e.g. h100-sxm=2.5,h200-sxm=3.5")
        if not value.isascii():
            raise argparse.ArgumentTypeError(f"{name}: {shown(value)} has characters other than ASCII; write it "
                                             "with 0-9")
        try:
            v = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={shown(value)} is not a number; {allowed}") from None
        if not math.isfinite(v) or not 0 < v <= MAX_GPU_HOUR_USD:
            raise argparse.ArgumentTypeError(f"{name}={value} is out of range; {allowed}")
        out[name] = v
    return out


def add_parser(subparsers):
    p = subparsers.add_parser(
        "search", conflict_handler="resolve",
        help="the cheapest deployment (GPU, precision, TP, policy, knobs) within the SLOs",
        epilog=f"Fleet check: the top {FLEET_TOP} configurations (--fleet-top) are simulated as a fleet of their "
               f"estimated nodes behind --router at the target rate, adding a node while the SLOs fail (at most "
               f"{FLEET_EXTRA_NODES} more). --router defaults to round-robin here, as for every command; give "
               f"--router {ROUTER_DEFAULT} for the search library's default (a gateway that reads replica load). "
               "The JSON's router says which ran.")
    add_scenario_args(p)  # --gpu, --tp and --precision are replaced by the lists below; --nodes is not read
    g = p.add_argument_group("the grid (every combination is one configuration)")
    g.add_argument("--gpus", "--gpu", dest="gpus", type=_list_arg("GPUs", (), str, "h100-sxm,h200-sxm"),
                   default=("h100-sxm",),
                   help=f"GPUs to try, comma-separated: {', '.join(GPUS)} (and {CUSTOM_GPU!r}, the GPU of "
                        "--gpu-json); default h100-sxm")
    g.add_argument("--precisions", "--precision", dest="precisions",
                   type=_list_arg("precisions", PRECISIONS, str, "bf16,fp8"), default=("bf16",),
                   help=f"precisions to try: {', '.join(PRECISIONS)} (default bf16)")
    g.add_argument("--tp", dest="tps", type=_list_arg("TP degrees", AGG_TPS, int, "1,2,4,8,16"), default=TPS,
                   help=f"tensor-parallel degrees to try, each dividing --num-gpus (default 1,2,4,8), or "
                        f"{TWO_NODE_GPUS}: one replica over two {GPUS_PER_NODE}-GPU nodes (a copy is two nodes; its "
                        "rows say calibrated: false, the two-node all-reduce being composed, not measured)")
    g.add_argument("--policies", type=_list_arg("presets", tuple(PRESETS), str, "chunked,priority"),
                   default=("chunked",), help=f"policy presets to try: {', '.join(PRESETS)} (default chunked)")
    g.add_argument("--knobs", nargs="+", default=(), metavar="NAME=V1,V2",
                   help=f"knob values to try, e.g. max_num_seqs=128,256,512 max_num_batched_tokens=512,2048,8192; "
                        f"knobs: {', '.join(SEARCH_KNOBS)} (each varied only in the presets whose mode uses it)")
    g.add_argument("--serving", choices=list(SERVING), default="both",
                   help="agg: aggregated nodes (TP x replicas); disagg: every prefill/decode split P x TP + D x TP "
                        "that fits a node (splits that leave GPUs idle beside the same copies per node are dominated "
                        "and not run); both (default: the question is which is cheaper, and only a search of both "
                        "answers it)")
    add_prefix_caching_arg(g, every_preset=True)
    add_slo_args(p)
    plan = p.add_argument_group("plan")
    plan.add_argument("--target-rate", type=float_arg(0.0, MAX_TARGET_RATE_REQ_S, low_open=True), required=True,
                      help="traffic to serve, req/s")
    plan.add_argument("--gpu-hour-usd", type=prices_arg, default=None, metavar="GPU=USD,...",
                      help="price of one GPU-hour per GPU searched, e.g. h100-sxm=2.5,h200-sxm=3.5 (or one number "
                           "for every GPU); a GPU not given takes the default table's (" + _defaults_text() + ")")
    low, high = HEADROOM_LIMITS
    plan.add_argument("--headroom", type=float_arg(low, high), default=DEFAULT_HEADROOM,
                      help=f"plan for the simulated rate per node divided by this factor ({low:g} to {high:g}; "
                           f"see `capacity --help`); default {DEFAULT_HEADROOM:g}")
    plan.add_argument("--router", default="round-robin", choices=list(ROUTERS),
                      help="the router the fleet check runs behind (default round-robin, as for run; the search "
                           f"library defaults to {ROUTER_DEFAULT}): " + "; ".join(
                               f"{k}: {v}" for k, v in ROUTER_HELP.items()))
    plan.add_argument("--fleet-top", type=int_fleet_top, default=FLEET_TOP,
                      help=f"check this many of the top configurations as a fleet (default {FLEET_TOP}; 0: none, "
                           "nodes from perfect load balancing only)")
    run = p.add_argument_group("execution")
    run.add_argument("--backend", choices=list(BACKENDS), default="local",
                     help="local: a process pool over this machine's cores (default); ray: Ray tasks "
                          "(pip install -r requirements-cluster.txt)")
    run.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="with --backend ray: a running Ray cluster (e.g. ray://head:10001, head:6379 or auto); "
                          "default: start a local one")
    low, high = RAY_TIMEOUT_LIMITS_S
    run.add_argument("--ray-timeout-s", type=float_arg(low, high), default=None, metavar="S",
                     help=f"with --ray-address: give up when the cluster has not answered within S seconds "
                          f"({low:g} to {high:g}; default {RAY_TIMEOUT_S:g})")
    run.add_argument("--workers", type=int_workers, default=None,
                     help="tasks at once (default: the cores here, or the Ray cluster's CPUs); at most the "
                          f"configurations that fit and {WORKERS_PER_CPU}x this machine's cores ({worker_cap()} "
                          "here) for the local pool, whose processes start with the first configuration")
    run.add_argument("--prune", action=argparse.BooleanOptionalAction, default=True,
                     help="skip configurations that cannot beat the best cost found (default on)")
    run.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=True,
                     help="start each capacity bisection from a similar configuration's answer (default on)")
    p.add_argument("--json", type=Path, help="write the ranked configurations as JSON")
    p.set_defaults(func=cmd_search)
    return p


def int_fleet_top(text: str) -> int:
    from batching.cli.args import int_arg

    return int_arg(0, 64)(text)


def int_workers(text: str) -> int:
    from batching.cli.args import int_arg

    return int_arg(1, 4096)(text)


def _base(args) -> tuple[Scenario, dict]:
    """The scenario every configuration shares (model, workload, GPUs per node, KV options, all-reduce, prefix
    caching) and the custom GPUs (--gpu-json), before any simulation."""
    custom = {}
    if getattr(args, "gpu_json", None) is not None:
        custom[CUSTOM_GPU] = load_json_spec(args.gpu_json, "gpu")
    known = (*GPUS, *custom)
    for gpu in args.gpus:
        if gpu not in known:
            extra = f", {CUSTOM_GPU} (with --gpu-json)" if not custom else ""
            raise CliError(f"--gpus: {shown(gpu)} is not allowed; allowed: {', '.join(known)}{extra}")
    model = load_json_spec(args.model_json, "model") if getattr(args, "model_json", None) else MODELS[args.model]
    model.validate()
    first = custom.get(args.gpus[0]) or GPUS[args.gpus[0]]
    dep = Deployment(Node(first, search_gpus(args), 1), model, "bf16", getattr(args, "kv_dtype", None) or "auto",
                     kv_cache_tokens=getattr(args, "kv_cache_tokens", None))
    wl = workload_from_args(args)
    caching = args.prefix_caching if args.prefix_caching is not None else PRESETS["chunked"].prefix_caching
    pol = BatchingPolicy(mode="continuous", prefix_caching=caching)  # carries the prefix-caching choice only
    return Scenario(dep, wl, pol, args.allreduce, engine=engine_from_args(args)), custom


def _defaults_text() -> str:
    """The price table's rows for --help, or why it cannot be read (the help still shows: issue 39 item 11)."""
    problem = table_problem()
    if problem is not None:
        return f"none: {problem}"
    return ", ".join(f"{g} ${p.usd_per_gpu_hour:g}" for g, p in price_table().items())


def check_size(args, base: Scenario, custom: dict) -> None:
    """The size guard ``run`` applies (``simulate.check_run``), up front: on the searched node with the most
    replicas that holds the model (the smallest --tp that fits, at the first precision that fits) at --rate, whose
    steps summed over its replicas are the most of the grid's aggregated configurations; ValueError in one line."""
    for tp in sorted(t for t in args.tps if t <= base.deployment.node.num_gpus):
        for precision in args.precisions:
            for gpu in args.gpus:
                dep = replace(base.deployment, node=Node(custom.get(gpu) or GPUS[gpu], base.deployment.node.num_gpus,
                                                         tp), precision=precision)
                sc = base.with_deployment(dep)
                try:
                    sc.validate()
                except ValueError:  # this configuration does not hold the model; the search skips it too
                    continue
                check_run(sc)
                return


def _prices(args) -> dict:
    """The prices given (one number: every GPU); a GPU not given takes the default table's (a GPU without a
    default, e.g. --gpu-json's, must be given)."""
    v = args.gpu_hour_usd
    if isinstance(v, float):
        return {g: v for g in args.gpus}
    v = dict(v or {})
    unknown = [g for g in v if g not in args.gpus]
    if unknown:
        raise CliError(f"--gpu-hour-usd: {shown(unknown[0])} is not searched; allowed: {', '.join(args.gpus)}")
    missing = [g for g in args.gpus if g not in v and g not in price_table()]
    if missing:
        raise CliError(f"--gpu-hour-usd: no price for {', '.join(missing)} and no default; give one, e.g. "
                       + ",".join(f"{g}=2.5" for g in missing))
    return {g: v[g] for g in args.gpus if g in v}


def _ms(v) -> str:
    return "-" if v is None else (f"{v:,.2f} s" if v >= 10 else f"{v * 1e3:,.0f} ms")


def search_gpus(args) -> int:
    """--num-gpus for the search: nodes of 1-8 GPUs (8 by default; --tp 16 then spans two of them)."""
    if args.num_gpus is None:
        return GPUS_PER_NODE
    if args.num_gpus > GPUS_PER_NODE:
        raise CliError(f"--num-gpus {args.num_gpus}: the search's nodes have 1 to {GPUS_PER_NODE} GPUs; for TP "
                       f"{TWO_NODE_GPUS} over two nodes give --num-gpus {GPUS_PER_NODE} --tp {TWO_NODE_GPUS} (with "
                       "any other TP degrees to compare)")
    return args.num_gpus


def cmd_search(args) -> int:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None and args.slo_e2e_s is None:
        raise CliError("give at least one SLO: --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-s")
    split = [flag for flag, field in DISAGG_FLAGS.items() if getattr(args, field, None) is not None]
    for flag in ("--kv-link-gbps", "--kv-transfer-fixed-ms"):
        if getattr(args, flag[2:].replace("-", "_"), None) is not None:
            split.append(flag)
    if split:
        raise CliError(f"{split[0]}: the search enumerates the prefill/decode splits itself (--serving disagg or "
                       "both); leave the split flags out")
    if args.backend != "ray":
        for flag, value in (("--ray-address", args.ray_address), ("--ray-timeout-s", args.ray_timeout_s)):
            if value is not None:
                raise CliError(f"{flag}: only with --backend ray (the backend is {args.backend}); give --backend "
                               f"ray or leave {flag} out")
    if args.nodes != 1:
        raise CliError("--nodes: the search finds the nodes needed itself (from --target-rate); leave --nodes out")
    num_gpus = search_gpus(args)
    for tp in args.tps:
        if tp == TWO_NODE_GPUS and num_gpus == GPUS_PER_NODE:
            continue  # one replica over two of these nodes
        if tp > num_gpus or num_gpus % tp:
            ok = [t for t in TPS if t <= num_gpus and num_gpus % t == 0]
            ok += [TWO_NODE_GPUS] if num_gpus == GPUS_PER_NODE else []
            raise CliError(f"--tp: {tp} must divide --num-gpus {num_gpus}; allowed: " + ", ".join(map(str, ok))
                           + ("" if tp != TWO_NODE_GPUS else f" ({TWO_NODE_GPUS} spans two {GPUS_PER_NODE}-GPU "
                              f"nodes: give --num-gpus {GPUS_PER_NODE})"))
    try:
        knobs = parse_knobs(args.knobs)
    except ValueError as exc:
        raise CliError(f"--knobs: {exc}") from None
    base, custom = _base(args)
    slo = slo_from_args(args, base)
    prices = _prices(args)
    grid = Grid(tuple(args.gpus), tuple(args.precisions), tuple(args.tps), tuple(args.policies), knobs,
                args.serving, num_gpus)
    try:
        grid.validate(custom)
    except ValueError as exc:
        raise CliError(f"the grid: {exc}") from None
    check_output_file("--json", args.json)
    check_size(args, base, custom)

    def open_backend(tasks: int):
        """The backend, made once the configurations that fit are known (none: never made, so an unreachable
        Ray address is not tried); ``search`` closes it."""
        timeout = RAY_TIMEOUT_S if args.ray_timeout_s is None else args.ray_timeout_s
        backend = make_backend(args.backend, args.ray_address, args.workers, tasks=tasks, timeout_s=timeout)
        print(f"searching {tasks:,} of {grid.size():,} configurations on {backend.describe()}", file=sys.stderr)
        return backend

    res = search(base, slo, args.target_rate, prices, grid, backend=open_backend, prune=args.prune,
                 warm=args.warm_start, headroom=args.headroom, custom_gpus=custom, progress=_progress,
                 router=args.router, fleet_top=args.fleet_top)
    _print(res, slo.describe(class_names(base)))
    with_launch(res["configs"], base, custom)  # each row's vLLM and SGLang commands (docs/LAUNCH.md)
    write_json(args.json, res)
    if res["failed"]:
        print(f"{len(res['failed'])} configuration(s) failed on a worker after a retry: "
              + "; ".join(f"{f['label']}: {f['error']}" for f in res["failed"])[:2000], file=sys.stderr)
        return 1
    return 0


def _progress(done: int, total: int, msg: str) -> None:
    print(f"[{done}/{total}] {msg}", file=sys.stderr)


def fleet_text(c: dict) -> str:
    """A row's fleet column: '3 nodes ✓ least-outstanding' (checked: the fleet met the SLOs), '≥ 7 nodes ✗
    least-outstanding' (not verified: still missed them with 3 more), 'perfect balance' (not checked)."""
    if not c.get("fleet_checked"):
        return "perfect balance"
    n = c["nodes_needed"]
    if c.get("fleet_verified"):
        return f"{n} node{'s' if n != 1 else ''} ✓ {c['router']}"
    return f"≥ {n} nodes ✗ {c['router']}"


def _print(res: dict, slo_text: str) -> None:
    print(f"slo: {slo_text}")
    print(f"target: {fmt(res['target_rate_req_s'])} req/s, {res['mean_output_tokens']:,.0f} output tokens per "
          f"request on average; {res['num_gpus_per_node']} GPUs per node")
    print(f"headroom: {res.get('headroom_note') or headroom_note(res['headroom'])}")
    tail = res.get("tail", "P99")  # the percentile the attainment target reads (P90 for --attainment 0.9)
    key = "p99" if tail == "P99" else "tail"
    print(f"{tail} TTFT and TPOT at the target traffic (each copy carrying target / copies); ranked by cost, then by "
          "the fleet's capacity (more first), then by P99 TTFT and TPOT; margin: the share of the fleet's capacity "
          "the target uses")
    head = (f"{'#':>3} {'configuration':52s} {'rate/copy':>11} {'nodes':>6} {'$/M out tok':>12} {'margin':>6} "
            f"{'$/M at cap':>10} {'tok/s/GPU':>9} {tail + ' TTFT':>10} {tail + ' TPOT':>9}  binding  pareto  fleet")
    print(head)
    for i, c in enumerate(r for r in res["configs"] if r["meets_slo"]):
        margin = "-" if c.get("margin") is None else f"{c['margin'] * 100:.0f} %"
        at_cap = c.get("usd_per_million_output_tokens_at_capacity")
        per_gpu = c.get("output_tok_s_per_gpu")
        print(f"{i + 1:>3} {c['label'][:52]:52s} {c['max_rate_req_s']:>7,.3g} req/s "
              f"{c['nodes_needed']:>6} {'$' + format(c['usd_per_million_output_tokens'], ',.3f'):>12} {margin:>6} "
              f"{'-' if at_cap is None else '$' + format(at_cap, ',.3f'):>10} "
              f"{'-' if per_gpu is None else format(per_gpu, ',.0f'):>9} "
              f"{_ms(c.get(f'ttft_{key}_s')):>10} {_ms(c.get(f'tpot_{key}_s')):>9}  {c['binding_slo'] or '-':7s}  "
              f"{'*' if c['pareto'] else ' ':6s}  {fleet_text(c)}"
              + ("" if c.get("calibrated", True) else "  (not calibrated)"))
    best = next((r for r in res["configs"] if r["meets_slo"]), None)
    if best is not None:
        print(f"best: {best['label']}: {chosen_sentence(best, res['target_rate_req_s'], res['headroom'], tail)}")
    if res.get("rounding_note"):
        print(f"rounding: {res['rounding_note']}")
    uncal: dict[str, list[str]] = {}
    for c in res["configs"]:
        if c["meets_slo"] and not c.get("calibrated", True):
            uncal.setdefault(c["calibration_note"], []).append(c["label"])
    for why, labels in uncal.items():
        print(f"not calibrated: {', '.join(labels)}: {why}")
    for key, what in (("best_by_gpu", "gpu"), ("best_by_serving", "serving")):
        rows = res.get(key) or []
        if len(rows) < 2:
            continue
        for b in rows:
            head = f"best {b[what]}: " + (f"#{b['rank']} {b['label']}" if b["label"] else "none")
            print(head + (f" ({b['why_not_best']})" if b["why_not_best"] else " (the best)"))
    for c in res["configs"]:
        if c.get("fleet_note"):
            print(f"fleet   {c['label']}: {c['fleet_note']}")
    if not any(r["meets_slo"] for r in res["configs"]):
        print("   (no configuration meets the SLOs)")
    for s in res["skipped"]:
        print(f"skipped {s['label']}: {s['reason']}: {s['why']}")
    for s in res["pruned"]:
        print(f"pruned  {s['label']}: {s['why']}")
    if res.get("dominated"):
        print(f"not run: {len(res['dominated'])} split shapes or policies (e.g. {res['dominated'][0]['label']}: "
              f"{res['dominated'][0]['why']}); the JSON lists them")
    print(f"searched {res['searched']} of {res['grid_size']} configurations, {len(res['skipped'])} skipped, "
          f"{len(res['pruned'])} pruned, {len(res['failed'])} failed; {res['simulations']:,} simulations in "
          f"{res['seconds']:,.1f} s ({res['backend']})")
    print(f"note: {res['notes'][0] if res.get('notes') else ROUTER_NOTE}")
    for note in (res.get("notes") or [])[1:] or [COST_NOTE]:
        print(f"note: {note}")
