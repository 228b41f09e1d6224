"""The dashboard in a real browser: every page as the first URL a fresh server sees, a keyboard slider move,
no error on screen, a screenshot of each page in test-artifacts/.

Needs the Debian Chromium at /usr/bin/chromium (Playwright never downloads a browser here).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from streamlit_server import StreamlitServer

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
RENDER_TIMEOUT_MS = 120_000

if not CHROMIUM.exists():
    pytest.skip("Chromium is not installed at /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

# (URL path, query, heading, charts) - Explore comes first: a deep link before anyone opened "/"
PAGES = [
    # Explore and Compare draw only the open tab's latency charts (TTFT); TPOT and E2E are a click away
    ("explore", "policy=dynamic&workload=chat&rate=0.2&n=100", "Explore a policy", 5),
    ("compare", "n=200", "Compare policies", 2),
    ("", "n=200&rate=4", "Strategy showdown", 3),
    ("model_and_hardware", "n=200", "Model and hardware", None),
    ("tune", "n=200", "Tune a knob", 4),
    ("capacity", "n=200", "Capacity planning", 2),
    # its default grid (4 configurations) searches on open and draws the Pareto chart
    ("find_a_deployment", "n=200", "Find a deployment", 1),
]


def _other_pages() -> list[tuple[str, str, str, None]]:
    """Pages other engineers add to pages/ get the same check (at least one chart, no error)."""
    sys.path.insert(0, str(ROOT))
    from batching.ui.sidebar import PAGES as OURS, all_pages

    ours = {p for p, _, _ in OURS}
    return [(re.sub(r"^\d+_", "", Path(path).stem), "n=200", label, None)
            for path, label, _ in all_pages() if path not in ours]


PAGES += _other_pages()





@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, timeout=60_000)
        yield b
        b.close()


def wait_idle(page, timeout_ms: int = RENDER_TIMEOUT_MS) -> None:
    """Until the script run is over and every Plotly chart has drawn."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].every(g => g._fullLayout && g.data)",
        timeout=timeout_ms)


def assert_no_errors(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]').all_inner_texts()
    errors = page.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 0, errors.all_inner_texts()


def chart_data(page, index: int = 0) -> str:
    return page.evaluate("(i) => JSON.stringify(document.querySelectorAll('.js-plotly-plot')[i].data)", index)


def metric(page, label: str) -> str:
    card = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return card.locator('[data-testid="stMetricValue"]').inner_text()


@pytest.mark.parametrize("path,query,title,charts", PAGES, ids=[p[0] or "home" for p in PAGES])
def test_page_as_first_url_of_a_fresh_server(browser, path, query, title, charts):
    with StreamlitServer() as server:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(RENDER_TIMEOUT_MS)
        try:
            page.goto(f"{server.url}/{path}?{query}", timeout=RENDER_TIMEOUT_MS)
            page.get_by_role("heading", name=title).wait_for(timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".js-plotly-plot", timeout=RENDER_TIMEOUT_MS)
            wait_idle(page)
            # charts in tabs mount a little later: wait for the count (bounded) rather than read it once
            want = 1 if charts is None else charts
            page.wait_for_function("(n) => document.querySelectorAll('.js-plotly-plot').length >= n", arg=want,
                                   timeout=30_000)
            wait_idle(page)
            if charts is not None:
                assert page.locator(".js-plotly-plot").count() == charts
            # the shared sidebar is there, with the values from the link
            sidebar = page.locator('[data-testid="stSidebar"]')
            assert sidebar.get_by_text("Scenario", exact=True).count() == 1
            assert sidebar.get_by_role("link", name="Explore a policy").count() == 1
            assert_no_errors(page)
            if path == "explore":
                _move_slider_with_keyboard(page)
            if path in ("explore", "compare"):
                _open_other_tab(page, charts)
            if path == "":
                _downloads(page)
            if path == "model_and_hardware":
                _kv_dtype_moves(page)
            page.set_viewport_size({"width": 1440, "height": 3400})
            page.wait_for_timeout(800)
            page.screenshot(path=str(ARTIFACTS / f"{path or 'home'}.png"), full_page=True)
            assert_no_errors(page)
        finally:
            page.close()


