"""easy_context sequence parallelism inside ``transformers.Trainer`` and TRL's ``SFTTrainer``.

::

    from easy_context.training.trainer import SequenceParallelTrainer, sequence_parallel_trainer

    trainer = SequenceParallelTrainer(model=model, args=args, train_dataset=ds, sp="zigzag_ring_attn")
    trainer.train()                                   # accelerate launch / torchrun, gloo on CPU, nccl on GPU

    SPSFTTrainer = sequence_parallel_trainer(trl.SFTTrainer)   # any Trainer subclass
    SPSFTTrainer(model=model, args=sft_config, train_dataset=ds, processing_class=tok, sp="ulysses_attn").train()

What the mixin changes (everything else is the wrapped Trainer's):

* **attention**: the model attends through the backend (:meth:`~easy_context.sp_config.SPConfig.attach`, after
  :meth:`~easy_context.sp_config.SPConfig.check_model`); the SP setup is one
  :func:`~easy_context.sp_config.resolve_sp_config` call on the launcher's process group.
* **data**: the train/eval dataloaders are sharded over the DP groups only (``sp.data_shards`` shards, this rank
  reads ``sp.data_rank``): every rank of an SP group gets the same batch, which is checked at every optimizer step
  (one tiny all-reduce over the SP group).
* **batches**: each micro-batch ``(batch, seq)`` is turned into this rank's :class:`LocalBatch` ``(batch, seq_local)``
  by :func:`sp_local_batch`: targets shifted as transformers does (``labels[:, 1:]``, -100 after the last token),
  a right-padding ``attention_mask`` folded into the targets (-100) and dropped, the length padded to
  ``sp.seq_multiple()`` (pad token in, -100 out), then sharded (:meth:`SPConfig.shard`).
* **loss**: the exact token mean of the optimizer step: every rank's loss sum over its valid targets, divided by the
  number of valid targets of the whole step (all micro-batches of the gradient-accumulation window, all SP ranks,
  all DP replicas; one integer all-reduce per step), times the process count ``W`` so that DDP's / DeepSpeed's
  gradient AVERAGE over the ``W`` processes is the gradient of the global mean
  (:func:`easy_context.loss.global_mean_loss`). ``loss_is_scaled_for_ga = True`` keeps Trainer from dividing by the
  accumulation steps again. The logged ``loss`` is the global mean too: Trainer gathers the per-rank values of the
  step and takes their mean, which divides the ``W`` back out.
* **loss head**: by default easy_context's chunked linear cross-entropy inside the LM head (no ``(batch, seq_local,
  vocab)`` logits: :class:`~easy_context.loss.LMHeadWithLoss`); ``sp_loss="logits"`` uses the model's own logits.
* **engines**: DDP, FSDP2 and DeepSpeed ZeRO-3 wrap the model as they do for a plain Trainer; the loss goes through
  the wrapped model's forward and the head's own forward, so FSDP2 unshards and ZeRO-3 gathers the head's weight
  around it. All three average gradients over the ``W`` processes, which the loss scaling above undoes. An engine
  asked for that accelerate does not run (on CPU it drops FSDP, and DeepSpeed under ACCELERATE_USE_CPU; without a
  gloo backend DeepSpeed's state counts 1 process) is refused at construction, with the fix.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Trainer

from easy_context.core.groups import get_sp_group
from easy_context.core.inputs import IGNORE_INDEX, shift_targets
from easy_context.hf.support import decoder_of
from easy_context.loss import (
    HEAD_LOSS_IMPLS,
    CausalLMWithLoss,
    count_valid_targets,
    global_mean_for_logging,
    global_mean_loss,
)
from easy_context.sp_config import SPConfig, resolve_sp_config
from easy_context.training.dataloader import batch_checksum

SP_LOSSES = (*HEAD_LOSS_IMPLS, "logits")
# keys of TRL's padding-free batches that position_ids already say (documents restart at position 0)
_DERIVED_KEYS = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"})
_BATCH_KEYS = frozenset({"input_ids", "labels", "shift_labels", "attention_mask", "position_ids"})


class LocalBatch(dict):
    """This rank's shard of one micro-batch: ``input_ids``, ``position_ids`` (global positions) and ``shift_labels``
    (the target of each local token, -100: none), each ``(batch, seq_local)`` int64, where ``seq_local`` is the
    padded length over the SP group's ranks (``seq_padded // sp_size``; data parallel: ``seq_padded``)."""


