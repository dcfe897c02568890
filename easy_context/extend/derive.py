"""A recipe for any model: :func:`derive` reads a model's config and the hardware, and returns the :class:`Recipe`
with, per stage, the planner's answer (:class:`StagePlan`). Every rule is a constant or a small function here, its
source in docs/extension.md; every derived value carries its why (a comment in the written YAML).

Rules, in order: the native length (the config's RoPE limit); the stages (x :data:`STAGE_FACTOR` per stage); the RoPE
base (the stable Men et al. bound at the target x :data:`ROPE_MARGIN`, rounded up); the tokens (Fu et al.'s 0.5B at
7B, in proportion to the parameters) split equally over the stages; the learning rate (a power law through the
PI paper's 7B and 65B rates); the warmup; the launch layout and memory options (the planner: the first optimizer
placement, memory option and SP degree, cheapest first, that fits the target; Ulysses where the heads divide); the
time (FLOPs per token at :data:`MFU`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from easy_context.extend import estimate
from easy_context.extend.layout import LayoutError, PlanLayout, Run, next_multiple
from easy_context.extend.micro import micro_section
from easy_context.extend.recipe import Recipe, Stage, format_length
from easy_context.extend.rope_base import stable_rope_base
from easy_context.models.config import get_rope_theta, layer_windows, rope_position_limit, text_config
from easy_context.models.shapes import GB, ModelShape, parse_size
from easy_context.plan.options import OPTIONS, parse_config
from easy_context.plan.report import train_flags
from easy_context.plan.setup import Setup
from easy_context.plan.solve import Prediction, best_prediction, budget_at, predict
from easy_context.training.flops import Gpu, train_flops_per_token

STAGE_FACTOR = 4  # each stage at most 4x the length trained before it (Llama 3.1, LongRoPE: progressive extension)
ROPE_MARGIN = 2.0  # x the stable bound: Gemma 3 kept 1.8x it at 32K, Llama 3 2.8x at 8K
NICE = (1.0, 2.0, 2.5, 5.0)  # a derived base is rounded up to one of these x 10^k
TOKENS_AT_7B = 0.5e9  # Fu et al. 2024: 0.5B tokens take Llama-2-7B from 4K to 128K
LR_ANCHORS = ((7e9, 2e-5), (65e9, 1e-5))  # Chen et al. 2023 (Position Interpolation): 2e-5 for 7B/13B, 1e-5 for 65B
WARMUP_STEPS = 20  # PI and YaRN: 20 linear warmup steps
WARMUP_FRACTION = 0.1  # a short stage: a tenth of its steps
# the planner's memory configurations, cheapest in time first: the chunked loss costs nothing, MLP tiles little,
# offloading layer inputs a host copy each
CONFIGS = (
    "full+chunked",
    "full+tiled+chunked",
    "offload+chunked",
    "offload+tiled+chunked",
    "offload-split+tiled+chunked",
)
# the planner's optimizer placements, fastest first; host_adamw (fp32 master and moments in host memory, no DeepSpeed)
# on one GPU only, before ZeRO-3's optimizer offload: the same bytes there
OPTIMS = ("ddp", "zero3", "host_adamw", "zero3_offload_optimizer", "zero3_offload")
SP_MODES = ("ulysses_attn", "zigzag_ring_attn")  # Ulysses where the heads divide the degree, else the ring
MFU = 0.25  # measured: 32 % (SmolLM2 64K, no recompute) and 22 % (Gemma 3 256K, full recompute) on one H200


@dataclass(frozen=True)
class StagePlan:
    """The planner's answer for one stage: layout, memory option, bytes, and the time estimate."""

    seq_length: int
    steps: int
    tokens: int  # seq_length x steps x data-parallel groups
    mode: str
    sp_size: int
    optim: str
    config: str  # the planner's memory configuration (full, offload+tiled+chunked, ...)
    max_seq: int  # the planner's longest S at this layout and option
    gpu_bytes: float  # per GPU at seq_length
    host_bytes: float  # per node
    step_seconds: float  # at MFU
    train_flags: str  # what the planner's row means on train.py's command line

    @property
    def seconds(self) -> float:
        return self.step_seconds * self.steps


