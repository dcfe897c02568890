"""RULER's synthetic long-context tasks (retrieval, multi-hop tracing, aggregation) under any sequence-parallel backend.

    python eval_ruler.py --model out/demo/model --lengths 512,1024 --num_samples 2        # one process
    python eval_ruler.py --model M --lengths 4096,8192,16384,32768,65536 --kernel fa4      # one GPU
    accelerate launch --config_file accelerate_configs/single_node.yaml eval_ruler.py --model M \\
        --lengths 131072 --parallel_mode zigzag_ring_attn                                  # the prefill over 8 GPUs

Every prompt is generated locally from the task definitions (easy_context/eval/ruler/tasks.py; no downloads) to a
target token count with the model's tokenizer. The answer is generated greedily after an SP prefill, with a KV cache
that stays sharded over the ranks, and scored as RULER does (the share of the expected strings in the output).
Generation stops at EOS, at the task's token budget, or once every expected string is in the output (the score
cannot change after that). ``--scoring teacher_forced`` scores each expected string by teacher-forced exact match
instead. Writes results.csv, results.json (scores per task x length, the average, the effective length), summary.md
and ruler.png into --output-dir. Installed: easy-context-eval-ruler (or python -m easy_context.eval.run_ruler).
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
from easy_context.data import load_tokenizer
from easy_context.eval.forward import greedy_generate, logits_at
from easy_context.eval.haystack import read_haystack_text
from easy_context.eval.plots import ruler_figure
from easy_context.eval.results import write_csv, write_json
from easy_context.eval.ruler import DEFAULT_TASKS, TASKS, make_case
from easy_context.eval.ruler.scoring import all_found, averages, effective_length, native_score, string_match_all, table
from easy_context.eval.runtime import add_runtime_args, init_runtime, load_eval_model_from_args, position_warning
from easy_context.eval.scoring import answer_split
from easy_context.eval.tokens import adds_bos, encode, unlimited
from easy_context.models import PRESETS, missing_local_path
from easy_context.training.process_exit import run_program


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not values or values[0] < 64:
        raise argparse.ArgumentTypeError(f"lengths must be >= 64 tokens, got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__)
    p.add_argument(
        "--model", required=True, help=f"hub id, local checkpoint, or a random-init preset: {', '.join(PRESETS)}"
    )
    p.add_argument("--lengths", type=_int_list, default=_int_list("4096,8192,16384,32768"),
                   help="comma-separated prompt sizes in tokens (default 4096,8192,16384,32768)")  # fmt: skip
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help=f"comma-separated, or 'all' (default: RULER's {len(DEFAULT_TASKS)} offline tasks); known: "
                        f"{', '.join(TASKS)}")  # fmt: skip
    p.add_argument("--num_samples", type=int, default=10, help="prompts per task and length")
    p.add_argument("--haystack_dir", default="PaulGrahamEssays", help=".txt files: the essay haystack")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    p.add_argument("--scoring", choices=["generate", "teacher_forced"], default="generate",
                   help="generate (RULER's): greedy output contains the answers; teacher_forced: each answer's "
                        "tokens are the argmax after the answer prefix")  # fmt: skip
    p.add_argument("--max_new_tokens", type=int, default=None, help="cap every task's generation budget")
    p.add_argument("--threshold", type=float, default=None, help="effective-length threshold on the average (0..1)")
    p.add_argument(
        "--threshold_from",
        default=None,
        metavar="RESULTS_JSON",
        help="take the threshold from another run (its average at its native length: the base model)",
    )
    p.add_argument(
        "--native_length",
        type=int,
        default=None,
        help="the length the model was trained at (default: its max_position_embeddings)",
    )
    p.add_argument("--output-dir", "--output_dir", default=None, help="default out/eval_ruler/<model name>")
    add_runtime_args(p)
    args = p.parse_args(argv)
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
    if args.num_samples < 1 or (args.max_new_tokens is not None and args.max_new_tokens < 1):
        p.error("--num_samples and --max_new_tokens must be >= 1")
    if args.threshold is not None and not 0 <= args.threshold <= 1:
        p.error(f"--threshold is a score in [0, 1], got {args.threshold}")
    if args.output_dir is None:
        args.output_dir = os.path.join("out", "eval_ruler", os.path.basename(os.path.normpath(args.model)))
    return args


def prompt_wrapper(tokenizer, chat: bool):
    """``wrap(body, answer_prefix)`` -> the model input text, and whether to put the BOS token in front."""
    if not chat:
        return (lambda body, prefix: body + prefix), adds_bos(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat: this tokenizer has no chat template; drop --chat (plain prompts)")
    prefix_text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                add_generation_prompt=True)  # fmt: skip
    bos = adds_bos(tokenizer) and not (tokenizer.bos_token and prefix_text.startswith(tokenizer.bos_token))

    def wrap(body: str, prefix: str) -> str:
        messages = [{"role": "user", "content": body}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + prefix.lstrip()

    return wrap, bos


def score_generated(model, runtime, tokenizer, ids: list[int], case, pad_id: int, cap: int | None) -> dict:
    budget = min(case.max_new_tokens, cap) if cap else case.max_new_tokens
    new = greedy_generate(model, runtime, ids, budget, pad_id, tokenizer.eos_token_id,
                          stop=lambda tokens: all_found(tokenizer.decode(tokens), case.answers))  # fmt: skip
    output = tokenizer.decode(new, skip_special_tokens=True)
    return {"score": string_match_all(output, case.answers), "output": output, "new_tokens": len(new)}


def score_teacher_forced(model, runtime, tokenizer, case, bos: bool, pad_id: int) -> dict:
    """Each expected string right after the answer prefix: 1 when every one of its tokens is the argmax."""
    hits = []
    for answer in case.answers:
        ids, start = answer_split(tokenizer, case.text, " " + answer, bos)
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


def threshold_of(args, average: dict[int, float], native: int) -> tuple[float | None, str]:
    """The effective-length threshold and where it came from."""
    if args.threshold is not None:
        return args.threshold, "--threshold"
    if args.threshold_from:
        with open(args.threshold_from, encoding="utf-8") as f:
            other = json.load(f)
        return float(other["native_score"]), f"{args.threshold_from} (its average at {other['native_length']})"
    found = native_score(average, native)
    if found is None:
        return None, f"no length <= the native {native} evaluated: pass --threshold or --threshold_from"
    return found[1], f"this model's average at {found[0]} (native length {native})"


def summary_markdown(summary: dict) -> str:
    lengths = sorted({n for row in summary["scores"].values() for n in map(int, row)})
    head = "| task | " + " | ".join(str(n) for n in lengths) + " |"
    lines = [f"# RULER: {summary['model']}", "", head, "|" + " --- |" * (len(lengths) + 1)]
    for task, row in summary["scores"].items():
        lines.append(f"| {task} | " + " | ".join(f"{row.get(str(n), row.get(n, float('nan'))):.2f}"
                                                   for n in lengths) + " |")  # fmt: skip
    avg = summary["average"]
    lines.append("| **average** | " + " | ".join(f"**{avg[str(n)]:.2f}**" if str(n) in avg else "-"
                                                  for n in lengths) + " |")  # fmt: skip
    lines += ["", f"Effective length: **{summary['effective_length']}** (threshold {summary['threshold']}, "
              f"{summary['threshold_source']}); {summary['prompts']} prompts, {summary['seconds']} s, "
              f"{summary['parallel_mode']} on {summary['processes']} process(es), "
              f"scoring {summary['scoring']}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    tasks = [TASKS[name] for name in args.tasks]
    try:
        essay_words = read_haystack_text(args.haystack_dir).split() if any(t.needs_essays for t in tasks) else None
        runtime = init_runtime(args.parallel_mode, args.kernel, **option_values(args))
        tokenizer = unlimited(load_tokenizer(args.tokenizer or args.model))
        wrap, bos = prompt_wrapper(tokenizer, args.chat)
        model = load_eval_model_from_args(args.model, runtime, len(tokenizer), args)
    except (OSError, RuntimeError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    native = args.native_length or getattr(model.config, "max_position_embeddings", None) or max(args.lengths)
    runtime.print(
        f"eval_ruler: {args.model} | {runtime.seq_algo} on {runtime.world_size} process(es) | {len(tasks)} tasks x "
        f"{len(args.lengths)} lengths x {args.num_samples} samples | scoring {args.scoring}"
    )

    def count(text: str) -> int:
        return len(encode(tokenizer, text, bos))

    cells = [(task, n, s) for n in args.lengths for task in tasks for s in range(args.num_samples)]
    mine = runtime.my_share(len(cells))
    warned: set[int] = set()
    rows, start = [], time.time()
    os.makedirs(args.output_dir, exist_ok=True)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    partial = os.path.join(args.output_dir, f"rows.rank{rank}.jsonl")  # each row as it lands (for a cut run)
    open(partial, "w").close()
    for index in tqdm(mine, desc="ruler prompts", disable=not runtime.is_main, file=sys.stderr):
        task, length, sample = cells[index]
        t0 = time.time()
        try:
            case = make_case(task, length, sample, count, wrap, essay_words, args.seed)
        except ValueError as exc:
            sys.exit(f"error: {task.name} at {length} tokens: {exc}")
        ids = encode(tokenizer, case.text, bos)
        if length not in warned:
            warned.add(length)
            message = position_warning(model.config, len(ids) + case.max_new_tokens, args.model)
            if message:
                runtime.print(message)
        with torch.no_grad():
            if args.scoring == "generate":
                result = score_generated(model, runtime, tokenizer, ids, case, pad_id, args.max_new_tokens)
            else:
                result = score_teacher_forced(model, runtime, tokenizer, case, bos, pad_id)
        rows.append({"task": task.name, "length": length, "sample": sample, **result,
                     "answers": " | ".join(case.answers), "prompt_tokens": len(ids), "units": case.units,
                     "seconds": round(time.time() - t0, 3)})  # fmt: skip
        with open(partial, "a", encoding="utf-8") as f:
            f.write(json.dumps(rows[-1]) + "\n")
    rows = sorted(runtime.gather_objects(rows), key=lambda r: (r["task"], r["length"], r["sample"]))

    if runtime.is_main:
        scores = table(rows)
        in_average = [t.name for t in tasks if t.in_average]
        average = averages(scores, in_average)
        threshold, source = threshold_of(args, average, native)
        found = native_score(average, native)
        summary = {
            "model": args.model,
            "parallel_mode": runtime.seq_algo,
            "processes": runtime.world_size,
            "scoring": args.scoring,
            "tasks": args.tasks,
            "lengths": args.lengths,
            "scores": {task: {str(n): v for n, v in row.items()} for task, row in scores.items()},
            "average": {str(n): v for n, v in average.items()},
            "average_tasks": in_average,
            "native_length": found[0] if found else None,
            "native_score": found[1] if found else None,
            "threshold": threshold,
            "threshold_source": source,
            "effective_length": effective_length(average, threshold) if threshold is not None else None,
            "prompts": len(rows),
            "seconds": round(time.time() - start, 1),
            "args": vars(args),
            "rows": rows,
        }
        write_csv(rows, os.path.join(args.output_dir, "results.csv"))
        write_json(summary, os.path.join(args.output_dir, "results.json"))
        with open(os.path.join(args.output_dir, "summary.md"), "w", encoding="utf-8") as f:
            f.write(summary_markdown(summary))
        png = ruler_figure(scores, average, os.path.join(args.output_dir, "ruler.png"),
                           title=os.path.basename(os.path.normpath(args.model)), threshold=threshold)  # fmt: skip
        print(summary_markdown(summary), end="")
        print(f"results: {os.path.join(args.output_dir, 'results.csv')}; figure: {png}")
    torch.distributed.barrier()


def run() -> None:
    """The ``easy-context-eval-ruler`` console script."""
    run_program(main)


if __name__ == "__main__":
    run()