def sp_local_batch(batch: Mapping[str, Any], sp: SPConfig, *, pad_token_id: int = 0, pad: bool = True,
                   device: torch.device | str | None = None) -> LocalBatch:  # fmt: skip
    """This rank's :class:`LocalBatch` of a collated ``(batch, seq)`` micro-batch (every rank of the SP group holds
    the same one).

    ``batch``: ``input_ids`` and ``labels`` (or already-shifted ``shift_labels``), optionally ``position_ids`` (packed
    documents restart at 0) and an ``attention_mask`` that pads on the right only (its zeros become -100 targets:
    under causal attention no real token sees a later pad, so dropping the mask changes nothing); TRL's padding-free
    keys (``cu_seq_lens_*``, ``max_length_*``, ``seq_idx``) are dropped, position_ids carry them. ``pad``: pad the
    length to ``sp.seq_multiple()`` (input ids with ``pad_token_id``, targets -100); False: a length that does not
    shard raises the backend's ``ValueError`` (which names the padding call). ``device``: where the shards go
    (default: the inputs' device).
    """
    unknown = sorted(set(batch) - _BATCH_KEYS - _DERIVED_KEYS)
    if unknown:
        raise ValueError(
            f"sequence-parallel training takes batches of {sorted(_BATCH_KEYS)} (each (batch, seq)); got also "
            f"{unknown}: drop them in the collator (or set remove_unused_columns=True)"
        )
    if "input_ids" not in batch:
        raise ValueError("sequence-parallel training needs input_ids in every batch (inputs_embeds are not sharded)")
    input_ids = torch.as_tensor(batch["input_ids"])
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    if batch.get("shift_labels") is not None:
        targets = torch.as_tensor(batch["shift_labels"])
    elif batch.get("labels") is not None:
        targets = shift_targets(torch.as_tensor(batch["labels"]))
    else:
        raise ValueError("sequence-parallel training needs labels (or shift_labels) in every batch: the loss is "
                         "computed on each rank's shard; use -100 for tokens without a target")  # fmt: skip
    if targets.shape != input_ids.shape:
        raise ValueError(f"labels {tuple(targets.shape)} and input_ids {tuple(input_ids.shape)} differ in shape")
    position_ids = batch.get("position_ids")
    mask = batch.get("attention_mask")
    if mask is not None:
        real = torch.as_tensor(mask).to(torch.bool)
        if (real[:, 1:] & ~real[:, :-1]).any():
            raise ValueError(
                f"{sp.backend}: an attention_mask that is not right padding (left padding, or holes) is not supported "
                "with sequence parallelism (custom attention gets no key mask): pad on the right "
                "(tokenizer.padding_side = 'right'), or pack sequences with position_ids"
            )
        # a pad token is no target and predicts none (padding sits after every real token of its row)
        next_real = F.pad(real[:, 1:], (0, 1), value=True)
        targets = targets.masked_fill(~(real & next_real), IGNORE_INDEX)
    if not pad:
        try:
            sp.algo.check_length(input_ids.shape[1], sp.sp_size, "the batch's sequence length", **sp.options)
        except ValueError as exc:
            raise ValueError(f"{exc} (or let the trainer pad: sp_pad=True)") from None
    device = input_ids.device if device is None else device
    position_ids = None if position_ids is None else position_ids.long()
    local = sp.local_batch(input_ids.long(), position_ids, targets.long(), device,
                           pad_token_id=pad_token_id if pad else None)  # fmt: skip
    return LocalBatch(input_ids=local.input_ids, position_ids=local.position_ids, shift_labels=local.target_ids)


