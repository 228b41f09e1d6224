"""TP 16 over two 8-GPU nodes (docs/CALIBRATION.md, "Two nodes (TP 16)"): the composed all-reduce held against the one
public measured two-node H100 table found, and DeepSeek-V3 on 2 x 8 H100 beside NVIDIA aiconfigurator's estimate of
the same setting. Nothing here is fitted: the composition's constants are NCCL's and the NIC's (costmodel)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from batching.sim.hardware import costmodel as cm
from batching.sim.hardware.specs import deployment
from batching.sim.simulate import simulate
from batching.studies import deepseek_check
from batching.studies.markdown import table as md_table

# nccl-tests all_reduce_perf (float, out-of-place time, us) on 2 x 8 H100 80GB HBM3 of Google Cloud's A3 Mega
# (GPUDirect-TCPXO: 8 x 200 Gb/s NICs per node), -b 8 -e 8G: github.com/lessizzmore/create-a3mega-ztan-fork,
# file ztan-NCCL-test-result. A TCP-based fabric, not InfiniBand: it is held against the composition with its own
# NIC speed and its own latency floor, to check the composition's form, not its InfiniBand constants.
TCPXO_SOURCE = ("nccl-tests all_reduce_perf on 2 x 8 H100 (Google Cloud A3 Mega, GPUDirect-TCPXO, 8 x 200 Gb/s "
                "per node; github.com/lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result)")
TCPXO_US = {8: 135.8, 1024: 147.1, 65536: 159.4, 1048576: 203.2, 4194304: 364.6, 16777216: 977.6,
            67108864: 1261.6, 268435456: 2360.9, 536870912: 3817.5}
TCPXO_NIC_BPS = 200e9 / 8  # one 200 Gb/s NIC per GPU
# aiconfigurator 0.12.0 `cli estimate --model-path deepseek-ai/DeepSeek-V3 --system h100_sxm --backend sglang
# --isl 1024 --osl 1024 --batch-size N --tp-size 16 --moe-tp-size 16 --moe-ep-size 1 --gemm-quant-mode fp8_block
# --moe-quant-mode fp8_block --kvcache-quant-mode bfloat16` (its SGLang 0.5.14 database; a static batch of N): TPOT;
# its time breakdown puts 75 % of a decode step in "generation_moe_overlap" at N = 8
AIC_TP16_TPOT = {8: 17.739e-3, 16: 25.134e-3, 32: 32.569e-3, 64: 46.095e-3}
AIC_TP16_MOE_SHARE = 0.75  # its "generation_moe_overlap" share of a decode step at N = 8 (--detail time)
ENGINE = "sglang"  # the engine of the published one-node run and of aiconfigurator's database


def tcpxo_frame() -> pd.DataFrame:
    """The composition with the TCPXO fabric's own floor (its smallest message's time less the 8-GPU NVLink floor,
    in place of NCCL's two network hops) and its NIC speed, against its measured times."""
    x8, y8 = cm.allreduce_table(cm.TWO_NODE_BASE, 8)
    floor = TCPXO_US[min(TCPXO_US)] * 1e-6 - y8[0]
    rows = []
    for size, us in TCPXO_US.items():
        t8 = float(np.exp(np.interp(np.log(size), x8, np.log(y8))))  # (below the table: its floor)
        composed = t8 + floor + size / 8 / TCPXO_NIC_BPS
        rows.append({"message_bytes": size, "measured_us": us, "composed_us": composed * 1e6,
                     "error": composed * 1e6 / us - 1})
    return pd.DataFrame(rows)


def table_frame() -> pd.DataFrame:
    """The composed InfiniBand table at a few sizes beside the measured 8-GPU one (one node)."""
    x, y = cm.allreduce_table("nccl", 16)
    x8, y8 = cm.allreduce_table("nccl", 8)
    sizes = np.exp(x)
    keep = [i for i, s in enumerate(sizes) if round(s) in (512, 65536, 1048576, 16777216, 134217728)]
    return pd.DataFrame({"message_bytes": sizes[keep].round().astype(np.int64), "one_node_8_gpus_us": y8[keep] * 1e6,
                         "two_nodes_16_gpus_us": y[keep] * 1e6, "ratio": y[keep] / y8[keep]})