@dataclass(frozen=True)
class Derived:
    """A derived recipe, the plan of each of its stages (the main one last), and the model's native length."""

    recipe: Recipe
    plans: tuple[StagePlan, ...]
    native: int
    hardware: str
    gpu: Gpu  # the named GPU: its dense bf16 peak times the step estimates
    config: PretrainedConfig  # the model's text config (FLOPs per token)
    layout: str = ""  # the line saying every training run passes train.py's layout check

    @property
    def peak_flops(self) -> float:
        return self.gpu.tflops * 1e12


def model_config(model: str | Mapping[str, Any] | PretrainedConfig) -> PretrainedConfig:
    """The text config of a config dict (``model_type`` and its fields), a PretrainedConfig, a local folder or
    config.json, a name ``easy-context-fetch --list`` prints (its folder once it holds the source's model, else the
    config shipped with the source: never a miniature's or another model's), or a hub id already in the local cache
    (never downloads)."""
    from easy_context.models.fetch import SOURCES, find_source, holds

    if isinstance(model, PretrainedConfig):
        return text_config(model)
    if isinstance(model, Mapping):
        values = dict(model)
        if "model_type" not in values:
            raise ValueError("model config: needs its model_type (llama, qwen2, gemma3_text, ...)")
        return text_config(AutoConfig.for_model(values.pop("model_type"), **values))
    source = find_source(model) if not os.path.exists(model) else None
    if source is not None:
        fetched = os.path.join(source.default_dest, "config.json")
        return model_config(fetched if holds(source) else source.config)
    path = os.path.dirname(model) if str(model).endswith("config.json") else model
    try:
        return text_config(AutoConfig.from_pretrained(path, local_files_only=True))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model {model}: no config.json there or in the local cache ({exc.__class__.__name__}); "
                         f"give a model folder, its config.json, or a name easy-context-fetch --list prints "
                         f"({', '.join(s.name for s in SOURCES)})") from None  # fmt: skip


def _shape(config: PretrainedConfig, name: str) -> ModelShape:
    """The planner's shape; a mixture of experts as a dense MLP of every expert's width (all experts' weights are
    stored; activations over-counted: a token passes only some experts)."""
    values = config.to_dict()
    experts = values.get("num_local_experts") or values.get("num_experts")
    if experts and values.get("intermediate_size"):
        values["intermediate_size"] = values.get("moe_intermediate_size") or values["intermediate_size"]
        values["intermediate_size"] *= int(experts)
    return ModelShape.from_config(name, values)


def rotary_dim(config: PretrainedConfig) -> int:
    """The rotated dimensions of a head: head_dim x partial_rotary_factor."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = getattr(config, "rope_parameters", None) or {}
    factor = getattr(config, "partial_rotary_factor", None) or params.get("partial_rotary_factor") or 1.0
    return int(head_dim * factor) // 2 * 2


def stage_lengths(native: int, target: int) -> list[int]:
    """The lengths of the stages before the main one: x :data:`STAGE_FACTOR` from ``native`` while below ``target``."""
    out, length = [], native * STAGE_FACTOR
    while length < target:
        out.append(length)
        length *= STAGE_FACTOR
    return out


def round_up_nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= x."""
    k = math.floor(math.log10(x))
    for step in (*NICE, 10.0):
        if step * 10**k >= x * (1 - 1e-12):
            return step * 10**k
    raise AssertionError("unreachable")


