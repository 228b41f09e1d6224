"""URL parameters: one ``Param`` per value a link carries, parsed and clamped (no Streamlit here)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batching.sim.hardware.specs import NOT_ASCII, number_text

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
MAX_SHOWN = 40  # characters of a link value quoted in a notice


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.10g}"
    return str(value)


@dataclass(frozen=True)
class Param:
    """A value that lives in the URL: its key, default and allowed values.

    The kind (bool, int, float or str) is the type of ``default``. Numbers are clamped to
    [low, high]; numeric ``choices`` snap to the nearest allowed value; unknown strings fall
    back to the default. Every correction comes with a notice for the user.
    """

    key: str
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    label: str = ""

    @property
    def kind(self) -> type:
        return type(self.default)

    def clamp(self, value: Any) -> Any:
        if self.choices is not None:
            if value in self.choices:
                return value
            if self.kind in (int, float) and all(isinstance(c, (int, float)) for c in self.choices):
                return min(self.choices, key=lambda c: (abs(c - value), c))
            return self.default
        if self.kind in (int, float):
            if self.low is not None and value < self.low:
                value = self.kind(self.low)
            if self.high is not None and value > self.high:
                value = self.kind(self.high)
        return value

    def widget_range(self) -> dict:
        """``min_value`` and ``max_value`` for the number input or slider that edits this value: a widget reads
        its bounds from its Param, so the widget and the link accept the same range."""
        if self.low is None or self.high is None or self.kind not in (int, float):
            raise ValueError(f"Param {self.key!r} has no numeric range")
        return {"min_value": self.kind(self.low), "max_value": self.kind(self.high)}

    def allowed(self) -> str:
        if self.choices is not None:
            return ", ".join(_show(c) for c in self.choices)
        if self.kind is bool:
            return "true or false"
        if self.low is not None and self.high is not None:
            return f"{_show(self.kind(self.low))} to {_show(self.kind(self.high))}"
        return "any value"

    def parse(self, raw: str) -> tuple[Any, str | None]:
        """(value, notice): the URL text as a value, corrected where needed."""
        name = self.label or self.key
        text = str(raw).strip()
        if len(str(raw)) > MAX_SHOWN:  # a notice quotes the start of a hostile value, not all of it
            raw = f"{str(raw)[:MAX_SHOWN]}... ({len(str(raw)):,} characters)"
        whole = True
        try:
            if self.kind is bool:
                low = text.lower()
                if low not in _TRUE | _FALSE:
                    raise ValueError
                value: Any = low in _TRUE
            elif self.kind is int:
                number = number_text(text)  # the command line's syntax: ASCII digits, 1e3, no commas
                if number != number or number in (float("inf"), float("-inf")):
                    raise ValueError
                value = int(round(number))
                whole = value == number
            elif self.kind is float:
                value = number_text(text)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError
            else:
                value = text
        except ValueError as exc:
            why = f": it {NOT_ASCII.replace(';', ',')}" if str(exc) == NOT_ASCII else ""
            return self.default, (f"Link value {self.key}={raw!r} for {name} is not valid{why} (allowed "
                                  f"{self.allowed()}); using {_show(self.default)}.")
        fixed = self.clamp(value)
        if fixed == value and not whole:
            return value, (f"Link value {self.key}={raw} for {name} is not a whole number; using "
                           f"{_show(value)}.")
        if fixed != value:
            reason = "is not one of the allowed values" if self.choices is not None else "is out of range"
            return fixed, (f"Link value {self.key}={raw} for {name} {reason} (allowed {self.allowed()}); "
                           f"using {_show(fixed)}.")
        return value, None

    def encode(self, value: Any) -> str:
        if self.kind is bool:
            return "true" if value else "false"
        if self.kind is float:
            return f"{float(value):.10g}"
        return str(value)
