"""The range checks every config's ``validate()`` uses, with one message format:

    ``{name}={value} is out of range; allowed {low} to {high}`` (``allowed > {low} to {high}`` for an open bound)
    ``{name}={value} is not an integer; allowed {low} to {high}``

Booleans, non-numbers and NaN are refused (``low <= nan`` is False, so NaN never passes). Numpy only: nothing
from batching, so every layer may use it.
"""
from __future__ import annotations

import numpy as np

MAX_SHOWN_CHARS = 200  # a message quotes at most this much of a text value
_BIG_INT = 10**30  # integers this large are shown by their digit count (str() of a 5,000-digit int raises)


def is_number(value: object) -> bool:
    """A Python or numpy int or float, not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def show(value: object) -> str:
    """A value as messages quote it: floats to 10 significant digits (``1e+30``, ``nan``, ``-1`` for -1.0),
    integers in full up to 30 digits, then by their digit count, text in quotes cut to MAX_SHOWN_CHARS,
    containers by their kind (never their contents), anything else by its repr."""
    if is_number(value):
        if isinstance(value, (float, np.floating)):
            return f"{float(value):.10g}"
        value = int(value)
        if abs(value) < _BIG_INT:
            return str(value)
        try:
            digits = f"{len(str(abs(value))):,}-digit"
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            digits = f"~{int(abs(value).bit_length() * 0.30103) + 1:,}-digit"
        return f"<a {'negative ' if value < 0 else ''}{digits} number>"
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, str):
        if len(value) <= MAX_SHOWN_CHARS:
            return repr(value)
        return repr(value[:MAX_SHOWN_CHARS]) + f"... ({len(value):,} characters)"
    if isinstance(value, (list, tuple, dict, set, frozenset, np.ndarray)):
        return f"<{type(value).__name__}>"
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "..."


def check_range(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    """Raise a ValueError unless value is a number with low <= value <= high (low < value when low_open)."""
    ok = is_number(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        allowed = f"> {show(low)}" if low_open else show(low)
        raise ValueError(f"{name}={show(value)} is out of range; allowed {allowed} to {show(high)}")


def check_int(name: str, value: object, low: int, high: int) -> None:
    """Raise a ValueError unless value is a Python or numpy integer (not a bool) with low <= value <= high."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        # a float keeps its decimal point here ("2.0 is not an integer", not "2 is not an integer")
        quoted = repr(float(value)) if isinstance(value, (float, np.floating)) else show(value)
        raise ValueError(f"{name}={quoted} is not an integer; allowed {show(low)} to {show(high)}")
    check_range(name, value, low, high)
