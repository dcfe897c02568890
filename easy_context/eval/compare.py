"""Side by side: several evaluated models (a base, training-free baselines, an extended model) on the same prompts.

    python -m easy_context.eval.compare --model base=out/eval/base --model yarn=out/eval/yarn \\
        --model extended=out/eval/extended --base-length 8192 --target-length 65536 --train-metrics out/extended \\
        --output out/results

``--train-metrics`` once per training stage of a progressive extension (in the order trained, the extended model's
last): the summary's ``training`` is the last stage's, ``training_stages`` each stage's, and the loss curve runs
through all of them.

Each ``--model NAME=DIR`` folder may hold ``needle/results.csv`` (eval_needle.py), ``needle3/results.csv`` (the same
with distractors), ``ppl.csv`` (eval_ppl.py by length), ``ppl_short.csv`` (eval_ppl.py over short windows) and
``prompts.json`` (:mod:`easy_context.eval.fixed_prompts`), ``ruler/results.json`` (eval_ruler.py: the separating
tasks) and ``long_<SCALING>/results.csv`` (the needle beyond the trained length, untrained there: ``long_none`` as
is, ``long_yarn_2_65536`` with ``--rope_scaling yarn:2:65536``); what is missing is reported as null. Writes
``summary.json`` (per model: needle accuracy per length, within / beyond the base length, per depth beyond it, the
worst cell; perplexities; prompts; RULER scores per task and length; and ``training_free_baselines`` and
``gain_over_best_baseline``: each extended model's gain over the best training-free baseline per task and length,
:mod:`easy_context.eval.gain`), ``summary.md`` (its first line: which baselines the gains are over, or that none ran;
then the gain table and the tables of every model) and ``comparison.png`` (needle heatmaps of the first and last
model, needle accuracy vs length of every model, perplexity vs length, the training loss, the RULER tasks' mean vs
length of every model, the gain per task vs length). ``--caveat TEXT``: what the numbers are not (a CPU miniature's
random weights), the title of summary.md and ``caveat`` in summary.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict

from easy_context import cli
from easy_context.eval.extension import training_summary
from easy_context.eval.gain import SHORTER_ROUTE, gains, headline, is_trained, training_free
from easy_context.eval.results import read_csv, write_json


def needle_summary(rows: list[dict], base_length: int) -> dict:
    """Accuracy per length, within / beyond ``base_length``, per depth beyond it, and the worst (depth, length) cell."""
    by_length: dict[int, list[float]] = defaultdict(list)
    cells: dict[tuple[float, int], list[float]] = defaultdict(list)
    for r in rows:
        by_length[int(r["length"])].append(float(r["correct"]))
        cells[(float(r["depth"]), int(r["length"]))].append(float(r["correct"]))
    beyond_depth: dict[float, list[float]] = defaultdict(list)
    for (depth, length), values in cells.items():
        if length > base_length:
            beyond_depth[depth] += values

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    worst = min(cells.items(), key=lambda kv: statistics.fmean(kv[1])) if cells else None
    return {
        "by_length": {n: mean(v) for n, v in sorted(by_length.items())},
        "within": mean([x for n, v in by_length.items() if n <= base_length for x in v]),
        "beyond": mean([x for n, v in by_length.items() if n > base_length for x in v]),
        "beyond_by_depth": {d: mean(v) for d, v in sorted(beyond_depth.items())},
        "worst_cell": None
        if worst is None
        else {"depth": worst[0][0], "length": worst[0][1], "accuracy": mean(worst[1])},  # fmt: skip
        "prompts": len(rows),
    }


def _read(path: str, numeric: tuple[str, ...]) -> list[dict] | None:
    return read_csv(path, numeric=numeric) if os.path.isfile(path) else None


def model_summary(folder: str, base_length: int) -> tuple[dict, list[dict]]:
    """(the summary of one model's folder, its needle rows)."""
    needle = _read(os.path.join(folder, "needle", "results.csv"), ("length", "depth", "correct")) or []
    needle3 = _read(os.path.join(folder, "needle3", "results.csv"), ("length", "depth", "correct"))
    ppl = _read(os.path.join(folder, "ppl.csv"), ("tokens", "ppl"))
    short = _read(os.path.join(folder, "ppl_short.csv"), ("tokens", "ppl", "scored_tokens"))
    prompts = os.path.join(folder, "prompts.json")
    ruler = os.path.join(folder, "ruler", "results.json")
    long = {}
    for entry in sorted(e for e in os.listdir(folder) if e.startswith("long_")):
        rows = _read(os.path.join(folder, entry, "results.csv"), ("length", "depth", "correct"))
        if rows:
            long[scaling_label(entry)] = needle_summary(rows, base_length)
    out = {
        "needle": needle_summary(needle, base_length) if needle else None,
        "needle_3_distractors": needle_summary(needle3, base_length) if needle3 else None,
        "ppl": {int(r["tokens"]): round(float(r["ppl"]), 3) for r in ppl} if ppl else None,
        "ppl_short": {int(r["tokens"]): round(float(r["ppl"]), 3) for r in short} if short else None,
        "prompts": json.load(open(prompts, encoding="utf-8")) if os.path.isfile(prompts) else None,
        "needle_long": long or None,
        "ruler": ruler_scores(ruler) if os.path.isfile(ruler) else None,
    }
    return out, needle


def ruler_scores(path: str) -> dict:
    """The scores per task and length (and the prompts a cell) of one eval_ruler.py results.json."""
    with open(path, encoding="utf-8") as f:
        ruler = json.load(f)
    return {key: {task: {int(n): v for n, v in row.items()} for task, row in (ruler.get(key) or {}).items()}
            for key in ("scores", "samples")}  # fmt: skip


def scaling_label(folder: str) -> str:
    """``long_none`` -> "as trained"; ``long_yarn_2_65536`` -> "yarn:2:65536" (the eval's --rope_scaling)."""
    scaling = folder.removeprefix("long_").replace("_", ":")
    return "as trained" if scaling == "none" else scaling


def _k(tokens: int) -> str:
    """8192 -> "8K"; lengths that are not a multiple of 1024 stay as they are."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _fmt(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _signed(value) -> str:
    return "—" if value is None else f"{value:+.2f}"


def gain_markdown(rows: list[dict], baselines: int, title: str = "Gain over the best training-free baseline (the "
                  "same prompts; best = the highest baseline score in the cell):",
                  column: str = "best training-free baseline") -> list[str]:  # fmt: skip
    """The gain table: per extended model, task and length, its score, the best compared model's (with how many of
    the ``baselines`` scored the cell, where not all did), the gain."""
    if not rows:
        return []
    lines = [title, "", f"| task | length | model | score | {column} | its score | gain |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        ran = f" ({r['baselines_scored']} of {baselines} ran)" if r["baselines_scored"] < baselines else ""
        best = f"{r['best_baseline'] or '—'}{ran} | {_fmt(r['best_baseline_score'])}"
        lines.append(f"| {r['task']} | {_k(r['length'])} | {r['model']} | {_fmt(r['score'])} | {best} | "
                     f"{_signed(r['gain'])} |")  # fmt: skip
    return [*lines, ""]


def ruler_markdown(models: dict) -> list[str]:
    """The RULER tasks of every model: one row per task and model, a column per length."""
    runs = {name: m["ruler"] for name, m in models.items() if m.get("ruler")}
    if not runs:
        return []
    lengths = sorted({n for r in runs.values() for row in r["scores"].values() for n in row})
    tasks = list(dict.fromkeys(t for r in runs.values() for t in r["scores"]))
    prompts = sorted({c for r in runs.values() for row in r["samples"].values() for c in row.values()})
    cell = f", {'/'.join(map(str, prompts))} prompt{'s' if prompts != [1] else ''} a cell" if prompts else ""
    lines = [
        "",
        f"RULER tasks (answers generated{cell}):",
        "",
        "| task | model | " + " | ".join(map(_k, lengths)) + " |",
        "| --- | --- |" + " --- |" * len(lengths),
    ]
    for task in tasks:
        for name, r in runs.items():
            if task in r["scores"]:
                row = r["scores"][task]
                lines.append(f"| {task} | {name} | " + " | ".join(_fmt(row.get(n)) for n in lengths) + " |")
    return lines


def markdown(summary: dict, base_length: int) -> str:
    """The tables of ``summary`` as markdown: the first line (which baselines), the gain over the best of them, needle
    by length, perplexity, distractors, RULER tasks, prompts."""
    models = summary["models"]
    lengths = sorted({n for m in models.values() if m["needle"] for n in m["needle"]["by_length"]})
    kinds = ", ".join(f"{name} ({_kind(name)})" for name in models)
    caveat = [f"# {summary['caveat']}", ""] if summary.get("caveat") else []
    lines = [
        *caveat,
        headline(models),
        "",
        f"Models: {kinds}.",
        "",
        *gain_markdown(summary["gain_over_best_baseline"], len(training_free(models))),
        *gain_markdown(
            summary.get("gain_over_shorter_route") or [],
            1,
            f"Gain over the shorter route ({SHORTER_ROUTE}: the last stage before the target, trained "
            "shorter, with YaRN over the rest at inference; the same prompts):",
            "shorter route",
        ),
    ]
    lines += ["| model | " + " / ".join(map(_k, lengths)) + f" | mean > {_k(base_length)} |"
             + " worst cell | ppl short | ppl " + " / ".join(map(_k, _ppl_lengths(models))) + " |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, m in models.items():
        nd = m["needle"] or {}
        by = nd.get("by_length", {})
        worst = nd.get("worst_cell")
        worst_s = f"{worst['accuracy']:.2f} at {_k(worst['length'])}/{worst['depth']:g}%" if worst else "—"
        short = next(iter((m["ppl_short"] or {}).values()), None)
        ppl = " / ".join(_fmt((m["ppl"] or {}).get(n), 1) for n in _ppl_lengths(models))
        lines.append(f"| {name} | " + " / ".join(_fmt(by.get(n)) for n in lengths)
                     + f" | {_fmt(nd.get('beyond'))} | {worst_s} | {_fmt(short, 2)} | {ppl} |")  # fmt: skip
    three = {k: m["needle_3_distractors"] for k, m in models.items() if m["needle_3_distractors"]}
    if three:
        lines += ["", "Needle with 3 distractors:", "", "| model | " + " / ".join(map(_k, lengths))
                  + " | mean |", "| --- | --- | --- |"]  # fmt: skip
        for name, nd in three.items():
            mean = statistics.fmean(v for v in nd["by_length"].values() if v is not None)
            lines.append(f"| {name} | " + " / ".join(_fmt(nd["by_length"].get(n)) for n in lengths)
                         + f" | {mean:.2f} |")  # fmt: skip
    lines += ruler_markdown(models)
    beyond = [(name, label, nd) for name, m in models.items() for label, nd in (m.get("needle_long") or {}).items()]
    if beyond:
        far = sorted({n for _, _, nd in beyond for n in nd["by_length"]})
        lines += ["", "Needle beyond the trained length (no training there; RoPE scaling at inference only):", "",
                  "| model | RoPE at inference | " + " / ".join(map(_k, far)) + " | mean | worst cell |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for name, label, nd in beyond:
            w = nd["worst_cell"]
            mean = statistics.fmean(v for v in nd["by_length"].values() if v is not None)
            lines.append(f"| {name} | {label} | " + " / ".join(_fmt(nd["by_length"].get(n)) for n in far)
                         + f" | {mean:.2f} | {w['accuracy']:.2f} at {_k(w['length'])}/{w['depth']:g}% |")  # fmt: skip
    prompts = {k: m["prompts"] for k, m in models.items() if m["prompts"]}
    if prompts:
        lines += ["", "Fixed prompts (greedy):", "", "| prompt | " + " | ".join(prompts) + " |",
                  "| --- |" + " --- |" * len(prompts)]  # fmt: skip
        first = next(iter(prompts.values()))
        for i, item in enumerate(first):
            cells = [p[i]["output"].replace("\n", "\\n").replace("|", "\\|")[:80] for p in prompts.values()]
            lines.append(f"| {item['prompt'][:40].replace(chr(10), ' ')} | " + " | ".join(cells) + " |")
    stages = summary.get("training_stages") or ({"": summary["training"]} if summary.get("training") else {})
    for stage, t in stages.items():
        lines += ["", f"Training{f' ({stage})' if stage else ''}: {t['steps']} steps, {t['tokens']:,} tokens, "
                  f"{t['train_seconds']:.0f} s, {t['tokens_per_s']:,.0f} tok/s, final loss {t['loss']}, "
                  f"peak {t['peak_mem_gib']} GiB" + (f", MFU {t['mfu']:.1%}" if "mfu" in t else "")]  # fmt: skip
    return "\n".join(lines) + "\n"


def _kind(name: str) -> str:
    if is_trained(name):
        return "trained"
    return "trained shorter, YaRN to the target" if name == SHORTER_ROUTE else "training-free"


def _ppl_lengths(models: dict) -> list[int]:
    return sorted({n for m in models.values() if m["ppl"] for n in m["ppl"]})


def figure(models: dict, needles: dict[str, list[dict]], loss: list[tuple[int, float]], base_length: int,
           path: str, after: str | None = None, stage_starts: list[int] | None = None,
           gain_rows: list[dict] | None = None) -> str:  # fmt: skip
    """Heatmaps of the first model with needle rows and of ``after`` (default: the last), needle accuracy vs length
    of all, perplexity vs length of all, the training loss (each logged step and a running mean of 5; a dotted line
    where each stage after the first starts, ``stage_starts``), the RULER tasks' mean vs length of all, the gain over
    the best training-free baseline per task vs length (``gain_rows``: :func:`easy_context.eval.gain.gains`);
    returns ``path``."""
    from easy_context.eval import plots

    plt = plots.plt
    fig, axes = plt.subplots(3, 3, figsize=(20, 15))
    with_rows = [k for k in models if needles.get(k)]
    shown = [with_rows[0], after if after in with_rows else with_rows[-1]] if with_rows else []
    for ax, name in zip(axes[0][:2], shown):
        mean = plots._heatmap(fig, ax, needles[name], mark_length=base_length)
        ax.set_title(f"{name}: needle retrieval (mean {mean:.2f})")
    ax = axes[0][2]
    for name in with_rows:
        by = models[name]["needle"]["by_length"]
        line = ax.plot(list(by), list(by.values()), marker="o", label=name)[0]
        for label, nd in (models[name].get("needle_long") or {}).items():  # beyond the trained length: dashed
            far = {**by, **nd["by_length"]}
            ax.plot(list(far), list(far.values()), marker=".", linestyle="--" if label == "as trained" else ":",
                    color=line.get_color(), label=f"{name}, beyond: {label}")  # fmt: skip
    ax.axvline(base_length, color="black", linestyle="--", linewidth=1)
    ax.set(xlabel="Context length (tokens)", ylabel="needle accuracy", ylim=(-0.03, 1.03),
           title="Needle accuracy vs length (all depths)")  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend()
    series = {k: sorted(m["ppl"].items()) for k, m in models.items() if m["ppl"]}
    if series:
        plots._ppl_axes(axes[1][0], series, log_y=True)
        axes[1][0].axvline(base_length, color="black", linestyle="--", linewidth=1)
        axes[1][0].set_title("Perplexity vs context length (essays, first window)")
        axes[1][0].legend()
    three = {k: m["needle_3_distractors"]["by_length"] for k, m in models.items() if m["needle_3_distractors"]}
    ax = axes[1][1]
    for name, by in three.items():
        ax.plot(list(by), list(by.values()), marker="o", label=name)
    ax.set(xlabel="Context length (tokens)", ylabel="accuracy", ylim=(-0.03, 1.03),
           title="Needle with 3 distractors")  # fmt: skip
    ax.grid(True, alpha=0.3)
    if three:
        ax.legend()
    ax = axes[1][2]
    if loss:
        steps, values = [s for s, _ in loss], [v for _, v in loss]
        ax.plot(steps, values, alpha=0.35, label="logged step")
        ax.plot(steps, [sum(values[max(0, i - 4) : i + 1]) / len(values[max(0, i - 4) : i + 1])
                        for i in range(len(values))], label="running mean of 5")  # fmt: skip
        for start in stage_starts or []:
            ax.axvline(start, color="black", linestyle=":", linewidth=1)
        ax.legend()
    ax.set(xlabel="step (all stages)" if stage_starts else "step", ylabel="training loss (token mean)",
           title="Extension: training loss")  # fmt: skip
    ax.grid(True, alpha=0.3)
    _ruler_axes(axes[2][0], models)
    _gain_axes(axes[2][1], gain_rows or [])
    axes[2][2].axis("off")
    fig.tight_layout()
    return plots._save(fig, path)


def _ruler_axes(ax, models: dict) -> None:
    """The mean over the RULER tasks per length of every model (training-free ones dashed)."""
    for name, m in models.items():
        scores = (m.get("ruler") or {}).get("scores")
        if scores:
            lengths = sorted({n for row in scores.values() for n in row})
            mean = [statistics.fmean(row[n] for row in scores.values() if n in row) for n in lengths]
            ax.plot(lengths, mean, marker="o", linestyle="-" if is_trained(name) else "--", label=name)
    ax.set(xlabel="Context length (tokens)", ylabel="mean score", ylim=(-0.03, 1.03),
           title="RULER tasks (mean over the tasks run)")  # fmt: skip
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend()


def _gain_axes(ax, rows: list[dict]) -> None:
    """Each extended model's gain over the best training-free baseline per task vs length (cells without one left
    out)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r["gain"] is not None:
            series[r["task"] if r["model"] == "extended" else f"{r['model']}: {r['task']}"].append(
                (r["length"], r["gain"])
            )
    for label, points in series.items():
        ax.plot([n for n, _ in points], [g for _, g in points], marker="o", label=label)
    ax.axhline(0, color="black", linewidth=1)
    ax.set(xlabel="Context length (tokens)", ylabel="score - best training-free baseline", ylim=(-1.03, 1.03),
           title="Gain of training over the best training-free baseline")  # fmt: skip
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="python -m easy_context.eval.compare", description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR", help="an evaluated model's folder")
    p.add_argument("--base-length", type=int, required=True, help="the length the base model was trained at")
    p.add_argument("--target-length", type=int, required=True, help="the extension's length")
    p.add_argument("--train-metrics", action="append", default=None, metavar="DIR",
                   help="the extension's train.py output dir (metrics.jsonl); once per stage, in order")  # fmt: skip
    p.add_argument("--output", required=True, help="folder for summary.json, summary.md, comparison.png")
    p.add_argument("--after", default=None, metavar="NAME", help="the model of the second heatmap (default: the last)")
    p.add_argument("--caveat", default=None, metavar="TEXT", help="what the numbers are not: summary.md's title")
    args = p.parse_args(argv)
    models, needles = {}, {}
    for item in args.model:
        name, sep, folder = item.partition("=")
        if not sep or not os.path.isdir(folder):
            p.error(f"--model {item}: expected NAME=DIR with an existing folder")
        models[name], needles[name] = model_summary(folder, args.base_length)
    summary = {
        **({"caveat": args.caveat} if args.caveat else {}),
        "base_length": args.base_length,
        "target_length": args.target_length,
        "models": models,
        "training_free_baselines": training_free(models),
        "gain_over_best_baseline": gains(models),
    }
    if SHORTER_ROUTE in models:
        summary["gain_over_shorter_route"] = gains(models, against=[SHORTER_ROUTE])
    loss: list[tuple[int, float]] = []
    stages, starts, offset = {}, [], 0
    for folder in args.train_metrics or []:
        metrics = os.path.join(folder, "metrics.jsonl")
        if not os.path.isfile(metrics):
            continue
        stages[os.path.basename(os.path.normpath(folder))] = training_summary(metrics)
        if loss:
            starts.append(offset)
        with open(metrics, encoding="utf-8") as f:
            rows = [(r["step"], r["loss"]) for r in map(json.loads, filter(str.strip, f))]
        loss += [(offset + step, value) for step, value in rows]
        offset += rows[-1][0] if rows else 0
    if stages:
        summary["training"] = list(stages.values())[-1]
    if len(stages) > 1:
        summary["training_stages"] = stages
    os.makedirs(args.output, exist_ok=True)
    write_json(summary, os.path.join(args.output, "summary.json"))
    with open(os.path.join(args.output, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown(summary, args.base_length))
    if args.after is not None and args.after not in models:
        p.error(f"--after {args.after}: not one of the --model names ({', '.join(models)})")
    figure(models, needles, loss, args.base_length, os.path.join(args.output, "comparison.png"), after=args.after,
           stage_starts=starts, gain_rows=summary["gain_over_best_baseline"])  # fmt: skip
    print(f"wrote {args.output}/summary.json, summary.md, comparison.png ({len(models)} models)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
