"""Figures ready for a document: a caption line naming the scenario under the plot (no Streamlit here).

``scenario_caption`` writes the line (GPU, model, TP, precision, workload, rate, requests, seed);
``with_caption`` puts it at the bottom left of a figure. The line is the title of a legend of its own
(``CAPTION_LEGEND``) anchored to the bottom of the figure's container: Plotly reserves the room for it
(automargin) below everything else, x tick labels, axis titles and bottom legends included, at any width,
so nothing overlaps and nothing is clipped, in the dashboard, in its modebar PNG download and in kaleido's
PNG. The legend holds one invisible entry (a legend with no entry is not drawn).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace

import plotly.graph_objects as go

from batching.charts.text import literal, unliteral
from batching.sim.hardware.specs import gpu_preset
from batching.sim.simulate import Scenario
from batching.sim.workload.requests import WORKLOAD_PRESETS, WORKLOAD_SESSIONS, SyntheticWorkload, TraceWorkload

CAPTION_LEGEND = "legend9"  # a legend no builder uses for its series
CAPTION_NAME = "scenario caption"  # the name of the invisible entry
CAPTION_FONT = {"size": 11, "color": "#6B6B6B"}
MAX_LINE_CHARS = 90  # a longer caption wraps once, at a separator


def workload_name(workload: SyntheticWorkload | TraceWorkload) -> str:
    """The preset a synthetic workload is ("mixed"), "<preset> with its own mix" when only the shares or lengths
    differ, else the class names; "trace <file>" for a trace."""
    if isinstance(workload, TraceWorkload):
        text = f"trace {workload.filename}"
        if workload.speedup != 1.0:
            text += f" at {workload.speedup:.3g}x speed"
        return text
    # a shared prompt is named on its own (scenario_caption); sessions pick the presets that have them
    own = tuple(replace(c, shared_prefix_tokens=0) for c in workload.classes)
    presets = {k: v for k, v in WORKLOAD_PRESETS.items() if (k in WORKLOAD_SESSIONS) == (workload.sessions is not None)}
    for name, classes in presets.items():
        if own == tuple(classes):
            return name
    names = [c.name for c in sorted(workload.classes, key=lambda c: c.priority)]
    for name, classes in presets.items():
        if names == [c.name for c in sorted(classes, key=lambda c: c.priority)]:
            return f"{name} (own mix)"
    return " + ".join(names)


def scenario_caption(scenario: Scenario, *, policy: str | None = None, rate: str | None = None) -> str:
    """One line naming what a figure simulated, e.g. ``Simulated: 8× H100 SXM 80GB · Qwen2.5-72B · TP 8 · BF16 ·
    vLLM 0.11 profile · workload mixed · 3 req/s · 2,000 requests · seed 0``.

    ``policy``: the policy's name, for a figure of one policy; ``rate``: what to say instead of the workload's
    rate where a study varies it (``"rate searched"`` on Capacity, ``"rate swept"`` on Tune)."""
    dep, wl = scenario.deployment, scenario.workload
    node = dep.node
    parts = [f"{node.num_gpus}× {node.gpu.name}", dep.model.name,
             f"TP {node.tp} over two nodes" if node.cross_node else f"TP {node.tp}", dep.precision.upper()]
    split = getattr(scenario, "disagg", None)
    if split is not None:  # the split's own TPs, not the sidebar's
        parts[2] = (f"{split.prefill_instances} prefill × TP {split.prefill_tp} + {split.decode_instances} decode × "
                    f"TP {split.decode_tp}")
        if scenario.nodes > 1:
            parts[0] = f"{scenario.nodes} nodes of {parts[0]}"
    elif scenario.nodes > 1 or scenario.router != "round-robin":
        parts[0] = f"{scenario.nodes} node{'s' if scenario.nodes > 1 else ''} of {parts[0]}"
        parts.insert(4, f"{scenario.replicas} replica{'s' if scenario.replicas > 1 else ''}, {scenario.router} router")
    prof = getattr(scenario, "profile", None)
    if prof is not None:  # the engine profile the run priced its steps and client times with
        parts.append(f"{prof.label} profile")
    if dep.kv_dtype == "fp8":
        parts.append("FP8 KV cache")
    if dep.kv_cache_tokens is not None:
        parts.append(f"KV cache {dep.kv_capacity_tokens:,} tokens")
    parts.append(f"workload {workload_name(wl)}")
    if isinstance(wl, SyntheticWorkload):
        shared = {c.shared_prefix_tokens for c in wl.classes}
        if shared != {0}:
            parts.append(f"{'/'.join(f'{t:,}' for t in sorted(shared))}-token shared prompt")
        # the rate to 4 significant digits: "4.712 req/s", never a raw 4.71174
        if getattr(wl, "concurrency", None) is not None:  # closed-loop clients: no rate is set, N is
            rate = "concurrency searched" if rate == "rate searched" else wl.load_text
        parts += [rate or f"{wl.rate_req_s:.4g} req/s", *_arrival_words(wl), f"{wl.num_requests:,} requests",
                  f"seed {wl.seed}"]
    else:
        if rate:
            parts.append(rate)
        if wl.max_requests is not None:
            parts.append(f"first {wl.max_requests:,} requests")
    if policy:
        parts.append(f"policy {policy}")
    return "Simulated: " + " · ".join(parts)


def configs_caption(configs: Sequence[Mapping], scenario: Scenario) -> str:
    """The caption of a figure whose points are many configurations (Find a deployment's search): the GPUs,
    precisions, TPs and policies of those points, not the sidebar's one deployment, e.g. ``Simulated: 8× B200 180GB
    / H100 SXM 80GB · Qwen2.5-72B · TP 4 / 8 · FP8 · policies chunked, continuous · workload mixed · rate searched
    · 2,000 requests · seed 0``. ``configs``: the search's rows (``gpu``, ``precision``, ``tp``, ``policy``); the
    model and the traffic are the scenario's, the rate the search's."""
    rows = [c for c in configs if c.get("meets_slo", True)] or list(configs)

    def seen(key) -> list:
        return list(dict.fromkeys(c[key] for c in rows if c.get(key) is not None))

    gpus = [_gpu_name(g) for g in seen("gpu")] or [scenario.deployment.node.gpu.name]
    tps = seen("tp") or [scenario.deployment.node.tp]
    precisions = [str(p).upper() for p in seen("precision")] or [scenario.deployment.precision.upper()]
    parts = [f"{scenario.deployment.node.num_gpus}× {' / '.join(gpus)}", scenario.deployment.model.name,
             f"TP {' / '.join(str(t) for t in sorted(tps))}", " / ".join(precisions)]
    policies = seen("policy")
    if policies:
        parts.append(f"polic{'ies' if len(policies) > 1 else 'y'} {', '.join(policies)}")
    wl = scenario.workload
    parts += [f"workload {workload_name(wl)}", "rate searched"]
    if isinstance(wl, SyntheticWorkload):
        parts += [f"{wl.num_requests:,} requests", f"seed {wl.seed}"]
    elif wl.max_requests is not None:
        parts.append(f"first {wl.max_requests:,} requests")
    return "Simulated: " + " · ".join(parts)


def _gpu_name(key: str) -> str:
    try:
        return gpu_preset(key).name
    except (KeyError, ValueError):
        return str(key)  # a custom GPU: its own name


def _arrival_words(wl: SyntheticWorkload) -> list[str]:
    """How the arrivals differ from Poisson, if they do: ``bursty (Gamma CV 4)``, ``on 10 s / off 10 s``, ..."""
    a = wl.arrivals
    if getattr(wl, "concurrency", None) is not None:  # closed loop: the arrival process is not used
        return []
    if a.kind == "gamma":
        return [f"bursty (Gamma CV {a.cv:g})"]
    if a.kind == "onoff":
        return [f"on {a.on_s:g} s / off {a.off_s:g} s"]
    if a.kind == "diurnal":
        return [f"diurnal peak:trough {a.peak_to_trough:g}, period {a.period_s:,.0f} s"]
    if a.kind == "constant":
        return ["evenly spaced"]
    return []


def _halved(text: str) -> str:
    """``text`` split at the " · " nearest its middle when longer than ``MAX_LINE_CHARS``, again for each half."""
    if len(text) <= MAX_LINE_CHARS:
        return text
    cuts = [i for i in range(len(text)) if text.startswith(" · ", i)]
    if not cuts:
        return text
    at = min(cuts, key=lambda i: abs(i - len(text) / 2))
    return _halved(text[:at]) + "<br>" + _halved(text[at + 3:])


def _wrapped(text: str) -> str:
    """The caption on two short lines, hardware and model, then the traffic (``· workload`` starts the second):
    each fits a half-width dashboard column, where one long line would be cut at the right edge. A line longer
    than ``MAX_LINE_CHARS`` (a fleet's "2 nodes of ... · 16 replicas, least-outstanding router", which was cut at
    "least-outstanding rou") is split again at the separator nearest its middle."""
    at = text.find(" · workload ")
    if at < 0:
        return _halved(text)
    return _halved(text[:at]) + "<br>" + _halved(text[at + 3:])


def caption_of(fig: go.Figure) -> str | None:
    """The caption a figure carries (``with_caption``), as one line; None when it has none."""
    legend = fig.layout[CAPTION_LEGEND] if CAPTION_LEGEND in fig.layout else None
    if legend is None or legend.title is None or not legend.title.text:
        return None
    return unliteral(legend.title.text.replace("<br>", " · "))


def _entry(fig: go.Figure):
    """The caption legend's one entry, empty and invisible, of a trace type the figure already draws: WebGL lines
    in a WebGL figure (no second renderer), a bar in a stacked bar chart (where an empty bar takes no room), else
    an SVG line (a bar in a grouped chart would take a slot of every group)."""
    types = {t.type for t in fig.data}
    common = dict(x=[None], y=[None], name=CAPTION_NAME, legend=CAPTION_LEGEND, showlegend=True, hoverinfo="skip")
    if "scattergl" in types:
        return go.Scattergl(mode="lines", line=dict(width=0, color="rgba(0,0,0,0)"), **common)
    if types == {"bar"} and fig.layout.barmode in ("stack", "relative", "overlay"):
        return go.Bar(marker=dict(color="rgba(0,0,0,0)", line=dict(width=0)), **common)
    return go.Scatter(mode="lines", line=dict(width=0, color="rgba(0,0,0,0)"), **common)


@functools.lru_cache(maxsize=64)
def _caption_legend(text: str) -> go.layout.Legend:
    """The caption's legend, built (and validated) once per caption text: assigning a built object to a figure
    costs ~0.3 ms where ``update_layout`` with the same dict re-validates it for ~6 ms, on every figure of every
    rerun. Plotly copies it into each figure, so the cached one is never changed."""
    return go.layout.Legend(
        title=dict(text=_wrapped(literal(text)), font=dict(CAPTION_FONT), side="top left"),
        xref="container", yref="container", x=0.005, y=0.0, xanchor="left", yanchor="bottom",
        orientation="h", bgcolor="rgba(0,0,0,0)", borderwidth=0, itemclick=False, itemdoubleclick=False,
        itemwidth=30, font=dict(size=1, color="rgba(0,0,0,0)"), indentation=10)


def with_caption(fig: go.Figure, text: str, copy: bool = True) -> go.Figure:
    """The figure with ``text`` as a caption line under everything else (a copy unless ``copy`` is off). ``text`` is
    plain text, shown as written (``charts.text.literal``): it names the trace file, the model and the GPU.

    Idempotent: a figure that already carries a caption has it replaced, never doubled."""
    out = go.Figure(fig) if copy else fig
    if not any(getattr(t, "legend", None) == CAPTION_LEGEND for t in out.data):
        # the one (invisible, inert) entry that makes Plotly draw the legend and so its title
        out.add_trace(_entry(out))
    out.layout[CAPTION_LEGEND] = _caption_legend(text)  # replaces a caption it had: the legend is all ours
    return out
