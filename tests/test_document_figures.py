"""Issue 24 item 12, figures and labels at document size: numbers in captions and tables at sensible digits,
no "None" cells, legends clear of axis titles and captions, labels that do not collide."""
from __future__ import annotations

import math

from batching.charts.formatting import MISSING, change_text, rate_text, sig_text


def test_sig_text_never_prints_a_raw_float():
    assert sig_text(4.71174) == "4.71"
    assert rate_text(4.71174) == "4.71 req/s"
    assert sig_text(0.0277, 2) == "0.028"
    assert sig_text(15.83) == "15.8"
    assert sig_text(1234.5) == "1,234"
    assert sig_text(3.0) == "3" and sig_text(0.5) == "0.5" and sig_text(0) == "0"
    assert sig_text(float("nan")) == MISSING and sig_text(None) == MISSING


def test_change_text_is_a_dash_not_none():
    assert change_text(12.345) == "+12.3 %"
    assert change_text(-4.0) == "-4.0 %"
    for missing in (None, float("nan"), math.inf, True):
        assert change_text(missing) == MISSING
