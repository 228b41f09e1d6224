"""Browser benchmark (issue 11): what a user waits for after a knob move, in headless Chromium.

    python benchmarks/bench_browser.py [--moves 6] [--quiet 1.5] [--pages explore,compare] [--skip-open]
                                       [--skip-big] [--trace [--trace-page home]] [--max-minutes 40]
    python benchmarks/bench_browser.py --server-profile    # AppTest + cProfile, no browser
    python benchmarks/bench_browser.py --figure-lab        # Explore's figures alone in Chromium
    python benchmarks/bench_browser.py --chart-costs [--pages explore]  # each chart redrawn in its own page
    python benchmarks/bench_browser.py --without-charts --skip-open --skip-big  # moves with no Plotly redraw

A full run takes about 15 minutes on 2 cores (Tune and Capacity's SLO moves re-simulate for seconds each).

Starts ``benchmarks/trivial_app.py`` (one slider, one 200-point Plotly line) and ``app.py``, each with
``streamlit run`` on its own free 127.0.0.1 port (logs in test-artifacts/bench-*.log), drives them with
Playwright and Debian's Chromium (/usr/bin/chromium, the e2e tests' flags; no browser is downloaded) and
stops both servers at the end, on Ctrl-C, and after --max-minutes at the latest.

Knob moves. On the trivial page and on every page with knobs, one control (``PAGES``) is moved ``--moves``
times with the keyboard, each time to a value not seen before: focus it, press one key, wait until done. Sliders
get ArrowRight (the thumb's input; a slider in a closed expander has its expander opened first), number inputs
ArrowUp (Streamlit commits that at once), a segmented control Space on its other option, a text input (an SLO)
its first value + 5 % typed in, then Enter (the key timed). The control is the
page's first one where every step changes the charts (see ``PAGES`` for why the literal first slider is not
always that); ``explore_first`` keeps the literal first slider of Explore to show what a step that changes no
chart costs. Per move:

- last change: key press -> the last DOM mutation inside (or adding / removing) any ``.js-plotly-plot``,
  recorded by a MutationObserver installed before the page's scripts run. "Last" means no further chart
  mutation and no script-state change for ``--quiet`` seconds with ``data-test-script-state="notRunning"``;
  the quiet period is not part of the number (the time is that of the last mutation itself).
- first change: key press -> the first such mutation.
- server rerun: the script thread's wall and CPU time per run, logged by the server process (``LAUNCHER`` wraps
  ScriptRunner._run_script before Streamlit's CLI starts; the app is unchanged), and the CPU seconds the server
  process and Chromium used during the move (/proc). Also the rerun as the page received it (CDP
  Network.webSocketFrame*: ForwardMsg ``new_session`` -> ``script_finished``; Chromium reports a frame when the
  renderer handles it, so this includes the time the renderer was too busy to read).
- KB per rerun: WebSocket payload bytes received from the key press to the end, and the part of it that is
  Plotly figure specs.

Opening pages. Each page opened in a fresh browser context on the warm server (kernel compiled): with a seed no
run used before (``seed=`` in the link, so every cache is cold for that scenario) and, for the first page after
the server started, the cold-start time too; then a 20,000-request link (``n=20000``) on Explore and the home
page. Times are from navigation start to the first and the last chart mutation (quiet period as above).

``--trace`` records a Chrome performance trace (CDP Tracing, through Playwright) over one more move on Explore
(``--trace-page`` for another; saved as test-artifacts/bench-<page>-move.trace.json, opens in DevTools) and
prints where the renderer's main thread spent the time between the key press and the last chart change:
scripting, style/layout, paint, GPU/raster (waiting for the GPU process), idle, from the trace events' self
times, and how busy the GPU process, compositor and raster threads were.

``--figure-lab`` draws each Explore figure alone in a blank Chromium page (no Streamlit): JSON.parse,
Plotly.newPlot and Plotly.react to the next run's figure, as built and with the timeline as float32 and/or SVG.

``--without-charts`` measures the same moves with Plotly's redraw taken out of the app's pages (``SKIP_REDRAW_JS``:
each chart keeps its first drawing; a move's later ``Plotly.react`` becomes one attribute write that the observer
counts as the chart's change). What is left is everything else a move costs, so it shows how far a page is from
the target with charts that cost nothing to redraw. The trivial baseline still draws its chart.

``--chart-costs`` times what the browser pays to redraw each chart where it lives, with no server work and no
other element changing: on the trivial page and on each page of ``--pages``, the figures of two neighbouring
runs (before and after one move of the page's control) are drawn in turn with ``Plotly.react``, in each chart's
own node, several times over (a chart the move left unchanged is skipped, as the app's element skips it); it
prints each chart's synchronous redraw (ms), its SVG elements and figure KB, the page's redraws summed (the
ratio against the trivial page's one chart is taken on these sums) and all of them through two animation frames
(paint included). The sum is a floor for the key press -> last chart change: the real move adds the server's run
and Streamlit's own rendering of the page's other elements on the same renderer thread.

``--server-profile`` (no browser) profiles one Explore rerun in AppTest after a slider move to a new value:
time per section (simulate through the cache, each figure builder, Streamlit's figure conversion and JSON
serialisation), each figure's JSON size, and the top functions of a cProfile of the script thread.
"""
from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1440, "height": 1000}
BIG_REQUESTS = 20_000  # the sidebar's "n" query parameter (batching/ui/sidebar.py)

# (name, URL path and query, control kind (slider, number, segmented, text), control label): a control of each page with knobs whose every
# step changes the charts. The literal "first slider" does not always: Explore's default preset (continuous)
# starts with max running sequences, which 2,000 requests at 3 req/s never reach, so a step redraws nothing;
# Tune's fixed knobs are overridden by the swept one. Moves that change no chart are counted, not timed.
PAGES = [
    ("home", "", "number", "Request rate (req/s)"),  # the sidebar: five presets re-simulated
    ("explore", "explore?policy=dynamic", "slider", "Max wait (ms)"),  # the e2e test's knob: one new run
    ("compare", "compare", "slider", "Max wait (ms)"),  # policy A (dynamic), in its closed expander
    ("tune", "tune", "number", "Points"),  # one more value: a new sweep
    ("tune_slo", "tune", "text", "TTFT SLO (ms)"),  # class 0's TTFT SLO + 5 %: the sweep's runs re-read
    ("tune_share", "tune", "number", "Knee threshold (%)"),  # the knee moves; no new simulation
    ("capacity", "capacity", "number", "Target traffic (req/s)"),  # no new simulation
    ("capacity_slo", "capacity", "text", "TTFT SLO (ms)"),  # the first control: a new search per policy
    ("model_and_hardware", "model_and_hardware", "segmented", "KV cache dtype"),  # BF16 <-> FP8
    ("explore_first", "explore", "slider", None),  # the literal first slider of the default preset
]
TRIVIAL = ("trivial", "", "slider", None)

# Installed before any page script: chart mutations, script-state changes, progress indicators, key presses.
OBSERVER_JS = r"""
(() => {
  if (window.__bench) return;
  const S = window.__bench = {key: null, first: null, last: null, n: 0, ran: false, stateT: null,
                              progressT: null, armedAt: null};
  S.arm = () => { S.key = null; S.first = null; S.last = null; S.n = 0; S.ran = false; S.stateT = null;
                  S.progressT = null; S.armedAt = performance.now();
                  document.querySelectorAll('.js-plotly-plot').forEach(g => { g.__benchOld = true; }); };
  const PROGRESS = '[data-testid="stSpinner"], [data-testid="stProgress"]';  // the app's own, not the header's
  const inPlot = (n) => {
    const el = n.nodeType === 1 ? n : n.parentElement;
    return !!(el && el.closest('.js-plotly-plot'));
  };
  const has = (n, sel) => n.nodeType === 1 && (n.matches(sel) || !!n.querySelector(sel));
  new MutationObserver((records) => {
    const t = performance.now();
    for (const r of records) {
      if (r.type === 'attributes' && r.attributeName === 'data-test-script-state') {
        S.stateT = t;  // any change of the script state after arm() means a run happened (records read late:
        S.ran = true;  // getAttribute would give today's value, "notRunning" again, for a fast run)
        continue;
      }
      let hit = inPlot(r.target);
      if (r.type === 'childList') {
        for (const n of [...r.addedNodes, ...r.removedNodes]) {
          if (!hit && has(n, '.js-plotly-plot')) hit = true;
        }
        if (S.progressT === null) {
          for (const n of r.addedNodes) if (has(n, PROGRESS)) { S.progressT = t; break; }
        }
      }
      if (hit) { if (S.first === null) S.first = t; S.last = t; S.n++; }
    }
  }).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
  window.addEventListener('keydown', () => { if (S.key === null) S.key = performance.now(); }, true);
})();
"""

