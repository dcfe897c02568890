"""The run a budget is made for (:class:`Setup`: hardware, optimizer placement, loss chunk, RMSNorm, checkpoint
stride), the planner's constants, and the layout a backend takes on it (:func:`mode_layout`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from easy_context.core import registry
from easy_context.core.layout import Layout
from easy_context.launch_configs import CONFIG_DIR
from easy_context.loss.chunked_ce import DEFAULT_CHUNK_SIZE
from easy_context.memory.rmsnorm import CHUNK_ROWS
from easy_context.models.shapes import GB, ModelShape

OPTIMS = ("zero3_offload", "zero3_offload_optimizer", "zero3", "ddp", "host_adamw")
_ZERO3 = json.loads((CONFIG_DIR / "zero3_offload.json").read_text(encoding="utf-8"))["zero_optimization"]
MAX_LIVE_PARAMETERS = _ZERO3["stage3_max_live_parameters"]  # the most parameters ZeRO-3 keeps gathered
SUB_GROUP_SIZE = _ZERO3["sub_group_size"]  # the parameters one optimizer step of ZeRO-3 updates at once
LOSS_CHUNK = DEFAULT_CHUNK_SIZE  # tokens per chunk of the chunked LM-head loss
NORMS = ("eager", "chunked")  # transformers' eager RMSNorm, easy_context.memory.enable_chunked_rmsnorm
NORM_CHUNK_ROWS = CHUNK_ROWS  # rows per chunk of the chunked RMSNorm's backward
NORM_CHUNK_TEMPS = 5  # fp32 (chunk, h) temporaries alive at once in RMSNormFunction.backward (4.5 counted op by op)


@dataclass
class Setup:
    """The hardware and the run's settings a budget is made for: GPUs and memory, optimizer placement, MLP tiles, loss
    chunk, allocator margins, RMSNorm model, checkpoint stride."""

    gpus: int
    gpu_mem: float
    host_mem: float
    gpus_per_node: int | None = None
    sp_size: int | None = None  # W; default all GPUs
    optim: str = "zero3_offload"
    mlp_tiles: int | None = None  # None: tiles of h tokens (ALST) unless mlp_tile_tokens; else a fixed tile count
    mlp_tile_tokens: int | None = None  # tiles of this many tokens (enable_tiled_mlp(model, tile_tokens=...))
    loss_chunk: int = LOSS_CHUNK
    frag: float = 0.10
    cuda_reserve: float = 1.5 * GB
    nccl_reserve: float = 0.5 * GB
    host_reserve: float = 3 * GB  # per process
    pinned_pow2: bool = True
    ring_degree: int | None = None  # usp_attn; None: the repo's default, else the next feasible
    norm: str = "eager"  # RMSNorm autograd: "eager" (transformers') or "chunked" (enable_chunked_rmsnorm)
    checkpoint_every: int = 1  # keep every K-th layer input, regenerate the others (strided_checkpoint)
    attn_heads_per_call: int | None = None  # query heads per attention kernel call (None: whole calls)

    def __post_init__(self):
        if self.optim not in OPTIMS:
            raise ValueError(f"optim must be one of {OPTIMS}, got {self.optim!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        self.gpus_per_node = self.gpus_per_node or min(self.gpus, 8)
        self.sp_size = self.sp_size or self.gpus
        if self.gpus % self.sp_size:
            raise ValueError(f"sp_size {self.sp_size} must divide the number of GPUs {self.gpus}")
        if self.mlp_tiles is not None and self.mlp_tile_tokens is not None:
            raise ValueError("give mlp_tiles (a tile count) or mlp_tile_tokens (tokens per tile), not both")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be an integer >= 1, got {self.checkpoint_every!r}")

    def stored_inputs(self, layers: int) -> int:
        """How many layer inputs are checkpointed: one per group of ``checkpoint_every`` layers."""
        return -(-layers // self.checkpoint_every)

    @property
    def procs_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)


def mode_layout(mode: str, shape: ModelShape, setup: Setup) -> Layout:
    """The backend's own layout on the SP size. Its options set in ``setup`` (a field of the option's name, e.g.
    ``ring_degree``) are taken as given; those left open are searched (``SeqAlgo.option_choices``): the backend's
    default first, then every other choice, the first one the heads allow."""
    algo = registry.get_seq_algo(mode)
    given = {name: getattr(setup, name, None) for name in algo.options}
    feasible = algo.feasible_layouts(setup.sp_size, shape.heads, shape.kv_heads, **given)
    return next(feasible, None) or algo.layout(setup.sp_size, shape.heads, shape.kv_heads, **given)
