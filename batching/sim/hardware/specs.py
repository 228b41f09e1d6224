"""GPU, node and model presets (frozen dataclasses) and what follows from them.

Hardware figures are vendor datasheet numbers (NVIDIA H100/H200/A100/HGX B200 datasheets);
model figures are the ``config.json`` of each model on its official release. Custom GPUs and
models come from a dict or a JSON file (``gpu_from_dict``, ``model_from_dict``, which also
reads a Hugging Face ``config.json``).
"""
from __future__ import annotations

import json
import math
import re
import sys
import unicodedata
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from batching.sim.checks import check_range

GIB = 1024**3
KV_BLOCK_TOKENS = 16  # vLLM's default paged-attention block size

PRECISIONS = ("bf16", "fp8", "nvfp4")
# NVFP4 (NVIDIA blog "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025-06-24): 4-bit E2M1
# weights with one FP8 E4M3 scale per block of 16 (plus one FP32 scale per tensor, negligible): 0.5 + 1/16 bytes
NVFP4_BLOCK = 16
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1.0 / NVFP4_BLOCK}
# The MoE router stays BF16 in every precision (vLLM builds it unquantized: Deployment.layer_weight_bytes_per_gpu)
ROUTER_BYTES_PER_WEIGHT = 2.0
KV_DTYPES = ("auto", "fp8")


MAX_SHOWN_CHARS = 200  # error messages quote at most this much of what a user wrote
MAX_NAME_CHARS = 64


