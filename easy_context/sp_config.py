"""One resolved sequence-parallel setup per process: the backend, its options, the kernel and the ranks.

train.py, the evals and the benches build it with one call and ask it every layout question::

    sp = resolve_sp_config("usp_attn", sp_size=4, kernel="auto", ring_degree=None)  # defaults resolved
    sp.check_model(model.config).check_length(65536)   # the backend's own rules: heads, length multiple
    sp.attach(model)                                    # the model attends through sp (see attach)
    local = sp.local_batch(input_ids, position_ids, target_ids, "cuda")  # this rank's piece of one batch

Building it joins (or creates) the process group: without one, a 1-process gloo group (a ``HashStore``) so SP code
runs unchanged on one process; then the DP x SP mesh (:func:`~easy_context.core.groups.init_sp_groups`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from easy_context.core.groups import get_dp_group, get_sp_group, init_sp_groups
from easy_context.core.layout import Layout
from easy_context.core.registry import get_seq_algo, unknown_mode_error
from easy_context.core.seq_algo import SeqAlgo
from easy_context.kernels import KERNEL_NAMES
from easy_context.kernels.base import check_heads_per_call


class LocalBatch(NamedTuple):
    """This rank's piece of one batch, each ``(batch, seq_local)`` int64 on the device: input ids, their global
    position ids, the targets (target ``i`` is the token after input ``i``; -100: none; a switched model's
    ``shift_labels=``) and, when one was given, the padding attention mask."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    target_ids: torch.Tensor | None
    attention_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class SPConfig:
    """This process's place in a DP x SP job and the backend it attends with.

    ``backend``: a registered backend name (``zigzag_ring_attn``, ``data_parallel``, ...); ``options``: its options
    with defaults resolved (``{"ring_degree": 2}`` for usp_attn); ``kernel``: the local attention kernel
    (``"auto"``: the first that works on the device); ``heads_per_call``: at most this many query heads per kernel
    call (:meth:`~easy_context.kernels.base.AttnKernel.with_heads_per_call`); ``sp_rank`` / ``sp_size``: this rank
    in its sequence group;
    ``dp_rank`` / ``dp_size``: its sequence group among the replicas (``sp_size * dp_size == world_size``).
    """

    backend: str
    options: Mapping[str, Any] = field(default_factory=dict)
    kernel: str = "auto"
    sp_rank: int = 0
    sp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    heads_per_call: int | None = None  # query heads per local kernel call (a memory bound; None: whole calls)

    @property
    def algo(self) -> SeqAlgo:
        return get_seq_algo(self.backend)

    @property
    def world_size(self) -> int:
        return self.sp_size * self.dp_size

    @property
    def distributed(self) -> bool:
        """True when the ranks of an SP group share each sequence; False for ``data_parallel``."""
        return self.algo.distributed

    @property
    def data_shards(self) -> int:
        """How many ranks read different samples: the replicas under SP, every rank under data parallel."""
        return self.dp_size if self.distributed else self.world_size

    @property
    def data_rank(self) -> int:
        """Which of the :attr:`data_shards` this rank reads."""
        return self.dp_rank if self.distributed else self.dp_rank * self.sp_size + self.sp_rank

    def layout(self, heads: int, kv_heads: int | None = None) -> Layout:
        """The backend's layout for ``heads`` query / ``kv_heads`` K/V heads over the SP group (not checked)."""
        return self.algo.layout(self.sp_size, heads, kv_heads, **self.options)

    def check_model(self, config: Any) -> Layout:
        """The layout for a transformers model ``config``, or ``ValueError`` naming why it cannot run here."""
        return self.algo.model_layout(self.sp_size, config, **self.options).require()

    def check_run(self, config: Any, seq_length: int, what: str = "--seq-length") -> Layout:
        """The layout for a model ``config`` trained on full sequences of ``seq_length`` tokens, or ``ValueError``
        naming why it cannot run here (heads that do not split, a length that does not shard): train.py's check,
        also what the extension's plans are held to before they run."""
        return self.check_model(config).check_length(seq_length, what)

    def seq_multiple(self) -> int:
        """The number a full sequence length must divide by on this SP group."""
        return self.algo.seq_multiple(self.sp_size, **self.options)

    def shard(self, input_ids: torch.Tensor, position_ids: torch.Tensor, target_ids: torch.Tensor,
              device: torch.device | str,
              attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """This rank's ``local_input_ids`` / ``local_position_ids`` / ``local_target_ids`` (and
        ``local_attention_mask`` when a mask is given) of full ``(batch, seq)`` tensors
        (:func:`easy_context.prepare_seq_parallel_inputs`)."""
        from easy_context.core.inputs import prepare_seq_parallel_inputs

        return prepare_seq_parallel_inputs(self.backend, input_ids, position_ids, target_ids, self.sp_rank,
                                           self.sp_size, device, attention_mask, **self.options)  # fmt: skip

    def local_batch(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, target_ids: torch.Tensor | None,
                    device: torch.device | str, *, pad_token_id: int | None = None,
                    attention_mask: torch.Tensor | None = None) -> LocalBatch:  # fmt: skip
        """This rank's :class:`LocalBatch` of full ``(batch, seq)`` host or device tensors, moved to ``device`` once:
        the one shard path of train.py, the Trainer and the evals. ``target_ids`` are already shifted (target ``i``
        is the token after input ``i``). With ``pad_token_id`` the sequence is first padded to the backend's
        multiple (pad tokens last, targets -100, positions counting on); without it the length must divide.
        ``position_ids`` None: ``0 .. seq-1`` per row. ``attention_mask``: a (batch, seq) left / right padding mask
        (a switched model's ``attention_mask=``), padded with zeros and sharded like the ids."""
        from easy_context.core.inputs import pad_seq_parallel_inputs

        if pad_token_id is not None:
            length = input_ids.shape[1]
            input_ids, position_ids, target_ids = pad_seq_parallel_inputs(
                self.backend, input_ids, position_ids, target_ids, self.sp_size, pad_token_id, **self.options
            )
            if attention_mask is not None:
                attention_mask = torch.nn.functional.pad(attention_mask, (0, input_ids.shape[1] - length), value=0)
        elif position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        local = self.shard(input_ids, position_ids, target_ids, device, attention_mask)
        return LocalBatch(local["local_input_ids"], local["local_position_ids"], local["local_target_ids"],
                          local.get("local_attention_mask"))  # fmt: skip

    def attach(self, model: Any, *, through_easy_context: bool | None = None) -> Any:
        """Make a transformers ``model`` attend with this backend and kernel; returns it.

        A distributed backend always replaces the model's attention. Under ``data_parallel`` the model keeps its
        own attention unless ``through_easy_context`` (None: only when a kernel other than ``"auto"`` is named):
        checkpoint-after-attention and the benches need easy_context's kernel interface there.
        """
        from easy_context.hf.patch import apply_seq_parallel_monkey_patch

        if through_easy_context is None:
            through_easy_context = self.kernel != "auto"
        return apply_seq_parallel_monkey_patch(self.backend, model, always=through_easy_context or self._split_calls,
                                               **self._kernel_options, **self.options)  # fmt: skip

    @property
    def _split_calls(self) -> bool:
        return self.heads_per_call is not None

    @property
    def _kernel_options(self) -> dict[str, Any]:
        """``kernel`` and, when set, ``heads_per_call``: the local kernel's options (``KERNEL_OPTIONS``)."""
        return {"kernel": self.kernel} | ({"heads_per_call": self.heads_per_call} if self._split_calls else {})

    def attn_func(self):
        """The backend's attention function on local shards, ``(batch, seq_local, heads, head_dim)`` in and out."""
        return self.algo.attn_func(**self._kernel_options, **self.options)


def _options(backend: str, kernel: str, option_values: dict[str, Any]) -> dict[str, Any]:
    """``backend``'s options from ``option_values`` (defaults not yet resolved); ``ValueError`` for an unknown
    backend or kernel, or a value given for an option the backend does not take."""
    error = unknown_mode_error(backend)
    if error:
        raise ValueError(error)
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {KERNEL_NAMES}")
    return get_seq_algo(backend).options_from(option_values)


def sp_config_for(backend: str, sp_size: int, *, kernel: str = "auto", sp_rank: int = 0, dp_rank: int = 0,
                  dp_size: int = 1, heads_per_call: int | None = None, **option_values: Any) -> SPConfig:  # fmt: skip
    """The :class:`SPConfig` of ``backend`` on SP groups of ``sp_size`` ranks, without touching process groups (for
    planning, checks and tests; :func:`resolve_sp_config` joins the real ones). ``option_values``: backend option
    flags, None when not given; defaults are resolved for ``sp_size`` (usp_attn's ``ring_degree``). ``ValueError``
    for an unknown backend or kernel, an option the backend does not take, or options ``sp_size`` rules out."""
    algo = get_seq_algo(backend)
    options = _options(backend, kernel, option_values)
    # heads that every split allows, so that only the options decide here (a model's heads: SPConfig.check_model)
    layout = algo.layout(sp_size, sp_size, sp_size, **options)
    if layout.infeasible:
        raise ValueError(f"{layout.infeasible} ({sp_size} ranks per sequence)")
    check_heads_per_call(heads_per_call)
    return SPConfig(backend, dict(layout.options), kernel, sp_rank, sp_size, dp_rank, dp_size, heads_per_call)


def resolve_sp_config(backend: str, *, sp_size: int | None = None, kernel: str = "auto",
                      heads_per_call: int | None = None, **option_values: Any) -> SPConfig:  # fmt: skip
    """Join or create the process group and the DP x SP mesh, and resolve ``backend``'s options
    (:func:`sp_config_for` on this rank's groups).

    ``sp_size``: ranks per sequence group (None: the world; ``data_parallel`` ignores the mesh for its data but
    keeps it); ``option_values``: backend option flags, None when not given (e.g. ``ring_degree=None``). Bad input
    (see :func:`sp_config_for`, and an ``sp_size`` that does not divide the world) raises ``ValueError``; what can be
    checked without a process group is checked before one is created.
    """
    _options(backend, kernel, option_values)  # the names of the backend, kernel and options, before any group
    if not dist.is_initialized():
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1:  # a group of one here would train each process alone: silently other math
            raise RuntimeError(
                f"resolve_sp_config: this process was launched as one of {launched} (WORLD_SIZE) but joined no process "
                "group yet; create the Accelerator (or call torch.distributed.init_process_group) first"
            )
        # one process: a process group of one, so the SP code runs unchanged
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    init_sp_groups(sp_size)
    sp_group, dp_group = get_sp_group(), get_dp_group()
    return sp_config_for(backend, dist.get_world_size(sp_group), kernel=kernel, heads_per_call=heads_per_call,
                         sp_rank=dist.get_rank(sp_group),
                         dp_rank=0 if dp_group is None else dist.get_rank(dp_group),
                         dp_size=1 if dp_group is None else dist.get_world_size(dp_group),
                         **option_values)  # fmt: skip
