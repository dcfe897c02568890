"""``python -m easy_context.extend`` (the ``easy-context-extend`` console script): derive a model's extension recipe
for the hardware, write it, and run it (easy_context.extend.pipeline); ``--dry-run`` prints each stage's train.py
command, tokens, and the planner's memory and time estimate instead, running nothing. ``--recipe R`` runs a recipe
written before (edited or not)::

    easy-context-extend --model path/to/model --to 256K --gpus 1 --gpu-mem 141GB      # derive, write, run
    easy-context-extend --model path/to/model --to 256K --write-recipe r.yaml --dry-run
    easy-context-extend --recipe r.yaml                                               # run it
    easy-context-extend --model smollm2-135m --to 64K --micro [--dry-run]             # its CPU miniature

Every plan is held to train.py's own layout check (length multiple, head split) before anything runs.
"""

from __future__ import annotations

import os
import sys
import tempfile

from easy_context.cli import ArgumentParser
from easy_context.extend.derive import MFU, Derived, derive
from easy_context.extend.recipe import Recipe, format_length, parse_length
from easy_context.extend.settings import Settings, SettingsError
from easy_context.models.shapes import GB


def build_parser() -> ArgumentParser:
    """The parser of :func:`main`; --gpus, --gpu-mem and --host-mem as the planner spells them."""
    ap = ArgumentParser(
        prog="python -m easy_context.extend",
        description="Derive the recipe that extends a model's context on this hardware (docs/extension.md).",
    )
    ap.add_argument(
        "--model",
        help="a model folder or its config.json, a name easy-context-fetch --list prints "
        "(fetched when the plan runs), or a hub id in the local cache",
    )
    ap.add_argument("--to", metavar="LENGTH", help="the target length: 262144, 256K or 1M")
    ap.add_argument(
        "--recipe",
        metavar="R.yaml",
        help="run this recipe (one --write-recipe wrote, edited or not) instead of deriving one",
    )
    ap.add_argument("--gpus", type=int, default=1, help="GPUs in all")
    ap.add_argument("--gpu-mem", default="80GB", help="per GPU: 80GB (1e9), 80GiB (2^30), 141GB")
    ap.add_argument("--host-mem", default="1TB", help="per node")
    ap.add_argument(
        "--write-recipe",
        metavar="OUT.yaml",
        default=None,
        help="write the derived recipe here (default: out/extend_NAME/recipe.yaml)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the stages and their commands; run nothing")
    ap.add_argument(
        "--micro",
        action="store_true",
        help="the plan's CPU miniature (MICRO=1): every stage on a tiny random model of the same family and layer "
        "pattern, minutes on 2 cores; with --dry-run, print the miniature's plan",
    )
    return ap


def describe(derived: Derived) -> str:
    """The stages as text: each one's train.py command, tokens, and the planner's bytes and time estimate."""
    r = derived.recipe
    lines = [f"{r.run_name}: {format_length(derived.native)} -> {format_length(r.target)} on {derived.hardware}; "
             f"RoPE base {r.rope_theta:.3g}, peak LR {r.learning_rate:g}"]  # fmt: skip
    total_s = 0.0
    for i, (stage, plan) in enumerate(zip(r.all_stages, derived.plans)):
        total_s += plan.seconds
        name = "main" if i == len(derived.plans) - 1 else f"stage {i + 1}"
        lines.append(
            f"  {name}: {format_length(plan.seq_length)} x {plan.steps} steps = {plan.tokens / 1e6:.1f}M tokens; "
            f"{plan.gpu_bytes / GB:.1f} GB a GPU, {plan.host_bytes / GB:.1f} GB host ({plan.optim}, {plan.config}); "
            f"~{plan.step_seconds:.1f} s/step, ~{plan.seconds / 3600:.2f} h"
        )
        lines.append(f"    train.py --model MODEL --rope-theta {r.rope_theta:g} --max-train-steps {stage.steps} "
                     f"--learning-rate {stage.learning_rate or r.learning_rate:g} {plan.train_flags}")  # fmt: skip
    lines.append(f"  in all: {sum(p.tokens for p in derived.plans) / 1e6:.1f}M tokens, ~{total_s / 3600:.2f} h "
                 f"(time at {MFU:.0%} of dense bf16 peak; nothing was run)")  # fmt: skip
    return "\n".join(lines)


def describe_recipe(recipe: Recipe) -> str:
    """A recipe file's stages as text: each one's length, steps, tokens and own train.py flags."""
    optim = recipe.settings.get("optim", "ddp")
    lines = [f"{recipe.run_name}: {format_length(recipe.base_length)} -> {format_length(recipe.target)}; RoPE base "
             f"{recipe.rope_theta:.3g}, {recipe.parallel_mode}, optimizer {optim}"]  # fmt: skip
    for i, stage in enumerate(recipe.all_stages):
        name = "main" if i == len(recipe.stages) else f"stage {i + 1}"
        own = {k: v for k, v in stage.to_mapping().items() if k not in ("seq-length", "max-train-steps")}
        flags = " ".join(f"--{k} {v}" for k, v in own.items())
        lines.append(f"  {name}: {format_length(stage.seq_length)} x {stage.steps} steps = {stage.tokens / 1e6:.1f}M "
                     f"tokens a sequence per step; {flags}")  # fmt: skip
    return "\n".join(lines)


