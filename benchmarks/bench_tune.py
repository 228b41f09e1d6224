"""Where a Tune rerun's seconds go (issue 25 item 3), server side, no browser:

    python benchmarks/bench_tune.py [--moves open,points,slo,slo,share]

Opens the Tune page in AppTest on a warm kernel (the default scenario: continuous, max_num_seqs 8 to 1,024 in 8
log-spaced values, the other presets on the frontier, the default SLOs) and makes the moves the browser benchmark
makes (``benchmarks/bench_browser.py`` PAGES: one more point, class 0's TTFT SLO + 5 %, the knee share + 1). Per
move: AppTest.run() wall time; simulations run, split into runs at the offered load or a capacity-search rate
and saturated (capacity) runs, with the CPU seconds of the calling thread in ``simulate`` and in the first
``summary()`` of each run (the metrics), and in drawing the previews; and when each chart was handed to Streamlit (the previews of the points
done so far, then the four result charts), in seconds from the start of the rerun. AppTest reruns the whole
script; a browser reruns only the page's fragment (the sidebar is not redrawn), so its times are a little lower.
CPU seconds are the figures to compare between trees on a busy machine; the walls count the other load too.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", default="open,points,points,slo,slo,share",
                    help="comma list of: open (the first rerun), points (+1 value), slo (class 0's TTFT SLO + 5 %%), "
                         "share (knee share + 1 %%)")
    args = ap.parse_args()
    moves = [m.strip() for m in args.moves.split(",") if m.strip()]
    bad = sorted(set(moves) - {"open", "points", "slo", "share"})
    if bad or not moves or moves[0] != "open":
        ap.error(f"--moves={args.moves!r}: start with open, then points, slo or share (unknown: {bad})")

    from streamlit.testing.v1 import AppTest

    import batching.sim.simulate as simm
    from batching.ui import cache, planning, widgets

    stats: dict[str, list] = defaultdict(lambda: [0, 0.0])
    charts: list[tuple[str, float]] = []
    start = [0.0]
    real_simulate, real_summary, real_chart = cache.simulate, simm.SimResult.summary, widgets.chart
    real_sweeps = planning.sweeps_cached

    def simulate(sc, saturated=False, **kw):
        t = time.thread_time()
        try:
            return real_simulate(sc, saturated=saturated, **kw)
        finally:
            k = "saturated runs" if saturated else "runs at a rate"
            stats[k][0] += 1
            stats[k][1] += time.thread_time() - t

    def summary(self):
        first = "_summary" not in self.__dict__
        t = time.thread_time()
        try:
            return real_summary(self)
        finally:
            if first:
                stats["summaries"][0] += 1
                stats["summaries"][1] += time.thread_time() - t

    def chart(fig, caption, filename, *a, **k):
        kind = filename.rsplit("_", 1)[-1]
        charts.append(("preview " + kind if "preview" in filename else kind, time.perf_counter() - start[0]))
        return real_chart(fig, caption, filename, *a, **k)

    def sweeps_cached(jobs, text, preview=None):
        def timed(*a):
            t = time.thread_time()
            try:
                return preview(*a)
            finally:
                stats["previews (script thread)"][0] += 1
                stats["previews (script thread)"][1] += time.thread_time() - t
        return real_sweeps(jobs, text, None if preview is None else timed)

    cache.simulate, simm.SimResult.summary, widgets.chart = simulate, summary, chart
    planning.sweeps_cached = sweeps_cached
    try:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900)
        at.run()
        at.switch_page("pages/tune.py")
        print(f"Tune in AppTest ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}); CPU s: the calling "
              "threads' own")
        for move in moves:
            if move == "points":
                w = at.number_input(key="wid:points")
                w.set_value(w.value + 1)
            elif move == "slo":
                w = at.text_input(key="wid:ttft_ms")
                parts = w.value.split(",")
                parts[0] = f"{float(parts[0]) * 1.05:.10g}"
                w.set_value(",".join(parts))
            elif move == "share":
                w = at.number_input(key="wid:share")
                w.set_value(w.value + 1)
            stats.clear()
            charts.clear()
            start[0] = time.perf_counter()
            at.run()
            wall = time.perf_counter() - start[0]
            if at.exception:
                raise SystemExit(f"{move}: {[e.value for e in at.exception]}")
            runs = ", ".join(f"{k} {n} ({s:.2f} CPU s)" for k, (n, s) in sorted(stats.items())) or "no runs"
            previews = [t for k, t in charts if k.startswith("preview")]
            final = [t for k, t in charts if not k.startswith("preview")]
            drawn = (f"first preview at {previews[0]:.2f} s, {len(previews) // 2} previews; " if previews else "") + \
                (f"results drawn at {final[0]:.2f}-{final[-1]:.2f} s" if final else "no charts")
            print(f"  {move:<7} {wall:6.2f} s wall; {runs}; {drawn}")
    finally:
        cache.simulate, simm.SimResult.summary, widgets.chart = real_simulate, real_summary, real_chart
        planning.sweeps_cached = real_sweeps


if __name__ == "__main__":
    main()
