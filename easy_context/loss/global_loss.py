"""The exact global loss of a sequence-parallel (and data-parallel) step.

The quantity we train on is the token-weighted mean over EVERY valid target (target != -100) of the whole
step: all SP shards of every sequence and every DP rank's batch,

    L = sum_{all ranks r} S_r / N,        S_r = sum of rank r's per-token losses,   N = sum_r n_r,

where n_r is rank r's number of valid targets. Each rank computes ``S_r`` and ``n_r`` locally, the counts
are all-reduced (an integer, no grad), and the rank's loss is ``S_r / N``. Then the SUM over ranks of the
ranks' gradients is exactly dL/dθ.

Why not "each rank's mean, then average" (what EasyContext did)? Rank r would use ``S_r / n_r`` and the
trainer averages gradients over W ranks, which weights a token of rank r by ``1 / (W * n_r)`` instead of
``1 / N``. With -100 labels the n_r differ a lot (a prompt masked with -100 sits on the first shards, padding
on the last), so tokens on sparsely labelled shards are over-weighted — a biased gradient; and a shard with
NO valid target gives ``0 / 0 = NaN``, which the gradient all-reduce spreads to every rank.

Gradient averaging: DDP, Accelerate and DeepSpeed AVERAGE parameter gradients over their ``W`` ranks (they
divide the sum by W). With ``grad_average_world=W`` the returned loss is ``W * S_r / N`` so the averaged
gradient equals dL/dθ. The returned value is then NOT the loss to report: log
:func:`global_mean_for_logging` (the all-reduced, detached L) instead.

Typical step (every rank of ``group``, here the world, holding its shard of inputs and shifted targets)::

    loss_sum, n = linear_cross_entropy(hidden, lm_head.weight, targets)     # easy_context.loss
    loss = global_mean_loss(loss_sum, n, grad_average_world=dist.get_world_size())
    accelerator.backward(loss)                                                # averages grads over W ranks
    log(global_mean_for_logging(loss_sum, n))

Gradient accumulation: this normalises by the tokens of ONE micro-step. For the exact mean over k
micro-steps, pass the count summed over all k micro-batches as ``num_valid`` (it is all-reduced the same way)
and mind that Accelerate divides the loss by k in ``backward`` (multiply ``grad_average_world`` by k).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def count_valid_targets(targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """int64 scalar: the number of entries of ``targets`` (any shape) that are not ``ignore_index``."""
    return (targets != ignore_index).sum()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_count(
    num_valid: torch.Tensor | int, group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """int64 scalar: ``num_valid`` summed over ``group`` (default: the world; no-op without torch.distributed)."""
    count = torch.as_tensor(num_valid, dtype=torch.long, device=device).detach().clone().reshape(())
    if _distributed():
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    return count


def global_mean_loss(
    loss_sum: torch.Tensor,
    num_valid: torch.Tensor | int,
    group: dist.ProcessGroup | None = None,
    grad_average_world: int | None = None,
    already_reduced: bool = False,
) -> torch.Tensor:
    """This rank's share ``loss_sum / N`` of the exact global mean loss (collective over ``group``).

    Args:
        loss_sum: scalar, differentiable: the SUM of this rank's per-token losses over its valid targets
            (e.g. from ``linear_cross_entropy`` or ``F.cross_entropy(..., reduction="sum")``). Must be 0 when
            the rank has no valid target (a sum is; a mean would be NaN).
        num_valid: this rank's number of valid targets (int or scalar tensor).
        group: the ranks whose tokens form the step: default the world (all SP and DP ranks).
        grad_average_world: if the trainer AVERAGES gradients over W ranks (DDP, Accelerate, DeepSpeed),
            pass W: the loss is multiplied by W so the averaged gradient is the global mean's gradient.
            None: the ranks' gradients are meant to be SUMMED.
        already_reduced: ``num_valid`` is already the total over ``group`` (from :func:`all_reduce_count`,
            e.g. counted once for several micro-batches): no collective here.

    Returns:
        scalar, same dtype as ``loss_sum``. The sum over ranks of the returned values (times
        ``1/grad_average_world``) is the global mean loss. 0 with 0 gradients if ``N == 0``; never NaN.
        To report the loss use :func:`global_mean_for_logging`.
    """
    if already_reduced:
        total = torch.as_tensor(num_valid, dtype=torch.long, device=loss_sum.device).reshape(())
    else:
        total = all_reduce_count(num_valid, group, device=loss_sum.device)
    scale = 1.0 if grad_average_world is None else float(grad_average_world)
    if grad_average_world is not None and grad_average_world < 1:
        raise ValueError(f"grad_average_world must be >= 1 or None, got {grad_average_world}")
    # clamp(min=1): with N == 0 every loss_sum is 0, so the loss and its gradients are exactly 0.
    return (loss_sum.float() * scale / total.clamp(min=1).float()).to(loss_sum.dtype)


def global_mean_for_logging(
    loss_sum: torch.Tensor, num_valid: torch.Tensor | int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """The true global mean loss ``sum_r S_r / sum_r n_r`` (fp32, detached, same value on every rank).

    Collective over ``group`` (one all-reduce of two fp64 numbers). 0 when no rank has a valid target.
    """
    stats = torch.stack(
        [loss_sum.detach().to(torch.float64).reshape(()), torch.as_tensor(num_valid).to(loss_sum.device, torch.float64)]
    )
    if _distributed():
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    return (stats[0] / stats[1].clamp(min=1)).float()
