"""``python -m batching report``: a dashboard page's figures, tables and report, for documents, without a browser.

``--page`` picks the page (default ``explore``, what the command always did); the scenario comes from the same
flags as ``run``, and each page's own inputs from its flags (below). Into ``--out`` go, every name starting with
the page and unique within it:

- ``<page>_<figure>.png`` and ``.svg``: one PNG and one SVG per figure the page draws, from the same builders, template and study
  functions as the dashboard (``report.*_export``), each with the scenario's caption line under it, rendered by
  kaleido with the system Chromium at ``--scale`` (default 2, as the dashboard's download button);
- ``<page>_<table>.csv``: the page's tables and its CSV downloads;
- ``<page>_summary.json`` (``_sweep.json`` on tune, ``_plan.json`` on capacity): the page's JSON download;
- ``<page>_report.html``: the page's standalone report (plotly.js inlined, opens offline).

Pages and their inputs:

- ``explore``: one simulation of ``--preset`` and its knob flags;
- ``showdown`` (the home page): the five presets at the offered load and saturated;
- ``compare``: ``--policies`` (2 to 4 presets, default dynamic,continuous,chunked, as the page's slots);
- ``tune``: ``--preset`` and its knobs swept over ``--knob`` (default the policy's batch cap) and ``--values``
  (default the page's range), ``--knee-share``, ``--others/--no-others`` (the other presets that use the knob
  on the frontier, default on), ``--frontier``, and the SLOs below;
- ``capacity``: ``--policies`` (default all five), the SLOs below, ``--target-rate`` (20 req/s),
  ``--gpu-hour-usd`` (default: the GPU's row of the price table, ``studies.pricing``), ``--headroom``
  (``pricing.DEFAULT_HEADROOM``), the page's defaults;
- ``search`` (Find a deployment): the grid ``--gpus``, ``--precisions``, ``--tps``, ``--policies``, ``--serving``
  and ``--knobs`` (default the page's: h100-sxm,h200-sxm; bf16,fp8; 2,4,8; chunked; agg), the SLOs below,
  ``--target-rate`` (20 req/s), ``--gpu-hour-usd`` (one price for every GPU; default each GPU's row of the price
  table), ``--headroom`` and ``--fleet-top``; the fleet check runs behind ``--router``, as the page's behind the
  sidebar's;
- tune, capacity and search: ``--slo-ttft-ms``, ``--slo-tpot-ms``, ``--slo-e2e-s`` (one value or one per priority class)
  and ``--attainment``, as ``capacity`` and ``sweep`` take them; without them the pages' shared default SLOs
  (``studies.capacity.default_slo``).

A flag of another page is refused (one line, exit code 2), before anything is simulated.

Chromium: ``BROWSER_PATH`` when set, else ``/usr/bin/chromium`` or a Chromium/Chrome on ``PATH``. When none
is found the command prints one line naming the install step and exits with code 2 (``--no-png`` skips the
PNG files and needs no browser).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from batching.sim.metrics import saturated_capacity
from batching.cli.args import (CliError, add_policy_args, add_scenario_args, add_slo_args, build_scenario,
                               check_folder_inputs, check_output_folder, float_arg, int_arg, presets_with_caching, progress, shown,
                               slo_from_args, values_arg, write_files)
from batching.cli.capacity import MAX_GPU_HOUR_USD, MAX_TARGET_RATE_REQ_S
from batching.sim.policy import PRESETS
from batching.studies.capacity import HEADROOM_LIMITS, default_price
from batching.studies.pricing import DEFAULT_HEADROOM
from batching.studies.knee import DEFAULT_SHARE
from batching.studies.sweeps import KNOBS

INSTALL_STEP = "apt-get install chromium"
SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROG = "python -m batching report"
SCALE_LIMITS = (0.5, 6.0)
WIDTH_LIMITS = (200, 4000)
PAGES = ("showdown", "explore", "compare", "tune", "capacity", "search")
PAGE_TITLES = {"showdown": "Strategy showdown (home)", "explore": "Explore a policy", "compare": "Compare policies",
               "tune": "Tune a knob", "capacity": "Capacity planning", "search": "Find a deployment"}
COMPARE_DEFAULT = ("dynamic", "continuous", "chunked")  # the Compare page's slots A, B, C
COMPARE_SLOTS = "ABCD"
FRONTIERS = ("tpot_cap", "tpot", "ttft")  # charts.planning.FRONTIER_LATENCY
# the Capacity page's defaults (its SLOs are studies.capacity.default_slo, as Tune's)
# (the price: the scenario's GPU's default, studies.capacity.default_price, as the page's)
CAPACITY_DEFAULTS = {"target_rate": 20.0, "headroom": DEFAULT_HEADROOM}
# Find a deployment's defaults (pages/find_a_deployment.py params: its grid and target)
SEARCH_DEFAULTS = {"gpus": ("h100-sxm", "h200-sxm"), "precisions": ("bf16", "fp8"), "tps": (2, 4, 8),
                   "policies": ("chunked",), "serving": "agg", "target_rate": 20.0}
# flag dest -> the pages it applies to (checked before anything runs)
PAGE_FLAGS = {
    "policies": ("compare", "capacity", "search"),
    **{k: ("tune",) for k in ("knob", "values", "knee_share", "others", "frontier")},
    **{k: ("tune", "capacity", "search") for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_s", "attainment")},
    **{k: ("capacity", "search") for k in ("target_rate", "gpu_hour_usd", "headroom")},
    **{k: ("search",) for k in ("gpus", "precisions", "tps", "serving", "knobs", "fleet_top")},
    **{k: ("explore", "tune") for k in ("mode", "max_batch_size", "max_wait_ms", "max_num_seqs",
                                        "max_num_batched_tokens", "chunked_prefill", "priority", "preemption")},
}


def find_chromium() -> str | None:
    """The browser kaleido should use: BROWSER_PATH if set (and executable), else the system Chromium."""
    given = os.environ.get("BROWSER_PATH")
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    if SYSTEM_CHROMIUM.is_file() and os.access(SYSTEM_CHROMIUM, os.X_OK):
        return str(SYSTEM_CHROMIUM)
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _no_chromium_message() -> str:
    given = os.environ.get("BROWSER_PATH")
    where = (f"BROWSER_PATH={given} is not an executable file" if given
             else f"no Chromium at {SYSTEM_CHROMIUM} or on PATH")
    return (f"{PROG}: error: the PNG exports need Chromium and {where}; install it with "
            f"`{INSTALL_STEP}` (or set BROWSER_PATH, or pass --no-png)")


def policies_arg(text: str) -> list[str]:
    """``--policies``: preset names separated by commas, each once."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"it is empty; give presets separated by commas from {', '.join(PRESETS)}")
    for name in names:
        if name not in PRESETS:
            shown = name if len(name) <= 40 else name[:40] + "..."
            raise argparse.ArgumentTypeError(f"{shown!r} is not a preset; allowed: {', '.join(PRESETS)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{','.join(names)} names a preset twice; give each once")
    return names


