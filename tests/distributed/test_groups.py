"""DP x SP process groups and USP subgroups on 4 gloo ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

import easy_context as ec
from tests.support.reference import reference_with_grads, rel_err


def mesh_worker(rank, world, algo, opts):
    """sp_size=2: ranks {0,1} and {2,3} each run one sample with SP; DP groups are {0,2} and {1,3}."""
    ec.reset_groups()
    try:
        sp_group, dp_group = ec.init_sp_groups(2)
        assert ec.init_sp_groups(2) == (sp_group, dp_group), "groups are created once and cached"
        assert ec.get_sp_group() is sp_group and ec.get_dp_group() is dp_group
        sp_rank, sp_size = dist.get_rank(sp_group), dist.get_world_size(sp_group)
        assert dist.get_process_group_ranks(sp_group) == [rank - rank % 2, rank - rank % 2 + 1]
        assert dist.get_process_group_ranks(dp_group) == [rank % 2, rank % 2 + 2]
        dp_rank = rank // 2
        g = torch.Generator().manual_seed(100 + dp_rank)  # a different sample per DP rank
        q, dout = (torch.randn(1, 24, 4, 16, generator=g) for _ in range(2))
        k, v = (torch.randn(1, 24, 2, 16, generator=g) for _ in range(2))
        ref = reference_with_grads(q, k, v, dout, causal=True)
        shard = lambda x: ec.extract_local(algo, x, sp_rank, sp_size, **opts)  # noqa: E731
        ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
        out = ec.get_attn_func(algo, **opts)(ql, kl, vl)  # group=None -> the mesh's SP group
        out.backward(shard(dout))
        errs = [rel_err(x, shard(r)) for x, r in zip((out, ql.grad, kl.grad, vl.grad), ref)]
        return max(errs)
    finally:
        ec.reset_groups()


def test_dp_sp_mesh_every_backend(dist_pool):
    pool = dist_pool(4)
    for algo, opts in [
        ("zigzag_ring_attn", {}),
        ("ulysses_attn", {}),
        ("usp_attn", {"ring_degree": 2}),
        ("usp_attn", {"ring_degree": 1}),
        ("dist_flash_attn", {}),
    ]:
        errs = pool.run(mesh_worker, algo, opts)
        assert max(errs) < 1e-5, (algo, opts, errs)


def bad_mesh_worker(rank, world):
    ec.reset_groups()
    try:
        ec.init_sp_groups(3)
    except ValueError as e:
        return str(e)
    return "no error"


def test_sp_size_must_divide_world(dist_pool):
    msgs = dist_pool(4).run(bad_mesh_worker)
    assert all("sp_size=3 must divide the world size 4" in m for m in msgs)
