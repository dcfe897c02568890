"""What the extension pipeline checks before any stage runs: every training run of the resolved settings passes
train.py's layout check (:mod:`easy_context.extend.layout`) for the model's config, a model to fetch can be, and the
attention kernels it would pass (:func:`run_kernels`) can run on this machine (:func:`machine_problem`: no CUDA
kernel without a CUDA GPU, no fa4 without Hopper or Blackwell).

    line = preflight(resolve("r.yaml"))  # "layout: ... passes"; SettingsError (one line naming the fix) otherwise
    problem = machine_problem(settings, probe_machine("python", env))  # None, or one line naming the fix
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from easy_context.extend.layout import LayoutError, PlanLayout, Run
from easy_context.extend.settings import Settings, SettingsError


def recipe_layout(settings: Settings) -> PlanLayout:
    """How the pipeline launches train.py: PARALLEL_MODE (else the recipe's parallel_mode, else train.py's
    default) on NPROC processes, the recipe's sp-size and ring_degree."""
    from easy_context.training.flags import DEFAULT_PARALLEL_MODE
    from easy_context.training.recipe import load_recipe

    flags = {str(k).replace("-", "_"): v for k, v in load_recipe(settings.recipe).items()}
    mode = settings.parallel_mode or DEFAULT_PARALLEL_MODE  # the recipe's parallel_mode is PARALLEL_MODE's default
    options = {"ring_degree": flags["ring_degree"]} if flags.get("ring_degree") and mode == "usp_attn" else {}
    return PlanLayout(mode, settings.nproc, flags.get("sp_size"), options)


def training_runs(settings: Settings) -> list[Run]:
    """The train.py runs the pipeline would start (their stage names and lengths), as Pipeline.run orders them."""
    s = settings
    if not s.train:
        return []
    runs = [Run(stage.name(i), stage.seq) for i, stage in enumerate(s.stages)] + [Run("extended", s.target)]
    if s.target2:
        runs.append(Run(f"extended_{s.target2}", int(s.target2)))
    if s.control and s.only != "train":
        runs.append(Run("control", s.base_length))
    return runs


def settings_config(settings: Settings) -> Any | None:
    """The config of the model the runs train, from what is there without loading weights: the miniature's own
    (MICRO=1), MODEL's config.json or GGUF file, the fetch source's shipped config, a hub id in the local cache;
    None when none is (the heads are then checked when the run starts)."""
    from transformers import AutoConfig

    from easy_context.extend.derive import model_config
    from easy_context.models.fetch import find_source

    s = settings
    if os.path.isfile(os.path.join(s.model, "config.json")):
        try:
            return model_config(s.model)
        except ValueError:  # not a config transformers reads: the run itself will say why
            return None
    if s.micro:
        from easy_context.extend.micro import micro_config
        from easy_context.models.shapes import PRESETS

        spec = s.micro_model
        if spec.startswith("{"):
            import json

            return micro_config(json.loads(spec))
        if spec in PRESETS:
            model_type, values = PRESETS[spec]
            return micro_config({"model_type": model_type, **values})
        return None
    if s.model.endswith(".gguf") and os.path.isfile(s.model):
        try:
            from easy_context.models.gguf import load_gguf_config

            return load_gguf_config(s.model)
        except (ImportError, RuntimeError, ValueError):
            return None
    source = find_source(s.fetch) if s.fetch else None
    if source is not None and source.config:
        return model_config(dict(source.config))
    try:
        return AutoConfig.from_pretrained(s.model, local_files_only=True)
    except (OSError, ValueError):
        return None


def fetch_problem(settings: Settings) -> str | None:
    """Why the fetch stage would fail before it starts (gguf missing), else None."""
    s = settings
    if s.micro or not s.fetch or os.path.isfile(os.path.join(s.model, "config.json")):
        return None
    try:
        import gguf  # noqa: F401
    except ImportError:
        return f"fetching {s.fetch} needs the gguf package: pip install gguf (requirements.txt pins it)"
    return None


