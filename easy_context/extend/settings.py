"""The extension pipeline's settings: a recipe's ``pipeline:`` section under the environment, with their defaults.

An environment variable of a setting's name in upper case wins over the recipe (also when it is set and empty); a
setting neither gives takes its default. Values are kept as the text a shell would see (a recipe's ``true`` is
``1``, a list of words is the words joined by spaces), so that commands carry them exactly as written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easy_context.eval.gain import SHORTER_ROUTE
from easy_context.extend.micro import micro_name, micro_settings
from easy_context.extend.recipe import BASELINES
from easy_context.launch_configs import ZERO3_OFFLOADS
from easy_context.tasks.ruler.builders import TASKS
from easy_context.training import recipe as recipe_io

DEFAULT_BASELINES = "base rope_theta dynamic_ntk yarn"
# RULER's tasks that separate training from free RoPE scaling, run for every model by default (docs/extension.md):
# multi-key needle with distractor needles, multi-value, variable tracking (multi-hop), frequent words (aggregation)
SEPARATING_TASKS = "niah_multikey_1,niah_multivalue,vt,fwe"
ONLY = ("", "before", "train")  # ONLY=before: the before-evaluations alone; ONLY=train: the model, data, training


class SettingsError(ValueError):
    """A recipe or setting the pipeline cannot run with; its message is one line naming the fix."""


def shell_text(value: Any) -> str:
    """A recipe value as the text its shell variable held (booleans 1/0, None empty, a word list space-joined, a
    mapping or nested list as JSON)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return " ".join(map(str, value))
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


