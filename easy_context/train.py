r"""Extend a causal LM's context with sequence parallelism (full fine-tuning, full attention).

    accelerate launch --config_file accelerate_configs/single_node.yaml --mixed_precision bf16 train.py \
        --model meta-llama/Llama-2-7b-hf --dataset data/slimpajama-64k --seq-length 65536 \
        --parallel_mode zigzag_ring_attn --rope-theta 1000000 --output-dir out/llama2-64k
    accelerate launch ... -m easy_context.train --config recipe.yaml --max-train-steps 10   # YAML recipe + override

On CPU (tests, demo):
    ACCELERATE_USE_CPU=1 accelerate launch --config_file accelerate_configs/cpu_2proc.yaml train.py ...
Installed: easy-context-train (or python -m easy_context.train); --print-config-path NAME gives a shipped launch
config. Each run records its flags, package versions and git revision in OUTPUT_DIR/run_config.json.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs, set_seed
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import get_scheduler

from easy_context import cli
from easy_context.cli import refuse
from easy_context.core.groups import collective_timeout, launch_error
from easy_context.core.registry import get_seq_algo, option_values
from easy_context.data import load_train_dataset
from easy_context.loss import CausalLMWithLoss, resolve_loss_impl
from easy_context.memory import apply_checkpointing, enable_chunked_rmsnorm, enable_tiled_mlp
from easy_context.memory.rmsnorm import unpatched_note
from easy_context.models import build_config, is_random_init, load_model, match_special_tokens
from easy_context.models.tokenizer import load_tokenizer
from easy_context.sp_config import SPConfig, resolve_sp_config
from easy_context.training import flags, fp8, recipe
from easy_context.training.compile import compile_regions
from easy_context.training.dataloader import prepare_dataloader
from easy_context.training.deepspeed_precision import deepspeed_precision_error
from easy_context.training.flags import TRACKERS, check_tracker  # noqa: F401  (tests import them from here)
from easy_context.training.guard import RunGuard, exit_on
from easy_context.training.metrics import MetricsLogger
from easy_context.training.optim import build_optimizer
from easy_context.training.preemption import StopSignals
from easy_context.training.process_exit import run_program
from easy_context.training.step import TrainStep, nonfinite_problem, split_batch, to_host  # noqa: F401  (as above)
from easy_context.training.train_state import (
    RESUME_AUTO,
    CheckpointError,
    DataLayout,
    EpochShuffleSampler,
    last_good_checkpoint,
    load_training_state,
    model_fingerprint,
    read_training_position,
    remove_stale_temp,
    resume_plan,
)


def main(argv: list[str] | None = None) -> int:
    """Train; the exit code: 0, or preemption.EXIT_CODE after a stop signal (the state saved, resumable)."""
    started = time.monotonic()  # --time-limit counts from here (start-up and model loading included)
    stop = StopSignals().install()  # SIGTERM / SIGUSR1 from here on: stop at a step boundary with the state saved
    args = parse_args(argv)
    accelerator = make_accelerator(args)
    check_launch(accelerator, args)
    choose_resume_state(args, accelerator)  # --resume-from auto: the output dir's newest state, or none
    start_step, position = resume_position(args, accelerator.process_index)
    last_step = args.max_train_steps if args.stop_at_step is None else min(args.max_train_steps, args.stop_at_step)
    if start_step >= last_step:  # e.g. a re-queued job resuming a finished run: done before building anything
        nothing_to_train(args, accelerator, start_step, last_step)
        return 0
    args.loss = resolve_loss(args, accelerator)  # "auto" made concrete once: run_config.json records what runs
    set_seed(args.seed)
    sp = sp_config(args)  # the backend, its options, the kernel and this rank's place: every layout question
    check_layout(args, sp, layout_config(args))  # from the config alone: before the tokenizer and the weights load

    # model, data, optimizer, and what bounds and saves the run
    tokenizer = load_tokenizer_if_needed(args)
    model = build_model(args, tokenizer, sp)
    train_model = CausalLMWithLoss(model, impl=args.loss)
    sampler, loader = build_loader(args, tokenizer, model.config.vocab_size, accelerator)
    optimizer, scheduler = build_optimizer_and_schedule(args, accelerator, train_model)
    train_model, optimizer, scheduler = accelerator.prepare(train_model, optimizer, scheduler)
    record = record_run(args, accelerator, optimizer, sp.sp_size)
    if args.resume_from:
        with exit_on(CheckpointError):
            load_training_state(accelerator, args.resume_from)
    layout = data_layout(args, sp, loader, model.config)
    consumed, skipped, tokens = continue_from(position, layout, args, accelerator)
    step_tokens = tokens_per_step(args, sp)
    metrics = MetricsLogger(accelerator, args.output_dir, model.config, args.seq_length, step_tokens, start_step,
                            start_tokens=tokens)  # fmt: skip
    guard = RunGuard(args, accelerator, started, last_step, record, layout, stop)
    train_step = TrainStep(accelerator, train_model, optimizer, scheduler, sp, balance_documents=args.balance_documents,
                           grad_clip=args.grad_clip, nonfinite=args.nonfinite,
                           max_skips_in_a_row=args.max_skips_in_a_row, skipped=skipped)  # fmt: skip

    if guard.stop_before_start(start_step):  # a stop signal during start-up: nothing new to save
        return guard.stopped()

    # the loop: one optimizer step of --gradient-accumulate-every micro-batches per iteration
    stream = micro_batch_stream(loader, sampler, skip=consumed)
    # counted by hand: a bar that wraps the loop counts a step when the next one begins, so the break after the last
    # step would leave it at n-1 of n
    bar = tqdm(disable=not accelerator.is_local_main_process, initial=start_step, total=args.max_train_steps)
    for step in range(start_step, last_step):
        guard.step_begins()
        batches = [next(stream) for _ in range(args.gradient_accumulate_every)]  # on the host
        loss = train_step(step + 1, batches)
        consumed, tokens = consumed + len(batches), tokens + step_tokens
        last = guard.step_done(step + 1)  # --time-limit or a stop signal may make this step the last
        bar.update(1)
        if (step + 1) % args.log_every == 0 or last:
            show(bar, metrics.log(step + 1, loss, scheduler.get_last_lr()[0], train_step.skipped, train_step.grad_norm))
        if guard.save_due(step + 1):
            guard.save_state(step + 1, consumed, train_step.skipped, tokens)
        if last:
            break
    bar.close()

    if not guard.stopped_by:  # after a stop signal only the state is saved: the kill may come soon
        guard.save_final(train_model, tokenizer)
    for tracker in accelerator.trackers:  # not accelerator.end_training(): it destroys the world group while
        tracker.finish()  # the model still holds it, and freeing it later can deadlock (process_exit.py)
    if guard.stopped_by:
        return guard.stopped()
    if accelerator.is_main_process:
        what = "metrics in" if args.no_save else "saved"
        # the last step's loss on the tokens it trained (needle rows: only their answers), not an evaluation
        print(f"{what} {args.output_dir} (final loss {loss:.4f}: the last step's, on its trained tokens)")
    return 0


# ---------------------------------------------------------------------------------------------------------------
# flags (easy_context/training/flags.py)


def build_parser() -> cli.ArgumentParser:
    """The program's flags, this module's docstring heading ``--help``."""
    return flags.build_parser(description=__doc__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (``--config`` recipe first, the command line over it), checked: a bad combination is a one-line
    usage error before anything is built."""
    return flags.parse_args(argv, build_parser())


