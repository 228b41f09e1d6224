"""Where a figure's legend goes so that nothing runs into it at a document's size (issue 24 item 12).

A legend below the plot is placed in fractions of the plot's height (Plotly has no pixel offset for legends), so
it moves up as the plot shrinks: the caption line (``export.with_caption``) takes its room out of the bottom
margin, the plot gets shorter, and a legend at y = -0.2 landed on the x-axis title. A legend beside the plot, its
top at the plot's top, stays where it is at any height and width; Plotly widens the right margin for it.
"""
from __future__ import annotations

import plotly.graph_objects as go

SIDE_LEGEND = dict(orientation="v", x=1.02, xanchor="left", y=1.0, yanchor="top", xref="paper", yref="paper")


def clear_of_axes(fig: go.Figure) -> bool:
    """Whether the figure's series legend sits beside the plot (right of it, top-anchored inside its height), so
    it cannot cover an x-axis title, tick labels or the caption below the plot."""
    legend = fig.layout.legend
    x = legend.x if legend.x is not None else 1.02
    y = legend.y if legend.y is not None else 1.0
    return (legend.orientation in (None, "v") and x >= 1.0 and (legend.xanchor in (None, "left"))
            and 0.0 <= y <= 1.0 and legend.yanchor in (None, "top", "auto"))