def _downloads(page) -> None:
    """The deferred downloads produce real files: a CSV of every run and an offline HTML report."""
    with page.expect_download(timeout=60_000) as info:
        page.get_by_role("button", name="Requests (CSV)").click()
    csv = Path(info.value.path()).read_text()
    assert csv.startswith("policy,request_id,arrival_s") and csv.count("\n") == 5 * 200 + 1
    with page.expect_download(timeout=60_000) as info:
        page.get_by_role("button", name="Report (HTML)").click()
    assert info.value.suggested_filename.endswith("_report.html")
    html = Path(info.value.path()).read_text()
    assert "Strategy showdown" in html and "cdn.plot.ly" not in html.split("<body>")[0] and len(html) > 3_000_000
    assert_no_errors(page)


def _open_other_tab(page, charts: int) -> None:
    """A hidden tab's charts are drawn when it is opened: clicking TPOT shows the TPOT charts, as many as before."""
    page.get_by_role("tab", name="TPOT").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].some(g => g._fullLayout && "
        "(g._fullLayout.title.text || '').startsWith('TPOT'))", timeout=RENDER_TIMEOUT_MS)
    wait_idle(page)
    assert page.locator(".js-plotly-plot").count() == charts
    page.get_by_role("tab", name="TTFT").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].some(g => g._fullLayout && "
        "(g._fullLayout.title.text || '').startsWith('TTFT'))", timeout=RENDER_TIMEOUT_MS)
    wait_idle(page)
    assert_no_errors(page)