def install_loss_forward(model: PreTrainedModel, impl: str = "chunked") -> PreTrainedModel:
    """Give ``model.forward`` an ``ec_targets`` keyword: ``model(input_ids=, position_ids=, ec_targets=)`` ->
    ``(loss_sum, n_valid)`` (fp32 scalar, int64 scalar) of the ``(batch, seq_local)`` targets, computed inside the LM
    head (:class:`~easy_context.loss.LMHeadWithLoss`, gathered there under ZeRO-3), without ``(batch, seq_local,
    vocab)`` logits for ``impl="chunked"``. Without ``ec_targets`` the forward is the model's own (generate, eval).

    Going through ``model.forward`` keeps DDP / FSDP / DeepSpeed wrappers in the call (their hooks run).
    Models that scale their logits (Cohere, Granite, ...) are scaled as the model does
    (:mod:`easy_context.loss.logit_scale`); a model type with an unknown scaling raises ``NotImplementedError``.
    """
    if getattr(model, "_easy_context_loss_forward", None) == impl:
        return model
    wrapped = CausalLMWithLoss(model, impl=impl)  # checks the model, installs LMHeadWithLoss (same weights)
    softcap, scale = wrapped.softcap, wrapped.logit_scale
    original = model.forward

    @functools.wraps(original)  # the signature Trainer inspects (remove_unused_columns) stays the model's
    def forward(*args: Any, ec_targets: torch.Tensor | None = None, **kwargs: Any):
        if ec_targets is None:
            return original(*args, **kwargs)
        if args:
            raise TypeError("pass input_ids and position_ids by keyword with ec_targets")
        out = decoder_of(model)(input_ids=kwargs["input_ids"], position_ids=kwargs["position_ids"], use_cache=False)
        return model.get_output_embeddings()(out.last_hidden_state, ec_targets, logit_softcapping=softcap,
                                             logit_scale=scale)  # fmt: skip

    model.forward = forward
    model._easy_context_loss_forward = impl
    return model


def _env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a true value (as accelerate reads its flags)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "on")


def _unwrap(model: nn.Module) -> nn.Module:
    """The PreTrainedModel under PEFT (``get_base_model``) or returned as is."""
    base = getattr(model, "get_base_model", None)
    return base() if callable(base) else model


