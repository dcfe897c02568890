"""Counting how many times code looks a backend up by name in easy_context's registry."""

from __future__ import annotations

import collections
from collections.abc import Callable
from unittest import mock


class _CountingRegistry(dict):
    """The registry of backends (name -> SeqAlgo), counting lookups by name."""

    def __init__(self, algos: dict):
        super().__init__(algos)
        self.lookups: collections.Counter[str] = collections.Counter()

    def __getitem__(self, name):
        self.lookups[name] += 1
        return super().__getitem__(name)


def count_lookups(run: Callable[[], object]) -> int:
    """How many times ``run()`` looked a backend up by name (``get_seq_algo`` with a name, wherever it is imported)."""
    from easy_context.core import registry

    counting = _CountingRegistry(registry._ALGOS)
    with mock.patch.object(registry, "_ALGOS", counting):
        run()
    return sum(counting.lookups.values())
