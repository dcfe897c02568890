"""RULER's synthetic long-context tasks (retrieval, multi-hop tracing, aggregation) under any sequence-parallel backend.

    python eval_ruler.py --model out/demo/extended --lengths 512,1024 --num_samples 2        # one process
    python eval_ruler.py --model M --lengths 4096,8192,16384,32768,65536 --kernel fa4      # one GPU
    accelerate launch --config_file accelerate_configs/single_node.yaml eval_ruler.py --model M \\
        --lengths 131072 --parallel_mode zigzag_ring_attn                                  # the prefill over 8 GPUs
    python eval_ruler.py --tokenizer M --prompts_only prompts.jsonl --lengths 4096        # the prompts, no model

Every prompt is generated locally as NVIDIA's RULER generator defines it (easy_context/tasks/ruler/builders.py; no
downloads) with the model's tokenizer, so that prompt + the task's tokens_to_generate fit the length, in the model's
template (``--template``: the chat template for a tokenizer that has one, else RULER's "base": the prompt then the
answer prefix). The answer is generated greedily after an SP prefill, with a KV cache that stays sharded over the
ranks, and scored as RULER does (the share of the expected strings in the output). Generation stops at EOS, at the
task's token budget, or once every expected string is in the output (the score cannot change after that).
``--scoring teacher_forced`` scores each expected string by teacher-forced exact match instead. Writes results.csv,
results.json (scores per task x length with their 95 % intervals, the average over 11 of RULER's 13 tasks, the
effective length), summary.md and ruler.png into --output-dir. Installed: easy-context-eval-ruler (or python -m
easy_context.eval.run_ruler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from tqdm import tqdm

from easy_context import cli
from easy_context.core.registry import option_values
from easy_context.eval.forward import can_batch_generate, greedy_generate, greedy_generate_batch, logits_at
from easy_context.eval.plots import ruler_figure
from easy_context.eval.results import write_csv, write_json
from easy_context.eval.ruler import DEFAULT_TASKS, TASKS, make_case
from easy_context.eval.ruler.scoring import (
    RULER_THRESHOLD,
    RULER_THRESHOLD_SOURCE,
    all_found,
    average_intervals,
    averages,
    counts,
    effective_length,
    native_score,
    samples_for,
    string_match_all,
    table,
    wilson,
)
from easy_context.eval.runtime import add_runtime_args, init_runtime, load_eval_model_from_args, position_warning
from easy_context.eval.scoring import answer_split
from easy_context.eval.tokens import unlimited
from easy_context.models import PRESETS, missing_local_path
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.tokenizer import encode, load_tokenizer, start_ids
from easy_context.tasks.haystack import read_haystack_text
from easy_context.tasks.ruler.builders import RULER_TASK_COUNT, SIZINGS, unit_name
from easy_context.tasks.ruler.vocab import english_words, key_pairs
from easy_context.training.process_exit import run_program

DEFAULT_SAMPLES = 100  # a cell's 95 % interval is then at most +-0.1 (Wilson; 93 would do, RULER uses 500)


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not values or values[0] < 64:
        raise argparse.ArgumentTypeError(f"lengths must be >= 64 tokens, got {text!r}")
    return values


def _score(text: str) -> float:
    """argparse type: a score threshold in [0, 1] (RULER's 85.6 % is 0.856)."""
    rule = "a score in [0, 1] (RULER's 85.6 % is 0.856)"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}") from None
    if not 0 <= value <= 1:  # NaN fails it too
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


