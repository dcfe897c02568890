"""Memory planner: the byte budget of one training step and the longest trainable context, before renting GPUs.

``python -m easy_context.plan --model <config.json|hub-id|preset> --gpus N --gpu-mem 80GB --host-mem 1TB``; every
assumption, and the validation against measured probes, is in docs/planner.md. The modules:
:mod:`easy_context.models.shapes` (model shapes, sizes), :mod:`.options` (memory options), :mod:`.setup` (the run's
hardware and settings), :mod:`.budget` (a step's byte budget), :mod:`.terms` (the terms of each phase of a step),
:mod:`.solve` (the longest S), :mod:`.validate` (anchors, probes), :mod:`.report` (text), :mod:`.cli` (the command
line)."""

from easy_context.models.resolve import load_model_shape
from easy_context.models.shapes import (
    ALIASES,
    BUILTIN_MODELS,
    GB,
    GIB,
    PRESETS,
    ModelShape,
    parse_size,
)
from easy_context.plan.budget import Budget, Term
from easy_context.plan.cli import build_parser, main
from easy_context.plan.options import (
    CHECKPOINTING,
    OPTION_BY_NAME,
    OPTIONS,
    MemOption,
    allowed_configs,
    config_name,
    parse_config,
)
from easy_context.plan.report import (
    OPTIM_CONFIGS,
    format_breakdown,
    format_header,
    format_run,
    format_summary,
    train_flags,
)
from easy_context.plan.setup import (
    LOSS_CHUNK,
    MAX_LIVE_PARAMETERS,
    NORM_CHUNK_ROWS,
    NORM_CHUNK_TEMPS,
    NORMS,
    OPTIMS,
    SUB_GROUP_SIZE,
    Setup,
    mode_layout,
)
from easy_context.plan.solve import (
    MODES,
    ROUND_TOKENS,
    Prediction,
    best_prediction,
    budget_at,
    plan,
    predict,
    split_offload_layers,
)
from easy_context.plan.terms import build_budget
from easy_context.plan.validate import (
    ANCHORS,
    PROBE_OPTIMIZERS,
    anchors,
    format_anchors,
    format_validation,
    read_probes,
    validate_probe,
)

__all__ = [
    # shapes
    "ALIASES", "BUILTIN_MODELS", "GB", "GIB", "PRESETS", "ModelShape", "load_model_shape", "parse_size",
    # options
    "CHECKPOINTING", "OPTION_BY_NAME", "OPTIONS", "MemOption", "allowed_configs", "config_name", "parse_config",
    # setup, budget, terms
    "LOSS_CHUNK", "MAX_LIVE_PARAMETERS", "NORM_CHUNK_ROWS", "NORM_CHUNK_TEMPS", "NORMS", "OPTIMS", "SUB_GROUP_SIZE",
    "Budget", "Setup", "Term", "build_budget", "mode_layout",
    # solve
    "MODES", "ROUND_TOKENS", "Prediction", "best_prediction", "budget_at", "plan", "predict", "split_offload_layers",
    # validate
    "ANCHORS", "PROBE_OPTIMIZERS", "anchors", "format_anchors", "format_validation", "read_probes", "validate_probe",
    # report
    "OPTIM_CONFIGS", "format_breakdown", "format_header", "format_run", "format_summary", "train_flags",
    # cli
    "build_parser", "main",
]  # fmt: skip