def rope_base(config: PretrainedConfig, target: int) -> tuple[float, str]:
    """The RoPE base of the long-range layers at ``target`` tokens, and why."""
    dim = rotary_dim(config)
    bound, how = stable_rope_base(dim, target)
    base = round_up_nice(bound * ROPE_MARGIN)
    own = get_rope_theta(config) or 0.0
    why = (f"{ROPE_MARGIN:g} x the stable Men et al. bound {bound:.3g} ({how}), rounded up to 1/2/2.5/5 x 10^k; "
           f"the model's own {own:.3g}")  # fmt: skip
    if own > base:
        return own, why + ": kept, above the bound's base"
    return base, why


def total_tokens(params: int) -> tuple[int, str]:
    """Training tokens over all stages: :data:`TOKENS_AT_7B` x params / 7B (Fu et al. 2024, our proportion)."""
    tokens = int(TOKENS_AT_7B * params / 7e9)
    return tokens, f"0.5B tokens at 7B (Fu et al. 2024) x {params / 1e9:.3g}B / 7B params"


def learning_rate(params: int) -> tuple[float, str]:
    """Peak learning rate: the power law through :data:`LR_ANCHORS`, 2 significant figures."""
    (n0, lr0), (n1, lr1) = LR_ANCHORS
    slope = math.log(lr0 / lr1) / math.log(n1 / n0)
    lr = float(f"{lr0 * (n0 / params) ** slope:.2g}")
    return lr, f"2e-5 x (7B / {params / 1e9:.3g}B)^{slope:.2f}: through PI's 2e-5 at 7B and 1e-5 at 65B"


def warmup(steps: int) -> int:
    """Linear warmup: :data:`WARMUP_STEPS`, at most a tenth of a short stage (at least 1)."""
    return max(1, min(WARMUP_STEPS, math.ceil(steps * WARMUP_FRACTION)))


def _candidates(shape: ModelShape, gpus: int, gpu_mem: float, host_mem: float):
    """(optim, option, sp degree, mode) in the order tried: cheapest optimizer placement, then memory option, then
    the smallest SP degree (the rest data parallel), Ulysses before the ring."""
    degrees = [d for d in range(1, gpus + 1) if gpus % d == 0]
    for optim in OPTIMS:
        if optim == "host_adamw" and gpus > 1:  # train.py: a whole optimizer state in every process's host memory
            continue
        for config in CONFIGS:
            for sp in degrees:
                setup = Setup(gpus=gpus, gpu_mem=gpu_mem, host_mem=host_mem, sp_size=sp, optim=optim)
                for mode in SP_MODES if sp > 1 else ("data_parallel",):
                    yield setup, parse_config(config), mode


def _fits(shape: ModelShape, setup: Setup, option, mode: str, length: int) -> Prediction | None:
    pred = predict(shape, setup, mode, option)
    return pred if pred.limited_by != "infeasible" and pred.max_seq >= length else None


def _stage_plan(config, shape, setup, mode, pred: Prediction, length: int, steps: int, peak: float) -> StagePlan:
    budget = budget_at(shape, setup, mode, parse_config(pred.config), length)
    at = budget.at(length)
    dp = setup.gpus // setup.sp_size
    step_s = train_flops_per_token(config, length) * length * dp / (setup.gpus * peak * MFU)
    return StagePlan(length, steps, length * steps * dp, mode, setup.sp_size, setup.optim, pred.config, pred.max_seq,
                     at["gpu_total"], at["host_total"], step_s,
                     train_flags(shape, setup, mode, pred.config, length, budget))  # fmt: skip


def _flags(plan: StagePlan) -> dict[str, Any]:
    """The planner's memory configuration as recipe values: checkpointing, offload layers, MLP tiles, loss."""
    option = parse_config(plan.config)
    out: dict[str, Any] = {"checkpointing": "full" if option.checkpointing == "full" else "offload"}
    flags = plan.train_flags.split()
    if "--offload-layers" in flags:
        out["offload-layers"] = int(flags[flags.index("--offload-layers") + 1])
    if "--tiled-mlp" in flags:
        out["tiled-mlp"] = int(flags[flags.index("--tiled-mlp") + 1])
    out["loss"] = "chunked" if option.chunked_loss else "plain"
    return out


