"""easy_context: full-attention, full-sequence long-context training with sequence parallelism.

Functional API::

    import easy_context as ec
    ec.SEQ_ALGOS                                              # backend names
    ec.extract_local(seq_algo, value, rank, world_size, dim=1, **options)  # this rank's shard (same options)
    attn = ec.get_attn_func(seq_algo, kernel="auto", **options)
    out = attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None)
    out = attn(q, k, v, position_ids=local_position_ids)      # packed documents (docs/documents.md)
"""

from __future__ import annotations

import sys

from . import backends, usp_attn  # noqa: F401  (backends: registers the built-in backends, in their order)
from .compat import (  # EasyContext's per-backend names
    apply_dist_flash_attn_monkey_patch_llama,
    apply_ulysses_attn_monkey_patch_llama,
    apply_usp_attn_monkey_patch_llama,
    apply_zigzag_ring_attn_monkey_patch_llama,
    apply_zigzag_ring_attn_monkey_patch_mistral,
    prepare_dist_flash_attn_inputs,
    prepare_ulysses_attn_inputs,
    prepare_usp_attn_inputs,
    prepare_zigzag_ring_attn_inputs,
)
from .core import registry
from .core.documents import Documents, find_documents
from .core.groups import get_dp_group, get_sp_group, init_sp_groups, reset_groups
from .core.inputs import pad_seq_parallel_inputs, prepare_seq_parallel_inputs
from .core.padding import pad_to_multiple
from .core.registry import extract_local, get_attn_func, get_seq_algo, register_seq_algo, seq_multiple
from .kernels import KERNEL_NAMES, get_kernel
from .training.dataloader import prepare_dataloader
from .training.fp8 import quiet_torchao_import
from .usp_attn import monkey_patch as _usp_monkey_patch
from .usp_attn import prepare_inputs as _usp_prepare_inputs

quiet_torchao_import()  # transformers' model code imports torchao (installed for --fp8): not its CPU log noise

# EasyContext's USP package was ``easy_context.usp``: its module paths name ours
sys.modules[f"{__name__}.usp"] = usp_attn
sys.modules[f"{__name__}.usp.prepare_inputs"] = _usp_prepare_inputs
sys.modules[f"{__name__}.usp.monkey_patch"] = _usp_monkey_patch


def apply_seq_parallel_monkey_patch(seq_algo, model, always=False, **options):
    """Switch a transformers model (or, given a model-type string, models of that type) to ``seq_algo`` attention.

    See :func:`easy_context.hf.apply_seq_parallel_monkey_patch` (imported lazily: transformers is optional).
    """
    from .hf import apply_seq_parallel_monkey_patch as patch

    return patch(seq_algo, model, always=always, **options)


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
    # EasyContext's per-backend names (easy_context.compat)
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
