"""Training FLOPs per token and MFU: 6N for the matmuls plus the attention each layer computes (recompute not counted).

Attention per layer and token: QK^T and PV are ``2 * heads * head_dim`` MACs per (query, key) pair, 2 FLOPs per
MAC, x3 for forward + backward, so ``12 * heads * head_dim * keys`` with ``keys`` the mean number of keys a query
sees (:func:`mean_keys_per_query`):

* a full causal layer: ``seq / 2`` (the usual convention: half of the square);
* a sliding-window layer of ``w`` keys (a query at position p sees ``min(p + 1, w)`` keys, transformers'
  ``sliding_window`` convention, :mod:`easy_context.core.windows`): the mean of that over the positions, ~``w`` for
  ``seq >> w``, so the layer's FLOPs per sequence grow linearly with its length;
* a chunked layer (Llama 4 ``chunked_attention``, chunks of ``c`` tokens): ``(p mod c) + 1`` keys, averaged.

Which layers have a window is read as transformers' masks read it (:func:`layer_windows`).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from easy_context.models import layer_windows, text_config


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet figures: ``name`` as its device name contains it, the dense bf16 tensor peak (no sparsity:
    half the datasheet's "with sparsity" figure) and the memory in GB (1e9)."""

    name: str
    tflops: float
    memory_gb: float


# by the name --gpu takes; a more specific device name first (peak_flops matches the first name a device name contains)
GPUS: dict[str, Gpu] = {
    "h200": Gpu("H200", 989.0, 141),  # NVIDIA H200 datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 141 GB HBM3e
    "h100-pcie": Gpu("H100 PCIe", 756.0, 80),  # NVIDIA H100 datasheet (PCIe): BF16 1,513 with sparsity, 80 GB
    "h100": Gpu("H100", 989.0, 80),  # NVIDIA H100 datasheet (SXM): BF16 1,979 with sparsity, 80 GB HBM3
    "h800": Gpu("H800", 989.0, 80),  # NVIDIA H800 (SXM): H100's tensor cores, 80 GB
    "b200": Gpu("B200", 2250.0, 180),  # NVIDIA HGX B200 datasheet: BF16 36 PFLOPS with sparsity for 8 GPUs, 1.4 TB
    "a100": Gpu("A100", 312.0, 80),  # NVIDIA A100 datasheet: BF16 312 (624 with sparsity), 80 GB HBM2e
    "a100-40gb": Gpu("A100", 312.0, 40),  # the same, 40 GB HBM2
    "a800": Gpu("A800", 312.0, 80),  # NVIDIA A800: A100's tensor cores, 80 GB
    "l40s": Gpu("L40S", 362.0, 48),  # NVIDIA L40S datasheet: BF16 362 (733 with sparsity), 48 GB GDDR6
    "a10": Gpu("A10", 125.0, 24),  # NVIDIA A10 datasheet: BF16 125 (250 with sparsity), 24 GB GDDR6
    "l4": Gpu("L4", 121.0, 24),  # NVIDIA L4 datasheet: BF16 242 with sparsity, 24 GB GDDR6
}
# dense bf16 peak by device-name part, in GPUS' order (MFU of a run)
PEAK_TFLOPS = {gpu.name: gpu.tflops for gpu in GPUS.values()}

# model types whose MLP is two matmuls (up, down) instead of the gated three (gate, up, down)
NON_GATED_MLP = frozenset({
    "biogpt", "bloom", "codegen", "falcon", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "mpt", "nemotron", "opt",
    "phi", "starcoder2", "xglm",
})  # fmt: skip


def _heads(config: PretrainedConfig) -> tuple[int, int, int]:
    """(query heads, key/value heads, head_dim); head_dim may differ from hidden / heads (Gemma 3: 256 vs 160)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim


def mlp_width(config: PretrainedConfig) -> int:
    """The MLP's inner width as the config names it (``intermediate_size``, GPT-2's ``n_inner``, OPT's ``ffn_dim``,
    Falcon's ``ffn_hidden_size``), else 4 x hidden (their default)."""
    for name in ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 4 * config.hidden_size


def mlp_params(config: PretrainedConfig) -> int:
    """Weights one token's MLP multiplies with: gated (gate, up, down) or two matmuls (:data:`NON_GATED_MLP`); of a
    mixture of experts, the ``num_experts_per_tok`` experts a token is routed to plus any shared expert."""
    h = config.hidden_size
    mats = 2 if getattr(config, "model_type", None) in NON_GATED_MLP else 3
    k = getattr(config, "num_experts_per_tok", None)
    if not k:
        return mats * h * mlp_width(config)
    expert = getattr(config, "moe_intermediate_size", None) or mlp_width(config)
    shared = (getattr(config, "shared_expert_intermediate_size", None) or 0) + (
        getattr(config, "n_shared_experts", None) or 0
    ) * expert
    return mats * h * (k * expert + shared)


def non_embedding_params(config: PretrainedConfig) -> int:
    """Parameters of the transformer blocks and the LM head that one token multiplies with (the matmul FLOPs per token
    are ~2x this). The input embedding is a lookup, not a matmul: a tied embedding counts once, as the head."""
    config = text_config(config)
    h = config.hidden_size
    heads, kv, head_dim = _heads(config)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o and k, v projections
    return config.num_hidden_layers * (attn + mlp_params(config)) + h * config.vocab_size


def mean_keys_per_query(kind: str, size: int | None, seq_length: int) -> float:
    """The mean number of keys a query attends to in a causal layer over ``seq_length`` tokens.

    ``"full"``: ``seq / 2``. ``"sliding"`` (window ``w``): the mean of ``min(p + 1, w)`` over positions p, i.e.
    ``w - w (w - 1) / (2 seq)`` for ``seq >= w``; a window covering the sequence counts as full. ``"chunked"`` (chunks
    of ``c``): the mean of ``(p mod c) + 1``.
    """
    s = seq_length
    if kind == "full" or size is None or size >= s:
        return s / 2
    w = size
    if kind == "sliding":
        return (w * (w + 1) / 2 + (s - w) * w) / s
    if kind == "chunked":
        full, rest = divmod(s, w)
        return (full * w * (w + 1) / 2 + rest * (rest + 1) / 2) / s
    raise ValueError(f"unknown attention layer kind {kind!r}")


def attention_flops_per_token(config: PretrainedConfig, seq_length: int) -> float:
    """Forward + backward FLOPs of QK^T and PV per token, summed over the layers, each with its own window."""
    config = text_config(config)
    heads, _, head_dim = _heads(config)
    keys = sum(mean_keys_per_query(kind, size, seq_length) for kind, size in layer_windows(config))
    return 12 * heads * head_dim * keys


def train_flops_per_token(config: PretrainedConfig, seq_length: int) -> float:
    """6N (forward + backward of the matmuls) + the attention of every layer (:func:`attention_flops_per_token`):
    ``6 * layers * seq * heads * head_dim`` for a model without windows."""
    return 6 * non_embedding_params(config) + attention_flops_per_token(config, seq_length)


def peak_flops(device_name: str) -> float | None:
    """Datasheet dense bf16 FLOP/s of a GPU by name, None when unknown (e.g. CPU)."""
    for key, tflops in PEAK_TFLOPS.items():
        if key in device_name:
            return tflops * 1e12
    return None