def _move_slider_with_keyboard(page) -> None:
    """Focus the Max wait thumb, press ArrowRight: the run reruns and the charts change, in place (the same chart
    nodes, redrawn with Plotly.react; batching/ui/plot.py), not re-mounted."""
    before_chart = chart_data(page, 0)
    nodes = page.evaluate("() => { const gs = [...document.querySelectorAll('.js-plotly-plot')];"
                          " gs.forEach((g, i) => { g.__e2eMark = i + 1; }); return gs.length; }")
    assert nodes >= 5
    before_ttft = metric(page, "TTFT P50")
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Max wait (ms)")
    thumb = slider.locator('input[type="range"]')  # the thumb's focusable input (role slider)
    assert thumb.input_value() == "100"
    thumb.focus()
    # one key press: more presses race the fragment reruns they trigger (the thumb re-renders)
    page.keyboard.press("ArrowRight")
    slider.locator('[data-testid="stSliderThumbValue"]').filter(has_text="110").wait_for(timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function("() => location.search.includes('wait_ms=110')", timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function(
        "(before) => { const g = document.querySelectorAll('.js-plotly-plot')[0];"
        " return g && JSON.stringify(g.data) !== before; }", arg=before_chart, timeout=RENDER_TIMEOUT_MS)
    wait_idle(page)
    assert chart_data(page, 0) != before_chart
    assert page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(g => g.__e2eMark || 0)") == \
        list(range(1, nodes + 1))
    assert metric(page, "TTFT P50") != before_ttft
    assert "wait_ms=110" in page.url
    assert_no_errors(page)
    json.loads(chart_data(page, 0))  # the chart holds valid data after the change


KV_TOKENS_JS = """() => [...document.querySelectorAll('[data-testid="stMetric"]')]
  .filter(m => (m.querySelector('[data-testid="stMetricLabel"]') || {}).innerText.trim() === 'KV cache (tokens)')
  .map(m => parseInt(m.querySelector('[data-testid="stMetricValue"]').innerText.replace(/,/g, ''), 10))"""


def _kv_dtype_moves(page) -> None:
    """The KV dtype knob reruns its section (a fragment) and FP8 doubles the KV cache; with the user's own model
    entered, a move also reprices that model's section below the fragment (the page reruns)."""
    def pick(option: str) -> None:
        group = page.locator('[data-testid="stButtonGroup"]').filter(has_text="KV cache dtype").first
        group.locator('[role="radio"]', has_text=option).click()

    def wait_kv(expected: list[float]) -> list[int]:
        """Until the KV cache cards read these token counts, within 1 % (whole blocks, the same weights)."""
        page.wait_for_function(f"(want) => {{ const got = ({KV_TOKENS_JS})(); return got.length === want.length "
                               "&& got.every((v, i) => Math.abs(v - want[i]) <= 0.01 * want[i]); }",
                               arg=expected, timeout=RENDER_TIMEOUT_MS)
        wait_idle(page)
        return page.evaluate(KV_TOKENS_JS)

    (bf16,) = page.evaluate(KV_TOKENS_JS)
    pick("FP8")
    (fp8,) = wait_kv([2 * bf16])
    page.locator('[data-testid="stTextInput"]').filter(has_text="Model name").locator("input").fill("Tiny")
    page.locator('[data-testid="stNumberInput"]').filter(has_text="Layers").first.locator("input").fill("4")
    page.get_by_role("button", name="Use these specs").click()
    page.wait_for_function(f"() => ({KV_TOKENS_JS})().length === 2", timeout=RENDER_TIMEOUT_MS)
    wait_idle(page)
    ours, tiny = page.evaluate(KV_TOKENS_JS)
    assert ours == fp8 and tiny > ours  # four layers leave far more room than eighty
    pick("BF16")
    wait_kv([bf16, tiny / 2])
    assert_no_errors(page)


LINKS_AND_TEXT_JS = """() => { const g = document.querySelector('.js-plotly-plot');
  return {links: g.querySelectorAll('svg a').length, bold: g.querySelectorAll('svg tspan[style*="bold"]').length,
          legend: [...g.querySelectorAll('.legend .legendtext')].map(t => t.textContent),
          caption: [...g.querySelectorAll('.legend9titletext')].map(t => t.textContent)}; }"""


def test_plotly_draws_escaped_user_text_as_typed(browser):
    """The app's plotly.js draws a histogram whose classes and caption are named like links and formatting: with
    ``charts.text.literal`` no link and no bold text, and the legend reads the names exactly as typed; the same
    figure built from the raw names draws the links (the check sees them)."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import pandas as pd
    import plotly.io as pio

    from batching.charts import policy as charts
    from batching.charts.export import with_caption

    names = ['<a href="https://evil.example/a">Click A</a>', "<b>Bold</b> & &lt;x&gt;"]
    caption = "workload trace <a href='https://evil.example/g'>Open me</a>.csv"
    rng = np.random.default_rng(0)
    requests = pd.DataFrame({"priority": np.repeat([0, 1], 50), "class_name": np.repeat(names, 50),
                             "ttft_s": rng.uniform(0.05, 2.0, 100)})
    fig = with_caption(charts.latency_histogram(requests, "ttft", names), caption)
    raw = fig.to_plotly_json()
    raw["data"][0]["name"] = names[0]  # what a builder without literal() sent
    page = browser.new_page()
    try:
        page.set_content("<html><body><div id='g' class='js-plotly-plot'></div></body></html>")
        page.add_script_tag(path=str(ROOT / "static" / "plotly.min.js"))
        for figure, links in ((fig, 0), (raw, 1)):
            page.evaluate("(f) => Plotly.newPlot('g', f.data, f.layout)", json.loads(pio.to_json(figure)))
            drawn = page.evaluate(LINKS_AND_TEXT_JS)
            assert drawn["links"] == links, drawn
            if links == 0:
                assert drawn["bold"] == 0 and set(names) <= set(drawn["legend"]), drawn
                assert drawn["caption"] == [caption], drawn
    finally:
        page.close()