def add_parser(subparsers) -> argparse.ArgumentParser:
    """The ``report`` subcommand: ``run``'s scenario and policy flags, the page and its inputs, the output folder."""
    p = subparsers.add_parser(
        "report", help="a dashboard page's figures (PNG), tables (CSV), HTML report and JSON",
        description="Run what one page of the dashboard runs (--page, default explore) on the scenario the flags "
                    "describe and write into --out its figures as PNG, its tables as CSV, its standalone HTML "
                    "report and its JSON, every name starting with the page.")
    add_scenario_args(p)
    add_policy_args(p)
    p.add_argument("--page", choices=PAGES, default="explore",
                   help="the page to export: showdown (home), explore (default), compare, tune, capacity, search "
                        "(Find a deployment)")
    p.add_argument("--out", type=Path, required=True, help="folder for the files (created if missing)")
    p.add_argument("--scale", type=float_arg(*SCALE_LIMITS), default=2.0,
                   help="PNG pixel scale, 0.5 to 6 (default 2, as the dashboard's button)")
    p.add_argument("--width", type=int_arg(*WIDTH_LIMITS), default=1200,
                   help="PNG width in CSS pixels before scaling, 200 to 4000 (default 1200)")
    p.add_argument("--no-png", action="store_true", help="no PNG files (no Chromium needed)")
    g = p.add_argument_group("compare, capacity and search pages")
    g.add_argument("--policies", type=policies_arg, default=None,
                   help=f"presets, comma-separated: compare 2 to 4 (default {','.join(COMPARE_DEFAULT)}), capacity "
                        f"1 to 5 (default all), search 1 to 5 (default {','.join(SEARCH_DEFAULTS['policies'])})")
    g = p.add_argument_group("tune page")
    g.add_argument("--knob", choices=list(KNOBS), default=None,
                   help="the knob to sweep (default the policy's batch cap: max_num_seqs or max_batch_size)")
    g.add_argument("--values", type=values_arg, default=None,
                   help="comma-separated values (default the page's range for the knob)")
    g.add_argument("--knee-share", type=float_arg(), default=None,
                   help=f"growth below which the knee is reached (default {DEFAULT_SHARE:g})")
    g.add_argument("--others", action=argparse.BooleanOptionalAction, default=None,
                   help="sweep the other presets that use the knob too, for the frontier (default on)")
    g.add_argument("--frontier", choices=FRONTIERS, default=None,
                   help="the frontier's latency axis (default ttft for the request rate, else tpot_cap)")
    add_slo_args(p, "tune, capacity and search pages; default: the pages' shared default SLOs")
    _add_search_args(p)
    g = p.add_argument_group("capacity and search pages")
    low, high = HEADROOM_LIMITS
    g.add_argument("--headroom", type=float_arg(low, high), default=None,
                   help=f"divide the rate per node by this factor for nodes and cost, {low:g} to {high:g} (default "
                        f"{DEFAULT_HEADROOM:g}, as the page)")
    g.add_argument("--target-rate", type=float_arg(0.0, MAX_TARGET_RATE_REQ_S, low_open=True), default=None,
                   help=f"traffic to plan for, req/s (default {CAPACITY_DEFAULTS['target_rate']:g})")
    g.add_argument("--gpu-hour-usd", type=float_arg(0.0, MAX_GPU_HOUR_USD, low_open=True), default=None,
                   help="price of one GPU-hour, $ (search: of every GPU searched; default: each GPU's row of the "
                        "price table, as the pages)")
    p.set_defaults(func=cmd_report)
    return p


