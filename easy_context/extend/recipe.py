"""An extension recipe as typed values: :class:`Recipe` (the main stage's train.py flags and the pipeline's settings)
and :class:`Stage` (a stage trained before the main one), read from and written to the YAML of train_scripts/*.yaml.

The YAML's layout is train.py's (easy_context.training.recipe): the main stage's flags at the top level (``seq-length``
is the target length, ``rope-theta`` the RoPE base every stage trains with), and under ``pipeline:`` the settings of
the script around train.py, ``stages:`` among them. Keys this module does not type (``lr-schedule``, ``micro:``, the
evaluation sizes, ...) are kept as they are, in :attr:`Recipe.flags` and :attr:`Recipe.settings`, so a recipe reads
and writes back whole. Each typed value is checked when the dataclass is built; a bad one raises a one-line
ValueError naming its YAML key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from easy_context.training.recipe import PIPELINE_KEY, load_recipe

BASELINES = ("base", "rope_theta", "linear", "dynamic_ntk", "yarn")  # the training-free baselines extend.sh knows
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2}
_LENGTH = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KkMm]?)\s*")


def parse_length(text: str | int) -> int:
    """Tokens of ``262144``, ``256K`` or ``1M`` (K = 1024, M = 1024**2, as context lengths are counted)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _LENGTH.fullmatch(str(text))
        if not m:
            raise ValueError(f"length {text!r}: give tokens as 262144, 256K or 1M")
        number = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
        if number != int(number):
            raise ValueError(f"length {text!r}: not a whole number of tokens; give tokens as 262144, 256K or 1M")
        value = int(number)
    if value < 1:
        raise ValueError(f"length {text!r}: must be at least 1 token")
    return value


def format_length(tokens: int) -> str:
    """``262144`` -> ``256K``, ``1048576`` -> ``1M``; other counts as they are."""
    for suffix, size in (("M", 1024**2), ("K", 1024)):
        if tokens % size == 0:
            return f"{tokens // size}{suffix}"
    return str(tokens)


def _checkpoint_modes() -> tuple[str, ...]:
    from easy_context.memory.offload_checkpoint import CHECKPOINT_MODES

    return tuple(CHECKPOINT_MODES)


def _seq_algos() -> tuple[str, ...]:
    from easy_context.core.registry import SEQ_ALGOS

    return tuple(SEQ_ALGOS)


def _kernels() -> tuple[str, ...]:
    from easy_context.kernels import KERNEL_NAMES

    return tuple(KERNEL_NAMES)


def _whole(key: str, value: Any, low: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"recipe {key}: expected a whole number >= {low}, got {value!r}")


