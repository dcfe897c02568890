r"""Needle-in-a-haystack retrieval over context length x depth, with any sequence-parallel backend.

    python eval_needle.py --model out/demo/extended --max_context_length 2048 --min_context_length 256 \
        --context_interval 256 --depth_interval 0.25 --num_samples 2          # one process: the plain model
    accelerate launch --config_file accelerate_configs/single_node.yaml eval_needle.py --model M \
        --max_context_length 131072 --min_context_length 8192 --context_interval 8192   # zigzag over 8 GPUs

A needle "The special magic <city> number is: <number>." (plus --num_distractor other cities) is put at a
sentence boundary of the haystack (--haystack_dir, .txt files) at each depth; the question asks for the
city's number. Score: teacher-forced exact match of the answer tokens (--generate adds greedy decoding).
Writes results.csv, results.json and heatmap.png into --output-dir.
Installed: easy-context-eval-needle (or python -m easy_context.eval.run_needle), same flags.
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
from easy_context.eval.plots import needle_heatmap
from easy_context.eval.results import cell_scores, write_csv, write_json
from easy_context.eval.runtime import add_runtime_args, init_runtime, load_eval_model_from_args, position_warning
from easy_context.eval.scoring import score_case
from easy_context.eval.tokens import unlimited
from easy_context.models import PRESETS
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.source import model_source_error
from easy_context.models.tokenizer import load_tokenizer
from easy_context.tasks.haystack import Haystack, read_haystack_text
from easy_context.tasks.needle import context_lengths, depth_percents, make_case
from easy_context.training.process_exit import run_program


def depth_step(text: str) -> float:
    """argparse type of ``--depth_interval``: a fraction in (0, 1] or a percent in (1, 100]."""
    value = cli.positive_float(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1] or a percent in (1, 100], got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--max_context_length", type=cli.positive_int, default=8192, help="largest haystack size in tokens")
    p.add_argument("--min_context_length", type=cli.positive_int, default=1024, help="smallest haystack size in tokens")
    p.add_argument(
        "--context_interval", type=cli.positive_int, default=1024, help="lengths: range(min, max + 1, interval)"
    )
    p.add_argument(
        "--depth_interval",
        type=depth_step,
        default=0.1,
        help="depth step as a fraction (0.1 = 0%%, 10%%, ..., 100%%) or, above 1, in percent (10)",
    )
    p.add_argument(
        "--num_samples", type=cli.positive_int, default=5, help="needles (city, number) per (length, depth) cell"
    )
    p.add_argument("--rnd_number_digits", type=cli.positive_int, default=7, help="digits of each needle's number")
    p.add_argument(
        "--num_distractor", type=cli.non_negative_int, default=0, help="needles of other cities at random depths"
    )
    p.add_argument("--haystack_dir", default="PaulGrahamEssays", help="folder of .txt files")
    p.add_argument("--generate", action="store_true", help="also score greedy generation of the answer")
    p.add_argument("--output-dir", "--output_dir", default=None, help="default out/eval_needle/<model name>")
    add_runtime_args(p)
    cli.retype(p, rope_theta=cli.positive_float, seed=cli.non_negative_int)
    args = p.parse_args(argv)
    for flag, name in [("--model", args.model), ("--tokenizer", args.tokenizer)]:
        error = model_source_error(name, flag)
        if error:
            p.error(error)
    if args.model in PRESETS and not args.tokenizer:
        p.error(f"--model {args.model} (random init) needs --tokenizer")
    try:
        context_lengths(args.min_context_length, args.max_context_length, args.context_interval)
    except ValueError as exc:
        p.error(str(exc))
    if args.output_dir is None:
        args.output_dir = os.path.join("out", "eval_needle", os.path.basename(os.path.normpath(args.model)))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        lengths = context_lengths(args.min_context_length, args.max_context_length, args.context_interval)
        depths = depth_percents(args.depth_interval)
        text = read_haystack_text(args.haystack_dir)
        runtime = init_runtime(args.parallel_mode, args.kernel, **option_values(args))
        tokenizer = unlimited(load_tokenizer(args.tokenizer or args.model))
        model = load_eval_model_from_args(args.model, runtime, len(tokenizer), args, max_length=lengths[-1])
    except (OSError, RuntimeError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    haystack = Haystack.from_text(text, tokenizer)
    if haystack.total_tokens < lengths[-1]:
        haystack = haystack.repeated_to(lengths[-1])
        runtime.print(
            f"note: {args.haystack_dir} holds {haystack.total_tokens // haystack.repeats} tokens, fewer than "
            f"--max_context_length {lengths[-1]}: the haystack is repeated {haystack.repeats} times"
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    runtime.print(
        f"eval_needle: {args.model} | {runtime.seq_algo} on {runtime.world_size} process(es) | "
        f"{len(lengths)} lengths x {len(depths)} depths x {args.num_samples} samples"
    )

    cells = [(n, d, s) for n in lengths for d in depths for s in range(args.num_samples)]
    mine = runtime.my_share(len(cells))
    warned: set[int] = set()
    rows = []
    start = time.time()
    for index in tqdm(mine, desc="needle cells", disable=not runtime.is_main, file=sys.stderr):
        length, depth, sample = cells[index]
        case = make_case(haystack, length, depth, sample, args.rnd_number_digits, args.num_distractor, args.seed)
        with torch.no_grad():
            row = score_case(model, runtime, tokenizer, case, pad_id, args.generate)
        if length not in warned:
            warned.add(length)
            message = position_warning(model.config, row["prompt_tokens"] + row["answer_tokens"], args.model)
            if message:
                runtime.print(message)
        rows.append(row)
    rows = sorted(runtime.gather_objects(rows), key=lambda r: (r["length"], r["depth"], r["sample"]))

    if runtime.is_main:
        scores = sorted(cell_scores(rows).items(), key=lambda item: (item[0][1], item[0][0]))
        accuracy = sum(r["correct"] for r in rows) / len(rows)
        summary = {
            "model": args.model,
            "parallel_mode": runtime.seq_algo,
            "processes": runtime.world_size,
            "accuracy": accuracy,
            "cells": [{"length": n, "depth": d, "score": v} for (d, n), v in scores],
            "args": vars(args),
            "seconds": round(time.time() - start, 1),
            "rows": rows,
        }
        if args.generate:
            summary["generated_accuracy"] = sum(r["generated_correct"] for r in rows) / len(rows)
        write_csv(rows, os.path.join(args.output_dir, "results.csv"))
        write_json(summary, os.path.join(args.output_dir, "results.json"))
        png = needle_heatmap(
            rows, os.path.join(args.output_dir, "heatmap.png"), title=os.path.basename(os.path.normpath(args.model))
        )
        print(
            f"needle accuracy {accuracy:.3f} over {len(rows)} prompts; results: "
            f"{os.path.join(args.output_dir, 'results.csv')}; heatmap: {png}"
        )
    torch.distributed.barrier()


def run() -> None:
    """The ``easy-context-eval-needle`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
