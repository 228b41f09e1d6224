"""First-minute benchmark (issue 25): what a new user and a planner trying a technique wait for, from an EMPTY
kernel cache, each moment as a ratio to its warm case.

    python benchmarks/bench_first_minute.py [--rows 1,2,3,4] [--features router,eagle,...] [--moves 3]
                                            [--dash-features router,eagle,disagg] [--prepare auto|on|off]
                                            [--quiet 1.5] [--json FILE] [--max-minutes 45]
    python benchmarks/bench_first_minute.py --report FILE     # the tables of a run saved with --json

A full run takes about 15-25 minutes on 2 cores (most of it Numba compiling kernels, on purpose); ``--rows 2``
alone about 10. It creates a fresh temporary folder, points NUMBA_CACHE_DIR at it (for the servers and the CLI
runs it starts; this process compiles nothing) and removes it at the end, on Ctrl-C and after --max-minutes.
Servers, the browser, the observer of ``.js-plotly-plot`` mutations and the "last change" rule (no chart mutation
and no script-state change for ``--quiet`` seconds, the time being that of the last mutation) are
``benchmarks/bench_browser.py``'s, imported from it. Every row also counts the kernels compiled during it (new
``*.nbc`` files in the cache folder), so a slow case says whether it compiled.

Setup (always): ``streamlit run app.py`` with the empty cache and BATCHING_PREPARE=off; the home page opened in a
fresh browser context draws everything the home page needs (the five presets' kernels). The cache after that is
the "plain kernels compiled" state; it is copied once for the CLI cases, once for the dashboard features and once
for ``prepare``, so each first use of a feature is a real first use. (BATCHING_PREPARE=off keeps the dashboard's
background compile, which starts once the first page is drawn, out of that state; every later server runs as
installed, or all with BATCHING_PREPARE=off under ``--background-prepare off``, the "before" case.)

Row 1, cold start: the setup's page, seconds from navigation start to the first and to the last chart; then the
server restarted on the same (now warm) cache and the home page opened with a new seed (``seed=`` in the link);
ratio cold / warm (target <= 3x). It lists the texts of the progress indicators seen while waiting
(``stProgress``, ``stSpinner``, the header's ``stStatusWidget``, ``st.info`` boxes: the compile notice) with the
second each first appeared. The home page is opened once more with another seed on the same server: that is the
process-warm case, printed too.

Row 2, first use of a feature. CLI: ``python -m batching run --requests 300`` plus each feature's flags
(``FEATURES``), on its copy of the cache: the first run (cold: its kernels compile) and the same command again
(warm: a new process loading them from the cache), wall seconds and ratio (target <= 2x); a third column, where
``python -m batching prepare`` exists on this tree (``--prepare auto``), runs each feature once on a third copy of
the cache after ``prepare`` has compiled ahead, ratio to the warm run. The first line the CLI printed on stderr
about compiling is kept. Dashboard: a server on the dashboard copy, the home page opened once (process warm),
then Explore with each feature's link (``FEATURES``' query) and the same link with a new seed: seconds to the
last chart, ratio (target <= 2x).

Row 3, Tune: on the warm server in one browser run, ``--moves`` knob moves each (bench_browser's move: one key,
then the last chart change) of Explore's Max wait slider (the reference), Tune's sidebar request rate (a knob: the
whole sweep re-simulated), Tune's Points (one more point) and Tune's first TTFT SLO (+5 %, re-read); medians,
ratio to Explore's (target <= 3x).

Row 4, opening each page on the warm server in a fresh context with a new seed: home, Explore, Compare, Tune,
Capacity, Find a deployment, Model and hardware; last chart, ratio to the home page's (target <= 2x).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_browser as bb  # noqa: E402
from benchmarks.bench_browser import fmt  # noqa: E402

ROWS = (1, 2, 3, 4)
CLI_REQUESTS = 300  # issue 25's CLI row: 300 requests
MOONCAKE = "{mooncake}"  # replaced by the path of the small Mooncake trace written into the temporary folder
# (name, flags after `python -m batching run --requests 300`, Explore link query or None: no dashboard link)
FEATURES = [
    ("plain", (), None),  # no feature: what the setup left to compile for the CLI (its reference is its warm run)
    ("router", ("--nodes", "2", "--router", "least-kv"), "nodes=2&router=least-kv"),
    ("fleet", ("--nodes", "2", "--router", "round-robin"), "nodes=2&router=round-robin"),
    ("eagle", ("--spec-decode", "eagle"), "spec=eagle"),
    ("draft", ("--spec-decode", "draft"), "spec=draft"),
    ("disagg", ("--prefill-instances", "1", "--decode-instances", "1", "--prefill-tp", "4", "--decode-tp", "4"),
     "serving=disaggregated&prefill_instances=1&decode_instances=1&prefill_tp=4&decode_tp=4"),
    ("sessions", ("--workload", "chat-sessions"), "workload=chat-sessions"),
    ("prefix", ("--shared-prefix-tokens", "1000", "--prefix-caching"), "prefix_tokens=1000&cache=true"),
    ("mooncake", ("--trace", MOONCAKE), None),  # the dashboard takes a Mooncake file by upload only
    ("clients", ("--concurrency", "8"), "load=clients&conc=8"),
    ("trtllm", ("--engine", "trtllm"), "engine=trtllm"),
]
FEATURE_TEXT = {
    "plain": "no feature (continuous default)", "router": "router least-kv, 2 nodes",
    "fleet": "fleet round-robin, 2 nodes", "eagle": "speculative decoding EAGLE",
    "draft": "speculative decoding, draft model", "disagg": "disaggregated 1P (TP4) + 1D (TP4)",
    "sessions": "chat sessions", "prefix": "1,000-token shared prefix + caching", "mooncake": "Mooncake trace",
    "clients": "closed loop, 8 clients", "trtllm": "engine profile TensorRT-LLM",
}
DASH_DEFAULT = "router,eagle,draft,disagg,sessions,prefix,clients,trtllm,fleet"
# Row 4: (name, URL path) of every page
OPEN_PAGES = [("home", ""), ("explore", "explore"), ("compare", "compare"), ("tune", "tune"),
              ("capacity", "capacity"), ("find_a_deployment", "find_a_deployment"),
              ("model_and_hardware", "model_and_hardware")]
# Row 3: bench_browser's page/knob specs (name, path, control kind, label); the first is the reference
TUNE_MOVES = [next(p for p in bb.PAGES if p[0] == "explore"),
              ("tune_knob", "tune", "number", "Request rate (req/s)"),  # the sidebar: the whole sweep again
              next(p for p in bb.PAGES if p[0] == "tune"),  # Points + 1
              next(p for p in bb.PAGES if p[0] == "tune_slo")]  # TTFT SLO + 5 %
TARGETS = {1: 3.0, 2: 2.0, 3: 3.0, 4: 2.0}
ROW3_TEXT = {"explore": "Explore, a knob (reference)", "tune_knob": "Tune, a knob", "tune": "Tune, one more point",
             "tune_slo": "Tune, an SLO move"}
ELAPSED = re.compile(r"\s*\((\d+ minutes?, )?\d+(\.\d+)? seconds?\)$")  # a Streamlit spinner's elapsed-time suffix
SO_FAR = re.compile(r"\d+ s so far")  # batching/ui/compile_notice.py's box counts its seconds: "(12 s so far"
ORDER_NOTE = ("(features run in this order on one cache: one that shares kernels with an earlier one, such as the "
              "round-robin fleet after the least-kv router, finds them compiled; kernels = variants it compiled)")

# Installed with bench_browser's observer in row 1's tabs: every distinct text of a progress indicator
PROGRESS_JS = r"""
(() => {
  if (window.__benchProgress) return;
  const P = window.__benchProgress = [];
  const SEL = '[data-testid="stProgress"], [data-testid="stSpinner"], [data-testid="stStatusWidget"], ' +
              '[data-testid="stAlertContentInfo"]';  // the last: an st.info box, as the compile notice draws
  const seen = new Set();
  new MutationObserver(() => {
    document.querySelectorAll(SEL).forEach(el => {
      // Streamlit's spinner appends its elapsed time, "(2.5 seconds)", "(1 minute, 0.1 seconds)", every 0.1 s: kept
      // once, without it
      const text = (el.innerText || '').trim().replace(/\s+/g, ' ')
        .replace(/\s*\((\d+ minutes?, )?\d+(\.\d+)? seconds?\)$/, '');
      const what = el.getAttribute('data-testid') + ': ' + text;
      if (text && !seen.has(what)) { seen.add(what); P.push({t: performance.now(), what: what}); }
    });
  }).observe(document, {subtree: true, childList: true, characterData: true});
})();
"""


# ---------------------------------------------------------------- pure parts (tested)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4", type=_rows, help="comma-separated subset of 1,2,3,4")
    ap.add_argument("--features", default=",".join(f[0] for f in FEATURES), type=_names(FEATURES),
                    help="row 2's CLI features: " + ", ".join(f[0] for f in FEATURES))
    ap.add_argument("--dash-features", default=DASH_DEFAULT,
                    type=_names([f for f in FEATURES if f[2] is not None]),
                    help="row 2's dashboard features (those with a link): " + DASH_DEFAULT)
    ap.add_argument("--prepare", choices=("auto", "on", "off"), default="auto",
                    help="row 2's third column, first use after `python -m batching prepare`: auto = where the "
                         "command exists on this tree")
    ap.add_argument("--background-prepare", choices=("default", "off"), default="default",
                    help="off: BATCHING_PREPARE=off for every server (the dashboard's background compile after the "
                         "first page, where the tree has it, disabled: the 'before' case); default: as installed")
    ap.add_argument("--shipped", choices=("on", "off"), default="on",
                    help="off: BATCHING_SHIPPED_KERNELS=off for every server and command (the repository's compiled "
                         "kernels not unpacked: a platform without them, or the tree before them); on: as a fresh "
                         "clone is")
    ap.add_argument("--moves", type=_positive_int, default=3, help="row 3's knob moves per control (default 3)")
    ap.add_argument("--quiet", type=float, default=1.5, help="seconds without a chart mutation that mean 'done'")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one page open or one move may take")
    ap.add_argument("--cli-timeout", type=float, default=300, help="seconds one CLI run may take")
    ap.add_argument("--json", default=None, help="write every figure to this JSON file")
    ap.add_argument("--max-minutes", type=float, default=45, help="hard stop for the whole run")
    ap.add_argument("--report", default=None, metavar="FILE", help="only print the tables of a run saved with --json")
    args = ap.parse_args(argv)
    for name in ("quiet", "timeout", "cli_timeout", "max_minutes"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    return args


def _rows(text: str) -> tuple[int, ...]:
    try:
        rows = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows {text!r}: allowed a comma-separated subset of 1,2,3,4") from None
    if not rows or not set(rows) <= set(ROWS):
        raise argparse.ArgumentTypeError(f"--rows {text!r}: allowed a comma-separated subset of 1,2,3,4")
    return rows


def _names(features):
    known = [f[0] for f in features]

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        bad = [n for n in names if n not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(bad)}: unknown feature; allowed {', '.join(known)}")
        return names
    return parse


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed a whole number >= 1")
    return n


def cli_command(flags, trace_path: str = "trace.jsonl") -> list[str]:
    """The `python -m batching run` arguments (after `-m batching`) of one feature."""
    return ["run", "--requests", str(CLI_REQUESTS), *(trace_path if f == MOONCAKE else f for f in flags)]


def ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def fmt_x(x: float | None, target: float | None = None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f}x" + ("" if target is None else (" ok" if x <= target else " OVER"))


def progress_texts(seen: list, shown: int = 8) -> str:
    """The distinct progress texts of a page open (``[(seconds, "testid: text")]``), a spinner's elapsed-time
    suffix taken off, the first ``shown`` of them with the second each first appeared."""
    out: dict[str, float] = {}
    for t, what in seen:
        out.setdefault(SO_FAR.sub("N s so far", ELAPSED.sub("", what)), t)
    items = [f"{t:.1f} s {what!r}" for what, t in out.items()]
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more if items else "none"


def rerun(row: dict) -> float | None:
    """Median rerun (BackMsg sent -> script_finished received) of a row 3 control's moves."""
    return bb.median([m.get("sent_done_s") for m in row.get("moves", [])])


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned, a rule under the header."""
    cols = [headers] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(headers))]

    def line(r):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    head = line(headers)
    return "\n".join([head, "-" * len(head)] + [line(r) for r in rows])


def mooncake_rows(n: int = CLI_REQUESTS, rate_req_s: float = 1.0, seed: int = 25) -> list[dict]:
    """A small Mooncake-format trace (timestamp ms, input_length, output_length, hash_ids of 512-token blocks):
    n requests at rate_req_s, four conversation groups whose prompts share their first two blocks, so its
    prefixes are replayed as the real trace's are. Lengths are drawn, not taken from a measurement: this is a
    compile-path input, not a workload model."""
    import random

    rng = random.Random(seed)
    rows, next_hash = [], 1000
    for i in range(n):
        tokens = rng.randint(1100, 4000)
        blocks = -(-tokens // 512)
        group = i % 4
        ids = [2 * group, 2 * group + 1] + list(range(next_hash, next_hash + blocks - 2))
        next_hash += blocks - 2
        rows.append({"timestamp": int(1000 * i / rate_req_s), "input_length": tokens,
                     "output_length": rng.randint(20, 300), "hash_ids": ids})
    return rows


# ---------------------------------------------------------------- kernel cache folders


class Caches:
    """The empty NUMBA_CACHE_DIR of the run and its copies, all under one temporary folder removed at the end."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bench-first-minute-"))
        self.main = self.root / "cache"
        self.main.mkdir()

    def copy(self, name: str) -> Path:
        dst = self.root / name
        shutil.copytree(self.main, dst)
        return dst

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def kernels(cache: Path) -> int:
    """Compiled kernel variants in a cache folder (Numba writes one .nbc file per compiled signature), not counting
    those unpacked from the shipped kernels (written before their ``shipped-*`` marker; copies keep the times)."""
    marks = [m.stat().st_mtime for m in cache.glob("*/shipped-*")]
    return sum(1 for f in cache.rglob("*.nbc") if not marks or f.stat().st_mtime > max(marks))


