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
import math
import os
import sys
import time
from contextlib import contextmanager

import torch
from accelerate import Accelerator, PartialState
from accelerate.tracking import get_available_trackers
from accelerate.utils import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs, LoggerType, set_seed
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import get_scheduler

import easy_context as ec
from easy_context import cli, launch_configs
from easy_context.core.document_order import balance_documents
from easy_context.core.groups import collective_timeout, launch_error
from easy_context.core.registry import add_backend_args, option_values, unknown_mode_error
from easy_context.data import load_tokenizer, load_train_dataset, random_source_rows
from easy_context.loss import (
    LOSS_CHOICES,
    CausalLMWithLoss,
    all_reduce_count,
    global_mean_for_logging,
    global_mean_loss,
    resolve_loss_impl,
)
from easy_context.memory import CHECKPOINT_MODES, apply_checkpointing, enable_chunked_rmsnorm, enable_tiled_mlp
from easy_context.models import PRESETS, is_random_init, load_model, match_special_tokens
from easy_context.sp_config import SPConfig, resolve_sp_config
from easy_context.training import fp8, recipe
from easy_context.training.compile import compile_regions
from easy_context.training.deepspeed_precision import deepspeed_precision_error
from easy_context.training.metrics import MetricsLogger
from easy_context.training.optim import OPTIMIZERS, build_optimizer
from easy_context.training.process_exit import run_program
from easy_context.training.train_state import (
    CheckpointError,
    DataLayout,
    EpochShuffleSampler,
    load_training_state,
    model_fingerprint,
    read_training_position,
    remove_stale_temp,
    resume_plan,
    save_hf_checkpoint,
    save_training_state,
)
from easy_context.training.watchdog import StepTimeout, Watchdog, parse_step_timeout

TRACKERS = ["none", *(t.value for t in LoggerType)]  # every tracker accelerate knows ("all": those installed)


