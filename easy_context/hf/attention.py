"""Sequence-parallel attention as a transformers attention function (``AttentionInterface``).

transformers 5.x calls a registered function as
``fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)`` with query
(b, h, s, d) (a transposed view), K/V not repeated for GQA and kwargs such as ``position_ids`` and
``sliding_window``; it returns ``(out (b, s, h, d), None)``. For a custom name the model builds no mask.
Features our attention cannot honour raise a clear error instead of computing something else.

Attention variants (docs/attention_variants.md) come from the kwargs transformers passes: ``softcap`` (Gemma 2's
``attn_logit_softcapping``, else the module config's), ``sliding_window`` (Mistral, Qwen2, and the sliding layers of
Gemma 2/3 and gpt-oss; None on full-attention layers; where a model does not pass it, the window its own mask uses:
Qwen2-MoE, Phi-MoE) and ``s_aux`` (gpt-oss' ``module.sinks``, one logit per head); every backend computes them
exactly, forward and backward. Any other keyword with a value (``position_bias``, a sparse ``indices``) is refused.

Packed documents follow transformers' rule (:mod:`easy_context.core.documents`): ``position_ids`` that do not increase
by one inside a row start a new document, and attention stays inside each document. ``position_ids`` here is this
rank's shard; the documents of the full sequence come from one all-gather per forward (cached on the tensor, which
every layer receives). Flash-attention's ``cu_seq_lens_q``/``cu_seq_lens_k`` (transformers'
``DataCollatorWithFlattening``) are accepted too when they describe the full sequence.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from easy_context.core.documents import Documents, cached_on, documents_from_cu_seqlens, local_documents
from easy_context.core.groups import get_sp_group
from easy_context.core.registry import get_attn_func, get_seq_algo
from easy_context.core.seq_algo import KERNEL_OPTIONS, SeqAlgo
from easy_context.hf.kv_cache import active_cache


def _full_length(algo: SeqAlgo, local_len: int) -> int:
    if not algo.distributed:
        return local_len
    return local_len * dist.get_world_size(get_sp_group())


# The keywords of transformers' causal-LM loss (``loss_utils.ForCausalLMLoss`` / ``fixed_cross_entropy``): a
# ``...ForCausalLM.forward`` passes its ``**kwargs`` to both the loss and the decoder, so they reach every attention
# call; they do not change attention. tests/unit/test_hf_dropin.py checks them against transformers' signatures.
LOSS_KWARGS = frozenset({"shift_labels", "num_items_in_batch", "ignore_index"})

# Keywords transformers models pass to attention functions that leave softmax attention as it is (routing outputs,
# packing metadata that :func:`_documents` reads, flags, the loss's), or that :func:`variants` computes. Any other
# keyword with a value is refused: a model that passes e.g. ``position_bias`` (Inkling), ``indices`` (DSA sparse
# attention) or ``sinks`` expects the attention to use it, and ignoring it would silently compute other attention.
KNOWN_KWARGS = LOSS_KWARGS | frozenset({
    "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "is_causal",
    "use_cache", "output_attentions", "output_hidden_states", "output_router_logits", "return_dict",
    "cache_position", "sliding_window", "softcap", "s_aux",
})  # fmt: skip


def check_supported(module: torch.nn.Module, seq_algo: str, query: torch.Tensor, attention_mask, dropout, kwargs):
    """Raise for attention features the SP backends do not implement (never silently wrong attention)."""
    if attention_mask is not None:
        raise NotImplementedError(
            f"{seq_algo}: an attention mask reached sequence-parallel attention (transformers builds none for it: "
            f"{type(module).__name__} made its own, e.g. a learned dynamic mask, which easy_context does not "
            "implement); only causal attention over packed sequences is supported, with documents marked by "
            "position_ids that restart at 0 (no padding mask: pad at the end with target -100)"
        )
    if dropout:
        raise NotImplementedError(
            f"{seq_algo}: attention dropout ({dropout}) is not supported; set config.attention_dropout = 0"
        )
    if kwargs.get("output_attentions"):
        raise NotImplementedError(f"{seq_algo}: output_attentions is not available with sequence parallelism")
    unknown = sorted(k for k, v in kwargs.items() if k not in KNOWN_KWARGS and v is not None and v is not False)
    if unknown:
        raise NotImplementedError(
            f"{seq_algo}: {type(module).__name__} passes {', '.join(unknown)} to its attention function; easy_context "
            "does not implement what it changes in attention (it would be silently ignored), so this model is not "
            "supported"
        )


def sliding_window(module: torch.nn.Module, kwargs: dict[str, Any]) -> int | None:
    """This layer's causal window: transformers' ``sliding_window`` keyword when the model passes one (None on full
    layers), else what the model's own mask uses: ``module.sliding_window`` (Qwen2-MoE sets it on sliding layers),
    else ``config.sliding_window`` on the layers ``config.layer_types`` marks sliding, or on every layer when the
    config has no layer types (Phi-MoE's mask windows them all); off with ``config.use_sliding_window = False``."""
    if "sliding_window" in kwargs:
        return kwargs["sliding_window"]
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    config = getattr(module, "config", None)
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types, layer = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if layer_types and layer is not None:
        return window if layer_types[layer] == "sliding_attention" else None
    return window


def variants(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The soft-cap, sliding window and sinks of this call (keywords of the SP attention function), from
    transformers' kwargs (``softcap``, ``sliding_window``, ``s_aux``) or, where a model keeps them on the module
    or config without passing them, ``config.attn_logit_softcapping``, :func:`sliding_window` and ``module.sinks``."""
    softcap = kwargs.get("softcap") or getattr(getattr(module, "config", None), "attn_logit_softcapping", None)
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), torch.Tensor):
        sinks = module.sinks
    return {"softcap": softcap or None, "sliding_window": sliding_window(module, kwargs), "sinks": sinks}


def _documents(algo: SeqAlgo, options: dict[str, Any], query: torch.Tensor, kwargs) -> Documents | None:
    """The documents of this call: from ``cu_seq_lens_q`` when transformers passes it, else from ``position_ids``."""
    position_ids = kwargs.get("position_ids")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    opts = {k: v for k, v in options.items() if k not in KERNEL_OPTIONS}
    docs = None if position_ids is None else local_documents(algo, position_ids, **opts)
    if cu_q is None:
        return docs
    full = _full_length(algo, query.shape[2])
    cu_docs = cached_on(torch.as_tensor(cu_q), ("cu_seq_lens", algo.name, full, query.shape[0], id(cu_k)),
                        lambda: _documents_from_cu(algo.name, cu_q, cu_k, full, query.shape[0]))  # fmt: skip
    if position_ids is not None and docs != cu_docs:
        raise ValueError(
            f"{algo.name}: cu_seq_lens_q and position_ids describe different documents; pass one or make them agree"
        )
    return cu_docs


def _documents_from_cu(seq_algo: str, cu_q, cu_k, full: int, batch: int) -> Documents | None:
    """Documents of ``cu_seq_lens_q`` (host copies: run once per forward, through :func:`cached_on`)."""
    if cu_k is not None and not torch.equal(torch.as_tensor(cu_q).cpu(), torch.as_tensor(cu_k).cpu()):
        raise NotImplementedError(f"{seq_algo}: cu_seq_lens_q != cu_seq_lens_k (cross-attention) is not supported")
    total = int(torch.as_tensor(cu_q)[-1])
    if total != full or batch != 1:
        raise ValueError(
            f"{seq_algo}: cu_seq_lens_q describe {total} tokens in a batch of {batch}, but the full sequence "
            f"has {full} tokens in one row: pass the cumulative document lengths of the whole (global) sequence, or "
            "only position_ids restarting at each document"
        )
    return documents_from_cu_seqlens(cu_q)


_CALLS = [0]


def attention_calls() -> int:
    """How many times any easy_context attention function ran in this process (the patch's hooks use the count to
    detect a forward that never reached it)."""
    return _CALLS[0]


def _layer_key(module: torch.nn.Module) -> int:
    """The cache slot of an attention module: its ``layer_idx`` (transformers sets it), else its identity."""
    layer = getattr(module, "layer_idx", None)
    return int(layer) if layer is not None else id(module)


def sp_world() -> int:
    """Ranks sharing each sequence (1 without a process group)."""
    return dist.get_world_size(get_sp_group()) if dist.is_initialized() else 1


def own_attention_function(module: torch.nn.Module, own: str) -> Callable[..., Any] | None:
    """The attention function the model of ``module`` had before it was switched (``own``: its implementation name):
    transformers' registered one, or the modeling file's ``eager_attention_forward`` for ``eager``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if own == "eager":
        return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return ALL_ATTENTION_FUNCTIONS[own] if own in ALL_ATTENTION_FUNCTIONS.valid_keys() else None


def make_hf_attention(seq_algo: SeqAlgo | str, **options: Any) -> Callable[..., tuple[torch.Tensor, None]]:
    """The transformers attention function for ``seq_algo`` (a backend or its name; ``options``: kernel,
    ring_degree, ...). The backend is looked up here, once: the function holds it."""
    algo = get_seq_algo(seq_algo)
    attn = get_attn_func(algo, **options)
    sharded = algo.distributed

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
        own = getattr(module, "_easy_context_own_attention", None)
        if attention_mask is not None and own is not None and (not sharded or sp_world() == 1):
            # a mask transformers built for the model's own attention (a padded or cached forward on one process,
            # recomputed by gradient checkpointing after the forward switched back): the model's own numbers
            fn = own_attention_function(module, own)
            if fn is not None:
                return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        _CALLS[0] += 1
        check_supported(module, algo.name, query, attention_mask, dropout, kwargs)
        causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        extra = variants(module, kwargs)
        cache = active_cache()
        if cache is not None and cache.mode == "decode":  # one new token against the sharded cache
            scale = scaling if scaling is not None else q.shape[-1] ** -0.5
            out = cache.attend(_layer_key(module), q, k, v, kwargs.get("position_ids"), scale, extra, None)
            return out, None

        def call() -> torch.Tensor:
            documents = _documents(algo, options, query, kwargs)
            return attn(q, k, v, softmax_scale=scaling, causal=causal, documents=documents, **extra)

        if cache is not None:  # prefill: record this rank's K/V shard
            scale = scaling if scaling is not None else q.shape[-1] ** -0.5
            return cache.attend(_layer_key(module), q, k, v, kwargs.get("position_ids"), scale, extra, call), None
        return call(), None

    easy_context_attention.__name__ = f"easy_context_{algo.name}_attention"
    return easy_context_attention