def use_cache(cache: Path) -> None:
    os.environ["NUMBA_CACHE_DIR"] = str(cache)  # the servers started next inherit it


PREPARE_ENV = "BATCHING_PREPARE"  # "off": the dashboard does not compile the other kernels in the background
SHIPPED_ENV = "BATCHING_SHIPPED_KERNELS"  # "off": the shipped kernels are not unpacked (everything compiles)


# ---------------------------------------------------------------- browser cases


@dataclass
class Opened:
    case: str
    first_s: float | None
    last_s: float | None
    charts: int
    kernels_new: int
    note: str = ""
    progress: list = field(default_factory=list)  # [(seconds, "testid: text")]


def open_timed(browser, url: str, case: str, cache: Path, quiet_s: float, timeout_s: float,
               progress: bool = False) -> Opened:
    k0 = kernels(cache)
    tab = bb.Tab(browser)
    try:
        if progress:
            tab.ctx.add_init_script(PROGRESS_JS)  # applies to the page's next navigation
        tab.page.goto(url, wait_until="commit")
        s = tab.settle(quiet_s, timeout_s, need_run=False, need_plots=True)
        seen = tab.page.evaluate("() => window.__benchProgress || []") if progress else []
    finally:
        tab.close()
    note = "timeout" if s.get("timeout") else ""
    if s["errors"]:
        note += f" {s['errors']} error(s) on screen"
    o = Opened(case, s["first"] / 1e3 if s["first"] is not None else None,
               s["last"] / 1e3 if s["last"] is not None else None, s["plots"], kernels(cache) - k0, note.strip(),
               [(p["t"] / 1e3, p["what"]) for p in seen])
    print(f"  {case}: first chart {fmt_s(o.first_s)}, last chart {fmt_s(o.last_s)}, {o.charts} charts, "
          f"{o.kernels_new} kernels compiled{' [' + o.note + ']' if o.note else ''}", flush=True)
    return o