def shown(value) -> str:
    """A value as error messages quote it: JSON's spelling for true/false/null and non-finite numbers, huge
    integers by their digit count, text cut to MAX_SHOWN_CHARS, arrays and objects by kind (never their
    contents, which may be huge or nested 100,000 deep)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        if abs(value) < 10**15:
            return str(value)
        try:
            digits = f"{len(str(abs(value)))}-digit"
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            digits = f"{int(abs(value).bit_length() * 0.30103) + 1:,}-digit"
        return f"<a {'negative ' if value < 0 else ''}{digits} number>"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        if len(value) <= MAX_SHOWN_CHARS:
            return repr(value)
        return repr(value[:MAX_SHOWN_CHARS]) + f"... ({len(value):,} characters)"
    if isinstance(value, (list, tuple)):
        return "<a JSON array>"
    if isinstance(value, dict):
        return "<a JSON object>"
    return f"<{type(value).__name__}>"


NOT_ASCII = "has characters other than ASCII (full-width digits?); write it with 0-9"


def number_text(text: str) -> float:
    """A number as a user types it on the command line or in a link, read one way for both: ASCII only (full-width
    or other scripts' digits are refused, as trace cells and JSON specs refuse them; Python's float() would take
    them), then Python's float syntax (``1e3``, ``1_000``, ``inf``, ``nan``; no thousands commas), spaces around
    ignored. A ValueError says why (NOT_ASCII, or not a number); the caller checks finiteness and range."""
    if not text.isascii():
        raise ValueError(NOT_ASCII)
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("is not a number") from None


# control and format characters (ESC, NUL, newline, tab, DEL, C1, bidi overrides...) and line/paragraph separators:
# a name reaches terminals, launch commands and file names, so it holds none of them
_CONTROL_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def _check_name(name) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"name={shown(name)} is not allowed; allowed 1 to {MAX_NAME_CHARS} characters")
    bad = next((i for i, ch in enumerate(name) if unicodedata.category(ch) in _CONTROL_CATEGORIES), None)
    if bad is not None:
        raise ValueError(f"name={shown(name)} is not allowed: it has a control character (U+{ord(name[bad]):04X} at "
                         f"position {bad + 1}); allowed 1 to {MAX_NAME_CHARS} printable characters")


@dataclass(frozen=True)
class GPU:
    """One accelerator: memory, HBM bandwidth, dense peak compute, links."""

    name: str
    memory_bytes: float  # usable HBM as the driver reports it
    hbm_bw_Bps: float  # peak HBM bandwidth, bytes/s
    peak_bf16_flops: float  # dense BF16 tensor-core peak, FLOP/s
    peak_fp8_flops: float  # dense FP8 tensor-core peak, FLOP/s (0 = no FP8)
    nvlink_Bps: float  # NVLink bandwidth per direction per GPU, bytes/s
    pcie_Bps: float  # usable host<->device bandwidth, bytes/s (swap)
    # GEMM kernel family the measured linear-layer tables apply to ("hopper" = H100/H200:
    # same SMs, same cuBLAS kernels); "" = use the smooth fitted model only.
    arch: str = ""
    peak_fp4_flops: float = 0.0  # dense FP4 (NVFP4) tensor-core peak, FLOP/s (0 = no FP4: Hopper, Ampere)

    def peak_flops(self, precision: str) -> float:
        if precision == "nvfp4":
            if self.peak_fp4_flops <= 0:
                ok = "bf16, fp8" if self.peak_fp8_flops > 0 else "bf16"
                raise ValueError(f"precision='nvfp4' is not supported on {self.name} (no FP4 tensor cores; NVFP4 "
                                 f"needs Blackwell, e.g. b200); allowed: {ok}")
            return self.peak_fp4_flops
        if precision == "fp8":
            if self.peak_fp8_flops <= 0:
                raise ValueError(f"precision='fp8' is not supported on {self.name}; allowed: bf16")
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def validate(self) -> None:
        _check_name(self.name)
        check_range("memory_bytes", self.memory_bytes, 1 * GIB, 1024 * GIB)
        check_range("hbm_bw_Bps", self.hbm_bw_Bps, 1e11, 1e14)
        check_range("peak_bf16_flops", self.peak_bf16_flops, 1e12, 1e17)
        if self.peak_fp8_flops != 0:
            check_range("peak_fp8_flops", self.peak_fp8_flops, 1e12, 1e17)
        if self.peak_fp4_flops != 0:
            check_range("peak_fp4_flops", self.peak_fp4_flops, 1e12, 1e17)
        check_range("nvlink_Bps", self.nvlink_Bps, 1e9, 1e13)
        check_range("pcie_Bps", self.pcie_Bps, 1e8, 1e12)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer, as its config.json describes it.

    Mixture of experts: ``num_experts`` > 0 replaces the MLP by that many experts of width
    ``ffn_size`` each (``moe_intermediate_size`` in Qwen3-MoE and DeepSeek configs) plus a router, and each
    token runs ``experts_per_token`` of them. Memory holds every expert; compute uses the
    active ones (see ``active_linear_params_per_layer``). DeepSeek's MoE (DeepSeek-V2/V3, Kimi-K2) adds
    ``shared_experts`` experts every token runs (``n_shared_experts``) and keeps the first
    ``first_dense_layers`` layers dense (``first_k_dense_replace``) with an MLP of width ``dense_ffn_size``
    (``intermediate_size``; 0 = ``ffn_size``).

    Multi-head latent attention (MLA; DeepSeek-V2/V3/R1, Kimi-K2): ``kv_lora_rank`` > 0. Each token caches one
    latent of ``kv_lora_rank`` elements plus a shared RoPE key of ``qk_rope_head_dim`` per layer, whatever the
    number of heads; queries go through a rank-``q_lora_rank`` bottleneck (0 = a full query projection), each of
    the ``num_heads`` heads has a query/key of ``qk_nope_head_dim`` + ``qk_rope_head_dim`` (= ``head_dim``) and a
    value of ``v_head_dim`` (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1; DeepSeek-V3 technical report,
    arXiv:2412.19437, section 2.1.1).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int  # MLP width; for a mixture of experts, each expert's width
    vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    num_experts: int = 0  # 0 = dense MLP
    experts_per_token: int = 0  # top-k routing (mixture of experts only)
    shared_experts: int = 0  # experts every token runs besides its top-k (n_shared_experts)
    first_dense_layers: int = 0  # leading layers with a dense MLP instead of experts (first_k_dense_replace)
    dense_ffn_size: int = 0  # those layers' MLP width (intermediate_size); 0 = ffn_size
    kv_lora_rank: int = 0  # MLA: latent KV rank (0 = multi-head / grouped-query attention)
    q_lora_rank: int = 0  # MLA: query bottleneck rank (0 = none)
    qk_rope_head_dim: int = 0  # MLA: RoPE part of each query/key head (one shared RoPE key per token)
    qk_nope_head_dim: int = 0  # MLA: non-RoPE part of each query/key head
    v_head_dim: int = 0  # MLA: value head width
    # the longest sequence (prompt + output) the model serves: vLLM's max_model_len, derived from config.json's
    # max_position_embeddings (see ``context_from_hf_config``); 0 = not stated, no limit applied
    max_context_tokens: int = 0
    # multi-token-prediction modules published with the weights (DeepSeek-V3's num_nextn_predict_layers): what
    # speculative decoding 'mtp' runs; 0 = none, so the model cannot speculate with MTP
    mtp_layers: int = 0

    def validate(self) -> None:
        _check_name(self.name)
        check_range("num_layers", self.num_layers, 1, 1000)
        check_range("hidden_size", self.hidden_size, 64, 65536)
        check_range("num_heads", self.num_heads, 1, 1024)
        check_range("num_kv_heads", self.num_kv_heads, 1, self.num_heads)
        check_range("head_dim", self.head_dim, 16, 1024)
        check_range("ffn_size", self.ffn_size, 64, 1 << 20)
        check_range("vocab_size", self.vocab_size, 1, 1 << 22)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.num_experts == 0:
            if self.experts_per_token != 0:
                raise ValueError(f"experts_per_token={self.experts_per_token} needs num_experts > 0; "
                                 "allowed 0 for a dense model")
            for key in ("shared_experts", "first_dense_layers"):
                if getattr(self, key) != 0:
                    raise ValueError(f"{key}={getattr(self, key)} needs num_experts > 0; allowed 0 for a dense model")
        else:
            check_range("num_experts", self.num_experts, 2, 1024)
            check_range("experts_per_token", self.experts_per_token, 1, self.num_experts)
            check_range("shared_experts", self.shared_experts, 0, MODEL_LIMITS["shared_experts"][1])
            check_range("first_dense_layers", self.first_dense_layers, 0, self.num_layers - 1)
        if self.dense_ffn_size != 0:
            check_range("dense_ffn_size", self.dense_ffn_size, 64, 1 << 20)
        if self.kv_lora_rank == 0:
            for key in ("q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, key) != 0:
                    raise ValueError(f"{key}={getattr(self, key)} needs kv_lora_rank > 0 (multi-head latent "
                                     "attention); allowed 0 for multi-head or grouped-query attention")
        else:
            check_range("kv_lora_rank", self.kv_lora_rank, 16, MODEL_LIMITS["kv_lora_rank"][1])
            if self.q_lora_rank != 0:
                check_range("q_lora_rank", self.q_lora_rank, 16, MODEL_LIMITS["q_lora_rank"][1])
            check_range("qk_rope_head_dim", self.qk_rope_head_dim, 0, 1024)
            check_range("qk_nope_head_dim", self.qk_nope_head_dim, 1, 1024)
            check_range("v_head_dim", self.v_head_dim, 1, 1024)
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
                raise ValueError(f"head_dim={self.head_dim} must be qk_nope_head_dim + qk_rope_head_dim = "
                                 f"{self.qk_nope_head_dim + self.qk_rope_head_dim} for multi-head latent attention")
        for key in ("max_context_tokens", "mtp_layers"):
            check_range(key, getattr(self, key), *MODEL_LIMITS[key])

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (a compressed latent KV cache)."""
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts (0 for a dense model)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    def _per_layer(self, total: int) -> int | float:
        """A whole-model count as a mean per layer: exact (an int) when every layer is alike."""
        return total // self.num_layers if total % self.num_layers == 0 else total / self.num_layers

    # --- parameter counts -------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        if self.is_mla:
            # DeepSeek-V3 modeling code (DeepseekV3Attention): q_a_proj (hidden x q_lora_rank) and q_b_proj
            # (q_lora_rank x heads x (nope + rope)), or q_proj without the bottleneck; kv_a_proj_with_mqa
            # (hidden x (kv_lora_rank + rope)); kv_b_proj (kv_lora_rank x heads x (nope + v)); o_proj
            # (heads x v x hidden). Their RMSNorms (q_a_layernorm, kv_a_layernorm) are in non_linear_params.
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = self.hidden_size * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
            else:
                q = self.hidden_size * self.num_heads * qk
            kv_a = self.hidden_size * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * self.hidden_size
            return q + kv_a + kv_b + o
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + bias

    @property
    def expert_params(self) -> int:
        """One gated MLP (gate, up, down): the dense MLP, or one expert."""
        return 3 * self.hidden_size * self.ffn_size

    @property
    def dense_mlp_params(self) -> int:
        """The gated MLP of a dense layer of a mixture of experts (DeepSeek's first_k_dense_replace layers)."""
        return 3 * self.hidden_size * (self.dense_ffn_size or self.ffn_size)

    @property
    def router_params_per_layer(self) -> int:
        """The router of one layer with experts."""
        return self.hidden_size * self.num_experts

    @property
    def router_params_mean_per_layer(self) -> int | float:
        """The routers as a mean per layer (layers without experts have none)."""
        return self._per_layer(self.num_moe_layers * self.router_params_per_layer)

    @property
    def replicated_attn_params_per_layer(self) -> int:
        """MLA's down-projections, which tensor parallelism does not split: q_a_proj (hidden x q_lora_rank) and
        kv_a_proj_with_mqa (hidden x (kv_lora_rank + rope)); 0 without MLA. vLLM builds both as ReplicatedLinear
        (vllm/model_executor/models/deepseek_v2.py, DeepseekV2Attention.__init__; its MLA path fuses them into
        fused_qkv_a_proj with disable_tp=True), as SGLang does (python/sglang/srt/models/deepseek_v2.py): every TP
        rank holds and runs them whole."""
        if not self.is_mla:
            return 0
        return self.hidden_size * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def always_run_params_per_moe_layer(self) -> int:
        """What every token of a layer with experts runs besides its top-k: the router and the shared experts."""
        return self.router_params_per_layer + self.shared_experts * self.expert_params

    @property
    def mlp_params_per_layer(self) -> int | float:
        """Every expert (what memory holds); the mean over layers when some are dense."""
        if self.is_moe:
            moe = self.num_experts * self.expert_params + self.always_run_params_per_moe_layer
            return self._per_layer(self.num_moe_layers * moe + self.first_dense_layers * self.dense_mlp_params)
        return self.expert_params

    @property
    def active_mlp_params_per_layer(self) -> int | float:
        """The experts one token runs through (what its FLOPs use); the mean over layers when some are dense."""
        if self.is_moe:
            moe = self.experts_per_token * self.expert_params + self.always_run_params_per_moe_layer
            return self._per_layer(self.num_moe_layers * moe + self.first_dense_layers * self.dense_mlp_params)
        return self.expert_params

    @property
    def step_read_params_per_layer(self) -> int | float:
        """Weights every step reads whatever its tokens route to, mean per layer: attention, routers, shared
        experts and dense layers' MLPs (the routed experts a step touches come on top; a dense model: all)."""
        if not self.is_moe:
            return self.linear_params_per_layer
        return self.attn_params_per_layer + self._per_layer(
            self.num_moe_layers * self.always_run_params_per_moe_layer + self.first_dense_layers * self.dense_mlp_params)

    @property
    def moe_layer_fraction(self) -> float:
        """Share of layers with routed experts (1.0 unless some layers are dense)."""
        return self.num_moe_layers / self.num_layers if self.is_moe else 0.0

    @property
    def linear_params_per_layer(self) -> int | float:
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def active_linear_params_per_layer(self) -> int | float:
        return self.attn_params_per_layer + self.active_mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def non_linear_params(self) -> int:
        """Embeddings, LM head and norms (MLA's q_a and kv_a RMSNorms too): kept in BF16 by FP8 checkpoints."""
        head = 0 if self.tied_embeddings else self.embedding_params
        norms = (2 * self.num_layers + 1) * self.hidden_size
        if self.is_mla:
            norms += self.num_layers * (self.q_lora_rank + self.kv_lora_rank)
        return self.embedding_params + head + norms

    @property
    def num_params(self) -> int:
        return round(self.num_layers * self.linear_params_per_layer) + self.non_linear_params

    @property
    def active_params(self) -> int:
        """Parameters one token runs through (= num_params for a dense model), the input embedding included (as
        Mixtral's 12.9B and Qwen3-30B-A3B's 3.3B count; DeepSeek's 36.6B leaves the embedding lookup out)."""
        return round(self.num_layers * self.active_linear_params_per_layer) + self.non_linear_params

    def kv_bytes_per_token(self, kv_bytes_per_element: float = 2.0) -> float:
        """The KV cache of every layer for one token, whole model: K and V of every KV head, or for multi-head
        latent attention the latent and the shared RoPE key, (kv_lora_rank + qk_rope_head_dim) x layers
        (DeepSeek-V3 in BF16: (512 + 64) x 61 x 2 = 70,272 bytes)."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * kv_bytes_per_element
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes_per_element


# A physical node holds 8 GPUs on NVLink (HGX / DGX); tensor parallelism within it, or (TP 16) one replica over two
# such nodes, whose all-reduces cross the network between them (costmodel.allreduce_table)
GPUS_PER_NODE = 8
TP_DEGREES = (1, 2, 4, 8, 16)
TWO_NODE_GPUS = 2 * GPUS_PER_NODE
NODE_GPU_COUNTS = (*range(1, GPUS_PER_NODE + 1), TWO_NODE_GPUS)  # what num_gpus may be


@dataclass(frozen=True)
class Node:
    """A serving unit of ``num_gpus`` identical GPUs split in tensor-parallel groups: one node of up to 8 GPUs on
    NVLink, or two such nodes (16 GPUs) serving TP 16 groups across the network between them."""

    gpu: GPU
    num_gpus: int = 8
    tp: int = 8

    def validate(self) -> None:
        self.gpu.validate()
        check_range("num_gpus", self.num_gpus, 1, TWO_NODE_GPUS)
        if GPUS_PER_NODE < self.num_gpus < TWO_NODE_GPUS or self.num_gpus != int(self.num_gpus):
            raise ValueError(f"num_gpus={shown(self.num_gpus)} is not allowed; allowed: 1 to {GPUS_PER_NODE} (one "
                             f"node) or {TWO_NODE_GPUS} (two nodes, for tp {TWO_NODE_GPUS})")
        if self.tp not in TP_DEGREES:
            raise ValueError(f"tp={self.tp!r} is not allowed; allowed: {', '.join(map(str, TP_DEGREES))}")
        if self.tp > self.num_gpus or self.num_gpus % self.tp:
            ok = [t for t in TP_DEGREES if t <= self.num_gpus and self.num_gpus % t == 0]
            raise ValueError(f"tp={self.tp} must divide num_gpus={self.num_gpus} (allowed tp: "
                             f"{', '.join(map(str, ok))}; tp {TWO_NODE_GPUS} needs num_gpus {TWO_NODE_GPUS})")

    @property
    def replicas(self) -> int:
        """Data-parallel model replicas on the node (num_gpus / tp)."""
        return self.num_gpus // self.tp

    @property
    def physical_nodes(self) -> int:
        """8-GPU nodes this unit spans: 1, or 2 for 16 GPUs."""
        return -(-self.num_gpus // GPUS_PER_NODE)

    @property
    def cross_node(self) -> bool:
        """Whether a tensor-parallel group spans two nodes (its all-reduces cross the network)."""
        return self.tp > GPUS_PER_NODE


# --- presets ---------------------------------------------------------------
GPUS: dict[str, GPU] = {
    # H100 SXM5 80GB (NVIDIA H100 datasheet): 989.4 TF BF16 dense, 1979 TF FP8 dense, 3.35 TB/s
    # HBM3, NVLink4 900 GB/s total = 450 GB/s per direction; 81,559 MiB as nvidia-smi reports;
    # PCIe Gen5 x16 ~55 GB/s usable.
    "h100-sxm": GPU("H100 SXM 80GB", 81559 * 2**20, 3.35e12, 989.4e12, 1978.9e12, 450e9, 55e9, "hopper"),
    # H200 SXM 141GB (NVIDIA H200 datasheet): same compute as H100, 4.8 TB/s HBM3e, NVLink4;
    # 143,771 MiB as nvidia-smi reports.
    "h200-sxm": GPU("H200 SXM 141GB", 143771 * 2**20, 4.8e12, 989.4e12, 1978.9e12, 450e9, 55e9, "hopper"),
    # B200 (NVIDIA HGX B200 datasheet, per GPU of the 8-GPU board: 2.25 PF BF16 dense and 4.5 PF
    # FP8 dense = half the sparse figures, 8 TB/s HBM3e, NVLink5 1.8 TB/s total = 900 GB/s per
    # direction); 183,359 MiB as nvidia-smi reports; host link PCIe Gen5 x16 ~55 GB/s usable.
    # FP4 (NVIDIA HGX B200 datasheet: 144 PFLOPS FP4 with sparsity for 8 GPUs = 18 PF per GPU, 9 PF dense)
    "b200": GPU("B200 180GB", 183359 * 2**20, 8.0e12, 2250e12, 4500e12, 900e9, 55e9, "blackwell", 9000e12),
    # A100 SXM4 80GB (NVIDIA A100 datasheet): 312 TF BF16 dense, no FP8, 2.039 TB/s HBM2e, NVLink3
    # 600 GB/s total = 300 GB/s per direction, PCIe Gen4 x16 ~25 GB/s usable; 81,920 MiB reported.
    "a100-80gb": GPU("A100 SXM 80GB", 81920 * 2**20, 2.039e12, 312e12, 0.0, 300e9, 25e9, "ampere"),
}

# Context lengths (max_context_tokens) are each config.json's max_position_embeddings, as vLLM derives its
# max_model_len (Llama 3.1's llama3 RoPE scaling leaves it; DeepSeek-V3's YaRN gives 4,096 x 40 = 163,840 =
# max_position_embeddings; Qwen2.5's 128k needs a YaRN rope_scaling its published configs do not set).
MODELS: dict[str, Model] = {
    # Qwen/Qwen2.5-72B-Instruct config.json
    "qwen2.5-72b": Model("Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, False, True, max_context_tokens=32768),
    # meta-llama/Llama-3.1-70B-Instruct config.json
    "llama-3.1-70b": Model("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, max_context_tokens=131072),
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama-3.1-8b": Model("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, max_context_tokens=131072),
    # Qwen/Qwen2.5-7B-Instruct config.json (7.62B parameters)
    "qwen2.5-7b": Model("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, False, True, max_context_tokens=32768),
    # Qwen/Qwen2.5-32B-Instruct config.json (32.8B parameters by its shapes)
    "qwen2.5-32b": Model("Qwen2.5-32B", 64, 5120, 40, 8, 128, 27648, 152064, False, True, max_context_tokens=32768),
    # meta-llama/Llama-3.1-405B-Instruct config.json (405.9B parameters): BF16 needs ~95 GiB per
    # GPU at TP 8, so it runs in FP8 on 8xH100 or in either precision on 8xH200.
    "llama-3.1-405b": Model("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256, max_context_tokens=131072),
    # mistralai/Mixtral-8x7B-Instruct-v0.1 config.json: 8 experts of width 14336, top-2
    # routing; 46.7B parameters in memory, 12.9B active per token.
    "mixtral-8x7b": Model("Mixtral-8x7B", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2,
                           max_context_tokens=32768),
    # Qwen/Qwen3-30B-A3B config.json: 128 experts of width 768 (moe_intermediate_size), top-8;
    # 30.5B parameters in memory, 3.3B active (its q/k RMSNorm weights, 256 per layer, omitted);
    # max_position_embeddings 40960.
    "qwen3-30b-a3b": Model("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 768, 151936, num_experts=128,
                           experts_per_token=8, max_context_tokens=40960),
    # deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, hidden_size 7168, num_attention_heads 128,
    # num_key_value_heads 128, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128, n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, moe_intermediate_size
    # 2048, first_k_dense_replace 3, intermediate_size 18432, vocab_size 129280, tie_word_embeddings false.
    # 671.0B parameters, 37.5B active (36.6B without the input embedding, as DeepSeek counts: 671B / 37B in the
    # technical report, arXiv:2412.19437; 36.6B in the release's README_WEIGHTS.md); the MTP module
    # (num_nextn_predict_layers 1, 11.5B more) is left out of the weights, as vLLM loads it only for speculative
    # decoding (mtp_layers=1: what spec_decode 'mtp' runs).
    # Published in FP8 (quantization_config: fp8 e4m3, 128x128 blocks): 79 GiB per GPU at TP 8 (the replicated
    # q_a_proj, kv_a_proj_with_mqa and routers whole on every GPU: Deployment.layer_weight_bytes_per_gpu).
    "deepseek-v3": Model("DeepSeek-V3", 61, 7168, 128, 128, 192, 2048, 129280, num_experts=256,
                         experts_per_token=8, shared_experts=1, first_dense_layers=3, dense_ffn_size=18432,
                         kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
                         v_head_dim=128, max_context_tokens=163840, mtp_layers=1),
    # moonshotai/Kimi-K2-Instruct config.json (architectures DeepseekV3ForCausalLM, model_type kimi_k2):
    # num_hidden_layers 61, hidden_size 7168, num_attention_heads 64, num_key_value_heads 64, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, n_routed_experts 384,
    # num_experts_per_tok 8, n_shared_experts 1, moe_intermediate_size 2048, first_k_dense_replace 1,
    # intermediate_size 18432, vocab_size 163840, tie_word_embeddings false, max_position_embeddings 131072,
    # num_nextn_predict_layers 0 (no MTP module). 1.026T parameters (Moonshot: "1T
    # total"), 32.9B active (31.7B without the input embedding; Moonshot: "32B activated"). Published in FP8.
    "kimi-k2": Model("Kimi-K2", 61, 7168, 64, 64, 192, 2048, 163840, num_experts=384, experts_per_token=8,
                     shared_experts=1, first_dense_layers=1, dense_ffn_size=18432, kv_lora_rank=512,
                     q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                     max_context_tokens=131072),
}
# The precision each model's weights are published in, where it is not BF16 (the specs command's default)
PUBLISHED_PRECISION: dict[str, str] = {"deepseek-v3": "fp8", "kimi-k2": "fp8"}

DEFAULT_GPU = "h100-sxm"
DEFAULT_MODEL = "qwen2.5-72b"


def gpu_preset(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"gpu={name!r} is unknown; allowed: {', '.join(GPUS)}") from None


def model_preset(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model={name!r} is unknown; allowed: {', '.join(MODELS)}") from None


@dataclass(frozen=True)
class Deployment:
    """A model served on a node: what memory it takes and how much KV cache is left."""

    node: Node = field(default_factory=lambda: Node(GPUS[DEFAULT_GPU]))
    model: Model = field(default_factory=lambda: MODELS[DEFAULT_MODEL])
    precision: str = "bf16"
    kv_dtype: str = "auto"  # "auto" = same as activations (BF16), or "fp8"
    gpu_memory_utilization: float = 0.9  # vLLM's default share of HBM it may use
    # Peak activation memory per GPU that vLLM's profiling run reserves; 2 GiB is typical
    # for a 70B model at TP 8 with an 8k token budget (vLLM start-up logs).
    activation_reserve_bytes: float = 2 * GIB
    kv_cache_tokens: int | None = None  # override: shrink the cache to this many tokens
    # Expert parallelism: 1 = every expert split over the TP group's GPUs (tensor-parallel experts); = tp: whole
    # experts spread over them, num_experts / ep per GPU (vLLM --enable-expert-parallel, SGLang --ep-size)
    ep: int = 1
    # Data-parallel attention (SGLang --enable-dp-attention with dp = tp): each GPU of the group runs attention for
    # its own share of the sequences with every head and the whole attention weights, and holds only those
    # sequences' KV cache (a latent is no longer replicated); the experts stay shared by the group
    dp_attention: bool = False

    def validate(self) -> None:
        self.node.validate()
        self.model.validate()
        self._validate_layout()
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
        self.node.gpu.peak_flops(self.precision)
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={self.kv_dtype!r} is not allowed; allowed: {', '.join(KV_DTYPES)}")
        check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.1, 1.0)
        if self.model.num_heads % self.node.tp:
            ok = [t for t in TP_DEGREES if self.model.num_heads % t == 0 and t <= self.node.num_gpus]
            raise ValueError(
                f"tp={self.node.tp} must divide the model's num_heads={self.model.num_heads}; "
                f"allowed tp: {', '.join(map(str, ok))}"
            )
        free = self.kv_bytes_available_per_gpu
        if free < self.kv_bytes_per_token_per_gpu * KV_BLOCK_TOKENS:
            need = (self.weight_bytes_per_gpu + self.activation_reserve_bytes) / GIB
            have = self.node.gpu.memory_bytes * self.gpu_memory_utilization / GIB
            raise ValueError(
                f"model {self.model.name} in {self.precision} does not fit on {self.node.gpu.name} "
                f"with tp={self.node.tp}: it needs {need:.1f} GiB per GPU for weights and "
                f"activations but {have:.1f} GiB are usable; {self._fit_hint()}"
            )
        if self.kv_cache_tokens is not None:
            check_range("kv_cache_tokens", self.kv_cache_tokens, KV_BLOCK_TOKENS, self.kv_capacity_tokens_max)

    def _validate_layout(self) -> None:
        """Expert parallelism and DP attention: a mixture of experts only; ep = 1 or the TP degree."""
        m, tp = self.model, self.node.tp
        if not isinstance(self.ep, int) or isinstance(self.ep, bool) or self.ep < 1:
            raise ValueError(f"ep={shown(self.ep)} is not allowed; allowed: 1 or tp={tp}")
        if self.ep != 1:
            if not m.is_moe:
                raise ValueError(f"ep={self.ep} needs a mixture-of-experts model; {m.name} is dense: allowed ep 1")
            if self.ep != tp:
                raise ValueError(f"ep={self.ep} is not allowed with tp={tp}; allowed: 1 (experts split by tensor "
                                 f"parallelism) or {tp} (= tp: whole experts spread over the group's GPUs)")
            if m.num_experts % self.ep:
                raise ValueError(f"ep={self.ep} must divide {m.name}'s num_experts={m.num_experts}")
        if not isinstance(self.dp_attention, bool):
            raise ValueError(f"dp_attention={shown(self.dp_attention)} is not true or false")
        if self.dp_attention:
            if not m.is_moe:
                raise ValueError(f"dp_attention needs a mixture-of-experts model (the experts are what the group "
                                 f"shares); {m.name} is dense: use more replicas (smaller tp) instead")
            if tp == 1:
                raise ValueError("dp_attention needs tp > 1 (attention replicated over the group's GPUs); "
                                 f"allowed with tp {', '.join(map(str, TP_DEGREES[1:]))}")

    @property
    def attention_ranks(self) -> int:
        """GPUs that split the group's sequences for attention: tp with DP attention, else 1 (all run all)."""
        return self.node.tp if self.dp_attention else 1

    def _fit_hint(self) -> str:
        """What would make the model fit: more GPUs per replica, FP8, or a larger GPU."""
        hints = []
        for tp in (2, 4, 8):
            if self.node.tp < tp <= self.node.num_gpus and self.model.num_heads % tp == 0:
                if replace(self, node=replace(self.node, tp=tp))._fits():
                    hints.append(f"tp={tp}")
                    break
        if self.precision == "bf16" and self.node.gpu.peak_fp8_flops > 0:
            for tp in sorted({self.node.tp, 8}):
                if tp <= self.node.num_gpus and replace(self, precision="fp8", node=replace(self.node, tp=tp))._fits():
                    hints.append("precision fp8" + ("" if tp == self.node.tp else f" with tp={tp}"))
                    break
        if hints:
            return "it fits with " + " or ".join(hints)
        where = "no tensor-parallel degree or precision on this node fits it"
        two = self._fits_two_nodes()
        elsewhere = self._fits_elsewhere()
        if two:
            where += f"; it fits with {two}"
        if elsewhere:
            return where + ("; or" if two else ";") + " use a GPU with more memory: it fits on " + " or ".join(elsewhere)
        return where + ("; or" if two else ";") + " use a GPU with more memory"

    def _fits_two_nodes(self) -> str:
        """'tp=16 over two nodes (num_gpus=16)' (with the precision if another) when one node of 8 is too small but a
        TP 16 replica over two fits; else ''."""
        if self.node.num_gpus != GPUS_PER_NODE or self.model.num_heads % TWO_NODE_GPUS:
            return ""
        for precision in sorted({self.precision, "fp8"}, key=PRECISIONS.index):
            if precision == "fp8" and self.node.gpu.peak_fp8_flops <= 0:
                continue
            if replace(self, precision=precision, node=Node(self.node.gpu, TWO_NODE_GPUS, TWO_NODE_GPUS))._fits():
                return (f"tp={TWO_NODE_GPUS} over two nodes (num_gpus={TWO_NODE_GPUS})"
                        + ("" if precision == self.precision else f" in {precision}"))
        return ""

    def _fits_elsewhere(self) -> list[str]:
        """The preset GPUs (as many as this node has, up to TP 8) on which the model fits: the lowest precision
        and TP degree that do, e.g. '8x H200 SXM 141GB in fp8 with tp=8'."""
        out = []
        n = self.node.num_gpus
        for gpu in GPUS.values():
            if gpu == self.node.gpu or gpu.memory_bytes <= self.node.gpu.memory_bytes:
                continue
            found = None
            for precision in sorted({self.precision, "fp8"}, key=PRECISIONS.index):
                if precision == "fp8" and gpu.peak_fp8_flops <= 0 or precision == "nvfp4" and gpu.peak_fp4_flops <= 0:
                    continue
                for tp in (1, 2, 4, 8):
                    if tp <= n and n % tp == 0 and self.model.num_heads % tp == 0 and replace(
                            self, precision=precision, node=Node(gpu, n, tp))._fits():
                        found = (precision, tp)
                        break
                if found:
                    break
            if found:
                out.append(f"{n}x {gpu.name} in {found[0]} with tp={found[1]}")
        return out

    def _fits(self) -> bool:
        return self.kv_bytes_available_per_gpu >= self.kv_bytes_per_token_per_gpu * KV_BLOCK_TOKENS

    @property
    def bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT[self.precision]

    @property
    def kv_bytes_per_element(self) -> float:
        """1 byte with an FP8 KV cache; NVFP4 checkpoints serve with an FP8 KV cache (NVIDIA ModelOpt's NVFP4
        exports write hf_quant_config.json with quant_algo NVFP4, group_size 16, kv_cache_quant_algo FP8), else 2."""
        return 1.0 if self.kv_dtype == "fp8" or self.precision == "nvfp4" else 2.0

    def layer_weight_bytes_per_gpu(self, params_per_layer: float) -> float:
        """Bytes on one GPU of ``params_per_layer`` linear parameters per layer (a mean; they include the layer's
        attention and routers): the replicated layers whole on every rank, the router in BF16, the rest split
        over the TP group (the attention projections whole under DP attention).

        Replicated: MLA's q_a_proj and kv_a_proj_with_mqa (Model.replicated_attn_params_per_layer) and the MoE
        router, which vLLM builds as GateLinear / ReplicatedLinear with quant_config=None (deepseek_v2.py,
        DeepseekV2MoE.__init__; qwen3_moe.py and mixtral.py alike): unquantized, so BF16 in FP8 deployments."""
        m, tp, bpw = self.model, self.node.tp, self.bytes_per_weight
        replicated, router = m.replicated_attn_params_per_layer, m.router_params_mean_per_layer
        split = params_per_layer - replicated - router
        out = split * bpw / tp + replicated * bpw + router * ROUTER_BYTES_PER_WEIGHT
        if self.dp_attention:  # the attention projections whole on every GPU, the rest split over the group
            out += (m.attn_params_per_layer - replicated) * bpw * (tp - 1) / tp
        return out

    def layer_params_run_per_gpu(self, params_per_layer: float) -> float:
        """Of ``params_per_layer`` parameters one token runs through per layer (a mean; attention and routers
        included), those one GPU computes: the replicated layers whole, the rest a 1/tp share. Under DP attention
        each GPU runs the whole attention for its own 1/tp of the tokens (a 1/tp share per token of the step),
        the router for every token (gathered before the experts)."""
        m, tp = self.model, self.node.tp
        whole = m.router_params_mean_per_layer + (0 if self.dp_attention else m.replicated_attn_params_per_layer)
        return params_per_layer / tp + whole * (1.0 - 1.0 / tp)

    @property
    def linear_weight_bytes_per_gpu(self) -> float:
        """Transformer-block linear layers (attention projections, routers, MLP or experts) per GPU."""
        return self.model.num_layers * self.layer_weight_bytes_per_gpu(self.model.linear_params_per_layer)

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Every weight per GPU. FP8 checkpoints (vLLM ``quantization=fp8``, the FP8 releases of
        Llama 3.1) quantize only the transformer-block linear layers; embeddings, LM head and
        norms stay BF16."""
        return self.linear_weight_bytes_per_gpu + self.model.non_linear_params * BYTES_PER_WEIGHT["bf16"] / self.node.tp

    @property
    def kv_bytes_per_token(self) -> float:
        """Whole model, all TP ranks together."""
        return self.model.kv_bytes_per_token(self.kv_bytes_per_element)

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        if self.dp_attention:
            # each token's KV (every head, or the whole latent) lives on the one GPU whose attention serves its
            # sequence: per GPU of the group, a token costs its whole KV over the group's GPUs
            return self.model.kv_bytes_per_token(self.kv_bytes_per_element) / self.node.tp
        if self.model.is_mla:
            # one latent per token serves every head: each TP rank holds all of it (vLLM's and SGLang's MLA
            # backends under tensor parallelism replicate the latent cache; SGLang's DP attention avoids that)
            return self.model.kv_bytes_per_token(self.kv_bytes_per_element)
        # KV heads are split across TP ranks (replicated when tp > num_kv_heads)
        heads_per_gpu = max(1, self.model.num_kv_heads // self.node.tp)
        return 2 * self.model.num_layers * heads_per_gpu * self.model.head_dim * self.kv_bytes_per_element

    @property
    def kv_bytes_available_per_gpu(self) -> float:
        return (
            self.node.gpu.memory_bytes * self.gpu_memory_utilization
            - self.weight_bytes_per_gpu
            - self.activation_reserve_bytes
        )

    @property
    def kv_capacity_tokens_max(self) -> int:
        blocks = int(max(0.0, self.kv_bytes_available_per_gpu) // (self.kv_bytes_per_token_per_gpu * KV_BLOCK_TOKENS))
        return blocks * KV_BLOCK_TOKENS

    @property
    def kv_capacity_blocks(self) -> int:
        """Blocks of one replica's KV cache (the override applied)."""
        tokens = self.kv_capacity_tokens_max
        if self.kv_cache_tokens is not None:
            tokens = min(tokens, self.kv_cache_tokens)
        return tokens // KV_BLOCK_TOKENS

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_capacity_blocks * KV_BLOCK_TOKENS

    def with_kv_cache_tokens(self, tokens: int | None) -> "Deployment":
        return replace(self, kv_cache_tokens=tokens)


