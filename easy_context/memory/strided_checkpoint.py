"""Keep one decoder-layer input in every K: the others are regenerated in the backward.

Ordinary layer checkpointing keeps every layer's input ``(batch, seq_local, hidden)`` from the forward to the
backward: L of them, which is what bounds the longest context once everything else is tiled, chunked or
offloaded (Llama-3-8B: 32 layers x 8 KiB per token). With ``every=K`` only the inputs of layers 0, K, 2K, ...
are stored (in host memory when offloading). The input of a layer in between is not saved: a small
:class:`Regenerate` token stands for it. When the backward first needs one of them (at the last layer of the
group) the group's stored input goes once through the group's first K-1 layers without grad, which yields the
K-1 missing inputs; each then waits on the device until its own layer's recompute takes it. Every layer is
recomputed and differentiated as with ordinary checkpointing.

- Held from forward to backward: ceil(L/K) layer inputs instead of L.
- Transient, during the backward of one group: K-1 layer inputs on the device.
- Extra compute: K-1 layer forwards per group of K layers, (K-1)/K of a layer forward per layer; a checkpointed
  layer already costs about four forwards (forward, recompute, backward = 2), so K=2 adds about 12 %.
- Exact: the regenerated inputs are the forward's values, recomputed by the same deterministic kernels (the
  assumption ordinary checkpointing makes of its recompute), under each layer's own autocast and RNG state
  (dropout masks repeat). Layers must be called once each, in order, each on the previous layer's output;
  anything else raises.

How: each layer's non-reentrant ``checkpoint`` runs inside a ``saved_tensors_hooks`` pair, which sees exactly the
inputs checkpoint saves (see :mod:`easy_context.memory.offload_checkpoint`). A group's first layer packs its input
as usual (a host copy when offloading) and the group remembers the packed object; the other layers pack a token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class ForwardState:
    """What a layer's forward ran under, and its regeneration runs under again: autocast and the RNG (dropout).
    (``checkpoint`` does the same for its own recompute.)"""

    autocast: tuple[tuple[str, bool, torch.dtype], ...]  # (device type, enabled, dtype)
    autocast_cache: bool
    cpu_rng: torch.Tensor
    cuda_rng: tuple[tuple[int, torch.Tensor], ...]  # (device index, state) of the input's CUDA device

    @classmethod
    def capture(cls, device: torch.device) -> ForwardState:
        types = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        autocast = tuple((t, torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in types)
        cuda = ((device.index or 0, torch.cuda.get_rng_state(device)),) if device.type == "cuda" else ()
        return cls(autocast, torch.is_autocast_cache_enabled(), torch.get_rng_state(), cuda)

    @contextmanager
    def restored(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[i for i, _ in self.cuda_rng]), ExitStack() as stack:
            torch.set_rng_state(self.cpu_rng)
            for index, state in self.cuda_rng:
                torch.cuda.set_rng_state(state, index)
            for device_type, enabled, dtype in self.autocast:
                stack.enter_context(
                    torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=self.autocast_cache)
                )
            yield


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype)


def _hidden(output: Any) -> torch.Tensor:
    """A decoder layer's output hidden states (transformers 5 layers return the tensor, older ones a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output


@contextmanager
def _unsharded(module: torch.nn.Module | None) -> Iterator[None]:
    """FSDP2 (``fully_shard``) layers hold sharded parameters outside their own forward/backward: a regenerating
    forward, which calls the layer's forward directly, gathers them first."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        FSDPModule = ()  # noqa: N806
    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


class ForwardPass:
    """One forward pass under strided checkpointing: the groups' stored inputs, each layer's bound forward, and
    the inputs regenerated for the backward. Only the autograd graph refers to it (through :class:`Regenerate`
    tokens), so it lives as long as the graph: freed with it, after the backward or without one."""

    def __init__(self, every: int):
        self.every = every
        self.stored: dict[int, Any] = {}  # group head -> its packed input (a detached tensor or a host copy)
        self.layers: dict[int, tuple[Callable[..., Any], ForwardState, torch.nn.Module | None]] = {}
        self.regenerated: dict[int, torch.Tensor] = {}  # layer -> its input, waiting for its recompute
        self.ran = 0  # layers run in this forward

    def regenerate(self, index: int, unpack: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        """The input of layer ``index`` (not a group head), recomputed with its group's other missing inputs."""
        if index not in self.regenerated:
            head = index - index % self.every
            last = min(head + self.every, self.ran) - 1  # the group's last layer that ran in the forward
            if head not in self.stored:
                raise RuntimeError(
                    f"checkpoint_every={self.every}: the stored input of decoder layer {head} was already used; "
                    "a second backward through the same graph (retain_graph) needs checkpoint_every=1"
                )
            hidden = unpack(self.stored.pop(head))
            with torch.no_grad():
                for layer in range(head, last):
                    function, state, module = self.layers.pop(layer)
                    with state.restored(), _unsharded(module):
                        hidden = _hidden(function(hidden))
                    self.regenerated[layer + 1] = hidden
            self.layers.pop(last, None)
        return self.regenerated.pop(index)