def describe_micro(settings: Settings) -> str:
    """The CPU miniature (MICRO=1) a recipe runs: its model, stages, control and evaluations."""
    import json

    from easy_context.extend.preflight import recipe_layout

    s = settings
    spec = s.micro_model
    if spec.startswith("{"):
        m = json.loads(spec)
        types = m.get("layer_types")
        pattern = f", layers {'/'.join(t.split('_')[0] for t in types)}" if types else ""
        window = f", window {m['sliding_window']}" if m.get("sliding_window") and types else ""
        spec = (
            f"a random {m['model_type']}: {m.get('num_hidden_layers')} layers x {m.get('hidden_size')}, "
            f"{m.get('num_attention_heads')} q / {m.get('num_key_value_heads')} kv heads{pattern}{window}"
        )
    layout = recipe_layout(s)
    lines = [f"{s.name}: its CPU miniature (MICRO=1): {spec}; {s.base_length} -> {s.target} tokens, "
             f"{layout.describe()}, optimizer {s.optim}"]  # fmt: skip
    steps = s.steps or s.recipe_steps
    for i, stage in enumerate(s.stages):
        lines.append(f"  stage {i + 1}: {stage.seq} tokens x {stage.steps} steps {' '.join(stage.flags)}".rstrip())
    lines.append(f"  main: {s.target} tokens x {steps} steps")
    if s.target2:
        lines.append(f"  second stage: {s.target2} tokens x {s.steps2} steps")
    if s.control:
        lines.append(f"  control: {s.base_length} tokens x {s.control_step_count()} steps, "
                     f"{s.target // s.base_length} rows a step")  # fmt: skip
    lines.append(f"  evaluations: {' '.join(s.baselines) or 'none'} before; needle {s.needle_min}..{s.needle_max} "
                 f"step {s.needle_step}, {s.samples} sample(s); perplexity to {s.ppl_max}; RULER "
                 f"{'at ' + s.ruler_lengths_to(s.target) if s.ruler else 'off'}")  # fmt: skip
    return "\n".join(lines)


def resolved(path: str, micro: bool) -> tuple[Settings, str]:
    """The pipeline's settings of the recipe at ``path`` (MICRO=1 when ``micro``) and the line saying that every
    training run passes train.py's layout check; SettingsError (one line naming the fix) otherwise."""
    from easy_context.extend.preflight import preflight
    from easy_context.extend.settings import resolve

    env = {**os.environ, **({"MICRO": "1"} if micro else {})}
    settings = resolve(path, env)
    return settings, preflight(settings)


def run_recipe(path: str, micro: bool = False) -> int:
    """The pipeline on the recipe at ``path``: its exit status (easy_context.extend.pipeline; its settings may be
    overridden by the environment, train_scripts/extend.sh's header lists them); ``micro``: its CPU miniature."""
    from easy_context.extend import pipeline

    if micro:
        os.environ["MICRO"] = "1"
    return pipeline.main([path])


def main(argv: list[str] | None = None) -> int:
    """Derive, write and run (--dry-run: print instead), or run --recipe; a bad input exits 2 with one line naming
    the fix."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if bool(args.recipe) == bool(args.model or args.to):
        ap.error("give --model M --to LENGTH (derive a recipe) or --recipe R.yaml (run one), not both")
    micro = args.micro or os.environ.get("MICRO") == "1"
    if args.recipe:
        try:
            recipe = Recipe.load(args.recipe)
            settings, layout = resolved(args.recipe, micro)
        except (OSError, ValueError) as exc:  # SettingsError included: a plan train.py would refuse
            ap.error(str(exc))
        if args.dry_run:
            print(describe_micro(settings) if micro else describe_recipe(recipe))
            print(f"  {layout}")
            return 0
        return run_recipe(args.recipe, micro)
    if not (args.model and args.to):
        ap.error("give both --model and --to (the target length: 262144, 256K or 1M)")
    try:
        derived = derive(args.model, parse_length(args.to), gpus=args.gpus, gpu_mem=args.gpu_mem,
                         host_mem=args.host_mem)  # fmt: skip
    except ValueError as exc:
        ap.error(str(exc))
    header = (f"derived by python -m easy_context.extend --model {args.model} --to {args.to} --gpus {args.gpus} "
              f"--gpu-mem {args.gpu_mem}: each comment says where its value came from")  # fmt: skip
    if args.dry_run and not args.write_recipe:
        if micro:  # the miniature's settings are the written recipe's, resolved: a file nobody keeps
            with tempfile.TemporaryDirectory() as tmp:
                return _print_micro(ap, str(derived.recipe.write(os.path.join(tmp, "recipe.yaml"), header)))
        print(describe(derived))
        print(f"  {derived.layout}")
        return 0
    out = args.write_recipe or f"out/extend_{derived.recipe.run_name}/recipe.yaml"
    path = derived.recipe.write(out, header)
    print(f"recipe: {path}")
    if micro:
        if args.dry_run:
            return _print_micro(ap, str(path))
    else:
        print(describe(derived))
        print(f"  {derived.layout}")
    if args.dry_run:
        return 0
    print(f"running {'its CPU miniature' if micro else 'it'} (the same command, or --recipe {path}"
          f"{' --micro' if micro else ''}, continues a run cut off)", flush=True)  # fmt: skip
    return run_recipe(str(path), micro)


def _print_micro(ap: ArgumentParser, path: str) -> int:
    try:
        settings, layout = resolved(path, micro=True)
    except SettingsError as exc:
        ap.error(str(exc))
    print(describe_micro(settings))
    print(f"  {layout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