def _add_search_args(p) -> None:
    """The search page's grid (as Find a deployment's inputs), its fleet check."""
    from batching.cli.search import _list_arg, int_fleet_top
    from batching.sim.hardware.specs import GPUS, PRECISIONS
    from batching.studies.search import AGG_TPS, FLEET_TOP, SERVING

    d = SEARCH_DEFAULTS
    g = p.add_argument_group("search page (Find a deployment)")
    g.add_argument("--gpus", type=_list_arg("GPUs", tuple(GPUS), str, "h100-sxm,h200-sxm"), default=None,
                   help=f"GPUs to try, comma-separated: {', '.join(GPUS)} (default {','.join(d['gpus'])})")
    g.add_argument("--precisions", type=_list_arg("precisions", PRECISIONS, str, "bf16,fp8"), default=None,
                   help=f"precisions to try: {', '.join(PRECISIONS)} (default {','.join(d['precisions'])})")
    g.add_argument("--tps", type=_list_arg("TP degrees", AGG_TPS, int, "2,4,8"), default=None,
                   help=f"tensor-parallel degrees to try: {', '.join(map(str, AGG_TPS))} (default "
                        f"{','.join(map(str, d['tps']))})")
    g.add_argument("--serving", choices=list(SERVING), default=None,
                   help=f"agg, disagg (every prefill/decode split of a node) or both (default {d['serving']}, as "
                        "the page)")
    g.add_argument("--knobs", nargs="+", default=None, metavar="NAME=V1,V2",
                   help="knob values to try, e.g. max_num_seqs=128,256 (default: each preset's own)")
    g.add_argument("--fleet-top", type=int_fleet_top, default=None,
                   help=f"check this many of the top configurations as a fleet behind --router (default "
                        f"{FLEET_TOP}; 0: none)")


