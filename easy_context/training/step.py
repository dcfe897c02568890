"""One optimizer step of the training program (easy_context/train.py): shard the micro-batches, count the valid
targets once, forward/backward each micro-batch, clip, and the policy for a step whose loss or gradient norm is
inf/NaN (``--nonfinite stop|skip``), decided before the update, the same on every rank."""

from __future__ import annotations

import math
import sys

import torch

from easy_context.core.document_order import balance_documents
from easy_context.loss import all_reduce_count, global_mean_for_logging, global_mean_loss
from easy_context.sp_config import SPConfig


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(inputs, position_ids or None, targets), each ``(batch, seq_length)``, of a ``(batch, seq_length + 1)``
    micro-batch, on its device (train.py's loader keeps batches on the host). A dataset packed with ``--pack
    documents`` also yields position_ids restarting at each document (attention stays inside it); one with needle rows
    trained on their answers yields labels (-100: not trained), whose next token is the target."""
    if not isinstance(batch, dict):
        return batch[:, :-1], None, batch[:, 1:]
    positions = batch.get("position_ids")
    targets = batch.get("labels", batch["input_ids"])
    return batch["input_ids"][:, :-1], None if positions is None else positions[:, :-1], targets[:, 1:]


def host_batch(batch, sp: SPConfig, balance: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`split_batch`; with ``balance`` the whole documents of each row reordered so that ``sp``'s ring steps
    get even work (:func:`~easy_context.core.document_order.balance_documents`: every rank computes the same order)."""
    parts = split_batch(batch)
    if balance and parts[1] is not None:
        parts = balance_documents(*parts, sp.algo, sp.sp_size, **sp.options)
    return parts


def to_host(loss: torch.Tensor, grad_norm: torch.Tensor | float | None) -> tuple[float, float | None]:
    """The step's loss and gradient norm as Python floats, in one device-to-host sync."""
    if grad_norm is None:
        return loss.item(), None
    loss, grad_norm = torch.stack([loss, torch.as_tensor(grad_norm, dtype=loss.dtype, device=loss.device)]).tolist()
    return loss, grad_norm


def nonfinite_problem(step: int, loss: float, grad_norm: float | None) -> str | None:
    """Why step ``step`` must not update the weights (its loss or gradient norm is inf/NaN), or None."""
    bad = [f"{name} {value}" for name, value in (("loss", loss), ("gradient norm", grad_norm))
           if value is not None and not math.isfinite(value)]  # fmt: skip
    return f"step {step}: non-finite {' and '.join(bad)}" if bad else None


def poison_unless_finite(loss: torch.Tensor, step_loss: torch.Tensor) -> torch.Tensor:
    """``loss`` (scalar) times 1 when ``step_loss`` (scalar, the same on every rank) is finite, times NaN when not:
    every gradient of its backward is then NaN, which DeepSpeed's own check of the gradient norm turns into a skipped
    update. On the device: no host sync; times 1 is exact."""
    factor = torch.where(torch.isfinite(step_loss), 1.0, math.nan).to(device=loss.device, dtype=loss.dtype)
    return loss * factor


class TrainStep:
    """One optimizer step: ``step(n, batches)`` trains the ``K = len(batches)`` micro-batches (full
    ``(batch, seq_length + 1)`` rows on the host, as the loader yields them) and returns the step's exact global mean
    loss (every token of every micro-batch, rank and DP replica).

    Each micro-batch is sharded on the host (this rank's ``(batch, seq_length / sp_size)`` slice), its valid targets
    counted there (one all-reduce for the step, no device sync), then the shards move to the device once. Each backward
    takes ``loss_sum x K x W / N_total`` (accelerate/DeepSpeed divide by K and average over W ranks).

    ``--nonfinite``: a non-finite loss or gradient norm drops the update (``skip``, at most ``max_skips_in_a_row`` in a
    row) or ends the run before it (``stop``); the data and the LR schedule advance either way. Under DeepSpeed the
    update runs inside the last micro-batch's backward: the step's loss is reduced before that backward, and a
    non-finite one makes its gradients NaN, so that DeepSpeed's check of the gradient norm (ZeRO 1-3; fp16 loss
    scaling) skips the update; a non-finite gradient norm DeepSpeed skips by itself. Should a DeepSpeed version or
    configuration apply such an update anyway (``was_step_applied``), the run ends with an error naming that, before
    any checkpoint from it."""

    def __init__(self, accelerator, model, optimizer, scheduler, sp: SPConfig, *, balance_documents: bool = False,
                 grad_clip: float = 1.0, nonfinite: str = "stop", max_skips_in_a_row: int = 10,
                 skipped: int = 0) -> None:  # fmt: skip
        self.accelerator, self.model, self.optimizer, self.scheduler, self.sp = (
            accelerator, model, optimizer, scheduler, sp)  # fmt: skip
        self.balance, self.grad_clip = balance_documents, grad_clip
        self.nonfinite, self.max_skips_in_a_row = nonfinite, max_skips_in_a_row
        self.deepspeed = accelerator.state.deepspeed_plugin is not None
        # fp16 loss scaling: inf gradients are the scaler's
        self.check_grad_norm = accelerator.mixed_precision != "fp16"
        self.skipped = skipped  # steps whose update was dropped, this run and the runs it resumes
        self.skips_in_a_row = 0
        self.grad_norm: float | None = None  # the last step's gradient norm before clipping (None: not clipped)

    def __call__(self, step: int, batches: list) -> float:
        """Train optimizer step ``step`` (1-based, for messages) on ``batches``; returns its loss."""
        shards = [self.sp.shard(*host_batch(b, self.sp, self.balance), "cpu") for b in batches]
        n_local = sum(int((s["local_target_ids"] != -100).sum()) for s in shards)
        n_total = all_reduce_count(n_local, device=self.accelerator.device)
        shards = [{k: v.to(self.accelerator.device, non_blocking=True) for k, v in s.items()} for s in shards]
        step_loss = self._forward_backward(shards, n_local, n_total)
        # one decision per step, the same on every rank: the loss is reduced over ranks, the gradients already are
        # (identical on each)
        grad_norm = None
        if self.grad_clip or self.deepspeed:  # DeepSpeed clips inside its step: this returns its norm
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        loss, grad_norm = to_host(step_loss, grad_norm)
        self.grad_norm = grad_norm
        problem = nonfinite_problem(step, loss, grad_norm if self.check_grad_norm else None)
        if problem is None:
            self.skips_in_a_row = 0
            self.optimizer.step()  # a no-op under DeepSpeed (it stepped in the last backward)
        else:
            self.skipped, self.skips_in_a_row = self.skipped + 1, self.skips_in_a_row + 1
            self.stop_unless_skippable(problem)
        self.scheduler.step()
        self.optimizer.zero_grad()
        return loss

    def _forward_backward(self, shards: list[dict[str, torch.Tensor]], n_local: int,
                          n_total: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Forward and backward of each shard (``local_*_ids``: ``(batch, seq_length / sp_size)`` on the device);
        returns the step's global mean loss (fp32 scalar, the same on every rank), reduced before the last
        backward."""
        sums = []
        for i, shard in enumerate(shards):
            with self.accelerator.accumulate(self.model):
                loss_sum, _ = self.model(shard["local_input_ids"], shard["local_position_ids"],
                                         shard["local_target_ids"])  # fmt: skip
                sums.append(loss_sum.detach())
                # accelerate/DeepSpeed average grads over ranks and divide by the accumulation steps: undo both
                loss = global_mean_loss(loss_sum * len(shards), n_total, already_reduced=True,
                                        grad_average_world=self.accelerator.num_processes)  # fmt: skip
                if i == len(shards) - 1:
                    step_loss = global_mean_for_logging(torch.stack(sums).sum(), n_local)
                    if self.deepspeed:  # its update runs inside this backward: a non-finite step must not reach it
                        loss = poison_unless_finite(loss, step_loss)
                self.accelerator.backward(loss)  # under DeepSpeed the step's last backward also runs its optimizer step
        return step_loss

    def stop_unless_skippable(self, problem: str) -> None:
        """Exit (before any checkpoint from this step) unless ``--nonfinite skip`` may drop the step's update."""
        if self.deepspeed and self.model.was_step_applied():
            sys.exit(f"error: {problem}; DeepSpeed applied that update (its ZeRO stage does not skip non-finite "
                     "gradients): stopped before any checkpoint from it")  # fmt: skip
        if self.nonfinite == "stop":
            sys.exit(f"error: {problem}; stopped before updating the weights (--nonfinite stop)")
        if self.skips_in_a_row > self.max_skips_in_a_row:
            sys.exit(f"error: {problem}; {self.skips_in_a_row} steps in a row skipped "
                     f"(--max-skips-in-a-row {self.max_skips_in_a_row})")  # fmt: skip
