"""Plot eval results: perplexity CSVs of eval_ppl.py -> one ppl-vs-length PNG; a needle results.csv -> heatmap.

    python plot.py out/ppl_base.csv out/ppl_long.csv --output out/ppl.png       # every model of every CSV
    python plot.py out/eval_needle/model/results.csv --output out/needle.png      # re-draw a needle heatmap

The kind is read from the columns (a needle CSV has ``depth``); --kind forces it.
Installed: easy-context-plot (or python -m easy_context.eval.run_plot), same flags.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict

from easy_context import cli
from easy_context.eval.plots import needle_heatmap, ppl_plot
from easy_context.eval.results import read_csv


def csv_kind(path: str) -> str:
    """``needle`` for an eval_needle results.csv, ``ppl`` for an eval_ppl CSV."""
    with open(path, newline="", encoding="utf-8") as f:
        columns = next(csv.reader(f), [])
    if {"length", "depth", "correct"} <= set(columns):
        return "needle"
    if {"model", "tokens", "ppl"} <= set(columns):
        return "ppl"
    raise ValueError(
        f"{path}: neither an eval_ppl CSV (model, tokens, ppl) nor a needle results.csv (columns: {columns})"
    )


def ppl_series(paths: list[str], labels: list[str] | None) -> dict[str, list[tuple[int, float]]]:
    """{legend label: [(tokens, ppl)]}: one line per (CSV, model); ``labels`` name the CSVs' lines in order."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    keys = []
    for path in paths:
        for row in read_csv(path, numeric=("tokens", "ppl")):
            key = (path, row["model"])
            if key not in keys:
                keys.append(key)
            series[key].append((row["tokens"], row["ppl"]))
    if labels and len(labels) != len(keys):
        raise ValueError(f"--labels has {len(labels)} names for {len(keys)} lines ({[k[1] for k in keys]})")
    models = [k[1] for k in keys]
    out = {}
    for i, key in enumerate(keys):
        name = os.path.basename(os.path.normpath(key[1])) or key[1]
        if not labels and models.count(key[1]) > 1:
            name = f"{name} ({os.path.basename(key[0])})"
        out[labels[i] if labels else name] = series[key]
    return out


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("csv", nargs="+", help="eval_ppl.py CSV(s), or one eval_needle.py results.csv")
    p.add_argument("--output", "-o", default=None, help="PNG path (default: next to the first CSV)")
    p.add_argument("--kind", choices=["auto", "ppl", "needle"], default="auto", help="auto: from the CSV columns")
    p.add_argument("--labels", nargs="+", default=None, help="legend names, one per plotted line")
    p.add_argument("--title", default=None, help="plot title")
    p.add_argument("--log-y", action="store_true", help="log-scale perplexity axis")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        kinds = {csv_kind(path) if args.kind == "auto" else args.kind for path in args.csv}
        if len(kinds) > 1:
            raise ValueError("mix of needle and perplexity CSVs: plot them separately")
        kind = kinds.pop()
        output = args.output or os.path.splitext(args.csv[0])[0] + ".png"
        if kind == "needle":
            if len(args.csv) > 1:
                raise ValueError("a heatmap shows one needle results.csv at a time")
            rows = read_csv(args.csv[0], numeric=("length", "depth", "correct"))
            png = needle_heatmap(rows, output, title=args.title)
        else:
            png = ppl_plot(ppl_series(args.csv, args.labels), output, title=args.title, log_y=args.log_y)
    except (OSError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    print(f"plot: {png}")


if __name__ == "__main__":
    main()
