"""The summary of a context extension: needle accuracy within / beyond the base length and perplexity per length,
before and after, from the result files of ``eval_needle.py`` and ``eval_ppl.py``; one figure and one JSON.

    python -m easy_context.eval.extension --before out/demo/before --after out/demo/after \\
        --base-length 256 --target-length 2048 --output out/demo

reads ``{before,after}/needle/results.csv`` and ``{before,after}/ppl.csv``, writes ``summary.json``
(``{"base_length", "target_length", "before": {"needle_within", "needle_beyond", "ppl": {length: ppl},
"answer_logprob_within", "answer_logprob_beyond"}, "after": {...}, "seconds"}``) and ``extension.png``, and
prints one line.

``--train-metrics NAME=PATH`` (repeatable; PATH a train.py output dir or its ``metrics.jsonl``) adds
``"training": {NAME: {"steps", "tokens", "tokens_per_s", "train_seconds", "loss", "peak_mem_gib", "mfu"}}``
(:func:`training_summary`). ``--partial``: a stage whose result files are missing (a time-limited run that did not
get there) is recorded as null and drawn as "no results" instead of failing the summary.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from easy_context import cli
from easy_context.eval.results import read_csv, write_json


def needle_split(rows: list[dict], base_length: int, key: str = "correct") -> tuple[float | None, float | None]:
    """Mean ``key`` of the rows at lengths <= ``base_length`` and > it (None where there are none)."""
    within = [float(r[key]) for r in rows if int(r["length"]) <= base_length]
    beyond = [float(r[key]) for r in rows if int(r["length"]) > base_length]
    return (sum(within) / len(within) if within else None, sum(beyond) / len(beyond) if beyond else None)


def ppl_by_length(rows: list[dict]) -> dict[int, float]:
    """{tokens: ppl} of one model's eval_ppl rows."""
    models = {r["model"] for r in rows}
    if len(models) != 1:
        raise ValueError(f"expected one model's perplexity rows, got {sorted(models)}")
    return {int(r["tokens"]): round(float(r["ppl"]), 4) for r in rows}


def stage(folder: str, base_length: int) -> tuple[dict, list[dict], dict[int, float]]:
    """(summary part, needle rows, ppl by length) of one evaluated model's folder."""
    needle = read_csv(os.path.join(folder, "needle", "results.csv"), numeric=("length", "depth", "correct"))
    ppl = ppl_by_length(read_csv(os.path.join(folder, "ppl.csv"), numeric=("tokens", "ppl")))
    within, beyond = needle_split(needle, base_length)
    part = {"needle_within": within, "needle_beyond": beyond, "ppl": ppl}
    if needle and "answer_logprob" in needle[0]:  # the answer's total log-probability: progress before accuracy
        lp_within, lp_beyond = needle_split(needle, base_length, "answer_logprob")
        part |= {"answer_logprob_within": lp_within, "answer_logprob_beyond": lp_beyond}
    return part, needle, ppl


def stage_or_none(folder: str, base_length: int) -> tuple[dict | None, list[dict], dict[int, float]]:
    """:func:`stage`, or (None, [], {}) when ``folder`` holds neither result file (the stage did not run)."""
    files = [os.path.join(folder, "needle", "results.csv"), os.path.join(folder, "ppl.csv")]
    if not any(os.path.isfile(f) for f in files):
        return None, [], {}
    return stage(folder, base_length)