def start_server(name: str, cache: Path, background: bool = True) -> bb.Server:
    """app.py on a free port with this kernel cache; background=False (or --background-prepare off for every
    server) sets BATCHING_PREPARE=off: no background compile after the first page."""
    use_cache(cache)
    before = os.environ.get(PREPARE_ENV)
    if not background:
        os.environ[PREPARE_ENV] = "off"
    try:
        server = bb.Server("app.py", name)
        health = server.start(timeout_s=180)
    finally:
        if before is None:
            os.environ.pop(PREPARE_ENV, None)
        else:
            os.environ[PREPARE_ENV] = before
    print(f"  server {name} up in {health:.1f} s at {server.url} (NUMBA_CACHE_DIR {cache}"
          f"{'' if background else ', ' + PREPARE_ENV + '=off'})", flush=True)
    return server


# ---------------------------------------------------------------- CLI cases


@dataclass
class CliRun:
    wall_s: float | None
    rc: int
    kernels_new: int
    said: str = ""  # the first stderr line about compiling or preparing


def run_cli(args: list[str], cache: Path, timeout_s: float) -> CliRun:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    k0 = kernels(cache)
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "batching", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return CliRun(None, 124, kernels(cache) - k0, f"timed out after {timeout_s:.0f} s")
    wall = time.perf_counter() - t
    said = next((ln.strip() for ln in p.stderr.splitlines() if "compil" in ln.lower() or "prepar" in ln.lower()), "")
    if p.returncode != 0:
        said = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return CliRun(wall if p.returncode == 0 else None, p.returncode, kernels(cache) - k0, said)


