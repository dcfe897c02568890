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

import importlib

from easy_context import backends  # noqa: F401  (registers the built-in backends, in their order)
from easy_context.core import registry
from easy_context.core.documents import Documents, find_documents
from easy_context.core.groups import get_dp_group, get_sp_group, init_sp_groups, reset_groups
from easy_context.core.inputs import pad_seq_parallel_inputs, prepare_seq_parallel_inputs, shift_targets
from easy_context.core.padding import pad_to_multiple
from easy_context.core.registry import extract_local, get_attn_func, get_seq_algo, register_seq_algo, seq_multiple
from easy_context.kernels import KERNEL_NAMES, get_kernel
from easy_context.legacy import names as _legacy_names
from easy_context.legacy import paths as _legacy_paths
from easy_context.legacy.names import *  # noqa: F403  (EasyContext's per-backend names: its __all__)
from easy_context.training.dataloader import prepare_dataloader
from easy_context.training.fp8 import quiet_torchao_import

quiet_torchao_import()  # transformers' model code imports torchao (installed for --fp8): not its CPU log noise

_legacy_paths.install()  # EasyContext's module paths (easy_context.zigzag_ring_attn.prepare_inputs, ...)


def apply_seq_parallel_monkey_patch(seq_algo, model, always=False, **options):
    """Switch a transformers model (or, given a model-type string, models of that type) to ``seq_algo`` attention.

    See :func:`easy_context.hf.apply_seq_parallel_monkey_patch` (imported lazily: transformers is optional).
    """
    from easy_context.hf import apply_seq_parallel_monkey_patch as patch

    return patch(seq_algo, model, always=always, **options)


def apply_unsloth_offloaded_gradient_checkpoint_monkey_patch():
    """EasyContext compat: make ``model.gradient_checkpointing_enable()`` keep layer inputs in host memory.

    See :mod:`easy_context.memory.offload_checkpoint` (``enable_offloaded_checkpointing(model)`` is the
    explicit alternative).
    """
    from easy_context.memory import apply_unsloth_offloaded_gradient_checkpoint_monkey_patch as patch

    return patch()


__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "SEQ_ALGOS":  # live view: backends registered later appear too
        return registry.SEQ_ALGOS
    if name in _legacy_paths.PACKAGES:  # EasyContext's package names (``easy_context.usp``, ...)
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'easy_context' has no attribute {name!r}")


__all__ = [
    "Documents",
    "KERNEL_NAMES",
    "apply_seq_parallel_monkey_patch",
    "apply_unsloth_offloaded_gradient_checkpoint_monkey_patch",
    "pad_seq_parallel_inputs",
    "prepare_dataloader",
    "prepare_seq_parallel_inputs",
    "SEQ_ALGOS",  # noqa: F405  (served by __getattr__: a live view)
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
    "shift_targets",
    *_legacy_names.__all__,  # EasyContext's per-backend names
]
