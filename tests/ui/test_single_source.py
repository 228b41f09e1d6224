"""One source of truth: page titles and icons (batching/ui/nav.py), the default request rate
(sim.workload.DEFAULT_RATE_REQ_S) and the bounds of every input (the library's limits, read by the widgets,
the links and the CLI's validators)."""
from __future__ import annotations

import ast

import pytest
from uihelpers import FAST, ROOT, assert_clean, run_page

from batching.sim.policy import KNOB_LIMITS, PRESETS, with_knobs
from batching.sim.workload.requests import DEFAULT_RATE_REQ_S, MAX_RATE_REQ_S, workload_preset
from batching.studies import planning as sp
from batching.studies.capacity import SLO, SLO_MAX_S
from batching.studies.knee import SHARE_LIMITS, check_share
from batching.ui import knobs, nav, sidebar


def _setup_target(path) -> str:
    """The nav entry a page passes to page.setup (``nav.TUNE`` -> 'TUNE')."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "setup" and isinstance(n.func.value, ast.Name) and n.func.value.id == "page"]
    assert len(calls) == 1, path
    arg = calls[0].args[0]
    assert isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "nav", \
        f"{path}: page.setup takes its title and icon from batching.ui.nav"
    return arg.attr


def test_every_page_takes_its_title_and_icon_from_nav():
    names = {getattr(nav, n): n for n in dir(nav) if isinstance(getattr(nav, n), nav.PageInfo)}
    for entry in nav.PAGES:
        assert (ROOT / entry.path).is_file()
        assert _setup_target(ROOT / entry.path) == names[entry]
        assert entry.icon.startswith(":material/")
    # the sidebar's links are the same entries, in the same order
    assert sidebar.PAGES is nav.PAGES
    assert [tuple(p) for p in sidebar.all_pages()[:len(nav.PAGES)]] == [tuple(p) for p in nav.PAGES]
    assert len({p.title for p in nav.PAGES}) == len(nav.PAGES)


def test_the_shown_title_and_links_are_the_registry_s():
    at = run_page(nav.TUNE.path, **FAST)
    assert_clean(at)
    assert at.title[0].value == nav.TUNE.title


def test_the_default_rate_is_the_workload_s():
    rate = [p for p in sidebar.params() if p.key == "rate"][0]
    assert rate.default == DEFAULT_RATE_REQ_S == workload_preset("mixed").arrivals.rate_req_s
    assert rate.high == MAX_RATE_REQ_S


def test_the_sidebar_inputs_read_their_params():
    at = run_page("app.py", **FAST)
    assert_clean(at)
    for p in sidebar.params():
        if p.low is None:
            continue
        widget = at.number_input(key=f"wid:{p.key}")
        assert (widget.min, widget.max) == (p.low, p.high), p.key
    assert at.number_input(key="wid:rate").value == DEFAULT_RATE_REQ_S


def test_policy_sliders_lie_inside_what_the_policy_accepts():
    for key, (low, high, step) in knobs.SLIDERS.items():
        field, divisor = knobs.FIELDS[key]
        lo, hi = KNOB_LIMITS[field]
        assert lo <= low / (divisor or 1) < high / (divisor or 1) <= hi, key
        assert (high - low) % step == 0, key
        base = PRESETS["dynamic" if key in ("batch", "wait_ms") else "continuous"]
        for end in (low, high):  # both ends of the slider make a valid policy
            with_knobs(base, **{field: end / divisor if divisor else end})
    for name, pol in PRESETS.items():
        for p in knobs.knob_params("", pol):
            if p.key in knobs.SLIDERS:  # the link accepts what the slider shows
                assert (p.low, p.high) == knobs.SLIDERS[p.key][:2], (name, p.key)
    # the sweep ranges are the policy's own limits
    assert all(sp.KNOB_BOUNDS[k] == KNOB_LIMITS[k] for k in ("max_batch_size", "max_num_seqs", "max_wait_s",
                                                             "max_num_batched_tokens"))


def test_tune_and_capacity_inputs_read_the_library_bounds():
    at = run_page("pages/tune.py", **FAST)
    assert_clean(at)
    points = at.number_input(key="wid:points")
    assert (points.min, points.max) == (2, sp.MAX_POINTS)
    share = at.number_input(key="wid:share")
    assert (share.min, share.max) == pytest.approx((SHARE_LIMITS[0] * 100, SHARE_LIMITS[1] * 100))
    assert check_share(SHARE_LIMITS[1]) == SHARE_LIMITS[1]
    seqs_to = at.number_input(key="wid:to")
    assert seqs_to.max == KNOB_LIMITS["max_num_seqs"][1]
    cap = run_page("pages/capacity.py", **FAST, policies="chunked")
    assert_clean(cap)
    from batching.ui.planning import SLO_INPUTS

    # the SLO inputs are text (one value or one per class); their top is the library's
    assert SLO_INPUTS["ttft_ms"][2] == SLO_MAX_S * 1e3 and SLO_INPUTS["e2e_s"][2] == SLO_MAX_S
    over = run_page("pages/capacity.py", **FAST, policies="chunked", ttft_ms=str(int(SLO_MAX_S * 1e3) + 1))
    assert any("3,600,000" in e.value for e in over.error), [e.value for e in over.error]
    SLO(e2e_s=SLO_MAX_S).validate()  # the top of the input is what the library accepts
    with pytest.raises(ValueError, match="allowed > 0 to 3600"):
        SLO(e2e_s=SLO_MAX_S + 1).validate()