def deployment(gpu: str | GPU = DEFAULT_GPU, model: str | Model = DEFAULT_MODEL, tp: int = 8,
               num_gpus: int | None = None, precision: str = "bf16", kv_dtype: str = "auto",
               kv_cache_tokens: int | None = None, ep: int = 1, dp_attention: bool = False) -> Deployment:
    """Build a validated Deployment from preset ids as users type them (or custom GPU / Model objects)."""
    g = gpu if isinstance(gpu, GPU) else gpu_preset(gpu)
    m = model if isinstance(model, Model) else model_preset(model)
    n = max(GPUS_PER_NODE, tp) if num_gpus is None else num_gpus  # TP 16: two nodes
    d = Deployment(Node(g, n, tp), m, precision, kv_dtype,
                   kv_cache_tokens=kv_cache_tokens, ep=ep, dp_attention=dp_attention)
    d.validate()
    return d


# --- custom GPUs and models (dashboard form, --gpu-json / --model-json) -------------------
# GPU JSON: figures in the units datasheets use.
GPU_JSON_FIELDS = {
    "name": (str, None),
    "memory_gib": (float, None),  # usable HBM, GiB (nvidia-smi's MiB / 1024)
    "hbm_bandwidth_tb_s": (float, None),  # peak HBM bandwidth, TB/s
    "peak_bf16_tflops": (float, None),  # dense BF16 tensor-core peak, TFLOP/s
    "peak_fp8_tflops": (float, 0.0),  # dense FP8 peak, TFLOP/s (0 = no FP8)
    "nvlink_gb_s": (float, 450.0),  # NVLink per direction per GPU, GB/s (H100's by default)
    "pcie_gb_s": (float, 55.0),  # usable host link, GB/s (PCIe Gen5 x16 by default)
    "arch": (str, ""),  # "hopper" applies the measured H100 GEMM tile factors; "" = smooth model only
    "peak_fp4_tflops": (float, 0.0),  # dense FP4 (NVFP4) peak, TFLOP/s (0 = no FP4)
}
# JSON field -> (GPU attribute, scale to SI units, lowest, highest in the JSON's units): the one place the
# ranges are defined (GPU.validate checks the attributes against them; the dashboard's form uses the same)
GPU_JSON_UNITS: dict[str, tuple[str, float, float, float]] = {
    "memory_gib": ("memory_bytes", GIB, 1.0, 1024.0),
    "hbm_bandwidth_tb_s": ("hbm_bw_Bps", 1e12, 0.1, 100.0),
    "peak_bf16_tflops": ("peak_bf16_flops", 1e12, 1.0, 1e5),
    "peak_fp8_tflops": ("peak_fp8_flops", 1e12, 1.0, 1e5),  # or 0 = no FP8
    "nvlink_gb_s": ("nvlink_Bps", 1e9, 1.0, 1e4),
    "pcie_gb_s": ("pcie_Bps", 1e9, 0.1, 1e3),
    "peak_fp4_tflops": ("peak_fp4_flops", 1e12, 1.0, 1e5),  # or 0 = no FP4
}
GPU_ARCHS = ("", "hopper", "blackwell", "ampere")
# Model field -> (lowest, highest) for the integer fields (num_kv_heads is also held to num_heads, and
# experts_per_token to num_experts, by Model.validate)
MODEL_LIMITS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 1000),
    "hidden_size": (64, 65536),
    "num_heads": (1, 1024),
    "num_kv_heads": (1, 1024),
    "head_dim": (16, 1024),
    "ffn_size": (64, 1 << 20),
    "vocab_size": (1, 1 << 22),
    "num_experts": (0, 1024),
    "experts_per_token": (0, 1024),
    "shared_experts": (0, 64),
    "first_dense_layers": (0, 1000),
    "dense_ffn_size": (0, 1 << 20),
    "kv_lora_rank": (0, 65536),
    "q_lora_rank": (0, 65536),
    "qk_rope_head_dim": (0, 1024),
    "qk_nope_head_dim": (0, 1024),
    "v_head_dim": (0, 1024),
    "max_context_tokens": (0, 1 << 24),  # 0 = not stated; up to 16M tokens
    "mtp_layers": (0, 16),
}
MODEL_JSON_FIELDS = {f.name: f for f in fields(Model)}
# Hugging Face config.json keys -> Model fields (first key found wins)
HF_KEYS = {
    "num_layers": ("num_hidden_layers",),
    "hidden_size": ("hidden_size",),
    "num_heads": ("num_attention_heads",),
    "num_kv_heads": ("num_key_value_heads", "num_attention_heads"),
    "ffn_size": ("moe_intermediate_size", "intermediate_size"),
    "vocab_size": ("vocab_size",),
    "tied_embeddings": ("tie_word_embeddings",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",),
    # DeepSeek-V2/V3 and Kimi-K2 (DeepseekV3ForCausalLM): shared experts, leading dense layers, MLA
    "shared_experts": ("n_shared_experts",),
    "first_dense_layers": ("first_k_dense_replace",),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "mtp_layers": ("num_nextn_predict_layers",),
}
# config.json keys vLLM reads a model's longest sequence from (the smallest found wins; vllm/config.py,
# _get_and_verify_max_len)
HF_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                   "max_sequence_length", "max_seq_length", "seq_len")
# RoPE scalings that leave the context vLLM derives as it is (the rest multiply it by their factor)
HF_UNSCALED_ROPE = ("su", "longrope", "llama3")
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
HF_QKV_BIAS_TYPES = ("qwen2",)  # architectures whose attention has q/k/v biases
# Hugging Face architectures whose shapes Model describes exactly (decoder-only, multi-head, grouped-query or
# multi-head latent attention, a gated MLP or top-k experts, DeepSeek's shared experts and leading dense layers),
# with their model_type. Anything else is refused rather than approximated: state-space models have no KV cache
# per token, Qwen2-MoE's shared expert has its own width and gate, multimodal wrappers hold a vision tower and
# keep the language model in text_config.
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",  # also Kimi-K2's (model_type kimi_k2)
}
HF_MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
HF_MARKERS = ("architectures", "model_type", "num_hidden_layers", "text_config")  # keys that mark a config.json
MAX_SPEC_BYTES = 1 << 20  # a config.json is a few KB


