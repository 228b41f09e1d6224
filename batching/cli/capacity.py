"""``python -m batching capacity``: the highest request rate per node at which every priority class meets its SLOs
(one value for every class or one per class), nodes and cost (``studies.pricing.price``: $ per million output tokens
at the target traffic and at capacity) with a headroom factor for the cost model's known error (default
``pricing.DEFAULT_HEADROOM``) at the GPU's default price from the price table unless ``--gpu-hour-usd`` is given."""
from __future__ import annotations

import math
from pathlib import Path

from batching.cli.args import (CliError, add_policy_args, add_scenario_args, add_slo_args, arrivals_text,
                               build_scenario, check_output_file, float_arg, fmt, progress, slo_from_args, spec_json,
                               spec_line, write_json)
from batching.studies.capacity import (ATTAINMENT_DEFAULT, HEADROOM_LIMITS, HEADROOM_RANGE, TPOT_UNDERESTIMATE,
                                       capacity, class_names, default_price, default_price_note, headroom_note,
                                       own_profile, tail_key, tail_label)
from batching.studies.pricing import DEFAULT_HEADROOM, MAX_GPU_HOUR_USD, PRICES_ENV
from batching.sim.hardware.specs import GPUS_PER_NODE
from batching.sim.simulate import check_run
from batching.charts.formatting import shown
from batching.studies.launch import launch

MAX_TARGET_RATE_REQ_S = 1e9


def add_parser(subparsers):
    p = subparsers.add_parser("capacity", help="highest request rate per node that meets the SLOs")
    add_scenario_args(p)
    add_policy_args(p)
    add_slo_args(p)
    p.add_argument("--target-rate", type=float_arg(0.0, MAX_TARGET_RATE_REQ_S, low_open=True),
                   default=None, help="traffic to plan for, req/s: reports the nodes needed")
    p.add_argument("--gpu-hour-usd", type=float_arg(0.0, MAX_GPU_HOUR_USD, low_open=True),
                   default=None, help="price of one GPU-hour, $ (default: the GPU's row of the price table, "
                                      f"batching/data/gpu_hour_usd.csv or ${PRICES_ENV})")
    low, high = HEADROOM_LIMITS
    p.add_argument("--headroom", type=float_arg(low, high), default=DEFAULT_HEADROOM,
                   help=f"plan for the simulated rate per node divided by this factor ({low:g} to {high:g}; it "
                        "multiplies the nodes needed and the $ per million tokens). The cost model's known error: "
                        f"its TPOT is {TPOT_UNDERESTIMATE[0] * 100:.0f}-{TPOT_UNDERESTIMATE[1] * 100:.0f} %% below "
                        f"published vLLM and SGLang runs (docs/CALIBRATION.md), i.e. {HEADROOM_RANGE[0]:g} to "
                        f"{HEADROOM_RANGE[1]:g}. Default {DEFAULT_HEADROOM:g}, inside that range; 1: the simulator's "
                        "own figures")
    p.add_argument("--json", type=Path, help="write the result as JSON")
    p.set_defaults(func=cmd_capacity)
    return p


def _pct(v: float) -> str:
    return f"{v * 100:.1f} %" if math.isfinite(v) else "n/a"


def class_line(c: dict, attainment: float = ATTAINMENT_DEFAULT) -> str:
    """A class's reading against its own SLOs: 'attainment 97.2 % (misses its SLOs), goodput ..., TTFT P50 1,293 ms
    P99 ... (SLO 1,000 ms) ...', its tail at the percentile the attainment target reads (P90 for 0.9)."""
    slo = c.get("slo", {})
    verdict = "meets its SLOs" if c.get("meets_slo") else "misses its SLOs"
    tail, ttft, tpot = tail_label(attainment), tail_key("ttft", attainment), tail_key("tpot", attainment)

    def vs(name: str, key: str) -> str:
        return f" (SLO {shown(key, slo[name])})" if name in slo else ""
    return (f"attainment {_pct(c['attainment'])} ({verdict}), goodput {fmt(c['goodput_req_s'])} req/s, "
            f"TTFT P50 {shown('ttft_p50_s', c['ttft_p50_s'])} {tail} {shown('ttft_p99_s', c[ttft])}"
            f"{vs('ttft_s', 'ttft_p99_s')}, TPOT P50 {shown('tpot_p50_s', c['tpot_p50_s'])} "
            f"{tail} {shown('tpot_p99_s', c[tpot])}{vs('tpot_s', 'tpot_p99_s')}")


