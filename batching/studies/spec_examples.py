"""The speculative-decoding examples docs/CALIBRATION.md quotes, simulated when the report is written (so they follow
the code): DeepSeek-V3's MTP aggregated and on a prefill/decode split, and an EAGLE head on a split."""
from __future__ import annotations

from batching.sim.hardware.specs import KV_BLOCK_TOKENS, deployment
from batching.sim.policy import PRESETS, with_knobs
from batching.sim.simulate import Scenario, simulate
from batching.sim.topology.disagg import Disagg
from batching.sim.workload.requests import workload_preset

POLICY = "continuous"
REQUESTS = 200
RATE_REQ_S = 0.5  # chat traffic at a low load: the decode steps are small, where speculation pays most


def _pair(sc: Scenario, spec: dict) -> tuple[dict, dict]:
    """The summaries without and with speculation (``spec``: its knobs)."""
    on = Scenario(sc.deployment, sc.workload, with_knobs(sc.policy, **spec), nodes=sc.nodes, disagg=sc.disagg)
    return simulate(sc).summary(), simulate(on).summary()


def mtp_example() -> dict:
    """DeepSeek-V3 FP8 on H200, MTP K = 1, A = 0.85: TPOT P50 (s) without and with it, aggregated on TP 8 and on
    1 prefill TP 8 + 1 decode TP 8 (two nodes); the split's draft share of the decode steps' time."""
    dep = deployment("h200-sxm", "deepseek-v3", 8, precision="fp8")
    base = Scenario(dep, workload_preset("chat", RATE_REQ_S, REQUESTS, 0), PRESETS[POLICY])
    spec = {"spec_decode": "mtp", "spec_tokens": 1, "spec_acceptance": 0.85}
    agg_off, agg_on = _pair(base, spec)
    split = Scenario(dep, base.workload, base.policy, nodes=2, disagg=Disagg(1, 8, 1, 8))
    split_off, split_on = _pair(split, spec)
    return {"agg_off_s": agg_off["tpot_p50_s"], "agg_on_s": agg_on["tpot_p50_s"],
            "split_off_s": split_off["tpot_p50_s"], "split_on_s": split_on["tpot_p50_s"],
            "split_draft_share": split_on["draft_time_share"]}


def eagle_split_example() -> dict:
    """Llama-3.1-8B on H100, 1 prefill TP 1 + 1 decode TP 1, EAGLE K = 3, A = 0.7: TPOT and TTFT P50 (s) without
    and with it, and the KV tokens a decode instance holds (the head's weights and KV take their share)."""
    dep = deployment("h100-sxm", "llama-3.1-8b", 1, 2)
    dis = Disagg(1, 1, 1, 1)
    sc = Scenario(dep, workload_preset("chat", RATE_REQ_S, REQUESTS, 0), PRESETS[POLICY], disagg=dis)
    spec = {"spec_decode": "eagle", "spec_tokens": 3, "spec_acceptance": 0.7}
    off, on = _pair(sc, spec)
    return {"tpot_off_s": off["tpot_p50_s"], "tpot_on_s": on["tpot_p50_s"], "ttft_off_s": off["ttft_p50_s"],
            "ttft_on_s": on["ttft_p50_s"],
            "kv_off_tokens": dis.kv_blocks(dep, "decode", sc.policy) * KV_BLOCK_TOKENS,
            "kv_on_tokens": dis.kv_blocks(dep, "decode", with_knobs(sc.policy, **spec)) * KV_BLOCK_TOKENS}
