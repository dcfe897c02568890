"""``python -m easy_context.extend`` (the ``easy-context-extend`` console script): derive a model's extension recipe
for the hardware, write it, and run it (easy_context.extend.pipeline); ``--dry-run`` prints each stage's train.py
command, tokens, the planner's memory and the time estimates (training for the named GPU, data, evaluations)
instead, running nothing. ``--recipe R`` runs a recipe written before (edited or not)::

    easy-context-extend --model path/to/model --to 256K --gpus 1 --gpu h200           # derive, write, run
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
from easy_context.extend import estimate
from easy_context.extend.derive import MFU, Derived, derive
from easy_context.extend.estimate import format_seconds, format_tokens
from easy_context.extend.micro import micro_name
from easy_context.extend.recipe import Recipe, format_length, parse_length
from easy_context.extend.settings import Settings, SettingsError, resolve, work_folder
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.shapes import GB
from easy_context.training.flops import GPUS


def build_parser() -> ArgumentParser:
    """The parser of :func:`main`; --gpus, --gpu-mem and --host-mem as the planner spells them."""
    ap = ArgumentParser(
        prog="python -m easy_context.extend",
        description="Derive the recipe that extends a model's context on this hardware (docs/extension.md).",
    )
    ap.add_argument(
        "--model",
        help=MODEL_HELP + " (a fetch name is fetched when the plan runs; a hub id from the local cache)",
    )
    ap.add_argument("--to", metavar="LENGTH", help="the target length: 262144, 256K or 1M")
    ap.add_argument(
        "--recipe",
        metavar="R.yaml",
        help="run this recipe (one --write-recipe wrote, edited or not) instead of deriving one",
    )
    ap.add_argument("--gpus", type=int, default=1, help="GPUs in all")
    ap.add_argument("--gpu", default="h100", help=f"the GPU: {', '.join(GPUS)} (its dense bf16 peak times the steps)")
    ap.add_argument("--gpu-mem", default=None, help="per GPU: 80GB (1e9), 80GiB (2^30), 141GB (default: --gpu's)")
    ap.add_argument("--host-mem", default=None, help="per node (default: this machine's RAM, said in the plan)")
    ap.add_argument(
        "--write-recipe",
        metavar="OUT.yaml",
        default=None,
        help="write the derived recipe here (default: out/extend_NAME/recipe.yaml; --micro: out/extend_NAME-micro/)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the stages and their commands; run nothing")
    ap.add_argument(
        "--micro",
        action="store_true",
        help="the plan's CPU miniature (MICRO=1): every stage on a tiny random model of the same family and layer "
        "pattern, minutes on 2 cores; with --dry-run, print the miniature's plan",
    )
    return ap


def describe(derived: Derived, settings: Settings | None = None, host_note: str = "",
             cut: Settings | None = None) -> str:  # fmt: skip
    """The stages as text: each one's train.py command, tokens, and the planner's bytes and time estimate; with the
    pipeline's ``settings``, the data preparation, evaluations and control it runs besides (estimated); when the
    evaluations take longer than the training, the settings that cut them with the estimate under ``cut`` (the
    pipeline's settings with estimate.EVAL_CUTS)."""
    r = derived.recipe
    lines = [f"{r.run_name}: {format_length(derived.native)} -> {format_length(r.target)} on {derived.hardware}"
             f"{host_note}; RoPE base {r.rope_theta:.3g}, peak LR {r.learning_rate:g}"]  # fmt: skip
    train_s = 0.0
    for i, (stage, plan) in enumerate(zip(r.all_stages, derived.plans)):
        train_s += plan.seconds
        name = "main" if i == len(derived.plans) - 1 else f"stage {i + 1}"
        lines.append(
            f"  {name}: {format_length(plan.seq_length)} x {plan.steps} steps = {format_tokens(plan.tokens)} tokens; "
            f"{plan.gpu_bytes / GB:.1f} GB a GPU, {plan.host_bytes / GB:.1f} GB host ({plan.optim}, {plan.config}); "
            f"~{format_seconds(plan.step_seconds)} a step, ~{format_seconds(plan.seconds)}"
        )
        lines.append(f"    train.py --model MODEL --rope-theta {r.rope_theta:g} --max-train-steps {stage.steps} "
                     f"--learning-rate {stage.learning_rate or r.learning_rate:g} {plan.train_flags}")  # fmt: skip
    tokens = sum(p.tokens for p in derived.plans)
    extras = [] if settings is None else _extras(derived, settings, tokens)
    for extra in extras:
        lines.append(f"  {extra.name}: ~{format_seconds(extra.seconds)} ({extra.why})")
    total_s = train_s + sum(e.seconds for e in extras)
    evals = next((e for e in extras if e.name == "evaluations"), None)
    if evals and cut and estimate.evaluations_dominate(evals.seconds, train_s):
        cut_evals = estimate.evaluations(derived.config, cut, derived.peak_flops, MFU)
        lines.append(f"  {estimate.evaluation_cut(evals, cut_evals, train_s, int(settings.nproc), total_s)}")
    besides = " + data, evaluations" + (", control" if any(e.name == "control" for e in extras) else "")
    lines.append(f"  in all: {format_tokens(tokens)} tokens trained, ~{format_seconds(total_s)} (training "
                 f"{format_seconds(train_s)}{besides if extras else ''}); estimates at {MFU:.0%} of the "
                 f"{derived.gpu.name}'s dense bf16 peak, nothing was run")  # fmt: skip
    return "\n".join(lines)


def _extras(derived: Derived, settings: Settings, tokens: int) -> list[estimate.Extra]:
    """The pipeline's work besides the training stages, estimated (easy_context.extend.estimate)."""
    config = derived.config
    gpus = int(settings.nproc)
    lengths = len({*(p.seq_length for p in derived.plans), *([settings.base_length] if settings.control else [])})
    out = [estimate.data(settings, lengths), estimate.evaluations(config, settings, derived.peak_flops, MFU)]
    control = estimate.control(config, settings, tokens, gpus, derived.peak_flops, MFU)
    return out + ([control] if control else [])


def pipeline_settings(recipe: Recipe, path: str | None, overrides: dict[str, str] | None = None) -> Settings | None:
    """The pipeline's settings of ``recipe`` (written at ``path``, else in a temporary file) under this environment
    and ``overrides``; None when they do not resolve (the run would say why)."""
    env = {**os.environ, **(overrides or {})}
    try:
        if path:
            return resolve(path, env)
        with tempfile.TemporaryDirectory() as tmp:
            return resolve(str(recipe.write(os.path.join(tmp, "recipe.yaml"), "for the estimate")), env)
    except (SettingsError, OSError, ValueError):
        return None


def describe_plan(derived: Derived, path: str | None, host_note: str) -> str:
    """:func:`describe` with the pipeline's settings of the recipe (at ``path``, else not written yet) and those
    that cut its evaluations."""
    recipe = derived.recipe
    return describe(derived, pipeline_settings(recipe, path), host_note,
                    pipeline_settings(recipe, path, estimate.EVAL_CUTS))  # fmt: skip


def machine_memory() -> float:
    """This machine's RAM in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def describe_recipe(recipe: Recipe, settings: Settings) -> str:
    """A recipe file's run as the pipeline would start it (``settings``: the recipe under this environment): its
    lengths, RoPE base, backend on its processes and optimizer, then each stage's length, steps, tokens and own
    train.py flags."""
    from easy_context.extend.preflight import recipe_layout

    s = settings
    layout = recipe_layout(s)
    dp = max(1, layout.sequences)
    lines = [f"{s.name}: {format_length(s.base_length)} -> {format_length(s.target)}; RoPE base "
             f"{float(s.theta):.3g}, {layout.describe()}, optimizer {s.optim}"]  # fmt: skip
    main_steps = int(s.steps or s.recipe_steps)
    for i, stage in enumerate(recipe.all_stages):
        last = i == len(recipe.stages)
        seq, steps = (s.target, main_steps) if last else (stage.seq_length, stage.steps)
        own = {k: v for k, v in stage.to_mapping().items() if k not in ("seq-length", "max-train-steps")}
        flags = " ".join(f"--{k} {v}" for k, v in own.items())
        lines.append(f"  {'main' if last else f'stage {i + 1}'}: {format_length(seq)} x {steps} steps = "
                     f"{format_tokens(seq * steps * dp)} tokens ({dp} sequence{'s' if dp > 1 else ''} a step); "
                     f"{flags}")  # fmt: skip
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
             f"{layout.describe()}, optimizer {s.optim}; its own folders: work {s.work}, model {s.model}"]  # fmt: skip
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
            recipe = Recipe.load(args.recipe, "--recipe")
            settings, layout = resolved(args.recipe, micro)
        except (OSError, ValueError) as exc:  # SettingsError included: a plan train.py would refuse
            ap.error(str(exc))
        if args.dry_run:
            print(describe_micro(settings) if micro else describe_recipe(recipe, settings))
            print(f"  {layout}")
            return 0
        return run_recipe(args.recipe, micro)
    if not (args.model and args.to):
        ap.error("give both --model and --to (the target length: 262144, 256K or 1M)")
    host_mem, host_note = args.host_mem, ""
    if host_mem is None:
        host_mem = machine_memory()
        host_note = " (host: this machine's RAM; --host-mem for the training machine's)"
    try:
        derived = derive(args.model, parse_length(args.to), gpus=args.gpus, gpu_mem=args.gpu_mem, host_mem=host_mem,
                         gpu=args.gpu)  # fmt: skip
    except ValueError as exc:
        ap.error(str(exc))
    host = args.host_mem or f"{host_mem / GB:g}GB"
    header = (f"derived by python -m easy_context.extend --model {args.model} --to {args.to} --gpus {args.gpus} "
              f"--gpu {args.gpu} --gpu-mem {args.gpu_mem or 'its own'} --host-mem {host}: each comment says where its "
              "value came from")  # fmt: skip
    if args.dry_run and not args.write_recipe:
        if micro:  # the miniature's settings are the written recipe's, resolved: a file nobody keeps
            with tempfile.TemporaryDirectory() as tmp:
                return _print_micro(ap, str(derived.recipe.write(os.path.join(tmp, "recipe.yaml"), header)))
        print(describe_plan(derived, None, host_note))
        print(f"  {derived.layout}")
        return 0
    name = derived.recipe.run_name
    out = args.write_recipe or f"{work_folder(micro_name(name) if micro else name)}/recipe.yaml"
    path = derived.recipe.write(out, header)
    print(f"recipe: {path}")
    if micro:
        if args.dry_run:
            return _print_micro(ap, str(path))
    else:
        print(describe_plan(derived, str(path), host_note))
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
