"""``python -m batching specs``: what fits and how much KV cache: parameters, active parameters, weight GiB per GPU,
KV bytes per token and KV capacity per replica of a model on a node, without simulating anything. A model that does
not fit is one line saying what would (another TP degree, FP8, or the GPUs it fits on)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from batching.cli.args import add_layout_args, add_spec_arguments, check_output_file, deployment_from_args, int_arg, write_json
from batching.sim.hardware.specs import (GPUS, GPUS_PER_NODE, KV_BLOCK_TOKENS, MODELS, NODE_GPU_COUNTS, PRECISIONS,
                                         PUBLISHED_PRECISION, TP_DEGREES, TWO_NODE_GPUS, deployment_figures)

STDOUT = "-"


def add_parser(subparsers):
    p = subparsers.add_parser("specs", help="what fits and how much KV cache: parameters, weights per GPU, KV "
                                            "bytes per token and KV capacity (nothing simulated)")
    g = p.add_argument_group("deployment")
    g.add_argument("--model", default="qwen2.5-72b", choices=list(MODELS))
    g.add_argument("--gpu", default="h100-sxm", choices=list(GPUS))
    g.add_argument("--num-gpus", type=int_arg(1, TWO_NODE_GPUS, choices=NODE_GPU_COUNTS), default=None,
                   help=f"GPUs in the node (1-{GPUS_PER_NODE}; default {GPUS_PER_NODE}), or {TWO_NODE_GPUS}: two "
                        f"nodes serving --tp {TWO_NODE_GPUS} (the default with --tp {TWO_NODE_GPUS})")
    g.add_argument("--tp", type=int_arg(1, TWO_NODE_GPUS, choices=TP_DEGREES), default=None,
                   help=f"tensor parallel degree {{1,2,4,8,16}} (default {GPUS_PER_NODE}, or the largest dividing "
                        f"--num-gpus); {TWO_NODE_GPUS}: one replica over two nodes")
    g.add_argument("--precision", default=None, choices=list(PRECISIONS),
                   help="weight precision (default: the precision the model is published in: fp8 for "
                        f"{', '.join(PUBLISHED_PRECISION)}, else bf16)")
    g.add_argument("--kv-cache-tokens", type=int_arg(KV_BLOCK_TOKENS, 2**40), default=None,
                   help="shrink the KV cache to this many tokens")
    add_spec_arguments(g, allreduce=False)  # --model-json, --gpu-json, --kv-dtype
    add_layout_args(g)  # --ep, --dp-attention
    p.add_argument("--json", type=Path, nargs="?", const=Path(STDOUT), default=None, metavar="FILE",
                   help="print the figures as JSON (or write them to FILE)")
    p.set_defaults(func=cmd_specs)
    return p


def _precision(args) -> str:
    if args.precision is not None:
        return args.precision
    if getattr(args, "model_json", None):
        return "bf16"
    return PUBLISHED_PRECISION.get(args.model, "bf16")


def _gib(v: float) -> str:
    return f"{v:,.1f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e9:,.2f} billion ({n:,})"


def cmd_specs(args) -> int:
    to_stdout = args.json is not None and str(args.json) == STDOUT
    if args.json is not None and not to_stdout:
        check_output_file("--json", args.json)
    ns = argparse.Namespace(**vars(args))
    ns.precision = _precision(args)
    dep = deployment_from_args(ns)
    d = deployment_figures(dep)
    if to_stdout:
        print(json.dumps(d, indent=2))
        return 0
    kv_label = "FP8" if d["kv_dtype"] == "fp8" or d["precision"] == "nvfp4" else "BF16"
    rows = [
        ("model", f"{d['model']} ({d['attention']})"),
        ("node", f"{d['num_gpus']}x {d['gpu']}, tp={d['tp']}, {d['replicas']} replica"
                 f"{'s' if d['replicas'] != 1 else ''}"
                 + (f", ep={d['ep']}" if d.get("ep", 1) > 1 else "") + (", DP attention" if d.get("dp_attention") else "")),
        ("precision", f"{d['precision']} weights, {kv_label} KV cache"),
        ("parameters", _params(d["parameters"])),
        ("active_parameters", _params(d["active_parameters"])),
        ("weight_gib_per_gpu", _gib(d["weight_gib_per_gpu"])),
        ("usable_gib_per_gpu", _gib(d["usable_gib_per_gpu"])),
        ("kv_cache_gib_per_gpu", _gib(d["kv_cache_gib_per_gpu"])),
        ("kv_bytes_per_token", f"{d['kv_bytes_per_token']:,.0f} B (whole model)"),
        ("kv_bytes_per_token_per_gpu", f"{d['kv_bytes_per_token_per_gpu']:,.0f} B"
                                       + (" (DP attention: each token's KV on one GPU of the group, "
                                          f"{d['tp']} GPUs)" if d.get("dp_attention")
                                          else " (the latent is held whole on every TP rank)"
                                          if d["attention"] == "MLA" and d["tp"] > 1 else "")),
        ("kv_capacity_tokens", f"{d['kv_capacity_tokens']:,} per replica"),
        ("kv_capacity_tokens_node", f"{d['kv_capacity_tokens_node']:,} ({d['replicas']} replica"
                                    f"{'s' if d['replicas'] != 1 else ''})"),
    ]
    for k, v in rows:
        print(f"{k:28s} {v}")
    if args.json is not None:
        write_json(args.json, d)
    return 0

