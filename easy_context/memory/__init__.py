"""Memory savers for long-context training: CPU-offloaded activation checkpointing and tiled MLPs.

::

    from easy_context.memory import enable_offloaded_checkpointing, enable_tiled_mlp
    model.train()
    enable_offloaded_checkpointing(model)   # decoder-layer inputs held in (pinned) host memory
    enable_tiled_mlp(model, num_tiles=8)    # (seq x intermediate) MLP activations never exist whole

or, EasyContext-style, ``apply_unsloth_offloaded_gradient_checkpoint_monkey_patch()`` and then
``model.gradient_checkpointing_enable()``.
"""

from easy_context.memory.offload_checkpoint import (
    CHECKPOINT_MODES,
    HostCopy,
    apply_checkpointing,
    apply_unsloth_offloaded_gradient_checkpoint_monkey_patch,
    enable_offloaded_checkpointing,
    offload_saved_tensors,
    offloaded_checkpoint,
    revert_unsloth_offloaded_gradient_checkpoint_monkey_patch,
)
from easy_context.memory.rmsnorm import RMSNormFunction, enable_chunked_rmsnorm
from easy_context.memory.tiled_mlp import TiledMLPFunction, enable_tiled_mlp, tile_bounds, tile_mlp_module, tiled_mlp

__all__ = [
    "CHECKPOINT_MODES",
    "HostCopy",
    "apply_checkpointing",
    "RMSNormFunction",
    "TiledMLPFunction",
    "apply_unsloth_offloaded_gradient_checkpoint_monkey_patch",
    "enable_chunked_rmsnorm",
    "enable_offloaded_checkpointing",
    "enable_tiled_mlp",
    "offload_saved_tensors",
    "offloaded_checkpoint",
    "revert_unsloth_offloaded_gradient_checkpoint_monkey_patch",
    "tile_bounds",
    "tile_mlp_module",
    "tiled_mlp",
]
