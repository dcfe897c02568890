"""The backends by name, the functional API over them, and the command-line flags they share.

This module holds the registry only: the built-in backends register themselves in :mod:`easy_context.backends`
(imported first by ``import easy_context``), so that the core never imports the backends built on it.
A new backend is its sub-package (a :class:`~easy_context.core.seq_algo.SeqAlgo`) plus :func:`register_seq_algo`:
train.py, the evals, the planner and the benches take its name, its options (:func:`add_option_args`) and its
layout rule (:meth:`SeqAlgo.layout <easy_context.core.seq_algo.SeqAlgo.layout>`) from here.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ..kernels import KERNEL_NAMES
from .seq_algo import REGISTERED as _ALGOS
from .seq_algo import AttnFunc, OptionFlag, SeqAlgo, algos_implementing


def register_seq_algo(algo: SeqAlgo) -> None:
    """Add a backend (its name becomes valid everywhere a ``seq_algo`` is taken)."""
    global SEQ_ALGOS
    _ALGOS[algo.name] = algo
    SEQ_ALGOS = tuple(_ALGOS)


SEQ_ALGOS: tuple[str, ...] = ()  # filled by easy_context.backends (the built-ins) and later registrations


def get_seq_algo(seq_algo: str) -> SeqAlgo:
    """The registered backend of that name (``ValueError`` listing the names otherwise)."""
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
        parser.add_argument(*spellings, type=flag.type, default=None, help=f"{', '.join(owners)}: {flag.help}")


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


def extract_local(seq_algo: str, value: torch.Tensor, rank: int, world_size: int, dim: int = 1, **kw) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor (``dim`` is the sequence dimension)."""
    return get_seq_algo(seq_algo).extract_local(value, rank, world_size, dim, **kw)


def seq_multiple(seq_algo: str, world_size: int, **kw) -> int:
    """The number the full sequence length must be a multiple of for ``seq_algo`` on ``world_size`` ranks."""
    return get_seq_algo(seq_algo).seq_multiple(world_size, **kw)


def get_attn_func(seq_algo: str, kernel: str = "auto", **kw) -> AttnFunc:
    """``attn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True, group=None, position_ids=None,
    documents=None)`` on local shards.

    q: (batch, seq_local, heads, dim); k/v: (batch, seq_local, heads_kv, dim); output has q's shape.
    Packed documents: ``position_ids`` (this rank's shard of the full sequence's, restarting at each document) or
    ``documents`` (:class:`easy_context.core.documents.Documents` of the full sequence) keep attention inside each
    document (docs/documents.md).
    ``kernel`` picks the local kernel (``auto``, ``cpu``, ``cudnn``, ``flash``, ``efficient``,
    ``flash_attn``, ``math``); other keywords are backend options (e.g. ``ring_degree`` for usp_attn).
    """
    return get_seq_algo(seq_algo).attn_func(kernel, **kw)
