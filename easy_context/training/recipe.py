"""Recipes: a run's flags as a YAML file, and the record of what each run used.

    easy-context-train --config train_scripts/danube2_256k.yaml --max-train-steps 10   # the command line wins

A recipe is a mapping of flag names to values: every flag of the script is a key, spelled with dashes or
underscores and without the leading ``--`` (``seq-length: 65536``, ``parallel_mode: zigzag_ring_attn``,
``adam-betas: [0.9, 0.95]``, ``no-save: true``; ``null`` keeps the default). The keys become flags placed before
the command line's, so a flag given on the command line overrides the file; values are checked like flags (type,
choices) and an unknown key is an error naming the nearest flag. A run's ``run_config.json`` is a recipe too:
``--config OUT/run_config.json`` repeats that run's flags.

One top-level key is not a flag: ``pipeline:`` holds the settings of the script that drives train.py through a whole
recipe (train_scripts/extend.sh: the model to fetch, the evaluations, the stages before the main one), which
train.py ignores; ``python easy_context/training/recipe.py --shell RECIPE.yaml`` prints them as shell assignments
(:func:`pipeline_shell`).

Each run records its resolved flags, package versions and git revision in ``run_config.json`` (:func:`run_record`)
in its output dir; ``--resume-from`` refuses a run that changes what the saved state was trained with
(:func:`resume_mismatch`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

RUN_CONFIG = "run_config.json"
# flags a resumed run must keep: the weights and the data rows of the saved state depend on them. The backend
# (--parallel_mode, --sp-size) and the process count may change: the state's data position is mapped onto the new
# layout (train_state.resume_plan)
RESUME_FIXED = ("model", "seq_length")
VERSIONED = ("torch", "transformers", "accelerate", "deepspeed", "easy_context")
PIPELINE_KEY = "pipeline"  # a recipe's section for the script around train.py (train_scripts/extend.sh), not flags


def _recipe_path(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The value of ``--config`` in ``argv`` (``--config X``, ``--config=X`` or an abbreviation argparse accepts,
    the last one given), else None."""
    found = None
    for i, token in enumerate(argv):
        if token == "--":
            break
        flag, eq, value = token.partition("=")
        if not flag.startswith("--"):
            continue
        actions = {id(a): a for o, a in parser._option_string_actions.items() if o.startswith(flag)}
        exact = parser._option_string_actions.get(flag)
        action = exact or (next(iter(actions.values())) if len(actions) == 1 else None)
        if action is not None and action.dest == "config":
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def load_recipe(path: str, flag: str = "--config") -> dict[str, Any]:
    """The key -> value mapping of a YAML recipe; raises ValueError (one line, naming ``flag``: the option that gave
    the path) for an unreadable or non-mapping file."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{flag} {path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"{flag} {path}: expected a mapping of flag names to values, got {type(data).__name__}")
    return data


def _long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{'--seq-length': action, '--seq_length': action, ...}: every long option a recipe key may name."""
    skip = (argparse._HelpAction, argparse._VersionAction)
    return {
        option: action
        for option, action in parser._option_string_actions.items()
        if option.startswith("--") and not isinstance(action, skip) and action.dest != "config"
        and not getattr(action, "not_a_recipe_key", False)
    }  # fmt: skip


def _key_action(options: dict[str, argparse.Action], key: str) -> argparse.Action | None:
    for spelling in (key, key.replace("_", "-"), key.replace("-", "_")):
        if f"--{spelling}" in options:
            return options[f"--{spelling}"]
    return None


def _check_value(parser, action: argparse.Action, key: str, value: Any, source: str) -> None:
    """The error argparse would give for this value on the command line, naming the recipe key instead."""
    convert = action.type if callable(action.type) else (lambda text: text)
    values = value if isinstance(value, list) else [value]
    for item in values:
        try:
            converted = convert(str(item))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            detail = f": {exc}" if isinstance(exc, argparse.ArgumentTypeError) else ""
            parser.error(f"--config {source}: {key}: invalid value {item!r}{detail}")
        if action.choices is not None and converted not in action.choices:
            choices = ", ".join(map(str, action.choices))
            parser.error(f"--config {source}: {key}: {item!r} is not one of {choices}")


