"""Attention variants of today's decoders under every SP backend: value head dim != query/key head dim (MLA).

(The tiny DeepSeek-V3 model's parity, with the other variant models, is
tests/distributed/test_attention_variants2.py's.)"""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from tests.support.reference import rel_err


def reference(q, k, v, causal):
    """Explicit fp64 softmax attention with GQA; q/k (b, s, h, d_qk), v (b, s, h_kv, d_v)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2).double(), v.repeat_interleave(rep, 2).double()
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


DIMS = {"v-narrower": (24, 16), "v-wider": (16, 24)}  # (d_qk, d_v)


def unequal_head_dims_worker(rank, world, algo, opts):
    """{(dims, causal): errors} of out, dq, dk, dv against the fp64 reference, both dims, causal and full."""
    hq, hkv = (6, 3) if world == 3 else (4, 2)  # Ulysses splits the heads over the world
    shard_opts = {k_: v_ for k_, v_ in opts.items() if k_ != "kernel"}
    results = {}
    for (name, (d_qk, d_v)), causal in ((d, c) for d in DIMS.items() for c in (True, False)):
        g = torch.Generator().manual_seed(3)
        seq = 8 * world
        q = torch.randn(2, seq, hq, d_qk, generator=g)
        k = torch.randn(2, seq, hkv, d_qk, generator=g)
        v = torch.randn(2, seq, hkv, d_v, generator=g)
        dout = torch.randn(2, seq, hq, d_v, generator=g)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        ref = reference(*leaves, causal)
        ref.backward(dout.double())
        local = [ec.extract_local(algo, x, rank, world, **shard_opts).detach().requires_grad_() for x in (q, k, v)]
        out = ec.get_attn_func(algo, **opts)(*local, causal=causal)
        out.backward(ec.extract_local(algo, dout, rank, world, **shard_opts))
        assert out.shape[-1] == d_v
        errs = {"out": rel_err(out, ec.extract_local(algo, ref.detach().float(), rank, world, **shard_opts))}
        for x_name, x, leaf in zip("qkv", local, leaves):
            errs["d" + x_name] = rel_err(x.grad, ec.extract_local(algo, leaf.grad.float(), rank, world, **shard_opts))
        results[f"{name} causal={causal}"] = errs
    return results


# every backend on 2, 3 and 4 ranks (USP: both degenerate grids on 2 and 3, the 2 x 2 grid on 4); data_parallel
# attends locally (the world size does not enter)
WORLDS = [(algo, {}, w) for w in (2, 3, 4) for algo in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn")]
WORLDS += [("usp_attn", {"ring_degree": r}, w) for w, r in ((2, 1), (2, 2), (3, 1), (3, 3), (4, 2))]
WORLDS += [("data_parallel", {"kernel": "cpu"}, 2)]


@pytest.mark.parametrize("algo,opts,world", WORLDS, ids=[f"{a}-{o.get('ring_degree', '')}w{w}" for a, o, w in WORLDS])
def test_value_head_dim_differs_from_query_key(dist_pool, algo, opts, world):
    """Output and q/k/v gradients of attention with d_v != d_qk (zero-padded to one head dim inside) equal an fp64
    reference, d_v narrower and wider, causal and full (one distributed call per backend and world)."""
    for rank, per_case in enumerate(dist_pool(world).run(unequal_head_dims_worker, algo, opts)):
        for case, errs in per_case.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"rank {rank} {case}: {worst} rel err {errs[worst]:.2e}"