def deepseek_frame() -> pd.DataFrame:
    """DeepSeek-V3 FP8 on 2 x 8 H100 at TP 16 (the one-node check's 1k/1k clients and SGLang settings) against
    aiconfigurator's estimate, beside one 8 x H200 node at TP 8 (where the published run is)."""
    rows = []
    for n, aic in AIC_TP16_TPOT.items():
        one = deepseek_check.scenario(n).with_engine(ENGINE)
        two = replace(one, deployment=deployment("h100-sxm", "deepseek-v3", 16, precision="fp8"))
        s2, s1 = simulate(two).summary(), simulate(one).summary()
        # mean TPOT, as the published run states it (deepseek_check.SIM_TPOT)
        tpot = deepseek_check.SIM_TPOT
        rows.append({"clients": n, "tp16_h100_tpot_ms": s2[tpot] * 1e3, "aiconfigurator_tpot_ms": aic * 1e3,
                     "difference": s2[tpot] / aic - 1, "tp16_h100_output_tok_s": s2["throughput_output_tok_s"],
                     "tp8_h200_tpot_ms": s1[tpot] * 1e3,
                     "tp8_h200_aiconfigurator_tpot_ms": deepseek_check.AIC_SGLANG_TPOT[n] * 1e3,
                     "tp8_h200_published_tpot_ms": deepseek_check.PUBLISHED[n][0] * 1e3})
    return pd.DataFrame(rows)