def _number(name: str, value, kind, low=None, high=None):
    """``value`` as an int (``kind is int``) or a finite float, within [low, high] when given; errors name the
    field as the user wrote it and quote at most MAX_SHOWN_CHARS of the value."""
    if isinstance(value, str):
        hint = ""
        if value.strip() and not value.isascii():
            hint = " (it has non-ASCII characters, e.g. full-width digits)"
        raise ValueError(f"{name}={shown(value)} is text, not a number{hint}; write it as a JSON number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={shown(value)} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}={shown(value)} is not a finite number")
    allowed = "" if low is None else f"; allowed {low:g} to {high:g}" if kind is float else f"; allowed {low} to {high}"
    if low is not None and not (low <= value <= high):  # before int(): 1e30 is a whole number, but far too big
        raise ValueError(f"{name}={shown(value)} is out of range{allowed}")
    if kind is int:
        if value != int(value):
            raise ValueError(f"{name}={shown(value)} is not a whole number{allowed}")
        return int(value)
    return float(value)


def _text(name: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}={shown(value)} is not text; write it as a JSON string")
    return value


def _names(keys, limit: int = MAX_SHOWN_CHARS) -> str:
    """Field names for a message: as many as fit in ``limit`` characters, then how many more."""
    keys = [str(k) for k in keys]
    out, used = [], 0
    for k in keys:
        k = k if len(k) <= 40 else k[:40] + "..."
        if used + len(k) > limit and out:
            break
        out.append(k)
        used += len(k) + 2
    more = len(keys) - len(out)
    return ", ".join(out) + (f" and {more:,} more" if more else "")


