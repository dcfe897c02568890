"""The summary of a context extension: needle accuracy within / beyond the base length and perplexity per length,
before and after, from the result files of ``eval_needle.py`` and ``eval_ppl.py``; one figure and one JSON.

    python -m easy_context.eval.extension --before out/demo/before --after out/demo/after \\
        --base-length 256 --target-length 2048 --output out/demo

reads ``{before,after}/needle/results.csv`` and ``{before,after}/ppl.csv``, writes ``summary.json``
(``{"base_length", "target_length", "before": {"needle_within", "needle_beyond", "ppl": {length: ppl},
"answer_logprob_within", "answer_logprob_beyond"}, "after": {...}, "seconds"}``) and ``extension.png``, and
prints one line.
"""

from __future__ import annotations

import os
import sys

from .. import cli
from .results import read_csv, write_json


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


def summarize(before: str, after: str, base_length: int, target_length: int, seconds: float | None = None) -> dict:
    """The summary dict of an extension whose evaluated models' folders are ``before`` and ``after``."""
    return {
        "base_length": base_length,
        "target_length": target_length,
        "before": stage(before, base_length)[0],
        "after": stage(after, base_length)[0],
        "seconds": seconds,
    }


def one_line(summary: dict) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"

    b, a, n = summary["before"], summary["after"], summary["target_length"]
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
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from .plots import extension_figure

    try:
        summary = summarize(args.before, args.after, args.base_length, args.target_length, args.seconds)
        _, before_rows, ppl_before = stage(args.before, args.base_length)
        _, after_rows, ppl_after = stage(args.after, args.base_length)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(summary, os.path.join(args.output, "summary.json"))
    png = extension_figure(before_rows, after_rows, {"before (base model)": sorted(ppl_before.items()),
                           "after extension": sorted(ppl_after.items())}, args.base_length,
                           os.path.join(args.output, "extension.png"))  # fmt: skip
    print(one_line(summary))
    print(f"summary: {os.path.join(args.output, 'summary.json')}   figure: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