def check_page_flags(args) -> None:
    """Refuse a flag of another page, and a --policies count the page does not take."""
    for dest, pages in PAGE_FLAGS.items():
        if getattr(args, dest, None) is not None and args.page not in pages:
            flag = "--" + dest.replace("_", "-")
            raise CliError(f"{flag} applies to --page {' or '.join(pages)}, not --page {args.page}")
    if args.policies is not None:
        low, high = (2, 4) if args.page == "compare" else (1, len(PRESETS))  # capacity, search: 1 to 5
        if not low <= len(args.policies) <= high:
            raise CliError(f"--policies: {len(args.policies)} presets; --page {args.page} takes {low} to {high}")


def cmd_report(args) -> int:
    check_page_flags(args)  # before looking for a browser or simulating
    chromium = None
    if not args.no_png:
        chromium = find_chromium()
        if chromium is None:  # fail before spending time on the simulation
            print(_no_chromium_message(), file=sys.stderr)
            return 2
        os.environ.setdefault("BROWSER_PATH", chromium)
    scenario = build_scenario(args)
    if args.page == "search":
        search_grid(args, scenario)  # a grid that cannot be searched fails now, naming its flag
    if args.page == "capacity" and args.gpu_hour_usd is None:
        default_price(scenario)  # a price table that cannot be read fails now, in one line, not after the searches
    check_output_folder("--out", args.out)  # created now, before the simulation
    check_page_names(args.out, args.page)
    check_folder_inputs("--out", args.out, lambda name: name.startswith(f"{args.page}_"),  # the page's file names
                        f"the report writes its {args.page}_* files in that folder (at the end, replacing any of the "
                        "same name): give another --out or move the input")
    written = write_report(args, chromium, scenario)
    for path in written:
        print(path)
    return 0


def check_page_names(out: Path, page: str) -> None:
    """Before anything runs: no folder in ``out`` takes a name the page's files start with (``<page>_``), since
    a file cannot replace it (the files are written all at the end, all or nothing: ``args.write_files``)."""
    try:
        entries = [e for e in Path(out).iterdir() if e.name.startswith(f"{page}_")]
    except OSError as exc:
        raise CliError(f"--out {shown(out)}: cannot list the folder ({exc.strerror or type(exc).__name__})") from None
    for e in entries:
        if e.is_dir() and not e.is_symlink():
            raise CliError(f"--out {shown(out)}: {e.name} in it is a folder, and the report's files are named "
                           f"{page}_*; remove it or choose another folder")