def average_label(tasks: list[str]) -> str:
    """How the average is named wherever it is shown: RULER's average is over 13 tasks, ours over those evaluated."""
    return f"average of {len(tasks)} of RULER's {RULER_TASK_COUNT} tasks"


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None,
                   help=MODEL_HELP + " (not needed with --prompts_only)")  # fmt: skip
    p.add_argument("--lengths", type=_int_list, default=_int_list("4096,8192,16384,32768"),
                   help="comma-separated lengths in tokens: prompt + tokens_to_generate <= length "
                        "(default 4096,8192,16384,32768)")  # fmt: skip
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help=f"comma-separated, or 'all' (default: RULER's {len(DEFAULT_TASKS)} offline tasks); known: "
                        f"{', '.join(TASKS)}")  # fmt: skip
    p.add_argument("--num_samples", type=cli.positive_int, default=DEFAULT_SAMPLES,
                   help=f"prompts per task and length ({samples_for(0.1)}+: a cell's 95 %% interval within +-0.1; "
                        "RULER: 500)")  # fmt: skip
    p.add_argument("--haystack_dir", default="PaulGrahamEssays", help=".txt files: the essay haystack")
    p.add_argument("--template", choices=["auto", "base", "chat"], default="auto",
                   help="the prompt format: chat (the tokenizer's chat template, for instruct models), base (RULER's "
                        "for base models: the prompt then the answer prefix); auto: chat when the tokenizer has a "
                        "chat template")  # fmt: skip
    p.add_argument("--chat", action="store_true", help="same as --template chat")
    p.add_argument("--sizing", choices=list(SIZINGS), default="ruler",
                   help="ruler (default): the haystack sized as RULER's generator sizes it (one size search per task "
                        "and length, then each prompt stepped back by RULER's step while it is too long: prompt + "
                        "generation ~0.75-1.0 of the length, by the luck of its draws); fill: each prompt's largest "
                        "haystack that fits (~1.0)")  # fmt: skip
    p.add_argument("--prompts_only", default=None, metavar="OUT.jsonl",
                   help="write every prompt (task, length, token count, tokens_to_generate, answers) and stop: no "
                        "model is loaded; needs --tokenizer (or --model)")  # fmt: skip
    p.add_argument("--batch_size", type=cli.positive_int, default=1,
                   help="prompts of one length decoded together (data parallel with the model's own attention, "
                        "--kernel auto): each prefilled alone, then one forward a step for all; memory grows with "
                        "it")  # fmt: skip
    p.add_argument("--scoring", choices=["generate", "teacher_forced"], default="generate",
                   help="generate (RULER's): greedy output contains the answers; teacher_forced: each answer's "
                        "tokens are the argmax after the answer prefix")  # fmt: skip
    p.add_argument("--max_new_tokens", type=cli.positive_int, default=None,
                   help="cap every task's generation budget (RULER's: 128 NIAH, 30 VT, 120 CWE, 50 FWE; a lower cap "
                        "is recorded in results.json; the prompts still leave RULER's budget free)")  # fmt: skip
    p.add_argument(
        "--threshold",
        type=_score,
        default=None,
        help=f"the effective length's threshold on the average (default {RULER_THRESHOLD}: RULER's)",
    )
    p.add_argument(
        "--threshold_from",
        default=None,
        metavar="RESULTS_JSON",
        help="also report the effective length against another run's average at its native length (the base model)",
    )
    p.add_argument(
        "--native_length",
        type=cli.positive_int,
        default=None,
        help="the length the model was trained at (default: its max_position_embeddings); its average there is "
        "what --threshold_from reads from this run",
    )
    p.add_argument("--output-dir", "--output_dir", default=None, help="default out/eval_ruler/<model name>")
    add_runtime_args(p)
    cli.retype(p, rope_theta=cli.positive_float, seed=cli.non_negative_int)
    args = p.parse_args(argv)
    if args.chat:
        if args.template == "base":
            p.error("--chat and --template base contradict each other")
        args.template = "chat"
    if not args.model and not (args.prompts_only and args.tokenizer):
        p.error("--model is required (or --prompts_only OUT.jsonl with --tokenizer)")
    for flag, name in [("--model", args.model), ("--tokenizer", args.tokenizer)]:
        missing = missing_local_path(name or "", flag)
        if missing:
            p.error(missing)
    if args.threshold_from:
        problem = threshold_file_problem(args.threshold_from)
        if problem:
            p.error(f"--threshold_from {args.threshold_from}: {problem}")
    if args.model in PRESETS and not args.tokenizer:
        p.error(f"--model {args.model} (random init) needs --tokenizer")
    args.tasks = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown or not args.tasks:
        p.error(f"unknown task(s) {unknown}; choose from {', '.join(TASKS)} (or 'all')")
    if args.output_dir is None and args.model:
        args.output_dir = os.path.join("out", "eval_ruler", os.path.basename(os.path.normpath(args.model)))
    return args


