"""The backends by name, the functional API over them, and the command-line flags they share.

This module holds the registry only: the built-in backends register themselves in :mod:`easy_context.backends`
(imported first by ``import easy_context``), so that the core never imports the backends built on it.
A new backend is its sub-package (a :class:`~easy_context.core.seq_algo.SeqAlgo`) plus :func:`register_seq_algo`:
train.py, the evals, the planner and the benches take its name, its options (:func:`add_option_args`) and its
layout rule (:meth:`SeqAlgo.layout <easy_context.core.seq_algo.SeqAlgo.layout>`) from here.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch
import torch.distributed as dist

from easy_context.cli import positive_int
from easy_context.core.seq_algo import REGISTERED as _ALGOS
from easy_context.core.seq_algo import AttnFunc, OptionFlag, SeqAlgo, algos_implementing
from easy_context.kernels import KERNEL_NAMES


def register_seq_algo(algo: SeqAlgo) -> None:
    """Add a backend (its name becomes valid everywhere a ``seq_algo`` is taken)."""
    global SEQ_ALGOS
    _ALGOS[algo.name] = algo
    SEQ_ALGOS = tuple(_ALGOS)


SEQ_ALGOS: tuple[str, ...] = ()  # filled by easy_context.backends (the built-ins) and later registrations


def get_seq_algo(seq_algo: SeqAlgo | str) -> SeqAlgo:
    """The registered backend of that name (``ValueError`` listing the names otherwise); a backend object is
    returned as it is (callers that hold one pass it on instead of its name)."""
    if isinstance(seq_algo, SeqAlgo):
        return seq_algo
    if seq_algo not in _ALGOS:
        raise ValueError(f"unknown sequence-parallel mode {seq_algo!r}; choose one of {tuple(_ALGOS)}")
    return _ALGOS[seq_algo]


def unknown_mode_error(seq_algo: str) -> str | None:
    """The command-line error for a ``--parallel_mode`` that names no registered backend, else None."""
    if seq_algo in _ALGOS:
        return None
    return f"unknown --parallel_mode {seq_algo!r}; choose one of {', '.join(_ALGOS)}"


def document_masking_algos() -> tuple[str, ...]:
    """The registered backends whose attention implements document masking (packed documents)."""
    return algos_implementing("documents")


def option_flags() -> dict[str, tuple[OptionFlag, tuple[str, ...]]]:
    """Every registered backend option with a command-line flag: name -> (its flag, the backends taking it)."""
    flags: dict[str, OptionFlag] = {}
    owners: dict[str, list[str]] = {}
    for algo in _ALGOS.values():
        for name, flag in algo.flags.items():
            flags.setdefault(name, flag)
            owners.setdefault(name, []).append(algo.name)
    return {name: (flag, tuple(owners[name])) for name, flag in flags.items()}


def add_option_args(parser: argparse.ArgumentParser) -> None:
    """``--<option>`` / ``--<option-with-dashes>`` for every registered backend option (default None: the backend's
    default), e.g. usp_attn's ``--ring_degree``; read them back with :func:`option_values`."""
    for name, (flag, owners) in option_flags().items():
        dashed = f"--{name.replace('_', '-')}"
        spellings = [f"--{name}"] + ([dashed] if dashed != f"--{name}" else [])
        kind = positive_int if flag.type is int else flag.type  # an int option is a size or a degree: 0 is no value
        parser.add_argument(*spellings, type=kind, default=None, help=f"{', '.join(owners)}: {flag.help}")


def add_backend_args(parser: argparse.ArgumentParser, default: str | None, mode_help: str | None = None,
                     kernel_help: str = "local attention kernel") -> None:  # fmt: skip
    """The backend flags train.py and the evals share: ``--parallel_mode`` (EasyContext's flag), every backend
    option (:func:`add_option_args`) and ``--kernel``."""
    parser.add_argument("--parallel_mode", "--parallel-mode", default=default, help=mode_help or ", ".join(_ALGOS))
    add_option_args(parser)
    parser.add_argument("--kernel", default="auto", choices=KERNEL_NAMES, help=kernel_help)


def option_values(args: Any) -> dict[str, Any]:
    """The backend option flags of parsed ``args`` (None where not given), for :meth:`SeqAlgo.options_from`."""
    return {name: getattr(args, name, None) for name in option_flags()}


# The attribute a shard made by extract_local carries: (seq_algo, options, world_size, dim). get_attn_func's attention
# compares it with its own layout: a tensor cannot otherwise tell which backend cut it.
SHARD_LAYOUT = "_easy_context_shard_layout"


def extract_local(seq_algo: str, value: torch.Tensor, rank: int, world_size: int, dim: int = 1, **kw) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor (``dim`` is the sequence dimension). The shard remembers its
    layout: :func:`get_attn_func`'s attention refuses a shard cut for another backend or other options."""
    algo = get_seq_algo(seq_algo)
    local = algo.extract_local(value, rank, world_size, dim, **kw)
    if algo.distributed and world_size > 1 and local is not value:
        setattr(local, SHARD_LAYOUT, (seq_algo, dict(kw), world_size, dim % value.dim()))
    return local


