"""Write assets/sample_trace.csv: 500 requests of the "mixed" preset at 2 req/s, seed 7.

Native trace format (arrival_s, prompt_tokens, output_tokens, priority, class_name), so
the file loads back with load_trace / TraceWorkload. Run from anywhere:
``python tools/make_sample_trace.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.workload.requests import workload_preset  # noqa: E402

OUT = ROOT / "assets" / "sample_trace.csv"


def main() -> None:
    requests = workload_preset("mixed", rate_req_s=2.0, num_requests=500, seed=7).generate()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    requests.to_frame().to_csv(OUT, index=False, float_format="%.6f", lineterminator="\n")
    print(f"wrote {len(requests)} requests to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
