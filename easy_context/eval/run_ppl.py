r"""Perplexity as the context grows, with any sequence-parallel backend (token-weighted, no (seq, vocab) logits).

    python eval_ppl.py --model out/demo/extended --min-tokens 256 --max-tokens 2048 --truncate --samples 4 \
        --output out/demo/ppl.csv                                      # default data: the essays, concatenated
    accelerate launch --config_file accelerate_configs/single_node.yaml eval_ppl.py -m M1 -m M2 \
        --dataset emozilla/pg19-test --dataset-min-tokens 131072 --min-tokens 8192 --max-tokens 131072 --truncate

Lengths: --min-tokens doubled up to --max-tokens, or range(min, max + 1, --tokens-step). Each length reads
every sample in windows of that many tokens (--truncate: the first window only; else sliding by
--sliding-window). Writes a CSV (model, tokens, ppl, loss, samples, scored_tokens, ...); plot it with plot.py.
Installed: easy-context-eval-ppl (or python -m easy_context.eval.run_ppl), same flags.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from tqdm import tqdm

from easy_context import cli
from easy_context.core.registry import option_values
from easy_context.data import load_documents
from easy_context.eval.perplexity import perplexity_at, ppl_lengths, select_documents, tokenize_documents
from easy_context.eval.results import write_csv
from easy_context.eval.runtime import add_runtime_args, init_runtime, load_eval_model_from_args, position_warning
from easy_context.eval.tokens import unlimited
from easy_context.loss import CausalLMWithLoss
from easy_context.models import PRESETS
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.source import model_source_error
from easy_context.models.tokenizer import load_tokenizer, start_ids
from easy_context.tasks.haystack import FETCH_HINT
from easy_context.training.process_exit import run_program

DEFAULT_DATASET = "PaulGrahamEssays"


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument(
        "-m",
        "--model",
        action="append",
        required=True,
        help=MODEL_HELP + "; repeat for several",
    )
    p.add_argument(
        "-d",
        "--dataset",
        default=None,
        help="HF hub dataset (name[:config]), save_to_disk dir or .txt/.jsonl files/dirs with 'text'; "
        f"default {DEFAULT_DATASET}/ concatenated",
    )
    p.add_argument(
        "--concatenate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="join the documents and cut them into --max-tokens samples (default: only for the essays)",
    )
    p.add_argument("--min-tokens", type=cli.positive_int, default=256, help="shortest evaluated length L")
    p.add_argument(
        "--max-tokens",
        type=cli.positive_int,
        default=8192,
        help="longest evaluated length L (doubling from --min-tokens)",
    )
    p.add_argument("--tokens-step", type=cli.positive_int, default=None, help="linear steps instead of doubling")
    p.add_argument("--samples", type=cli.positive_int, default=None, help="use the first N samples (documents)")
    p.add_argument(
        "--dataset-min-tokens", type=cli.non_negative_int, default=None, help="keep documents with at least N tokens"
    )
    p.add_argument("--truncate", action="store_true", help="one window per sample: its first L tokens")
    p.add_argument(
        "--sliding-window", type=cli.positive_int, default=256, help="stride of the sliding window (without --truncate)"
    )
    p.add_argument("--output", "--output-file", default=None, help="CSV path (default out/eval_ppl.csv)")
    add_runtime_args(p)
    cli.retype(p, rope_theta=cli.positive_float, seed=cli.non_negative_int)
    args = p.parse_args(argv)
    for flag, name in [("--model", m) for m in args.model] + [("--tokenizer", args.tokenizer)]:
        error = model_source_error(name, flag)
        if error:
            p.error(error)
    try:
        ppl_lengths(args.min_tokens, args.max_tokens, args.tokens_step)
    except ValueError as exc:
        p.error(str(exc))
    if any(m in PRESETS for m in args.model) and not args.tokenizer:
        p.error("a random-init preset --model needs --tokenizer")
    if args.concatenate is None:
        args.concatenate = args.dataset is None
    args.dataset = args.dataset or DEFAULT_DATASET
    args.output = args.output or os.path.join("out", "eval_ppl.csv")
    return args


def load_samples(args, tokenizer, max_tokens: int) -> list[list[int]]:
    """The token ids of the evaluation samples (see :func:`easy_context.eval.perplexity.select_documents`)."""
    if args.dataset == DEFAULT_DATASET and not os.path.isdir(DEFAULT_DATASET):
        raise FileNotFoundError(
            f"dataset folder {DEFAULT_DATASET!r} does not exist; {FETCH_HINT.replace('haystack_dir', 'dataset')}"
        )
    docs = tokenize_documents(load_documents(args.dataset), tokenizer)
    samples = select_documents(
        docs, max_tokens if args.concatenate else None, tokenizer.eos_token_id, args.dataset_min_tokens, args.samples
    )
    if not samples:
        raise ValueError(f"no evaluation samples in {args.dataset!r} (--dataset-min-tokens {args.dataset_min_tokens})")
    return samples


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        lengths = ppl_lengths(args.min_tokens, args.max_tokens, args.tokens_step)
        runtime = init_runtime(args.parallel_mode, args.kernel, **option_values(args))
        tokenizer = unlimited(load_tokenizer(args.tokenizer or args.model[0]))
        samples = load_samples(args, tokenizer, lengths[-1])
    except (OSError, RuntimeError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    lead = start_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    mode = "truncate" if args.truncate else f"sliding {args.sliding_window}"
    runtime.print(
        f"eval_ppl: {len(samples)} samples ({min(map(len, samples))}-{max(map(len, samples))} tokens), "
        f"lengths {lengths}, {mode} | {runtime.seq_algo} on {runtime.world_size} process(es)"
    )
    rows = []
    for name in args.model:
        try:
            model = load_eval_model_from_args(name, runtime, len(tokenizer), args, max_length=lengths[-1])
        except (OSError, RuntimeError, ValueError) as exc:
            # keep what was scored (hub ids cannot be checked up front without loading them)
            kept = ""
            if rows:
                if runtime.is_main:
                    write_csv(rows, args.output)
                kept = f"; the {len(rows)} rows scored before it are in {args.output}"
            sys.exit(f"error: --model {name}: {' '.join(str(exc).split())}{kept}")  # one line
        scorer = CausalLMWithLoss(model)
        for length in lengths:
            message = position_warning(model.config, length, name)
            if message:
                runtime.print(message)
            start = time.time()
            bar = tqdm(
                total=len(runtime.my_share(len(samples))),
                desc=f"{os.path.basename(name)} @ {length}",
                disable=not runtime.is_main,
                file=sys.stderr,
            )
            result = perplexity_at(
                scorer, runtime, samples, length, args.sliding_window, args.truncate, lead, pad_id, progress=bar
            )
            bar.close()
            rows.append(
                {
                    "model": name,
                    "tokens": length,
                    "ppl": result.ppl,
                    "loss": result.loss,
                    "samples": result.samples,
                    "scored_tokens": result.scored_tokens,
                    "mode": mode,
                    "parallel_mode": runtime.seq_algo,
                    "processes": runtime.world_size,
                    "seconds": round(time.time() - start, 2),
                }
            )
            runtime.print(
                f"{name} @ {length} tokens: ppl {result.ppl:.4f} (loss {result.loss:.4f}, "
                f"{result.scored_tokens} tokens)"
            )
        del scorer, model
    if runtime.is_main:
        write_csv(rows, args.output)
        print(f"perplexity: {args.output}")
    torch.distributed.barrier()


def run() -> None:
    """The ``easy-context-eval-ppl`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
