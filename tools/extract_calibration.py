"""Regenerate batching/data/ from the measured tables in batching/data/raw/, and refit.

    python tools/extract_calibration.py [--source DIR]

DIR (default batching/data/raw) holds the published tables under the names in
batching/data/README.md: h100_llama2_70b_linear_ops.csv (Vidur's Llama-2-70B mlp.csv),
h100_dgx_allreduce_vidur.csv (Vidur's h100_dgx all_reduce.csv) and h100_allreduce.csv
(aiconfigurator's all-reduce rows).

Writes (all small, all derived; batching/data/README.md says where each comes from):
  h100_llama2_70b_linear_ops.csv  per TP and token count: the median time of each linear op
                                  (QKV, O, gate+up, down), their sum, and the sum of the five
                                  element-wise ops (2 RMSNorms, RoPE, SiLU-and-mul, add), ms
  h100_allreduce.csv              NVIDIA aiconfigurator's measured all-reduce rows, as shipped
  h100_allreduce_vidur.csv        Vidur's NCCL all-reduce: median per half-octave of message size
  linear_fit.json                 batching.sim.hardware.calibration.fit_ops() on the linear-ops table
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batching.sim.hardware import calibration  # noqa: E402

DATA = ROOT / "batching" / "data"
RAW = DATA / "raw"  # the measured tables as published (batching/data/README.md)
VIDUR_BINS_PER_OCTAVE = 2  # Vidur's rows are noisy (2-5x between neighbours below 1 MiB): pool per half octave


def linear_ops(src: Path) -> pd.DataFrame:
    raw = pd.read_csv(src / "h100_llama2_70b_linear_ops.csv")
    med = {op: raw[f"time_stats.{op}.median"] for op in calibration.LINEAR_OPS + calibration.ELEMENTWISE_OPS}
    t = pd.DataFrame({"tp": raw.num_tensor_parallel_workers, "num_tokens": raw.num_tokens, **med})
    # 2048 and 4096 tokens were profiled twice: one row per (tp, tokens), the median of the repeats
    t = t.groupby(["tp", "num_tokens"], as_index=False).median()
    out = t[["tp", "num_tokens"]].copy()
    for op in calibration.LINEAR_OPS:
        out[f"{op}_ms"] = t[op]
    out["linear_ms"] = t[list(calibration.LINEAR_OPS)].sum(axis=1)
    out["elementwise_ms"] = t[list(calibration.ELEMENTWISE_OPS)].sum(axis=1)
    return out.round(5)


def vidur_allreduce(src: Path) -> pd.DataFrame:
    raw = pd.read_csv(src / "h100_dgx_allreduce_vidur.csv")
    raw = raw[raw.collective == "all_reduce"]
    rows = []
    for gpus, g in raw.groupby("num_workers"):
        b = np.floor(np.log2(g["size"].to_numpy(float)) * VIDUR_BINS_PER_OCTAVE)
        for _, part in g.groupby(b):
            rows.append({"num_gpus": int(gpus), "message_bytes": int(round(part["size"].median())),
                         "latency_us": round(float(part["time_stats.all_reduce.median"].median()) * 1e3, 3),
                         "samples": len(part),
                         "min_us": round(float(part["time_stats.all_reduce.median"].min()) * 1e3, 3),
                         "max_us": round(float(part["time_stats.all_reduce.median"].max()) * 1e3, 3)})
    return pd.DataFrame(rows).sort_values(["num_gpus", "message_bytes"]).reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=RAW)
    args = ap.parse_args()
    src = args.source
    lin = linear_ops(src)
    lin.to_csv(DATA / "h100_llama2_70b_linear_ops.csv", index=False)
    raw, dst = src / "h100_allreduce.csv", DATA / "h100_allreduce.csv"
    if not dst.exists() or dst.read_bytes() != raw.read_bytes():
        dst.unlink(missing_ok=True)  # the checked-out copy may be read-only
        shutil.copyfile(raw, dst)
    vidur_allreduce(src).to_csv(DATA / "h100_allreduce_vidur.csv", index=False)
    (DATA / "linear_fit.json").write_text(calibration.fit_json(calibration.fit_ops(lin)))
    for name in ("h100_llama2_70b_linear_ops.csv", "h100_allreduce.csv", "h100_allreduce_vidur.csv", "linear_fit.json"):
        print(f"wrote batching/data/{name} ({(DATA / name).stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
