"""Attention variants of today's decoders under every SP backend: value head dim != query/key head dim (MLA)."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from tests.reference import rel_err
from tests.test_hf_models import ALGOS, model_parity_worker

BACKENDS = [*ALGOS, ("data_parallel", {"kernel": "cpu"})]


def reference(q, k, v, causal):
    """Explicit fp64 softmax attention with GQA; q/k (b, s, h, d_qk), v (b, s, h_kv, d_v)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2).double(), v.repeat_interleave(rep, 2).double()
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def unequal_head_dims_worker(rank, world, algo, opts, d_qk, d_v, causal):
    g = torch.Generator().manual_seed(3)
    seq = 8 * world
    q = torch.randn(2, seq, 4, d_qk, generator=g)
    k = torch.randn(2, seq, 2, d_qk, generator=g)
    v = torch.randn(2, seq, 2, d_v, generator=g)
    dout = torch.randn(2, seq, 4, d_v, generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = reference(*leaves, causal)
    ref.backward(dout.double())
    shard_opts = {k_: v_ for k_, v_ in opts.items() if k_ != "kernel"}
    local = [ec.extract_local(algo, x, rank, world, **shard_opts).detach().requires_grad_() for x in (q, k, v)]
    out = ec.get_attn_func(algo, **opts)(*local, causal=causal)
    out.backward(ec.extract_local(algo, dout, rank, world, **shard_opts))
    errs = {"out": rel_err(out, ec.extract_local(algo, ref.detach().float(), rank, world, **shard_opts))}
    for name, x, leaf in zip("qkv", local, leaves):
        errs["d" + name] = rel_err(x.grad, ec.extract_local(algo, leaf.grad.float(), rank, world, **shard_opts))
    assert out.shape[-1] == d_v
    return errs


@pytest.mark.parametrize("d_qk,d_v", [(24, 16), (16, 24)], ids=["v-narrower", "v-wider"])
@pytest.mark.parametrize("algo,opts", BACKENDS, ids=[a for a, _ in BACKENDS])
def test_value_head_dim_differs_from_query_key(dist_pool, algo, opts, d_qk, d_v):
    """Output and q/k/v gradients of attention with d_v != d_qk (zero-padded to one head dim inside) equal an fp64
    reference, causal and full, on 2 ranks (4 for USP with a ring of 2)."""
    world = 4 if algo == "usp_attn" else 2
    for causal in (True, False):
        for rank, errs in enumerate(dist_pool(world).run(unequal_head_dims_worker, algo, opts, d_qk, d_v, causal)):
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"rank {rank} causal={causal}: {worst} rel err {errs[worst]:.2e}"


@pytest.mark.parametrize("algo,opts", ALGOS, ids=[a for a, _ in ALGOS])
def test_deepseek_v3_mla_model_parity(dist_pool, algo, opts):
    """A tiny DeepSeek-V3 (MLA: Q/K heads 24 dims, V heads 16; MoE) under each SP backend: logits and every
    parameter gradient equal the single-process transformers model."""
    world = 4 if algo == "usp_attn" else 2
    for rank, errs in enumerate(dist_pool(world).run(model_parity_worker, algo, opts, "deepseek_v3")):
        worst = max(errs, key=errs.get)
        assert errs[worst] < 2e-5, f"rank {rank}: {worst} rel err {errs[worst]:.2e}"