# --without-charts: the app's plotly.js (window.Plotly, loaded by batching/ui/plot.js) keeps its first draw of
# each chart, and every later Plotly.react on a drawn chart of the app (.batching-plot) becomes one attribute write
# on the chart's node, which the observer above counts as the chart's change. A move then costs everything it
# costs in the app (the run, the figures built, sent and parsed, Streamlit's rendering of the page) except
# Plotly's redraw. The trivial page's st.plotly_chart (not a .batching-plot) still draws.
SKIP_REDRAW_JS = r"""
(() => {
  let plotly;
  Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly, set: (v) => {
    plotly = v;
    if (!v || typeof v.react !== 'function' || Object.isFrozen(v)) return;
    const react = v.react;
    let n = 0;
    v.react = function (div, ...rest) {
      if (div && div._fullLayout && div.classList.contains('batching-plot')) {
        div.setAttribute('data-bench-skipped', String(++n));
        return Promise.resolve(div);
      }
      return react.call(this, div, ...rest);
    };
  }});
})();
"""
SKIP_REDRAW = False  # main() sets it for --without-charts; Tab installs SKIP_REDRAW_JS then

POLL_JS = """() => {
  const S = window.__bench || {};
  const app = document.querySelector('[data-testid="stApp"]');
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return {now: performance.now(), key: S.key, first: S.first, last: S.last, n: S.n, ran: S.ran,
          stateT: S.stateT, progressT: S.progressT, armedAt: S.armedAt,
          state: app ? app.getAttribute('data-test-script-state') : null,
          plots: plots.length, drawn: plots.every(g => g._fullLayout && g.data),
          remounted: plots.filter(g => !g.__benchOld).length,
          errors: document.querySelectorAll('[data-testid="stException"], [data-testid="stAlertContentError"]').length};
}"""


# `streamlit run` with the script thread's wall and CPU time per run appended to $BENCH_RUN_LOG (the app is
# unchanged: ScriptRunner._run_script is wrapped in the server process before Streamlit's CLI starts)
LAUNCHER = r"""
import json, os, sys, time
from streamlit.runtime.scriptrunner import script_runner as _sr
_orig = _sr.ScriptRunner._run_script
_log = os.environ["BENCH_RUN_LOG"]
_prof = os.environ.get("BENCH_PROFILE_DIR")  # --server-cprofile: one pstats file per script run
_n = [0]
def _timed(self, rerun_data):
    w, c = time.perf_counter(), time.thread_time()
    if _prof:
        import cProfile
        pr = cProfile.Profile()
        pr.enable()
    try:
        return _orig(self, rerun_data)
    finally:
        if _prof:
            pr.disable()
            _n[0] += 1
            pr.dump_stats(os.path.join(_prof, f"run-{_n[0]:03d}.pstats"))
        with open(_log, "a") as f:
            f.write(json.dumps({"wall": time.perf_counter() - w, "cpu": time.thread_time() - c}) + "\n")
_sr.ScriptRunner._run_script = _timed
from streamlit.web import cli
sys.argv = ["streamlit", "run", *sys.argv[1:]]
sys.exit(cli.main())
"""


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds user + system) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(server_pid: int | None) -> tuple[float, float]:
    """(CPU s of the server process, CPU s of every other descendant of this process: Playwright + Chromium)."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                stats[int(d)] = st
    children = defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    browser, todo = 0.0, [c for c in children[os.getpid()] if c != server_pid]
    while todo:
        pid = todo.pop()
        browser += stats[pid][1]
        todo += children[pid]
    server = stats[server_pid][1] if server_pid in stats else 0.0
    return server, browser


def link(base: str, path: str, query: str = "") -> str:
    """base/path with query appended to the path's own query (if any)."""
    url = f"{base}/{path}"
    return url + ("&" if "?" in url else "?") + query if query else url


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f", none="n/a"):
    return none if x is None else format(x, spec)


# ---------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``streamlit run <script>`` on a free loopback port, in its own process group; ``stop`` ends it."""

    live: list["Server"] = []

    def __init__(self, script: str, name: str, extra: tuple[str, ...] = ()) -> None:
        self.script, self.name, self.extra = script, name, extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.run_log = ARTIFACTS / f"bench-{name}-runs.jsonl"

    def runs(self) -> list[dict]:
        """Script runs so far: wall and CPU seconds of the script thread."""
        try:
            return [json.loads(line) for line in self.run_log.read_text().splitlines() if line.strip()]
        except OSError:
            return []

    def start(self, timeout_s: float = 90) -> float:
        ARTIFACTS.mkdir(exist_ok=True)
        self._log = (ARTIFACTS / f"bench-{self.name}.log").open("w")
        self.run_log.write_text("")
        cmd = [sys.executable, "-c", LAUNCHER, self.script, "--server.headless", "true",
               "--server.port", str(self.port), "--server.address", "127.0.0.1", "--server.fileWatcherType",
               "none", "--browser.gatherUsageStats", "false", *self.extra]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_RUN_LOG": str(self.run_log)},
                                     start_new_session=True)
        Server.live.append(self)
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.script} exited with {self.proc.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.script}: no /_stcore/health within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this script started, nothing else
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        if self in Server.live:
            Server.live.remove(self)
            self._log.close()


def stop_all() -> None:
    for s in list(Server.live):
        s.stop()


def watchdog(minutes: float) -> None:
    def expire():
        print(f"\n!! --max-minutes {minutes:g} reached: stopping the servers and exiting", flush=True)
        stop_all()
        os._exit(3)

    t = threading.Timer(minutes * 60, expire)
    t.daemon = True
    t.start()


# ---------------------------------------------------------------- a browser tab with its instruments


@dataclass
class Frame:
    ts: float  # CDP monotonic seconds
    out: bool
    nbytes: int
    kind: str
    plotly_bytes: int = 0