def gpu_from_dict(d: dict) -> GPU:
    """A validated GPU from ``GPU_JSON_FIELDS`` (unknown keys are an error naming them)."""
    if not isinstance(d, dict):
        raise ValueError(f"a GPU description must be a JSON object, not {shown(d)}")
    unknown = [k for k in d if k not in GPU_JSON_FIELDS]
    if unknown:
        raise ValueError(f"unknown GPU field(s) {_names(unknown)}; allowed: {', '.join(GPU_JSON_FIELDS)}")
    v = {}
    for key, (kind, default) in GPU_JSON_FIELDS.items():
        if key not in d:
            if default is None:
                raise ValueError(f"GPU field {key} is missing; required: "
                                 + ", ".join(k for k, (_, dflt) in GPU_JSON_FIELDS.items() if dflt is None))
            v[key] = default
        elif kind is str:
            v[key] = _text(key, d[key])
        else:
            _, _, low, high = GPU_JSON_UNITS[key]
            if key in ("peak_fp8_tflops", "peak_fp4_tflops") and d[key] == 0 and not isinstance(d[key], bool):
                v[key] = 0.0
                continue
            v[key] = _number(key, d[key], float, low, high)
    _check_name(v["name"])
    if v["arch"] not in GPU_ARCHS:
        raise ValueError(f"arch={shown(v['arch'])} is not allowed; allowed: {', '.join(repr(a) for a in GPU_ARCHS)}")

    def whole(key: str) -> float:  # bytes, bytes/s and FLOP/s are whole numbers (exact JSON round trips)
        return float(round(v[key] * GPU_JSON_UNITS[key][1]))

    gpu = GPU(v["name"], whole("memory_gib"), whole("hbm_bandwidth_tb_s"), whole("peak_bf16_tflops"),
              whole("peak_fp8_tflops"), whole("nvlink_gb_s"), whole("pcie_gb_s"), v["arch"], whole("peak_fp4_tflops"))
    gpu.validate()
    return gpu