def prepare_available() -> bool:
    p = subprocess.run([sys.executable, "-m", "batching", "prepare", "--help"], cwd=ROOT, capture_output=True)
    return p.returncode == 0


# ---------------------------------------------------------------- the run


def save(out: dict, path: str | None) -> None:
    """Write the figures so far (after every stage, so a run stopped by --max-minutes keeps what it measured)."""
    if path:
        Path(path).write_text(json.dumps(out, indent=1))


def watchdog(minutes: float, caches: Caches) -> None:
    def expire():
        print(f"\n!! --max-minutes {minutes:g} reached: stopping the servers, removing {caches.root}", flush=True)
        bb.stop_all()
        caches.remove()
        os._exit(3)

    t = threading.Timer(minutes * 60, expire)
    t.daemon = True
    t.start()


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return
    if not Path(bb.CHROMIUM).exists():
        sys.exit(f"no Chromium at {bb.CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    caches = Caches()
    atexit.register(caches.remove)
    atexit.register(bb.stop_all)
    signal.signal(signal.SIGTERM, lambda *_: (bb.stop_all(), caches.remove(), os._exit(143)))
    watchdog(args.max_minutes, caches)
    if args.background_prepare == "off":
        os.environ[PREPARE_ENV] = "off"
    if args.shipped == "off":
        os.environ[SHIPPED_ENV] = "off"
    trace = caches.root / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in mooncake_rows()))
    features = {f[0]: f for f in FEATURES}
    load = os.getloadavg()
    print(f"First-minute benchmark: rows {','.join(map(str, args.rows))}, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; empty kernel cache {caches.main}; {PREPARE_ENV}="
          f"{os.environ.get(PREPARE_ENV, '(unset)')}; {SHIPPED_ENV}={os.environ.get(SHIPPED_ENV, '(unset)')}",
          flush=True)
    out: dict = {"cpus": os.cpu_count(), "load_start": load, "rows": list(args.rows), "moves": args.moves,
                 "background_prepare": os.environ.get(PREPARE_ENV, "(unset)"),
                 "shipped": os.environ.get(SHIPPED_ENV, "(unset)")}
    t_start = time.perf_counter()
    seed = iter(range(2501, 2600))  # seeds no earlier run in this process used
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=bb.CHROMIUM, args=bb.ARGS, timeout=60_000)
            print("Setup / row 1: the home page on a server started with the empty kernel cache", flush=True)
            # no background compile on this server: the cache it leaves is the plain-kernels state row 2 starts
            # from (a background compile starts after the first page is drawn, so the first chart is the same)
            cold_server = start_server("fm-cold", caches.main, background=False)
            cold = open_timed(browser, f"{cold_server.url}/", "cold: empty cache, new server, fresh browser context",
                              caches.main, args.quiet, max(args.timeout, 600), progress=True)
            cold_server.stop()
            snap = {name: caches.copy(name) for name in ("cli", "dash", "prep")} if 2 in args.rows else {}
            if snap:
                print(f"  the plain-kernels cache ({kernels(caches.main)} kernels) copied for row 2's CLI, dashboard "
                      "and prepare cases", flush=True)
            server = start_server("fm-warm", caches.main)
            warm = open_timed(browser, bb.link(server.url, "", f"seed={next(seed)}"),
                              "warm: server restarted, same cache, new seed", caches.main, args.quiet, args.timeout,
                              progress=True)
            again = open_timed(browser, bb.link(server.url, "", f"seed={next(seed)}"),
                               "warm process: same server, another new seed", caches.main, args.quiet, args.timeout,
                               progress=True)
            out["row1"] = {"cold": asdict(cold), "warm": asdict(warm), "warm_process": asdict(again)}

            if 4 in args.rows:
                print("Row 4: each page on the warm server, fresh context, new seed", flush=True)
                out["row4"] = [asdict(open_timed(browser, bb.link(server.url, path, f"seed={next(seed)}"), name,
                                                 caches.main, args.quiet, args.timeout))
                               for name, path in OPEN_PAGES]
            if 3 in args.rows:
                print(f"Row 3: {args.moves} knob moves each, Explore against Tune, same browser run", flush=True)
                out["row3"] = []
                for spec in TUNE_MOVES:
                    k0 = kernels(caches.main)
                    r = bb.measure_moves(browser, server, spec, args.moves, args.quiet, args.timeout)
                    out["row3"].append({"name": spec[0], "control": r.control, "last_s": r.med("last_s"),
                                        "moves": [asdict(m) for m in r.moves],
                                        "kernels_new": kernels(caches.main) - k0})
            server.stop()
            save(out, args.json)

            if 2 in args.rows and args.dash_features:
                print("Row 2, dashboard: Explore with each feature's link on a server warm for the plain kernels",
                      flush=True)
                dash = start_server("fm-features", snap["dash"])
                open_timed(browser, bb.link(dash.url, "", f"seed={next(seed)}"), "home (warms the process)",
                           snap["dash"], args.quiet, args.timeout)
                out["row2_dash"] = []
                for name in args.dash_features:
                    query = features[name][2]
                    first = open_timed(browser, bb.link(dash.url, "explore", f"{query}&seed={next(seed)}"),
                                       f"{name}: first use", snap["dash"], args.quiet, max(args.timeout, 600))
                    second = open_timed(browser, bb.link(dash.url, "explore", f"{query}&seed={next(seed)}"),
                                        f"{name}: again, new seed", snap["dash"], args.quiet, args.timeout)
                    out["row2_dash"].append({"name": name, "first": asdict(first), "again": asdict(second)})
                dash.stop()
                save(out, args.json)
            browser.close()
    finally:
        bb.stop_all()

    if 2 in args.rows:
        print("Row 2, CLI: `python -m batching run --requests 300` + each feature's flags, first use then again",
              flush=True)
        out["row2_cli"] = []
        for name in args.features:
            cmd = cli_command(features[name][1], str(trace))
            cold_run = run_cli(cmd, snap["cli"], args.cli_timeout)
            warm_run = run_cli(cmd, snap["cli"], args.cli_timeout)
            print(f"  {name}: first {fmt_s(cold_run.wall_s)} ({cold_run.kernels_new} kernels compiled), again "
                  f"{fmt_s(warm_run.wall_s)}{'; stderr: ' + cold_run.said if cold_run.said else ''}", flush=True)
            out["row2_cli"].append({"name": name, "command": "python -m batching " + " ".join(cmd),
                                    "first": asdict(cold_run), "again": asdict(warm_run)})
            save(out, args.json)
        have = args.prepare == "on" or (args.prepare == "auto" and prepare_available())
        out["prepare"] = None
        if have:
            print("Row 2, CLI after `python -m batching prepare` (a third copy of the plain-kernels cache)", flush=True)
            prep = run_cli(["prepare"], snap["prep"], 3600)
            print(f"  prepare: {fmt_s(prep.wall_s)}, {prep.kernels_new} kernels compiled", flush=True)
            out["prepare"] = {"run": asdict(prep), "features": {}}
            for name in args.features:
                r = run_cli(cli_command(features[name][1], str(trace)), snap["prep"], args.cli_timeout)
                print(f"  {name} after prepare: {fmt_s(r.wall_s)} ({r.kernels_new} kernels compiled)", flush=True)
                out["prepare"]["features"][name] = asdict(r)
                save(out, args.json)
        else:
            print("Row 2, CLI after prepare: skipped (--prepare off, or no `python -m batching prepare` on this "
                  "tree)", flush=True)

    out["wall_s"] = time.perf_counter() - t_start
    out["load_end"] = os.getloadavg()
    print(report(out))
    if args.json:
        save(out, args.json)
        print(f"\nfigures saved to {args.json}")


