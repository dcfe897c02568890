"""CPU-offloaded activation checkpointing of decoder layers.

Ordinary (non-reentrant) activation checkpointing of a decoder layer keeps one tensor per layer from the
forward to the backward: the layer input ``hidden_states`` (batch, seq_local, hidden). Everything the layer's
operations would save is dropped and recomputed from that input in the backward. With L layers this is
``L * batch * seq_local * hidden`` elements of device memory, which dominates at long sequence lengths.

:func:`offloaded_checkpoint` is :func:`torch.utils.checkpoint.checkpoint` with the saved layer inputs moved
to host memory:

- forward: ``checkpoint`` stores its tensor inputs through the autograd saved-tensor machinery, so a
  :class:`torch.autograd.graph.saved_tensors_hooks` pair around the call sees exactly those inputs (inside the
  checkpointed region checkpoint's own hooks take precedence, so nothing else is touched). The pack hook copies
  each input into pinned host memory on a side CUDA stream (the copy overlaps the next layer's compute; the
  device block is held, through ``record_stream``, only until the copy has finished). On CPU it makes a plain
  copy, which keeps the mechanism observable in tests.
- backward: when the recompute of the layer starts, the unpack hook copies the input back to its device
  (on the compute stream, after the side-stream copy's event) and the layer is recomputed from it.

What stays on the device per checkpointed layer: nothing of the layer's own activations. Keyword arguments
that HF binds into the checkpointed function (attention mask, rotary ``position_embeddings``, position ids)
are not inputs of ``checkpoint`` and stay where they are; they are shared by all layers (one copy per model).
``nn.Parameter`` inputs are never copied. During the backward of one layer, its input and its recomputed
activations are on the device as with ordinary checkpointing.

transformers 5.24's own ``activation_checkpointing_enable(offload=True)`` wraps ``checkpoint`` in
``torch.autograd.graph.save_on_cpu``, which copies on the compute stream (no overlap). With the monkey patch
below applied, that path runs :func:`offloaded_checkpoint` inside ``save_on_cpu``; the innermost hooks (ours) win.

Measured on one H200 (tiny 8-layer Llama, hidden 1024, 8192 tokens, fp32): device memory held after the forward
391 MiB with plain checkpointing, 135 MiB offloaded (8 layer inputs of 32 MiB moved to the host); step time
506 ms vs 511 ms.

Two entry points share this one implementation:

- :func:`enable_offloaded_checkpointing` sets up the decoder layers of one model.
- :func:`apply_unsloth_offloaded_gradient_checkpoint_monkey_patch` (EasyContext's name) makes transformers'
  own ``gradient_checkpointing_enable`` / ``activation_checkpointing_enable`` use it (see that function).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from easy_context.core.attn_checkpoint import AttnCache
from easy_context.memory.strided_checkpoint import LayerGroups, strided_checkpoint

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@dataclass
class HostCopy:
    """A saved tensor living in host memory until the backward needs it on ``device`` again."""

    host: torch.Tensor  # same shape and dtype as the saved tensor, on CPU (pinned when it came from CUDA)
    device: torch.device  # where the tensor lived and goes back to
    ready: torch.cuda.Event | None  # recorded on the side stream after the device-to-host copy (CUDA only)


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def pack_to_host(tensor: torch.Tensor, pin_memory: bool = True) -> HostCopy | torch.Tensor:
    """Saved-tensor pack hook: copy ``tensor`` to host memory (parameters are kept as they are).

    ``pin_memory=False`` uses pageable memory: exact-size blocks (the pinned allocator rounds every block up
    to a power of two, up to 2x the bytes) at the price of copies that do not overlap compute.
    """
    if isinstance(tensor, torch.nn.Parameter):
        return tensor
    if tensor.device.type == "cuda":
        compute, side = torch.cuda.current_stream(tensor.device), _side_stream(tensor.device)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin_memory)
        side.wait_stream(compute)  # the tensor is produced on the compute stream
        with torch.cuda.stream(side):
            host.copy_(tensor.detach(), non_blocking=True)
            ready = side.record_event()
        tensor.record_stream(side)  # its device block is not reused before the copy has finished
        return HostCopy(host, tensor.device, ready)
    return HostCopy(tensor.detach().to("cpu", copy=True), tensor.device, None)


def unpack_to_device(packed: HostCopy | torch.Tensor) -> torch.Tensor:
    """Saved-tensor unpack hook: the saved tensor, back on its original device."""
    if isinstance(packed, torch.Tensor):
        return packed
    if packed.ready is not None:
        torch.cuda.current_stream(packed.device).wait_event(packed.ready)
        return packed.host.to(packed.device, non_blocking=True)
    return packed.host.to(packed.device)


@contextmanager
def offload_saved_tensors(pin_memory: bool = True) -> Iterator[None]:
    """Within the block, tensors saved for backward are held in host memory (see the module docstring)."""
    # The hooks are looked up at entry so that tests can observe them.
    pack = pack_to_host if pin_memory else functools.partial(pack_to_host, pin_memory=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack_to_device):
        yield


def offloaded_checkpoint(
    function: Callable[..., Any],
    *args: Any,
    offload: bool = True,
    use_reentrant: bool = False,
    pin_memory: bool = True,
    **kwargs: Any,
) -> Any:
    """:func:`torch.utils.checkpoint.checkpoint` whose saved inputs are held in host memory.

    ``args`` are the checkpointed function's inputs, for a decoder layer ``hidden_states`` (b, s_local, hidden);
    their tensors are offloaded when ``offload`` (to pinned memory unless ``pin_memory=False``). ``kwargs``
    (``preserve_rng_state``, ``context_fn``, ...) go to ``checkpoint``. Non-reentrant by default, as transformers
    uses it; ``use_reentrant=True`` works too (its inputs are saved through the same hooks).
    """
    if not offload:
        return checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)
    with offload_saved_tensors(pin_memory):
        return checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)


def _attn_replay_contexts():
    return AttnCache().contexts()


def enable_offloaded_checkpointing(
    model: torch.nn.Module,
    *,
    offload: bool = True,
    replay_attention: bool | Literal["global"] = False,
    offload_layers: int | None = None,
    pin_memory: bool = True,
    checkpoint_every: int = 1,
) -> torch.nn.Module:
    """Checkpoint every decoder layer of the HF ``model`` with :func:`offloaded_checkpoint`; returns ``model``.

    ``offload=False`` gives plain non-reentrant checkpointing through the same code path. With
    ``replay_attention`` the recompute does not re-run attention (checkpoint-after-attention, see
    :mod:`easy_context.core.attn_checkpoint`): each layer keeps its attention output (b, s_local, heads, head_dim) and
    fp32 lse on the device, and the backward skips one attention forward per layer. As with HF's own
    checkpointing, layers are checkpointed only in training mode (``model.train()``) with grad enabled, and
    ``use_cache`` is turned off in the checkpointed layers. ``model.gradient_checkpointing_disable()`` undoes it.
    ``replay_attention="global"`` replays the attention of the layers that attend over the whole sequence only:
    a sliding-window layer's attention costs window x length, little to re-run, and its output is not worth
    keeping (:func:`easy_context.models.layer_windows`, as transformers' masks read the config).

    ``offload_layers=n`` offloads only the first n stored layer inputs (the others stay on the device), to
    split the checkpoints between host and device memory when the host cannot hold them all. ``pin_memory=False``
    offloads to pageable memory (see :func:`pack_to_host`).

    ``checkpoint_every=k`` stores only every k-th layer input; the others are regenerated in the backward from
    their group's stored input (:mod:`easy_context.memory.strided_checkpoint`): ceil(L/k) layer inputs held
    instead of L, for (k-1)/k of a layer forward more per layer. Not with ``replay_attention``.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing (no checkpointable layers)")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    if checkpoint_every > 1 and replay_attention:
        raise ValueError(
            "checkpoint_every > 1 regenerates layer inputs by re-running whole layers: it cannot be "
            "combined with replay_attention (checkpointing mode 'attn'); use 'full' or 'offload'"
        )
    extra = {"context_fn": _attn_replay_contexts} if replay_attention else {}
    func = functools.partial(offloaded_checkpoint, offload=offload, use_reentrant=False, pin_memory=pin_memory, **extra)
    # HF's own setter: stores ``func`` as ``_gradient_checkpointing_func`` of every GradientCheckpointingLayer
    # (and of the other modules carrying a ``gradient_checkpointing`` flag) and sets the flag.
    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=func)
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    # offload_layers counts stored inputs: with checkpoint_every=k, layer i stores the input of group i // k
    offloaded = [offload and (offload_layers is None or i // checkpoint_every < offload_layers)
                 for i in range(len(layers))]  # fmt: skip
    sliding = [False] * len(layers)
    if replay_attention == "global":  # sliding-window layers: plain checkpointing, attention re-run
        from easy_context.models import layer_windows

        windows = layer_windows(model.config)
        sliding = [kind != "full" for kind, _ in windows] if len(windows) == len(layers) else sliding
        plain = functools.partial(offloaded_checkpoint, use_reentrant=False, pin_memory=pin_memory)
        for layer, off, slides in zip(layers, offloaded, sliding):
            if slides:
                layer._gradient_checkpointing_func = functools.partial(plain, offload=off)
    if checkpoint_every > 1:
        groups = LayerGroups(len(layers), checkpoint_every)
        for i, layer in enumerate(layers):
            hooks = {"pack": functools.partial(_pack, pin_memory=pin_memory), "unpack": _unpack} if offloaded[i] else {}
            layer._gradient_checkpointing_func = functools.partial(strided_checkpoint, groups=groups, index=i,
                                                                   module=layer, **hooks)  # fmt: skip
    else:
        for layer, off, slides in zip(layers, offloaded, sliding):
            if offload and not off and not slides:
                layer._gradient_checkpointing_func = functools.partial(func, offload=False)
    return model


def _pack(tensor: torch.Tensor, pin_memory: bool) -> HostCopy | torch.Tensor:
    return pack_to_host(tensor, pin_memory=pin_memory)  # looked up per call, so that tests can observe it


def _unpack(packed: HostCopy | torch.Tensor) -> torch.Tensor:
    return unpack_to_device(packed)


CHECKPOINT_MODES: dict[str, str] = {
    "none": "no activation checkpointing",
    "full": "checkpoint each decoder layer (recompute it in the backward)",
    "offload": "as full, with the layer inputs in pinned host memory",
    "attn": "as full, but keep each layer's attention output: the backward does not re-run attention",
    "attn-offload": "attn, with the layer inputs in host memory (attention outputs stay on the device)",
    "attn-global": "attn for the layers that attend over the whole sequence only; sliding-window layers re-run "
    "their (window x length) attention and keep no output (Gemma 2/3, gpt-oss: the memory of attn at the cost "
    "of full for the global layers)",
}


def apply_checkpointing(
    model: torch.nn.Module, mode: str, offload_layers: int | None = None, checkpoint_every: int = 1
) -> torch.nn.Module:
    """Set up activation checkpointing of ``model``'s decoder layers by name (see :data:`CHECKPOINT_MODES`).

    ``offload_layers=k`` (offload modes only): only the first k layer inputs go to the host, in pageable
    exact-size blocks (the split of the longest-context runs: the host holds what it can, the GPU the rest).
    ``checkpoint_every=k`` (modes full and offload): only every k-th layer input is kept, see
    :func:`enable_offloaded_checkpointing`."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpointing mode {mode!r}; choose one of {list(CHECKPOINT_MODES)}")
    if offload_layers is not None and ("offload" not in mode or offload_layers < 0):
        raise ValueError(f"offload_layers={offload_layers} needs a checkpointing mode that offloads (offload, "
                         f"attn-offload) and a count >= 0, got mode {mode!r}")  # fmt: skip
    if checkpoint_every != 1 and mode not in ("full", "offload"):
        raise ValueError(f"checkpoint_every={checkpoint_every} needs checkpointing mode 'full' or 'offload' "
                         f"(it re-runs whole layers to regenerate their inputs), got mode {mode!r}")  # fmt: skip
    if mode == "none":
        return model
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", ""))
    if mode.startswith("attn") and not impl.startswith("easy_context"):
        # it keeps the output of easy_context's attention: a model still on its own attention (not patched for an SP
        # mode: data parallel) switches to easy_context's data_parallel attention, kernel "auto" (the same math)
        from easy_context.hf.patch import apply_seq_parallel_monkey_patch

        if not isinstance(model, PreTrainedModel):
            raise ValueError(f"checkpointing {mode!r} keeps the output of easy_context attention, but this "
                             f"{type(model).__name__} attends with {impl!r}: call "
                             "easy_context.apply_seq_parallel_monkey_patch on it first")  # fmt: skip
        apply_seq_parallel_monkey_patch("data_parallel", model, always=True, kernel="auto")
    split = {} if offload_layers is None else {"offload_layers": offload_layers, "pin_memory": False}
    replay = "global" if mode == "attn-global" else mode.startswith("attn")
    return enable_offloaded_checkpointing(model, offload="offload" in mode, replay_attention=replay,
                                          checkpoint_every=checkpoint_every, **split)  # fmt: skip


# --- EasyContext-compatible monkey patch -------------------------------------------------------------------


def apply_unsloth_offloaded_gradient_checkpoint_monkey_patch() -> None:
    """Make transformers' ``gradient_checkpointing_enable()`` use :func:`offloaded_checkpoint`.

    How transformers (5.x) wires checkpointing: ``gradient_checkpointing_enable`` (a deprecated alias of
    ``activation_checkpointing_enable``) builds ``functools.partial(checkpoint, **kwargs)`` from the name
    ``checkpoint`` in ``transformers.modeling_utils`` (``from torch.utils.checkpoint import checkpoint``) and
    stores it as ``_gradient_checkpointing_func`` on every ``GradientCheckpointingLayer``, whose ``forward`` calls
    it. This patch rebinds that one module attribute, ``transformers.modeling_utils.checkpoint``, to
    :func:`offloaded_checkpoint`, so every later enable call (on models built or loaded before or after the
    patch, with any ``gradient_checkpointing_kwargs``) installs the offloaded variant. Models whose checkpointing
    was enabled before the patch keep their function until enabled again. Idempotent; undone by
    :func:`revert_unsloth_offloaded_gradient_checkpoint_monkey_patch`.
    """
    import transformers.modeling_utils as modeling_utils

    current = getattr(modeling_utils, "checkpoint", None)
    if current is offloaded_checkpoint:
        return
    if current is not checkpoint:
        raise RuntimeError(
            "transformers.modeling_utils.checkpoint is not torch.utils.checkpoint.checkpoint "
            f"(found {current!r}); this transformers version wires checkpointing differently"
        )
    modeling_utils.checkpoint = offloaded_checkpoint


def revert_unsloth_offloaded_gradient_checkpoint_monkey_patch() -> None:
    """Undo :func:`apply_unsloth_offloaded_gradient_checkpoint_monkey_patch` (for later enable calls)."""
    import transformers.modeling_utils as modeling_utils

    if getattr(modeling_utils, "checkpoint", None) is offloaded_checkpoint:
        modeling_utils.checkpoint = checkpoint
