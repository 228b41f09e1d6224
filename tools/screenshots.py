"""Full-page screenshots of every dashboard page in headless Chromium, for before/after comparisons.

    python tools/screenshots.py OUT_DIR [--pages home,explore,...]

Starts ``streamlit run app.py`` (tests/streamlit_server.py), opens each page 1440 px wide and ``--height`` px
tall (Streamlit scrolls inside the page, so a tall window is what shows all of it) with the default scenario,
waits until the script is idle and every Plotly chart has drawn, and saves OUT_DIR/<page>.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from streamlit_server import StreamlitServer  # noqa: E402

PAGES = {"home": "", "explore": "explore", "compare": "compare", "tune": "tune", "capacity": "capacity",
         "model_and_hardware": "model_and_hardware", "find_a_deployment": "find_a_deployment"}
DRAWN = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return app && app.getAttribute('data-test-script-state') === 'notRunning'
      && plots.every(g => g._fullLayout && g.data);
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--pages", default=",".join(PAGES))
    ap.add_argument("--height", type=int, default=7000, help="window height in px")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with StreamlitServer("screenshots-server.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        for name in args.pages.split(","):
            page = browser.new_page(viewport={"width": 1440, "height": args.height})
            page.goto(f"{server.url}/{PAGES[name]}")
            page.wait_for_selector('[data-testid="stApp"]', timeout=60_000)
            page.wait_for_selector(".js-plotly-plot", timeout=240_000)  # the page has started drawing
            for _ in range(2):  # idle and drawn, twice, 2 s apart: later charts and fonts settle
                page.wait_for_function(DRAWN, timeout=240_000, polling=500)
                time.sleep(2)
            page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
            charts = page.locator(".js-plotly-plot").count()
            print(f"{name}: {charts} charts -> {args.out / (name + '.png')}", flush=True)
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