def recipe_argv(parser: argparse.ArgumentParser, recipe: dict[str, Any], source: str) -> list[str]:
    """The recipe as command-line tokens (``{"seq-length": 512}`` -> ``["--seq-length", "512"]``); calls
    ``parser.error`` for an unknown key, a value of the wrong shape or type, or a choice not offered."""
    options = _long_options(parser)
    argv: list[str] = []
    for key, value in recipe.items():
        if key == PIPELINE_KEY:  # the driving script's settings (pipeline_shell), not train.py's
            if not isinstance(value, dict):
                parser.error(f"--config {source}: {key}: expected a mapping of settings, got {value!r}")
            continue
        action = _key_action(options, key)
        if action is None and key.replace("_", "-") in ("config", "print-config-path"):
            parser.error(f"--config {source}: '{key}' is a command-line flag, not a recipe key")
        if action is None:
            known = sorted({o[2:].replace("_", "-") for o in options})
            near = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.5)
            hint = f" (did you mean '{near[0]}'?)" if near else f" (see {parser.prog} --help)"
            parser.error(f"--config {source}: unknown key '{key}'{hint}")
        flag = action.option_strings[0]
        if value is None:
            continue
        if action.nargs == 0:  # store_true / store_false / store_const
            if not isinstance(value, bool):
                parser.error(f"--config {source}: {key}: expected true or false, got {value!r}")
            negation = isinstance(action, argparse.BooleanOptionalAction)
            if value == (not isinstance(action, argparse._StoreFalseAction)):
                argv.append(flag)
            elif negation:
                argv.append(f"--no-{flag[2:]}")
            continue
        many = action.nargs not in (None, argparse.OPTIONAL)
        if isinstance(value, dict):
            parser.error(f"--config {source}: {key}: invalid value {value!r}")
        if isinstance(value, list) != many:
            shape = "a list" if many else "one value"
            parser.error(f"--config {source}: {key}: expected {shape}, got {value!r}")
        if isinstance(action.nargs, int) and len(value) != action.nargs:
            parser.error(f"--config {source}: {key}: expected {action.nargs} values, got {value!r}")
        _check_value(parser, action, key, value, source)
        argv += [flag, *map(str, value)] if many else [f"{flag}={value}"]
    return argv


