"""Shard a batch for sequence parallelism (EasyContext's ``prepare_seq_parallel_inputs``) and pad it first."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from easy_context.core.padding import pad_to_multiple
from easy_context.core.registry import extract_local, seq_multiple

IGNORE_INDEX = -100


def shift_targets(labels: torch.Tensor) -> torch.Tensor:
    """``(batch, seq)`` labels -> ``(batch, seq)`` targets as transformers' ``ForCausalLMLoss`` shifts them: target
    ``i`` is ``labels[:, i + 1]``, the last position has none (-100).

    Shift the whole sequence once, then shard it: the shard is what a switched model takes as ``shift_labels=``
    under SP (``labels=`` would shift each rank's shard on its own)."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def pad_seq_parallel_inputs(
    seq_algo: str,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    target_ids: torch.Tensor,
    world_size: int,
    pad_token_id: int = 0,
    **options,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad (batch, seq) ids at the end to the length ``seq_algo`` needs on ``world_size`` ranks.

    Input ids get ``pad_token_id``, targets get -100 (ignored by the loss), position ids keep counting from each
    row's last position (pad positions only follow real tokens, which never attend to them under causal attention;
    with packed documents the padding joins the row's last document).
    Returns (input_ids, position_ids, target_ids).
    """
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    multiple = seq_multiple(seq_algo, world_size, **options)
    length = input_ids.shape[1]
    padded = -(-length // multiple) * multiple
    if padded == length:
        return input_ids, position_ids, target_ids
    extra = position_ids[:, -1:] + torch.arange(1, padded - length + 1, device=position_ids.device)
    return (
        pad_to_multiple(input_ids, multiple, dim=1, value=pad_token_id),
        torch.cat([position_ids, extra.to(position_ids.dtype)], dim=1),
        pad_to_multiple(target_ids, multiple, dim=1, value=-100),
    )


def prepare_seq_parallel_inputs(
    seq_algo: str,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    target_ids: torch.Tensor | None,
    rank: int,
    world_size: int,
    device: torch.device | str,
    attention_mask: torch.Tensor | None = None,
    **options,
) -> dict[str, torch.Tensor | None]:
    """This rank's shard of (batch, seq) ids: ``{"local_input_ids", "local_position_ids", "local_target_ids"}``.

    ``target_ids`` are already shifted by the caller (target i is the token after input i: :func:`shift_targets` of
    transformers-style labels); None (inference, as in EasyContext) gives ``local_target_ids`` None. A switched
    transformers model takes ``local_target_ids`` as ``shift_labels=`` for its own loss. A (batch, seq) padding
    ``attention_mask`` (left or right padding) is sharded the same way, as ``local_attention_mask``, for a switched
    model's ``attention_mask=``. ``rank`` and
    ``world_size`` are the SP rank and size. Lengths that do not shard evenly raise an error naming
    :func:`pad_seq_parallel_inputs` (:meth:`SeqAlgo.check_length <easy_context.core.seq_algo.SeqAlgo.check_length>`).
    """
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    shard = lambda x: extract_local(seq_algo, x, rank, world_size, dim=1, **options).to(device)  # noqa: E731
    local = {
        "local_input_ids": shard(input_ids),
        "local_position_ids": shard(position_ids),
        "local_target_ids": None if target_ids is None else shard(target_ids),
    }
    if attention_mask is not None:
        local["local_attention_mask"] = shard(attention_mask)
    return local
