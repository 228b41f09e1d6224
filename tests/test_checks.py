"""The one range check every config's validate() uses (batching/sim/checks.py): its messages and edge cases."""
import math
from dataclasses import replace

import numpy as np
import pytest

from batching.sim.checks import check_int, check_range, show
from batching.sim.hardware.specs import GPUS, MODELS
from batching.sim.policy import BatchingPolicy
from batching.sim.workload.requests import ArrivalProcess, LengthDist
from batching.sim.workload.sessions import SessionSpec


@pytest.mark.parametrize("value", [0, 0.0, 5, 10, 10.0, np.int64(7), np.float32(2.5), np.uint8(3)])
def test_in_range_passes(value):
    check_range("x", value, 0, 10)  # no error in range, and the same value past either bound is refused
    with pytest.raises(ValueError, match=r"^x=.* is out of range; allowed 11 to 20$"):
        check_range("x", value, 11, 20)
    with pytest.raises(ValueError, match=r"^x=.* is out of range; allowed -10 to -1$"):
        check_range("x", value, -10, -1)


@pytest.mark.parametrize("value, message", [
    (-1, "x=-1 is out of range; allowed 0 to 10"),
    (10.5, "x=10.5 is out of range; allowed 0 to 10"),
    (float("nan"), "x=nan is out of range; allowed 0 to 10"),
    (np.float64("nan"), "x=nan is out of range; allowed 0 to 10"),
    (float("inf"), "x=inf is out of range; allowed 0 to 10"),
    (True, "x=True is out of range; allowed 0 to 10"),  # 0 <= True <= 10, yet a bool is not a number
    (np.bool_(True), "x=True is out of range; allowed 0 to 10"),
    ("5", "x='5' is out of range; allowed 0 to 10"),  # text is refused, not compared (no TypeError)
    (None, "x=None is out of range; allowed 0 to 10"),
    ([5], "x=<list> is out of range; allowed 0 to 10"),
    (1e30, "x=1e+30 is out of range; allowed 0 to 10"),
    (-10**400, "x=<a negative 401-digit number> is out of range; allowed 0 to 10"),
])
def test_out_of_range_message(value, message):
    with pytest.raises(ValueError) as info:
        check_range("x", value, 0, 10)
    assert str(info.value) == message


def test_open_lower_bound():
    check_range("rate", 1e-9, 0, 100.0, low_open=True)
    check_range("rate", 100, 0, 100.0, low_open=True)  # the upper bound stays closed
    with pytest.raises(ValueError) as info:
        check_range("rate", 0, 0, 100.0, low_open=True)
    assert str(info.value) == "rate=0 is out of range; allowed > 0 to 100"
    with pytest.raises(ValueError, match=r"^rate=nan is out of range; allowed > 0 to 100$"):
        check_range("rate", math.nan, 0, 100.0, low_open=True)


def test_bounds_are_shown_like_values():
    # integral float bounds without ".0", large ints in full, tiny and huge floats in exponent form
    with pytest.raises(ValueError, match=r"^x=2 is out of range; allowed 0\.1 to 1$"):
        check_range("x", 2, 0.1, 1.0)
    with pytest.raises(ValueError, match=r"^seed=-1 is out of range; allowed 0 to 9223372036854775807$"):
        check_range("seed", -1, 0, 2**63 - 1)
    with pytest.raises(ValueError, match=r"^x=1e\+18 is out of range; allowed 1e-12 to 1e\+17$"):
        check_range("x", 1e18, 1e-12, 1e17)


@pytest.mark.parametrize("value", [1, 16, np.int32(8), np.int64(16)])
def test_int_in_range_passes(value):
    check_int("k", value, 1, 16)  # no error in range, and the same value past either bound is refused
    with pytest.raises(ValueError, match=r"^k=.* is out of range; allowed 17 to 32$"):
        check_int("k", value, 17, 32)
    with pytest.raises(ValueError, match=r"^k=.* is out of range; allowed -5 to 0$"):
        check_int("k", value, -5, 0)


@pytest.mark.parametrize("value, message", [
    (2.0, "k=2.0 is not an integer; allowed 1 to 16"),  # a float keeps its ".0": "2 is not an integer" would puzzle
    (np.float64(2.5), "k=2.5 is not an integer; allowed 1 to 16"),
    (float("nan"), "k=nan is not an integer; allowed 1 to 16"),
    (True, "k=True is not an integer; allowed 1 to 16"),
    ("3", "k='3' is not an integer; allowed 1 to 16"),
    (0, "k=0 is out of range; allowed 1 to 16"),
    (17, "k=17 is out of range; allowed 1 to 16"),
    (np.int64(-3), "k=-3 is out of range; allowed 1 to 16"),
])
def test_int_messages(value, message):
    with pytest.raises(ValueError) as info:
        check_int("k", value, 1, 16)
    assert str(info.value) == message


def test_show():
    assert show(np.float64(0.1)) == "0.1" and show(-1.0) == "-1" and show(np.int64(5)) == "5"
    assert show("a" * 300) == repr("a" * 200) + "... (300 characters)"
    assert show(np.zeros(10**6)) == "<ndarray>"
    assert show(10**29) == str(10**29) and show(10**30) == "<a 31-digit number>"


# every config that validates with it says the same thing, field name, value and allowed range, and refuses NaN
@pytest.mark.parametrize("config, message", [
    (replace(GPUS["h100-sxm"], hbm_bw_Bps=math.nan), "hbm_bw_Bps=nan is out of range; allowed 1e+11 to 1e+14"),
    (replace(MODELS["qwen2.5-72b"], num_layers=True), "num_layers=True is out of range; allowed 1 to 1000"),
    (replace(MODELS["qwen2.5-72b"], hidden_size="8192"), "hidden_size='8192' is out of range; allowed 64 to 65536"),
    (BatchingPolicy(watermark=math.nan), "watermark=nan is out of range; allowed 0 to 0.5"),
    (BatchingPolicy(max_num_seqs=True), "max_num_seqs=True is out of range; allowed 1 to 4096"),
    (BatchingPolicy(spec_tokens=3.0), "spec_tokens=3.0 is not an integer; allowed 1 to 16"),
    (SessionSpec(think_cv=math.nan), "think_cv=nan is out of range; allowed 0 to 20"),
    (SessionSpec(max_turns=2.0), "max_turns=2.0 is not an integer; allowed 1 to 1000"),
    (ArrivalProcess(rate_req_s=math.nan), "rate_req_s=nan is out of range; allowed > 0 to 10000"),
    (LengthDist("uniform", low=True, high=8), "low=True is not an integer; allowed 1 to 1000000"),
])
def test_configs_share_the_message(config, message):
    with pytest.raises(ValueError) as info:
        config.validate()
    assert str(info.value) == message