class Tab:
    """A fresh browser context and page with the observer installed and the WebSocket frames recorded."""

    def __init__(self, browser) -> None:
        self.ctx = browser.new_context(viewport=VIEWPORT)
        self.ctx.add_init_script(OBSERVER_JS)
        if SKIP_REDRAW:
            self.ctx.add_init_script(SKIP_REDRAW_JS)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(120_000)
        self.frames: list[Frame] = []
        self.cdp = self.ctx.new_cdp_session(self.page)
        self.cdp.on("Network.webSocketFrameReceived", lambda p: self._frame(p, False))
        self.cdp.on("Network.webSocketFrameSent", lambda p: self._frame(p, True))
        self.cdp.send("Network.enable")

    def _frame(self, params: dict, out: bool) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        resp = params["response"]
        data = base64.b64decode(resp["payloadData"]) if resp.get("opcode") == 2 else resp["payloadData"].encode()
        kind, plotly = "?", 0
        try:
            msg = (BackMsg if out else ForwardMsg).FromString(data)
            kind = msg.WhichOneof("type") or "?"
            if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                el = msg.delta.new_element.WhichOneof("type")
                kind = f"delta:{el}"
                if el == "plotly_chart":
                    plotly = len(msg.delta.new_element.plotly_chart.spec)
                elif el == "bidi_component" and msg.delta.new_element.bidi_component.component_name == "batching_plot":
                    plotly = len(msg.delta.new_element.bidi_component.bytes)  # batching/ui/plot.py: figure + config
        except Exception:  # not a Streamlit message (or a future format): count the bytes anyway
            pass
        self.frames.append(Frame(params["timestamp"], out, len(data), kind, plotly))

    def poll(self) -> dict:
        return self.page.evaluate(POLL_JS)

    def settle(self, quiet_s: float, timeout_s: float, need_run: bool, need_plots: bool) -> dict:
        """Poll until the script is not running, charts are drawn and nothing changed for quiet_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.poll()
            ok = s["state"] == "notRunning" and (s["ran"] or not need_run) and s["drawn"]
            if need_plots:
                ok = ok and s["plots"] > 0
            if ok:
                marks = [m for m in (s["last"], s["stateT"], s["key"], s["armedAt"]) if m is not None]
                if s["now"] - max(marks, default=0.0) >= quiet_s * 1000:
                    return s
            if time.monotonic() > deadline:
                s["timeout"] = True
                return s
            if need_run and not s["ran"] and s["armedAt"] is not None and s["now"] - s["armedAt"] > 20_000:
                s["timeout"] = "no rerun within 20 s"
                return s
            self.page.wait_for_timeout(50)

    def close(self) -> None:
        try:
            self.ctx.close()
        except Exception:
            pass


def server_times(frames: list[Frame]) -> tuple[float | None, float | None, int]:
    """(script run time summed over runs, first BackMsg sent -> last script_finished, runs) from CDP frames."""
    runs, start, total = 0, None, 0.0
    sent = next((f.ts for f in frames if f.out and f.kind == "rerun_script"), None)
    finished = None
    for f in frames:
        if f.out:
            continue
        if f.kind == "new_session":
            start = f.ts
        elif f.kind == "script_finished" and start is not None:
            total += f.ts - start
            runs += 1
            start = None
            finished = f.ts
    return (total if runs else None), (finished - sent if sent is not None and finished is not None else None), runs


# ---------------------------------------------------------------- controls and moves


def first_control(page, kind: str, label: str | None):
    """(element to focus, key to press, description) for the page's first control of this kind."""
    if kind == "slider":
        slider = page.locator('[data-testid="stMain"] [data-testid="stSlider"]')
        slider = (slider.filter(has_text=label) if label else slider).first
        slider.wait_for(state="attached", timeout=60_000)
        if not slider.is_visible():  # in a closed expander: open it (no rerun)
            slider.locator("xpath=ancestor::details[1]/summary").click()
            slider.wait_for(state="visible", timeout=10_000)
        name = slider.locator('[data-testid="stWidgetLabel"]').first.inner_text().strip()
        return slider.locator('input[type="range"], [role="slider"]').first, "ArrowRight", f"slider '{name}'"
    if kind == "number":
        box = page.locator('[data-testid="stNumberInput"]').filter(has_text=label).first
        return box.locator("input").first, "ArrowUp", f"number '{label}' (ArrowUp)"
    if kind == "text":  # a text input (in a closed expander: opened first): the first number + 5 %, then Enter
        box = page.locator('[data-testid="stTextInput"]').filter(has_text=label).first
        box.wait_for(state="attached", timeout=60_000)
        if not box.is_visible():
            box.locator("xpath=ancestor::details[1]/summary").click()
            box.wait_for(state="visible", timeout=10_000)
        field = box.locator("input").first
        first, *rest = field.input_value().split(",")
        field.fill(",".join([f"{float(first) * 1.05:.6g}", *rest]))  # no rerun until Enter
        return field, "Enter", f"text '{label}' (first value + 5 %, Enter)"
    if kind == "segmented":
        group = page.locator('[data-testid="stButtonGroup"]').filter(has_text=label).first
        other = group.locator('[role="radio"][aria-checked="false"]').first
        return other, "Space", f"segmented '{label}' (Space on the other option)"
    raise ValueError(kind)


@dataclass
class Move:
    first_s: float | None
    last_s: float | None
    server_s: float | None
    sent_done_s: float | None
    runs: int
    kb: float
    plotly_kb: float
    charts: int
    remounted: int = 0
    script_wall_s: float | None = None
    script_cpu_s: float | None = None
    server_cpu_s: float | None = None
    browser_cpu_s: float | None = None
    note: str = ""


def move_once(tab: Tab, server: Server, kind: str, label: str | None, quiet_s: float,
              timeout_s: float) -> tuple[Move, str]:
    target, key, desc = first_control(tab.page, kind, label)
    target.focus()
    tab.page.evaluate("() => window.__bench.arm()")
    mark, runs0 = len(tab.frames), len(server.runs())
    cpu0 = cpu_seconds(server.proc.pid)
    tab.page.keyboard.press(key)
    s = tab.settle(quiet_s, timeout_s, need_run=True, need_plots=True)
    cpu1 = cpu_seconds(server.proc.pid)
    script = server.runs()[runs0:]
    frames = tab.frames[mark:]
    server_s, sent_done, runs = server_times(frames)
    rx = [f for f in frames if not f.out]
    k = s["key"]
    note = ("timeout" if s.get("timeout") is True else s.get("timeout")) or ""
    if s["errors"]:
        note += f" {s['errors']} error(s) on screen"
    first = (s["first"] - k) / 1e3 if s["first"] is not None and k is not None else None
    last = (s["last"] - k) / 1e3 if s["last"] is not None and k is not None else None
    return Move(first, last, server_s, sent_done, runs, sum(f.nbytes for f in rx) / 1024,
                sum(f.plotly_bytes for f in rx) / 1024, s["plots"], s["remounted"],
                sum(r["wall"] for r in script) if script else None, sum(r["cpu"] for r in script) if script else None,
                cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], note.strip()), desc


@dataclass
class PageResult:
    name: str
    control: str = ""
    moves: list[Move] = field(default_factory=list)

    def med(self, attr: str):
        return median([getattr(m, attr) for m in self.moves])


def measure_moves(browser, server: Server, spec, n: int, quiet_s: float, timeout_s: float,
                  trace: bool = False) -> PageResult:
    base_url = server.url
    name, path, kind, label = spec
    res = PageResult(name)
    tab = Tab(browser)
    try:
        tab.page.goto(link(base_url, path), wait_until="commit")
        s = tab.settle(quiet_s, timeout_s, need_run=False, need_plots=True)
        if s.get("timeout"):
            print(f"  {name}: page did not settle in {timeout_s:.0f} s ({s['plots']} charts); skipped", flush=True)
            return res
        print(f"  {name}: opened, all charts at {fmt(s['last'] / 1e3 if s['last'] else None)} s", flush=True)
        for i in range(n):
            m, res.control = move_once(tab, server, kind, label, quiet_s, timeout_s)
            res.moves.append(m)
            print(f"  {name} move {i + 1}: first {fmt(m.first_s)} s, last {fmt(m.last_s)} s, wire "
                  f"{fmt(m.server_s)} s ({m.runs} run{'s' if m.runs != 1 else ''}), sent->done "
                  f"{fmt(m.sent_done_s)} s, {m.kb:,.0f} KB ({m.plotly_kb:,.0f} KB Plotly), {m.charts} charts "
                  f"({m.remounted} new)"
                  f"; script {fmt(m.script_wall_s)} s wall / {fmt(m.script_cpu_s)} s CPU, CPU during the move: server "
                  f"{fmt(m.server_cpu_s)} s, browser {fmt(m.browser_cpu_s)} s{' [' + m.note + ']' if m.note else ''}",
                  flush=True)
        if trace:
            trace_one_move(browser, tab, server, kind, label, quiet_s, timeout_s)
    finally:
        tab.close()
    return res


# ---------------------------------------------------------------- opening pages


@dataclass
class Open:
    page: str
    what: str
    first_s: float | None
    all_s: float | None
    charts: int
    kb: float
    progress_s: float | None
    note: str = ""