class SequenceParallelMixin:
    """Mix into a ``transformers.Trainer`` subclass (before it): ``class T(SequenceParallelMixin, Trainer)``.

    Keyword arguments (the rest go to the Trainer):

    * ``sp``: a backend name (``zigzag_ring_attn``, ``dist_flash_attn``, ``ulysses_attn``, ``usp_attn``,
      ``data_parallel``) or a resolved :class:`~easy_context.sp_config.SPConfig`;
    * ``sp_size``: ranks per sequence (None: all processes); ``world / sp_size`` DP replicas;
    * ``sp_kernel``: the local attention kernel (``"auto"``); ``sp_options``: backend options
      (``{"ring_degree": 2}`` for usp_attn);
    * ``sp_pad``: pad each batch's length to ``sp.seq_multiple()`` (True) or raise on one that does not shard;
    * ``sp_check_batches``: check at every optimizer step that the SP group holds the same micro-batches;
    * ``sp_loss``: ``"chunked"`` (default: no full logits), another of
      :data:`easy_context.loss.HEAD_LOSS_IMPLS`, or ``"logits"`` (the model's own logits, fp32 cross-entropy).

    Not supported (``ValueError`` at construction): ``compute_loss_func``, label smoothing, TRL's ``loss_type``
    other than ``"nll"``, MoE router aux losses, ``n_gpu > 1`` (torch DataParallel), accelerate's own CP/SP
    (``parallelism_config``) or DeepSpeed's (``sequence_parallel_size``), ``train_sampling_strategy="batch_rebalance"``,
    ``dispatch_batches=True``, an FSDP / DeepSpeed setup that accelerate would not run as asked. Evaluation
    computes the loss only (``prediction_loss_only``): logits are sharded over the SP group.
    """

    # compute_loss returns the loss already normalised over the accumulation window (transformers' Trainer docstring)
    loss_is_scaled_for_ga: bool | None = True

    def __init__(self, *args: Any, sp: SPConfig | str = "zigzag_ring_attn", sp_size: int | None = None,
                 sp_kernel: str = "auto", sp_options: Mapping[str, Any] | None = None, sp_pad: bool = True,
                 sp_check_batches: bool = True, sp_loss: str = "chunked", **kwargs: Any) -> None:  # fmt: skip
        if sp_loss not in SP_LOSSES:
            raise ValueError(f"unknown sp_loss {sp_loss!r}; choose one of {SP_LOSSES}")
        super().__init__(*args, **kwargs)  # the accelerator: the launcher's process group exists from here on
        self._check_supported()
        if isinstance(sp, SPConfig):
            if sp.world_size != self.accelerator.num_processes:
                raise ValueError(f"sp covers {sp.world_size} processes, this job has {self.accelerator.num_processes}")
            self.sp = sp
        else:
            self.sp = resolve_sp_config(sp, sp_size=sp_size, kernel=sp_kernel, **dict(sp_options or {}))
        self.sp_pad, self.sp_check_batches, self.sp_loss = sp_pad, sp_check_batches, sp_loss
        # our loss is normalised by num_items_in_batch: Trainers that ask this rather than loss_is_scaled_for_ga
        # (transformers before it) then leave it undivided by the accumulation steps too
        self.model_accepts_loss_kwargs = True
        base = _unwrap(self.model)
        if not isinstance(base, PreTrainedModel):
            raise TypeError(f"expected a transformers PreTrainedModel, got {type(base).__name__}")
        self.sp.check_model(base.config)  # heads / options the backend cannot run: ValueError naming why
        self.sp.attach(base)
        if sp_loss != "logits":
            install_loss_forward(base, sp_loss)
        self._sp_pad_token_id = self._pad_token_id(base)

    # -- setup ------------------------------------------------------------------------------------------------------

    def _check_supported(self) -> None:
        args = self.args
        problems = []
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        running = self.accelerator.num_processes
        wants_deepspeed = getattr(args, "deepspeed_plugin", None) is not None or _env_flag("ACCELERATE_USE_DEEPSPEED")
        if launched != running:  # each process would train alone on whole sequences
            fix = ("DeepSpeed on CPU: give the DeepSpeed config to accelerate launch (distributed_type: DEEPSPEED, "
                   "e.g. accelerate_configs/cpu_zero3.yaml) rather than TrainingArguments(deepspeed=...), and pass "
                   "ddp_backend='gloo'" if wants_deepspeed
                   else "on CPU: use_cpu=True or ACCELERATE_USE_CPU=1")  # fmt: skip
            problems.append(f"the launcher started {launched} processes but the accelerator runs {running} ({fix})")
        problems += self._engine_problems(wants_deepspeed)
        if getattr(self, "compute_loss_func", None) is not None:
            problems.append("compute_loss_func (the loss is computed per shard here)")
        if args.label_smoothing_factor:
            problems.append("label_smoothing_factor")
        if getattr(args, "loss_type", "nll") not in (None, "nll"):
            problems.append(f"loss_type={args.loss_type!r} (only 'nll')")
        if getattr(self, "aux_loss_enabled", False):
            problems.append("the MoE router aux loss (set router_aux_loss_coef=0)")
        if args.n_gpu > 1:
            problems.append("n_gpu > 1 (torch DataParallel): launch one process per GPU")
        pc = getattr(self.accelerator, "parallelism_config", None)
        if pc is not None and any(getattr(pc, f"{dim}_enabled", False) for dim in ("cp", "sp", "tp")):
            problems.append("accelerate's parallelism_config with cp/sp/tp (one sequence-parallel scheme at a time; "
                            "the dataloader here shards over easy_context's DP groups only)")  # fmt: skip
        if getattr(args, "train_sampling_strategy", None) == "batch_rebalance":
            problems.append("train_sampling_strategy='batch_rebalance' (its sampler shards over every process)")
        if self.accelerator.dispatch_batches:
            problems.append("dispatch_batches=True (rank 0 would split batches over every process)")
        if problems:
            raise ValueError(f"{type(self).__name__}: not supported with easy_context sequence parallelism: "
                             + "; ".join(problems))  # fmt: skip

    def _engine_problems(self, wants_deepspeed: bool) -> list[str]:
        """The sharding engine asked for (DeepSpeed, FSDP) against the one accelerate runs: accelerate drops either
        without a word on CPU (the job would train under DDP, unsharded); DeepSpeed's own sequence parallelism."""
        import accelerate
        from accelerate.utils import DistributedType

        running = self.accelerator.distributed_type
        problems = []
        if wants_deepspeed and running != DistributedType.DEEPSPEED:
            problems.append(f"DeepSpeed was asked for but accelerate runs {running.value}: ACCELERATE_USE_CPU=1 (or "
                            "accelerate launch --cpu) switches DeepSpeed off; on CPU unset it and pass "
                            "ddp_backend='gloo'")  # fmt: skip
        wants_fsdp = getattr(self.args, "fsdp_plugin_args", None) is not None or _env_flag("ACCELERATE_USE_FSDP")
        if wants_fsdp and running != DistributedType.FSDP:
            problems.append(f"FSDP was asked for but accelerate runs {running.value} (accelerate "
                            f"{accelerate.__version__} enables FSDP on GPU-type devices only and trains with DDP on "
                            "CPU): drop fsdp / fsdp_config on CPU (DDP computes the same), or run on GPUs")  # fmt: skip
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        ds_sp = (getattr(plugin, "deepspeed_config", None) or {}).get("sequence_parallel_size", 1)
        if isinstance(ds_sp, int) and ds_sp > 1:
            problems.append(f"DeepSpeed's own sequence parallelism (sequence_parallel_size={ds_sp} in the DeepSpeed "
                            "config; one scheme at a time: remove it)")  # fmt: skip
        return problems

    def _pad_token_id(self, model: PreTrainedModel) -> int:
        for owner in (self.processing_class, getattr(self.processing_class, "tokenizer", None), model.config):
            value = getattr(owner, "pad_token_id", None)
            if isinstance(value, int):
                return value
        return 0

    # -- data: shard over DP groups only --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dataloaders_over_dp_groups(self) -> Iterator[None]:
        """While building a dataloader, ``accelerator.prepare`` shards it over ``sp.data_shards`` (the DP groups)
        instead of every process; everything else about it is what the accelerator would do."""
        if not self.sp.distributed:  # data parallel: every process reads its own batches, accelerate's default
            yield
            return
        from accelerate.data_loader import prepare_data_loader

        acc = self.accelerator

        def over_dp_groups(data_loader, device_placement=None, slice_fn_for_dispatch=None):
            if getattr(data_loader, "_is_accelerate_prepared", False):
                return data_loader
            prepared = prepare_data_loader(
                data_loader, acc.device, num_processes=self.sp.data_shards, process_index=self.sp.data_rank,
                split_batches=acc.split_batches, put_on_device=acc.device_placement if device_placement is None
                else device_placement, rng_types=acc.rng_types.copy(), dispatch_batches=False,
                even_batches=acc.even_batches, use_seedable_sampler=acc.use_seedable_sampler,
                data_seed=acc.dataloader_config.data_seed, non_blocking=acc.non_blocking,
                use_stateful_dataloader=acc.use_stateful_dataloader,
            )  # fmt: skip
            acc._dataloaders.append(prepared)  # saved / restored with the accelerator's state, as prepare does
            return prepared

        acc.prepare_data_loader = over_dp_groups  # an instance attribute: Accelerator.prepare calls it
        try:
            yield
        finally:
            del acc.prepare_data_loader

    def get_train_dataloader(self):
        """Trainer's dataloader, sharded over the DP groups only (every SP rank reads the same batches)."""
        with self._dataloaders_over_dp_groups():
            return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset=None):
        with self._dataloaders_over_dp_groups():
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        with self._dataloaders_over_dp_groups():
            return super().get_test_dataloader(test_dataset)

    def get_total_train_batch_size(self, args) -> int:
        """Samples per optimizer step: an SP group reads one copy of each (``sp.data_shards`` readers)."""
        return self._train_batch_size * args.gradient_accumulation_steps * self.sp.data_shards

    # -- one optimizer step's micro-batches -------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list[LocalBatch], torch.Tensor]:  # fmt: skip
        """The step's (up to) ``num_batches`` micro-batches as this rank's :class:`LocalBatch` shards, and the number
        of valid targets of the whole step over every rank (int64 scalar on ``device``): Trainer passes it to
        :meth:`compute_loss` as ``num_items_in_batch``.

        Collective over the world (every rank calls it once per step): one all-reduce of the counts, which also
        carries every rank's verdict on its batches (the same-batch check over its SP group, a refused batch), so a
        bad batch on one rank raises on all of them instead of leaving the others waiting.
        """
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        mismatch = self._sp_batches_differ(batches, device) if self.sp_check_batches else False
        shards, refused = [], None
        try:
            shards = [self._sp_local(b, device) for b in batches]
        except ValueError as exc:
            refused = exc
        n_local = sum(int(count_valid_targets(s["shift_labels"])) for s in shards)
        stats = torch.tensor([n_local, int(refused is not None), int(mismatch)], dtype=torch.long, device=device)
        if dist.is_initialized():
            dist.all_reduce(stats)
        if refused is not None:
            raise refused
        if stats[1] > 0:
            raise ValueError("another rank refused its batch (its error says why); stopping every rank")
        if stats[2] > 0:
            raise RuntimeError(
                "ranks of one sequence-parallel group received different batches: the train dataloader must be "
                "sharded over data-parallel groups only (SequenceParallelTrainer.get_train_dataloader; a custom "
                "sampler must give every rank of an SP group the same samples, e.g. seeded the same)"
            )
        return shards, stats[0]

    def _sp_batches_differ(self, batches: list, device: torch.device) -> bool:
        """Whether the SP group's ranks hold different micro-batches (checksums compared by one MAX all-reduce)."""
        if not self.sp.distributed or self.sp.sp_size == 1:
            return False
        # a fixed size on every rank (the count may differ when the data does): how many, and their checksums in order
        mixed = sum((i + 1) * batch_checksum(b) for i, b in enumerate(batches))
        both = torch.tensor([len(batches), mixed, -len(batches), -mixed], dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=get_sp_group())
        return not torch.equal(both[:2], -both[2:])  # max == min

    def _sp_local(self, batch: Mapping[str, Any], device: torch.device | str) -> LocalBatch:
        return sp_local_batch(batch, self.sp, pad_token_id=self._sp_pad_token_id, pad=self.sp_pad, device=device)

    # -- the loss -----------------------------------------------------------------------------------------------------

    def _sp_loss_sum(self, model: nn.Module, batch: LocalBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 loss sum, int64 valid-target count) of this rank's shard, through the (wrapped) ``model``."""
        targets = batch["shift_labels"]
        if self.sp_loss == "logits":
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            loss_sum = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX,
                                       reduction="sum")  # fmt: skip
            return loss_sum, count_valid_targets(targets)
        loss_sum, n_valid = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], ec_targets=targets)
        return loss_sum, n_valid

    def compute_loss(self, model: nn.Module, inputs: Mapping[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None):  # fmt: skip
        """This rank's share of the step's exact global token mean (training), or the global token mean of this
        evaluation batch over every rank (evaluation, the same value on each).

        Training: ``num_items_in_batch`` is :meth:`get_batch_samples`' count ``N`` (valid targets of the whole step,
        every rank); the loss is ``W * S_r / N`` with ``S_r`` this rank's loss sum and ``W`` the process count (DDP
        averages gradients over ``W``): summed over the accumulation window, averaged over the ranks, it is the
        global mean and its gradient. Without ``num_items_in_batch`` (a direct call) ``N`` is this micro-batch's.
        """
        if return_outputs:
            raise ValueError("sequence-parallel compute_loss returns the loss only: outputs are sharded over the SP "
                             "group (evaluate with prediction_loss_only=True, no compute_metrics)")  # fmt: skip
        batch = inputs if isinstance(inputs, LocalBatch) else self._sp_local(inputs, self.args.device)
        loss_sum, n_valid = self._sp_loss_sum(model, batch)
        if not self.model.training:
            return global_mean_for_logging(loss_sum, n_valid)
        return global_mean_loss(loss_sum, n_valid if num_items_in_batch is None else num_items_in_batch,
                                grad_average_world=self.accelerator.num_processes,
                                already_reduced=num_items_in_batch is not None)  # fmt: skip

    def prediction_step(self, model: nn.Module, inputs: Mapping[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):  # fmt: skip
        """Evaluation: the batch's global token-mean loss (no logits: they are sharded over the SP group)."""
        if not prediction_loss_only:
            raise ValueError("sequence-parallel evaluation computes the loss only: set prediction_loss_only=True and "
                             "pass no compute_metrics (logits are sharded over the SP group)")  # fmt: skip
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None


class SequenceParallelTrainer(SequenceParallelMixin, Trainer):
    """``transformers.Trainer`` with easy_context sequence parallelism (see :class:`SequenceParallelMixin`)."""


def sequence_parallel_trainer(trainer_cls: type[Trainer]) -> type[Trainer]:
    """``trainer_cls`` (a ``transformers.Trainer`` subclass, e.g. ``trl.SFTTrainer``) with easy_context sequence
    parallelism: a subclass taking :class:`SequenceParallelMixin`'s ``sp*`` keyword arguments."""
    if not (inspect.isclass(trainer_cls) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"expected a transformers.Trainer subclass, got {trainer_cls!r}")
    if issubclass(trainer_cls, SequenceParallelMixin):
        return trainer_cls
    return type(f"SequenceParallel{trainer_cls.__name__}", (SequenceParallelMixin, trainer_cls),
                {"__module__": __name__, "__doc__": f"{trainer_cls.__name__} with easy_context sequence parallelism "
                 "(see SequenceParallelMixin)."})  # fmt: skip


__all__ = [
    "LocalBatch",
    "SP_LOSSES",
    "SequenceParallelMixin",
    "SequenceParallelTrainer",
    "install_loss_forward",
    "sequence_parallel_trainer",
    "shift_targets",
    "sp_local_batch",
]
