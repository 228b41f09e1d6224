"""The engine's step tables as a DataFrame (simulate.py and disagg.py build SimResult.steps from it)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from batching.sim.engine import kernel as eng
from batching.sim.hardware.costmodel import CostModel, useful_flops_bytes


def steps_frame(out: eng.EngineOutput, replica: int, cm: CostModel) -> pd.DataFrame:
    """One row per forward pass of one replica (or instance): the engine's step tables with names and units."""
    si, sf = out.steps_i, out.steps_f
    tokens = si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]
    flops, nbytes = useful_flops_bytes(cm.coef, tokens, sf[:, eng.F_ATTN_WORK], sf[:, eng.F_DECODE_CTX],
                                       si[:, eng.S_LM])
    frame = pd.DataFrame({
        "replica": replica,
        "step": np.arange(len(si)),
        "start_s": sf[:, eng.F_START],
        "duration_s": sf[:, eng.F_DURATION],
        "prefill_tokens": si[:, eng.S_PREFILL],
        "decode_tokens": si[:, eng.S_DECODE],
        "padded_tokens": si[:, eng.S_PADDED],
        "running": si[:, eng.S_RUNNING],
        "waiting": si[:, eng.S_WAITING],
        "kv_blocks": si[:, eng.S_KV_BLOCKS],
        "swapped": si[:, eng.S_SWAPPED],
        "swap_tokens": si[:, eng.S_SWAP_TOKENS],
        "preempted": si[:, eng.S_PREEMPTED],
        "admitted": si[:, eng.S_ADMITTED],  # taken from the waiting queue: first time, or again after a recompute
        "stalled": si[:, eng.S_STALLED],  # past their prefill, no token in this step (generation stalls)
        "cached_tokens": si[:, eng.S_CACHED_TOKENS],  # prompt tokens served from the prefix cache at admissions
        "cached_blocks": si[:, eng.S_CACHE_BLOCKS],  # KV blocks held only by the prefix cache (evictable), after it
        "useful_flops": flops,
        "useful_bytes": nbytes,
    })
    if out.spec_steps_i is not None:  # speculative decoding: rejected draft tokens are in padded_tokens
        frame["spec_seqs"] = out.spec_steps_i[:, eng.SP_SEQS]  # decoding sequences that speculated
        frame["spec_proposed"] = out.spec_steps_i[:, eng.SP_PROPOSED]  # draft tokens proposed and verified
        frame["spec_accepted"] = out.spec_steps_i[:, eng.SP_ACCEPTED]  # of those, accepted
        frame["draft_s"] = out.spec_steps_f[:, eng.SPF_DRAFT_S]  # seconds of the step spent drafting (in duration_s)
    return frame