def shard_layout_error(tensor: torch.Tensor, seq_algo: SeqAlgo | str, options: dict[str, Any],
                       world_size: int) -> str | None:  # fmt: skip
    """Why ``tensor`` (a shard from :func:`extract_local`) is not laid out as ``seq_algo`` (a backend or its name)
    with ``options`` lays out a sequence on ``world_size`` ranks (some rank holds other rows); None when it is, or when
    the tensor does not carry its layout. Decided on every rank alike (no communication), so that all ranks raise
    together."""
    made = getattr(tensor, SHARD_LAYOUT, None)
    if made is None or made[3] != 1:
        return None
    ours = get_seq_algo(seq_algo)
    seq_algo = ours.name
    cut_by, cut_options, cut_world, _ = made
    cut = f"{cut_by}{''.join(f', {k}={v!r}' for k, v in cut_options.items())}"
    if cut_world != world_size:
        return (f"{seq_algo}: this shard was cut for {cut_world} ranks (extract_local('{cut}')), the attention runs on "
                f"{world_size}: shard with the SP group's size")  # fmt: skip
    seq_local = tensor.shape[1]
    theirs = get_seq_algo(cut_by)
    for rank in range(world_size):
        if theirs.global_rows(rank, world_size, seq_local, **cut_options) != ours.global_rows(
            rank, world_size, seq_local, **options
        ):
            given = "".join(f", {k}={v!r}" for k, v in options.items() if v is not None)
            fix = f"extract_local('{seq_algo}', x, rank, {world_size}, dim=1{given})"
            return (f"{seq_algo}: the inputs were sharded by extract_local('{cut}'), whose layout differs from "
                    f"{seq_algo}'s on {world_size} ranks (rank {rank} holds other tokens): shard with the backend "
                    f"and options you attend with ({fix})")  # fmt: skip
    return None


def seq_multiple(seq_algo: str, world_size: int, **kw) -> int:
    """The number the full sequence length must be a multiple of for ``seq_algo`` on ``world_size`` ranks."""
    return get_seq_algo(seq_algo).seq_multiple(world_size, **kw)


def get_attn_func(seq_algo: SeqAlgo | str, kernel: str = "auto", heads_per_call: int | None = None, **kw) -> AttnFunc:
    """``attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None, position_ids=None,
    documents=None)`` on local shards.

    q: (batch, seq_local, heads, dim); k/v: (batch, seq_local, heads_kv, dim); output has q's shape.
    Packed documents: ``position_ids`` (this rank's shard of the full sequence's, restarting at each document) or
    ``documents`` (:class:`easy_context.core.documents.Documents` of the full sequence) keep attention inside each
    document (docs/documents.md).
    ``kernel`` picks the local kernel (``auto``, ``cpu``, ``cudnn``, ``flash``, ``efficient``,
    ``flash_attn``, ``math``), ``heads_per_call`` the most query heads per kernel call (a memory bound, the same
    values); other keywords are backend options (e.g. ``ring_degree`` for usp_attn). ``seq_algo``:
    a backend's name, or the backend (looked up once, here).
    """
    algo = get_seq_algo(seq_algo)
    inner = algo.attn_func(kernel, heads_per_call=heads_per_call, **kw)
    if not algo.distributed:
        return inner
    options = algo._options(kw)

    @functools.wraps(inner)
    def attn(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = True, group=None,
             position_ids: torch.Tensor | None = None, documents=None, **variants):  # fmt: skip
        if dist.is_available() and dist.is_initialized():
            from easy_context.core.groups import get_sp_group

            world = dist.get_world_size(get_sp_group() if group is None else group)
            for x in (q, k, v):
                error = shard_layout_error(x, algo, options, world)
                if error:
                    raise ValueError(error)
            if position_ids is not None and documents is None and world > 1:
                documents = checked_documents(algo, position_ids, group, options)
                position_ids = None
        return inner(q, k, v, dropout_p, softmax_scale, causal, group, position_ids=position_ids, documents=documents,
                     **variants)  # fmt: skip

    return attn


def checked_documents(algo, position_ids: torch.Tensor, group, options: dict[str, Any]):
    """The packed documents of the full sequence from this rank's ``position_ids`` shard (one all-gather per
    position_ids tensor, remembered on it), after checking that the ranks' shards fit ``algo``'s layout
    (:func:`~easy_context.core.layout.position_layout_error`: every rank sees the same gathered ids and raises
    alike)."""
    from easy_context.core.documents import gathered_documents

    error, documents = gathered_documents(algo, position_ids, group, **options)
    if error:
        raise ValueError(error)
    return documents