def prompt_wrapper(tokenizer, template: str):
    """``(wrap, name)``: ``wrap(body, answer_prefix)`` -> the model input text (encoded by :func:`encode`: the
    tokenizer's BOS first when it adds one, once), and the template used (``auto`` resolved: chat when the tokenizer
    has a chat template, else base)."""
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        template = "chat" if has_chat else "base"
    if template == "base":  # RULER's "base" template: the task prompt, the answer prefix right after it
        return (lambda body, prefix: body + prefix), "base"
    if not has_chat:
        raise ValueError("--template chat: this tokenizer has no chat template; use --template base")

    def wrap(body: str, prefix: str) -> str:
        messages = [{"role": "user", "content": body}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + prefix  # RULER puts the answer prefix right after the model's template, as is

    return wrap, "chat"


def score_generated(model, runtime, tokenizer, ids: list[int], case, pad_id: int, budget: int) -> dict:
    new = greedy_generate(model, runtime, ids, budget, pad_id, tokenizer.eos_token_id,
                          stop=lambda tokens: all_found(tokenizer.decode(tokens), case.answers))  # fmt: skip
    output = tokenizer.decode(new, skip_special_tokens=True)
    return {"score": string_match_all(output, case.answers), "output": output, "new_tokens": len(new)}


def score_generated_batch(model, runtime, tokenizer, prompts: list[list[int]], cases, pad_id: int,
                          budgets: dict[str, int]) -> list[dict]:  # fmt: skip
    """:func:`score_generated` of prompts generated together (:func:`greedy_generate_batch`)."""
    stops = [lambda tokens, answers=case.answers: all_found(tokenizer.decode(tokens), answers) for case in cases]
    outputs = greedy_generate_batch(model, runtime, prompts, [budgets[case.task] for case in cases], pad_id,
                                    tokenizer.eos_token_id, stops)  # fmt: skip
    results = []
    for case, new in zip(cases, outputs):
        output = tokenizer.decode(new, skip_special_tokens=True)
        results.append({"score": string_match_all(output, case.answers), "output": output, "new_tokens": len(new)})
    return results


def batches(indices: list[int], lengths: list[int], size: int) -> list[list[int]]:
    """``indices`` in runs of at most ``size`` consecutive ones with one length (``lengths[index]``)."""
    out: list[list[int]] = []
    for index in indices:
        if out and len(out[-1]) < size and lengths[out[-1][0]] == lengths[index]:
            out[-1].append(index)
        else:
            out.append([index])
    return out


def score_teacher_forced(model, runtime, tokenizer, case, pad_id: int) -> dict:
    """Each expected string right after the answer prefix: 1 when every one of its tokens is the argmax."""
    hits = []
    for answer in case.answers:
        ids, start = answer_split(tokenizer, case.text, " " + answer)
        logits = logits_at(model, runtime, ids[:-1], list(range(start - 1, len(ids) - 1)), pad_id)
        hits.append(bool((logits.argmax(-1).cpu() == torch.tensor(ids[start:])).all()))
    return {"score": sum(hits) / len(hits), "output": "", "new_tokens": 0}


def threshold_file_problem(path: str) -> str | None:
    """Why ``path`` cannot give a threshold (None when it can): it must be a results.json of eval_ruler.py whose run
    scored a length at or below its native one."""
    if not os.path.isfile(path):
        return "no such file (a results.json written by eval_ruler.py)"
    try:
        with open(path, encoding="utf-8") as f:
            other = json.load(f)
    except (OSError, ValueError) as e:
        return f"not a results.json of eval_ruler.py ({e})"
    if not isinstance(other, dict) or not isinstance(other.get("native_score"), (int, float)):
        native = other.get("native_length") if isinstance(other, dict) else None
        return (f"holds no score at a native length (that run evaluated no length <= {native}): evaluate that model "
                "at its native length too, or pass --threshold")  # fmt: skip
    return None


def thresholds(args, average: dict[int, float]) -> dict:
    """The effective length at RULER's threshold (or --threshold), and against the base's when --threshold_from."""
    threshold = RULER_THRESHOLD if args.threshold is None else args.threshold
    out = {
        "threshold": threshold,
        "threshold_source": RULER_THRESHOLD_SOURCE if args.threshold is None else "--threshold",
        "effective_length": effective_length(average, threshold),
    }
    if args.threshold_from:
        with open(args.threshold_from, encoding="utf-8") as f:
            other = json.load(f)
        at = other.get("native_score_length", other.get("native_length"))
        base = float(other["native_score"])
        out |= {"base_threshold": base, "base_threshold_source": f"{args.threshold_from} (its average at {at})",
                "effective_length_vs_base": effective_length(average, base)}  # fmt: skip
    return out


def generation_budgets(tasks, cap: int | None) -> tuple[dict[str, int], str]:
    """Each task's generation budget (RULER's, or ``cap`` where lower) and a note naming the tasks it cut."""
    budgets = {t.name: min(t.max_new_tokens, cap) if cap else t.max_new_tokens for t in tasks}
    cut = [f"{t.name} {budgets[t.name]} < {t.max_new_tokens}" for t in tasks if budgets[t.name] < t.max_new_tokens]
    note = f"--max_new_tokens {cap} generates less than RULER's tokens_to_generate: {', '.join(cut)}" if cut else ""
    return budgets, note


def _cell(value: float, interval) -> str:
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _length_name(n: int | None) -> str:
    return "none" if n is None else str(n)


def summary_markdown(summary: dict) -> str:
    lengths = sorted({n for row in summary["scores"].values() for n in map(int, row)})
    head = "| task | " + " | ".join(str(n) for n in lengths) + " |"
    lines = [f"# RULER: {summary['model']}", "", head, "|" + " --- |" * (len(lengths) + 1)]
    intervals = summary.get("intervals", {})
    for task, row in summary["scores"].items():
        cells = []
        for n in lengths:
            value = row.get(str(n))
            bounds = intervals.get(task, {}).get(str(n))
            cells.append("-" if value is None else _cell(value, bounds) if bounds else f"{value:.2f}")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    avg, avg_int = summary["average"], summary.get("average_interval", {})
    label = summary.get("average_label", "average")
    lines.append(f"| **{label}** | " + " | ".join(
        f"**{_cell(avg[str(n)], avg_int[str(n)]) if str(n) in avg_int else format(avg[str(n)], '.2f')}**"
        if str(n) in avg else "-" for n in lengths) + " |")  # fmt: skip
    samples = sorted({m for row in summary.get("samples", {}).values() for m in row.values()})
    lines += ["", f"95 % intervals in brackets (Wilson; {'/'.join(map(str, samples))} prompts a cell). QA (SQuAD, "
              f"HotpotQA) is not evaluated: the average is not RULER's 13-task average.", "",
              f"Effective length: **{_length_name(summary['effective_length'])}** (the longest length whose average "
              f"is >= {summary['threshold']}; threshold {summary['threshold_source']})."]  # fmt: skip
    if "base_threshold" in summary:
        lines.append(f"Against the base: **{_length_name(summary['effective_length_vs_base'])}** (threshold "
                     f"{summary['base_threshold']:.3f}, {summary['base_threshold_source']}).")  # fmt: skip
    if summary.get("generation_note"):
        lines.append(f"Not RULER's generation budget: {summary['generation_note']}.")
    sizing = {"ruler": "RULER's size search", "fill": "filled to the length"}.get(summary.get("sizing"), "?")
    lines.append(f"Template {summary.get('template', '?')}; prompts sized by {sizing}; native length "
                 f"{summary['native_length']}; "
                 f"{summary['prompts']} prompts, {summary['seconds']} s, {summary['parallel_mode']} on "
                 f"{summary['processes']} process(es), scoring {summary['scoring']}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_prompts(args, tasks, tokenizer, essay_words) -> int:
    """--prompts_only: every prompt as one JSON line; no model. Returns the number written."""
    wrap, template = prompt_wrapper(tokenizer, args.template)
    start = start_ids(tokenizer)
    written = 0

    def count(text: str) -> int:  # one function for every prompt: the size search runs once per task and length
        return len(encode(tokenizer, text, start))

    os.makedirs(os.path.dirname(os.path.abspath(args.prompts_only)), exist_ok=True)
    with open(args.prompts_only, "w", encoding="utf-8") as f:
        for length in args.lengths:
            for task in tasks:
                for sample in range(args.num_samples):
                    case = make_case(task, length, sample, count, wrap, essay_words, args.seed, args.sizing)
                    ids = encode(tokenizer, case.text, start)
                    f.write(json.dumps({"task": task.name, "length": length, "sample": sample, "template": template,
                                        "sizing": case.sizing, "tokens": len(ids),
                                        "tokens_to_generate": case.max_new_tokens,
                                        "answers": case.answers, "units": case.units, "unit": unit_name(task),
                                        "deviation": case.deviation, "start_ids": ids[: len(start)], "text": case.text},
                                       ensure_ascii=False) + "\n")  # fmt: skip
                    written += 1
    return written


def main(argv=None) -> None:
    args = parse_args(argv)
    tasks = [TASKS[name] for name in args.tasks]
    try:
        essay_words = read_haystack_text(args.haystack_dir).split() if any(t.needs_essays for t in tasks) else None
        if any(t.needs_word_lists for t in tasks):  # before any model loads: the one-line install hint
            english_words()
            key_pairs()
        if args.prompts_only:
            tokenizer = unlimited(load_tokenizer(args.tokenizer or args.model))
            written = write_prompts(args, tasks, tokenizer, essay_words)
            print(f"wrote {written} prompts to {args.prompts_only}")
            return
        runtime = init_runtime(args.parallel_mode, args.kernel, **option_values(args))
        tokenizer = unlimited(load_tokenizer(args.tokenizer or args.model))
        wrap, template = prompt_wrapper(tokenizer, args.template)
        start = start_ids(tokenizer)
        model = load_eval_model_from_args(args.model, runtime, len(tokenizer), args, max_length=max(args.lengths))
    except (OSError, RuntimeError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    native = args.native_length or getattr(model.config, "max_position_embeddings", None) or max(args.lengths)
    budgets, budget_note = generation_budgets(tasks, args.max_new_tokens)
    runtime.print(
        f"eval_ruler: {args.model} | {runtime.seq_algo} on {runtime.world_size} process(es) | {len(tasks)} tasks x "
        f"{len(args.lengths)} lengths x {args.num_samples} samples | template {template} | scoring {args.scoring}"
    )
    if budget_note:
        runtime.print(f"eval_ruler: {budget_note} (scores are not comparable with RULER's)")

    def count(text: str) -> int:
        return len(encode(tokenizer, text, start))

    cells = [(task, n, s) for n in args.lengths for task in tasks for s in range(args.num_samples)]
    mine = runtime.my_share(len(cells))
    warned: set[int] = set()
    rows, began = [], time.time()
    os.makedirs(args.output_dir, exist_ok=True)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    partial = os.path.join(args.output_dir, f"rows.rank{rank}.jsonl")  # each row as it lands (for a cut run)
    open(partial, "w").close()
    batch = args.batch_size if args.scoring == "generate" and can_batch_generate(model, runtime) else 1
    if batch < args.batch_size:
        runtime.print("eval_ruler: --batch_size needs data parallel with the model's own attention (--kernel auto) "
                      "and --scoring generate: one prompt at a time")  # fmt: skip
    progress = tqdm(total=len(mine), desc="ruler prompts", disable=not runtime.is_main, file=sys.stderr)
    for group in batches(mine, [length for _, length, _ in cells], batch):
        t0 = time.time()
        cases, prompts = [], []
        for index in group:
            task, length, sample = cells[index]
            try:
                cases.append(make_case(task, length, sample, count, wrap, essay_words, args.seed, args.sizing))
            except (RuntimeError, ValueError) as exc:
                sys.exit(f"error: {task.name} at {length} tokens: {exc}")
            prompts.append(encode(tokenizer, cases[-1].text, start))
            if length not in warned:
                warned.add(length)
                message = position_warning(model.config, len(prompts[-1]) + cases[-1].max_new_tokens, args.model)
                if message:
                    runtime.print(message)
        with torch.no_grad():
            if args.scoring == "teacher_forced":
                results = [score_teacher_forced(model, runtime, tokenizer, case, pad_id) for case in cases]
            elif batch > 1:
                results = score_generated_batch(model, runtime, tokenizer, prompts, cases, pad_id, budgets)
            else:
                results = [score_generated(model, runtime, tokenizer, ids, case, pad_id, budgets[case.task])
                           for ids, case in zip(prompts, cases)]  # fmt: skip
        seconds = round((time.time() - t0) / len(group), 3)  # a batch's time shared by its prompts
        for case, ids, result in zip(cases, prompts, results):
            rows.append({"task": case.task, "length": case.length, "sample": case.sample, **result,
                         "answers": " | ".join(case.answers), "prompt_tokens": len(ids),
                         "tokens_to_generate": case.max_new_tokens, "units": case.units,
                         "deviation": case.deviation, "seconds": seconds})  # fmt: skip
            with open(partial, "a", encoding="utf-8") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        progress.update(len(group))
    progress.close()
    rows = sorted(runtime.gather_objects(rows), key=lambda r: (r["task"], r["length"], r["sample"]))

    if runtime.is_main:
        scores, samples = table(rows), counts(rows)
        in_average = [t.name for t in tasks if t.in_average]
        average = averages(scores, in_average)
        found = native_score(average, native)
        label = average_label(in_average)
        summary = {
            "model": args.model,
            "parallel_mode": runtime.seq_algo,
            "processes": runtime.world_size,
            "scoring": args.scoring,
            "template": template,
            "sizing": args.sizing,
            "tasks": args.tasks,
            "lengths": args.lengths,
            "scores": {task: {str(n): v for n, v in row.items()} for task, row in scores.items()},
            "samples": {task: {str(n): v for n, v in row.items()} for task, row in samples.items()},
            "intervals": {
                task: {str(n): list(wilson(v, samples[task][n])) for n, v in row.items()}
                for task, row in scores.items()
            },
            "average": {str(n): v for n, v in average.items()},
            "average_interval": {str(n): list(v) for n, v in average_intervals(average, samples, in_average).items()},
            "average_tasks": in_average,
            "average_label": label,
            "native_length": native,
            "native_score_length": found[0] if found else None,
            "native_score": found[1] if found else None,
            **thresholds(args, average),
            "tokens_to_generate": {t.name: t.max_new_tokens for t in tasks},
            "generation_budget": budgets,
            "generation_note": budget_note,
            "prompts": len(rows),
            "seconds": round(time.time() - began, 1),
            "args": vars(args),
            "rows": rows,
        }
        write_csv(rows, os.path.join(args.output_dir, "results.csv"))
        write_json(summary, os.path.join(args.output_dir, "results.json"))
        with open(os.path.join(args.output_dir, "summary.md"), "w", encoding="utf-8") as f:
            f.write(summary_markdown(summary))
        title = f"{os.path.basename(os.path.normpath(args.model))} ({label})"
        png = ruler_figure(scores, average, os.path.join(args.output_dir, "ruler.png"), title=title,
                           threshold=summary["threshold"])  # fmt: skip
        print(summary_markdown(summary), end="")
        print(f"results: {os.path.join(args.output_dir, 'results.csv')}; figure: {png}")
    torch.distributed.barrier()


def run() -> None:
    """The ``easy-context-eval-ruler`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