# ---------------------------------------------------------------------------------------------------------------
# setup: each step fails with one line, before any work


def make_accelerator(args) -> Accelerator:
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"  # gloo on CPU: else every rank thinks it is rank 0
    return Accelerator(
        # sync exactly every k micro-batches (not early at an epoch's end) and step the LR schedule ourselves,
        # once per optimizer step (accelerate would step it once per process)
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=args.gradient_accumulate_every, sync_with_dataloader=False
        ),
        step_scheduler_with_optimizer=False,
        log_with=None if args.tracker == "none" else args.tracker,
        project_dir=args.output_dir,
        kwargs_handlers=[InitProcessGroupKwargs(backend=backend, timeout=collective_timeout(default_s=1800))]
        if launched
        else [],
    )


def check_launch(accelerator: Accelerator, args) -> None:
    """A launch that cannot run this configuration exits; one that runs slowly (GPU defaults on CPU) warns."""
    error = launch_error(accelerator.distributed_type != DistributedType.NO)  # CPU launch w/o ACCELERATE_USE_CPU=1
    if error:
        sys.exit(f"error: {error}")
    error = deepspeed_precision_error(accelerator, getattr(torch, args.dtype))  # ZeRO-3 builds in that precision
    if error:
        sys.exit(f"error: --dtype {args.dtype}: {error}")
    if args.compile and accelerator.state.deepspeed_plugin is not None:
        sys.exit("error: --compile is not supported under DeepSpeed (its parameter hooks run inside the compiled "
                 "regions; untested): drop --compile, or use FSDP2 / DDP")  # fmt: skip
    if args.fp8 or args.fp8_emulate:  # the device and the engine, before anything is built
        error = fp8.fp8_device_error(accelerator.device, args.fp8_emulate) or fp8.fp8_composition_error(
            deepspeed=accelerator.distributed_type == DistributedType.DEEPSPEED)  # fmt: skip
        if error:
            sys.exit(f"error: --fp8: {error}")
    warning = cpu_defaults_warning(accelerator.device, args)
    if accelerator.is_main_process and warning:
        print(warning, file=sys.stderr)