def cmd_capacity(args) -> int:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None and args.slo_e2e_s is None:
        raise CliError("give at least one SLO: --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-s")
    sc = build_scenario(args)
    slo = slo_from_args(args, sc)
    check_output_file("--json", args.json)
    check_run(sc)  # the size guard run, compare and report apply, before the search's first simulation
    usd = args.gpu_hour_usd if args.gpu_hour_usd is not None else default_price(sc)
    res = capacity(sc, slo, target_rate_req_s=args.target_rate, gpu_hour_usd=usd, progress=progress,
                   headroom=args.headroom)
    split = sc.disagg
    d = res.to_dict() | {"engine": sc.profile.name, "engine_label": sc.profile.label}
    print(f"# engine: {sc.profile.describe()}")
    if spec_line(sc.policy):  # method, K, acceptance and where the acceptance comes from (issue 39 item 4)
        print(spec_line(sc.policy))
        d |= spec_json(sc.policy)
    if split is not None:
        per_node = sc.deployment.node.num_gpus // sc.deployment.node.physical_nodes
        count = (f"{per_node // split.gpus} cop{'y' if per_node // split.gpus == 1 else 'ies'} of it per "
                 f"{per_node}-GPU node (a copy never straddles two nodes), as search counts them"
                 if split.gpus <= per_node else f"its {split.gpus} GPUs per copy")
        print(f"# {split.describe()}, {split.gpus} GPUs on {sc.nodes} node{'s' if sc.nodes > 1 else ''}: the rate is "
              f"the whole split's; nodes_needed and $ count {count}")
        d |= {"disaggregated": split.describe(), "gpus": split.gpus, "nodes": sc.nodes}
    elif sc.deployment.node.cross_node:
        print(f"# one TP {sc.deployment.node.tp} replica over {sc.deployment.node.physical_nodes} nodes: the rate is "
              f"the replica's; nodes_needed counts {GPUS_PER_NODE}-GPU nodes, {sc.deployment.node.physical_nodes} "
              "per copy")
    elif sc.nodes > 1:
        print(f"# {sc.nodes} nodes, {sc.replicas} replicas, router {sc.router}: the rate is the whole fleet's; "
              f"nodes_needed counts copies of it in nodes")
        d |= {"gpus": sc.nodes * sc.deployment.node.num_gpus, "nodes": sc.nodes, "router": sc.router}
    print(f"{'slo':32s} {slo.describe(class_names(sc))}")
    price_source = "given (--gpu-hour-usd)" if args.gpu_hour_usd is not None else \
        (f"default: {default_price_note(sc)}" if usd is not None else f"{default_price_note(sc)} with --gpu-hour-usd")
    print(f"{'price':32s} {price_source}")
    print(f"{'headroom':32s} {headroom_note(args.headroom, own_profile(sc))} $ at capacity: one copy at the rate "
          "found, no headroom")
    if arrivals_text(sc.workload):  # the search rescales the whole process: its shape stays, its mean rate moves
        closed = getattr(sc.workload, "concurrency", None) is not None
        print(f"{'arrivals':32s} " + ("closed-loop clients: the highest concurrency within the SLOs, searched (max_rate_"
                                       "req_s: the requests/s those clients send)" if closed else
                                       f"{arrivals_text(sc.workload)} (this shape at every rate tried)"))
    d["gpu_hour_usd_source"] = "given" if args.gpu_hour_usd is not None else \
        (f"default: {default_price_note(sc)}" if usd is not None else "none")
    for k, v in d.items():
        if k == "margin" and v is not None:
            print(f"{k:32s} {v * 100:.1f} % (the share of the fleet's capacity the target uses)")
        elif k not in ("by_priority", "gpu_hour_usd_source", "speculation"):
            print(f"{k:32s} {fmt(v) if v is not None else '-'}")
    where = "at the rate found" if res.max_rate_req_s > 0 else "at the lowest rate tried (none met the SLOs)"
    if res.max_concurrency is not None:
        where = f"at {res.max_concurrency:,} clients" if res.max_concurrency else "at 1 client (it misses the SLOs)"
    print(f"per class, {where} (each against its own SLOs at {slo.attainment * 100:.3g} %):")
    for level, c in res.by_priority.items():
        print(f"  {level} {c['class_name']}: {class_line(c, slo.attainment)}")
    write_json(args.json, d | {"slo": slo.to_dict(), "points": res.points.to_dict(orient="records"),
                               "launch": launch(sc)})  # the vLLM and SGLang commands (docs/LAUNCH.md)
    return 0
