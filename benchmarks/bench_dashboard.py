"""Dashboard speed: server-side rerun after a slider change, and cold start to the first chart.

    python benchmarks/bench_dashboard.py [--repeat 5] [--skip-browser]

1. Rerun after a slider change (target <= 0.3 s): AppTest on Explore with the default 2,000-request
   scenario; the page is run once so every other piece is cached, then a knob moves to a value not seen
   before (one new simulation) and ``AppTest.run()`` is timed. AppTest reruns the whole script, so this is
   an upper bound for the fragment-only rerun a browser gets.
2. Cold start to first chart (target <= 5 s): ``streamlit run app.py`` is started, and Playwright (Debian
   Chromium) opens the home page as soon as /_stcore/health answers; timed from the process start to the
   first drawn Plotly chart and to the whole page idle. The Numba kernel cache is warmed first, in another
   process, as the target assumes.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def bench_rerun(repeat: int) -> None:
    from streamlit.testing.v1 import AppTest

    def page(preset: str) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.query_params["policy"] = preset
        at.run()
        at.switch_page("pages/explore.py")
        t = time.perf_counter()
        at.run()
        took = time.perf_counter() - t
        print(f"  first render of Explore ({preset}, 2,000 requests, after the home page ran): {took:.2f} s")
        assert not at.exception, [e.value for e in at.exception]
        return at

    for preset, key, values in (("continuous", "wid:seqs", [255 - i for i in range(repeat)]),
                                ("dynamic", "wid:wait_ms", [110 + 10 * i for i in range(repeat)])):
        at = page(preset)
        times = []
        for v in values:
            at.slider(key=key).set_value(v)
            t = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - t)
            assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
        warm = []
        for v in values[:3]:  # values seen before: everything cached
            at.slider(key=key).set_value(v)
            t = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t)
        print(f"  {preset}: slider {key[4:]} -> new value, full-page rerun incl. one new simulation: "
              f"median {statistics.median(times):.3f} s, max {max(times):.3f} s (target <= 0.3 s)")
        print(f"  {preset}: slider back to a value seen before (all cached): median {statistics.median(warm):.3f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_cold_start(repeat: int) -> None:
    from playwright.sync_api import sync_playwright

    # warm the on-disk kernel cache (the target assumes it is warm)
    subprocess.run([sys.executable, "-c", "from batching.sim.simulate import Scenario, simulate; simulate(Scenario())"],
                   cwd=ROOT, check=True)
    firsts, idles = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(repeat):
            port = _free_port()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port",
                 str(port), "--server.address", "127.0.0.1", "--server.fileWatcherType", "none"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
            try:
                while True:
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                        break
                    except OSError:
                        if time.perf_counter() - t0 > 60:
                            raise TimeoutError("server did not start in 60 s") from None
                        time.sleep(0.05)
                t_health = time.perf_counter() - t0
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/", timeout=60_000)
                page.wait_for_function("() => { const g = document.querySelector('.js-plotly-plot');"
                                       " return g && g._fullLayout; }", timeout=120_000)
                firsts.append(time.perf_counter() - t0)
                page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]',
                                       timeout=120_000)
                idles.append(time.perf_counter() - t0)
                page.close()
                print(f"  run: health after {t_health:.2f} s, first chart {firsts[-1]:.2f} s, "
                      f"page idle {idles[-1]:.2f} s")
            finally:
                proc.terminate()
                proc.wait(timeout=15)
        browser.close()
    print(f"  cold start to first chart: median {statistics.median(firsts):.2f} s (target <= 5 s); "
          f"to the whole home page: median {statistics.median(idles):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-browser", action="store_true")
    args = ap.parse_args()
    print(f"Dashboard benchmark ({os.cpu_count()} CPUs)")
    print("1. Rerun after a slider change, Explore, default scenario (2,000 requests)")
    bench_rerun(args.repeat)
    if args.skip_browser or not Path(CHROMIUM).exists():
        print("2. Cold start: skipped (--skip-browser given, or no Chromium at /usr/bin/chromium)")
        return
    print("2. Cold start of `streamlit run app.py` to the first chart (Playwright, Chromium)")
    bench_cold_start(max(1, args.repeat // 2))


if __name__ == "__main__":
    main()
