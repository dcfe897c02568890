"""prepare_dataloader under DP x SP: SP groups share batches, DP groups split the data."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader

import easy_context as ec
from easy_context.training import dataloader
from tests.support.dist_pool import RemoteError


def _accelerator():
    os.environ["ACCELERATE_USE_CPU"] = "1"
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def loader_worker(rank, world, algo, sp_size):
    ec.reset_groups()
    try:
        data = torch.arange(16 * 4).view(16, 4)
        loader = ec.prepare_dataloader(algo, DataLoader(data, batch_size=2), _accelerator(), sp_size=sp_size)
        return [batch[:, 0].tolist() for batch in loader]
    finally:
        ec.reset_groups()


@pytest.mark.parametrize("algo", ["zigzag_ring_attn", "data_parallel"])
def test_dp_sp_sharding(dist_pool, algo):
    seen = dist_pool(4).run(loader_worker, algo, 2)
    firsts = [sorted(x for b in batches for x in b) for batches in seen]
    if algo == "data_parallel":  # every rank its own quarter of the data
        assert sorted(sum(firsts, [])) == list(range(0, 64, 4))
        return
    assert seen[0] == seen[1] and seen[2] == seen[3], "ranks of one SP group must see the same batches"
    assert not set(firsts[0]) & set(firsts[2]), "the two DP groups must see different data"
    assert sorted(firsts[0] + firsts[2]) == list(range(0, 64, 4))


def mismatch_worker(rank, world):
    ec.reset_groups()
    try:
        ec.init_sp_groups()
        loader = DataLoader(torch.full((4, 2), rank), batch_size=2)  # rank-dependent: wrong for SP
        list(dataloader._SameBatchCheck(loader))
    finally:
        ec.reset_groups()


def test_different_batches_in_sp_group_raise(dist_pool):
    with pytest.raises(RemoteError, match="received different batches"):
        dist_pool(2).run(mismatch_worker)
