"""Sequence-parallel attention as a transformers attention function (``AttentionInterface``).

transformers 5.x calls a registered function as
``fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)`` with query
(b, h, s, d) (a transposed view), K/V not repeated for GQA and kwargs such as ``position_ids`` and
``sliding_window``; it returns ``(out (b, s, h, d), None)``. For a custom name the model builds no mask.
Features our attention cannot honour raise a clear error instead of computing something else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..groups import get_sp_group
from ..registry import get_attn_func, get_seq_algo


def _full_length(seq_algo: str, local_len: int) -> int:
    if not get_seq_algo(seq_algo).distributed:
        return local_len
    return local_len * dist.get_world_size(get_sp_group())


def check_supported(module: torch.nn.Module, seq_algo: str, query: torch.Tensor, attention_mask, dropout, kwargs):
    """Raise for attention features the SP backends do not implement (never silently wrong attention)."""
    if attention_mask is not None:
        raise NotImplementedError(
            f"{seq_algo}: an attention mask reached sequence-parallel attention; only plain causal attention "
            "over one packed sequence is supported (no padding mask: pad at the end with target -100)"
        )
    if dropout:
        raise NotImplementedError(
            f"{seq_algo}: attention dropout ({dropout}) is not supported; set config.attention_dropout = 0"
        )
    softcap = kwargs.get("softcap") or getattr(getattr(module, "config", None), "attn_logit_softcapping", None)
    if softcap:
        raise NotImplementedError(f"{seq_algo}: attention logit soft-capping ({softcap}) is not supported")
    window = kwargs.get("sliding_window")
    if window is not None:
        full = _full_length(seq_algo, query.shape[2])
        if window < full:
            raise NotImplementedError(
                f"{seq_algo}: sliding-window attention (window {window}) shorter than the sequence ({full} tokens) "
                "is not supported; set config.sliding_window = None (full attention) to train at this length"
            )
    if kwargs.get("output_attentions"):
        raise NotImplementedError(f"{seq_algo}: output_attentions is not available with sequence parallelism")


def make_hf_attention(seq_algo: str, **options: Any) -> Callable[..., tuple[torch.Tensor, None]]:
    """The transformers attention function for ``seq_algo`` (``options``: kernel, ring_degree, ...)."""
    attn = get_attn_func(seq_algo, **options)

    def easy_context_attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        check_supported(module, seq_algo, query, attention_mask, dropout, kwargs)
        causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
        out = attn(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scaling, causal=causal
        )
        return out, None

    easy_context_attention.__name__ = f"easy_context_{seq_algo}_attention"
    return easy_context_attention
