"""Every page's downloads (issue 24 item 11): Find a deployment gets CSV, HTML, PNG and SVG besides its JSON, and its
chart's caption names its points' own GPUs and precisions, not the sidebar's deployment."""
from __future__ import annotations

from uihelpers import assert_clean, chart, run_page

from batching.charts.export import CAPTION_LEGEND

PAGE = "pages/find_a_deployment.py"
QUERY = dict(n="100", s_gpus="h100-sxm,a100-80gb", s_precs="bf16,fp8", s_tps="8", target="20")


def _labels(at) -> list[str]:
    return [b.proto.label for b in at.get("download_button")]


def test_find_a_deployment_exports_everything_and_captions_its_points():
    at = run_page(PAGE, **QUERY)  # 4 configurations: searched as the page opens
    assert_clean(at)
    assert _labels(at)[:3] == ["Configurations (CSV)", "Left out (CSV)", "Data (JSON)"] or \
        _labels(at)[:2] == ["Configurations (CSV)", "Data (JSON)"]
    assert {"Report (HTML)", "Charts (PNG)", "Charts (SVG)"} <= set(_labels(at))
    caption = chart(at, "Cost against tail latency")["layout"][CAPTION_LEGEND]["title"]["text"]
    res = at.session_state["search_last"][1]
    shown = [c for c in res["configs"] if c["meets_slo"]]
    names = {"h100-sxm": "H100 SXM 80GB", "a100-80gb": "A100 SXM 80GB"}
    for c in shown:  # every plotted point's GPU and precision is named
        assert names[c["gpu"]].split()[0] in caption and c["precision"].upper() in caption, (c["label"], caption)
    assert "rate searched" in caption and "1 req/s" not in caption
