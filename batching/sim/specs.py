"""GPU, node and model presets (frozen dataclasses) and what follows from them.

Hardware figures are vendor datasheet numbers (NVIDIA H100/H200/A100/HGX B200 datasheets);
model figures are the ``config.json`` of each model on its official release. Custom GPUs and
models come from a dict or a JSON file (``gpu_from_dict``, ``model_from_dict``, which also
reads a Hugging Face ``config.json``).
"""
from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

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
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 64:
            raise ValueError(f"name={self.name!r} is not allowed; allowed 1 to 64 characters")
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
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 64:
            raise ValueError(f"name={self.name!r} is not allowed; allowed 1 to 64 characters")
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
GPU_ARCHS = ("", "hopper", "blackwell", "ampere")
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


def _number(name: str, value, kind):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} is not a number")
    if kind is int:
        if float(value) != int(value):
            raise ValueError(f"{name}={value!r} is not an integer")
        return int(value)
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r} is not finite")
    return float(value)


def gpu_from_dict(d: dict) -> GPU:
    """A validated GPU from ``GPU_JSON_FIELDS`` (unknown keys are an error naming them)."""
    if not isinstance(d, dict):
        raise ValueError("a GPU description must be a JSON object")
    unknown = sorted(set(d) - set(GPU_JSON_FIELDS))
    if unknown:
        raise ValueError(f"unknown GPU field(s) {', '.join(unknown)}; allowed: {', '.join(GPU_JSON_FIELDS)}")
    v = {}
    for key, (kind, default) in GPU_JSON_FIELDS.items():
        if key not in d:
            if default is None:
                raise ValueError(f"GPU field {key} is missing; required: "
                                 + ", ".join(k for k, (_, dflt) in GPU_JSON_FIELDS.items() if dflt is None))
            v[key] = default
        else:
            v[key] = str(d[key]) if kind is str else _number(key, d[key], kind)
    if v["arch"] not in GPU_ARCHS:
        raise ValueError(f"arch={v['arch']!r} is not allowed; allowed: {', '.join(repr(a) for a in GPU_ARCHS)}")
    def whole(x: float) -> float:  # bytes, bytes/s and FLOP/s are whole numbers (exact JSON round trips)
        return float(round(x))

    gpu = GPU(v["name"], whole(v["memory_gib"] * GIB), whole(v["hbm_bandwidth_tb_s"] * 1e12),
              whole(v["peak_bf16_tflops"] * 1e12), whole(v["peak_fp8_tflops"] * 1e12), whole(v["nvlink_gb_s"] * 1e9),
              whole(v["pcie_gb_s"] * 1e9), v["arch"])
    gpu.validate()
    return gpu


def gpu_to_dict(gpu: GPU) -> dict:
    """The GPU_JSON_FIELDS form of a GPU (the inverse of gpu_from_dict)."""
    return {"name": gpu.name, "memory_gib": gpu.memory_bytes / GIB, "hbm_bandwidth_tb_s": gpu.hbm_bw_Bps / 1e12,
            "peak_bf16_tflops": gpu.peak_bf16_flops / 1e12, "peak_fp8_tflops": gpu.peak_fp8_flops / 1e12,
            "nvlink_gb_s": gpu.nvlink_Bps / 1e9, "pcie_gb_s": gpu.pcie_Bps / 1e9, "arch": gpu.arch}


def model_from_dict(d: dict, name: str | None = None) -> Model:
    """A validated Model from its fields (``Model``'s names) or from a Hugging Face config.json
    (recognised by ``num_hidden_layers``; its other keys are ignored)."""
    if not isinstance(d, dict):
        raise ValueError("a model description must be a JSON object")
    if "num_hidden_layers" in d:
        v = {}
        for fname, keys in HF_KEYS.items():
            for k in keys:
                if d.get(k) is not None:
                    v[fname] = d[k]
                    break
        missing = [f for f in ("num_layers", "hidden_size", "num_heads", "ffn_size", "vocab_size") if f not in v]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(HF_KEYS[f][0] for f in missing)}")
        v["head_dim"] = d.get("head_dim") or (int(v["hidden_size"]) // int(v["num_heads"]))
        v["qkv_bias"] = bool(d.get("attention_bias", d.get("model_type") in HF_QKV_BIAS_TYPES))
        if not v.get("num_experts"):
            v.pop("experts_per_token", None)
            v.pop("num_experts", None)
        v["name"] = name or d.get("_name_or_path") or d.get("model_type") or "custom model"
        d = v
    unknown = sorted(set(d) - set(MODEL_JSON_FIELDS))
    if unknown:
        raise ValueError(f"unknown model field(s) {', '.join(unknown)}; allowed: {', '.join(MODEL_JSON_FIELDS)}")
    required = [f.name for f in fields(Model) if f.default is MISSING]
    missing = [k for k in required if k not in d and not (k == "name" and name)]
    if missing:
        raise ValueError(f"model field(s) {', '.join(missing)} missing; required: {', '.join(required)}")
    kw = {}
    for key, f in MODEL_JSON_FIELDS.items():
        if key not in d:
            continue
        if key == "name":
            kw[key] = str(d[key])
        elif f.type in ("bool", bool):
            if not isinstance(d[key], bool):
                raise ValueError(f"{key}={d[key]!r} is not true or false")
            kw[key] = d[key]
        else:
            kw[key] = _number(key, d[key], int)
    if name:
        kw["name"] = name
    m = Model(**kw)
    m.validate()
    return m


def model_to_dict(model: Model) -> dict:
    return {f.name: getattr(model, f.name) for f in fields(Model)}


def load_json_spec(path: str | Path, kind: str) -> GPU | Model:
    """Read a GPU (``kind='gpu'``) or model (``kind='model'``) JSON file; errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{kind} file {path}: no such file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{kind} file {path}: not valid JSON ({exc})") from None
    try:
        return gpu_from_dict(data) if kind == "gpu" else model_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{kind} file {path}: {exc}") from None