@dataclass(frozen=True)
class Regenerate:
    """Saved in place of the input of decoder layer ``index``: recomputed from its group's stored input when the
    backward unpacks it. Holds the forward pass it belongs to (a later forward does not disturb it)."""

    index: int
    forward: ForwardPass


class LayerGroups:
    """One model's strided checkpointing: layer ``index`` belongs to the group starting at ``index - index % every``.
    Holds the forward pass in progress only while it runs (then the graph holds it)."""

    def __init__(self, num_layers: int, every: int):
        if every < 1 or num_layers < 1:
            raise ValueError(f"checkpoint_every must be >= 1 (got {every}) and the model needs decoder layers")
        self.num_layers, self.every = num_layers, every
        self.current: ForwardPass | None = None
        self._last_output: torch.Tensor | None = None  # held from the end of one layer to the start of the next

    def start_layer(self, index: int, hidden: torch.Tensor) -> ForwardPass:
        """Forward bookkeeping: layers run once each, in order, each on the previous layer's output."""
        if index == 0:
            self.current = ForwardPass(self.every)
        elif self.current is None or index != self.current.ran:
            after = "the start of a forward" if self.current is None else f"layer {self.current.ran - 1}"
            raise RuntimeError(
                f"checkpoint_every={self.every}: decoder layer {index} ran after {after}; regenerating layer inputs "
                "needs the layers called once each, in order (use checkpoint_every=1 for this model)"
            )
        elif index % self.every and (self._last_output is None or not _same_tensor(self._last_output, hidden)):
            raise RuntimeError(
                f"checkpoint_every={self.every}: the input of decoder layer {index} is not the output of layer "
                f"{index - 1} (this model changes the hidden states between layers); use checkpoint_every=1"
            )
        self._last_output = None
        self.current.ran = index + 1
        return self.current

    def end_layer(self, index: int, output: Any) -> None:
        if index + 1 < self.num_layers:
            # the next layer must get this very tensor (or an alias of its storage, as DeepSpeed ZeRO-3's module
            # hooks pass on): then the regenerated input equals the forward's
            self._last_output = _hidden(output)
        else:  # the forward is over: from now on only its graph refers to it
            self._last_output = self.current = None


def _identity(x: Any) -> Any:
    return x


def strided_checkpoint(
    function: Callable[..., Any],
    *args: Any,
    groups: LayerGroups,
    index: int,
    module: torch.nn.Module | None = None,
    pack: Callable[[torch.Tensor], Any] = _identity,
    unpack: Callable[[Any], torch.Tensor] = _identity,
    **kwargs: Any,
) -> Any:
    """Non-reentrant ``checkpoint(function, *args)`` of decoder layer ``index`` (``module``) under ``groups``'
    layer-input policy.

    ``args[0]`` is the layer input ``hidden_states`` (batch, seq_local, hidden). ``pack``/``unpack`` are how a
    stored input is held (identity: on the device; the offload hooks: in host memory); other saved inputs go the
    same way. ``kwargs`` go to ``checkpoint`` (``use_reentrant`` must stay False).
    """
    if kwargs.pop("use_reentrant", False):
        raise ValueError("checkpoint_every > 1 works with non-reentrant checkpointing only")
    hidden = args[0]
    forward = groups.start_layer(index, hidden)
    state = ForwardState.capture(hidden.device)
    head = index % groups.every == 0

    def pack_hook(t: torch.Tensor) -> Any:
        if not _same_tensor(t, hidden):
            return pack(t)
        if head:
            packed = pack(t)
            # detached: the forward pass must not refer back into the graph that refers to it (a cycle through
            # autograd nodes that Python's collector cannot see)
            forward.stored[index] = packed.detach() if isinstance(packed, torch.Tensor) else packed
            return packed
        return Regenerate(index, forward)

    def unpack_hook(packed: Any) -> torch.Tensor:
        if isinstance(packed, Regenerate):
            return packed.forward.regenerate(packed.index, unpack)
        return unpack(packed)

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        output = checkpoint(function, *args, use_reentrant=False, **kwargs)
    forward.layers[index] = (function, state, module)
    groups.end_layer(index, output)
    return output