class Values:
    """Settings looked up as the shell did: the environment first, then the recipe."""

    def __init__(self, recipe_settings: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self.values = {key.upper(): shell_text(value) for key, value in recipe_settings.items()}
        self.values.update(env)

    def get(self, name: str, default: str = "") -> str:
        """The value, or ``default`` when it is unset or empty (``${NAME:-default}``)."""
        return self.values.get(name) or default

    def unless_set(self, name: str, default: str) -> str:
        """The value, or ``default`` only when it is unset: empty means none (``${NAME-default}``)."""
        return self.values[name] if name in self.values else default

    def integer(self, name: str, default: int | None = None) -> int:
        """The value as an integer (lengths, counts); a one-line error naming the setting otherwise."""
        text = self.get(name, "" if default is None else str(default))
        try:
            return int(text)
        except ValueError:
            raise SettingsError(f"{name}={text!r} is not a whole number (set {name} or the recipe's "
                                f"pipeline.{name.lower()} to one)") from None  # fmt: skip


@dataclass(frozen=True)
class Stage:
    """A stage trained before the main one: its length, steps and train.py flags (``--flag=value`` words)."""

    seq: int
    steps: int
    flags: list[str]

    def name(self, index: int) -> str:
        return f"stage{index + 1}_{self.seq}"


@dataclass
class Settings:
    """Everything the pipeline reads from the recipe and the environment, resolved (see train_scripts/extend.sh's
    header for each setting's meaning)."""

    recipe: str
    name: str
    work: str
    results: str
    device: str
    model: str
    fetch: str
    wheels: str
    target: int
    base_length: int
    theta: str
    factor: str
    recall: str
    recall_kinds: str
    corpus_chars: str
    num_proc: str
    train_chunk_s: str
    steps: str
    recipe_steps: str
    needle_min: str
    needle_step: str
    needle_max: str
    samples: str
    distractor_samples: str
    short: str
    ppl_samples: str
    ppl_max: str
    baselines: list[str]
    control: bool
    control_steps: str
    target2: str
    steps2: str
    lr2: str
    warmup2: str
    theta2: str
    train2_s: str
    long: str
    long_min: str
    long_step: str
    long_samples: str
    long_scalings: str
    ruler: bool
    ruler_samples: str
    ruler_max_new: str
    ruler_lengths: str
    ruler_native: str
    ruler_tasks: str
    kernel_fallback: str
    kernel: str
    eval_kernel: str
    nproc: int
    parallel_mode: str
    train: bool
    micro: bool
    micro_model: str
    only: str
    eval_partial: bool
    omp_num_threads: str
    keep_going: bool = False  # KEEP_GOING=1: a failed stage does not stop the others (the exit status still says it)
    optim: str = "ddp"  # the planner's optimizer placement (easy_context.plan's --optim)
    stages: list[Stage] = field(default_factory=list)
    stage_yarn: bool = False  # the shorter route: the last stage's model, YaRN to TARGET, on the same prompts

    def stage_yarn_scaling(self) -> str:
        """The shorter route's scaling: YaRN from the last stage's length to TARGET."""
        seq = self.stages[-1].seq
        return f"yarn:{self.target // seq}:{seq}"

    @property
    def mixed(self) -> str:
        return "no" if self.device == "cpu" else "bf16"

    @property
    def train_args(self) -> list[str]:
        """train.py flags of every training run before the recipe's own: compiled on a GPU, frequent saves on CPU;
        the optimizer state in host memory for OPTIM=host_adamw, fp32 weights for ZeRO-3 on CPU."""
        optimizer = ["--optimizer", "host_adamw"] if self.optim == "host_adamw" else []
        if self.device == "cpu" and self.optim in ZERO3_OFFLOADS:  # DeepSpeed: a bf16 model needs bf16 mixed precision
            optimizer += ["--dtype", "float32"]
        return (["--save-every", "2"] if self.micro else ["--compile"]) + optimizer

    def launch(self, python: str, launch_config: str | None = None) -> list[str]:
        """One process runs train.py itself; N go through easy_context.launch (one readable line when ranks fail);
        a ZeRO-3 OPTIM through it with ``launch_config`` (launch_configs.zero3_config), on any number."""
        common = ["--num_processes", str(self.nproc), "--num_machines", "1", "--mixed_precision", self.mixed,
                  "--dynamo_backend", "no"]  # fmt: skip
        if self.optim in ZERO3_OFFLOADS:
            if not launch_config:
                raise SettingsError(f"OPTIM={self.optim} launches through a DeepSpeed config; none was written")
            return [python, "-m", "easy_context.launch", "--config_file", launch_config, *common]
        if self.nproc <= 1:
            return [python]
        return [python, "-m", "easy_context.launch", "--multi_gpu", *common]

    @property
    def par(self) -> list[str]:
        return ["--parallel_mode", self.parallel_mode] if self.parallel_mode else []

    def tokens(self) -> int:
        """The tokens of every stage together (the main stage at the recipe's or STEPS' steps)."""
        main = self.target * int(self.steps or self.recipe_steps)
        return main + sum(stage.seq * stage.steps for stage in self.stages)

    def control_step_count(self) -> str:
        """CONTROL_STEPS, else as many steps at TARGET tokens a step as all stages' tokens (rounded up)."""
        return self.control_steps or str(-(-self.tokens() // self.target))

    def ruler_lengths_to(self, longest: int) -> str:
        """RULER_LENGTHS, else half the base length and the powers of two from the base length up to ``longest``."""
        lengths, n = [self.base_length // 2], self.base_length
        while n <= longest:
            lengths.append(n)
            n *= 2
        return self.ruler_lengths or ",".join(map(str, lengths))

    def long_scaling_list(self) -> list[str]:
        """The beyond-length needle's scalings: LONG_SCALINGS, else as is and YaRN over the trained length."""
        return (self.long_scalings or f"none yarn:{int(self.long) // self.target}:{self.target}").split()

    def long_base_scaling(self) -> str:
        """The base's scaling for the needle beyond the trained length: YaRN at the full factor, LONG / BASE_LENGTH
        (the training-free route to the same lengths)."""
        return f"yarn:{int(self.long) // self.base_length}:{self.base_length}"


def work_folder(name: str) -> str:
    """WORK's default: the work folder of the run called ``name`` (its results in WORK/results, its recipe there)."""
    return f"out/extend_{name}"


def baseline_args(name: str, settings: Settings) -> list[str]:
    """The evaluation flags of a baseline (none for a trained model); SettingsError for an unknown name."""
    if name in ("base", "extended", "control") or name.startswith("extended_"):
        return []
    if name == SHORTER_ROUTE:
        return ["--rope_scaling", settings.stage_yarn_scaling()]
    flags = {
        "rope_theta": ["--rope_theta", settings.theta],
        "linear": ["--rope_scaling", f"linear:{settings.factor}"],
        "dynamic_ntk": ["--rope_scaling", f"dynamic:{settings.factor}:{settings.base_length}"],
        "yarn": ["--rope_scaling", f"yarn:{settings.factor}:{settings.base_length}"],
    }
    if name not in flags:
        raise SettingsError(f"unknown baseline {name!r} (BASELINES or the recipe's pipeline.baselines: a list of "
                            f"{', '.join(BASELINES)}; none: an empty list)")  # fmt: skip
    return flags[name]


def recipe_stages(settings: Mapping[str, Any]) -> list[Stage]:
    """The recipe's ``stages`` as Stage records (train.py flags as one ``--flag=value`` word each)."""
    return [Stage(seq, steps, " ".join(tokens).split()) for seq, steps, tokens in recipe_io.pipeline_stages(settings)]


def resolve(recipe_path: str, env: Mapping[str, str] | None = None) -> Settings:
    """The pipeline's settings of ``recipe_path`` under ``env`` (default: this process's environment), each with the
    default train_scripts/extend.sh gives it; SettingsError (one line) for a recipe or value it cannot run with."""
    env = dict(os.environ if env is None else env)
    micro = env.get("MICRO", "") == "1"
    try:
        recipe = recipe_io.load_recipe(recipe_path)
        section = recipe_io.pipeline_settings(recipe, micro)
        if micro:  # its own folders and model: never the real run's
            section = micro_settings(section, (recipe.get(recipe_io.PIPELINE_KEY) or {}).get("micro") or {})
        stages = recipe_stages(section)
    except ValueError as exc:
        raise SettingsError(f"{recipe_path}: {exc}") from None
    section.pop("stages", None)
    bad = [key for key in section if not key.replace("_", "").isalnum() or key[0].isdigit()]
    if bad:
        raise SettingsError(f"{recipe_path}: pipeline: {bad[0]!r} is not a usable setting name (letters, digits, _)")
    v = Values(section, env)
    for name, fix in (("TARGET", "seq-length"), ("BASE_LENGTH", "pipeline.base_length"), ("THETA", "rope-theta")):
        if not v.get(name):
            raise SettingsError(f"{recipe_path}: the recipe sets no {fix} (add it, or set {name})")
    target, base_length = v.integer("TARGET"), v.integer("BASE_LENGTH")
    if target <= 0 or base_length <= 0:
        raise SettingsError(f"{recipe_path}: TARGET and BASE_LENGTH must be positive, got {target}, {base_length}")
    name = v.get("RUN_NAME", Path(recipe_path).name.removesuffix(".yaml"))
    name = micro_name(name) if micro else name
    work = v.get("WORK", work_folder(name))
    device = v.get("DEVICE", "cuda")
    samples = v.get("SAMPLES", "5")
    nproc = v.integer("NPROC", 1)
    target2 = v.get("TARGET2")
    long = v.unless_set("LONG", str(target * 2))
    long = "" if long == "0" else long  # 0 or empty: no needle beyond the trained length
    if micro and target2:  # CPU: the second stage at twice the miniature's target
        target2 = str(target * 2)
    settings = Settings(
        recipe=recipe_path,
        name=name,
        work=work,
        results=v.get("RESULTS", f"{work}/results"),
        device=device,
        model=v.get("MODEL", f"{work}/base"),
        fetch=v.get("FETCH"),
        wheels=v.get("WHEELS"),
        target=target,
        base_length=base_length,
        theta=v.get("THETA"),
        factor=v.get("FACTOR", str(target // base_length)),
        recall=v.get("RECALL", "0.5"),
        recall_kinds=v.get("RECALL_KINDS", "single,many_keys,many_values,chain"),
        corpus_chars=v.get("CORPUS_CHARS", "1.6e8"),
        num_proc=v.get("NUM_PROC", "12"),
        train_chunk_s=v.get("TRAIN_CHUNK_S", "540"),
        steps=v.get("STEPS"),
        recipe_steps=v.get("RECIPE_STEPS", "400"),
        needle_min=v.get("NEEDLE_MIN", str(base_length)),
        needle_step=v.get("NEEDLE_STEP", str(base_length)),
        needle_max=v.get("NEEDLE_MAX", str(target)),
        samples=samples,
        distractor_samples=str(v.integer("DISTRACTOR_SAMPLES", 2)),
        short=v.get("SHORT", "2048"),
        ppl_samples=v.get("PPL_SAMPLES"),
        ppl_max=v.get("PPL_MAX", str(target)),
        baselines=v.unless_set("BASELINES", DEFAULT_BASELINES).split(),
        control=v.get("CONTROL", "1") == "1",
        control_steps=v.get("CONTROL_STEPS"),
        target2=target2,
        steps2=v.get("STEPS2", "60"),
        lr2=v.get("LR2", "3e-5"),
        warmup2=v.get("WARMUP2", "5"),
        theta2=v.get("THETA2"),
        train2_s=v.get("TRAIN2_S", "300"),
        long=long,
        long_min=v.get("LONG_MIN", str(target + target // 4)),
        long_step=v.get("LONG_STEP", str(target // 4)),
        long_samples=v.get("LONG_SAMPLES", samples),
        long_scalings=v.get("LONG_SCALINGS"),
        ruler=v.get("RULER", "1") == "1",
        ruler_samples=v.get("RULER_SAMPLES", "5"),
        ruler_max_new=v.get("RULER_MAX_NEW", "64"),
        ruler_lengths=v.get("RULER_LENGTHS"),
        ruler_native=v.get("RULER_NATIVE", str(base_length)),
        ruler_tasks=v.get("RULER_TASKS", SEPARATING_TASKS),
        kernel_fallback=v.get("KERNEL_FALLBACK", "cudnn"),
        kernel=v.get("KERNEL"),
        eval_kernel=v.get("EVAL_KERNEL"),
        nproc=nproc,
        parallel_mode=v.get("PARALLEL_MODE") or ("zigzag_ring_attn" if nproc > 1 else ""),
        train=v.get("TRAIN", "1") == "1",
        micro=micro,
        micro_model=v.get("MICRO_MODEL", "tiny-llama"),
        only=v.get("ONLY"),
        eval_partial=v.get("EVAL_PARTIAL") == "1",
        omp_num_threads=v.get("OMP_NUM_THREADS", "2"),
        keep_going=v.get("KEEP_GOING") == "1",
        optim=v.get("OPTIM", "ddp"),
        stages=stages,
        stage_yarn=v.get("STAGE_YARN") == "1",
    )
    optims = ("ddp", "host_adamw", *ZERO3_OFFLOADS)
    if settings.optim not in optims:
        raise SettingsError(f"{recipe_path}: OPTIM={settings.optim!r} (pipeline.optim) is not one of "
                            f"{', '.join(optims)}")  # fmt: skip
    if settings.only not in ONLY:
        raise SettingsError(f"{recipe_path}: ONLY={settings.only!r}: give before (the before-evaluations), train (the "
                            "model, data and training stages) or nothing (every stage)")  # fmt: skip
    if settings.stage_yarn and not any(stage.seq < target for stage in stages):
        raise SettingsError(
            f"{recipe_path}: STAGE_YARN (pipeline.stage_yarn) evaluates the last stage before the "
            "target with YaRN; the recipe has no stage shorter than its target (drop it or add one)"
        )
    for baseline in settings.baselines:
        baseline_args(baseline, settings)  # an unknown name stops here, before any stage runs
    if settings.long:
        Values({}, {"LONG": settings.long}).integer("LONG")
    unknown = [t for t in settings.ruler_tasks.split(",") if t.strip() not in (*TASKS, "all")]
    if unknown:
        raise SettingsError(f"{recipe_path}: RULER_TASKS (pipeline.ruler_tasks): unknown task(s) {unknown}; give "
                            f"comma-separated names of {', '.join(TASKS)}, or all")  # fmt: skip
    return settings
