"""Losses for sequence-parallel training: memory-light linear cross-entropy and the exact global mean.

::

    from easy_context.loss import linear_cross_entropy, global_mean_loss, global_mean_for_logging

    loss_sum, n = linear_cross_entropy(hidden, lm_head.weight, targets)     # (B, S_local, H), (B, S_local)
    loss = global_mean_loss(loss_sum, n, grad_average_world=world_size)    # backward this
    logged = global_mean_for_logging(loss_sum, n)                           # report this

    impl, why = resolve_loss_impl("auto", device)   # "liger" on CUDA with liger-kernel installed, else "chunked"
"""

from easy_context.loss.chunked_ce import (
    DEFAULT_CHUNK_SIZE,
    IGNORE_INDEX,
    chunked_linear_cross_entropy,
    plain_linear_cross_entropy,
)
from easy_context.loss.fused_ce import (
    LCE_IMPLS,
    cce_linear_cross_entropy,
    liger_linear_cross_entropy,
    linear_cross_entropy,
)
from easy_context.loss.global_loss import (
    all_reduce_count,
    count_valid_targets,
    global_mean_for_logging,
    global_mean_loss,
)
from easy_context.loss.lm_head import CausalLMWithLoss, LMHeadWithLoss
from easy_context.loss.logit_scale import LOGIT_SCALING, logit_multiplier
from easy_context.loss.select import HEAD_LOSS_IMPLS, LOSS_CHOICES, resolve_loss_impl

__all__ = [
    "HEAD_LOSS_IMPLS",
    "CausalLMWithLoss",
    "LMHeadWithLoss",
    "DEFAULT_CHUNK_SIZE",
    "IGNORE_INDEX",
    "LCE_IMPLS",
    "LOGIT_SCALING",
    "LOSS_CHOICES",
    "all_reduce_count",
    "cce_linear_cross_entropy",
    "chunked_linear_cross_entropy",
    "count_valid_targets",
    "global_mean_for_logging",
    "global_mean_loss",
    "liger_linear_cross_entropy",
    "linear_cross_entropy",
    "logit_multiplier",
    "plain_linear_cross_entropy",
    "resolve_loss_impl",
]