def training_summary(path: str) -> dict:
    """What one train.py run's ``metrics.jsonl`` (``path``: the file or its output dir) says about its speed:
    last step, tokens, final loss, the median ``tokens_per_s`` over the logged intervals (robust to the slow first
    interval of each start, which includes the warm-up), ``train_seconds`` (the intervals' sum: the loop's time),
    the peak GPU memory (GiB) and the median MFU (GPUs only)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no metrics rows")
    seconds, previous = 0.0, 0
    for row in rows:  # the tokens of each interval over its rate
        seconds += (row["tokens"] - previous) / max(row["tokens_per_s"], 1e-9)
        previous = row["tokens"]
    out = {
        "steps": rows[-1]["step"],
        "tokens": rows[-1]["tokens"],
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
        "train_seconds": round(seconds, 1),
        "loss": round(rows[-1]["loss"], 4),
        "peak_mem_gib": round(max(r["peak_mem_bytes"] for r in rows) / 2**30, 2),
    }
    if all("mfu" in r for r in rows):
        out["mfu"] = round(statistics.median(r["mfu"] for r in rows), 4)
    return out


def summarize(
    before: str,
    after: str,
    base_length: int,
    target_length: int,
    seconds: float | None = None,
    partial: bool = False,
    training: dict[str, str] | None = None,
) -> dict:
    """The summary dict of an extension whose evaluated models' folders are ``before`` and ``after`` (``partial``:
    a folder without results gives null); ``training``: {name: metrics path} of the runs (:func:`training_summary`)."""
    read = stage_or_none if partial else stage
    summary = {
        "base_length": base_length,
        "target_length": target_length,
        "before": read(before, base_length)[0],
        "after": read(after, base_length)[0],
        "seconds": seconds,
    }
    if training:
        summary["training"] = {name: training_summary(path) for name, path in training.items()}
    return summary


def one_line(summary: dict) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"

    empty = {"needle_within": None, "needle_beyond": None, "ppl": {}}
    b, a, n = summary["before"] or empty, summary["after"] or empty, summary["target_length"]
    ppl_b, ppl_a = b["ppl"].get(n), a["ppl"].get(n)
    ppl = f"; perplexity at {n}: {ppl_b:.1f} -> {ppl_a:.1f}" if ppl_b is not None and ppl_a is not None else ""
    return (
        f"needle retrieval beyond the base length {summary['base_length']}: {fmt(b['needle_beyond'])} -> "
        f"{fmt(a['needle_beyond'])} (within: {fmt(b['needle_within'])} -> {fmt(a['needle_within'])}){ppl}"
    )


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--before", required=True, help="folder of the base model's evals (needle/results.csv, ppl.csv)")
    p.add_argument("--after", required=True, help="folder of the extended model's evals")
    p.add_argument("--base-length", type=int, required=True, help="the length the base model was trained at")
    p.add_argument("--target-length", type=int, required=True, help="the length it was extended to")
    p.add_argument("--seconds", type=float, default=None, help="wall time of the whole run, recorded as is")
    p.add_argument("--output", required=True, help="folder for summary.json and extension.png")
    p.add_argument("--train-metrics", action="append", default=[], metavar="NAME=PATH",
                   help="a training run's speed into the summary: PATH is its train.py output dir or metrics.jsonl "
                        "(repeatable)")  # fmt: skip
    p.add_argument("--partial", action="store_true",
                   help="a stage whose result files are missing is recorded as null (drawn as 'no results') "
                        "instead of an error: the summary of a time-limited run that did not finish")  # fmt: skip
    args = p.parse_args(argv)
    training = {}
    for item in args.train_metrics:
        name, sep, path = item.partition("=")
        if not (sep and name and path):
            p.error(f"--train-metrics {item!r}: expected NAME=PATH (e.g. base=out/demo/base)")
        training[name] = path
    args.train_metrics = training
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from easy_context.eval.plots import extension_figure

    read = stage_or_none if args.partial else stage
    try:
        summary = summarize(args.before, args.after, args.base_length, args.target_length, args.seconds,
                            args.partial, args.train_metrics)  # fmt: skip
        _, before_rows, ppl_before = read(args.before, args.base_length)
        _, after_rows, ppl_after = read(args.after, args.base_length)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(summary, os.path.join(args.output, "summary.json"))
    series = {"before (base model)": sorted(ppl_before.items()), "after extension": sorted(ppl_after.items())}
    png = extension_figure(before_rows, after_rows, {k: v for k, v in series.items() if v}, args.base_length,
                           os.path.join(args.output, "extension.png"))  # fmt: skip
    print(one_line(summary))
    for name, run in summary.get("training", {}).items():
        mfu = f", MFU {run['mfu']:.1%}" if "mfu" in run else ""
        print(f"training {name}: {run['steps']} steps, {run['tokens']:,} tokens, {run['tokens_per_s']:,.0f} tokens/s "
              f"(median), {run['train_seconds']:.0f} s, peak {run['peak_mem_gib']:.1f} GiB{mfu}")  # fmt: skip
    print(f"summary: {os.path.join(args.output, 'summary.json')}   figure: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