def resolve_loss(args, accelerator: Accelerator) -> str:
    """The concrete ``--loss`` for this run's device (printed once); a CUDA-only loss on CPU or without its package
    exits with one line naming the fix."""
    with exit_on(ImportError, ValueError):
        impl, why = resolve_loss_impl(args.loss, accelerator.device)
    if accelerator.is_main_process:
        print(f"loss: {why}")
    return impl


def cpu_defaults_warning(device: torch.device, args) -> str | None:
    """A one-line warning when a CPU run keeps the GPU defaults (bf16, checkpointing), which are slow there."""
    slow = [f"--dtype {args.dtype}"] if args.dtype == "bfloat16" else []
    slow += [f"--checkpointing {args.checkpointing}"] if args.checkpointing != "none" else []
    if device.type != "cpu" or not slow:
        return None
    return (f"warning: on CPU {' and '.join(slow)} are slow (tiny-llama measured 140-218 tokens/s with both, "
            "617-743 with --dtype float32 --checkpointing none); pass those unless you need the memory")  # fmt: skip


def choose_resume_state(args, accelerator: Accelerator) -> None:
    """``--resume-from auto``: the newest complete state of ``--output-dir`` (train_state.last_good_checkpoint), or
    a start at step 0 when it has none: the same command starts a job and continues it once requeued. Any other
    value is kept."""
    if args.resume_from != RESUME_AUTO:
        return
    found = last_good_checkpoint(args.output_dir)
    args.resume_from = None if found is None else str(found)
    if accelerator.is_main_process:
        print(f"--resume-from auto: {f'resuming from {found}' if found else f'no state in {args.output_dir} yet'}")


def resume_position(args, process_index: int) -> tuple[int, dict | None]:
    """(step to start from, the ``--resume-from`` state's position or None) after checking the state's files and
    that this run keeps the model, length and layout it was trained with."""
    if not args.resume_from:
        return 0, None
    with exit_on(CheckpointError):
        position = read_training_position(args.resume_from, process_index)
    mismatch = recipe.resume_mismatch(args, args.resume_from)
    if mismatch:
        sys.exit(f"error: {mismatch}")
    return position["step"], position


def data_layout(args, sp: SPConfig, loader, config) -> DataLayout:
    """How this run reads its data (what a resumable state records, so that a resume on another layout continues
    from the same global sample)."""
    return DataLayout(
        data_shards=sp.data_shards, batch_size=args.batch_size, batches_per_epoch=len(loader),
        dataset_rows=len(loader.dataset), seq_length=args.seq_length, seed=args.seed, model=model_fingerprint(config),
        world_size=sp.world_size, sp_size=sp.sp_size, parallel_mode=sp.backend, options=dict(sp.options),
        gradient_accumulate_every=args.gradient_accumulate_every,
    )  # fmt: skip


def continue_from(position: dict | None, layout: DataLayout, args, accelerator) -> tuple[int, int, int]:
    """(micro-batches consumed, skipped steps, tokens trained) to continue from: zeros for a new run; a resumed
    state's, mapped onto this layout (``train_state.resume_plan``: the same global sample, none
    trained twice; a changed seq length, seed, dataset or model is refused)."""
    if position is None:
        return 0, 0, 0
    with exit_on(CheckpointError):
        plan = resume_plan(position, layout, args.resume_from)
    if accelerator.is_main_process:
        for note in plan.notes:
            print(f"note: {note}")
    start = position["step"] * tokens_per_step(args, layout)
    return plan.micro_batches, position["skipped_steps"], start if plan.tokens is None else plan.tokens


