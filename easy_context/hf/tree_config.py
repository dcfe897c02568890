"""One config object per switched model tree.

transformers 5 gives a model and its sub-models one config object (``model.config is model.model.config``): config
edits (``model.config.use_cache = False``) and ``set_experts_implementation`` reach every part through it. Its
``from_config(cfg)`` keeps ``cfg`` itself, so models merely built from one config object share it too (twins).
Switching a model's attention writes into its config, so a switched model needs configs of its own (its twins keep the
one they were built from), shared among its own modules exactly as transformers shared them, whatever parts of it were
switched before and in whatever order: a sub-model (a backbone under a custom head, a VLM's language model), then its
parent; the parent, then a sub-model; the same model twice.

:func:`private_config` owns that rule. The first switch of a tree deep-copies, in one copy, every config its modules
hold, and remembers each copy with the model whose tree holds it; a later switch of a tree that holds switched
sub-models adopts their copies instead of copying again; a switch of a part of a switched tree keeps the tree's.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

from torch import nn
from transformers import PretrainedConfig

from easy_context.hf.support import with_sub_configs


@dataclass(frozen=True)
class _Copy:
    """A config easy_context copied: the copy, what it was copied from, and the model whose tree holds it."""

    config: weakref.ref
    original: weakref.ref
    root: weakref.ref


_COPIES: dict[int, _Copy] = {}  # id(copy) -> its record (configs are not hashable)


def _copy_of(config: Any) -> _Copy | None:
    entry = _COPIES.get(id(config))
    return entry if entry is not None and entry.config() is config else None


def _forget(key: int):
    def callback(ref: weakref.ref) -> None:
        entry = _COPIES.get(key)
        if entry is not None and entry.config is ref:
            del _COPIES[key]

    return callback


def _within(part: nn.Module | None, whole: nn.Module | None) -> bool:
    """Whether ``part`` is ``whole`` or one of its modules."""
    return part is not None and whole is not None and any(m is part for m in whole.modules())


def switched_root(model: nn.Module) -> nn.Module | None:
    """The model whose switched tree holds ``model`` (``model`` itself, or a model it is part of) when ``model``'s
    config is that tree's private copy; None when ``model`` has not been given a config of its own yet."""
    entry = _copy_of(getattr(model, "config", None))
    root = entry.root() if entry is not None else None
    return root if _within(model, root) else None


def _holders(model: nn.Module) -> list[tuple[nn.Module, PretrainedConfig]]:
    return [(m, m.config) for m in model.modules() if isinstance(getattr(m, "config", None), PretrainedConfig)]


def private_config(model: nn.Module) -> PretrainedConfig:
    """Make every module of ``model`` hold configs private to ``model``'s tree (one object wherever transformers gave
    one) and return ``model.config``. A model built from the same config object as ``model`` keeps that object."""
    if switched_root(model) is not None:
        return model.config
    holders = _holders(model)
    memo: dict[int, Any] = {}
    for _, config in holders:  # copies made for sub-models switched before: the tree adopts them
        entry = _copy_of(config)
        if entry is None or not _within(entry.root(), model):
            continue
        original = entry.original()
        memo[id(config)] = config if original is None else memo.setdefault(id(original), config)
    originals = list({id(c): c for _, c in holders}.values())
    copy.deepcopy(originals, memo)  # one copy: configs shared among the modules stay shared among them
    for module, config in holders:
        module.config = memo[id(config)]
    for original in originals:
        _remember(original, memo[id(original)], model)
    return model.config


def _remember(original: PretrainedConfig, private: PretrainedConfig, root: nn.Module) -> None:
    """Record ``private`` (the copy of ``original``) and its sub-configs as held by ``root``'s tree."""
    for source, config in zip(with_sub_configs(original), with_sub_configs(private)):
        entry = _copy_of(config)
        origin = entry.original if entry is not None else weakref.ref(source)
        _COPIES[id(config)] = _Copy(weakref.ref(config, _forget(id(config))), origin, weakref.ref(root))
