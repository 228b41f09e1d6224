"""GPU, node and model presets (frozen dataclasses) and what follows from them.

Hardware figures are vendor datasheet numbers (NVIDIA H100/H200/A100 datasheets);
model figures are the ``config.json`` of each model on its official release.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GIB = 1024**3
KV_BLOCK_TOKENS = 16  # vLLM's default paged-attention block size

PRECISIONS = ("bf16", "fp8")
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8": 1.0}
KV_DTYPES = ("auto", "fp8")


def _check_range(name: str, value, low, high) -> None:
    if not (low <= value <= high):
        raise ValueError(f"{name}={value!r} is out of range; allowed {low} to {high}")


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

    def peak_flops(self, precision: str) -> float:
        if precision == "fp8":
            if self.peak_fp8_flops <= 0:
                raise ValueError(f"precision='fp8' is not supported on {self.name}; allowed: bf16")
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def validate(self) -> None:
        _check_range("memory_bytes", self.memory_bytes, 1 * GIB, 1024 * GIB)
        _check_range("hbm_bw_Bps", self.hbm_bw_Bps, 1e11, 1e14)
        _check_range("peak_bf16_flops", self.peak_bf16_flops, 1e12, 1e17)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer, as its config.json describes it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False

    def validate(self) -> None:
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

    # --- parameter counts -------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + bias

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.ffn_size  # gated MLP: gate, up, down

    @property
    def linear_params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.num_layers * self.linear_params_per_layer + self.embedding_params + head + norms

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
    # H100 SXM5 80GB: 989.4 TF BF16 dense, 1979 TF FP8 dense, 3.35 TB/s HBM3, NVLink4 450 GB/s
    # per direction; 81,559 MiB as nvidia-smi reports; PCIe Gen5 x16 ~55 GB/s usable.
    "h100-sxm": GPU("H100 SXM 80GB", 81559 * 2**20, 3.35e12, 989.4e12, 1978.9e12, 450e9, 55e9),
    # H200 SXM 141GB: same compute as H100, 4.8 TB/s HBM3e, 143,771 MiB reported.
    "h200-sxm": GPU("H200 SXM 141GB", 143771 * 2**20, 4.8e12, 989.4e12, 1978.9e12, 450e9, 55e9),
    # A100 SXM4 80GB: 312 TF BF16 dense, no FP8, 2.039 TB/s HBM2e, NVLink3 300 GB/s per
    # direction, PCIe Gen4 x16 ~25 GB/s usable; 81,920 MiB reported.
    "a100-80gb": GPU("A100 SXM 80GB", 81920 * 2**20, 2.039e12, 312e12, 0.0, 300e9, 25e9),
}

MODELS: dict[str, Model] = {
    # Qwen/Qwen2.5-72B-Instruct config.json
    "qwen2.5-72b": Model("Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, False, True),
    # meta-llama/Llama-3.1-70B-Instruct config.json
    "llama-3.1-70b": Model("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256),
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama-3.1-8b": Model("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256),
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
            raise ValueError(
                f"tp={self.node.tp} must divide the model's num_heads={self.model.num_heads}"
            )
        free = self.kv_bytes_available_per_gpu
        if free < self.kv_bytes_per_token_per_gpu * KV_BLOCK_TOKENS:
            need = (self.weight_bytes_per_gpu + self.activation_reserve_bytes) / GIB
            have = self.node.gpu.memory_bytes * self.gpu_memory_utilization / GIB
            raise ValueError(
                f"model {self.model.name} in {self.precision} does not fit on {self.node.gpu.name} "
                f"with tp={self.node.tp}: it needs {need:.1f} GiB per GPU for weights and "
                f"activations but {have:.1f} GiB are usable; raise tp, use fp8 or a larger GPU"
            )
        if self.kv_cache_tokens is not None:
            _check_range("kv_cache_tokens", self.kv_cache_tokens, KV_BLOCK_TOKENS, self.kv_capacity_tokens_max)

    @property
    def bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT[self.precision]

    @property
    def kv_bytes_per_element(self) -> float:
        return 1.0 if self.kv_dtype == "fp8" else 2.0

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.num_params * self.bytes_per_weight / self.node.tp

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


def deployment(gpu: str = DEFAULT_GPU, model: str = DEFAULT_MODEL, tp: int = 8, num_gpus: int | None = None,
               precision: str = "bf16", kv_dtype: str = "auto", kv_cache_tokens: int | None = None) -> Deployment:
    """Build a validated Deployment from preset ids as users type them."""
    d = Deployment(Node(gpu_preset(gpu), 8 if num_gpus is None else num_gpus, tp),
                   model_preset(model), precision, kv_dtype, kv_cache_tokens=kv_cache_tokens)
    d.validate()
    return d