def gpu_to_dict(gpu: GPU) -> dict:
    """The GPU_JSON_FIELDS form of a GPU (the inverse of gpu_from_dict)."""
    return {"name": gpu.name, "memory_gib": gpu.memory_bytes / GIB, "hbm_bandwidth_tb_s": gpu.hbm_bw_Bps / 1e12,
            "peak_bf16_tflops": gpu.peak_bf16_flops / 1e12, "peak_fp8_tflops": gpu.peak_fp8_flops / 1e12,
            "nvlink_gb_s": gpu.nvlink_Bps / 1e9, "pcie_gb_s": gpu.pcie_Bps / 1e9, "arch": gpu.arch,
            "peak_fp4_tflops": gpu.peak_fp4_flops / 1e12}


def _supported_architectures() -> str:
    return ", ".join(HF_ARCHITECTURES)


def _check_architecture(d: dict) -> None:
    """Refuse a config.json whose architecture Model cannot describe exactly, saying why and what is supported."""
    archs = d.get("architectures")
    if isinstance(archs, str):
        archs = [archs]
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ValueError(f"architectures={shown(d.get('architectures'))} is not a list of names; "
                         f"supported architectures: {_supported_architectures()}")
    model_type = d.get("model_type")
    known_types = set(HF_ARCHITECTURES.values())
    if archs:
        what = f"architectures={_names(archs)}"
        names = " ".join(archs).lower()
        ok = all(a in HF_ARCHITECTURES for a in archs)
    elif isinstance(model_type, str):
        what = f"model_type={shown(model_type)}"
        names = model_type.lower()
        ok = model_type in known_types
    else:
        raise ValueError("config.json names neither its architectures nor its model_type; supported "
                         f"architectures: {_supported_architectures()} (or write the model with Model's fields: "
                         f"{', '.join(MODEL_JSON_FIELDS)})")
    deepseek = bool(archs) and all(a in HF_MLA_ARCHITECTURES for a in archs) or (
        not archs and model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"))
    if not archs and model_type == "kimi_k2":
        ok = True
    if ok:  # a supported architecture, but perhaps not this config of it: say what does not match
        if "text_config" in d or "vision_config" in d:
            why = ("this config.json also holds a vision or audio model (text_config, vision_config): give the "
                   "language model's own config")
        elif "kv_lora_rank" in d and not deepseek:
            why = (f"this config.json has kv_lora_rank (multi-head latent attention), and "
                   f"{_names(archs or [model_type])} has no multi-head latent attention; MLA is modelled for "
                   f"{' and '.join(HF_MLA_ARCHITECTURES)}: name the architecture the weights are, or leave "
                   "kv_lora_rank out")
        elif d.get("use_sliding_window") is True or (
                "mistral" in names and isinstance(d.get("sliding_window"), int) and d.get("sliding_window")):
            why = "its sliding-window attention caches only the last window of tokens, which is not modelled"
        elif d.get("mlp_only_layers") or d.get("decoder_sparse_step") not in (None, 1):
            why = "it mixes dense and mixture-of-experts layers, which is not modelled"
        elif deepseek and d.get("moe_layer_freq") not in (None, 1):
            why = "its experts sit in every moe_layer_freq-th layer only, which is not modelled"
        elif deepseek and not d.get("kv_lora_rank"):
            why = "a DeepSeek model without multi-head latent attention (kv_lora_rank) is not modelled"
        else:
            return
        raise ValueError(f"{what} is a supported architecture, but not as this config.json describes it: {why}")
    if any(w in names for w in ("mamba", "jamba", "zamba", "rwkv", "recurrent", "ssm")) or "state_size" in d \
            or "ssm_cfg" in d:
        why = "a state-space or recurrent model (Mamba, Jamba, RWKV) keeps no per-token KV cache in those layers"
    elif "kv_lora_rank" in d or "deepseekv2" in names or "deepseekv3" in names or "deepseek_v" in names:
        why = ("its multi-head latent attention (MLA) is modelled for the DeepSeek-V2/V3 architectures only, "
               "whose other layers are known")
    elif "text_config" in d or "vision_config" in d or "forconditionalgeneration" in names:
        why = "a multimodal wrapper holds a vision or audio model besides the language model"
    else:
        why = "its layers are not known to match the shapes the simulator models"
    raise ValueError(f"{what} is not supported: {why}; supported architectures: {_supported_architectures()}")


def _hf_name(d: dict) -> str:
    """The model's name from ``_name_or_path`` (any length: a long local path keeps its last part, cut to
    MAX_NAME_CHARS), else its model_type."""
    for key in ("_name_or_path", "model_type"):
        name = d.get(key)
        if isinstance(name, str) and name.strip():
            name = name.strip()
            if len(name) > MAX_NAME_CHARS:
                name = name.rstrip("/").rsplit("/", 1)[-1] or name
            if len(name) > MAX_NAME_CHARS:
                name = name[: MAX_NAME_CHARS - 3] + "..."
            return name
    return "custom model"


def context_from_hf_config(d: dict) -> tuple[int, str] | None:
    """(tokens, where from): the longest sequence a config.json's model serves, as vLLM derives its max_model_len
    (vllm/config.py, ``_get_and_verify_max_len``): the smallest of HF_CONTEXT_KEYS, times the RoPE scaling's factor
    unless its type is one of HF_UNSCALED_ROPE (YaRN: its original_max_position_embeddings times the factor). None
    when the config states none of the keys."""
    found = [(_number(k, d[k], int, 1, MODEL_LIMITS["max_context_tokens"][1]), k)
             for k in HF_CONTEXT_KEYS if d.get(k) is not None]
    if not found:
        return None
    tokens, key = min(found)
    rope = d.get("rope_scaling")
    if isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in HF_UNSCALED_ROPE:
            factor = _number("rope_scaling.factor", rope.get("factor", 1.0), float, 1e-3, 1e4)
            if kind == "yarn" and rope.get("original_max_position_embeddings") is not None:
                tokens = _number("rope_scaling.original_max_position_embeddings",
                                 rope["original_max_position_embeddings"], int, *MODEL_LIMITS["max_context_tokens"])
                key = "rope_scaling.original_max_position_embeddings"
            tokens = int(tokens * factor)
            key = f"{key} x rope_scaling.factor"
            check_range(key, tokens, 1, MODEL_LIMITS["max_context_tokens"][1])
    return tokens, key


def _from_hf_config(d: dict) -> tuple[dict, dict[str, str]]:
    """Model fields from a Hugging Face config.json, and the config key each came from (for messages)."""
    _check_architecture(d)
    v: dict = {}
    source: dict[str, str] = {}
    for fname, keys in HF_KEYS.items():
        for k in keys:
            if d.get(k) is not None:
                v[fname], source[fname] = d[k], k
                break
    missing = [f for f in ("num_layers", "hidden_size", "num_heads", "ffn_size", "vocab_size") if f not in v]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(HF_KEYS[f][0] for f in missing)}")
    for fname in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_size", "vocab_size",
                  "num_experts", "experts_per_token", "shared_experts", "first_dense_layers",
                  "mtp_layers") + MLA_FIELDS:
        if fname in v:
            v[fname] = _number(source[fname], v[fname], int, *MODEL_LIMITS[fname])
    if v.get("kv_lora_rank"):
        # MLA: a query/key head is its non-RoPE part plus its RoPE part (transformers' DeepseekV3Config sets
        # head_dim to the RoPE part alone, so config.json's head_dim is not this); q_lora_rank null = no
        # query bottleneck (DeepSeek-V2-Lite)
        for fname in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if fname not in v:
                raise ValueError(f"config.json has kv_lora_rank but lacks {fname}")
        v["head_dim"] = v["qk_nope_head_dim"] + v["qk_rope_head_dim"]
        source["head_dim"] = "qk_nope_head_dim + qk_rope_head_dim"
        if v.get("num_experts") and v.get("first_dense_layers") and d.get("intermediate_size") is not None:
            v["dense_ffn_size"] = _number("intermediate_size", d["intermediate_size"], int,
                                          *MODEL_LIMITS["dense_ffn_size"])
            source["dense_ffn_size"] = "intermediate_size"
    else:
        for fname in MLA_FIELDS:
            v.pop(fname, None)
    if v.get("kv_lora_rank"):
        pass
    elif d.get("head_dim") is not None:
        v["head_dim"], source["head_dim"] = _number("head_dim", d["head_dim"], int, *MODEL_LIMITS["head_dim"]), "head_dim"
    else:
        v["head_dim"], source["head_dim"] = v["hidden_size"] // v["num_heads"], "hidden_size / num_attention_heads"
    bias = d.get("attention_bias", d.get("model_type") in HF_QKV_BIAS_TYPES)
    if not isinstance(bias, bool):
        raise ValueError(f"attention_bias={shown(bias)} is not true or false")
    v["qkv_bias"] = bias
    if not v.get("num_experts"):
        for fname in ("experts_per_token", "num_experts", "shared_experts", "first_dense_layers"):
            v.pop(fname, None)
        if v.get("kv_lora_rank") and d.get("intermediate_size") is not None:  # a dense MLA model: the MLP width
            v["ffn_size"] = _number("intermediate_size", d["intermediate_size"], int, *MODEL_LIMITS["ffn_size"])
            source["ffn_size"] = "intermediate_size"
    context = context_from_hf_config(d)
    if context is not None:
        v["max_context_tokens"], source["max_context_tokens"] = context
    v["name"] = _hf_name(d)
    source["name"] = next((k for k in ("_name_or_path", "model_type") if isinstance(d.get(k), str) and d[k].strip()),
                          "name")
    return v, source


