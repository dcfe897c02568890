"""easy_context: full-attention, full-sequence long-context training with sequence parallelism.

Functional API::

    import easy_context as ec
    ec.SEQ_ALGOS                                              # backend names
    ec.extract_local(seq_algo, value, rank, world_size, dim=1)  # this rank's shard
    attn = ec.get_attn_func(seq_algo, kernel="auto", **options)
    out = attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None)
    out = attn(q, k, v, position_ids=local_position_ids)      # packed documents (docs/documents.md)
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from . import registry, usp_attn
from .compat import (
    prepare_dist_flash_attn_inputs,
    prepare_ulysses_attn_inputs,
    prepare_usp_attn_inputs,
    prepare_zigzag_ring_attn_inputs,
)
from .dataloader import prepare_dataloader
from .dist_flash_attn.monkey_patch import apply_dist_flash_attn_monkey_patch_llama
from .documents import Documents, find_documents
from .groups import get_dp_group, get_sp_group, init_sp_groups, reset_groups
from .inputs import pad_seq_parallel_inputs, prepare_seq_parallel_inputs
from .kernels import KERNEL_NAMES, get_kernel
from .padding import pad_to_multiple
from .registry import extract_local, get_attn_func, get_seq_algo, register_seq_algo, seq_multiple
from .ulysses_attn.monkey_patch import apply_ulysses_attn_monkey_patch_llama
from .usp_attn.monkey_patch import apply_usp_attn_monkey_patch_llama
from .zigzag_ring_attn.monkey_patch import (
    apply_zigzag_ring_attn_monkey_patch_llama,
    apply_zigzag_ring_attn_monkey_patch_mistral,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedModel

# EasyContext's USP package was ``easy_context.usp``: its module paths name ours
sys.modules[f"{__name__}.usp"] = usp_attn
sys.modules[f"{__name__}.usp.prepare_inputs"] = usp_attn.prepare_inputs
sys.modules[f"{__name__}.usp.monkey_patch"] = usp_attn.monkey_patch


def apply_seq_parallel_monkey_patch(seq_algo, model, always=False, **options):
    """Switch a transformers model (or, given a model-type string, models of that type) to ``seq_algo`` attention.

    See :func:`easy_context.hf.apply_seq_parallel_monkey_patch` (imported lazily: transformers is optional).
    """
    from .hf import apply_seq_parallel_monkey_patch as patch

    return patch(seq_algo, model, always=always, **options)


def _config_of(model: Any, key: str) -> Any:
    return getattr(getattr(model, "config", None), key, None)


def _easycontext_monkey_patch(
    seq_algo: str, model_type: str, model: PreTrainedModel | None, patch_type: Callable[[], None], **options: Any
) -> PreTrainedModel | None:
    """EasyContext's ``apply_<seq_algo>_monkey_patch_<model_type>()`` mapped onto switching models.

    EasyContext replaced methods of transformers' ``model_type`` classes, which changed models built before the
    call too. Here ``patch_type()`` (:mod:`easy_context.compat`) switches models of that type built after the call,
    and ``model``, if given, is switched now (returned). Without ``model``, a model of that type that is already
    built and not on this attention would silently keep its own: that is refused with an error naming the fix.
    """
    import gc

    from transformers import PreTrainedModel

    from .hf import attention_name

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
    patch_type()
    if model is None:
        return None
    return apply_seq_parallel_monkey_patch(seq_algo, model, **options)


def apply_unsloth_offloaded_gradient_checkpoint_monkey_patch():
    """EasyContext compat: make ``model.gradient_checkpointing_enable()`` keep layer inputs in host memory.

    See :mod:`easy_context.memory.offload_checkpoint` (``enable_offloaded_checkpointing(model)`` is the
    explicit alternative).
    """
    from .memory import apply_unsloth_offloaded_gradient_checkpoint_monkey_patch as patch

    return patch()


__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "SEQ_ALGOS":  # live view: backends registered later appear too
        return registry.SEQ_ALGOS
    if name == "usp":  # EasyContext's package name (``import easy_context.usp.prepare_inputs``)
        return usp_attn
    raise AttributeError(f"module 'easy_context' has no attribute {name!r}")


__all__ = [
    "Documents",
    "KERNEL_NAMES",
    # EasyContext's per-backend names
    "apply_dist_flash_attn_monkey_patch_llama",
    "apply_ulysses_attn_monkey_patch_llama",
    "apply_usp_attn_monkey_patch_llama",
    "apply_zigzag_ring_attn_monkey_patch_llama",
    "apply_zigzag_ring_attn_monkey_patch_mistral",
    "prepare_dist_flash_attn_inputs",
    "prepare_ulysses_attn_inputs",
    "prepare_usp_attn_inputs",
    "prepare_zigzag_ring_attn_inputs",
    "apply_seq_parallel_monkey_patch",
    "apply_unsloth_offloaded_gradient_checkpoint_monkey_patch",
    "pad_seq_parallel_inputs",
    "prepare_dataloader",
    "prepare_seq_parallel_inputs",
    "SEQ_ALGOS",
    "extract_local",
    "find_documents",
    "get_attn_func",
    "get_dp_group",
    "get_kernel",
    "get_seq_algo",
    "get_sp_group",
    "init_sp_groups",
    "pad_to_multiple",
    "register_seq_algo",
    "reset_groups",
    "seq_multiple",
]