def main(argv=None) -> None:
    started = time.monotonic()  # --time-limit counts from here (start-up and model loading included)
    args = parse_args(argv)
    accelerator = make_accelerator(args)
    check_launch(accelerator, args)
    start_step, position = resume_position(args, accelerator.process_index)
    last_step = args.max_train_steps if args.stop_at_step is None else min(args.max_train_steps, args.stop_at_step)
    if start_step >= last_step:  # e.g. a re-queued job resuming a finished run: done before building anything
        if accelerator.is_main_process:
            until = f", --stop-at-step {args.stop_at_step}" if last_step < args.max_train_steps else ""
            print(f"nothing to train: {'resumed at' if args.resume_from else 'at'} step {start_step} of "
                  f"{args.max_train_steps}{until}")  # fmt: skip
        return
    args.loss = resolve_loss(args, accelerator)  # "auto" made concrete once: run_config.json records what runs
    set_seed(args.seed)
    sp = sp_config(args)  # the backend, its options, the kernel and this rank's place: every layout question

    # model, data, optimizer
    tokenizer = load_tokenizer_if_needed(args)
    model = build_model(args, tokenizer, sp)
    train_model = CausalLMWithLoss(model, impl=args.loss)
    sampler, loader = build_loader(args, tokenizer, model.config.vocab_size, accelerator)
    optimizer, scheduler = build_optimizer_and_schedule(args, accelerator, train_model)
    train_model, optimizer, scheduler = accelerator.prepare(train_model, optimizer, scheduler)
    ds = accelerator.state.deepspeed_plugin
    record = record_run(args, accelerator, optimizer, sp.sp_size)
    if args.resume_from:
        with exit_on(CheckpointError):
            load_training_state(accelerator, args.resume_from)
    layout = data_layout(args, sp, loader, model.config)
    consumed, skipped, tokens = continue_from(position, layout, args, accelerator)
    step_tokens = tokens_per_step(args, sp)
    metrics = MetricsLogger(accelerator, args.output_dir, model.config, args.seq_length, step_tokens, start_step,
                            start_tokens=tokens)  # fmt: skip
    fixed, floor = parse_step_timeout(args.step_timeout)
    long_phase = max(fixed or 0, 1800)  # the first step (compile, warm-up) and checkpoint saves
    timeouts = StepTimeout(fixed, first_s=long_phase, floor_s=floor)  # fixed, or 10x the slowest step (>= floor)
    watchdog = Watchdog(fixed or long_phase, accelerator.process_index).start(within_s=long_phase) if (
        fixed != 0) else None  # fmt: skip  # a stuck rank or a dead launcher ends the job: never a hang

    # the loop: one optimizer step of --gradient-accumulate-every micro-batches per iteration
    stream = micro_batch_stream(loader, sampler, skip=consumed)
    check_grad_norm = accelerator.mixed_precision != "fp16"  # fp16 loss scaling: inf gradients are the scaler's
    skips_in_a_row = 0
    bar = tqdm(range(start_step, last_step), disable=not accelerator.is_local_main_process,
               initial=start_step, total=args.max_train_steps)  # fmt: skip
    for step in bar:
        step_started = time.monotonic()
        batches = [next(stream) for _ in range(args.gradient_accumulate_every)]
        consumed += len(batches)
        shards = [sp.shard(*host_batch(b, sp, args.balance_documents), "cpu") for b in batches]
        # exact token-mean over every micro-batch, rank and DP replica of this optimizer step: one count, on the
        # host (no device sync), all-reduced once
        n_local = sum(int((s["local_target_ids"] != -100).sum()) for s in shards)
        n_total = all_reduce_count(n_local, device=accelerator.device)
        shards = [{k: v.to(accelerator.device, non_blocking=True) for k, v in s.items()} for s in shards]
        sums = []
        for shard in shards:
            with accelerator.accumulate(train_model):
                loss_sum, n = train_model(shard["local_input_ids"], shard["local_position_ids"],
                                          shard["local_target_ids"])  # fmt: skip
                # accelerate/DeepSpeed average grads over ranks and divide by the accumulation steps: undo both
                loss = global_mean_loss(loss_sum * len(shards), n_total, grad_average_world=accelerator.num_processes,
                                        already_reduced=True)  # fmt: skip
                accelerator.backward(loss)  # under DeepSpeed the step's last backward also runs its optimizer step
            sums.append(loss_sum.detach())
        # one decision per step, before the update and the same on every rank: the loss is reduced over ranks here,
        # the gradients already are (identical on each). DeepSpeed stepped in the last backward; ZeRO-3 skips an
        # update from non-finite gradients itself, and its norm tells
        grad_norm = None
        if args.grad_clip or ds is not None:  # DeepSpeed clips inside its step: this returns its norm
            grad_norm = accelerator.clip_grad_norm_(train_model.parameters(), args.grad_clip)
        logged, grad_norm = to_host(global_mean_for_logging(torch.stack(sums).sum(), n_local), grad_norm)
        problem = nonfinite_problem(step + 1, logged, grad_norm if check_grad_norm else None)
        if problem is None:
            skips_in_a_row = 0
            optimizer.step()  # a no-op under DeepSpeed
        else:
            skipped, skips_in_a_row = skipped + 1, skips_in_a_row + 1
            stop_unless_skippable(problem, args, skips_in_a_row, ds is not None and train_model.was_step_applied())
        scheduler.step()
        optimizer.zero_grad()
        tokens += step_tokens
        if watchdog:
            watchdog.beat(step + 1, within_s=timeouts.after(time.monotonic() - step_started))
        timed = args.time_limit is not None and step + 1 < last_step
        if timed and out_of_time(started, args.time_limit, accelerator.device):
            last_step = step + 1  # every rank takes the same decision (all-reduced): log, save the state, stop
            if accelerator.is_main_process:
                print(f"--time-limit {args.time_limit:g} s reached after step {last_step}: saving and stopping")
        if (step + 1) % args.log_every == 0 or step + 1 == last_step:
            row = metrics.log(step + 1, logged, scheduler.get_last_lr()[0], skipped)
            bar.set_postfix(loss=f"{logged:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            **({"mfu": f"{row['mfu']:.1%}"} if "mfu" in row else {}),
                            mem=f"{row['peak_mem_bytes'] / 2**30:.1f}G")  # fmt: skip
        stopping = step + 1 == args.stop_at_step or step + 1 == last_step < args.max_train_steps  # or --time-limit
        if (args.save_every and (step + 1) % args.save_every == 0) or stopping:
            if watchdog:
                watchdog.beat(step + 1, within_s=long_phase, doing=f"saving state-step{step + 1}")
            save_state(accelerator, f"{args.output_dir}/state-step{step + 1}", step + 1, consumed, skipped, record,
                       layout, tokens)  # fmt: skip
            if watchdog:
                watchdog.beat(step + 1, within_s=timeouts.current)
        if step + 1 == last_step:
            break

    if watchdog:
        watchdog.beat(last_step, within_s=long_phase, doing="saving the final model")
    if not args.no_save:
        with exit_on(CheckpointError):
            save_hf_checkpoint(accelerator, train_model, tokenizer, args.output_dir)
    if watchdog:  # left running until the process exits (exit_process): a teardown that hangs ends too
        watchdog.beat(last_step, within_s=300, doing="shutting down")
    for tracker in accelerator.trackers:  # not accelerator.end_training(): it destroys the world group while
        tracker.finish()  # the model still holds it, and freeing it later can deadlock (process_exit.py)
    if accelerator.is_main_process:
        what = "metrics in" if args.no_save else "saved"
        # the last step's loss on the tokens it trained (needle rows: only their answers), not an evaluation
        print(f"{what} {args.output_dir} (final loss {logged:.4f}: the last step's, on its trained tokens)")


