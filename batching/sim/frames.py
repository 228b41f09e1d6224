"""The engine's step tables as a DataFrame (simulate.py and disagg.py build SimResult.steps from it)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from batching.sim.engine import kernel as eng
from batching.sim.hardware.costmodel import CostModel, useful_flops_bytes


BLOCK_ROWS = 4096  # rows transposed at a time: a block stays in the CPU's cache

# the frame's columns from the engine's integer step table (S_LM only feeds the useful FLOPs and bytes)
INT_COLUMNS = (("prefill_tokens", eng.S_PREFILL), ("decode_tokens", eng.S_DECODE), ("padded_tokens", eng.S_PADDED),
               ("running", eng.S_RUNNING), ("waiting", eng.S_WAITING), ("kv_blocks", eng.S_KV_BLOCKS),
               ("swapped", eng.S_SWAPPED), ("swap_tokens", eng.S_SWAP_TOKENS), ("preempted", eng.S_PREEMPTED),
               # taken from the waiting queue: first time, or again after a recompute
               ("admitted", eng.S_ADMITTED),
               ("stalled", eng.S_STALLED),  # past their prefill, no token in this step (generation stalls)
               ("cached_tokens", eng.S_CACHED_TOKENS),  # prompt tokens served from the prefix cache at admissions
               # KV blocks held only by the prefix cache (evictable), after the step
               ("cached_blocks", eng.S_CACHE_BLOCKS))


def by_column(table: np.ndarray, columns: list[int]) -> np.ndarray:
    """``columns`` of a (rows, columns) table as a (len(columns), rows) array, each column contiguous: the engine
    writes a step's columns together, a frame reads a column at a time. Copied block by block (1.4x quicker than
    one transposed copy of a 100,000-step table); a frame built on its rows needs no copy of its own (pandas'
    consolidation of the strided columns took as long as the run itself)."""
    out = np.empty((len(columns), table.shape[0]), table.dtype)
    for i in range(0, table.shape[0], BLOCK_ROWS):
        out[:, i:i + BLOCK_ROWS] = table[i:i + BLOCK_ROWS, columns].T
    return out


def steps_frame(out: eng.EngineOutput, replica: int, cm: CostModel) -> pd.DataFrame:
    """One row per forward pass of one replica (or instance): the engine's step tables with names and units."""
    si, sf = out.steps_i, out.steps_f
    tokens = si[:, eng.S_PREFILL] + si[:, eng.S_DECODE]
    flops, nbytes = useful_flops_bytes(cm.coef, tokens, sf[:, eng.F_ATTN_WORK], sf[:, eng.F_DECODE_CTX],
                                       si[:, eng.S_LM])
    ints = by_column(si, [k for _, k in INT_COLUMNS])
    start, duration = by_column(sf, [eng.F_START, eng.F_DURATION])
    frame = pd.DataFrame({
        "replica": replica,
        "step": np.arange(len(si)),
        "start_s": start,
        "duration_s": duration,
        **{name: ints[i] for i, (name, _) in enumerate(INT_COLUMNS)},
        "useful_flops": flops,
        "useful_bytes": nbytes,
    }, copy=False)  # each column its own contiguous array, counted whole by memory_usage
    if out.spec_steps_i is not None:  # speculative decoding: rejected draft tokens are in padded_tokens
        frame["spec_seqs"] = out.spec_steps_i[:, eng.SP_SEQS]  # decoding sequences that speculated
        frame["spec_proposed"] = out.spec_steps_i[:, eng.SP_PROPOSED]  # draft tokens proposed and verified
        frame["spec_accepted"] = out.spec_steps_i[:, eng.SP_ACCEPTED]  # of those, accepted
        frame["draft_s"] = out.spec_steps_f[:, eng.SPF_DRAFT_S]  # seconds of the step spent drafting (in duration_s)
    return frame


class StepsTable:
    """Every replica's (or instance's) ``steps_frame`` in one table of ``rows`` rows, as pd.concat(frames,
    ignore_index=True) makes it, each column filled in place as a frame comes: the frames are never all held
    with the table (64 nodes of 8 replicas with every request alone, 5.6 million steps: ~0.9 GB each)."""

    def __init__(self, rows: int) -> None:
        self.rows, self.at = rows, 0
        self.columns: dict[str, np.ndarray] | None = None

    def add(self, frame: pd.DataFrame) -> None:
        if self.columns is None:
            self.columns = {name: np.empty(self.rows, frame[name].dtype) for name in frame.columns}
        if list(frame.columns) != list(self.columns):
            raise RuntimeError(f"step frames with different columns: {list(frame.columns)} after "
                               f"{list(self.columns)}")
        end = self.at + len(frame)
        for name, column in self.columns.items():
            column[self.at:end] = frame[name].to_numpy()
        self.at = end

    def frame(self) -> pd.DataFrame:
        if self.columns is None:
            return pd.DataFrame()
        if self.at != self.rows:
            raise RuntimeError(f"step table of {self.rows:,} rows got {self.at:,}")
        return pd.DataFrame(self.columns, copy=False)
