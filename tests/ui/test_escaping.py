"""Markdown injection: every text a user controls is shown as typed, never as a link, an image or formatting.

One test per surface: a shared link's values (the sidebar's notices, a page's own notices, Capacity's policy
list), an uploaded trace's file name, its column names and cells (in the error), its class names (the class
table's tooltips), a custom model's and GPU's names, and the signed-in user's name (tests/ui/test_access.py).
Each asserts that the Markdown the element carries shows exactly the user's text once read, and that no link,
image or autolink can form from it. Charts: hostile class and file names on every page, custom model and GPU
names on Model and hardware, reach each figure only as entities (``charts.text.literal``), never as Plotly markup.
"""
from __future__ import annotations

import json
import re

import pytest
from markup import FILE_LINK, HOSTILE_CLASSES, hostile_trace, live_markup, shows
from uihelpers import FAST, assert_clean, chart_specs, open_page, run_page

from batching.ui import nav
from batching.ui.safe import plain, unescape

IMAGE = "![p](http://host/p.png)"
LINK = "[Log in again](https://evil.io)"  # short enough to be quoted whole (40 characters)
HOSTILE = [IMAGE, LINK, "<https://evil.example>", "www.evil.example", "mail@evil.example", ":red[alert] $x$ **b**",
           ":material/lock: :smile:", "https://evil.io/a_b"]


def live_markdown(source: str) -> list[str]:
    """Markdown constructs that would render as a link, an image, an autolink or formatting.

    Syntax (links, autolinks, emphasis, Streamlit's directives) is searched in the source with every backslash
    escape taken out: an escaped character cannot start or close one. GFM's bare links (``https://``, ``www.``,
    ``a@b.c``) are searched in the text once escapes are read, as remark-gfm finds them there (Chromium showed
    ``https\\://x`` still linked), with the joiners ``plain`` puts in kept.
    """
    bare = re.sub(r"\\.", "\x00", source)
    syntax = {
        "link or image": r"!?\[[^\]]*\]\(", "reference": r"\[[^\]]*\]\[", "autolink": r"<[A-Za-z][\w+.-]*:",
        "emphasis": r"\*\*|__|~~", "directive": r":[a-z]+\[", "math": r"\$[^$]+\$", "code": r"`",
    }
    text = re.sub(r"\\(.)", r"\1", source)
    in_text = {
        "bare URL": r"(?i)https?://", "www link": r"(?i)www(?=\.)", "e-mail": r"[-.\w+]+@[-\w]+(?:\.[-\w]+)+",
        "icon": r":material/", "emoji": r":[a-z0-9_+-]+:",
    }
    return ([name for name, pattern in syntax.items() if re.search(pattern, bare)]
            + [name for name, pattern in in_text.items() if re.search(pattern, text)])


def assert_shown_as_typed(source: str, text: str) -> None:
    """``source`` (an element's Markdown) shows ``text`` literally and forms nothing from it."""
    assert text in unescape(source), (text, source)
    assert plain(text) in source, (plain(text), source)
    assert not live_markdown(source), (live_markdown(source), source)


def test_the_escaping_itself():
    for text in HOSTILE + ["prompt_tokens _x_ 1. # h | t", "back\\slash \\[x\\]", "two\nlines"]:
        source = plain(text)
        assert unescape(source) == text.replace("\n", " ")
        assert not live_markdown(source), (text, source)
    assert live_markdown(IMAGE) and live_markdown(LINK)  # the check itself sees them when they are live
    assert live_markdown(r"https\://evil.io") == ["bare URL"]  # escaping alone left this a link in Chromium
    assert plain("wait_ms=99999 (allowed 0 to 2,000)") == "wait_ms=99999 (allowed 0 to 2,000)"


@pytest.mark.parametrize("key, value", [("gpu", IMAGE), ("model", LINK), ("workload", "<https://evil.example>"),
                                        ("precision", "www.evil.example"), ("tp", "mail@evil.example")])
def test_sidebar_notice_quotes_a_link_value_as_plain_text(key, value):
    at = run_page("app.py", **FAST, **{key: value})
    assert not at.exception
    notes = [w.value for w in at.warning if f"{key}=" in unescape(w.value)]
    assert len(notes) == 1, [w.value for w in at.warning]
    assert_shown_as_typed(notes[0], value)


def test_page_notice_quotes_a_link_value_as_plain_text():
    at = run_page("pages/explore.py", **FAST, policy=LINK, preempt=IMAGE)
    assert not at.exception
    notes = [w.value for w in at.warning]
    for key, value in (("policy", LINK), ("preempt", IMAGE)):
        mine = [n for n in notes if f"{key}=" in unescape(n)]
        assert len(mine) == 1, notes
        assert_shown_as_typed(mine[0], value)


def test_capacity_policy_list_from_a_link_is_plain_text():
    at = run_page("pages/capacity.py", **FAST, policies=f"chunked,{LINK}")
    assert not at.exception
    notes = [w.value for w in at.warning if "policies" in w.value]
    assert len(notes) == 1
    assert_shown_as_typed(notes[0], LINK)


GOOD = b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(
    f"{i * 0.5:.2f},{200 + 37 * i % 900},{20 + 13 * i % 150}\n".encode() for i in range(60))