def write_report(args, chromium: str | None, scenario=None) -> list[Path]:
    """Run the page's studies on ``scenario`` (or the one the flags describe) and write its files; returns their
    paths (PNGs only when ``chromium`` is given)."""
    started = time.perf_counter()
    scenario = build_scenario(args) if scenario is None else scenario
    export = page_export(args, scenario)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m batching report " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "report" else "python -m batching report"
    note = (f"Made by `{command}` (the figures and tables of the dashboard's {PAGE_TITLES[args.page]} page for "
            "this scenario).")
    files = dict(export.files(notes=[note]))
    if chromium is not None:
        files.update(_render_pngs(export, args.scale, args.width, chromium))
    written = write_files("--out", out, files)  # all or nothing, never through a symlink
    print(f"{PROG}: {len(written)} files in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return written


def page_export(args, scenario):
    """The page's ``report.PageExport``, from the same study functions the page calls."""
    from batching import report
    from batching.sim.simulate import simulate
    from batching.studies.compare import compare

    known = PRESETS.get(args.preset, scenario.profile.policy)  # --preset engine: the profile's own defaults
    label = args.preset + ("*" if scenario.policy.unsized() != known else "")
    if args.page == "explore":
        return report.explore_export(simulate(scenario), label, simulate(scenario, saturated=True))
    if args.page == "showdown":
        every = presets_with_caching(getattr(args, "prefix_caching", None))
        from batching.studies.load_curve import load_curve

        # the page's first chart (latency against load) and its article table come with it (issue 24 item 11)
        return report.showdown_export(compare(scenario, every, progress=progress), scenario, every,
                                      curve=load_curve(scenario, every), article_summaries=report.showdown_article(scenario))
    if args.page == "compare":
        names = args.policies or COMPARE_DEFAULT
        every = presets_with_caching(getattr(args, "prefix_caching", None))
        policies = {f"{slot} · {n}": every[n] for slot, n in zip(COMPARE_SLOTS, names)}
        return report.compare_export(compare(scenario, policies, progress=progress), scenario, policies)
    if args.page == "tune":
        return report.tune_export(*_tune_study(args, scenario, label))
    if args.page == "search":
        return report.search_export(_search(args, scenario), scenario)
    return report.capacity_export(_capacity_plan(args, scenario))


def search_grid(args, scenario):
    """The grid Find a deployment searches, from the flags (the page's defaults where not given); CliError naming
    the flag when it cannot be searched."""
    from batching.sim.hardware.specs import GPUS_PER_NODE
    from batching.studies.search import Grid, parse_knobs

    d = SEARCH_DEFAULTS
    try:
        knobs = parse_knobs(args.knobs or ())
    except ValueError as exc:
        raise CliError(f"--knobs: {exc}") from None
    grid = Grid(tuple(args.gpus or d["gpus"]), tuple(args.precisions or d["precisions"]), tuple(args.tps or d["tps"]),
                tuple(args.policies or d["policies"]), knobs, args.serving or d["serving"],
                min(scenario.deployment.node.num_gpus, GPUS_PER_NODE))
    try:
        grid.validate()
    except ValueError as exc:
        raise CliError(f"the grid (--gpus, --precisions, --tps, --policies, --serving, --knobs): {exc}") from None
    return grid


def _search(args, scenario) -> dict:
    """Find a deployment's search on the scenario's model and workload (its GPU, TP, precision and rate replaced by
    the grid's and the search's), the fleet check behind the scenario's router, each row's launch commands."""
    from batching.studies import planning as sp
    from batching.studies.backends import make_backend
    from batching.studies.launch import with_launch
    from batching.studies.search import FLEET_TOP, search

    grid = search_grid(args, scenario)
    slo, _ = sp.study_slo(scenario, slo_from_args(args, scenario))  # the flags', else the pages' default
    if args.attainment is not None:
        slo = replace(slo, attainment=args.attainment)
    slo.validate()
    target = SEARCH_DEFAULTS["target_rate"] if args.target_rate is None else args.target_rate
    prices = None if args.gpu_hour_usd is None else {g: args.gpu_hour_usd for g in grid.gpus}
    headroom = DEFAULT_HEADROOM if args.headroom is None else args.headroom
    workers = max(1, min(4, os.cpu_count() or 1))

    def backend(tasks: int):
        return make_backend("threads", workers=max(1, min(workers, tasks)))

    try:
        res = search(scenario, slo, target, prices, grid, backend=backend, headroom=headroom, router=scenario.router,
                     fleet_top=FLEET_TOP if args.fleet_top is None else args.fleet_top,
                     progress=progress)
    except ValueError as exc:
        raise CliError(f"search: {exc}") from None
    with_launch(res["configs"], scenario)
    return res


def _tune_study(args, scenario, label: str):
    """(study, log x axis, frontier) as the Tune page makes them: the policy swept, then the other presets that
    use the knob (unless --no-others) on the same values, a preset that cannot run them named, not fatal."""
    from batching.cli.sweep import check_values
    from batching.sim.simulate import simulate
    from batching.studies import planning as sp
    from batching.studies.knee import check_share

    share = check_share(DEFAULT_SHARE if args.knee_share is None else args.knee_share)
    policy = scenario.policy
    knob = args.knob or sp.default_knob(policy)
    if not sp.knob_applies(knob, policy, scenario):
        allowed = ", ".join(sp.knobs_for(policy, scenario))
        raise CliError(f"--knob {knob} does not apply to {label} ({policy.mode} batching) on this workload; "
                       f"allowed: {allowed}")
    cap_rate = None
    if knob == "rate_req_s":
        cap_rate = saturated_capacity(simulate(scenario, saturated=True).summary())[0]
    start, stop, points, spacing = sp.default_range(knob, scenario, cap_rate)
    if args.values is not None:
        check_values(knob, args.values)
        values = sorted(set(args.values))
        if len(values) < 2:
            raise CliError(f"--values: {len(values)} distinct value; a sweep takes at least 2")
    else:
        values = sp.knob_values(knob, start, stop, points, spacing)
    low, high = sp.bounds(knob, scenario)
    if not all(low <= v <= high for v in values):
        raise CliError(f"--values: {knob} must be {low:g} to {high:g} on this scenario")
    slo, is_default = sp.study_slo(scenario, slo_from_args(args, scenario))
    if args.attainment is not None:  # the default SLOs with another attainment target, as `sweep` does
        slo = replace(slo, attainment=args.attainment)
    frames = {label: sp.sweep_study(scenario, knob, values, share, label, progress=progress, slo=slo).frame}
    others, skipped = {}, {}
    if args.others is not False:
        for name, pol in presets_with_caching(getattr(args, "prefix_caching", None)).items():
            if name == label or not sp.knob_applies(knob, pol, scenario):
                continue
            try:
                frames[name] = sp.sweep_study(scenario.with_policy(pol), knob, values, share, name,
                                              progress=progress, slo=slo).frame
                others[name] = pol
            except ValueError as exc:  # this preset cannot run this range: say why, keep the others
                skipped[name] = str(exc)
    study = sp.read_sweeps(scenario, knob, values, frames, share, label, policies=others, skipped=skipped, slo=slo,
                           slo_is_default=is_default)
    frontier = args.frontier or ("ttft" if knob == "rate_req_s" else "tpot_cap")
    return study, spacing == "log", frontier


def _capacity_plan(args, scenario):
    """The Capacity page's plan: one capacity search per policy for the SLOs, priced for the target."""
    from batching.studies import planning as sp
    from batching.studies.capacity import capacity, default_price

    d = CAPACITY_DEFAULTS
    slo, _ = sp.study_slo(scenario, slo_from_args(args, scenario))  # the flags', else the pages' default
    if args.attainment is not None:
        slo = replace(slo, attainment=args.attainment)
    slo.validate()
    names = args.policies or list(PRESETS)
    every = presets_with_caching(getattr(args, "prefix_caching", None))
    results = {n: capacity(scenario.with_policy(every[n]), slo, progress=progress) for n in names}
    target = d["target_rate"] if args.target_rate is None else args.target_rate
    usd = default_price(scenario) if args.gpu_hour_usd is None else args.gpu_hour_usd
    headroom = d["headroom"] if args.headroom is None else args.headroom
    return sp.plan_capacity(scenario, slo, results, target, usd, headroom)


def _render_pngs(export, scale: float, width: int, chromium: str) -> dict[str, bytes]:
    """One PNG per figure (file name -> bytes) through one kaleido browser (about 0.4 s a figure once it has
    started)."""
    import kaleido

    from batching import report
    from batching.report import figure_png

    pngs: dict[str, bytes] = {}
    names = export.png_names()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # plotly: "kopts is ignored if using a server"
        kaleido.start_sync_server(silence_warnings=True)
        try:
            for key, (fig, _) in export.figures.items():
                try:
                    png = figure_png(fig, scale=scale, width=width)
                except Exception as exc:  # kaleido/choreographer raise their own types
                    raise ValueError(f"rendering {names[key]} with Chromium at {chromium} failed: "
                                     f"{type(exc).__name__}: {exc}") from None
                pngs[names[key]] = png
                pngs[export.svg_names()[key]] = report.figure_svg(fig, width=width)  # vector, for documents
        finally:
            kaleido.stop_sync_server(silence_warnings=True)
    return pngs
