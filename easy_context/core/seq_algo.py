"""What a sequence-parallel backend is: a shard function, a length rule and an attention implementation.

Every backend sub-package exports one :class:`SeqAlgo`. The attention implementation has the fixed
signature ``impl(q, k, v, kernel, softmax_scale, causal, group, **options) -> out`` on local shards
(b, s_local, h, d), plus a keyword ``documents`` (:class:`~easy_context.core.documents.Documents`) when it implements
document masking; :meth:`SeqAlgo.attn_func` wraps it in the public
``attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None, position_ids=None, documents=None,
softcap=None, sliding_window=None, sinks=None)`` with the checks every backend shares (dropout, shapes, kernel
choice, default SP group, documents, variants). The variants (docs/attention_variants.md): ``softcap`` is bound into
the kernel (every backend computes it); ``impl`` takes keywords ``window`` (a causal sliding window, cut per block:
:mod:`easy_context.core.windows`) and ``sinks`` ((heads,) logits, merged once) when it implements them.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from easy_context.core.documents import Documents, local_documents
from easy_context.core.groups import get_sp_group
from easy_context.core.layout import Layout, heads_of, length_error, ring_rule, seq_multiple_call
from easy_context.core.ring_schedule import RingSchedule
from easy_context.core.shape_check import check_local_shapes
from easy_context.core.spans import Span, spans_of
from easy_context.core.windows import check_window
from easy_context.kernels import KERNEL_NAMES, default_scale, get_kernel
from easy_context.kernels.base import check_heads_per_call, check_shapes

AttnFunc = Callable[..., torch.Tensor]
KERNEL_OPTIONS = ("kernel", "heads_per_call")  # options of the local kernel, not of the backend's layout
_VARIANT_NAMES = {
    "documents": "document masking (packed documents: position_ids that restart inside a row)",
    "window": "sliding-window attention",
    "sinks": "attention sinks",
}


def _check_sinks(algo: str, sinks: torch.Tensor | None, q: torch.Tensor) -> None:
    """``ValueError`` unless ``sinks`` is None or one logit per query head of ``q`` (b, s, heads, d)."""
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (q.shape[2],)):
        shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"{algo}: sinks must be a ({q.shape[2]},) tensor (one logit per query head), got {shape}")


def _with_length_fix(message: str, algo: SeqAlgo, world: int, opts: dict[str, Any]) -> str:
    """An empty-shard error with the length that fixes it (the full sequence this backend needs on ``world``)."""
    if "empty sequence" not in message:
        return message
    need = algo.seq_multiple(world, **opts)
    per_rank = f" ({need // world} per rank)" if algo.distributed and world > 1 else ""
    return (f"{message}: {algo.name} on {world} rank{'s' * (world > 1)} needs a full sequence of at least {need} "
            f"tokens{per_rank}, a multiple of {seq_multiple_call(algo.name, world, opts)}")  # fmt: skip


def compute_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v in one dtype, as transformers' own attention would compute them: the autocast dtype when autocast is
    on (RoPE hands over fp32 q/k next to a bf16 v under bf16 AMP), else the widest of the three. The casts are
    differentiable, so gradients come back in each input's dtype."""
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    device = q.device.type
    if torch.is_autocast_enabled(device):
        target = torch.get_autocast_dtype(device)
    else:
        target = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return q.to(target), k.to(target), v.to(target)


def equal_head_dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v with one head dim: where V's differs from Q/K's (MLA after projection, e.g. 192 vs 128) the narrower
    side is zero-padded. Exact: zero Q/K dims add nothing to the scores, zero V dims give zero output dims (slice
    them off: ``out[..., :v_dim]``), and the pads' gradients are dropped by autograd. Every kernel, ring exchange and
    all-to-all then sees (batch, seq, heads, max(d_qk, d_v)) tensors; costs the pad's FLOPs and traffic."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if d_qk == d_v:
        return q, k, v
    if d_v < d_qk:
        return q, k, torch.nn.functional.pad(v, (0, d_qk - d_v))
    pad = (0, d_v - d_qk)
    return torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), v


@dataclass(frozen=True)
class OptionFlag:
    """How a backend option is given on the command line (``--name`` and ``--name-with-dashes``, default None: the
    backend's own default) and the values worth trying on ``world_size`` ranks (``candidates``, for the planner's
    search; None: only the default)."""

    help: str
    type: Callable[[str], Any] = int
    candidates: Callable[[int], Sequence[Any]] | None = None


