"""dist_flash_attn: the schedule (pure), virtual ranks, gloo parity at W = 2, 3, 4, inference, bad input and
checkpoint-after-attention."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

import easy_context as ec
from easy_context.backends.dist_flash_attn import contiguous_shard
from easy_context.backends.dist_flash_attn.schedule import (
    build_schedule,
    comm_rounds,
    rank_kernel_calls,
    rank_work,
    task_blocks,
    task_rows,
)
from easy_context.backends.dist_flash_attn.simulate import VirtualStats, virtual_backward, virtual_forward
from easy_context.core.attn_checkpoint import checkpoint_after_attention
from easy_context.kernels import KERNELS, AttnKernel
from tests.support.reference import reference_with_grads, rel_err

ALGO = "dist_flash_attn"
TOL = {"float32": 1e-5, "bfloat16": 1.5e-2}
# name -> (batch, local seq len, heads_q, heads_kv, head_dim, causal); full length = W * local (W = 3: 21, 15, 9)
# odd local lengths split the distance-W/2 block (even W) into floor/ceil halves; one row: the first half is empty
CASES = {
    "mha": (2, 7, 4, 4, 32, True),
    "gqa": (1, 5, 8, 2, 64, True),
    "mqa_d128": (1, 3, 4, 1, 128, True),
    "gqa_len1": (2, 1, 4, 2, 32, True),
    "noncausal_gqa": (2, 6, 4, 2, 32, False),
}


def _inputs(seed, b, s, hq, hkv, d, dtype):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(b, s, hq, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v, dout


# ---------------------------------------------------------------- schedule (pure)


def _pair_coverage(world: int, causal: bool, seq_local: int) -> torch.Tensor:
    """How often each (global query row, global key row) pair is computed by the schedule's blocks."""
    n = world * seq_local
    count = torch.zeros(n, n, dtype=torch.int64)
    for step in build_schedule(world, causal):
        for t in step:
            # borrowed queries are indexed from the first borrowed row, own queries from the chunk start
            offset = t.q_owner * seq_local + (task_rows(t, seq_local).start if t.borrows_q else 0)
            for blk in task_blocks(t, seq_local, causal):
                q0, k0 = offset + blk.q_rows.start, t.kv_owner * seq_local + blk.k_rows.start
                nq, nk = blk.q_rows.stop - blk.q_rows.start, blk.k_rows.stop - blk.k_rows.start
                pairs = torch.tril(torch.ones(nq, nk, dtype=torch.int64)) if blk.causal else torch.ones(nq, nk)
                count[q0 : q0 + nq, k0 : k0 + nk] += pairs.long()
    return count