def parse_args_with_recipe(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``--config FILE``'s keys placed before the command line's flags (these win).
    The parser must define ``--config`` itself (for ``--help`` and ``args.config``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    path = _recipe_path(parser, argv)
    if path is None:
        return parser.parse_args(argv)
    try:
        recipe = load_recipe(path)
    except ValueError as exc:
        parser.error(str(exc))
    if _is_record(recipe) and "versions" in recipe:  # a run_config.json: the flags of that run
        options = _long_options(parser)
        recipe = {key: value for key, value in recipe["args"].items() if _key_action(options, key)}
    return parser.parse_args(recipe_argv(parser, recipe, path) + argv)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a run's numbers depend on (None: not installed)."""
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(path: str | Path | None = None) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the git checkout holding easy_context's source (or ``path``), None outside one (e.g. an
    installed wheel) or without git."""
    root = Path(path) if path is not None else Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()  # fmt: skip

    try:
        top = git("rev-parse", "--show-toplevel")
        if path is None and Path(top).resolve() != root:  # a venv inside some other repository: not our source
            return None
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def run_record(args: argparse.Namespace, **launch: Any) -> dict[str, Any]:
    """What a run used: every flag after the recipe and the command line (``args``), the launch (``launch``: world
    size, distributed type, ...), package versions, git revision, and the command."""
    return {
        "args": _json_safe(vars(args)),
        "launch": _json_safe(launch),
        "versions": package_versions(),
        "git": git_revision(),
        "command": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
    }


def write_run_config(output_dir: str | Path, record: dict[str, Any]) -> Path:
    """``record`` as ``output_dir/run_config.json`` (written to a temp file, then renamed)."""
    path = Path(output_dir) / RUN_CONFIG
    temp = path.with_name(f".{RUN_CONFIG}.tmp")
    temp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(temp, path)
    return path


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("args"), dict)


def recorded_run(state_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(file, record) of the run that wrote ``state_dir``: the record train.py saves in each state (the ``config`` of
    its ``easy_context_state.json``, train_state.save_training_state), else the output dir's ``run_config.json``
    (states are ``<output-dir>/state-stepN``); None for a state saved before runs were recorded."""
    from easy_context.training.train_state import STATE_JSON

    for path, key in ((Path(state_dir) / STATE_JSON, "config"), (Path(state_dir).parent / RUN_CONFIG, None)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        record = data.get(key) if key and isinstance(data, dict) else data
        if _is_record(record):
            return path, record
    return None


def _same(key: str, old: Any, new: Any) -> bool:
    if key == "model" and isinstance(old, str) and isinstance(new, str) and os.path.exists(new):
        return os.path.realpath(old) == os.path.realpath(new)
    return old == new


def resume_mismatch(args: argparse.Namespace, state_dir: str | Path) -> str | None:
    """Why ``args`` may not resume ``state_dir`` (it changes --model or --seq-length from the recorded run), naming
    both values; None when they agree or nothing was recorded."""
    found = recorded_run(state_dir)
    if found is None:
        return None
    path, record = found
    changed = [
        f"--{key.replace('_', '-')} {record['args'][key]} -> {getattr(args, key)}"
        for key in RESUME_FIXED
        if key in record["args"] and not _same(key, record["args"][key], getattr(args, key, None))
    ]
    if not changed:
        return None
    return (f"--resume-from {state_dir}: the state was trained with other settings ({'; '.join(changed)}; recorded "
            f"in {path}); resume with the recorded values, or start a new run from its model")  # fmt: skip


# top-level flags the driving script reads as its own settings too (the main stage's length, RoPE base and steps, the
# backend it launches and the attention kernel it passes): a recipe says each once, at the top, where train.py reads it
_SHELL_FROM_FLAGS = {"seq-length": "TARGET", "rope-theta": "THETA", "max-train-steps": "RECIPE_STEPS",
                     "parallel-mode": "PARALLEL_MODE", "kernel": "KERNEL"}  # fmt: skip


def _flag_tokens(flags: dict[str, Any]) -> list[str]:
    """A mapping of train.py flags as command-line tokens, without the parser (train.py checks them when it runs;
    tests/e2e/test_gemma_recipe.py checks the shipped ones against it): ``true`` is the bare flag, ``false`` and
    ``null`` are left out, a list is the flag and its values."""
    tokens: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")  # every flag has its dash spelling
        if value is None or value is False:
            continue
        if value is True:
            tokens.append(flag)
        elif isinstance(value, list):
            tokens += [flag, *map(str, value)]
        else:
            tokens.append(f"{flag}={value}")
    return tokens


def _shell_word(value: Any) -> str:
    import shlex

    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "''"  # set and empty: none (e.g. no needle beyond the target length)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return shlex.quote(" ".join(map(str, value)))  # a word list: baselines, lengths
    if isinstance(value, (dict, list)):
        return shlex.quote(json.dumps(value))  # read by Python (a micro model's config)
    return shlex.quote(str(value))


def pipeline_settings(recipe: dict[str, Any], micro: bool = False) -> dict[str, Any]:
    """The driving script's settings of a recipe: its ``pipeline:`` mapping (``micro:`` inside it overrides the rest
    when ``micro``), over the values read from the top-level flags (seq-length -> target, rope-theta -> theta,
    max-train-steps -> recipe_steps, parallel_mode, kernel). Keys are lower case, ``-`` or ``_``. ValueError (one
    line naming both) when ``pipeline:`` gives one of those again with another value: a recipe has one answer."""
    section = recipe.get(PIPELINE_KEY) or {}
    if not isinstance(section, dict):
        raise ValueError(f"{PIPELINE_KEY}: expected a mapping of settings, got {section!r}")
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # setting -> the top-level key that gave it
    for flag, name in _SHELL_FROM_FLAGS.items():
        for spelling in (flag, flag.replace("-", "_")):
            if recipe.get(spelling) is not None:
                settings[name.lower()], spelled[name.lower()] = recipe[spelling], spelling
    own = {k.replace("-", "_").lower(): v for k, v in section.items() if k != "micro"}
    for key, top in spelled.items():
        if own.get(key) is not None and not _same_value(own[key], settings[key]):
            raise ValueError(f"the recipe sets {key} twice, {top}: {settings[key]} at the top and {PIPELINE_KEY}."
                             f"{key}: {own[key]} under it; keep one (the top one: train.py reads it)")  # fmt: skip
    settings.update(own)
    if micro:
        settings.update({k.replace("-", "_").lower(): v for k, v in (section.get("micro") or {}).items()})
    return settings


def _same_value(a: Any, b: Any) -> bool:
    """Whether two recipe values say the same (``65536`` and ``"65536"``, ``1e7`` and ``10000000``)."""
    if str(a) == str(b):
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def pipeline_shell(recipe: dict[str, Any], micro: bool = False) -> str:
    """:func:`pipeline_settings` as bash lines for ``eval``: ``NAME=value`` for each setting not already set in the
    environment (what the caller sets wins, also an empty value); ``stages`` (a list of mappings of train.py flags:
    the stages trained before the main one, each from the previous one's model) as the arrays STAGE_SEQ,
    STAGE_STEPS and STAGE_FLAGS (each stage's flags as one string of ``--flag=value`` tokens)."""
    lines = []
    settings = pipeline_settings(recipe, micro)
    stages = settings.pop("stages", None) or []
    for key, value in settings.items():
        name = key.upper()
        if not name.replace("_", "").isalnum() or name[0].isdigit():
            raise ValueError(f"{PIPELINE_KEY}: {key!r} is not a usable setting name (letters, digits, _)")
        lines.append(f'[ -n "${{{name}+set}}" ] || {name}={_shell_word(value)}')
    lines.append("STAGE_SEQ=() STAGE_STEPS=() STAGE_FLAGS=()")
    for seq, steps, tokens in pipeline_stages({"stages": stages}):
        lines.append(f"STAGE_SEQ+=({seq}) STAGE_STEPS+=({steps}) STAGE_FLAGS+=({_shell_word(' '.join(tokens))})")
    return "\n".join(lines) + "\n"


def pipeline_stages(settings: dict[str, Any]) -> list[tuple[int, int, list[str]]]:
    """(seq-length, max-train-steps, train.py flags as tokens) of each of :func:`pipeline_settings`' ``stages``
    (the stages trained before the main one); ValueError naming a stage that lacks either."""
    out = []
    for i, stage in enumerate(settings.get("stages") or []):
        if not isinstance(stage, dict) or not {"seq-length", "max-train-steps"} <= {k.replace("_", "-") for k in stage}:
            raise ValueError(f"{PIPELINE_KEY}: stages[{i}]: expected a mapping of train.py flags with seq-length and "
                             f"max-train-steps, got {stage!r}")  # fmt: skip
        flags = {k.replace("_", "-"): v for k, v in stage.items()}
        out.append((int(flags["seq-length"]), int(flags["max-train-steps"]), _flag_tokens(flags)))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python easy_context/training/recipe.py --shell [--micro] RECIPE.yaml``: the recipe's pipeline settings as
    shell lines (run as a file path, this imports neither torch nor easy_context)."""
    parser = argparse.ArgumentParser(prog="recipe.py", description=main.__doc__)
    parser.add_argument("--shell", required=True, action="store_true", help="print its pipeline settings for eval")
    parser.add_argument("--micro", action="store_true", help="with the pipeline's micro: overrides (CPU check)")
    parser.add_argument("recipe", metavar="RECIPE.yaml")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(pipeline_shell(load_recipe(args.recipe), micro=args.micro))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
