"""How full RULER's prompts are: (prompt + tokens_to_generate) / length per task and length, median and mean over
samples, with the sizing eval_ruler.py uses (``--sizing ruler``: RULER's size search) and a given tokenizer.

    python bench/ruler_fill.py --tokenizer path/SmolLM2-135M-Instruct.Q4_1.gguf --lengths 4096,8192 --samples 8

With ``--seeds K`` each cell also gives the mean fill over seeds 0..K-1 (one size search each) and the range of the
per-seed means: what RULER's rule gives on average, and how far one run's search can land from it.

The essays come from --haystack_dir (PaulGrahamEssays by default); the English word lists from wonderwords.
"""

from __future__ import annotations

import argparse
import statistics

from easy_context.eval.run_ruler import prompt_wrapper
from easy_context.eval.tokens import unlimited
from easy_context.models.tokenizer import encode, load_tokenizer, start_ids
from easy_context.tasks.haystack import read_haystack_text
from easy_context.tasks.ruler.builders import DEFAULT_TASKS, TASKS, make_case


def fills(
    tokenizer, task: str, length: int, samples: int, essay_words: list[str], sizing: str, seed: int = 0
) -> list[float]:
    """Each sample's (prompt tokens + tokens_to_generate) / length."""
    wrap, _ = prompt_wrapper(tokenizer, "base")
    start = start_ids(tokenizer)

    def count(text: str) -> int:
        return len(encode(tokenizer, text, start))

    out = []
    for sample in range(samples):
        case = make_case(TASKS[task], length, sample, count, wrap, essay_words, seed, sizing)
        out.append((count(case.text) + case.max_new_tokens) / length)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--lengths", default="4096,8192")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    p.add_argument("--haystack_dir", default="PaulGrahamEssays")
    p.add_argument("--sizing", default="ruler", choices=("ruler", "fill"))
    p.add_argument("--seeds", type=int, default=1, help="also the mean over seeds 0..K-1 (K > 1)")
    args = p.parse_args(argv)
    tokenizer = unlimited(load_tokenizer(args.tokenizer))
    essay_words = read_haystack_text(args.haystack_dir).split()
    lengths = [int(n) for n in args.lengths.split(",")]
    head = "median / mean / min" + (f"; mean of {args.seeds} seeds [range]" if args.seeds > 1 else "")
    print("| task | " + " | ".join(f"{n}: {head}" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for task in args.tasks.split(","):
        cells = []
        for n in lengths:
            f = fills(tokenizer, task, n, args.samples, essay_words, args.sizing)
            cell = f"{statistics.median(f):.3f} / {statistics.fmean(f):.3f} / {min(f):.3f}"
            if args.seeds > 1:
                means = [statistics.fmean(f)] + [
                    statistics.fmean(fills(tokenizer, task, n, args.samples, essay_words, args.sizing, seed))
                    for seed in range(1, args.seeds)
                ]
                cell += f"; {statistics.fmean(means):.3f} [{min(means):.3f}-{max(means):.3f}]"
            cells.append(cell)
        print(f"| {task} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