def _upload(name: str, data: bytes):
    at = run_page("app.py", workload="trace", n="60")
    at.file_uploader(key="trace_file").set_value((name, data, "text/csv")).run()
    return at


def test_trace_file_name_is_plain_text():
    name = f"{LINK}.csv"
    at = _upload(name, GOOD)
    assert_clean(at)
    caption = [c.value for c in at.sidebar.caption if "requests at" in c.value]
    assert len(caption) == 1
    assert_shown_as_typed(caption[0].replace("**", ""), name)  # the name is the caption's one bold part
    # and in an error about that file
    at = _upload(name, b"arrival_s,prompt_tokens,output_tokens\n0,abc,3\n")
    assert len(at.error) == 1
    assert_shown_as_typed(at.error[0].value.replace("**This scenario cannot run:**", ""), name)


def test_trace_column_names_in_an_error_are_plain_text():
    at = _upload("t.csv", f"{IMAGE},prompt_tokens,output_tokens\n1,2,3\n".encode())
    assert not at.exception and len(at.error) == 1
    msg = at.error[0].value
    assert "missing column" in unescape(msg)
    assert_shown_as_typed(msg.replace("**This scenario cannot run:**", ""), IMAGE)


def test_trace_cells_in_an_error_are_plain_text():
    at = _upload("t.csv", f"arrival_s,prompt_tokens,output_tokens\n0,{LINK},3\n".encode())
    assert not at.exception and len(at.error) == 1
    assert_shown_as_typed(at.error[0].value.replace("**This scenario cannot run:**", ""), LINK)


def test_trace_class_names_are_plain_text_in_the_class_table():
    rows = "".join(f"{i * 0.5:.2f},{200 + 37 * i % 900},{20 + 13 * i % 150},{i % 2},"
                   f"{LINK if i % 2 == 0 else 'batch'}\n" for i in range(60))
    at = _upload("classes.csv", ("arrival_s,prompt_tokens,output_tokens,priority,class_name\n" + rows).encode())
    assert_clean(at)
    tips = []
    for df in at.dataframe:
        config = json.loads(df.proto.columns or "{}")
        tips += [c["help"] for c in config.values() if LINK in unescape(c.get("help", ""))]
    # the per-class table's columns of that class: TTFT and TPOT, P50 and P99
    assert len(tips) == 4, tips
    for tip in tips:
        assert_shown_as_typed(tip.split(" (P0)")[0], LINK)


def test_custom_model_and_gpu_names_are_plain_text():
    at = run_page("pages/model_and_hardware.py", **FAST)
    [t for t in at.text_input if t.label == "Model name"][0].set_value(LINK)
    [t for t in at.text_input if t.label == "GPU name"][0].set_value(IMAGE)
    [n for n in at.number_input if n.label == "Layers"][0].set_value(1000)  # too big: an error naming them
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert not at.exception
    errors = [e.value for e in at.error if LINK in unescape(e.value)]
    assert len(errors) == 1, [e.value for e in at.error]
    source = errors[0].replace("**", "")
    assert_shown_as_typed(source, f"{LINK} on {IMAGE}")


# ---- chart text: Plotly draws <a href>, <b>, <br> found in a figure's text (charts.text.literal)


@pytest.mark.parametrize("page", [p.path for p in nav.PAGES])
def test_hostile_class_and_file_names_draw_no_markup_in_any_chart(page):
    """An uploaded trace named like a link, its classes named like a link and like formatting: every chart of every
    page shows them as typed (entities Plotly draws as text), none draws a link."""
    at = open_page(page, workload="trace", n="60")
    at.run()
    at.file_uploader(key="trace_file").set_value((FILE_LINK, hostile_trace(), "text/csv")).run()
    assert_clean(at)
    specs = chart_specs(at)
    assert specs, page
    for spec in specs:
        assert not live_markup(spec, [*HOSTILE_CLASSES[:2], FILE_LINK]), live_markup(spec, [FILE_LINK])
    # the file name is in the caption line under the page's charts, escaped
    assert any(shows(s, FILE_LINK, ".legend9.title") for s in specs), page
    if page in (nav.HOME.path, nav.EXPLORE.path):  # the pages with per-class charts name the classes, escaped
        for name in HOSTILE_CLASSES[:2]:
            assert any(shows(s, name, ".name") for s in specs), (page, name)


def test_custom_model_and_gpu_names_draw_no_markup_in_charts():
    model, gpu = '<a href="https://evil.example/m">M</a>', "<b>G</b><br>PU"
    at = run_page("pages/model_and_hardware.py", **FAST)
    [t for t in at.text_input if t.label == "Model name"][0].set_value(model)
    [t for t in at.text_input if t.label == "GPU name"][0].set_value(gpu)
    [b for b in at.button if "Use these specs" in b.label][0].click().run()
    assert_clean(at)
    specs = chart_specs(at)
    titled = [s for s in specs if shows(s, f"{model} on {gpu}", ".layout.title.text")]
    assert len(titled) == 2, [s["layout"]["title"]["text"] for s in specs]  # decode and prefill step time
    assert any(shows(s, model, ".layout.title.subtitle") and shows(s, gpu, ".layout.title.subtitle") for s in specs)
    for spec in specs:
        assert not live_markup(spec, [model, gpu]), live_markup(spec, [model, gpu])