@pytest.mark.parametrize("world", range(1, 9))
def test_causal_schedule_covers_once_and_balances(world):
    steps = build_schedule(world, causal=True)
    assert len(steps) == 1 + world // 2
    seen = []
    for s, step in enumerate(steps):
        runners = [t.runner for t in step]
        assert runners == sorted(set(runners)) == list(range(world)), "every rank runs one task per step"
        for t in step:
            assert t.runner in (t.q_owner, t.kv_owner)
            assert t.kv_owner <= t.q_owner, "only causal blocks"
            assert (t.half is not None) == (world % 2 == 0 and s == world // 2), "halves only at distance W/2"
            seen.append((t.q_owner, t.kv_owner, t.half))
    # every causal chunk pair once; a distance-W/2 pair (even W) as its two halves
    want = [
        (i, j, h) for i in range(world) for j in range(i + 1) for h in ((0, 1) if 2 * (i - j) == world else (None,))
    ]
    assert sorted(seen, key=str) == sorted(want, key=str)
    # perfectly balanced: diagonal and half blocks count 1/2, full blocks 1 (exact in binary floating point)
    work = rank_work(world, causal=True)
    assert sum(work) == world * world / 2
    assert max(work) == min(work) == world / 2, work
    assert sum(rank_kernel_calls(world, True)) == world * (world + 1) // 2 + (world // 2 if world % 2 == 0 else 0)


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("seq_local", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("causal", [True, False])
def test_schedule_covers_every_row_pair_once(world, seq_local, causal):
    n = world * seq_local
    want = torch.tril(torch.ones(n, n, dtype=torch.int64)) if causal else torch.ones(n, n, dtype=torch.int64)
    assert torch.equal(_pair_coverage(world, causal, seq_local), want)


def test_half_rows_split_floor_ceil():
    steps = build_schedule(4, causal=True)
    upper, lower = (next(t for t in steps[2] if t.runner == r) for r in (2, 0))
    assert (upper.q_owner, upper.kv_owner, upper.half) == (2, 0, 0) and upper.borrows_kv
    assert (lower.q_owner, lower.kv_owner, lower.half) == (2, 0, 1) and lower.borrows_q
    for seq_local, first, second in [(1, (0, 0), (0, 1)), (3, (0, 1), (1, 3)), (8, (0, 4), (4, 8))]:
        assert (task_rows(upper, seq_local).start, task_rows(upper, seq_local).stop) == first
        assert (task_rows(lower, seq_local).start, task_rows(lower, seq_local).stop) == second
    assert task_blocks(upper, 1, True) == []  # one row: the upper rank's half is empty, no kernel call
    assert rank_kernel_calls(4, True, seq_local=1) == [3, 3, 2, 2]
    assert rank_kernel_calls(4, True) == [3, 3, 3, 3]


@pytest.mark.parametrize("world", range(1, 9))
def test_full_schedule_covers_once_and_balances(world):
    seen = [(t.q_owner, t.kv_owner) for step in build_schedule(world, causal=False) for t in step]
    assert sorted(seen) == [(i, j) for i in range(world) for j in range(world)]
    assert rank_work(world, causal=False) == [float(world)] * world


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backward", [False, True])
def test_rounds_fetch_before_and_return_after(world, causal, backward):
    steps = build_schedule(world, causal)
    rounds = comm_rounds(world, causal, backward)
    assert len(rounds) == len(steps) + 2
    for s, step in enumerate(steps):
        for t in step:
            fetched = {m.what for m in rounds[s] if m.task == t}  # round s completes before step s runs
            returned = {m.what for m in rounds[s + 2] if m.task == t}  # in flight while step s + 1 runs
            assert fetched == {w for w, b in (("q", t.borrows_q), ("kv", t.borrows_kv)) if b}
            want = {"dq": t.borrows_q, "dkv": t.borrows_kv} if backward else {"out": t.borrows_q}
            assert returned == {w for w, b in want.items() if b}
    for r in rounds:
        assert all(m.src != m.dst for m in r)


# ---------------------------------------------------------------- virtual ranks (one process)


# (a one-token sequence, world 1 x length 1, has dK = 0 exactly: no relative error to assert, so not listed)
@pytest.mark.parametrize("world,sl", [(w, s) for w in (1, 2, 3, 4, 5, 8) for s in (1, 3, 4) if w * s > 1])
@pytest.mark.parametrize("causal", [True, False])
def test_virtual_matches_reference(world, causal, sl):
    b, hq, hkv, d = 2, 4, 2, 32
    q, k, v, dout = _inputs(world, b, world * sl, hq, hkv, d, torch.float32)
    ref = reference_with_grads(q, k, v, dout, causal)

    def sh(x):
        return [contiguous_shard(x, r, world) for r in range(world)]

    fwd, bwd = VirtualStats(), VirtualStats()
    outs, lses = virtual_forward(sh(q), sh(k), sh(v), KERNELS["cpu"], d**-0.5, causal, stats=fwd)
    grads = virtual_backward(sh(dout), sh(q), sh(k), sh(v), outs, lses, KERNELS["cpu"], d**-0.5, causal, stats=bwd)
    for got, want in zip((outs, *grads), ref, strict=True):
        assert rel_err(torch.cat(got, 1), want) < TOL["float32"]
    assert fwd.kernel_calls == bwd.kernel_calls == rank_kernel_calls(world, causal, sl)


# ---------------------------------------------------------------- distributed (gloo)


def _shard_err(x: torch.Tensor, ref_shard: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref_shard| / max |ref| in float64 (``ref``: the whole tensor ``ref_shard`` was cut from)."""
    return ((x.double() - ref_shard.double()).abs().max() / ref.double().abs().max()).item()


def parity_worker(rank, world, case, dtype_name, seed=0):
    b, sl, hq, hkv, d, causal = case
    dtype = getattr(torch, dtype_name)
    q, k, v, dout = _inputs(seed, b, world * sl, hq, hkv, d, dtype)
    ref = reference_with_grads(q, k, v, dout, causal)

    def shard(x):
        return ec.extract_local(ALGO, x, rank, world)

    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    out = ec.get_attn_func(ALGO)(ql, kl, vl, causal=causal)
    assert out.shape == ql.shape and out.dtype == dtype
    out.backward(shard(dout))
    got = (out, ql.grad, kl.grad, vl.grad)
    # relative to the whole reference tensor: a one-row shard may be exactly 0 (row 0's dq, a last key's dK)
    errs = {name: _shard_err(x, shard(r), r) for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref, strict=True)}
    # the virtual ranks run the same blocks and merges in the same order: identical results

    def every(x):
        return [ec.extract_local(ALGO, x, r, world) for r in range(world)]

    kern = ec.get_kernel("auto", "cpu", dtype, d)
    outs, lses = virtual_forward(every(q), every(k), every(v), kern, d**-0.5, causal)
    grads = virtual_backward(every(dout), every(q), every(k), every(v), outs, lses, kern, d**-0.5, causal)
    same = all(torch.equal(x.detach(), sim[rank]) for x, sim in zip(got, (outs, *grads), strict=True))
    return errs, same


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_parity(dist_pool, world, case, dtype_name):
    results = dist_pool(world).run(parity_worker, CASES[case], dtype_name)
    for rank, (errs, same) in enumerate(results):
        assert max(errs.values()) < TOL[dtype_name], f"rank {rank}: {errs}"
        assert same, f"rank {rank}: distributed result differs from the virtual ranks"


_GROUPS: dict[tuple, object] = {}


def subgroup_worker(rank, world, members_list):
    """Every rank creates every group (same order); each rank runs attention inside its own group."""
    key = tuple(map(tuple, members_list))
    if key not in _GROUPS:
        _GROUPS[key] = [dist.new_group(list(m)) for m in members_list]
    (idx,) = [i for i, m in enumerate(members_list) if rank in m]
    group, members = _GROUPS[key][idx], members_list[idx]
    sub_world, sub_rank = len(members), members.index(rank)
    q, k, v, dout = _inputs(idx, 1, 4 * sub_world, 4, 2, 32, torch.float32)
    ref = reference_with_grads(q, k, v, dout, True)

    def shard(x):
        return ec.extract_local(ALGO, x, sub_rank, sub_world)

    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    out = ec.get_attn_func(ALGO)(ql, kl, vl, causal=True, group=group)
    out.backward(shard(dout))
    return max(rel_err(x, shard(r)) for x, r in zip((out, ql.grad, kl.grad, vl.grad), ref, strict=True))


@pytest.mark.parametrize("world,members", [(2, [[0], [1]]), (4, [[0, 2], [1, 3]])], ids=["w1-singletons", "w2-strided"])
def test_subgroups(dist_pool, world, members):
    errs = dist_pool(world).run(subgroup_worker, members)
    assert max(errs) < TOL["float32"], errs


def no_grad_worker(rank, world):
    q, k, v, _ = _inputs(3, 2, 5 * world, 4, 2, 32, torch.float32)
    ql, kl, vl = (ec.extract_local(ALGO, x, rank, world).requires_grad_() for x in (q, k, v))
    attn = ec.get_attn_func(ALGO)
    with torch.no_grad():
        out = attn(ql, kl, vl, causal=True)
        layer_out = checkpoint_after_attention(_Layer(32 * 4, 4, 2, 32, KERNELS["cpu"]))(ql.reshape(2, 5, -1))
    assert not out.requires_grad and not layer_out.requires_grad
    return torch.equal(out, attn(ql, kl, vl, causal=True).detach())


@pytest.mark.parametrize("world", [2, 3])
def test_no_grad_inference(dist_pool, world):
    assert all(dist_pool(world).run(no_grad_worker))


def bad_length_worker(rank, world):
    q = torch.randn(1, 9 + rank, 2, 8)
    try:
        ec.get_attn_func(ALGO)(q, q, q, causal=True)
    except ValueError as exc:
        return str(exc)
    return "no error"


def equal_then_unequal_worker(rank, world, algo):
    attn = ec.get_attn_func(algo)
    q = torch.randn(1, 8, 2, 8)
    attn(q, q, q, causal=True)
    q = torch.randn(1, 8 + 2 * rank, 2, 8)
    with pytest.raises(ValueError, match="same shape"):
        attn(q, q, q, causal=True)
    with pytest.raises(ValueError, match="local rows"):  # q and k/v sharded differently
        attn(q, q[:, :4], q[:, :4], causal=False)
    return True


def test_unequal_local_lengths_raise(dist_pool):
    for msg in dist_pool(2).run(bad_length_worker):
        assert "same shape" in msg and "[9, 10]" in msg, msg
    # equal shapes first, then a mismatch: still a clear error on every rank, never a hang
    assert all(dist_pool(2).run(equal_then_unequal_worker, algo) for algo in ("zigzag_ring_attn", ALGO))


def test_bad_input_errors():
    with pytest.raises(ValueError, match="not divisible by 3"):
        ec.extract_local(ALGO, torch.zeros(1, 10, 2, 8), 0, 3)
    assert ec.seq_multiple(ALGO, 3) == 3
    assert ec.extract_local(ALGO, torch.arange(9).view(1, 9), 1, 3).tolist() == [[3, 4, 5]]


# ---------------------------------------------------------------- checkpoint after attention


def _counting(kernel: AttnKernel, calls: list[int]) -> AttnKernel:
    def fwd(*args):
        calls[0] += 1
        return kernel.forward_impl(*args)

    return AttnKernel(kernel.name, fwd, kernel.backward_impl)


class _Layer(torch.nn.Module):
    """x (b, s_local, dim) -> x + o(attn(q(x), k(x), v(x))) with dist_flash attention (causal, GQA)."""

    def __init__(self, dim: int, hq: int, hkv: int, d: int, kernel: AttnKernel, algo: str = ALGO):
        super().__init__()
        self.hq, self.hkv, self.d, self.kernel = hq, hkv, d, kernel
        self.impl = ec.get_seq_algo(algo).impl
        self.q, self.kv, self.o = (
            torch.nn.Linear(dim, hq * d),
            torch.nn.Linear(dim, 2 * hkv * d),
            torch.nn.Linear(hq * d, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.hq, self.d)
        k, v = self.kv(x).view(b, s, 2, self.hkv, self.d).unbind(2)
        a = self.impl(q, k, v, self.kernel, self.d**-0.5, True, dist.group.WORLD)
        return x + self.o(torch.tanh(a).reshape(b, s, -1))


def checkpoint_worker(rank, world, mode, algo=ALGO):
    """Two layers; mode: plain | after_attention | torch (plain torch checkpointing)."""
    calls = [0]
    torch.manual_seed(0)
    layers = [_Layer(16, 4, 2, 8, _counting(KERNELS["cpu"], calls), algo) for _ in range(2)]
    if mode == "after_attention":
        layers = [checkpoint_after_attention(m) for m in layers]
    x_full = torch.randn(2, 6 * world, 16, generator=torch.Generator().manual_seed(1))
    w_full = torch.randn(2, 6 * world, 16, generator=torch.Generator().manual_seed(2))
    x = ec.extract_local(algo, x_full, rank, world).requires_grad_()
    y = x
    for m in layers:
        y = checkpoint(m, y, use_reentrant=False) if mode == "torch" else m(y)
    (y * ec.extract_local(algo, w_full, rank, world)).sum().backward()
    grads = [x.grad] + [p.grad for m in layers for p in m.parameters()]
    return calls[0], grads


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algo", [ALGO, "zigzag_ring_attn", "ulysses_attn"])
def test_checkpoint_after_attention(dist_pool, algo, world):
    pool = dist_pool(world)
    plain = pool.run(checkpoint_worker, "plain", algo)
    after = pool.run(checkpoint_worker, "after_attention", algo)
    torch_ckpt = pool.run(checkpoint_worker, "torch", algo)
    for rank in range(world):
        # kernel forwards per layer: dist_flash its schedule, zigzag one block per ring step, Ulysses one local call
        per_layer = {ALGO: rank_kernel_calls(world, True)[rank], "zigzag_ring_attn": world}.get(algo, 1)
        assert plain[rank][0] == 2 * per_layer
        assert after[rank][0] == 2 * per_layer, "attention forward must run once per layer per step"
        assert torch_ckpt[rank][0] == 4 * per_layer  # plain checkpointing re-runs it (the count works)
        for g_plain, g_after in zip(plain[rank][1], after[rank][1], strict=True):
            assert rel_err(g_after, g_plain) < 1e-6
