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
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

GIB = 1024**3
KV_BLOCK_TOKENS = 16  # vLLM's default paged-attention block size

PRECISIONS = ("bf16", "fp8")
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8": 1.0}
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


def _check_range(name: str, value, low, high) -> None:
    if not (low <= value <= high):
        raise ValueError(f"{name}={shown(value)} is out of range; allowed {low} to {high}")


def _check_name(name) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"name={shown(name)} is not allowed; allowed 1 to {MAX_NAME_CHARS} characters")


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

    def peak_flops(self, precision: str) -> float:
        if precision == "fp8":
            if self.peak_fp8_flops <= 0:
                raise ValueError(f"precision='fp8' is not supported on {self.name}; allowed: bf16")
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def validate(self) -> None:
        _check_name(self.name)
        _check_range("memory_bytes", self.memory_bytes, 1 * GIB, 1024 * GIB)
        _check_range("hbm_bw_Bps", self.hbm_bw_Bps, 1e11, 1e14)
        _check_range("peak_bf16_flops", self.peak_bf16_flops, 1e12, 1e17)
        if self.peak_fp8_flops != 0:
            _check_range("peak_fp8_flops", self.peak_fp8_flops, 1e12, 1e17)
        _check_range("nvlink_Bps", self.nvlink_Bps, 1e9, 1e13)
        _check_range("pcie_Bps", self.pcie_Bps, 1e8, 1e12)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer, as its config.json describes it.

    Mixture of experts: ``num_experts`` > 0 replaces the MLP by that many experts of width
    ``ffn_size`` each (``moe_intermediate_size`` in Qwen3-MoE configs) plus a router, and each
    token runs ``experts_per_token`` of them. Memory holds every expert; compute uses the
    active ones (see ``active_linear_params_per_layer``).
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

    def validate(self) -> None:
        _check_name(self.name)
        _check_range("num_layers", self.num_layers, 1, 1000)
        _check_range("hidden_size", self.hidden_size, 64, 65536)
        _check_range("num_heads", self.num_heads, 1, 1024)
        _check_range("num_kv_heads", self.num_kv_heads, 1, self.num_heads)
        _check_range("head_dim", self.head_dim, 16, 1024)
        _check_range("ffn_size", self.ffn_size, 64, 1 << 20)
        _check_range("vocab_size", self.vocab_size, 1, 1 << 22)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.num_experts == 0:
            if self.experts_per_token != 0:
                raise ValueError(f"experts_per_token={self.experts_per_token} needs num_experts > 0; "
                                 "allowed 0 for a dense model")
        else:
            _check_range("num_experts", self.num_experts, 2, 1024)
            _check_range("experts_per_token", self.experts_per_token, 1, self.num_experts)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # --- parameter counts -------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
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
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def mlp_params_per_layer(self) -> int:
        """Every expert (what memory holds)."""
        if self.is_moe:
            return self.num_experts * self.expert_params + self.router_params_per_layer
        return self.expert_params

    @property
    def active_mlp_params_per_layer(self) -> int:
        """The experts one token runs through (what its FLOPs use)."""
        if self.is_moe:
            return self.experts_per_token * self.expert_params + self.router_params_per_layer
        return self.expert_params

    @property
    def linear_params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def active_linear_params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.active_mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def non_linear_params(self) -> int:
        """Embeddings, LM head and norms: kept in BF16 by FP8 checkpoints."""
        head = 0 if self.tied_embeddings else self.embedding_params
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.embedding_params + head + norms

    @property
    def num_params(self) -> int:
        return self.num_layers * self.linear_params_per_layer + self.non_linear_params

    @property
    def active_params(self) -> int:
        """Parameters one token runs through (= num_params for a dense model)."""
        return self.num_layers * self.active_linear_params_per_layer + self.non_linear_params

    def kv_bytes_per_token(self, kv_bytes_per_element: float = 2.0) -> float:
        """K and V of every layer for one token, whole model (all TP ranks)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes_per_element


@dataclass(frozen=True)
class Node:
    """A node of ``num_gpus`` identical GPUs on NVLink, split in tensor-parallel groups."""

    gpu: GPU
    num_gpus: int = 8
    tp: int = 8

    def validate(self) -> None:
        self.gpu.validate()
        _check_range("num_gpus", self.num_gpus, 1, 8)
        if self.tp not in (1, 2, 4, 8):
            raise ValueError(f"tp={self.tp!r} is not allowed; allowed: 1, 2, 4, 8")
        if self.tp > self.num_gpus or self.num_gpus % self.tp:
            raise ValueError(
                f"tp={self.tp} must divide num_gpus={self.num_gpus} (allowed tp: 1 to {self.num_gpus})"
            )

    @property
    def replicas(self) -> int:
        """Data-parallel model replicas on the node (num_gpus / tp)."""
        return self.num_gpus // self.tp


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
    "b200": GPU("B200 180GB", 183359 * 2**20, 8.0e12, 2250e12, 4500e12, 900e9, 55e9, "blackwell"),
    # A100 SXM4 80GB (NVIDIA A100 datasheet): 312 TF BF16 dense, no FP8, 2.039 TB/s HBM2e, NVLink3
    # 600 GB/s total = 300 GB/s per direction, PCIe Gen4 x16 ~25 GB/s usable; 81,920 MiB reported.
    "a100-80gb": GPU("A100 SXM 80GB", 81920 * 2**20, 2.039e12, 312e12, 0.0, 300e9, 25e9, "ampere"),
}

MODELS: dict[str, Model] = {
    # Qwen/Qwen2.5-72B-Instruct config.json
    "qwen2.5-72b": Model("Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, False, True),
    # meta-llama/Llama-3.1-70B-Instruct config.json
    "llama-3.1-70b": Model("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256),
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama-3.1-8b": Model("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256),
    # Qwen/Qwen2.5-7B-Instruct config.json (7.62B parameters)
    "qwen2.5-7b": Model("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, False, True),
    # Qwen/Qwen2.5-32B-Instruct config.json (32.8B parameters by its shapes)
    "qwen2.5-32b": Model("Qwen2.5-32B", 64, 5120, 40, 8, 128, 27648, 152064, False, True),
    # meta-llama/Llama-3.1-405B-Instruct config.json (405.9B parameters): BF16 needs ~95 GiB per
    # GPU at TP 8, so it runs in FP8 on 8xH100 or in either precision on 8xH200.
    "llama-3.1-405b": Model("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256),
    # mistralai/Mixtral-8x7B-Instruct-v0.1 config.json: 8 experts of width 14336, top-2
    # routing; 46.7B parameters in memory, 12.9B active per token.
    "mixtral-8x7b": Model("Mixtral-8x7B", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2),
    # Qwen/Qwen3-30B-A3B config.json: 128 experts of width 768 (moe_intermediate_size), top-8;
    # 30.5B parameters in memory, 3.3B active (its q/k RMSNorm weights, 256 per layer, omitted).
    "qwen3-30b-a3b": Model("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 768, 151936, num_experts=128,
                           experts_per_token=8),
}

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

    def validate(self) -> None:
        self.node.validate()
        self.model.validate()
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
        self.node.gpu.peak_flops(self.precision)
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={self.kv_dtype!r} is not allowed; allowed: {', '.join(KV_DTYPES)}")
        _check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.1, 1.0)
        if self.model.num_heads % self.node.tp:
            ok = [t for t in (1, 2, 4, 8) if self.model.num_heads % t == 0 and t <= self.node.num_gpus]
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
            _check_range("kv_cache_tokens", self.kv_cache_tokens, KV_BLOCK_TOKENS, self.kv_capacity_tokens_max)

    def _fit_hint(self) -> str:
        """What would make the model fit: more GPUs per replica, FP8, or a larger GPU."""
        hints = []
        for tp in (2, 4, 8):
            if self.node.tp < tp <= self.node.num_gpus and self.model.num_heads % tp == 0:
                if replace(self, node=replace(self.node, tp=tp))._fits():
                    hints.append(f"tp={tp}")
                    break
        if self.precision != "fp8" and self.node.gpu.peak_fp8_flops > 0:
            for tp in sorted({self.node.tp, 8}):
                if tp <= self.node.num_gpus and replace(self, precision="fp8", node=replace(self.node, tp=tp))._fits():
                    hints.append("precision fp8" + ("" if tp == self.node.tp else f" with tp={tp}"))
                    break
        if not hints:
            return "no tensor-parallel degree or precision on this node fits it; use a GPU with more memory"
        return "it fits with " + " or ".join(hints)

    def _fits(self) -> bool:
        return self.kv_bytes_available_per_gpu >= self.kv_bytes_per_token_per_gpu * KV_BLOCK_TOKENS

    @property
    def bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT[self.precision]

    @property
    def kv_bytes_per_element(self) -> float:
        return 1.0 if self.kv_dtype == "fp8" else 2.0

    @property
    def linear_weight_bytes_per_gpu(self) -> float:
        """Transformer-block linear layers (attention projections, MLP or experts) per GPU."""
        m = self.model
        return m.num_layers * m.linear_params_per_layer * self.bytes_per_weight / self.node.tp

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
               kv_cache_tokens: int | None = None) -> Deployment:
    """Build a validated Deployment from preset ids as users type them (or custom GPU / Model objects)."""
    g = gpu if isinstance(gpu, GPU) else gpu_preset(gpu)
    m = model if isinstance(model, Model) else model_preset(model)
    d = Deployment(Node(g, 8 if num_gpus is None else num_gpus, tp), m, precision, kv_dtype,
                   kv_cache_tokens=kv_cache_tokens)
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
}
HF_QKV_BIAS_TYPES = ("qwen2",)  # architectures whose attention has q/k/v biases
# Hugging Face architectures whose shapes Model describes exactly (decoder-only, multi-head or grouped-query
# attention, a gated MLP or top-k experts without shared experts), with their model_type. Anything else is
# refused rather than approximated: state-space models have no KV cache per token, DeepSeek's multi-head latent
# attention caches a compressed latent (a KV cache 25x smaller than these shapes say), multimodal wrappers hold a
# vision tower and keep the language model in text_config.
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
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
            if key == "peak_fp8_tflops" and d[key] == 0 and not isinstance(d[key], bool):
                v[key] = 0.0
                continue
            v[key] = _number(key, d[key], float, low, high)
    _check_name(v["name"])
    if v["arch"] not in GPU_ARCHS:
        raise ValueError(f"arch={shown(v['arch'])} is not allowed; allowed: {', '.join(repr(a) for a in GPU_ARCHS)}")

    def whole(key: str) -> float:  # bytes, bytes/s and FLOP/s are whole numbers (exact JSON round trips)
        return float(round(v[key] * GPU_JSON_UNITS[key][1]))

    gpu = GPU(v["name"], whole("memory_gib"), whole("hbm_bandwidth_tb_s"), whole("peak_bf16_tflops"),
              whole("peak_fp8_tflops"), whole("nvlink_gb_s"), whole("pcie_gb_s"), v["arch"])
    gpu.validate()
    return gpu


def gpu_to_dict(gpu: GPU) -> dict:
    """The GPU_JSON_FIELDS form of a GPU (the inverse of gpu_from_dict)."""
    return {"name": gpu.name, "memory_gib": gpu.memory_bytes / GIB, "hbm_bandwidth_tb_s": gpu.hbm_bw_Bps / 1e12,
            "peak_bf16_tflops": gpu.peak_bf16_flops / 1e12, "peak_fp8_tflops": gpu.peak_fp8_flops / 1e12,
            "nvlink_gb_s": gpu.nvlink_Bps / 1e9, "pcie_gb_s": gpu.pcie_Bps / 1e9, "arch": gpu.arch}


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
    if ok and "text_config" not in d and "vision_config" not in d and "kv_lora_rank" not in d:
        if d.get("use_sliding_window") is True or (
                "mistral" in names and isinstance(d.get("sliding_window"), int) and d.get("sliding_window")):
            why = "its sliding-window attention caches only the last window of tokens, which is not modelled"
        elif d.get("mlp_only_layers") or d.get("decoder_sparse_step") not in (None, 1):
            why = "it mixes dense and mixture-of-experts layers, which is not modelled"
        else:
            return
    elif any(w in names for w in ("mamba", "jamba", "zamba", "rwkv", "recurrent", "ssm")) or "state_size" in d \
            or "ssm_cfg" in d:
        why = "a state-space or recurrent model (Mamba, Jamba, RWKV) keeps no per-token KV cache in those layers"
    elif "kv_lora_rank" in d or "deepseekv2" in names or "deepseekv3" in names or "deepseek_v" in names:
        why = ("its multi-head latent attention (MLA) caches a compressed latent per token, which is not "
               "modelled yet")
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
                  "num_experts", "experts_per_token"):
        if fname in v:
            v[fname] = _number(source[fname], v[fname], int, *MODEL_LIMITS[fname])
    if d.get("head_dim") is not None:
        v["head_dim"], source["head_dim"] = _number("head_dim", d["head_dim"], int, *MODEL_LIMITS["head_dim"]), "head_dim"
    else:
        v["head_dim"], source["head_dim"] = v["hidden_size"] // v["num_heads"], "hidden_size / num_attention_heads"
    bias = d.get("attention_bias", d.get("model_type") in HF_QKV_BIAS_TYPES)
    if not isinstance(bias, bool):
        raise ValueError(f"attention_bias={shown(bias)} is not true or false")
    v["qkv_bias"] = bias
    if not v.get("num_experts"):
        v.pop("experts_per_token", None)
        v.pop("num_experts", None)
    v["name"] = _hf_name(d)
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
        raise ValueError(f"unknown model field(s) {_names(unknown)}; allowed: {', '.join(MODEL_JSON_FIELDS)}")
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