def model_from_dict(d: dict, name: str | None = None) -> Model:
    """A validated Model from its fields (``Model``'s names) or from a Hugging Face config.json
    (recognised by ``architectures``, ``model_type`` or ``num_hidden_layers``; its other keys are ignored;
    architectures other than ``HF_ARCHITECTURES`` are refused). Errors name the field as the file spells it."""
    if not isinstance(d, dict):
        raise ValueError(f"a model description must be a JSON object, not {shown(d)}")
    source: dict[str, str] = {}
    if any(k in d for k in HF_MARKERS):
        d, source = _from_hf_config(d)
    unknown = [k for k in d if k not in MODEL_JSON_FIELDS]
    if unknown:
        raise ValueError(f"unknown model field(s) {_names(unknown, 100)}; allowed: {', '.join(MODEL_JSON_FIELDS)}")
    required = [f.name for f in fields(Model) if f.default is MISSING]
    missing = [k for k in required if k not in d and not (k == "name" and name)]
    if missing:
        raise ValueError(f"model field(s) {', '.join(missing)} missing; required: {', '.join(required)}")
    kw = {}
    for key, f in MODEL_JSON_FIELDS.items():
        if key not in d:
            continue
        label = source.get(key, key)
        if key == "name":
            kw[key] = _text(label, d[key])
        elif f.type in ("bool", bool):
            if not isinstance(d[key], bool):
                raise ValueError(f"{label}={shown(d[key])} is not true or false")
            kw[key] = d[key]
        else:
            kw[key] = _number(label, d[key], int, *MODEL_LIMITS[key])
    if name:
        kw["name"] = name
    m = Model(**kw)
    try:
        m.validate()
    except ValueError as exc:  # say it with the config's keys: num_key_value_heads=16, not num_kv_heads=16
        msg = str(exc)
        for fname, key in source.items():
            if key != fname and "/" not in key:
                msg = re.sub(rf"\b{fname}=", f"{key}=", msg)
        raise ValueError(msg) from None
    return m