def markdown(deepseek: pd.DataFrame | None = None) -> str:
    """The "Two nodes (TP 16)" section of docs/CALIBRATION.md."""
    ds = deepseek_frame() if deepseek is None else deepseek
    tab, tcp = table_frame(), tcpxo_frame()
    pct = "+.0%"

    def times(v: float) -> str:
        return f"{v:.2f}×"
    mid = tcp[(tcp.message_bytes >= 65536) & (tcp.message_bytes <= 67108864)]
    dep = deployment("h100-sxm", "deepseek-v3", 16, precision="fp8")
    one = ds.tp8_h200_aiconfigurator_tpot_ms / ds.tp8_h200_tpot_ms - 1
    pub = ds.tp8_h200_published_tpot_ms / ds.tp8_h200_tpot_ms - 1
    two = ds.aiconfigurator_tpot_ms / ds.tp16_h100_tpot_ms - 1
    one_lo, one_hi, pub_lo, pub_hi, two_lo, two_hi = one.min(), one.max(), pub.min(), pub.max(), two.min(), two.max()
    return f"""## Two nodes (TP 16)

`--tp 16` (sidebar: Tensor parallel 16) serves one replica over two 8-GPU nodes (`num_gpus` 16). vLLM and SGLang
switch their custom all-reduce off when a group spans nodes (vLLM `custom_all_reduce.py`: "disabled because this
process group spans across nodes"), so NCCL runs every all-reduce of such a group, whatever `--allreduce` says.
No measured all-reduce over two InfiniBand-connected 8-GPU nodes was found to ship (aiconfigurator's NCCL tables
stop at 8 GPUs), so the table is composed the way NCCL's own tuning model composes a two-node all-reduce
(NVIDIA/nccl `src/graph/tuning.cc`: Tree/LL latency = base + 2 · ((GPUs per node − 1) · NVLink hop + log2(nodes) ·
network hop), 25.2 µs for 2 × 8 H100, the figure its log prints for such a cluster in NVIDIA/nccl issue #1453):

    allreduce_16(m) = allreduce_8,NCCL(m) + {cm.NET_HOPS} × {cm.NET_HOP_S * 1e6:.1f} µs + m / 8 / ({cm.NIC_BPS / 1e9:.0f} GB/s)

- `allreduce_8,NCCL(m)`: the measured 8-GPU NCCL table, the NVLink part (scaled by the GPU's NVLink above its
  latency floor, like every other table);
- {cm.NET_HOPS} × {cm.NET_HOP_S * 1e6:.1f} µs: NCCL's network hop latency for Tree/LL, up and down the tree;
- m / 8 / {cm.NIC_BPS / 1e9:.0f} GB/s: each GPU's eighth of the message through its own 400 Gb/s NIC (one ConnectX-7 per
  GPU on HGX H100, H200 and B200 nodes; NCCL reaches 46–48 GB/s per NDR NIC: its maintainers, NVIDIA/nccl-tests
  issue #290).

{md_table(tab, {"message_bytes": ",.0f", "one_node_8_gpus_us": ",.1f", "two_nodes_16_gpus_us": ",.1f",
           "ratio": times})}

Check of the form (not of the InfiniBand constants) on the one public measured two-node H100 table found:
{TCPXO_SOURCE}. The composition with that fabric's own floor (its 8-byte time less the NVLink floor) and its
{TCPXO_NIC_BPS * 8 / 1e9:.0f} Gb/s NICs is {format(mid.error.min(), pct)} to {format(mid.error.max(), pct)} off between
64 KB and 64 MB (the sizes of decode steps and prefill chunks): the composition has no per-chunk protocol cost, which
a TCP fabric pays heavily at mid sizes, and overlaps nothing at the largest sizes ({format(tcp.error.iloc[-1], pct)} at
512 MB). If an InfiniBand fabric's mid sizes fall short the same way, TP 16's all-reduce here is optimistic:

{md_table(tcp, {"message_bytes": ",.0f", "measured_us": ",.1f", "composed_us": ",.1f", "error": pct})}

Everything else TP 16 needs is measured where the tables have it: aiconfigurator's fused-MoE tables at expert TP 16
or EP 16 (DeepSeek-V3, Kimi-K2; H100, H200, B200) and its MLA modules at 8 heads per GPU. The linear and
element-wise terms use the TP 8 fit with half the shard and no tile factors (no GEMM measurement at 16 GPUs; the
factors belong to the measured shards' shapes), and a split's instances stay on one node (TP ≤ 8). So a TP 16 deployment always says `calibrated: false` with that reason.

DeepSeek-V3 FP8 on 2 × 8 H100 at TP 16 ({dep.weight_bytes_per_gpu / 2**30:.1f} GiB of weights per GPU,
{dep.kv_capacity_tokens:,} KV tokens; one 8 × H100 node cannot hold it), with the one-node DeepSeek check's
1k/1k clients and SGLang settings and the `{ENGINE}` profile, beside aiconfigurator 0.12's SGLang estimate of the same
setting (`cli estimate --system h100_sxm --tp-size 16 --moe-tp-size 16`, static batches) and the one-node
figures where the published run is (8 × H200, TP 8):

{md_table(ds, {"clients": ".0f", "tp16_h100_tpot_ms": ".2f", "aiconfigurator_tpot_ms": ".2f", "difference": pct,
          "tp16_h100_output_tok_s": ",.0f", "tp8_h200_tpot_ms": ".2f",
          "tp8_h200_aiconfigurator_tpot_ms": ".2f", "tp8_h200_published_tpot_ms": ".2f"})}

On one node aiconfigurator's TPOT is {one_lo:.0%} to {one_hi:.0%} above this one's and the published run
{pub_lo:.0%} to {pub_hi:.0%} above it; on two nodes aiconfigurator's is {two_lo:.0%} to {two_hi:.0%} above: most of
its two-node decode step is its cross-node MoE exchange ({AIC_TP16_MOE_SHARE:.0%} in "generation_moe_overlap" at 8
clients), where this model charges the two all-reduces per layer above. Which is nearer is open until a two-node run with its settings is published; the only
public figures found (sgl-project/sglang issue #3656: DeepSeek-R1 on 2 × 8 H100 at TP 16, 19 tok/s for one stream
with SGLang and 30 with vLLM, early 2025, no prompt lengths) name too little of the setting to hold the model against.

"""