def open_page(browser, url: str, page: str, what: str, quiet_s: float, timeout_s: float) -> Open:
    tab = Tab(browser)
    try:
        tab.page.goto(url, wait_until="commit")
        s = tab.settle(quiet_s, timeout_s, need_run=False, need_plots=True)
        note = "timeout" if s.get("timeout") else ""
        if s["errors"]:
            note += f" {s['errors']} error(s) on screen"
        kb = sum(f.nbytes for f in tab.frames if not f.out) / 1024
        o = Open(page, what, s["first"] / 1e3 if s["first"] is not None else None,
                 s["last"] / 1e3 if s["last"] is not None else None, s["plots"], kb,
                 s["progressT"] / 1e3 if s["progressT"] is not None else None, note.strip())
    finally:
        tab.close()
    print(f"  open {page} ({what}): first chart {fmt(o.first_s)} s, all charts {fmt(o.all_s)} s, {o.charts} charts, "
          f"{o.kb:,.0f} KB, progress shown at {fmt(o.progress_s)} s{' [' + o.note + ']' if o.note else ''}",
          flush=True)
    return o


# ---------------------------------------------------------------- performance trace

TRACE_CATEGORIES = ["-*", "devtools.timeline", "disabled-by-default-devtools.timeline",
                    "disabled-by-default-devtools.timeline.frame", "toplevel", "v8.execute", "blink.user_timing",
                    "gpu", "viz", "disabled-by-default-v8.cpu_profiler"]
SCRIPTING = {"EvaluateScript", "FunctionCall", "TimerFire", "EventDispatch", "FireAnimationFrame",
             "FireIdleCallback", "RunMicrotasks", "v8.compile", "v8.compileModule", "v8.run", "V8.Execute",
             "v8.evaluateModule", "XHRReadyStateChange", "XHRLoad", "MajorGC", "MinorGC", "V8.GCScavenger",
             "V8.GCIncrementalMarking", "V8.GCFinalizeMC", "V8.GCCompactor", "BlinkGC.AtomicPhase",
             "CppGC.IncrementalSweep", "BlinkGC.AtomicPauseMarkTransitiveClosure", "GCEvent",
             "v8.callFunction", "ParseHTML", "WebSocketReceive", "WebSocketSend", "ResourceReceivedData",
             "ResourceFinish", "ResourceSendRequest", "ResourceReceiveResponse", "V8.CompileCode",
             "v8.produceCache", "v8.parseOnBackground", "V8.GC_SCAVENGER", "V8.GC_MC_INCREMENTAL",
             "ScheduleStyleInvalidationTracking", "AnimationFrame", "AnimationFrame::Script::Execute"}
LAYOUT = {"Layout", "UpdateLayoutTree", "RecalculateStyles", "ScheduleStyleRecalculation", "InvalidateLayout",
          "UpdateLayerTree", "UpdateLayer", "HitTest", "PrePaint", "Layerize", "ParseAuthorStyleSheet",
          "IntersectionObserverController::computeIntersections", "ComputeIntersections",
          "StyleInvalidatorInvalidationTracking",
          "LayoutInvalidationTracking", "LayoutShift"}
PAINT = {"Paint", "PaintImage", "PaintSetup", "CompositeLayers", "Commit", "Decode Image", "Decode LazyPixelRef",
         "ImageDecodeTask", "ResizeImage", "DrawLazyPixelRef", "ScrollLayer", "UpdateLayer.Paint"}
RASTER = {"RasterTask", "Rasterize", "GPUTask"}
# the renderer blocked on the GPU process: WebGL readback (software compositing reads every WebGL canvas back)
GPU_WAIT = {"GLES2::ReadPixels", "CommandBufferHelper::Finish", "ImplementationBase::WaitForCmd",
            "CommandBufferProxyImpl::WaitForGetOffset", "CommandBufferProxyImpl::WaitForToken",
            "GLES2Implementation::Finish", "CommandBufferHelper::WaitForGetOffsetInRange"}
TOPLEVEL = {"RunTask", "ThreadControllerImpl::RunTask", "ThreadPool_RunTask", "TaskGraphRunner::RunTask"}


def _category(name: str) -> str | None:
    if name in SCRIPTING or name.startswith(("V8.GC", "v8.", "BlinkGC", "CppGC")):
        return "scripting"
    if name in LAYOUT:
        return "layout/style"
    if name in PAINT:
        return "paint"
    if name in RASTER or name in GPU_WAIT:
        return "GPU/raster"
    return None


def _complete_events(events: list[dict]) -> dict[tuple, list[tuple[float, float, str]]]:
    """(pid, tid) -> [(start us, end us, name)] from 'X' events and matched 'B'/'E' pairs."""
    out: dict[tuple, list] = defaultdict(list)
    open_: dict[tuple, list] = defaultdict(list)
    for e in events:
        ph, key = e.get("ph"), (e.get("pid"), e.get("tid"))
        if ph == "X" and "dur" in e:
            out[key].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph == "B":
            open_[key].append(e)
        elif ph == "E" and open_[key]:
            b = open_[key].pop()
            out[key].append((b["ts"], e["ts"], b["name"]))
    return out


def _busy(evs, t0_us: float, t1_us: float) -> float:
    """Time covered by the outermost events of one thread inside the window (nested ones not counted twice)."""
    total, end = 0.0, -1.0
    for a, b, _ in sorted(evs):
        a, b = max(a, t0_us, end), min(b, t1_us)
        if b > a:
            total += b - a
            end = b
    return total


def trace_split(trace: dict, t0_us: float, t1_us: float) -> dict:
    """Self time per category on the page's renderer main thread between t0 and t1, plus other threads."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    complete = _complete_events(events)
    mains = [k for k, n in names.items() if n == "CrRendererMain"]
    # the renderer of our page: the main thread with the most event time in the window
    def busy(k):
        return sum(min(b, t1_us) - max(a, t0_us) for a, b, _ in complete.get(k, []) if b > t0_us and a < t1_us
                   and _category(_) is not None)
    main = max(mains, key=busy) if mains else None
    split: dict[str, float] = defaultdict(float)
    if main is not None:
        evs = sorted((e for e in complete[main] if e[1] > t0_us and e[0] < t1_us), key=lambda e: (e[0], -e[1]))
        stack: list[list] = []  # [start, end, effective category, self]
        def pop_until(t):
            while stack and stack[-1][1] <= t:
                s = stack.pop()
                split[s[2] or "other"] += s[3]
        for a, b, name in evs:
            a, b = max(a, t0_us), min(b, t1_us)
            pop_until(a)
            cat = _category(name)
            if cat is None and stack:
                cat = stack[-1][2]
            if stack:
                stack[-1][3] -= (b - a)
            if name in TOPLEVEL:
                cat = None
            stack.append([a, b, cat, b - a])
        pop_until(float("inf"))
    window = t1_us - t0_us
    top = sum(v for v in split.values())
    result = {k: v / 1e3 for k, v in split.items()}
    result["idle (main thread)"] = max(0.0, window - top) / 1e3
    # other threads: compositor raster workers and the GPU process
    raster = 0.0
    others: dict[str, float] = defaultdict(float)
    for k, evs in complete.items():
        n = names.get(k, "")
        if n.startswith("CompositorTileWorker") or n.startswith("ThreadPoolForegroundWorker"):
            raster += sum(min(b, t1_us) - max(a, t0_us) for a, b, nm in evs
                          if nm in RASTER | {"ImageDecodeTask"} and b > t0_us and a < t1_us)
        if n in ("CrGpuMain", "VizCompositorThread", "Compositor"):
            others[n] += _busy(evs, t0_us, t1_us)
    result["raster threads (busy)"] = raster / 1e3
    for n, v in others.items():
        result[f"{n} (busy)"] = v / 1e3
    result["window"] = window / 1e3
    return result


def js_profile(events: list[dict], t0_us: float, t1_us: float) -> tuple[dict, dict]:
    """Self time (ms) by script and by function between t0 and t1, from the V8 sampling profiler's ProfileChunk
    events (category disabled-by-default-v8.cpu_profiler): where the renderer's scripting time went."""
    nodes: dict = {}
    by_script: dict = defaultdict(float)
    by_fn: dict = defaultdict(float)
    starts = {e["id"]: e["args"]["data"].get("startTime", 0) for e in events if e.get("name") == "Profile"}
    clock: dict = {}
    for e in sorted((e for e in events if e.get("name") == "ProfileChunk"), key=lambda e: e["ts"]):
        pid = e.get("id")
        d = e["args"]["data"]
        prof = d.get("cpuProfile", {})
        for n in prof.get("nodes", []):
            nodes[(pid, n["id"])] = n["callFrame"]
        t = clock.get(pid, starts.get(pid, e["ts"]))
        for node, dt in zip(prof.get("samples", []), d.get("timeDeltas", [])):
            t += dt
            if t0_us <= t <= t1_us:
                cf = nodes.get((pid, node), {})
                url = cf.get("url", "").split("/")[-1].split("?")[0] or "(native/idle)"
                fn = cf.get("functionName") or "(anonymous)"
                if fn in ("(idle)", "(program)", "(garbage collector)", "(root)"):
                    url = fn
                by_script[url] += dt / 1e3
                by_fn[f"{fn} [{url}:{cf.get('lineNumber', -1) + 1}]"] += dt / 1e3
        clock[pid] = t
    return dict(by_script), dict(by_fn)


