"""``python -m batching report``: the figures "Explore a policy" shows, for documents, without a browser.

One simulation of the scenario and policy given with the same flags as ``run``, then into ``--out``:

- one PNG per figure of the dashboard's Explore page (``timeline.png``, ``batch_composition.png``,
  ``kv_queue.png``, ``ttft_hist.png``, ``tpot_hist.png``, ``e2e_hist.png``, ``itl.png``), drawn by the same
  builders and template as the app (``report.policy_figures``) and rendered by kaleido with the system
  Chromium;
- ``report.html``, the dashboard's standalone report (plotly.js inlined, opens offline);
- ``summary.json``, the dashboard's summary download (scenario, policy, every metric).

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
from pathlib import Path

INSTALL_STEP = "apt-get install chromium"
SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROG = "python -m batching report"


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


def add_parser(subparsers) -> argparse.ArgumentParser:
    """The ``report`` subcommand: ``run``'s scenario and policy flags, plus the output folder."""
    from batching.cli.main import _add_policy, _add_scenario  # the same flags as `run`, defined once

    p = subparsers.add_parser(
        "report", help="PNGs of the dashboard's figures for one policy, an HTML report and the summary JSON",
        description="Simulate one policy (flags as for `run`) and write into --out the PNG of every figure the "
                    "dashboard's Explore page shows, a standalone HTML report and the summary JSON.")
    _add_scenario(p)
    _add_policy(p)
    p.add_argument("--out", type=Path, required=True, help="folder for the files (created if missing)")
    p.add_argument("--scale", type=float, default=2.0, help="PNG pixel scale (default 2, as the dashboard's button)")
    p.add_argument("--width", type=int, default=1200, help="PNG width in CSS pixels before scaling (default 1200)")
    p.add_argument("--no-png", action="store_true", help="only the HTML report and the JSON (no Chromium needed)")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args) -> int:
    if not 0.5 <= args.scale <= 6:
        print(f"{PROG}: error: --scale={args.scale:g} is out of range; allowed 0.5 to 6", file=sys.stderr)
        return 2
    if not 200 <= args.width <= 4000:
        print(f"{PROG}: error: --width={args.width} is out of range; allowed 200 to 4000", file=sys.stderr)
        return 2
    chromium = None
    if not args.no_png:
        chromium = find_chromium()
        if chromium is None:  # fail before spending time on the simulation
            print(_no_chromium_message(), file=sys.stderr)
            return 2
        os.environ.setdefault("BROWSER_PATH", chromium)
    written = write_report(args, chromium)
    for path in written:
        print(path)
    return 0


def write_report(args, chromium: str | None) -> list[Path]:
    """Simulate and write the files; returns their paths (PNGs only when ``chromium`` is given)."""
    from batching.charts import policy as charts
    from batching import report
    from batching.cli.main import build_scenario
    from batching.charts.formatting import report_frame
    from batching.sim.policy import PRESETS
    from batching.sim.simulate import simulate

    started = time.perf_counter()
    scenario = build_scenario(args)
    result = simulate(scenario)
    customised = scenario.policy != PRESETS[args.preset]
    label = args.preset + ("*" if customised else "")
    summary = result.summary()
    figs = report.policy_figures(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    one, policies = {label: summary}, {label: scenario.policy}
    path = out / "summary.json"
    path.write_bytes(report.summary_json(one, scenario, policies))
    written.append(path)

    command = "python -m batching report " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "report" else "python -m batching report"
    notes = [f"Made by `{command}` (the figures of the dashboard's Explore page for this scenario and policy)."]
    _, sample_note = charts.timeline_sample(result.requests)
    if sample_note:
        notes.append(sample_note)
    html = report.html_report(f"Explore a policy: {label}", scenario, figures=list(figs.values()),
                              tables=[("Metrics", report_frame(one, report.POLICY_METRICS))], policies=policies,
                              notes=notes)
    path = out / "report.html"
    path.write_text(html, encoding="utf-8")
    written.append(path)

    if chromium is not None:
        written += _write_pngs(figs, out, args.scale, args.width, chromium)
    print(f"{PROG}: {len(written)} files in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return written


def _write_pngs(figs: dict, out: Path, scale: float, width: int, chromium: str) -> list[Path]:
    """One PNG per figure through one kaleido browser (about 0.4 s a figure once it has started)."""
    import kaleido

    from batching.report import figure_png

    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # plotly: "kopts is ignored if using a server"
        kaleido.start_sync_server(silence_warnings=True)
        try:
            for key, (fig, _) in figs.items():
                try:
                    png = figure_png(fig, scale=scale, width=width)
                except Exception as exc:  # kaleido/choreographer raise their own types
                    raise ValueError(f"rendering {key}.png with Chromium at {chromium} failed: "
                                     f"{type(exc).__name__}: {exc}") from None
                path = out / f"{key}.png"
                path.write_bytes(png)
                written.append(path)
        finally:
            kaleido.stop_sync_server(silence_warnings=True)
    return written