def model_to_dict(model: Model) -> dict:
    return {f.name: getattr(model, f.name) for f in fields(Model)}


def _shown_path(path: Path) -> str:
    text = str(path)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + f"... ({len(text):,} characters)"


def parse_json_spec(data: bytes, kind: str) -> GPU | Model:
    """A GPU (``kind='gpu'``) or model (``kind='model'``) from the bytes of a JSON file: UTF-8 (with or without a
    byte-order mark) and at most MAX_SPEC_BYTES; any problem is a ValueError naming the field or the byte."""
    if kind not in ("gpu", "model"):
        raise ValueError(f"kind={shown(kind)} is not allowed; allowed: 'gpu', 'model'")
    if len(data) > MAX_SPEC_BYTES:
        raise ValueError(f"larger than {MAX_SPEC_BYTES:,} bytes, the most allowed (a config.json is a few KB)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text: byte 0x{data[exc.start:exc.start + 1].hex()} at offset {exc.start} "
                         "cannot be decoded; save the file as UTF-8") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError("not valid JSON: arrays or objects nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # Python's guard against integer literals of more than 4,300 digits
        if "integer string conversion" in str(exc):
            raise ValueError(f"not valid JSON: a number has more than {sys.get_int_max_str_digits():,} "
                             "digits") from None
        raise ValueError(f"not valid JSON: {str(exc)[:MAX_SHOWN_CHARS]}") from None
    return gpu_from_dict(obj) if kind == "gpu" else model_from_dict(obj)


def load_json_spec(path: str | Path, kind: str) -> GPU | Model:
    """Read a GPU (``kind='gpu'``) or model (``kind='model'``) JSON file; errors name the file and the field."""
    path = Path(path)
    label = f"{kind} file {_shown_path(path)}"
    try:
        if path.is_dir():
            raise ValueError(f"{label}: a folder, not a JSON file")
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{label}: no such file") from None
    except PermissionError:
        raise ValueError(f"{label}: cannot be read (permission denied)") from None
    except OSError as exc:
        raise ValueError(f"{label}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        return parse_json_spec(data, kind)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None


def attention_kind(model: Model) -> str:
    """'MLA' (multi-head latent attention), 'MHA' (a KV head per query head) or 'GQA' (grouped-query)."""
    if model.is_mla:
        return "MLA"
    return "MHA" if model.num_kv_heads == model.num_heads else "GQA"


def deployment_figures(dep: Deployment) -> dict:
    """What fits and how much KV: parameters, weights per GPU, KV bytes per token and KV capacity of a validated
    deployment (``python -m batching specs`` and the Model and hardware page show these)."""
    m, node = dep.model, dep.node
    usable = node.gpu.memory_bytes * dep.gpu_memory_utilization
    return {
        "model": m.name,
        "gpu": node.gpu.name,
        "num_gpus": node.num_gpus,
        "tp": node.tp,
        "replicas": node.replicas,
        "precision": dep.precision,
        "kv_dtype": dep.kv_dtype,
        "attention": attention_kind(m),
        "parameters": m.num_params,
        "active_parameters": m.active_params,
        "weight_bytes_per_gpu": dep.weight_bytes_per_gpu,
        "weight_gib_per_gpu": dep.weight_bytes_per_gpu / GIB,
        "usable_gib_per_gpu": usable / GIB,
        "kv_cache_gib_per_gpu": dep.kv_capacity_tokens * dep.kv_bytes_per_token_per_gpu / GIB,
        "kv_bytes_per_token": dep.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": dep.kv_bytes_per_token_per_gpu,
        "kv_capacity_tokens": dep.kv_capacity_tokens,
        "kv_capacity_tokens_node": dep.kv_capacity_tokens * node.replicas,
    } | ({"ep": dep.ep, "dp_attention": dep.dp_attention} if dep.ep > 1 or dep.dp_attention else {})
