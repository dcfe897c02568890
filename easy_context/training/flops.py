"""Training FLOPs per token and MFU (6N dense + causal attention; recompute not counted)."""

from __future__ import annotations

from transformers import PretrainedConfig

# dense bf16 peak by GPU name (datasheet, no sparsity)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "A800": 312.0, "H800": 989.0, "L40S": 362.0}


def non_embedding_params(config: PretrainedConfig) -> int:
    """Parameters of the transformer blocks and the LM head (the matmul FLOPs per token are ~2x this)."""
    h = config.hidden_size
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o and k, v projections
    mlp = 3 * h * config.intermediate_size  # gated MLP (gate, up, down)
    return config.num_hidden_layers * (attn + mlp) + h * config.vocab_size


def train_flops_per_token(config: PretrainedConfig, seq_length: int) -> float:
    """6N (forward + backward of the matmuls) + causal attention: 6 * layers * seq * heads * head_dim
    (QK^T and PV, 2 FLOPs per MAC, x3 for backward, halved for causal, averaged over positions)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attn = 6 * config.num_hidden_layers * seq_length * heads * head_dim
    return 6 * non_embedding_params(config) + attn


def peak_flops(device_name: str) -> float | None:
    """Datasheet dense bf16 FLOP/s of a GPU by name, None when unknown (e.g. CPU)."""
    for key, tflops in PEAK_TFLOPS.items():
        if key in device_name:
            return tflops * 1e12
    return None