def sp_config(args) -> SPConfig:
    """The run's SP setup, resolved once (:func:`~easy_context.sp_config.resolve_sp_config`; one process gets a
    process group of one, so the SP code runs unchanged); a bad flag exits with one line naming it."""
    options = backend_options(args)
    with exit_on(ValueError, flag="" if args.sp_size is None else f"--sp-size {args.sp_size}: ", alike=True):
        return resolve_sp_config(args.parallel_mode, sp_size=args.sp_size, kernel=args.kernel,
                                 heads_per_call=args.attn_heads_per_call, **options)  # fmt: skip


def backend_options(args) -> dict:
    """The options the chosen backend takes (``SeqAlgo.options``), from the flags of the same names."""
    try:
        return get_seq_algo(args.parallel_mode).options_from(option_values(args))
    except ValueError as exc:
        refuse(f"error: --{exc}")


def layout_config(args):
    """The model's config alone, without its weights or tokenizer: what :func:`check_layout` reads (the heads)."""
    with exit_on(OSError, ValueError, flag="--model: ", alike=True):
        return build_config(args.model, vocab_size=args.vocab_size or 1)  # the heads do not depend on the vocabulary


def check_layout(args, sp: SPConfig, config) -> None:
    """Fail fast, with one line from one rank, on a layout the backend cannot run (the backend's own layout rule
    decides: :meth:`SPConfig.check_run`, what the extension's plans are held to as well)."""
    with exit_on(ValueError, alike=True):
        sp.check_run(config, args.seq_length, "--seq-length")


def load_tokenizer_if_needed(args):
    """The tokenizer of ``--tokenizer`` (default ``--model``); None for random tokens without one."""
    if not (args.tokenizer or args.random_rows is None):
        return None
    with exit_on(OSError, RuntimeError, ValueError):
        return load_tokenizer(args.tokenizer or args.model)


def build_model(args, tokenizer, sp: SPConfig):
    """The HF model in training mode, its attention switched to the backend, with the memory options applied."""
    vocab = args.vocab_size or (len(tokenizer) if tokenizer is not None else None)
    with exit_on(OSError, flag="--model: "):  # a hub id that is not there (or not cached offline): one line
        model = load_model(args.model, vocab_size=vocab, rope_theta=args.rope_theta, seed=args.seed,
                           max_position_embeddings=args.seq_length, dtype=getattr(torch, args.dtype))  # fmt: skip
    model.train()  # from_pretrained returns eval mode, where transformers skips activation checkpointing
    if tokenizer is not None and is_random_init(args.model):
        match_special_tokens(model, tokenizer)
    # checkpoint-after-attention needs our attention function, also under data parallel
    sp.attach(model, through_easy_context=args.checkpointing.startswith("attn") or args.kernel != "auto")
    with exit_on(ValueError):
        apply_checkpointing(model, args.checkpointing, offload_layers=args.offload_layers,
                            checkpoint_every=args.checkpoint_every)  # fmt: skip  # per decoder layer
    if args.tiled_mlp:
        enable_tiled_mlp(model, num_tiles=args.tiled_mlp)
    if args.chunked_rmsnorm:
        enable_chunked_rmsnorm(model)
        note = unpatched_note(model)
        if note and int(os.environ.get("RANK", "0")) == 0:  # their memory is not saved: say so, once
            print(note)
    if args.fp8 or args.fp8_emulate:
        apply_fp8(args, model, sp)  # before compile: the float8 linears' casts are compiled with them
    if args.compile:  # with float8 linears the whole MLP (their casts fuse), else the down projection stays eager
        compile_regions(model, split_mlp=not (args.fp8 or args.fp8_emulate))
    return model


def apply_fp8(args, model, sp: SPConfig) -> None:
    """``--fp8``: the decoder layers' linears through torchao float8 (easy_context.training.fp8; the device and
    DeepSpeed were checked in :func:`check_launch`); token counts that float8 GEMMs cannot take exit with one line."""
    local_seq = args.seq_length // (sp.sp_size if sp.distributed else 1)  # tokens per rank the linears see
    error = None if args.fp8_emulate else fp8.fp8_shape_error(args.batch_size, local_seq, args.tiled_mlp)
    if error:
        sys.exit(f"error: --fp8: {error}")
    state = PartialState()  # the Accelerator's device
    with exit_on(fp8.FP8Error, flag="--fp8: "):
        n = fp8.enable_fp8_linears(model, emulate=args.fp8_emulate, device=state.device)
    if state.is_main_process:
        print(f"fp8: {n} decoder linears in float8 (rowwise{', emulated' if args.fp8_emulate else ''})")


