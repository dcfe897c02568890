"""Which transformers models sequence parallelism can run, and the model-level pieces it needs besides attention.

Sequence parallelism splits every token-mixing layer over the ranks. easy_context does that for softmax attention
reached through transformers' ``AttentionInterface``; everything else in a decoder (norms, MLPs, MoE routing,
embeddings, RoPE from ``position_ids``) works token by token. A model is refused with one error naming why when:

* transformers cannot switch its attention (the model computes attention in its own code, not through
  ``AttentionInterface``): each rank would silently attend within its own shard only;
* ``config.layer_types`` (transformers' standard per-layer kinds) holds a layer that is not plain (full or sliding)
  softmax attention: recurrent / linear-attention / convolution layers (Mamba, gated DeltaNet, ...; refused when
  the sequence is split), attention with a learned sparse indexer or compressed keys, chunked attention (refused
  whenever easy_context's attention replaces the model's); see :data:`LAYER_KINDS`;
* its forward runs without calling easy_context's attention at all (checked at every forward, see
  :func:`check_attention_called`).

:func:`global_rope_positions` handles RoPE variants whose frequencies depend on the largest position id of the
batch (``dynamic`` NTK scaling, ``longrope``): each rank sees only its shard's positions, so they are made to see the
global maximum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention"})
MLP_KINDS = frozenset({"moe", "mlp", "dense", "sparse"})  # layers without token mixing (e.g. Nemotron-H's MoE layers)

_RECURRENT = ("mixes tokens through a recurrent state or a causal convolution, not softmax attention; sequence "
              "parallelism of such layers is not implemented")  # fmt: skip
_SPARSE = ("attends to keys chosen by a learned indexer or compressed blocks, not to every key in its window; "
           "sequence parallelism of that selection is not implemented")  # fmt: skip

# transformers' layer kinds (configuration_utils.ALLOWED_ATTN_LAYER_TYPES) that easy_context does not implement, why.
# Token mixing outside attention: refused when the sequence is split (on one process the model's own layers run).
RECURRENT_KINDS: dict[str, str] = {
    "linear_attention": f"a recurrent layer (Mamba / Mamba-2 / gated DeltaNet / lightning attention) {_RECURRENT}",
    "hybrid": f"attention combined with a recurrent (Mamba-like) branch in one layer; the branch {_RECURRENT}",
    "hybrid_sliding": f"sliding attention combined with a recurrent branch in one layer; the branch {_RECURRENT}",
    "conv": f"a short-convolution layer that {_RECURRENT}",
}
# Attention that is not plain (full or sliding) softmax attention: refused whenever easy_context's attention replaces
# the model's, sharded or not.
ATTENTION_VARIANT_KINDS: dict[str, str] = {
    "indexed_attention": f"sparse attention (DSA-style indexer) that {_SPARSE}",
    "compressed_sparse_attention": f"compressed sparse attention that {_SPARSE}",
    "heavily_compressed_attention": f"heavily compressed attention that {_SPARSE}",
    "minimax_m3_sparse": f"lightning-index sparse attention that {_SPARSE}",
    "chunked_attention": "chunked attention (Llama 4: attention within fixed chunks, NoPE layers whose query scale "
    "is computed from the local token index), not implemented",
    "window_attention": "non-overlapping window attention, not implemented",
}
LAYER_KINDS = {**RECURRENT_KINDS, **ATTENTION_VARIANT_KINDS}


def with_sub_configs(config: Any) -> list[Any]:
    """``config`` and its sub-configs (a multimodal model's text config), depth first."""
    out, todo = [], [config]
    while todo:
        cfg = todo.pop()
        out.append(cfg)
        todo.extend(getattr(cfg, sub, None) for sub in getattr(cfg, "sub_configs", {}) or {})
        todo = [c for c in todo if c is not None]
    return out


def unsupported_layers(config: Any, sharded: bool = True) -> list[tuple[str, str]]:
    """(layer kind, why) of each layer kind in ``config.layer_types`` (and its sub-configs') that easy_context's
    attention does not implement; recurrent / convolution kinds count only when ``sharded``. Empty when every layer
    is full or sliding attention (or an MLP-only layer)."""
    kinds: dict[str, str] = {}
    for cfg in with_sub_configs(config):
        for kind in getattr(cfg, "layer_types", None) or ():
            if kind in ATTENTION_KINDS or kind in MLP_KINDS or (kind in RECURRENT_KINDS and not sharded):
                continue
            kinds[kind] = LAYER_KINDS.get(kind, "a layer kind easy_context does not know")
    return list(kinds.items())


def check_model_supported(model: nn.Module, seq_algo: str, sharded: bool = True) -> None:
    """Raise ``NotImplementedError`` naming why ``model`` cannot run ``seq_algo`` attention (split over ranks when
    ``sharded``)."""
    config = getattr(model, "config", None)
    name = getattr(config, "model_type", type(model).__name__)
    problems = unsupported_layers(config, sharded)
    if problems:
        kinds = "; ".join(f"'{kind}': {why}" for kind, why in problems)
        raise NotImplementedError(
            f"{seq_algo}: model type '{name}' has layers of a kind easy_context's attention cannot compute"
            f"{' split over ranks' if sharded else ''} (config.layer_types): {kinds}. Train it without sequence "
            "parallelism and with the model's own attention (data_parallel, no kernel / always)"
        )


def check_switched(model: nn.Module, seq_algo: str, wanted: str) -> None:
    """Raise when transformers kept the model's own attention instead of ``wanted`` (it only logs a warning)."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current != wanted:
        raise NotImplementedError(
            f"{seq_algo}: {type(model).__name__} (model type '{getattr(config, 'model_type', '?')}') computes "
            f"attention in its own code, not through transformers' AttentionInterface, so easy_context cannot "
            f"replace it (it stays '{current}'); under sequence parallelism each rank would attend only within its "
            "own shard"
        )


# transformers' output flags whose outputs it records from each attention module's second return value (its
# ``capture_outputs``: ``attentions``, and cross-attentions / SAM's mask-decoder attentions under the same flag), read
# from the forward's keyword or else the config; easy_context's attention returns no weights there, so the flag would
# give empty or None attentions silently.
ATTENTION_OUTPUT_FLAGS = ("output_attentions",)


def check_attention_outputs(model: nn.Module, seq_algo: str, kwargs: dict[str, Any] | None = None) -> None:
    """Raise ``NotImplementedError`` when a flag of :data:`ATTENTION_OUTPUT_FLAGS` is on for ``model``: in ``kwargs``
    (a forward's keywords) or, where they do not set it, on its config or a sub-config."""
    kwargs = kwargs or {}
    for flag in ATTENTION_OUTPUT_FLAGS:
        if flag in kwargs and kwargs[flag] is not None:
            on, where = bool(kwargs[flag]), f"{flag}=True passed to forward"
        else:
            configs = [c for c in with_sub_configs(getattr(model, "config", None)) if getattr(c, flag, False)]
            on, where = bool(configs), f"config.{flag} = True ({type(configs[0]).__name__ if configs else ''})"
        if on:
            raise NotImplementedError(
                f"{seq_algo}: {where} asks for attention weights, which easy_context's attention does not compute "
                f"(transformers would return none, silently); set {flag} = False on the config and pass it False, or "
                "keep the model's own eager attention to inspect weights"
            )


def attention_not_called(model: nn.Module, seq_algo: str) -> NotImplementedError:
    """The error for a forward that never reached easy_context's attention."""
    config = getattr(model, "config", None)
    return NotImplementedError(
        f"{seq_algo}: {type(model).__name__} (model type '{getattr(config, 'model_type', '?')}') ran a forward "
        "without calling easy_context's attention: its token mixing (a recurrent or convolution layer, or attention "
        "in its own code) does not go through transformers' AttentionInterface, so sequence parallelism would "
        "silently compute each shard alone"
    )


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM: the module that returns ``last_hidden_state`` (``model.model`` for most).

    ``get_decoder()`` is transformers' best effort; it returns the LM itself where the attribute names differ (Llama 4
    text) and a ``Linear`` where the head is called ``decoder`` (ModernBERT decoder)."""
    from transformers import PreTrainedModel

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if isinstance(decoder, PreTrainedModel) and decoder is not model:
        return decoder
    base = getattr(model, "base_model", None)
    if isinstance(base, PreTrainedModel) and base is not model:
        return base
    inner = [m for m in model.children() if isinstance(m, PreTrainedModel)]
    if len(inner) == 1:
        return inner[0]
    if isinstance(decoder, PreTrainedModel):  # a base model (``LlamaModel``) is its own decoder
        return decoder
    raise NotImplementedError(f"{type(model).__name__}: cannot find its decoder (the module returning hidden states)")


SEQUENCE_DEPENDENT_ROPE = ("dynamic", "longrope")  # frequencies / scale chosen from max(position_ids) + 1


def _rope_types(module: nn.Module) -> list[str]:
    kinds = getattr(module, "rope_type", None)
    if kinds is None:  # a model's own rotary class (Phi-MoE) reads the config
        params = getattr(getattr(module, "config", None), "rope_parameters", None) or {}
        kinds = params.get("rope_type") if "rope_type" in params else {k: v.get("rope_type") for k, v in params.items()
                                                                           if isinstance(v, dict)}  # fmt: skip
    values = kinds.values() if isinstance(kinds, dict) else [kinds]
    return [str(v) for v in values if v is not None]


def sequence_dependent_rope(model: nn.Module) -> list[nn.Module]:
    """The rotary-embedding modules of ``model`` whose frequencies depend on the batch's largest position id."""
    return [
        m for m in model.modules()
        if type(m).__name__.endswith("RotaryEmbedding")
        and any(s in kind for kind in _rope_types(m) for s in SEQUENCE_DEPENDENT_ROPE)
    ]  # fmt: skip


def global_rope_positions(module: nn.Module, group_fn: Callable[[], Any] | None) -> None:
    """Make a rotary embedding ``forward(x, position_ids, ...) -> (cos, sin)`` choose its frequencies from the
    largest position id over the sequence-parallel group, as the single-process model does over the whole row.

    The rank's ``position_ids`` get one extra column holding the global maximum (the only thing the frequency choice
    reads: ``max(position_ids) + 1``); the outputs drop that column again. ``group_fn()`` returns the SP group;
    ``None`` removes the hooks (the model is no longer sharded)."""

    def before(mod: nn.Module, args: tuple, kwargs: dict[str, Any]):
        args = list(args)
        in_args = len(args) > 1
        pos = args[1] if in_args else kwargs.get("position_ids")
        if pos is None or pos.dim() != 2:
            raise NotImplementedError(f"{type(mod).__name__}: expected position_ids of shape (batch, seq)")
        top = pos.max().reshape(1).to(torch.int64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group_fn())
        pos = torch.cat([pos, top.to(pos.dtype).expand(pos.shape[0], 1)], dim=1)
        if in_args:
            args[1] = pos
        else:
            kwargs["position_ids"] = pos
        return tuple(args), kwargs

    def after(mod: nn.Module, args: tuple, kwargs: dict[str, Any], output):
        if isinstance(output, torch.Tensor):
            return output[:, :-1]
        return type(output)(o[:, :-1] for o in output)

    for handle in getattr(module, "_easy_context_rope_hooks", ()):
        handle.remove()
    module._easy_context_rope_hooks = ()
    if group_fn is None:
        return
    module._easy_context_rope_hooks = (
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    )
