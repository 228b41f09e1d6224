"""URL values: parsing, clamping and the notices that come with corrections."""
from __future__ import annotations

from batching.ui.params import Param


def test_numbers_are_clamped_with_a_notice():
    n = Param("n", 2000, 10, 20000, label="number of requests")
    assert n.parse("500") == (500, None)
    value, note = n.parse("99999999")
    assert value == 20000 and "out of range" in note and "10 to 20,000" in note and "using 20,000" in note
    assert n.parse("2e3") == (2000, None)
    value, note = n.parse("lots")
    assert value == 2000 and "not valid" in note


def test_floats_bools_and_choices():
    rate = Param("rate", 3.0, 0.1, 1000.0)
    assert rate.parse("2.5") == (2.5, None)
    assert rate.parse("nan")[0] == 3.0
    assert rate.encode(2.5) == "2.5" and rate.encode(3.0) == "3"
    flag = Param("chunked", False)
    assert flag.parse("true") == (True, None) and flag.parse("0") == (False, None)
    assert flag.parse("maybe")[1]
    tp = Param("tp", 8, choices=(1, 2, 4, 8))
    assert tp.parse("16") == (8, tp.parse("16")[1]) and "not one of the allowed" in tp.parse("16")[1]
    assert tp.parse("3")[0] == 2  # nearest allowed, ties to the smaller
    gpu = Param("gpu", "h100-sxm", choices=("h100-sxm", "h200-sxm"))
    value, note = gpu.parse("tpu")
    assert value == "h100-sxm" and "h100-sxm, h200-sxm" in note
