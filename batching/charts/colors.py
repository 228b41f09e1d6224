"""One colour per batching policy, the same on every page, figure and export (no Streamlit here).

Figure builders take policy *names* and look their colours up here; pages never pick colours. A name may
carry what the pages add to a preset: a slot prefix (Compare's ``"A · continuous"``), a star for customised
knobs (``"continuous*"``) or a suffix after a space (``"continuous knee"``): all of them are the preset's
colour. Any other name (a custom policy) gets a colour from ``EXTRA_COLORS`` picked by a CRC-32 of the name,
so it keeps its colour from page to page and from run to run. When one figure holds two series of the same
policy (Compare with ``continuous`` and ``continuous*`` side by side), ``policy_colors`` gives the second a
darker shade and the third a lighter one of the same hue: still recognisably that policy, yet apart.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

# the presets (batching.sim.policy.PRESETS), one hue each: request-level warm (static red, dynamic orange),
# iteration-level cool and green (continuous blue, chunked green, priority purple)
POLICY_COLORS: dict[str, str] = {
    "static": "#E45756",
    "dynamic": "#F58518",
    "continuous": "#4C78A8",
    "chunked": "#54A24B",
    "priority": "#B279A2",
}
# for names that are not presets: none of these is a preset's colour
EXTRA_COLORS: tuple[str, ...] = ("#72B7B2", "#9D755D", "#EECA3B", "#FF9DA6", "#79706E", "#D67195", "#439894",
                                 "#8F6D31")
_SLOT = re.compile(r"^\s*[A-Za-z0-9]{1,3}\s*·\s*")  # "A · " in front of a Compare slot's name


def policy_base(name: str) -> str:
    """The policy a shown name stands for: ``"B · chunked*"`` -> ``"chunked"``; a name that is no preset is
    returned stripped of the slot prefix and the star."""
    text = _SLOT.sub("", str(name)).strip()
    for word in (text, text.split(" ")[0]):
        base = word.rstrip("*").strip()
        if base in POLICY_COLORS:
            return base
    return text.rstrip("*").strip()


def policy_color(name: str) -> str:
    """The colour of a policy by its name: the preset's, or a stable one of ``EXTRA_COLORS`` for any other name."""
    base = policy_base(name)
    if base in POLICY_COLORS:
        return POLICY_COLORS[base]
    return EXTRA_COLORS[zlib.crc32(base.encode("utf-8")) % len(EXTRA_COLORS)]


def shade(hex_color: str, amount: float) -> str:
    """The colour mixed with black (amount < 0) or white (amount > 0), by |amount| (0-1)."""
    h = hex_color.lstrip("#")
    rgb = [int(h[i:i + 2], 16) for i in (0, 2, 4)]
    target = 255 if amount > 0 else 0
    a = min(1.0, abs(amount))
    return "#" + "".join(f"{round(c + (target - c) * a):02X}" for c in rgb)


# the second, third, ... series of the same policy in one figure
_REPEAT_SHADES = (-0.35, 0.45, -0.6, 0.65)


def policy_colors(names: Iterable[str]) -> dict[str, str]:
    """name -> colour for the series of one figure, in order: each its policy's colour; a policy that repeats
    (two Compare slots of the same preset) gets a darker, then a lighter shade of it for the later ones."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for name in names:
        if name in out:
            continue
        color = policy_color(name)
        n = seen.get(color, 0)
        seen[color] = n + 1
        out[name] = color if n == 0 else shade(color, _REPEAT_SHADES[(n - 1) % len(_REPEAT_SHADES)])
    return out


def alpha(hex_color: str, a: float) -> str:
    """``rgba(...)`` of a ``#RRGGBB`` colour with opacity ``a``."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{a})"


# speculative decoding on Explore's charts: the drafting part of a step apart from the target's forward pass that
# verifies the drafts (timeline), and the draft tokens that forward pass accepted apart from those it rejected
# (computed for nothing) in the batch composition. None is a policy's colour; "rejected" reads as waste (a red),
# "accepted" as a lighter shade of the decode tokens' blue it adds to.
SPEC_COLORS: dict[str, str] = {
    "drafting": "#EECA3B",
    "verification": "#5B6770",
    "accepted": "#9ECAE9",
    "rejected": "#C44E52",
}
# the speculation crossover (Tune): the two curves, with and without speculative decoding
SPEC_CURVE_COLORS: dict[str, str] = {"on": "#D67195", "off": "#4C78A8"}
# prefill/decode disaggregation on Explore's charts: the request timeline's two segments between a request's first
# token (on its prefill instance) and its decode (the prompt's KV moving over the link, then waiting for KV room on
# the decode instance), and the per-instance view's lines by role (prefill instances in the prefill tokens' orange,
# decode instances in the decode tokens' blue, later instances of a role in shades of it). None is a class colour.
DISAGG_COLORS: dict[str, str] = {
    "transfer": "#111111",
    "decode_wait": "#7F7F7F",
    "prefill": "#F58518",
    "decode": "#4C78A8",
}
