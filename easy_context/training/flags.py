"""The flags of the training program (easy_context/train.py): the parser, its types and the checks that make a bad
combination a one-line usage error before anything is built."""

from __future__ import annotations

import argparse
import os

from accelerate.tracking import get_available_trackers
from accelerate.utils import LoggerType

from easy_context import cli, launch_configs
from easy_context.core.registry import add_backend_args, unknown_mode_error
from easy_context.data import random_source_rows
from easy_context.loss import LOSS_CHOICES
from easy_context.memory import CHECKPOINT_MODES
from easy_context.models import PRESETS, is_random_init
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.source import model_source_error
from easy_context.training import recipe
from easy_context.training.optim import OPTIMIZERS
from easy_context.training.watchdog import parse_step_timeout

DEFAULT_PARALLEL_MODE = "zigzag_ring_attn"  # --parallel_mode when none is given

TRACKERS = ["none", *(t.value for t in LoggerType)]  # every tracker accelerate knows ("all": those installed)


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


def build_parser(description: str | None = None) -> cli.ArgumentParser:
    """The training program's flags; ``description`` heads ``--help`` (easy_context.train passes its docstring)."""
    p = cli.ArgumentParser(description=description)
    p.add_argument("--config", default=None, metavar="RECIPE.yaml",
                   help="a YAML recipe (docs/recipes.md): every flag is a key (seq-length: 65536); flags given "
                        "on the command line override it")  # fmt: skip
    p.add_argument("--print-config-path", action=PrintConfigPath, metavar="NAME",
                   help=f"print the path of a shipped launch config ({', '.join(launch_configs.names())}) "
                        "and exit")  # fmt: skip
    p.add_argument(
        "--model",
        required=True,
        help=MODEL_HELP + " (random weights take their vocabulary from --tokenizer)",
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
    add_backend_args(p, default=DEFAULT_PARALLEL_MODE)  # --parallel_mode, each backend's options, --kernel
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
    p.add_argument("--attn-heads-per-call", type=cli.positive_int, default=None, metavar="N",
                   help="call the attention kernel on at most N query heads at a time (same values; the backward's "
                        "workspace and GQA dK/dV shrink with N: the long-context attention peak)")  # fmt: skip
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
    p.add_argument("--resume-from", default=None, metavar="STATE_DIR|auto",
                   help="a state dir written by --save-every / --stop-at-step / a stop signal (refused when --model or "
                        "--seq-length differ from its run_config.json); auto: the newest complete state-stepN in "
                        "--output-dir, or step 0 when there is none (one command starts a job and continues it after "
                        "a requeue)")  # fmt: skip
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


def parse_args(argv: list[str] | None = None, parser: cli.ArgumentParser | None = None) -> argparse.Namespace:
    """The flags of ``parser`` (default :func:`build_parser`): the ``--config`` recipe first, the command line over
    it, checked: a bad combination is a one-line usage error before anything is built."""
    p = build_parser() if parser is None else parser
    args = recipe.parse_args_with_recipe(p, argv)
    for flag, name in [("--model", args.model), ("--tokenizer", args.tokenizer)]:
        error = model_source_error(name, flag)
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
