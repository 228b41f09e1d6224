"""Load on one dashboard server: N browser sessions moving a slider; errors, update latency, server memory.

    python benchmarks/load_report.py [--sessions 8] [--seconds 60] [--max-concurrent 2] [--json out.json]

The same run as ``LOAD_FULL=1 python -m pytest tests/load -s`` (tests/load/test_load.py): one
``streamlit run app.py`` on a loopback port, one Chromium (/usr/bin/chromium) with one context per
session, each pressing ArrowRight/ArrowLeft on the "Max wait (ms)" slider of Explore a policy. Prints
the errors (must be 0), P50/P99 from key press to chart update, the server's CPU and VmRSS (idle,
peak, end), and how busy the whole machine was: the browsers run on the same machine, so on a small
box the charts' drawing, not the server, sets the latency.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from load.test_load import CHROMIUM, print_figures, run_load  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8, help="browser sessions at once (default 8)")
    p.add_argument("--seconds", type=float, default=60, help="how long each session moves the slider (default 60)")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="BATCHING_MAX_CONCURRENT_SIMULATIONS for the server (default: the environment's, or 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = p.parse_args()
    if not CHROMIUM.exists():
        print(f"load_report: error: Chromium is not installed at {CHROMIUM} (apt-get install chromium)",
              file=sys.stderr)
        return 2
    env = {} if args.max_concurrent is None else {"BATCHING_MAX_CONCURRENT_SIMULATIONS": str(args.max_concurrent)}
    figures = run_load(args.sessions, args.seconds, env)
    print_figures(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if figures["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