def derive(
    model: str | Mapping[str, Any] | PretrainedConfig, target: int, gpus: int = 1, gpu_mem: str | float | None = None,
    host_mem: str | float = "1TB", name: str | None = None, gpu: str = "h100",
) -> Derived:  # fmt: skip
    """The recipe that takes ``model`` to ``target`` tokens on ``gpus`` GPUs named ``gpu`` (its datasheet peak times
    the steps) of ``gpu_mem`` each (planner units: "80GB", "141GB"; None: the named GPU's memory); host memory per node
    ``host_mem``. Raises a one-line ValueError naming the fix for a target at or below the native length, no GPUs, an
    unknown GPU, or a target the planner finds no fitting layout for."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus {gpus}: give at least 1 GPU")
    spec = estimate.gpu(gpu)
    if gpu_mem is None:
        gpu_mem = spec.memory_gb * GB
    gpu_bytes = parse_size(gpu_mem) if isinstance(gpu_mem, str) else float(gpu_mem)
    host_bytes = parse_size(host_mem) if isinstance(host_mem, str) else float(host_mem)
    config = model_config(model)
    label = name or (model if isinstance(model, str) else getattr(config, "name_or_path", "") or config.model_type)
    native, how = rope_position_limit(config)
    if native is None:
        raise ValueError(f"{label}: its RoPE ({how}) names no native length; set max_position_embeddings")
    if target <= native:
        raise ValueError(f"--to {format_length(target)}: {label} already covers {format_length(native)} tokens "
                         f"({how}); give --to above it, e.g. {format_length(native * 2)}")  # fmt: skip
    windows = layer_windows(config)
    if all(kind != "full" for kind, _ in windows):
        raise ValueError(f"{label}: every layer attends through a window ({windows[0][1]} tokens), none sees the "
                         "extended length; use a model with full-attention layers")  # fmt: skip
    peak = f"{spec.tflops:g} TFLOP/s dense bf16"
    card = (f"{spec.name} ({_gb(gpu_bytes)} GB, {peak})" if gpu_bytes == spec.memory_gb * GB else
            f"{_gb(gpu_bytes)} GB GPU (timed as an {spec.name}: {peak}; --gpu names yours)")  # fmt: skip
    hardware = f"{gpus} x {card}, {_gb(host_bytes)} GB host"
    shape = _shape(config, str(label))

    # the launch layout: the first candidate that fits the target and that train.py's layout check lets run (the
    # heads split; the lengths are rounded up to the backend's multiple below), kept for every stage
    chosen = next(((s, o, m, p) for s, o, m in _candidates(shape, gpus, gpu_bytes, host_bytes)
                   if _runs(config, s, m) and (p := _fits(shape, s, o, m, next_multiple(target, _runs(config, s, m))))),
                  None)  # fmt: skip
    if chosen is None:
        widest = Setup(gpus=gpus, gpu_mem=gpu_bytes, host_mem=host_bytes, optim="zero3_offload")
        best = max((best_prediction(shape, widest, m, o) for m in ("zigzag_ring_attn", "data_parallel")
                    for o in OPTIONS), key=lambda p: p.max_seq)  # fmt: skip
        longest = (f"the planner's longest is {best.max_seq:,} tokens ({best.mode}, {best.config}, zero3_offload)"
                   if best.max_seq >= 1 else "not one token fits: the weights and optimizer state alone exceed it, "
                   "even offloaded (zero3_offload)")  # fmt: skip
        raise ValueError(f"{label} at {format_length(target)} tokens does not fit {hardware}: {longest}; next knob: "
                         f"--gpus {gpus * 2} (a longer SP ring) or more --host-mem")  # fmt: skip
    setup, _, mode, _ = chosen
    dp = gpus // setup.sp_size
    layout = _plan_layout(setup, mode)
    multiple = layout.multiple(config)
    asked = target
    target = next_multiple(target, multiple)

    lengths = [next_multiple(n, multiple) for n in stage_lengths(native, asked)] + [target]
    tokens, tokens_why = total_tokens(shape.params)
    lr, lr_why = learning_rate(shape.params)
    per_stage = tokens / len(lengths)
    plans, stages = [], []
    for i, length in enumerate(lengths):
        pred = next(p for c in CONFIGS if (p := _fits(shape, setup, parse_config(c), mode, length)))
        steps = max(1, math.ceil(per_stage / (length * dp)))
        plan = _stage_plan(config, shape, setup, mode, pred, length, steps, spec.tflops * 1e12)
        plans.append(plan)
        flags = _flags(plan)
        why = {
            "max-train-steps": f"{estimate.format_tokens(per_stage)} tokens (1/{len(lengths)} of {tokens_why}) / "
                               f"({format_length(length)} x {dp} sequences a step)",
            "checkpointing": f"the planner: {plan.config} fits ({plan.gpu_bytes / GB:.1f} GB a GPU; its longest at "
                             f"this layout {plan.max_seq:,} tokens)",
            "warmup-steps": f"min({WARMUP_STEPS}, a tenth of the stage's steps) (PI, YaRN: 20)",
        }  # fmt: skip
        if i < len(lengths) - 1:
            extra = {k: v for k, v in flags.items() if k != "checkpointing"}
            why["seq-length"] = f"x{STAGE_FACTOR} per stage from the native {format_length(native)}" + (
                f", rounded up to a multiple of {multiple} ({layout.describe()})" if length % 1024 else ""
            )
            stages.append(Stage(length, steps, flags["checkpointing"], warmup_steps=warmup(steps), flags=extra,
                                why=why))  # fmt: skip
    main = plans[-1]
    main_flags = _flags(main)
    sliding = any(kind == "sliding" for kind, _ in windows)
    theta, theta_why = rope_base(config, asked)
    rounded = f"; {format_length(asked)} rounded up to a multiple of {multiple} ({layout.describe()})"
    why = {
        "seq-length": f"the target ({format_length(asked)}, x{asked / native:g} the native {format_length(native)})"
                      + (rounded if target != asked else ""),
        "rope-theta": theta_why + ("; the global layers only, the sliding ones keep theirs" if sliding else ""),
        "parallel_mode": f"the planner: {mode} at SP {setup.sp_size} x DP {dp} fits the target"
                         + ("; Ulysses: the heads divide the degree" if mode == "ulysses_attn" else ""),
        "batch-size": f"one sequence per SP group (the planner's longest here: {main.max_seq:,} tokens)",
        "learning-rate": lr_why,
        **{k: v for k, v in why.items() if k != "seq-length"},
    }  # fmt: skip
    why |= {
        "pipeline.kernel_fallback": "sliding-window layers: auto (cuDNN has no windows)" if sliding else
                                    "every layer full attention: cuDNN",
        "pipeline.baselines": "training-free: the raised base, NTK, YaRN" + (", linear (Gemma 3's own)" if sliding
                                                                              else ""),
        "pipeline.needle_step": "eight needle lengths at most up to the target",
        "lr-schedule": "cosine per stage, as both hand-written recipes",
        "adam-betas": "PI and YaRN: AdamW (0.9, 0.95), no weight decay",
    }  # fmt: skip
    settings: dict[str, Any] = {"optim": setup.optim}
    why["pipeline.optim"] = "the planner: the first optimizer placement that fits (ddp, zero3, host_adamw, offloads)"
    if gpus > 1:
        settings |= {"nproc": gpus, "parallel_mode": mode}
    if native % multiple:  # the control trains at the native length: it would not shard
        settings["control"] = 0
        why["pipeline.control"] = (f"off: the native {format_length(native)} is no multiple of {multiple} "
                                   f"({layout.describe()})")  # fmt: skip
    recipe = Recipe(
        target=target, base_length=native, rope_theta=theta, run_name=f"{_slug(str(label))}_{format_length(asked)}",
        model=_model_folder(model), fetch=_fetch_name(model), parallel_mode=mode,
        sp_size=setup.sp_size if setup.sp_size != gpus else None, micro_batch=1, grad_accum=1, steps=main.steps,
        learning_rate=lr, warmup_steps=warmup(main.steps), checkpointing=main_flags["checkpointing"],
        offload_layers=main_flags.get("offload-layers"), tiled_mlp=main_flags.get("tiled-mlp"),
        loss=main_flags["loss"], kernel_fallback="auto" if sliding else "cudnn",
        baselines=("base", "rope_theta", *(("linear",) if sliding else ()), "dynamic_ntk", "yarn"),
        stages=tuple(stages), needle_min=native, needle_step=max(native, target // 8),
        flags={"lr-schedule": "cosine", "adam-betas": [0.9, 0.95], "weight-decay": 0.0,
               **({"dtype": "float32"} if setup.optim == "ddp" else {})},
        settings=settings, why=why,
    )  # fmt: skip
    micro = micro_section(config, native, recipe, layout, sliding)
    why["pipeline.micro"] = ("MICRO=1 (--micro): this plan's CPU miniature, a tiny random model of the same family "
                             "and layer pattern")  # fmt: skip
    recipe = recipe.with_(settings={**settings, "micro": micro}, why=why)
    runs = [*(Run(f"stage {i + 1}", s.seq_length) for i, s in enumerate(recipe.stages)), Run("main", target)]
    if settings.get("control", 1):
        runs.append(Run("control", native))
    checked = layout.check(config, runs)  # derive picks only what passes: a failure here is a bug, not a user's
    return Derived(recipe, tuple(plans), native, hardware, spec, config, checked)


def _plan_layout(setup: Setup, mode: str) -> PlanLayout:
    """How the recipe launches train.py on ``setup``: its SP size, the rest data parallel."""
    return PlanLayout(mode, setup.gpus, setup.sp_size if setup.sp_size != setup.gpus else None)


def _runs(config: PretrainedConfig, setup: Setup, mode: str) -> int:
    """The length multiple train.py's layout check asks of ``mode`` on ``setup`` for ``config``; 0 when the heads
    cannot split there."""
    try:
        return _plan_layout(setup, mode).multiple(config)
    except LayoutError:
        return 0


def _fetch_name(model: object) -> str | None:
    """The easy-context-fetch name ``model`` is, when it is one and no local path."""
    from easy_context.models.fetch import find_source

    if isinstance(model, str) and not os.path.exists(model) and find_source(model):
        return model
    return None


def _gb(nbytes: float) -> str:
    """Bytes as GB (1e9): whole above 100 (1,000), else 3 significant figures (25.3)."""
    return f"{nbytes / GB:,.0f}" if nbytes >= 100 * GB else f"{nbytes / GB:.3g}"


def _model_folder(model: object) -> str | None:
    """The recipe's model: a local folder (or a config.json's) as an absolute path, since the pipeline runs from the
    checkout's root; a fetch name's folder (the pipeline fetches it there when it is not yet); a hub id as given;
    None for a config given as values."""
    from easy_context.models.fetch import find_source

    if not isinstance(model, str):
        return None
    if _fetch_name(model):
        return find_source(model).default_dest
    folder = os.path.dirname(model) if model.endswith("config.json") else model
    return os.path.abspath(folder) if os.path.isdir(folder) else model


def _slug(text: str) -> str:
    tail = text.rstrip("/").split("/")[-1].removesuffix("config.json").rstrip("/") or "model"
    return "".join(c if c.isalnum() else "_" for c in tail.lower()).strip("_")
