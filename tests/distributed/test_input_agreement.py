"""Bad attention inputs on *one* SP rank: every rank raises the same clear error together (no rank is left waiting
in a collective), and the process group stays usable for the next call."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from tests.support.reference import reference_with_grads, rel_err

WORLD = 3
HEADS, HEADS_KV, DIM = 6, 3, 16
ALGOS = [("zigzag_ring_attn", {}), ("dist_flash_attn", {}), ("ulysses_attn", {}), ("usp_attn", {"ring_degree": 3}),
         ("usp_attn", {"ring_degree": 1})]  # fmt: skip

# case -> (what the faulty rank passes, substring of the faulty rank's error, substring of the others' error)
CASES = {
    "k_shorter_on_rank0": ("k/v have", "rejected their attention inputs"),
    "kv_fp64_on_rank0": ("float64 inputs are not supported", "rejected their attention inputs"),
    "k_not_v_on_rank0": ("incompatible", "rejected their attention inputs"),
    "v_head_dim_on_rank0": ("same shape", "same shape"),  # a valid MLA shape alone, but not what the others hold
    "longer_shard_on_rank2": ("same shape and dtype", "same shape and dtype"),
    "non_causal_on_rank0": ("same attention", "same attention"),
    "scale_on_rank1": ("softmax scale", "softmax scale"),
}


def _shards(rank, algo, opts, case):
    s = ec.seq_multiple(algo, WORLD, **opts) * 2
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, s, HEADS, DIM, generator=g)
    k, v = (torch.randn(1, s, HEADS_KV, DIM, generator=g) for _ in range(2))
    ql, kl, vl = (ec.extract_local(algo, x, rank, WORLD, **opts) for x in (q, k, v))
    kw = {}
    if case == "k_shorter_on_rank0" and rank == 0:
        kl, vl = kl[:, :-1], vl[:, :-1]
    elif case == "kv_fp64_on_rank0" and rank == 0:
        kl, vl = kl.double(), vl.double()
    elif case == "k_not_v_on_rank0" and rank == 0:
        vl = vl[:, :, :1]  # fewer V heads than K heads
    elif case == "v_head_dim_on_rank0" and rank == 0:
        vl = vl[..., :-1]
    elif case == "longer_shard_on_rank2" and rank == 2:
        ql, kl, vl = (torch.cat([x, x[:, :1]], dim=1) for x in (ql, kl, vl))
    elif case == "non_causal_on_rank0" and rank == 0:
        kw["causal"] = False
    elif case == "scale_on_rank1" and rank == 1:
        kw["softmax_scale"] = 0.5
    return (q, k, v), (ql, kl, vl), kw


def faulty_worker(rank, world, algo, opts, case):
    _, local, kw = _shards(rank, algo, opts, case)
    try:
        ec.get_attn_func(algo, **opts)(*local, **kw)
    except ValueError as exc:
        return str(exc)
    return None


def healthy_worker(rank, world, algo, opts):
    (q, k, v), local, _ = _shards(rank, algo, opts, "none")
    out = ec.get_attn_func(algo, **opts)(*local)
    ref = reference_with_grads(q, k, v, torch.zeros_like(q), True)[0]
    return rel_err(out, ec.extract_local(algo, ref, rank, world, **opts))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algo,opts", ALGOS, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x.values())))
def test_one_ranks_bad_input_fails_every_rank(dist_pool, algo, opts, case):
    pool = dist_pool(WORLD)
    messages = pool.run(faulty_worker, algo, opts, case, timeout=60)  # a hang fails here, after 60 s
    faulty = {"k_shorter_on_rank0": 0, "kv_fp64_on_rank0": 0, "k_not_v_on_rank0": 0, "v_head_dim_on_rank0": 0,
              "longer_shard_on_rank2": 2,
              "non_causal_on_rank0": 0, "scale_on_rank1": 1}[case]  # fmt: skip
    own, others = CASES[case]
    for rank, msg in enumerate(messages):
        assert msg is not None and algo in msg, (rank, msg)
        assert (own if rank == faulty else others) in msg, (rank, msg)
    assert max(pool.run(healthy_worker, algo, opts)) < 1e-5  # the group is still usable


def test_padding_hint_names_the_options(dist_pool):
    """usp_attn's shape error suggests seq_multiple with the ring degree in use (the default one differs)."""
    messages = dist_pool(WORLD).run(faulty_worker, "usp_attn", {"ring_degree": 1}, "longer_shard_on_rank2")
    assert all("seq_multiple('usp_attn', world_size, ring_degree=1)" in m for m in messages), messages


def test_ring_degree_must_be_an_integer():
    with pytest.raises(ValueError, match="ring_degree must be an integer"):
        ec.seq_multiple("usp_attn", 6, ring_degree=2.0)
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    out = ec.get_attn_func("data_parallel", kernel="cpu")(q, q.double(), q.double())  # mixed: the widest dtype
    assert out.dtype == torch.float64
    out.sum().backward()
    assert q.grad.dtype == torch.float32  # gradients in the input's dtype


def empty_shard_worker(rank, world, algo):
    q = torch.randn(1, 0, 2, 16)
    try:
        ec.get_attn_func(algo)(q, q, q)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("algo", ["zigzag_ring_attn", "ulysses_attn", "usp_attn", "dist_flash_attn", "data_parallel"])
def test_zero_length_shards_are_refused(dist_pool, algo):
    """An empty local shard crashed the process with SIGFPE inside the CPU kernel; now every rank raises."""
    for message in dist_pool(WORLD).run(empty_shard_worker, algo):
        assert "empty sequence" in message or "rejected their attention inputs" in message, message