def report(out: dict) -> str:
    """The summary tables of a run's figures (``main``'s dict, as saved with --json)."""
    load = out.get("load_end") or (None,)
    parts = [f"\nFirst-minute benchmark: {out['cpus']} CPUs, load average at the end {fmt(load[0], '.1f')}, wall "
             f"{out.get('wall_s', 0):.0f} s; BATCHING_SHIPPED_KERNELS={out.get('shipped', '(unset)')}; s = seconds, x = the ratio to the warm case, ok/OVER against the "
             "issue's target"]
    if "row1" in out and 1 in out["rows"]:
        c, w, a = out["row1"]["cold"], out["row1"]["warm"], out["row1"]["warm_process"]
        rows = [[k, fmt_s(c[f"{k}_s"]), fmt_s(w[f"{k}_s"]), fmt_x(ratio(c[f"{k}_s"], w[f"{k}_s"]), TARGETS[1]),
                 fmt_s(a[f"{k}_s"])] for k in ("first", "last")]
        rows = [[f"home page, {r[0]} chart"] + r[1:] for r in rows]
        parts += ["\nRow 1, cold start (target cold <= 3x warm)",
                  table(["moment", "cold (empty cache)", "warm (restarted)", "cold/warm", "warm process"], rows),
                  f"kernels compiled: cold {c['kernels_new']}, warm {w['kernels_new']}. Progress indicators seen "
                  f"while waiting (cold; second first seen, testid: text): {progress_texts(c['progress'])}"]
    if "row2_cli" in out or "row2_dash" in out:
        prep = out.get("prepare")
        head = ["feature", "first use", "again", "first/again", "kernels"]
        if prep:
            head += ["after prepare", "x again"]
        rows = []
        for r in out.get("row2_cli", []):
            f, a = r["first"], r["again"]
            row = [FEATURE_TEXT[r["name"]], fmt_s(f["wall_s"]), fmt_s(a["wall_s"]),
                   fmt_x(ratio(f["wall_s"], a["wall_s"]), TARGETS[2]), str(f["kernels_new"])]
            if prep:
                p = prep["features"].get(r["name"], {})
                row += [fmt_s(p.get("wall_s")), fmt_x(ratio(p.get("wall_s"), a["wall_s"]), TARGETS[2])]
            rows.append(row)
        if rows:
            parts += [f"\nRow 2, first use of a feature, CLI: `python -m batching run --requests {CLI_REQUESTS}` "
                      "wall time (target first use <= 2x again)", table(head, rows), ORDER_NOTE]
            parts.append("after prepare: " + (f"`prepare` took {fmt_s(prep['run']['wall_s'])} and compiled "
                                              f"{prep['run']['kernels_new']} kernels" if prep else
                                              "not measured (no `python -m batching prepare` on this tree, or "
                                              "--prepare off)"))
            firsts = [r["first"] for r in out.get("row2_cli", [])]
            said = [f["said"] for f in firsts if f["said"]]
            parts.append(f"CLI stderr on first use: {len(said)} of {len(firsts)} first runs printed a line about "
                         "compiling" + (f", e.g. {said[0]!r}" if said else "") + f"; of these, "
                         f"{sum(f['kernels_new'] > 0 for f in firsts)} compiled kernels")
        rows = [[FEATURE_TEXT[r["name"]], fmt_s(r["first"]["last_s"]), fmt_s(r["again"]["last_s"]),
                 fmt_x(ratio(r["first"]["last_s"], r["again"]["last_s"]), TARGETS[2]),
                 str(r["first"]["kernels_new"])] for r in out.get("row2_dash", [])]
        if rows:
            parts += ["\nRow 2, first use of a feature, dashboard: Explore link, navigation start to the last chart "
                      "(target first use <= 2x the same link with a new seed)",
                      table(["feature", "first use", "again", "first/again", "kernels"], rows), ORDER_NOTE]
    if "row3" in out:
        base = out["row3"][0] if out["row3"] else {}
        rows = [[ROW3_TEXT.get(r["name"], r["name"]), r["control"], fmt_s(r["last_s"]),
                 fmt_x(ratio(r["last_s"], base.get("last_s")), TARGETS[3]),
                 fmt_s(rerun(r)), fmt_x(ratio(rerun(r), rerun(base)), TARGETS[3]),
                 f"{sum(m['last_s'] is not None for m in r['moves'])}/{len(r['moves'])}", str(r["kernels_new"])]
                for r in out["row3"]]
        parts += [f"\nRow 3, Tune against an Explore move, medians of {out.get('moves', '?')} moves (target <= 3x "
                  "Explore's): key press to the last chart change (over the moves that changed a chart), and the "
                  "rerun it caused (BackMsg sent -> script_finished received)",
                  table(["move", "control", "last change", "x Explore", "rerun", "x Explore", "changed", "kernels"],
                        rows)]
    if "row4" in out:
        base = out["row4"][0]["last_s"] if out["row4"] else None
        rows = [[r["case"], fmt_s(r["first_s"]), fmt_s(r["last_s"]), fmt_x(ratio(r["last_s"], base), TARGETS[4]),
                 str(r["charts"]), str(r["kernels_new"]) + (f" [{r['note']}]" if r["note"] else "")]
                for r in out["row4"]]
        parts += ["\nRow 4, opening each page on the warm server with a new seed: navigation start to the first / "
                  "last chart (target last <= 2x the home page's)",
                  table(["page", "first chart", "last chart", "x home", "charts", "kernels"], rows)]
    return "\n".join(parts)


if __name__ == "__main__":
    main()
