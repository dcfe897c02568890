"""FP8 training of the decoder's linear layers through torchao's float8 training (``--fp8``).

::

    from easy_context.training.fp8 import enable_fp8_linears
    n = enable_fp8_linears(model)                  # before torch.compile, FSDP2 wrapping and the optimizer
    n = enable_fp8_linears(model, emulate=True)    # CPU tests: the same casts, the GEMMs in fp32

What is converted: every ``nn.Linear`` inside the decoder layers (``model.get_decoder().layers``): the attention
q/k/v/o projections and the MLP gate/up/down (or whatever linears a layer has, e.g. MLA's ``kv_a_proj``), swapped
for torchao's ``Float8Linear`` (same weight and bias parameters, same state-dict keys: checkpoints load with or
without fp8). Each GEMM of the forward and backward casts its two operands to float8 e4m3 with dynamic scales
(recipe ``rowwise``: one power-of-two scale per row of each operand) and runs ``torch._scaled_mm``; the
high-precision weights, gradients and optimizer states are unchanged. Never converted: the embeddings, the LM head
(its loss stays in bf16/fp32 through :mod:`easy_context.loss`), attention itself, the norms, MoE routers (a linear
whose parent holds ``experts``), and linears whose in/out features are not multiples of 16 (float8 GEMMs need
that; they are skipped, counted and named in a warning).

Shapes: ``torch._scaled_mm`` also needs the token count of each call (batch x local sequence, or batch x tile with
a tiled MLP) to be a multiple of 16: it is the inner dimension of the weight-gradient GEMM.
:func:`fp8_shape_error` checks it before training starts.

Composes with: checkpoint-after-attention and every other checkpointing mode (checkpoints hold layer inputs,
recompute re-casts identically), activation offload, tiled MLP (each tile runs the same converted linears; the
weight-gradient scales are per tile), torch.compile (apply fp8 first; torchao fuses the casts), DDP, FSDP2 (torchao's
documented distributed path), every SP backend (the linears see local tokens). Refused: DeepSpeed (torchao
documents FSDP2, not DeepSpeed; under ZeRO-3 each ``Float8Linear`` keeps a view of its gathered weight for its
backward where DeepSpeed's own linear re-gathers it: the math matched on CPU, GPU memory is unmeasured; docs/fp8.md),
a CPU or a GPU below sm89 without ``emulate``.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

TORCHAO_PIN = "0.18.0"  # requirements.txt; needs torch >= 2.11 (its C++ extensions; float8 training is pure Python)
RECIPES = ("rowwise", "tensorwise", "rowwise_with_gw_hp")  # torchao's Float8LinearRecipeName values
ALIGN = 16  # torch._scaled_mm: inner and output dimensions of each float8 GEMM


class FP8Error(ValueError):
    """A one-line reason why float8 linears cannot run here, naming the fix."""


@dataclass
class Fp8Selection:
    """Which decoder linears float8 training takes (``convert``) and which it leaves (``skipped``: name -> why)."""

    convert: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class _DropImportNoise(logging.Filter):
    """Drops the log records of one logger whose message contains one of ``needles``."""

    def __init__(self, *needles: str):
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in self.needles)


def quiet_torchao_import() -> None:
    """Silence what importing torchao logs that is noise for float8 training. transformers imports torchao with its
    model code whenever torchao is installed, so every program would print it: "Failed to load .../torchao/_C*.so"
    (its optional CUDA C++ extensions; always on CPU builds of torch; float8 training does not use them, its GEMM is
    ``torch._scaled_mm``) and torch >= 2.13's deprecation of ``register_constant`` on the Enums torchao registers.
    Only those messages of those two loggers are dropped; idempotent."""
    for name, needles in (("torchao", ("Failed to load",)),
                          ("torch.utils._pytree", ("Calling register_constant() on Enum subclasses",))):  # fmt: skip
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropImportNoise) for f in log.filters):
            log.addFilter(_DropImportNoise(*needles))


def _torchao_float8():
    """torchao.float8, or FP8Error naming the pinned install."""
    quiet_torchao_import()
    try:
        import torchao.float8 as float8
    except ImportError as exc:
        raise FP8Error(f"float8 training needs torchao: pip install torchao=={TORCHAO_PIN} ({exc})") from None
    return float8


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of an HF causal LM (``model.get_decoder().layers``), or FP8Error."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise FP8Error(f"{type(model).__name__}: no decoder layers (get_decoder().layers) to convert to float8")
    return layers


def select_fp8_linears(model: nn.Module) -> Fp8Selection:
    """The ``nn.Linear`` modules of the decoder layers, by name relative to ``layers`` (``"0.self_attn.q_proj"``),
    split into those float8 training converts and those it skips (MoE routers; features not multiples of 16)."""
    selection = Fp8Selection()
    for i, layer in enumerate(decoder_layers(model)):
        for parent_name, parent in layer.named_modules():
            for name, child in parent.named_children():
                if not isinstance(child, nn.Linear):
                    continue
                fqn = ".".join(p for p in (str(i), parent_name, name) if p)
                if hasattr(parent, "experts"):
                    selection.skipped[fqn] = "MoE router (routing stays in high precision)"
                elif child.in_features % ALIGN or child.out_features % ALIGN:
                    selection.skipped[fqn] = (f"{child.in_features} -> {child.out_features} features, not multiples "
                                              f"of {ALIGN}")  # fmt: skip
                else:
                    selection.convert.append(fqn)
    return selection


def fp8_device_error(device: torch.device | str, emulate: bool = False) -> str | None:
    """Why float8 GEMMs cannot run on ``device`` (None: they can, or ``emulate``)."""
    if emulate:
        return None
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None:
        return (f"float8 GEMMs need an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper, Blackwell), not "
                f"{'ROCm' if device.type == 'cuda' else device.type}; for a functional test use emulation "
                "(emulate=True, --fp8-emulate: fp32 GEMMs, no speed-up)")  # fmt: skip
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return (f"float8 GEMMs need compute capability 8.9+ (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}: train in bf16 (drop --fp8)")  # fmt: skip
    return None


def fp8_composition_error(*, deepspeed: bool = False) -> str | None:
    """Why float8 linears do not compose with this setup (None: they do)."""
    if deepspeed:
        return ("float8 linears do not compose with DeepSpeed (torchao documents float8 training with FSDP2; under "
                "ZeRO-3 each Float8Linear keeps its gathered weight until its backward, GPU memory unmeasured): use "
                "FSDP2 (accelerate_configs/fsdp2_offload.yaml) or DDP, or drop --fp8")  # fmt: skip
    return None


def fp8_shape_error(batch_size: int, local_seq: int, mlp_tiles: int = 0) -> str | None:
    """Why the token counts the linears see (``batch_size x local_seq``; with ``mlp_tiles``, also ``batch_size x``
    each MLP tile's length) do not fit float8 GEMMs, which need multiples of 16 (None: they do). Not needed with
    emulation."""
    tokens = batch_size * local_seq
    if tokens % ALIGN:
        return (f"the linears see {batch_size} x {local_seq} = {tokens} tokens per call, not a multiple of {ALIGN} "
                "(the inner dimension of the float8 weight-gradient GEMM): choose a sequence length (per rank) or "
                f"batch size that makes it one")  # fmt: skip
    if mlp_tiles:
        from easy_context.memory.tiled_mlp import tile_bounds

        tiles = {end - start for start, end in tile_bounds(local_seq, mlp_tiles)}
        bad = sorted(t for t in tiles if batch_size * t % ALIGN)
        if bad:
            return (f"--tiled-mlp {mlp_tiles} cuts {local_seq} tokens into tiles of {bad} tokens; float8 GEMMs need "
                    f"batch x tile to be a multiple of {ALIGN}: choose a tile count dividing the length into such "
                    "tiles")  # fmt: skip
    return None


def fp8_config(recipe: str = "rowwise", emulate: bool = False):
    """torchao's ``Float8LinearConfig`` of ``recipe`` (one of :data:`RECIPES`), with ``emulate`` set."""
    if recipe not in RECIPES:
        raise FP8Error(f"unknown float8 recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    float8 = _torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, emulate=emulate) if emulate else config


def enable_fp8_linears(
    model: nn.Module, recipe: str = "rowwise", emulate: bool = False, *, device: torch.device | str | None = None
) -> int:
    """Swap the decoder layers' linears of ``model`` for torchao ``Float8Linear`` (see the module docstring);
    returns how many decoder linears are float8 afterwards (already converted ones included).

    ``device``: where training runs (default: where ``model``'s parameters are); a CPU, or a GPU below sm89, is
    refused unless ``emulate`` (the float8 casts with fp32 GEMMs: for tests, no speed-up). Apply before
    torch.compile, FSDP2 wrapping and building the optimizer (the parameters are the same objects, so an optimizer
    built earlier still works). Skipped linears are named in one warning. Raises :class:`FP8Error` (one line).
    """
    config = fp8_config(recipe, emulate)
    if device is None:
        device = next(model.parameters()).device
    error = fp8_device_error(device, emulate)
    if error:
        raise FP8Error(error)
    error = fp8_composition_error(deepspeed=any(hasattr(p, "ds_id") for p in model.parameters()))  # zero.Init
    if error:
        raise FP8Error(error)
    float8 = _torchao_float8()
    selection = select_fp8_linears(model)
    wanted = set(selection.convert)

    def take(module: nn.Module, fqn: str) -> bool:
        return fqn in wanted and not isinstance(module, float8.float8_linear.Float8Linear)

    float8.convert_to_float8_training(decoder_layers(model), module_filter_fn=take, config=config)
    if selection.skipped:
        names = ", ".join(f"{k} ({v})" for k, v in list(selection.skipped.items())[:3])
        more = f" and {len(selection.skipped) - 3} more" if len(selection.skipped) > 3 else ""
        warnings.warn(f"fp8: {len(selection.skipped)} decoder linears stay in high precision: {names}{more}",
                      stacklevel=2)  # fmt: skip
    return len(wanted)
