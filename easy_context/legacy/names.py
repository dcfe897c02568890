"""EasyContext's per-backend names, as thin wrappers over the one API.

EasyContext's scripts imported, e.g., ``prepare_zigzag_ring_attn_inputs(input_ids, position_ids, target_ids, rank,
world_size, device)`` and ``apply_zigzag_ring_attn_monkey_patch_llama()``. Here each is one line over
:func:`easy_context.prepare_seq_parallel_inputs` and :func:`easy_context.apply_seq_parallel_monkey_patch` (the
patches switch models of that type built afterwards, as EasyContext's class patches did).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from easy_context.backends.dist_flash_attn import prepare_inputs as _dist_flash_attn_inputs
from easy_context.backends.ulysses_attn import prepare_inputs as _ulysses_attn_inputs
from easy_context.backends.usp_attn import prepare_inputs as _usp_attn_inputs
from easy_context.backends.usp_attn.prepare_inputs import resolve_ring_degree
from easy_context.backends.zigzag_ring_attn import prepare_inputs as _zigzag_ring_attn_inputs
from easy_context.core.inputs import prepare_seq_parallel_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Inputs = dict[str, torch.Tensor]
_USP_RING_DEGREE: list[int | None] = []  # the ring degree of apply_usp_attn_monkey_patch_llama, once applied


def _prepare(seq_algo: str) -> Callable[..., Inputs]:
    def prepare(input_ids, position_ids, target_ids, rank: int, world_size: int, device) -> Inputs:
        return prepare_seq_parallel_inputs(seq_algo, input_ids, position_ids, target_ids, rank, world_size, device)

    prepare.__name__ = prepare.__qualname__ = f"prepare_{seq_algo}_inputs"
    prepare.__doc__ = f"EasyContext: ``prepare_seq_parallel_inputs('{seq_algo}', ...)``: this rank's shard."
    return prepare


def _config_of(model: Any, key: str) -> Any:
    return getattr(getattr(model, "config", None), key, None)


def _switch(seq_algo: str, model_type: str, model: PreTrainedModel | None, **options: Any) -> PreTrainedModel | None:
    """EasyContext's ``apply_<seq_algo>_monkey_patch_<model_type>()`` mapped onto switching models.

    EasyContext replaced methods of transformers' ``model_type`` classes, which changed models built before the
    call too. Here models of that type built after the call are switched, and ``model``, if given, is switched now
    (returned). Without ``model``, a model of that type that is already built and not on this attention would
    silently keep its own: that is refused with an error naming the fix.
    """
    from transformers import PreTrainedModel

    from easy_context.hf import apply_seq_parallel_monkey_patch, attention_name

    fn = f"apply_{seq_algo}_monkey_patch_{model_type}"
    if model is not None and _config_of(model, "model_type") != model_type:
        got = _config_of(model, "model_type") or type(model).__name__
        raise TypeError(
            f"{fn}(model=...) switches {model_type} models, got {got!r}: use "
            f"easy_context.apply_seq_parallel_monkey_patch({seq_algo!r}, model) (any supported model type)"
        )
    if model is None:
        name = attention_name(seq_algo, **options)
        gc.collect()  # unreachable models (reference cycles) are not "built" models
        built = [m for m in gc.get_objects() if issubclass(type(m), PreTrainedModel)]
        built = [m for m in built if _config_of(m, "model_type") == model_type]
        built = [m for m in built if _config_of(m, "_attn_implementation") != name]
        if built:
            classes = ", ".join(sorted({type(m).__name__ for m in built}))
            raise RuntimeError(
                f"{fn}(): {len({id(m.config) for m in built})} {model_type} model(s) already built ({classes}) "
                f"would keep their own attention (EasyContext patched transformers' {model_type} classes, which "
                f"changed built models too; easy_context switches models). Pass it: {fn}(model=model), or call "
                f"{fn}() before building it; to leave built models as they are, use "
                f"easy_context.apply_seq_parallel_monkey_patch({seq_algo!r}, {model_type!r})"
            )
    apply_seq_parallel_monkey_patch(seq_algo, model_type, **options)
    return None if model is None else apply_seq_parallel_monkey_patch(seq_algo, model, **options)


def _patch(seq_algo: str, model_type: str) -> Callable[..., PreTrainedModel | None]:
    def patch(model: PreTrainedModel | None = None) -> PreTrainedModel | None:
        return _switch(seq_algo, model_type, model)

    patch.__name__ = patch.__qualname__ = f"apply_{seq_algo}_monkey_patch_{model_type}"
    patch.__doc__ = (
        f"EasyContext: {model_type} models built from now on (and ``model``, if given) attend with {seq_algo}."
    )
    return patch


prepare_zigzag_ring_attn_inputs = _prepare("zigzag_ring_attn")
prepare_dist_flash_attn_inputs = _prepare("dist_flash_attn")
prepare_ulysses_attn_inputs = _prepare("ulysses_attn")
apply_zigzag_ring_attn_monkey_patch_llama = _patch("zigzag_ring_attn", "llama")
apply_zigzag_ring_attn_monkey_patch_mistral = _patch("zigzag_ring_attn", "mistral")
apply_dist_flash_attn_monkey_patch_llama = _patch("dist_flash_attn", "llama")
apply_ulysses_attn_monkey_patch_llama = _patch("ulysses_attn", "llama")


def prepare_usp_attn_inputs(
    input_ids, position_ids, target_ids, rank: int, world_size: int, device, ring_degree: int, ulysses_degree: int
) -> Inputs:
    """EasyContext: USP shard with ``ring_degree`` x ``ulysses_degree`` == ``world_size``; the degree must match the
    one :func:`apply_usp_attn_monkey_patch_llama` was given (else the attention would read another layout)."""
    if ring_degree * ulysses_degree != world_size:
        raise ValueError(
            f"usp_attn: ring_degree {ring_degree} x ulysses_degree {ulysses_degree} must equal world_size {world_size}"
        )
    if _USP_RING_DEGREE:
        patched = resolve_ring_degree(world_size, _USP_RING_DEGREE[-1])
        if patched != ring_degree:
            raise ValueError(
                f"usp_attn: inputs sharded with ring_degree {ring_degree}, but the model was patched for ring_degree "
                f"{patched}; call apply_usp_attn_monkey_patch_llama(ring_degree={ring_degree})"
            )
    return prepare_seq_parallel_inputs(
        "usp_attn", input_ids, position_ids, target_ids, rank, world_size, device, ring_degree=ring_degree
    )


def apply_usp_attn_monkey_patch_llama(
    ring_degree: int | None = None, model: PreTrainedModel | None = None
) -> PreTrainedModel | None:
    """EasyContext: llama models built from now on (and ``model``, if given) attend with usp_attn over
    ``ring_degree`` ring ranks (None: the backend's default for the SP size; give the one
    :func:`prepare_usp_attn_inputs` shards with)."""
    switched = _switch("usp_attn", "llama", model, ring_degree=ring_degree)
    _USP_RING_DEGREE[:] = [ring_degree]
    return switched


__all__ = [
    "apply_dist_flash_attn_monkey_patch_llama",
    "apply_ulysses_attn_monkey_patch_llama",
    "apply_usp_attn_monkey_patch_llama",
    "apply_zigzag_ring_attn_monkey_patch_llama",
    "apply_zigzag_ring_attn_monkey_patch_mistral",
    "prepare_dist_flash_attn_inputs",
    "prepare_ulysses_attn_inputs",
    "prepare_usp_attn_inputs",
    "prepare_zigzag_ring_attn_inputs",
]

# EasyContext's module paths: ``from easy_context.<backend>.prepare_inputs import prepare_<backend>_inputs`` (set here,
# by the compatibility layer, so that the backends never import it; ``import easy_context`` imports this module)
for _module, _prepare_fn in (
    (_dist_flash_attn_inputs, prepare_dist_flash_attn_inputs),
    (_ulysses_attn_inputs, prepare_ulysses_attn_inputs),
    (_usp_attn_inputs, prepare_usp_attn_inputs),
    (_zigzag_ring_attn_inputs, prepare_zigzag_ring_attn_inputs),
):
    setattr(_module, _prepare_fn.__name__, _prepare_fn)