def trace_one_move(browser, tab: Tab, server: Server, kind: str, label: str | None, quiet_s: float,
                   timeout_s: float) -> None:
    browser.start_tracing(page=tab.page, categories=TRACE_CATEGORIES)
    try:
        m, desc = move_once(tab, server, kind, label, quiet_s, timeout_s)
    finally:
        raw = browser.stop_tracing()
    trace = json.loads(raw)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    page_name = tab.page.url.split("/")[3].split("?")[0] or "home"
    path = ARTIFACTS / f"bench-{page_name}-move.trace.json"
    path.write_bytes(raw)
    keys = [e for e in events if e.get("name") == "EventDispatch"
            and e.get("args", {}).get("data", {}).get("type") == "keydown"]
    if not keys or m.last_s is None:
        print(f"  trace: no keydown event or no chart change found ({len(events)} events); saved {path}")
        return
    t0 = keys[-1]["ts"]
    t1 = t0 + m.last_s * 1e6
    split = trace_split(trace, t0, t1)
    print(f"\nBrowser trace of one move on {page_name} ({desc}): key press -> last chart change {m.last_s:.2f} s, "
          f"{len(events):,} events, saved {path.relative_to(ROOT)}")
    print("  renderer main thread, self time by category (ms):")
    for k in ("scripting", "layout/style", "paint", "GPU/raster", "other", "idle (main thread)"):
        v = split.get(k, 0.0)
        print(f"    {k:<22} {v:8.0f}  {100 * v / split['window']:5.1f} %")
    print("  other threads, busy ms in the same window: " + ", ".join(
        f"{k.replace(' (busy)', '')} {v:.0f}" for k, v in split.items() if k.endswith("(busy)")))
    print("  (GPU/raster on the main thread = waiting for the GPU process: WebGL readback, ReadPixels; Chromium runs "
          "with --disable-gpu, so WebGL is SwiftShader on the CPU)")
    by_script, by_fn = js_profile(events, t0, t1)
    if by_script:
        print("  V8 samples, self ms by script: " + ", ".join(
            f"{k} {v:.0f}" for k, v in sorted(by_script.items(), key=lambda kv: -kv[1])[:8]))
        print("  V8 samples, top functions by self ms: " + "; ".join(
            f"{k} {v:.0f}" for k, v in sorted(by_fn.items(), key=lambda kv: -kv[1])[:12]))
    top = defaultdict(float)
    complete = _complete_events(events)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for k, evs in complete.items():
        if names.get(k) != "CrRendererMain":
            continue
        for a, b, nm in evs:
            if b > t0 and a < t1 and nm not in TOPLEVEL:
                top[nm] += min(b, t1) - max(a, t0)
    print("  longest event kinds on renderer main threads (inclusive ms): " +
          ", ".join(f"{n} {v / 1e3:.0f}" for n, v in sorted(top.items(), key=lambda kv: -kv[1])[:8]))


# ---------------------------------------------------------------- server-side profile