def _number(key: str, value: Any, positive: bool = True, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (value <= 0 if positive else value < 0):
        raise ValueError(f"recipe {key}: expected a number {'>' if positive else '>='} 0, got {value!r}")


def _choice(key: str, value: Any, choices: tuple[str, ...], optional: bool = False) -> None:
    if optional and value is None:
        return
    if value not in choices:
        raise ValueError(f"recipe {key}: {value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True)
class Stage:
    """One training run of the recipe: ``steps`` optimizer steps at ``seq_length`` tokens a sequence; the None fields
    keep the main stage's value (train.py's flag of the same name)."""

    seq_length: int
    steps: int
    checkpointing: str | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    time_limit: float | None = None  # seconds; the next stage starts from what this one saved by then
    flags: Mapping[str, Any] = field(default_factory=dict)  # other train.py flags of this stage, as written
    why: Mapping[str, str] = field(default_factory=dict, compare=False)  # YAML key -> where its value came from

    def __post_init__(self) -> None:
        _whole("seq-length", self.seq_length, 1)
        _whole("max-train-steps", self.steps, 1)
        _choice("checkpointing", self.checkpointing, _checkpoint_modes(), optional=True)
        _number("learning-rate", self.learning_rate, optional=True)
        _whole("warmup-steps", self.warmup_steps, 0, optional=True)
        _number("time-limit", self.time_limit, positive=False, optional=True)

    @property
    def tokens(self) -> int:
        """Tokens of one sequence per step x steps (the rows a step trains beyond one multiply this)."""
        return self.seq_length * self.steps

    def to_mapping(self) -> dict[str, Any]:
        """The stage as a mapping of train.py flags (``seq-length``, ``max-train-steps``, then the set ones)."""
        out: dict[str, Any] = {"seq-length": self.seq_length, "max-train-steps": self.steps}
        for key, value in (("checkpointing", self.checkpointing), ("learning-rate", self.learning_rate),
                           ("warmup-steps", self.warmup_steps), ("time-limit", self.time_limit)):  # fmt: skip
            if value is not None:
                out[key] = value
        return out | dict(self.flags)

    @classmethod
    def from_mapping(cls, flags: Mapping[str, Any], where: str = "stages") -> Stage:
        """A stage from its flags (dash or underscore spellings); ``where`` names it in errors."""
        if not isinstance(flags, Mapping):
            raise ValueError(f"recipe {where}: expected a mapping of train.py flags, got {flags!r}")
        rest = {str(k).replace("_", "-"): v for k, v in flags.items()}
        missing = [k for k in ("seq-length", "max-train-steps") if k not in rest]
        if missing:
            raise ValueError(f"recipe {where}: a stage needs {' and '.join(missing)}")
        try:
            return cls(
                seq_length=rest.pop("seq-length"), steps=rest.pop("max-train-steps"),
                checkpointing=rest.pop("checkpointing", None), learning_rate=rest.pop("learning-rate", None),
                warmup_steps=rest.pop("warmup-steps", None), time_limit=rest.pop("time-limit", None), flags=rest,
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(str(exc).replace("recipe ", f"recipe {where}.", 1)) from None


# the typed top-level flags: field -> YAML key (the main stage's train.py flags)
_FLAGS = {
    "target": "seq-length", "rope_theta": "rope-theta", "parallel_mode": "parallel_mode", "sp_size": "sp-size",
    "micro_batch": "batch-size", "grad_accum": "gradient-accumulate-every", "steps": "max-train-steps",
    "learning_rate": "learning-rate", "warmup_steps": "warmup-steps", "checkpointing": "checkpointing",
    "offload_layers": "offload-layers", "tiled_mlp": "tiled-mlp", "loss": "loss", "kernel": "kernel",
    "time_limit": "time-limit",
}  # fmt: skip
# the typed pipeline settings: field -> key under pipeline:
_SETTINGS = {
    "run_name": "run_name", "model": "model", "fetch": "fetch", "base_length": "base_length", "factor": "factor",
    "baselines": "baselines", "kernel_fallback": "kernel_fallback", "stages": "stages", "needle_min": "needle_min",
    "needle_step": "needle_step", "needle_max": "needle_max",
}  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """A whole extension: the stages before the main one (:attr:`stages`), then the main stage at :attr:`target`
    tokens, every stage with the RoPE base :attr:`rope_theta`; the evaluations' lengths and baselines. Lengths in
    tokens, ``time_limit`` in seconds; None: the pipeline's or train.py's default."""

    target: int  # the main stage's sequence length, tokens
    base_length: int  # the model's native context, tokens (the evaluations' first length, the baselines' origin)
    rope_theta: float  # the RoPE base of the layers that see the whole sequence (the global ones of a hybrid model)
    run_name: str = "extend"
    model: str | None = None  # a local folder or hub id of the base model
    fetch: str | None = None  # a python -m easy_context.models.fetch name, when the model is fetched
    parallel_mode: str = "data_parallel"
    sp_size: int | None = None  # ranks per sequence (None: every process)
    micro_batch: int = 1  # sequences per micro-batch per data-parallel group
    grad_accum: int = 1
    steps: int = 400
    learning_rate: float = 2e-5
    warmup_steps: int = 20
    checkpointing: str = "full"
    offload_layers: int | None = None
    tiled_mlp: int | None = None
    loss: str | None = None
    kernel: str | None = None  # None: the pipeline's (fa4 when it imports, else kernel_fallback)
    time_limit: float | None = None
    factor: int | None = None  # the baselines' RoPE scaling factor (None: target / base_length)
    baselines: tuple[str, ...] = ("base", "rope_theta", "dynamic_ntk", "yarn")
    kernel_fallback: str = "cudnn"
    stages: tuple[Stage, ...] = ()
    needle_min: int | None = None
    needle_step: int | None = None
    needle_max: int | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)  # other train.py flags, as written
    settings: Mapping[str, Any] = field(default_factory=dict)  # other pipeline settings (micro: included), as written
    why: Mapping[str, str] = field(default_factory=dict, compare=False)  # YAML key -> where its value came from

    def __post_init__(self) -> None:
        object.__setattr__(self, "baselines", tuple(self.baselines))
        object.__setattr__(self, "stages", tuple(self.stages))
        _whole("seq-length", self.target, 1)
        _whole("pipeline.base_length", self.base_length, 1)
        if self.target <= self.base_length:
            raise ValueError(f"recipe seq-length: {self.target} does not extend pipeline.base_length "
                             f"{self.base_length}; give a longer seq-length (the target)")  # fmt: skip
        _number("rope-theta", self.rope_theta)
        if not isinstance(self.run_name, str) or not self.run_name:
            raise ValueError(f"recipe pipeline.run_name: expected a name, got {self.run_name!r}")
        _choice("parallel_mode", self.parallel_mode, _seq_algos())
        _whole("sp-size", self.sp_size, 1, optional=True)
        _whole("batch-size", self.micro_batch, 1)
        _whole("gradient-accumulate-every", self.grad_accum, 1)
        _whole("max-train-steps", self.steps, 1)
        _number("learning-rate", self.learning_rate)
        _whole("warmup-steps", self.warmup_steps, 0)
        _choice("checkpointing", self.checkpointing, _checkpoint_modes())
        _whole("offload-layers", self.offload_layers, 0, optional=True)
        _whole("tiled-mlp", self.tiled_mlp, 0, optional=True)
        _choice("kernel", self.kernel, _kernels(), optional=True)
        _choice("pipeline.kernel_fallback", self.kernel_fallback, _kernels())
        _number("time-limit", self.time_limit, positive=False, optional=True)
        _whole("pipeline.factor", self.factor, 1, optional=True)
        for name in self.baselines:
            _choice("pipeline.baselines", name, BASELINES)
        for key in ("needle_min", "needle_step", "needle_max"):
            _whole(f"pipeline.{key}", getattr(self, key), 1, optional=True)
        last = self.base_length
        for i, stage in enumerate(self.stages):
            if not isinstance(stage, Stage):
                raise ValueError(f"recipe pipeline.stages[{i}]: expected a Stage, got {stage!r}")
            if not last < stage.seq_length < self.target:
                raise ValueError(f"recipe pipeline.stages[{i}].seq-length: {stage.seq_length} must lie between the "
                                 f"previous length {last} and seq-length {self.target}")  # fmt: skip
            last = stage.seq_length

    @property
    def all_stages(self) -> tuple[Stage, ...]:
        """The stages before the main one, then the main stage itself (its values as a :class:`Stage`)."""
        main = Stage(self.target, self.steps, self.checkpointing, self.learning_rate, self.warmup_steps,
                     self.time_limit)  # fmt: skip
        return (*self.stages, main)

    @property
    def tokens(self) -> int:
        """Tokens of one sequence per step over every stage (x the data-parallel groups and micro-batch rows)."""
        return sum(s.tokens for s in self.all_stages)

    def with_(self, **changes: Any) -> Recipe:
        """A copy with ``changes`` (checked again)."""
        return replace(self, **changes)

    # --- YAML ---
    @classmethod
    def from_mapping(cls, recipe: Mapping[str, Any]) -> Recipe:
        """A recipe from the YAML's mapping (train_scripts/*.yaml); keys not typed here are kept as they are."""
        if not isinstance(recipe, Mapping):
            raise ValueError(f"recipe: expected a mapping of train.py flags, got {type(recipe).__name__}")
        top = {str(k).replace("_", "-") if k != PIPELINE_KEY and k != "parallel_mode" else k: v
               for k, v in recipe.items()}  # fmt: skip
        if "parallel-mode" in top:
            top["parallel_mode"] = top.pop("parallel-mode")
        section = top.pop(PIPELINE_KEY, None) or {}
        if not isinstance(section, Mapping):
            raise ValueError(f"recipe {PIPELINE_KEY}: expected a mapping of settings, got {section!r}")
        section = {str(k).replace("-", "_"): v for k, v in section.items()}
        values: dict[str, Any] = {}
        for name, key in _FLAGS.items():
            if top.get(key) is not None:
                values[name] = top.pop(key)
            top.pop(key, None)
        for name, key in _SETTINGS.items():
            if section.get(key) is not None:
                values[name] = section.pop(key)
            section.pop(key, None)
        for required, key in (("target", "seq-length"), ("rope_theta", "rope-theta"),
                              ("base_length", "pipeline.base_length")):  # fmt: skip
            if required not in values:
                raise ValueError(f"recipe {key}: missing (every recipe sets it)")
        if isinstance(values.get("baselines"), str):  # extend.sh's word list
            values["baselines"] = values["baselines"].split()
        if "baselines" in values and not isinstance(values["baselines"], (list, tuple)):
            raise ValueError(f"recipe pipeline.baselines: expected a list of names, got {values['baselines']!r}")
        stages = values.get("stages", ())
        if not isinstance(stages, (list, tuple)):
            raise ValueError(f"recipe pipeline.stages: expected a list of stages, got {stages!r}")
        values["stages"] = tuple(Stage.from_mapping(s, f"pipeline.stages[{i}]") for i, s in enumerate(stages))
        if isinstance(values.get("rope_theta"), int):
            values["rope_theta"] = float(values["rope_theta"])
        return cls(**values, flags=top, settings=section)

    def to_mapping(self) -> dict[str, Any]:
        """The YAML's mapping: the main stage's flags, then ``pipeline:`` (None values left out)."""
        out: dict[str, Any] = {}
        for name, key in _FLAGS.items():
            if getattr(self, name) is not None:
                out[key] = getattr(self, name)
        out.update(self.flags)
        section: dict[str, Any] = {}
        for name, key in _SETTINGS.items():
            value = getattr(self, name)
            if name == "stages":
                value = [s.to_mapping() for s in value] or None
            elif name == "baselines":
                value = list(value)
            if value is not None:
                section[key] = value
        out[PIPELINE_KEY] = section | dict(self.settings)
        return out

    @classmethod
    def load(cls, path: str | Path, flag: str = "--config") -> Recipe:
        """A recipe from a YAML file (one-line ValueError for an unreadable file, naming ``flag``: the option that
        gave the path, or for a bad value)."""
        try:
            return cls.from_mapping(load_recipe(str(path), flag))
        except ValueError as exc:
            message = str(exc)
            raise ValueError(message if message.startswith(flag) else f"{path}: {message}") from None

    def to_yaml(self, header: str = "") -> str:
        """The recipe as YAML text, each value with its :attr:`why` as a comment (``header``: comment lines first)."""
        lines = [f"# {line}".rstrip() for line in header.splitlines()]
        lines += _emit(self.to_mapping(), _comments(self), "", 0)
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path, header: str = "") -> Path:
        """:meth:`to_yaml` into ``path`` (its folder made)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(header), encoding="utf-8")
        return path


def _comments(recipe: Recipe) -> dict[str, str]:
    """YAML key path -> comment: the recipe's whys (``pipeline.stages[0].max-train-steps``, ``rope-theta``, ...)."""
    out = dict(recipe.why)
    for i, stage in enumerate(recipe.stages):
        out.update({f"{PIPELINE_KEY}.stages[{i}].{k}": v for k, v in stage.why.items()})
    return out


def _scalar(value: Any) -> str:
    """One value in YAML flow style (a list as ``[a, b]``); floats keep a dot so YAML reads them back as floats."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _emit(mapping: Mapping[str, Any], comments: Mapping[str, str], path: str, indent: int) -> list[str]:
    """Block-style YAML lines of ``mapping`` at ``indent``, a comment after each value that ``comments`` names."""
    pad, lines = " " * indent, []
    for key, value in mapping.items():
        where = f"{path}{key}"
        note = f"  # {comments[where]}" if where in comments else ""
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:{note}")
            lines += _emit(value, comments, f"{where}.", indent + 2)
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            lines.append(f"{pad}{key}:{note}")
            for i, item in enumerate(value):
                sub = _emit(item, comments, f"{where}[{i}].", indent + 4)
                lines += [f"{pad}  - {sub[0].lstrip()}", *sub[1:]]
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}{note}")
    return lines


__all__ = ["BASELINES", "Recipe", "Stage", "format_length", "parse_length"]
