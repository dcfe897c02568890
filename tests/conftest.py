import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from tests.dist_pool import DistPool  # noqa: E402

_POOLS: dict[int, DistPool] = {}


def get_pool(world_size: int) -> DistPool:
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = DistPool(world_size)
    return pool


@pytest.fixture(scope="session")
def dist_pool():
    """``dist_pool(W)`` -> a live pool of W gloo ranks (started once per session and size)."""
    yield get_pool
    for pool in _POOLS.values():
        pool.close()
