"""The causal LM's output layer as a loss: the LM head's forward computes the loss from hidden states.

Putting the loss *inside the head's forward* matters under DeepSpeed ZeRO-3: parameters are gathered
only around a module's forward, so the head weight exists there and nowhere else. The head keeps the
original ``weight`` (and ``bias``) Parameters, so state-dict keys, weight tying and ``generate`` are
unchanged: called with hidden states alone it returns logits as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from easy_context.loss.chunked_ce import DEFAULT_CHUNK_SIZE, IGNORE_INDEX
from easy_context.loss.fused_ce import linear_cross_entropy
from easy_context.loss.logit_scale import logit_multiplier
from easy_context.loss.select import resolve_loss_impl


def _flash_attn_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's fused cross-entropy on materialised logits (EasyContext's choice), as (sum, count)."""
    try:
        from flash_attn.losses.cross_entropy import CrossEntropyLoss
    except ImportError as exc:
        raise ImportError(
            "loss 'flash_attn' needs the flash-attn package (pip install easy_context[gpu]); "
            "use --loss chunked (no (seq, vocab) logits, runs anywhere)"
        ) from exc
    loss = CrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")(logits.flatten(0, -2), targets.flatten())
    return loss, (targets != IGNORE_INDEX).sum()


def _resolve(impl: str) -> str:
    """``impl`` checked, ``"auto"`` made concrete for this machine (:func:`easy_context.loss.select.resolve_loss_impl`;
    a run that trains elsewhere than on the machine's GPU resolves with its device first, as train.py does)."""
    return resolve_loss_impl(impl)[0]


class LMHeadWithLoss(nn.Module):
    """``head(hidden)`` -> logits (b, s, V); ``head(hidden, targets)`` -> (loss_sum fp32, n_valid int64).

    ``impl``: one of :data:`HEAD_LOSS_IMPLS` or ``"auto"`` (made concrete here; ``self.impl`` is what runs)."""

    def __init__(self, head: nn.Linear, impl: str = "chunked", chunk_size: int = DEFAULT_CHUNK_SIZE):
        super().__init__()
        impl = _resolve(impl)
        self.weight = head.weight  # the same Parameter objects: keys, tying and optimizer state unchanged
        self.bias = getattr(head, "bias", None)
        self.impl, self.chunk_size = impl, chunk_size
        shape = getattr(self.weight, "ds_shape", self.weight.shape)  # ZeRO-3 partitions params to shape (0,)
        self.out_features, self.in_features = int(shape[0]), int(shape[1])

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None, logit_softcapping=None,
                logit_scale: float = 1.0):  # fmt: skip
        """Logits (no ``targets``: the head as the model calls it), else the loss of ``logit_scale`` x logits, then
        soft-capped (the model's own order; :mod:`easy_context.loss.logit_scale`)."""
        if targets is None:
            return F.linear(hidden, self.weight, self.bias)
        if logit_scale != 1.0:
            if self.bias is not None:
                raise NotImplementedError("a logit scale with an LM-head bias; use a model without one")
            hidden = hidden * logit_scale  # (m h) W^T = m (h W^T): the same loss for every implementation
        if self.impl == "flash_attn":
            return _flash_attn_cross_entropy(F.linear(hidden, self.weight, self.bias), targets)
        return linear_cross_entropy(
            hidden, self.weight, targets, self.bias, impl=self.impl, chunk_size=self.chunk_size,
            logit_softcapping=logit_softcapping,
        )  # fmt: skip


def check_plain_head(model: nn.Module, head: nn.Module) -> None:
    """Raise unless ``model``'s logits are ``head(decoder(...).last_hidden_state)`` with ``head`` a plain Linear: the
    loss computes ``hidden @ W^T + b`` itself and would silently skip anything else (a per-token logit scale in the
    head's forward: Dory; a prediction head between the decoder and the output layer: ModernBERT decoder)."""
    from easy_context.hf.support import decoder_of

    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        raise NotImplementedError(
            f"{type(model).__name__}: its output layer {type(head).__name__} computes more than a linear map of the "
            "hidden states; easy_context's loss would skip it (use the model's own loss: labels=)"
        )
    decoder = decoder_of(model)
    inner = {id(m) for m in decoder.modules()} | {id(m) for m in head.modules()}
    for name, child in model.named_children():
        holds_decoder = any(m is decoder for m in child.modules())
        if not holds_decoder and id(child) not in inner and any(True for _ in child.parameters()):
            raise NotImplementedError(
                f"{type(model).__name__}: {name} ({type(child).__name__}) has weights outside its decoder and output "
                "layer (it runs between them); easy_context's loss would skip it (use the model's own loss: labels=)"
            )


class CausalLMWithLoss(nn.Module):
    """``forward(input_ids, position_ids, targets) -> (loss_sum, n_valid)`` for a transformers causal LM.

    Runs the decoder, then the loss inside the LM head (:class:`LMHeadWithLoss`), never materialising
    (seq, vocab) logits with the chunked loss. ``model`` keeps working as a normal HF model.
    Layouts: input_ids/position_ids/targets (batch, seq_local); targets already shifted, -100 ignored.
    """

    def __init__(self, model: nn.Module, impl: str = "chunked", chunk_size: int = DEFAULT_CHUNK_SIZE):
        super().__init__()
        impl = _resolve(impl)  # "auto" once, here: self.impl is what runs
        self.logit_scale = logit_multiplier(model.config)  # Cohere, Granite, ...: 1.0 for most models
        head = model.get_output_embeddings()
        if not isinstance(head, LMHeadWithLoss):
            check_plain_head(model, head)
            model.set_output_embeddings(LMHeadWithLoss(head, impl, chunk_size))
        self.model, self.impl = model, model.get_output_embeddings().impl
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        if self.softcap and self.impl == "flash_attn":
            raise NotImplementedError("loss 'flash_attn' cannot apply final_logit_softcapping; use --loss chunked")
        # FSDP's auto-wrap policy and DeepSpeed's "auto" bucket sizes look at the root module
        self._no_split_modules = getattr(model, "_no_split_modules", None)
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, targets: torch.Tensor):
        from easy_context.hf.support import decoder_of  # the loss package imports no transformers code at import time

        out = decoder_of(self.model)(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        return self.model.get_output_embeddings()(out.last_hidden_state, targets, logit_softcapping=self.softcap,
                                                  logit_scale=self.logit_scale)  # fmt: skip