def preflight(settings: Settings) -> str:
    """The line saying that every training run passes train.py's layout check; SettingsError naming the recipe and
    the fix when one would not, or when the fetch cannot run."""
    problem = fetch_problem(settings)
    if problem:
        raise SettingsError(f"{settings.recipe}: {problem}")
    layout = recipe_layout(settings)
    config = settings_config(settings)
    runs = training_runs(settings)
    control = (" (or pipeline.control: 0 / CONTROL=0: the control trains at the native length)"
               if any(r.name == "control" for r in runs) else "")  # fmt: skip
    try:
        line = layout.check(config, runs)
    except LayoutError as exc:
        where = "the micro: section's" if settings.micro else "the recipe's"
        raise SettingsError(f"{settings.recipe}: {exc} ({where} lengths, NPROC, parallel_mode){control}") from None
    return line


# what the interpreter that runs the stages reports of its machine: each CUDA GPU's compute capability, and (with one)
# whether flash-attn-4 imports; one JSON line
MACHINE_PROBE = """import json, torch
caps = [list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]
fa4 = False
if caps:
    try:
        from flash_attn.cute import flash_attn_func
        fa4 = True
    except Exception:
        pass
print(json.dumps({"capabilities": caps, "fa4": fa4}))
"""


@dataclass(frozen=True)
class Machine:
    """This machine as the stages' interpreter sees it: each CUDA GPU's compute capability (none: no CUDA GPU), and
    whether flash-attn-4 imports."""

    capabilities: tuple[tuple[int, int], ...]
    fa4_imports: bool


def probe_machine(python: str, env: Mapping[str, str]) -> Machine | None:
    """What ``python`` (the stages' interpreter) reports of this machine; None when it reports nothing readable (its
    stages then say why they cannot run)."""
    try:
        res = subprocess.run([python, "-c", MACHINE_PROBE], env=dict(env), capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        report = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 and res.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not isinstance(report, dict):
        return None
    return Machine(tuple(tuple(c) for c in report.get("capabilities", [])), bool(report.get("fa4")))


def run_kernels(settings: Settings, machine: Machine | None) -> tuple[tuple[str, str], tuple[str, str]]:
    """(kernel, the setting that chose it) of the training runs and of the evaluations: KERNEL (the recipe's
    ``kernel:``), else cpu on DEVICE=cpu, else fa4 where it imports and runs, else KERNEL_FALLBACK; the evaluations'
    EVAL_KERNEL, else the training's."""
    from easy_context.kernels import machine_reason

    s = settings
    if s.kernel:
        train = (s.kernel, "KERNEL")
    elif s.device == "cpu":
        train = ("cpu", "DEVICE")
    elif machine and machine.fa4_imports and not machine_reason("fa4", "cuda", machine.capabilities, True):
        train = ("fa4", "KERNEL")  # KERNEL unset: fa4 where it runs
    else:
        train = (s.kernel_fallback, "KERNEL_FALLBACK")
    return train, ((s.eval_kernel, "EVAL_KERNEL") if s.eval_kernel else train)


_WHERE = {"KERNEL": "KERNEL, the recipe's kernel:", "EVAL_KERNEL": "EVAL_KERNEL", "DEVICE": "DEVICE=cpu",
          "KERNEL_FALLBACK": "KERNEL_FALLBACK, the recipe's pipeline.kernel_fallback, as KERNEL is unset"}  # fmt: skip


def machine_problem(settings: Settings, machine: Machine | None) -> str | None:
    """Why this machine cannot run the kernels the stages would pass (a CUDA kernel without a CUDA GPU or on
    DEVICE=cpu, fa4 without Hopper or Blackwell), as one line naming the setting to change; None when nothing known
    forbids them (``machine`` None: only what the settings alone decide)."""
    from easy_context.kernels import machine_reason

    s = settings
    capabilities = machine.capabilities if machine else None
    for (kernel, setting), role in zip(run_kernels(s, machine), ("training runs'", "evaluations'")):
        reason = machine_reason(kernel, s.device, capabilities, machine.fa4_imports if machine else None)
        if reason is None:
            continue
        if s.device != "cpu" and capabilities == ():
            fix = ("DEVICE=cpu (the recipe's pipeline.device) runs every stage on CPU with the cpu kernel (--micro: "
                   "the plan's CPU miniature), or run it on a machine with a CUDA GPU")  # fmt: skip
        else:
            fix = f"{setting}={'cpu' if s.device == 'cpu' else 'auto'} (one that runs here)"
        return f"the {role} attention kernel {kernel!r} ({_WHERE[setting]}) cannot run here: {reason}; fix: {fix}"
    return None