def server_profile(top_n: int = 25) -> None:
    """One Explore rerun in AppTest after a slider move (preset dynamic, max wait +10 ms, as the browser run):
    time per section, figure sizes, the cost of each figure step alone, and a cProfile of the script thread."""
    import cProfile
    import io
    import pickle
    import pstats

    import numpy as np
    import plotly.graph_objects as go
    import plotly.io as pio
    import plotly.tools
    from streamlit.elements.plotly_chart import PlotlyMixin
    from streamlit.runtime.scriptrunner import script_runner as sr
    from streamlit.testing.v1 import AppTest

    from batching import report
    from batching.charts import policy as charts
    from batching.sim.policy import PRESETS
    from batching.sim.simulate import Scenario, simulate
    from batching.ui import cache, knobs, page, state, widgets

    timings: dict[str, list[float]] = defaultdict(list)

    def timed(owner, attr, label):
        fn = getattr(owner, attr)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timings[label].append(time.perf_counter() - t)
        setattr(owner, attr, wrapper)
        return fn

    sections = (
        (page, "setup", "page.setup (title, sidebar; not in a fragment rerun)"),
        (knobs, "preset_select", "knobs.preset_select"),
        (knobs, "policy_knobs", "knobs.policy_knobs"),
        (knobs, "scenario_knobs", "knobs.scenario_knobs"),
        (state, "publish", "state.publish"),
        (cache, "simulate_cached", "cache.simulate_cached"),
        (cache, "summary_cached", "cache.summary_cached (baseline deltas)"),
        (widgets, "metric_cards", "widgets.metric_cards"),
        (report, "policy_figures", "report.policy_figures (7 figures)"),
        (charts, "request_timeline", "  charts.request_timeline"),
        (charts, "batch_composition", "  charts.batch_composition"),
        (charts, "kv_and_queue", "  charts.kv_and_queue"),
        (charts, "latency_histogram", "  charts.latency_histogram (x3)"),
        (charts, "itl_histogram", "  charts.itl_histogram"),
        (charts, "timeline_sample", "charts.timeline_sample (the page's note)"),
        (widgets, "chart", "widgets.chart (x7: st.plotly_chart + caption)"),
        (PlotlyMixin, "plotly_chart", "  st.plotly_chart (x7)"),
        (plotly.tools, "return_figure_from_figure_or_data", "    fig.to_dict() inside st.plotly_chart"),
        (pio, "to_json", "    plotly.io.to_json inside st.plotly_chart"),
        (widgets, "downloads", "widgets.downloads"),
    )
    if hasattr(report, "with_caption"):  # newer trees draw a scenario caption into every figure
        sections += ((report, "with_caption", "  with_caption (x7, the scenario caption)"),)
    originals = [(owner, attr, timed(owner, attr, label)) for owner, attr, label in sections]

    prof = {"on": False, "p": None}
    run_script = sr.ScriptRunner._run_script

    def profiled(self, rerun_data):
        t = time.perf_counter()
        try:
            if not prof["on"]:
                return run_script(self, rerun_data)
            prof["p"] = cProfile.Profile()
            return prof["p"].runcall(run_script, self, rerun_data)
        finally:
            timings["whole script run (script thread)"].append(time.perf_counter() - t)
    sr.ScriptRunner._run_script = profiled

    key = "wid:wait_ms"
    try:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.query_params["policy"] = "dynamic"
        at.run()
        at.switch_page("pages/explore.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        v0 = at.slider(key=key).value
        runs = []  # (what, value, profiled)
        runs += [("new value (one new simulation)", v0 + 10 * i, False) for i in (1, 2, 3)]
        runs += [("new value, under cProfile", v0 + 40, True)]
        runs += [("value seen before (all cached)", v0 + 10, False), ("value seen before (all cached)", v0 + 20, False)]
        report_rows = defaultdict(list)
        for what, v, on in runs:
            at.slider(key=key).set_value(v)
            timings.clear()
            prof["on"] = on
            t = time.perf_counter()
            at.run()
            took = time.perf_counter() - t
            prof["on"] = False
            assert not at.exception, [e.value for e in at.exception]
            report_rows[what].append((took, dict(timings)))
    finally:
        sr.ScriptRunner._run_script = run_script
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)

    load = os.getloadavg()
    print(f"Server side ({os.cpu_count()} CPUs, load average {load[0]:.1f}): Explore, preset dynamic, default scenario "
          f"(2,000 requests), slider {key[4:]} {v0} -> +10 ms steps; AppTest reruns the whole page (a browser "
          "reruns only the fragment: everything below but page.setup)")
    for what, rows in report_rows.items():
        walls = [r[0] for r in rows]
        print(f"\n  {what}: AppTest.run() {', '.join(f'{w:.3f}' for w in walls)} s")
        labels = list(dict.fromkeys(k for _, t in rows for k in t))
        for label in labels:
            per_run = [sum(t.get(label, [])) * 1e3 for _, t in rows]
            calls = len(rows[0][1].get(label, []))
            print(f"    {label:<58} {' '.join(f'{x:7.1f}' for x in per_run)} ms  "
                  f"({calls} call{'s' if calls != 1 else ''})")

    # the pieces alone, best of several (robust to a busy machine)
    def best(fn, n=5):
        out, ts = None, []
        for _ in range(n):
            t = time.perf_counter()
            out = fn()
            ts.append(time.perf_counter() - t)
        return out, min(ts)

    sc = Scenario().with_policy(PRESETS["dynamic"])
    res, t_sim = best(lambda: simulate(sc), 3)
    blob, t_dump = best(lambda: pickle.dumps(res))
    _, t_load = best(lambda: pickle.loads(blob))
    _, t_tok = best(lambda: cache.scenario_token(sc))
    print("\n  Pieces alone, best of 3-5 (dynamic preset, 2,000 requests):")
    print(f"    simulate(): {t_sim * 1e3:.0f} ms; the SimResult pickles to {len(blob) / 1024:,.0f} KB (st.cache_data "
          f"stores pickles: dumps {t_dump * 1e3:.1f} ms once, loads {t_load * 1e3:.1f} ms on every hit); "
          f"scenario_token {t_tok * 1e3:.2f} ms")
    _, t_figs = best(lambda: report.policy_figures(res))
    print(f"    report.policy_figures: {t_figs * 1e3:.0f} ms")
    builders = {
        "timeline": lambda: charts.request_timeline(res.requests, res.class_names),
        "batch_composition": lambda: charts.batch_composition(res.steps),
        "kv_queue": lambda: charts.kv_and_queue(res.steps, res.scenario.deployment.kv_capacity_tokens),
        "ttft_hist": lambda: charts.latency_histogram(res.requests, "ttft", res.class_names),
        "tpot_hist": lambda: charts.latency_histogram(res.requests, "tpot", res.class_names),
        "e2e_hist": lambda: charts.latency_histogram(res.requests, "e2e", res.class_names),
        "itl": lambda: charts.itl_histogram(res.itl_hist, res.itl_edges, res.class_names),
    }
    print(f"    {'figure':<18} {'traces':>6} {'points':>8} {'build ms':>9} {'to_dict ms':>10} {'to_json ms':>10} "
          f"{'JSON KB':>8} {'f32 KB':>7} {'dict->Figure ms':>15}")
    tot = defaultdict(float)

    def f32(obj):
        """The figure JSON with every float64 typed array (plotly 6+: {dtype, bdata}) as float32."""
        if isinstance(obj, dict):
            if obj.get("dtype") == "f8" and "bdata" in obj:
                arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype="f8").astype("f4")
                return {**obj, "dtype": "f4", "bdata": base64.b64encode(arr.tobytes()).decode()}
            return {k: f32(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [f32(v) for v in obj]
        return obj

    for name, build in builders.items():
        fig, tb = best(build)
        d, td = best(fig.to_dict)
        js, tj = best(lambda: pio.to_json(d, validate=False))
        _, tv = best(lambda: go.Figure(d))
        plain = fig.to_plotly_json()
        js32 = pio.to_json(f32(plain), validate=False)
        points = sum(len(tr.x) for tr in fig.data if getattr(tr, "x", None) is not None)
        for k, v in (("build", tb), ("dict", td), ("json", tj), ("kb", len(js) / 1024), ("kb32", len(js32) / 1024),
                     ("fig", tv), ("points", points)):
            tot[k] += v
        print(f"    {name:<18} {len(fig.data):>6} {points:>8,} {tb * 1e3:>9.1f} {td * 1e3:>10.1f} {tj * 1e3:>10.1f} "
              f"{len(js) / 1024:>8,.0f} {len(js32) / 1024:>7,.0f} {tv * 1e3:>15.1f}")
    print(f"    {'total':<18} {'':>6} {int(tot['points']):>8,} {tot['build'] * 1e3:>9.1f} {tot['dict'] * 1e3:>10.1f} "
          f"{tot['json'] * 1e3:>10.1f} {tot['kb']:>8,.0f} {tot['kb32']:>7,.0f} {tot['fig'] * 1e3:>15.1f}")
    print(f"    (JSON engine {pio.json.config.default_engine}; arrays go out as base64 typed arrays; f32 KB = the same "
          "figure with float32 x/y; dict->Figure = what st.plotly_chart adds when given a plain dict, as it "
          "validates dicts with go.Figure(**d))")
    if prof["p"] is not None:
        s = io.StringIO()
        pstats.Stats(prof["p"], stream=s).sort_stats("cumulative").print_stats(top_n)
        print(f"\n  cProfile of the script thread, rerun to a new value, top {top_n} by cumulative time:")
        print("\n".join(line for line in s.getvalue().splitlines()[:top_n + 12] if line.strip()))
        s = io.StringIO()
        pstats.Stats(prof["p"], stream=s).sort_stats("tottime").print_stats(15)
        print("  top 15 by own time:")
        print("\n".join(line for line in s.getvalue().splitlines()[:27] if line.strip()))


LAB_JS = """async ([json, json2, reps]) => {
  const div = document.getElementById('g');
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const out = {parse: [], newPlot: [], react: []};
  for (let i = 0; i < reps; i++) {
    Plotly.purge(div); await frame();
    let t = performance.now(); const f = JSON.parse(json); out.parse.push(performance.now() - t);
    t = performance.now(); await Plotly.newPlot(div, f.data, f.layout, {}); await frame();
    out.newPlot.push(performance.now() - t);
    const g = JSON.parse(json2);
    t = performance.now(); await Plotly.react(div, g.data, g.layout, {}); await frame();
    out.react.push(performance.now() - t);
  }
  return out;
}"""


def figure_lab(reps: int = 3) -> None:
    """Each Explore figure alone in a blank Chromium page (plotly.js from the plotly package, not Streamlit's
    bundle): JSON.parse, Plotly.newPlot and Plotly.react to the next run's figure, each through two animation
    frames (so WebGL readback and paint are in), for the figures as built and for timeline variants."""
    import dataclasses

    import numpy as np
    import plotly
    import plotly.io as pio
    from playwright.sync_api import sync_playwright

    from batching import report
    from batching.charts import policy as charts
    from batching.sim.policy import PRESETS
    from batching.sim.simulate import Scenario, simulate

    pol = PRESETS["dynamic"]
    a = simulate(Scenario().with_policy(pol))
    b = simulate(Scenario().with_policy(dataclasses.replace(pol, max_wait_s=pol.max_wait_s + 0.01)))
    fa, fb = report.policy_figures(a), report.policy_figures(b)

    def f32(obj):
        if isinstance(obj, dict):
            if obj.get("dtype") == "f8" and "bdata" in obj:
                arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype="f8").astype("f4")
                return {**obj, "dtype": "f4", "bdata": base64.b64encode(arr.tobytes()).decode()}
            return {k: f32(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [f32(v) for v in obj]
        return obj

    def svg(d):
        return {**d, "data": [{**tr, "type": "scatter"} if tr.get("type") == "scattergl" else tr for tr in d["data"]]}

    cases = [(k, fa[k][0].to_plotly_json(), fb[k][0].to_plotly_json()) for k in fa]
    cases_by = {k: (da, db) for k, da, db in cases}
    ta, tb = cases[0][1], cases[0][2]
    def every(d, k):
        """Every k-th request of the timeline (its traces are (start, end, NaN) triplets per request)."""
        def cut(spec):
            if not (isinstance(spec, dict) and "bdata" in spec):
                return spec
            arr = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"]).reshape(-1, 3)[::k]
            return {**spec, "bdata": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()}
        return {**d, "data": [{**tr, "x": cut(tr["x"]), "y": cut(tr["y"])} for tr in d["data"]]}

    cases += [("timeline float32", f32(ta), f32(tb)), ("timeline SVG (scatter)", svg(ta), svg(tb)),
              ("timeline SVG float32", f32(svg(ta)), f32(svg(tb))),
              ("timeline 1/2 of requests", every(ta, 2), every(tb, 2)),
              ("timeline 1/4 of requests", every(ta, 4), every(tb, 4)),
              ("timeline SVG 1/4", svg(every(ta, 4)), svg(every(tb, 4)))]
    if hasattr(charts, "TIMELINE_POINT_BUDGET"):  # the page's timeline: within a point budget, SVG, float32
        pa, pb = (report.policy_figures(r, timeline_points=charts.TIMELINE_POINT_BUDGET)["timeline"][0]
                  for r in (a, b))
        cases.append(("timeline as the page draws", pa.to_plotly_json(), pb.to_plotly_json()))
    from batching.charts.export import CAPTION_LEGEND

    def uncaptioned(d):
        """Without the scenario line drawn as a second legend's title under the plot (charts.export.with_caption)."""
        return {"data": [t for t in d["data"] if t.get("legend") != CAPTION_LEGEND],
                "layout": {k: v for k, v in d["layout"].items() if k != CAPTION_LEGEND}}

    def legendless(d):
        d = uncaptioned(d)
        return {"data": d["data"], "layout": {**d["layout"], "showlegend": False}}

    for k in ("kv_queue", "ttft_hist", "itl"):
        cases += [(f"{k} no caption line", uncaptioned(cases_by[k][0]), uncaptioned(cases_by[k][1])),
                  (f"{k} no legends", legendless(cases_by[k][0]), legendless(cases_by[k][1]))]
    js_path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    version = js_path.read_text()[:200].split("plotly.js v")[1].split()[0]
    print(f"Figure lab: Explore's figures (dynamic preset, 2,000 requests) alone in Chromium ({os.cpu_count()} CPUs, "
          f"--disable-gpu: WebGL is SwiftShader), plotly.js {version}; median of {reps}, ms")
    print(f"  {'figure':<26} {'JSON KB':>8} {'parse':>7} {'newPlot':>8} {'react':>7}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        for name, da, db in cases:
            ja, jb = pio.to_json(da, validate=False), pio.to_json(db, validate=False)
            page = browser.new_page(viewport=VIEWPORT)
            page.set_content('<div id="g" style="width:1300px"></div>')
            page.add_script_tag(path=str(js_path))
            r = page.evaluate(LAB_JS, [ja, jb, reps])
            page.close()
            print(f"  {name:<26} {len(ja) / 1024:>8,.0f} {statistics.median(r['parse']):>7.1f} "
                  f"{statistics.median(r['newPlot']):>8.0f} {statistics.median(r['react']):>7.0f}", flush=True)
        browser.close()


# ---------------------------------------------------------------- chart costs in place

# every chart node of the page with the figure it shows now: the app's element keeps the JSON it drew
# (batching/ui/plot.js), Streamlit's own chart (the trivial page) the data and layout it was given
SPECS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(d => d.__batchingSpec
  ? JSON.stringify(JSON.parse(d.__batchingSpec).figure) : JSON.stringify({data: d.data, layout: d.layout}))"""

REDRAW_JS = """async ([a, b, reps]) => {
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const divs = [...document.querySelectorAll('.js-plotly-plot')];
  const per = divs.map(() => []), total = [];
  for (let r = 0; r < reps; r++) {
    const specs = r % 2 ? b : a;
    const t0 = performance.now();
    for (let i = 0; i < divs.length && i < specs.length; i++) {
      if (a[i] === b[i]) continue;  // the same figure: the app's element does not redraw it either
      const fig = JSON.parse(specs[i]);
      const layout = Object.assign({}, fig.layout || {});
      if (layout.height === undefined && divs[i].classList.contains('batching-plot')) layout.height = 450;
      const t = performance.now();
      Plotly.react(divs[i], fig.data || [], layout, divs[i]._context);
      per[i].push(performance.now() - t);
    }
    await frame();
    total.push(performance.now() - t0);
  }
  const med = xs => xs.slice().sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  return {per: per.map(xs => xs.length ? med(xs) : null), total: med(total), elements: divs.map(d => d.querySelectorAll('svg *').length),
          titles: divs.map(d => ((d._fullLayout || {}).title || {}).text || '')};
}"""


def chart_costs(browser, server: Server, spec, quiet_s: float, timeout_s: float, reps: int = 9) -> float | None:
    """Print the page's charts redrawn in place (``--chart-costs``); returns the sum of the changed charts'
    synchronous redraws (ms). The total through two animation frames is printed too; two frames take 33 ms
    at 60 Hz however little is drawn, so it is no basis for a ratio."""
    name, path, kind, label = spec
    tab = Tab(browser)
    try:
        tab.page.goto(link(server.url, path), wait_until="commit")
        s = tab.settle(quiet_s, timeout_s, need_run=False, need_plots=True)
        if s.get("timeout"):
            print(f"  {name}: page did not settle in {timeout_s:.0f} s; skipped", flush=True)
            return None
        a = tab.page.evaluate(SPECS_JS)
        target, key, desc = first_control(tab.page, kind, label)
        target.focus()
        tab.page.evaluate("() => window.__bench.arm()")
        tab.page.keyboard.press(key)
        tab.settle(quiet_s, timeout_s, need_run=True, need_plots=True)
        b = tab.page.evaluate(SPECS_JS)
        if len(a) != len(b):
            print(f"  {name}: {len(a)} charts before the move, {len(b)} after; skipped", flush=True)
            return None
        same = sum(x == y for x, y in zip(a, b))
        r = tab.page.evaluate(REDRAW_JS, [a, b, reps])
    finally:
        tab.close()
    if same == len(a):
        print(f"  {name} ({desc}; {len(a)} charts): the move changed no chart, so nothing is redrawn", flush=True)
        return None
    drawn = sum(ms for ms in r["per"] if ms is not None)
    print(f"  {name} ({desc}; {len(a)} charts, {same} unchanged by the move): the changed charts' redraws "
          f"{drawn:.0f} ms in all, {r['total']:.0f} ms through two animation frames", flush=True)
    for title, ms, n, ja, jb in zip(r["titles"], r["per"], r["elements"], a, b):
        kb = (len(ja) + len(jb)) / 2 / 1024
        what = "unchanged" if ms is None else f"{ms:6.1f} ms"
        print(f"    {what:>9}  {n:>6,} SVG elements  {kb:>6,.0f} KB  {title[:70]}", flush=True)
    return drawn


def chart_costs_run(pages, quiet_s: float, timeout_s: float) -> None:
    from playwright.sync_api import sync_playwright

    print(f"Chart costs: each chart a move changes, redrawn in place with Plotly.react, alternating the figures "
          f"before and after the move; synchronous ms per chart, median of 9 ({os.cpu_count()} CPUs)", flush=True)
    totals = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        try:
            for script, name, specs in (("benchmarks/trivial_app.py", "trivial", [TRIVIAL]),
                                        ("app.py", "app", pages)):
                server = Server(script, f"costs-{name}")
                server.start()
                try:
                    for spec in specs:
                        totals[spec[0]] = chart_costs(browser, server, spec, quiet_s, timeout_s)
                finally:
                    server.stop()
        finally:
            browser.close()
    base = totals.get("trivial")
    if base:
        print("Redraws of the changed charts against the trivial page's one chart (synchronous ms): " + ", ".join(
            f"{k} {v / base:.1f}x" for k, v in totals.items() if v is not None and k != "trivial"))


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=6, help="knob moves per page (at least 5 for the target)")
    ap.add_argument("--quiet", type=float, default=1.5, help="seconds without a chart mutation that mean 'done'")
    ap.add_argument("--timeout", type=float, default=240, help="seconds one move or one page open may take")
    ap.add_argument("--pages", default="", help="comma-separated subset of: " + ", ".join(p[0] for p in PAGES))
    ap.add_argument("--trace", action="store_true", help="record a Chrome trace of one more move on a page")
    ap.add_argument("--trace-page", default="explore", help="the page --trace records (default explore)")
    ap.add_argument("--skip-open", action="store_true", help="skip the page-open timings")
    ap.add_argument("--skip-big", action="store_true", help="skip the 20,000-request links")
    ap.add_argument("--server-profile", action="store_true", help="only profile an Explore rerun in AppTest")
    ap.add_argument("--figure-lab", action="store_true", help="only time Explore's figures alone in Chromium")
    ap.add_argument("--chart-costs", action="store_true",
                    help="only time each chart redrawn in place, on the trivial page and on --pages")
    ap.add_argument("--without-charts", action="store_true",
                    help="moves without Plotly's redraw: the app's charts keep their first drawing (a floor)")
    ap.add_argument("--max-minutes", type=float, default=40, help="hard stop for the whole run")
    args = ap.parse_args()
    watchdog(args.max_minutes)
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, lambda *_: (stop_all(), os._exit(143)))

    if args.server_profile:
        server_profile()
        return
    if args.figure_lab:
        figure_lab()
        return
    if not Path(CHROMIUM).exists():
        sys.exit(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    pages = [p for p in PAGES if not args.pages or p[0] in args.pages.split(",")]
    if args.chart_costs:
        if args.without_charts:  # chart costs time Plotly.react itself, which --without-charts takes out
            ap.error("--chart-costs times the charts' redraws; --without-charts removes them: use one or the other")
        chart_costs_run(pages, args.quiet, args.timeout)
        return
    global SKIP_REDRAW
    SKIP_REDRAW = args.without_charts
    load = os.getloadavg()
    print(f"Browser benchmark: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{args.moves} moves per page, quiet period {args.quiet} s, Chromium {CHROMIUM}"
          + ("; WITHOUT CHARTS: the app's charts are not redrawn on a move (SKIP_REDRAW_JS)" if SKIP_REDRAW else ""),
          flush=True)
    # warm the on-disk kernel cache (the server's first run loads it)
    subprocess.run([sys.executable, "-c", "from batching.sim.simulate import Scenario, simulate; "
                    "simulate(Scenario())"], cwd=ROOT, check=True)
    results: list[PageResult] = []
    opens: list[Open] = []
    t_start = time.perf_counter()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
            # the baseline keeps Streamlit's default gc.collect() after every run, which .streamlit/config.toml
            # turns off for the app (runner.postScriptGC): the trivial page is what a plain Streamlit page costs
            trivial = Server("benchmarks/trivial_app.py", "trivial", ("--runner.postScriptGC", "true"))
            health = trivial.start()
            print(f"trivial app up in {health:.1f} s at {trivial.url}", flush=True)
            open_page(browser, trivial.url, "trivial", "first visit", args.quiet, args.timeout)
            results.append(measure_moves(browser, trivial, TRIVIAL, args.moves, args.quiet, args.timeout))
            trivial.stop()

            app = Server("app.py", "app")
            health = app.start()
            print(f"app up in {health:.1f} s at {app.url}", flush=True)
            if not args.skip_open:
                opens.append(open_page(browser, f"{app.url}/", "home", "first visit after server start",
                                       args.quiet, args.timeout))
                seen = set()
                for i, (name, path, _, _) in enumerate(pages):
                    if path.split("?")[0] in seen:
                        continue
                    seen.add(path.split("?")[0])
                    opens.append(open_page(browser, link(app.url, path, f"seed={101 + i}"), name,
                                           "fresh context, new seed", args.quiet, args.timeout))
            for spec in pages:
                results.append(measure_moves(browser, app, spec, args.moves, args.quiet, args.timeout,
                                             trace=args.trace and spec[0] == args.trace_page))
            if not args.skip_big:
                for name, path in (("explore", "explore"), ("home", "")):
                    opens.append(open_page(browser, link(app.url, path, f"n={BIG_REQUESTS}"), name,
                                           f"{BIG_REQUESTS:,}-request link", args.quiet, args.timeout))
            app.stop()
            browser.close()
    finally:
        stop_all()

    base = results[0].med("last_s") if results and results[0].moves else None
    load = os.getloadavg()
    print(f"\nKnob moves: median of {args.moves} per page ({os.cpu_count()} CPUs, load average now {load[0]:.1f}; "
          f"wall {time.perf_counter() - t_start:.0f} s)")
    head = (f"{'page':<19} {'last s':>6} {'first s':>7} {'ratio':>5} {'wire s':>8} {'sent>done':>9} "
            f"{'script s':>8} {'scr CPU':>7} {'srv CPU':>7} {'brw CPU':>7} {'KB/rerun':>8} {'Plotly':>6} "
            f"{'charts':>6} {'new':>3} {'changed':>7}  control")
    print(head)
    print("-" * len(head))
    for r in results:
        last = r.med("last_s")
        ratio = last / base if last is not None and base else None
        print(f"{r.name:<19} {fmt(last, '.3f'):>6} {fmt(r.med('first_s'), '.3f'):>7} {fmt(ratio, '.1f'):>5} "
              f"{fmt(r.med('server_s'), '.3f'):>8} {fmt(r.med('sent_done_s'), '.3f'):>9} "
              f"{fmt(r.med('script_wall_s'), '.3f'):>8} {fmt(r.med('script_cpu_s'), '.3f'):>7} "
              f"{fmt(r.med('server_cpu_s'), '.2f'):>7} {fmt(r.med('browser_cpu_s'), '.2f'):>7} "
              f"{fmt(r.med('kb'), ',.0f'):>8} {fmt(r.med('plotly_kb'), ',.0f'):>6} "
              f"{max((m.charts for m in r.moves), default=0):>6} {fmt(r.med('remounted'), '.0f'):>3} "
              f"{sum(m.first_s is not None for m in r.moves):>3}/{len(r.moves):<3}  {r.control}")
    print("last/first s: key press -> last/first chart mutation; ratio = last / the trivial page's (target <= 2.0); "
          "medians over the moves that changed a chart ('changed'), the other columns over all moves.\n"
          "wire s: ForwardMsg new_session -> script_finished as the page received them (CDP; Chromium reports "
          "frames when the renderer handles them, so a busy renderer inflates it), summed over the runs a move "
          "caused; sent>done: from the BackMsg that asked for the rerun. script s / scr CPU: the script thread's "
          "wall / CPU time, logged in the server. srv CPU / brw CPU: CPU seconds the server process / Chromium "
          "(all its processes) used from the key press to the end of the quiet period. KB/rerun: WebSocket bytes "
          "received; Plotly: the part that is figure JSON. new: charts whose DOM node is new after the move "
          "(re-mounted, Plotly.newPlot) rather than updated in place.")
    if opens:
        print("\nOpening pages (fresh browser context; seconds from navigation start):")
        print(f"{'page':<20} {'what':<32} {'first chart':>11} {'all charts':>10} {'charts':>6} {'KB':>7} "
              f"{'progress at':>11}")
        print("(progress at: when the app's first spinner or progress bar appeared; n/a = none)")
        for o in opens:
            print(f"{o.page:<20} {o.what:<32} {fmt(o.first_s):>11} {fmt(o.all_s):>10} {o.charts:>6} {o.kb:>7,.0f} "
                  f"{fmt(o.progress_s):>11}{'  [' + o.note + ']' if o.note else ''}")


if __name__ == "__main__":
    main()