# ---------------------------------------------------------------------------------------------------------------
# flags


def step_timeout(text: str) -> str:
    """argparse type of ``--step-timeout``: checked by :func:`~easy_context.training.watchdog.parse_step_timeout`,
    kept as written (run_config.json records it so)."""
    try:
        parse_step_timeout(text)
        return text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--step-timeout {text!r}: ")) from None


class PrintConfigPath(argparse.Action):
    """``--print-config-path NAME``: print a shipped launch config's path and exit (no other flag needed)."""

    not_a_recipe_key = True

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            print(launch_configs.path(values))
        except ValueError as exc:
            parser.error(str(exc))
        parser.exit()


def build_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--config", default=None, metavar="RECIPE.yaml",
                   help="a YAML recipe (docs/recipes.md): every flag is a key (seq-length: 65536); flags given "
                        "on the command line override it")  # fmt: skip
    p.add_argument("--print-config-path", action=PrintConfigPath, metavar="NAME",
                   help=f"print the path of a shipped launch config ({', '.join(launch_configs.names())}) "
                        "and exit")  # fmt: skip
    p.add_argument(
        "--model",
        required=True,
        help=f"hub id, local path, a preset ({', '.join(PRESETS)}) or shape:<name> (random-init "
        "full-size architecture, e.g. shape:llama-2-7b, vocab from --tokenizer)",
    )
    p.add_argument("--tokenizer", default=None, help="defaults to --model (required for presets)")
    p.add_argument("--dataset", required=True, help="save_to_disk dir (input_ids), .txt/.jsonl files/dirs, hub name, "
                   "or random[:ROWS] (random tokens, no tokenizer needed: throughput and memory probes)")  # fmt: skip
    p.add_argument("--vocab-size", type=cli.positive_int, default=None,
                   help="vocabulary of a random-init model trained on --dataset random without --tokenizer "
                        "(shape: models default to their published vocab)")  # fmt: skip
    p.add_argument("--output-dir", required=True, help="where the final checkpoint, states and logs go")
    p.add_argument("--seq-length", type=cli.positive_int, default=16384, help="tokens per training sequence")
    p.add_argument(
        "--batch-size", type=cli.positive_int, default=1, help="sequences per micro-batch per data-parallel group"
    )
    p.add_argument(
        "--gradient-accumulate-every", type=cli.positive_int, default=8, help="micro-batches per optimizer step"
    )
    p.add_argument("--max-train-steps", type=cli.positive_int, default=400, help="optimizer steps of the run")
    p.add_argument("--learning-rate", type=cli.positive_float, default=2e-5, help="peak learning rate")
    p.add_argument(
        "--warmup-steps", type=cli.non_negative_int, default=20, help="linear warmup steps of the LR schedule"
    )
    p.add_argument("--lr-schedule", default="constant_with_warmup", help="transformers scheduler name")
    p.add_argument("--weight-decay", type=cli.non_negative_float, default=0.0, help="AdamW weight decay")
    p.add_argument("--adam-betas", type=cli.decay_rate, nargs=2, default=(0.9, 0.999), metavar=("BETA1", "BETA2"),
                   help="AdamW betas (0.9 0.95 is the usual LLM pretraining choice)")  # fmt: skip
    p.add_argument(
        "--optimizer",
        default="adamw",
        choices=OPTIMIZERS,
        help="host_adamw: fp32 master weights + Adam moments in host memory, without DeepSpeed",
    )
    p.add_argument(
        "--grad-clip", type=cli.non_negative_float, default=1.0, help="clip the gradient norm to this; 0: no clipping"
    )
    p.add_argument("--nonfinite", default="stop", choices=["stop", "skip"],
                   help="a step whose loss or gradient norm (checked with --grad-clip or DeepSpeed) is inf/NaN: stop "
                        "(exit with an error, before that update and any checkpoint from it) or skip (drop its "
                        "update; the data and the LR schedule still advance; metrics count skipped_steps)")  # fmt: skip
    p.add_argument("--max-skips-in-a-row", type=cli.positive_int, default=10, metavar="N",
                   help="--nonfinite skip: stop with an error at the (N+1)-th non-finite step in a row")  # fmt: skip
    p.add_argument(
        "--rope-theta", type=cli.positive_float, default=None,
        help="override the RoPE base (default: the model's); Gemma 2/3 and other per-layer-type RoPE: the global "
             "layers' only, sliding-window layers keep theirs",
    )  # fmt: skip
    add_backend_args(p, default="zigzag_ring_attn")  # --parallel_mode, each backend's options, --kernel
    p.add_argument("--sp-size", type=cli.positive_int, default=None, help="ranks per sequence (DP x SP); default all")
    p.add_argument("--balance-documents", action="store_true",
                   help="packed documents (--pack documents): reorder each row's whole documents so every ring step's "
                        "work is even over the ranks (exact: the same loss and gradients; zigzag 128K on 8 ranks: "
                        "1.37x less lockstep attention time, counted; docs/documents.md)")  # fmt: skip
    p.add_argument(
        "--checkpointing",
        default="full",
        choices=list(CHECKPOINT_MODES),
        help="; ".join(f"{k}: {v}" for k, v in CHECKPOINT_MODES.items()),
    )
    p.add_argument("--offload-layers", type=cli.non_negative_int, default=None, metavar="K",
                   help="with --checkpointing offload/attn-offload: the first K stored layer inputs go to the host "
                        "(pageable), the rest stay on the GPU (when the host cannot hold them all)")  # fmt: skip
    p.add_argument("--checkpoint-every", type=cli.positive_int, default=1, metavar="K",
                   help="with --checkpointing full/offload: keep only every K-th layer input, regenerate the others "
                        "in the backward (1/K of the checkpoint bytes, (K-1)/K extra forward per layer)")  # fmt: skip
    p.add_argument("--fp8", action="store_true",
                   help="the decoder layers' linears in float8 (torchao, rowwise scales; needs sm89+, e.g. H100/H200; "
                        "attention, norms and the LM-head loss stay in --dtype): docs/fp8.md")  # fmt: skip
    p.add_argument("--fp8-emulate", action="store_true",
                   help="--fp8 with the float8 casts emulated in fp32 GEMMs (CPU tests; no speed-up)")  # fmt: skip
    p.add_argument(
        "--chunked-rmsnorm",
        action="store_true",
        help="RMSNorms without fp32 (seq, hidden) copies (same values; the long-context memory peak)",
    )
    p.add_argument(
        "--tiled-mlp", type=cli.non_negative_int, default=0, metavar="TILES", help="run MLPs over this many tiles"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the norms, the MLPs' gated products and RoPE of every layer (attention and the "
        "down projections stay eager: easy_context/training/compile.py; with --fp8 whole MLPs); not under DeepSpeed",
    )
    p.add_argument(
        "--loss",
        default="auto",
        choices=LOSS_CHOICES,
        help="LM head + cross-entropy implementation "
        "(auto: liger on a CUDA GPU with liger-kernel installed, else chunked; the same loss either way)",
    )
    p.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="model weights and compute dtype"
    )
    p.add_argument("--seed", type=cli.non_negative_int, default=42, help="data order and random-init weights")
    p.add_argument(
        "--save-every",
        type=cli.non_negative_int,
        default=0,
        help="save a resumable state every N steps (0: only at end)",
    )
    p.add_argument("--resume-from", default=None,
                   help="a state dir written by --save-every / --stop-at-step (refused when --model, --seq-length or "
                        "--parallel_mode differ from its run_config.json)")  # fmt: skip
    p.add_argument("--step-timeout", type=step_timeout, default="auto", metavar="S",
                   help="end the job (exit 124) when a rank makes no progress for S seconds, naming the rank and step: "
                        "a stuck rank or a dead launcher never hangs it. auto: 10x the slowest step so far, at least "
                        "120 s (auto:MIN_S: at least MIN_S); a number: fixed; 0: off. The first step and saves get "
                        "max(S, 1800) s")  # fmt: skip
    p.add_argument("--stop-at-step", type=cli.positive_int, default=None,
                   help="end this run at that step with a resumable state (time-limited jobs); the schedule "
                        "still follows --max-train-steps")  # fmt: skip
    p.add_argument("--time-limit", type=cli.non_negative_float, default=None, metavar="S",
                   help="end this run after the first step that ends S seconds after its start (start-up included) "
                        "with a resumable state and the model saved (time-limited jobs); the schedule still follows "
                        "--max-train-steps")  # fmt: skip
    p.add_argument("--log-every", type=cli.positive_int, default=1, help="print and log metrics every N steps")
    p.add_argument("--no-save", action="store_true", help="skip the final checkpoint (benchmarks and probes)")
    p.add_argument("--tracker", default="none", choices=TRACKERS, metavar="{none,tensorboard,wandb,...}",
                   help=f"experiment tracker, any of accelerate's: {', '.join(TRACKERS)} (wandb runs offline "
                        "without WANDB_API_KEY)")  # fmt: skip
    p.add_argument("--wandb", default=None, help="EasyContext compat: wandb project name (= --tracker wandb)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The flags (``--config`` recipe first, the command line over it), checked: a bad combination is a one-line
    usage error before anything is built."""
    p = build_parser()
    args = recipe.parse_args_with_recipe(p, argv)
    for flag, name in [("--model", args.model), ("--tokenizer", args.tokenizer)]:
        error = cli.model_source_error(name, flag)
        if error:
            p.error(error)
    if args.wandb:
        args.tracker = "wandb"
    tracker_error = check_tracker(args.tracker)
    if tracker_error:
        p.error(tracker_error)
    try:
        args.random_rows = random_source_rows(args.dataset)
    except ValueError as exc:
        p.error(str(exc))
    if args.random_rows is None and is_random_init(args.model) and not args.tokenizer:
        p.error(f"--model {args.model} (random init) needs --tokenizer (e.g. DIR/tokenizer of easy_context.data)")
    if args.vocab_size and args.random_rows is None:
        p.error("--vocab-size is for --dataset random (a real dataset's ids come from its tokenizer)")
    if args.random_rows is not None and args.model in PRESETS and not (args.tokenizer or args.vocab_size):
        p.error(f"--model {args.model} with --dataset {args.dataset}: give --vocab-size (or --tokenizer)")
    if unknown_mode_error(args.parallel_mode):
        p.error(unknown_mode_error(args.parallel_mode))
    return args


def check_tracker(name: str) -> str | None:
    """Why ``--tracker name`` cannot log here (its package is not installed), or None. wandb without an API key is
    switched to offline mode (runs sync later with ``wandb sync``)."""
    if name == "none":
        return None
    available = [t.value for t in get_available_trackers()]
    if name == "all" and not available:
        return f"--tracker all: no tracker is installed (pip install one of {', '.join(TRACKERS[2:])})"
    if name != "all" and name not in available:
        return f"--tracker {name} needs the {name} package: pip install {name}"
    if name in ("wandb", "all") and "WANDB_API_KEY" not in os.environ:
        os.environ.setdefault("WANDB_MODE", "offline")
    return None


# ---------------------------------------------------------------------------------------------------------------
# setup: each step fails with one line, before any work


@contextmanager
def exit_on(*errors: type[BaseException], flag: str = ""):
    """Turn the expected failures of one setup step into a one-line ``error: [flag]message`` exit."""
    try:
        yield
    except errors as exc:
        sys.exit(f"error: {flag}{' '.join(str(exc).split())}")  # one line, also for transformers' multi-line ones


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
    with exit_on(ValueError, flag="" if args.sp_size is None else f"--sp-size {args.sp_size}: "):
        return resolve_sp_config(args.parallel_mode, sp_size=args.sp_size, kernel=args.kernel, **options)


def backend_options(args) -> dict:
    """The options the chosen backend takes (``SeqAlgo.options``), from the flags of the same names."""
    try:
        return ec.get_seq_algo(args.parallel_mode).options_from(option_values(args))
    except ValueError as exc:
        sys.exit(f"error: --{exc}")


def check_layout(args, sp: SPConfig, config) -> None:
    """Fail fast, with one line, on a layout the backend cannot run (the backend's own layout rule decides)."""
    try:
        sp.check_model(config).check_length(args.seq_length, "--seq-length")
    except ValueError as exc:
        sys.exit(f"error: {exc}")


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
    check_layout(args, sp, model.config)
    # checkpoint-after-attention needs our attention function, also under data parallel
    sp.attach(model, through_easy_context=args.checkpointing.startswith("attn") or args.kernel != "auto")
    with exit_on(ValueError):
        apply_checkpointing(model, args.checkpointing, offload_layers=args.offload_layers,
                            checkpoint_every=args.checkpoint_every)  # fmt: skip  # per decoder layer
    if args.tiled_mlp:
        enable_tiled_mlp(model, num_tiles=args.tiled_mlp)
    if args.chunked_rmsnorm:
        enable_chunked_rmsnorm(model)
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
    """The dataset's rows in a per-epoch shuffled order, one copy per SP group (sharded over DP groups only)."""
    with exit_on(OSError, RuntimeError, ValueError):
        dataset = load_train_dataset(args.dataset, tokenizer, args.seq_length, seed=args.seed,
                                     show_progress=accelerator.is_local_main_process,
                                     vocab_size=vocab_size)  # fmt: skip
    sampler = EpochShuffleSampler(len(dataset), args.seed)
    loader = ec.prepare_dataloader(args.parallel_mode, DataLoader(dataset, args.batch_size, sampler=sampler),
                                   accelerator, sp_size=args.sp_size)  # fmt: skip
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


def save_state(accelerator, directory: str, step: int, consumed: int, skipped: int, record: dict | None,
               layout: DataLayout, tokens: int) -> None:  # fmt: skip
    """A resumable state with the run's record (its ``config``, which --resume-from checks), its data layout and
    the tokens trained so far."""
    with exit_on(CheckpointError):
        save_training_state(accelerator, directory, step, consumed, skipped, layout=layout, tokens=tokens,
                            config=record)  # fmt: skip


def tokens_per_step(args, layout: SPConfig | DataLayout) -> int:
    """Tokens of one optimizer step over all ranks (an SP group shares its sequences; the ranks reading different
    samples are the layout's ``data_shards``)."""
    return args.batch_size * args.seq_length * args.gradient_accumulate_every * layout.data_shards


# ---------------------------------------------------------------------------------------------------------------
# the step's pieces


def micro_batch_stream(loader, sampler: EpochShuffleSampler, skip: int):
    """Endless, deterministic stream of batches; skips the ``skip`` a resumed run already consumed."""

    def epochs():
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    return itertools.islice(epochs(), skip, None)


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(inputs, position_ids or None, targets) of a (batch, seq_length + 1) micro-batch, on the host. A dataset packed
    with ``--pack documents`` also yields position_ids restarting at each document (attention stays inside it); one
    with needle rows trained on their answers yields labels (-100: not trained), whose next token is the target."""
    if not isinstance(batch, dict):
        return batch[:, :-1].cpu(), None, batch[:, 1:].cpu()
    positions = batch.get("position_ids")
    targets = batch.get("labels", batch["input_ids"])
    return (
        batch["input_ids"][:, :-1].cpu(),
        None if positions is None else positions[:, :-1].cpu(),
        targets[:, 1:].cpu(),
    )


def host_batch(batch, sp: SPConfig, balance: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`split_batch`; with ``balance`` the whole documents of each row reordered so that ``sp``'s ring steps
    get even work (:func:`~easy_context.core.document_order.balance_documents`: every rank computes the same order)."""
    parts = split_batch(batch)
    if balance and parts[1] is not None:
        parts = balance_documents(*parts, sp.backend, sp.sp_size, **sp.options)
    return parts


def to_host(loss: torch.Tensor, grad_norm: torch.Tensor | float | None) -> tuple[float, float | None]:
    """The step's loss and gradient norm as Python floats, in one device-to-host sync."""
    if grad_norm is None:
        return loss.item(), None
    loss, grad_norm = torch.stack([loss, torch.as_tensor(grad_norm, dtype=loss.dtype, device=loss.device)]).tolist()
    return loss, grad_norm


def out_of_time(started: float, limit_s: float, device: torch.device) -> bool:
    """Whether ``limit_s`` seconds have passed since ``started`` (time.monotonic) on any rank: one all-reduced flag,
    so that every rank stops after the same step."""
    late = torch.tensor([time.monotonic() - started >= limit_s], dtype=torch.int32, device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(late, op=torch.distributed.ReduceOp.MAX)
    return bool(late.item())


def nonfinite_problem(step: int, loss: float, grad_norm: float | None) -> str | None:
    """Why step ``step`` must not update the weights (its loss or gradient norm is inf/NaN), or None."""
    bad = [f"{name} {value}" for name, value in (("loss", loss), ("gradient norm", grad_norm))
           if value is not None and not math.isfinite(value)]  # fmt: skip
    return f"step {step}: non-finite {' and '.join(bad)}" if bad else None


def stop_unless_skippable(problem: str, args, skips_in_a_row: int, deepspeed_applied: bool) -> None:
    """Exit (before any checkpoint from this step) unless ``--nonfinite skip`` may drop the step's update."""
    if deepspeed_applied:
        sys.exit(f"error: {problem}; DeepSpeed applied that update (its ZeRO stage does not skip non-finite "
                 "gradients): stopped before any checkpoint from it")  # fmt: skip
    if args.nonfinite == "stop":
        sys.exit(f"error: {problem}; stopped before updating the weights (--nonfinite stop)")
    if skips_in_a_row > args.max_skips_in_a_row:
        sys.exit(f"error: {problem}; {skips_in_a_row} steps in a row skipped "
                 f"(--max-skips-in-a-row {args.max_skips_in_a_row})")  # fmt: skip


def run() -> None:
    """The ``easy-context-train`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
