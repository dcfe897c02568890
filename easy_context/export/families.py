"""The model families exported to GGUF: llama.cpp's architecture name, how its tensors differ from transformers',
and the hyperparameters it reads (the ``{arch}.*`` fields besides the RoPE, :mod:`easy_context.models.gguf_rope`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Family:
    """One transformers ``model_type`` as llama.cpp stores it."""

    arch: str  # general.architecture
    permute_qk: bool  # llama.cpp's rotary layout: q/k rows as interleaved pairs (transformers: two halves)
    norm_offset: float  # added to every RMSNorm weight (Gemma computes x * (1 + w); llama.cpp stores 1 + w)


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", permute_qk=True, norm_offset=0.0),
    "qwen2": Family("qwen2", permute_qk=False, norm_offset=0.0),
    "gemma3_text": Family("gemma3", permute_qk=False, norm_offset=1.0),
}
GEMMA3_PATTERN = 6  # llama.cpp's Gemma 3: every 6th layer global, the others sliding (fixed in its loader)


def family(config) -> Family:
    """The :class:`Family` of ``config``, or a one-line ValueError naming the exportable ones."""
    found = FAMILIES.get(config.model_type)
    if found is None:
        raise ValueError(
            f"model_type {config.model_type!r} cannot be exported to GGUF here; exportable: {', '.join(FAMILIES)} "
            "(a multimodal Gemma 3: export its text model)"
        )
    return found


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' q/k projection rows (per head: the first halves of all rotary pairs, then the second halves)
    in llama.cpp's order (per head: the pairs interleaved). ``w``: (n_head * head_dim, in) or (n_head * head_dim,)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hyperparameters(config) -> dict[str, Any]:
    """The ``{arch}.*`` fields (keys without the prefix) of ``config``: the shape, the norm epsilon, and Gemma 3's
    window and head sizes. A Gemma 3 layout llama.cpp cannot reproduce is a one-line ValueError."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    out: dict[str, Any] = {
        "context_length": int(config.max_position_embeddings),
        "embedding_length": int(config.hidden_size),
        "block_count": int(config.num_hidden_layers),
        "feed_forward_length": int(config.intermediate_size),
        "attention.head_count": int(heads),
        "attention.head_count_kv": int(config.num_key_value_heads),
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "vocab_size": int(config.vocab_size),
        "rope.dimension_count": int(head_dim),
    }
    if head_dim * heads != config.hidden_size or config.model_type == "gemma3_text":
        out["attention.key_length"] = out["attention.value_length"] = int(head_dim)
    if config.model_type == "gemma3_text":
        _check_gemma3(config, head_dim)
        out["attention.sliding_window"] = int(config.sliding_window)
        if getattr(config, "final_logit_softcapping", None):
            out["final_logit_softcapping"] = float(config.final_logit_softcapping)
    return out


def _check_gemma3(config, head_dim: int) -> None:
    """llama.cpp's Gemma 3 fixes what transformers' config leaves free: the layer pattern, the attention scale
    (1 / sqrt(head_dim)), no attention-logit softcap."""
    expected = ["full_attention" if (i + 1) % GEMMA3_PATTERN == 0 else "sliding_attention"
                for i in range(config.num_hidden_layers)]  # fmt: skip
    if list(config.layer_types) != expected:
        raise ValueError(
            f"layer_types {config.layer_types} is not Gemma 3's pattern (every {GEMMA3_PATTERN}th layer global), the "
            "one llama.cpp builds; this model cannot be exported to GGUF"
        )
    if config.query_pre_attn_scalar != head_dim:
        raise ValueError(
            f"query_pre_attn_scalar {config.query_pre_attn_scalar} != head_dim {head_dim}: llama.cpp scales Gemma 3's "
            "attention by 1/sqrt(head_dim); this model cannot be exported to GGUF"
        )
    if getattr(config, "attn_logit_softcapping", None):
        raise ValueError("attn_logit_softcapping is set; llama.cpp's Gemma 3 has none: cannot export to GGUF")
