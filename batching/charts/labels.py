"""Point labels that do not collide (issue 24 item 12: the frontier's knob labels ran into each other, into the
other policies' markers and into the knee stars).

Plotly places a point's text at one of nine positions around its marker and never moves it out of the way. Here
every label gets the first position, in ``POSITIONS`` order, whose box overlaps no marker and no label placed
before it (and no line, where some position allows), on a plot of ``PLOT_PX`` (the plot area of a 700-px-wide document figure with a legend
beside it: a wider dashboard plot only spreads the points further apart). A label that fits nowhere is left out;
the point's hover still names it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PLOT_PX = (480.0, 260.0)  # plot area (width, height) at document size, in px
CHAR_PX = 0.62  # a character's width per px of font size (digits and units of the default sans font)
LINE_PX = 1.25  # a line's height per px of font size
GAP_PX = 2.0  # between a marker's edge and its label
POSITIONS = ("top center", "bottom center", "middle right", "middle left", "top right", "top left", "bottom right",
             "bottom left")

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in px, y up


def to_px(x: np.ndarray, y: np.ndarray, x_range: tuple[float, float], y_range: tuple[float, float],
          log_x: bool = False, plot_px: tuple[float, float] = PLOT_PX) -> tuple[np.ndarray, np.ndarray]:
    """Data coordinates -> px on the plot area (``x_range`` in log10 units on a log axis, as Plotly's ranges)."""
    x = np.log10(np.asarray(x, float)) if log_x else np.asarray(x, float)
    w, h = plot_px
    px = (x - x_range[0]) / (x_range[1] - x_range[0]) * w
    py = (np.asarray(y, float) - y_range[0]) / (y_range[1] - y_range[0]) * h
    return px, py


def label_box(px: float, py: float, text: str, position: str, radius: float, font_px: float) -> Box:
    """The box a label at ``position`` around a marker of ``radius`` px at (px, py) takes."""
    w, h = len(text) * CHAR_PX * font_px, LINE_PX * font_px
    vert, horiz = position.split(" ")
    off = radius + GAP_PX
    if horiz == "center":
        x0 = px - w / 2
    elif horiz == "right":
        x0 = px + (off if vert == "middle" else 0.0)
    else:
        x0 = px - w - (off if vert == "middle" else 0.0)
    if vert == "top":
        y0 = py + off
    elif vert == "bottom":
        y0 = py - off - h
    else:
        y0 = py - h / 2
    return (x0, y0, x0 + w, y0 + h)


def overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def marker_box(px: float, py: float, radius: float) -> Box:
    return (px - radius, py - radius, px + radius, py + radius)


def line_samples(px: np.ndarray, py: np.ndarray, step: float = 6.0) -> list[Box]:
    """Small boxes along a polyline, every ``step`` px: a label over a line is as hard to read as over a marker."""
    out: list[Box] = []
    for (x0, y0), (x1, y1) in zip(zip(px[:-1], py[:-1]), zip(px[1:], py[1:])):
        if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
            continue
        n = max(1, int(math.hypot(x1 - x0, y1 - y0) // step))
        for t in np.linspace(0.0, 1.0, n + 1)[1:-1]:
            out.append(marker_box(x0 + t * (x1 - x0), y0 + t * (y1 - y0), 1.0))
    return out


def place(px: Sequence[float], py: Sequence[float], texts: Sequence[str], radius: float | Sequence[float],
          font_px: float,
          obstacles: Sequence[Box] = (), plot_px: tuple[float, float] = PLOT_PX,
          soft: Sequence[Box] = ()) -> list[str | None]:
    """A position per label (None: it fits nowhere and is left out), each clear of ``obstacles`` (markers), of the
    plot's edges and of the labels placed before it; clear of ``soft`` ones too (line samples) where some
    position is, else across a line rather than left out. ``radius``: the markers' (one per point where they
    differ: a knee's star is larger)."""
    w, h = plot_px
    placed: list[Box] = []
    out: list[str | None] = []
    radii = [float(radius)] * len(texts) if isinstance(radius, (int, float)) else [float(r) for r in radius]
    for x, y, text, radius in zip(px, py, texts, radii):
        chosen = None
        if text and math.isfinite(x) and math.isfinite(y):
            free = []
            for pos in POSITIONS:
                box = label_box(x, y, text, pos, radius, font_px)
                if box[0] < 0 or box[2] > w or box[1] < 0 or box[3] > h:
                    continue
                if any(overlap(box, o) for o in obstacles) or any(overlap(box, o) for o in placed):
                    continue
                free.append((any(overlap(box, o) for o in soft), pos, box))
            if free:
                _, chosen, box = min(free, key=lambda f: f[0])  # stable: the first position clear of lines
                placed.append(box)
        out.append(chosen)
    return out
