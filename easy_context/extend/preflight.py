"""What the extension pipeline checks before any stage runs: every training run of the resolved settings passes
train.py's layout check (:mod:`easy_context.extend.layout`) for the model's config, and a model to fetch can be.

    line = preflight(resolve("r.yaml"))  # "layout: ... passes"; SettingsError (one line naming the fix) otherwise
"""

from __future__ import annotations

import os
from typing import Any

from easy_context.extend.layout import LayoutError, PlanLayout, Run
from easy_context.extend.settings import Settings, SettingsError


def recipe_layout(settings: Settings) -> PlanLayout:
    """How the pipeline launches train.py: PARALLEL_MODE (else the recipe's parallel_mode, else train.py's
    default) on NPROC processes, the recipe's sp-size and ring_degree."""
    from easy_context.training.flags import DEFAULT_PARALLEL_MODE
    from easy_context.training.recipe import load_recipe

    flags = {str(k).replace("-", "_"): v for k, v in load_recipe(settings.recipe).items()}
    mode = settings.parallel_mode or flags.get("parallel_mode") or DEFAULT_PARALLEL_MODE
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