def build_loader(args, tokenizer, vocab_size: int, accelerator) -> tuple[EpochShuffleSampler, DataLoader]:
    """The dataset's rows in a per-epoch shuffled order, one copy per SP group (sharded over DP groups only), on the
    host (:class:`~easy_context.training.step.TrainStep` moves each rank's shard to the device)."""
    with exit_on(OSError, RuntimeError, ValueError):
        dataset = load_train_dataset(args.dataset, tokenizer, args.seq_length, seed=args.seed,
                                     show_progress=accelerator.is_local_main_process,
                                     vocab_size=vocab_size)  # fmt: skip
    sampler = EpochShuffleSampler(len(dataset), args.seed)
    loader = prepare_dataloader(args.parallel_mode, DataLoader(dataset, args.batch_size, sampler=sampler),
                                   accelerator, sp_size=args.sp_size, put_on_device=False)  # fmt: skip
    return sampler, loader


def build_optimizer_and_schedule(args, accelerator, train_model):
    """Built here from the flags, also under DeepSpeed (its json has no optimizer or scheduler section, so nothing
    there can override --learning-rate or the schedule)."""
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:
        ds.deepspeed_config["train_micro_batch_size_per_gpu"] = args.batch_size
        ds.deepspeed_config["gradient_clipping"] = args.grad_clip
    params = [p for p in train_model.parameters() if p.requires_grad]
    with exit_on(ValueError):
        optimizer = build_optimizer(params, accelerator, lr=args.learning_rate, weight_decay=args.weight_decay,
                                    betas=tuple(args.adam_betas), name=args.optimizer)  # fmt: skip
    return optimizer, get_scheduler(args.lr_schedule, optimizer, args.warmup_steps, args.max_train_steps)


def record_run(args, accelerator, optimizer, sp_size: int) -> dict | None:
    """The output dir with what actually runs (engine.txt: accelerate silently drops DeepSpeed in some setups) and
    run_config.json (every flag, versions, git revision: the record, returned on the main process); the trackers
    started."""
    engine = f"{accelerator.distributed_type} x{accelerator.num_processes}, {type(optimizer.optimizer).__name__}"
    record = None
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        for line in remove_stale_temp(args.output_dir):  # an interrupted save's temp dir
            print(line)
        open(os.path.join(args.output_dir, "engine.txt"), "w").write(engine + "\n")
        record = recipe.run_record(args, processes=accelerator.num_processes, sp_size=sp_size, engine=engine,
                                   mixed_precision=accelerator.mixed_precision)  # fmt: skip
        recipe.write_run_config(args.output_dir, record)
    if args.tracker != "none":  # hyperparameters as trackers take them (TensorBoard: scalars or text)
        scalar = (bool, int, float, str, type(None))
        config = {k: v if isinstance(v, scalar) else str(v) for k, v in vars(args).items()}
        accelerator.init_trackers(args.wandb or "easy_context", config=config)
    return record


def tokens_per_step(args, layout: SPConfig | DataLayout) -> int:
    """Tokens of one optimizer step over all ranks (an SP group shares its sequences; the ranks reading different
    samples are the layout's ``data_shards``)."""
    return args.batch_size * args.seq_length * args.gradient_accumulate_every * layout.data_shards


# ---------------------------------------------------------------------------------------------------------------
# the data stream


def micro_batch_stream(loader, sampler: EpochShuffleSampler, skip: int):
    """Endless, deterministic stream of batches; skips the ``skip`` a resumed run already consumed."""

    def epochs():
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    return itertools.islice(epochs(), skip, None)


def nothing_to_train(args, accelerator: Accelerator, start_step: int, last_step: int) -> None:
    """Say so (main process): the run resumes at or past its last step."""
    if accelerator.is_main_process:
        until = f", --stop-at-step {args.stop_at_step}" if last_step < args.max_train_steps else ""
        print(f"nothing to train: {'resumed at' if args.resume_from else 'at'} step {start_step} of "
              f"{args.max_train_steps}{until}")  # fmt: skip


def show(bar: tqdm, row: dict) -> None:
    """A metrics row on the progress bar."""
    bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                    **({"mfu": f"{row['mfu']:.1%}"} if "mfu" in row else {}),
                    mem=f"{row['peak_mem_bytes'] / 2**30:.1f}G")  # fmt: skip


def run() -> None:
    """The ``easy-context-train`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