@dataclass(frozen=True)
class SeqAlgo:
    """A sequence-parallel backend.

    ``shard(value, rank, world_size, dim, **options)`` returns this rank's piece of a full sequence;
    ``multiple(world_size, **options)`` is the number the full length must divide by;
    ``impl`` computes attention on local shards; ``distributed`` is False only for data parallel;
    ``layout_rule(world_size, heads, kv_heads, **options)`` returns the :class:`~easy_context.core.layout.Layout` fields
    this backend decides (ring, ulysses, kv_rep, shard, resolved options, infeasible); :meth:`layout` adds the rest;
    ``spans(rank, world_size, seq_local, **options)`` the global rows of a rank's local rows as
    :class:`~easy_context.core.spans.Span` runs (None: derived from ``shard``; see :meth:`global_rows`);
    ``flags``: option name -> :class:`OptionFlag`, the command-line flag of each option (train.py, the evals and the
    planner add them for every registered backend: :func:`easy_context.core.registry.add_option_args`).
    """

    name: str
    shard: Callable[..., torch.Tensor]
    multiple: Callable[..., int]
    impl: Callable[..., torch.Tensor]
    distributed: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # option name -> default
    layout_rule: Callable[..., dict[str, Any]] = ring_rule
    spans: Callable[..., tuple[Span, ...]] | None = None
    flags: Mapping[str, OptionFlag] = field(default_factory=dict)
    ring_schedule: RingSchedule | None = None  # a lockstep ring the document balancer can even out

    @property
    def masks_documents(self) -> bool:
        """Whether ``impl`` implements document masking (takes ``documents``)."""
        return self.implements("documents")

    def implements(self, keyword: str) -> bool:
        """Whether ``impl`` takes ``keyword`` (``documents``, ``window``, ``sinks``)."""
        return keyword in inspect.signature(self.impl).parameters

    def _options(self, kw: dict[str, Any]) -> dict[str, Any]:
        unknown = set(kw) - set(self.options)
        if unknown:
            raise TypeError(f"{self.name} does not take {sorted(unknown)}; its options are {sorted(self.options)}")
        return {**self.options, **kw}

    def extract_local(self, value: torch.Tensor, rank: int, world_size: int, dim: int = 1, **kw) -> torch.Tensor:
        opts = self._options(kw)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.check_length(value.shape[dim], world_size, **kw)
        return self.shard(value, rank, world_size, dim, **opts).contiguous()

    def options_from(self, flags: dict[str, Any]) -> dict[str, Any]:
        """This backend's options taken from ``flags`` (e.g. the CLI's ``{"ring_degree": ...}``); a flag that is set
        (not None) but that this backend does not take raises ``ValueError`` (it would be silently ignored)."""
        ignored = sorted(k for k, v in flags.items() if v is not None and k not in self.options)
        if ignored:
            taken = sorted(self.options)
            raise ValueError(f"{', '.join(ignored)} does not apply to {self.name} (its options: {taken})")
        return {name: flags.get(name, default) for name, default in self.options.items()}

    def global_rows(self, rank: int, world_size: int, seq_local: int, **kw) -> tuple[Span, ...]:
        """Where rank ``rank``'s ``seq_local`` local rows sit in the full sequence: contiguous runs
        (:class:`~easy_context.core.spans.Span`), in local order. Data parallel: the whole sequence."""
        opts = self._options(kw)
        if self.spans is not None:
            return self.spans(rank, world_size, seq_local, **opts)
        full = seq_local * world_size if self.distributed else seq_local
        return spans_of(self.shard(torch.arange(full)[None], rank, world_size, 1, **opts)[0])

    def seq_multiple(self, world_size: int, **kw) -> int:
        """The number the full sequence length must be a multiple of on ``world_size`` ranks."""
        return self.multiple(world_size, **self._options(kw))

    def check_length(self, length: int, world_size: int, what: str = "sequence length", **kw) -> None:
        """``ValueError`` naming the padding that fixes it when a full sequence of ``length`` does not shard."""
        error = length_error(self.name, length, self.seq_multiple(world_size, **kw), world_size, kw, what)
        if error:
            raise ValueError(error)

    def option_choices(self, world_size: int, **given) -> Iterator[dict[str, Any]]:
        """The option sets worth trying on ``world_size`` ranks: ``given`` (the others at their defaults) first, then
        every combination of the :attr:`flags` candidates of the options not given (the planner's search)."""
        given = {k: v for k, v in given.items() if v is not None}
        self._options(given)  # unknown options raise
        yield given
        open_ = [n for n, f in self.flags.items() if n not in given and f.candidates is not None]
        if open_:
            for values in itertools.product(*(self.flags[n].candidates(world_size) for n in open_)):
                yield {**given, **dict(zip(open_, values))}

    def feasible_layouts(self, world_size: int, heads: int, kv_heads: int | None = None, **given) -> Iterator[Layout]:
        """The layouts this backend can run over :meth:`option_choices` (the default first), one per resolved
        option set: what the planner searches and the benches pick their variants from."""
        seen = []
        for opts in self.option_choices(world_size, **given):
            lay = self.layout(world_size, heads, kv_heads, **opts)
            if lay.infeasible is None and lay.options not in seen:
                seen.append(lay.options)
                yield lay

    def model_layout(self, world_size: int, config: Any, **kw) -> Layout:
        """:meth:`layout` for the heads of a transformers model ``config``."""
        return self.layout(world_size, *heads_of(config), **kw)

    def layout(self, world_size: int, heads: int, kv_heads: int | None = None, **kw) -> Layout:
        """How this backend spreads a sequence and ``heads`` query / ``kv_heads`` K/V heads over ``world_size``
        ranks (see :class:`~easy_context.core.layout.Layout`; check ``infeasible`` or call ``require()``)."""
        opts = self._options(kw)
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        try:
            fields = {"shard": world_size, "options": opts, **self.layout_rule(world_size, heads, kv_heads or heads,
                                                                                **opts)}  # fmt: skip
            multiple = self.multiple(world_size, **fields["options"])
        except ValueError as exc:  # an option the world size rules out (e.g. a ring_degree that does not divide it)
            fields = {"shard": world_size, "options": opts, "infeasible": str(exc)}
            multiple = 1
        why = fields.get("infeasible")
        if why and not why.startswith(f"{self.name}:"):
            fields["infeasible"] = f"{self.name}: {why}"
        return Layout(self.name, world_size, multiple, **fields)

    def attn_func(self, kernel: str = "auto", heads_per_call: int | None = None, **kw) -> AttnFunc:
        """The attention on local shards with ``kernel``, at most ``heads_per_call`` query heads per kernel call
        (:meth:`~easy_context.kernels.base.AttnKernel.with_heads_per_call`), and the backend's options ``kw``."""
        if kernel not in KERNEL_NAMES:
            raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {KERNEL_NAMES}")
        check_heads_per_call(heads_per_call)  # refused here, not at the first forward
        opts = self._options(kw)
        algo = self
        pad_hint = seq_multiple_call(algo.name, "world_size", kw)

        def attn(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = True, group=None,
                 position_ids: torch.Tensor | None = None, documents: Documents | None = None,
                 softcap: float | None = None, sliding_window: int | None = None,
                 sinks: torch.Tensor | None = None):  # fmt: skip
            if dropout_p:
                raise NotImplementedError(
                    f"{algo.name}: attention dropout is not supported by easy_context attention; "
                    "set the model's attention_dropout to 0"
                )
            q, k, v = compute_dtype(q, k, v)
            scale = default_scale(q.shape[-1], softmax_scale)  # of the real Q/K head dim, before any padding
            world = 1
            try:
                if algo.distributed:  # every rank raises together, also when only one rank's inputs are wrong
                    group = get_sp_group() if group is None else group
                    world = torch.distributed.get_world_size(group)
                    check_local_shapes(algo.name, q, k, v, group, causal, scale, pad_hint, documents)
                else:
                    check_shapes(q, k, v, causal=False, v_dim_may_differ=True)
            except ValueError as exc:
                raise ValueError(_with_length_fix(str(exc), algo, world, opts)) from None
            v_dim = v.shape[-1]  # checked above on the inputs as given (every rank the same); padded once here
            q, k, v = equal_head_dims(q, k, v)
            if documents is None and position_ids is not None:  # one all-gather per position_ids tensor (cached)
                documents = local_documents(algo, position_ids, group, **opts)
            window = check_window(algo.name, sliding_window, causal)
            if window is not None and window >= q.shape[1] * world:
                window = None  # every key of the sequence is in the window: plain causal attention
            _check_sinks(algo.name, sinks, q)
            needs = (("softcap",) if softcap else ()) + (("band",) if window is not None else ())
            kern = get_kernel(kernel, q.device, q.dtype, q.shape[-1], needs).with_softcap(softcap)
            kern = kern.with_heads_per_call(heads_per_call)
            if documents is not None:
                documents.check(algo.name, q.shape[1] * world, q.shape[0])
            extra = {name: x for name, x in (("documents", documents), ("window", window), ("sinks", sinks))
                     if x is not None}  # fmt: skip
            for name in extra:
                if not algo.implements(name):
                    raise NotImplementedError(
                        f"{algo.name}: this backend does not implement {_VARIANT_NAMES[name]}; use one of "
                        f"{', '.join(algos_implementing(name))}"
                    )
            return algo.impl(q, k, v, kern, scale, causal, group, **extra, **opts)[..., :v_dim]

        attn.__name__ = f"{algo.name}_attn"
        attn.__doc__ = inspect.getdoc(algo.impl)
        return attn


# The backends by name (filled through easy_context.core.registry.register_seq_algo; here, below the registry, so
# that a backend's attention can name the others that implement what it lacks)
REGISTERED: dict[str, SeqAlgo] = {}


def algos_implementing(keyword: str) -> tuple[str, ...]:
    """The registered backends whose attention takes ``keyword`` (``documents``, ``window``, ``sinks``)."""
    return tuple(name for name, algo in REGISTERED.items() if algo.implements(keyword))
