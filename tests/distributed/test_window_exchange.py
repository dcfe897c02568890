"""Zigzag ring attention with a sliding window exchanges K/V only with the source ranks some rank needs
(``zigzag_ring_attn.attention.window_offsets``, ``comm.exchange``): parity with an fp64 reference (windows shorter
than a half-chunk, about one chunk, longer than the sequence; batch 2, GQA, packed documents) on 2, 3 and 4 ranks,
the P2P traffic counted (2 offsets instead of W - 1 on 4 ranks for a short window; the ring for a long one), the same
results as the ring, and the exchange primitive's layout and errors.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist

import easy_context as ec
import easy_context.backends.zigzag_ring_attn.attention as zz
from easy_context.comm import exchange, start_exchange
from easy_context.core.documents import Documents
from tests.support.reference import rel_err

S_LOCAL = 32  # rows per rank: zigzag halves of 16
WINDOWS = (5, 17, 32, 1000)  # < a half-chunk, a half-chunk + 1 (still only the neighbours), one chunk, > sequence


def reference(q, k, v, window, starts=None):
    """fp64 causal attention, keys i - w < j <= i, inside the documents starting at ``starts[b]`` (per batch row);
    q (b, s, h, d), k/v (b, s, h_kv, d)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    n = q.shape[1]
    gap = torch.arange(n)[:, None] - torch.arange(n)[None]
    ok = ((gap >= 0) & (gap < window)).expand(q.shape[0], n, n).clone()
    if starts is not None:
        for b, row in enumerate(starts):
            doc = torch.zeros(n, dtype=torch.long)
            for a in row[1:]:
                doc[a:] += 1
            ok[b] &= doc[:, None] == doc[None]
    s = s.masked_fill(~ok[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def _inputs(world: int):
    g = torch.Generator().manual_seed(7)
    seq = S_LOCAL * world
    q, dout = torch.randn(2, seq, 4, 8, generator=g), torch.randn(2, seq, 4, 8, generator=g)
    k, v = torch.randn(2, seq, 2, 8, generator=g), torch.randn(2, seq, 2, 8, generator=g)
    return q, k, v, dout


def _local_run(rank, world, q, k, v, dout, window, documents=None):
    """(out, dq, dk, dv) of this rank's zigzag shards."""
    mine = [ec.extract_local("zigzag_ring_attn", x, rank, world).detach().clone().requires_grad_() for x in (q, k, v)]
    out = ec.get_attn_func("zigzag_ring_attn")(*mine, causal=True, sliding_window=window, documents=documents)
    out.backward(ec.extract_local("zigzag_ring_attn", dout, rank, world))
    return out.detach(), *(x.grad for x in mine)


def parity_worker(rank, world):
    """{case: {out, dq, dk, dv: rel err vs the fp64 reference}} for every window, alone and with documents."""
    q, k, v, dout = _inputs(world)
    seq = q.shape[1]
    starts = ((0, 11, seq // 2 + 3), (0, seq - 20))  # per batch row; documents cross the zigzag chunks
    results = {}
    for window in WINDOWS:
        for docs in (None, starts):
            leaves = [x.double().requires_grad_() for x in (q, k, v)]
            ref = reference(*leaves, window, docs)
            ref.backward(dout.double())
            documents = None if docs is None else Documents(seq, docs)
            got = _local_run(rank, world, q, k, v, dout, window, documents)
            want = [ref.detach(), *(x.grad for x in leaves)]
            results[f"w={window} docs={docs is not None}"] = {
                name: rel_err(x, ec.extract_local("zigzag_ring_attn", y, rank, world))
                for name, x, y in zip(("out", "dq", "dk", "dv"), got, want)
            }
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_windowed_zigzag_matches_reference(dist_pool, world):
    """Windows of 5 / 17 / 32 / 1000 tokens (16-row half-chunks: exchange with the neighbours on 4 ranks for 5 and
    17, the ring otherwise), alone and with packed documents, batch 2, 4 query / 2 K/V heads: out, dq, dk, dv equal
    the fp64 reference."""
    for rank, per_case in enumerate(dist_pool(world).run(parity_worker)):
        for case, errs in per_case.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"world {world} rank {rank} {case}: {worst} rel err {errs[worst]:.2e}"


def traffic_worker(rank, world, window):
    """This rank's P2P traffic of one forward and one backward (batched calls, sends, bytes sent, per pass) and its
    results with the exchange and with the ring forced (``window_offsets`` patched to None)."""
    q, k, v, dout = _inputs(world)
    calls: list[tuple[int, int]] = []  # (sends, bytes) per batch_isend_irecv call
    real = dist.batch_isend_irecv

    def counting(ops):
        sends = [op for op in ops if op.op is dist.isend]
        calls.append((len(sends), sum(op.tensor.numel() * op.tensor.element_size() for op in sends)))
        return real(ops)

    mine = [ec.extract_local("zigzag_ring_attn", x, rank, world).detach().clone().requires_grad_() for x in (q, k, v)]
    with mock.patch.object(dist, "batch_isend_irecv", counting):
        out = ec.get_attn_func("zigzag_ring_attn")(*mine, causal=True, sliding_window=window)
        forward = list(calls)
        out.backward(ec.extract_local("zigzag_ring_attn", dout, rank, world))
        backward = calls[len(forward) :]
    got = [out.detach(), *(x.grad for x in mine)]
    with mock.patch.object(zz, "window_offsets", lambda *a: None):
        ring = _local_run(rank, world, q, k, v, dout, window)

    def summary(c):
        return {"calls": len(c), "sends": sum(n for n, _ in c), "bytes": sum(b for _, b in c)}

    kv_bytes = 2 * mine[1].numel() * mine[1].element_size()
    return {
        "forward": summary(forward),
        "backward": summary(backward),
        "kv_bytes": kv_bytes,
        "out_equal": bool(torch.equal(got[0], ring[0])),
        "grad_err": max(rel_err(a, b) for a, b in zip(got[1:], ring[1:])),
    }


def test_short_window_exchanges_with_neighbours_only(dist_pool):
    """4 ranks, 16-row half-chunks: a 5-token window sends each rank's K/V to 2 ranks (offsets 1 and 3) in one batched
    call (the ring: 3 sends in 3 calls), and in the backward K/V again plus 2 fp32 dK/dV returns (the ring: 3 K/V +
    4 dK/dV sends); the same output as the ring bit for bit, gradients to rounding. A 1000-token window keeps the
    ring's traffic."""
    assert zz.window_offsets(4, S_LOCAL, True, 5) == (1, 3)
    assert zz.window_offsets(8, S_LOCAL, True, 17) == (1, 7)
    assert zz.window_offsets(8, S_LOCAL, True, 20) == (1, 2, 6, 7)
    assert zz.window_offsets(4, S_LOCAL, True, 1000) is None and zz.window_offsets(4, S_LOCAL, True, None) is None
    pool = dist_pool(4)
    for rank, r in enumerate(pool.run(traffic_worker, 5)):
        kv = r["kv_bytes"]  # bf16/fp32 K/V stacked: this test runs fp32, so dK/dV (fp32) are the same size
        assert r["forward"] == {"calls": 1, "sends": 2, "bytes": 2 * kv}, (rank, r)
        assert r["backward"] == {"calls": 2, "sends": 4, "bytes": 4 * kv}, (rank, r)
        assert r["out_equal"] and r["grad_err"] < 1e-6, (rank, r)
    for rank, r in enumerate(pool.run(traffic_worker, 1000)):
        kv = r["kv_bytes"]
        assert r["forward"] == {"calls": 3, "sends": 3, "bytes": 3 * kv}, (rank, r)
        assert r["backward"] == {"calls": 7, "sends": 7, "bytes": 7 * kv}, (rank, r)
        assert r["out_equal"] and r["grad_err"] == 0.0, (rank, r)


def exchange_worker(rank, world):
    """Received values of exchanges at offsets {2} and {1, -1} (mixed shapes and dtypes), and the errors."""
    got2 = exchange({2: torch.full((3,), float(rank))}, None)
    pending = start_exchange({1: torch.full((2, 2), 10.0 * rank), -1: torch.arange(4, dtype=torch.int64) + rank}, None)
    both = pending.wait()
    errors = []
    for bad in ({0: torch.zeros(1)}, {1: torch.zeros(1), 1 + world: torch.zeros(1)}):
        try:
            exchange(bad, None)
        except ValueError as exc:
            errors.append(str(exc))
    group = dist.new_group([0, 2])  # group ranks 0, 1 = global ranks 0, 2
    sub = None
    if rank in (0, 2):
        sub = exchange({1: torch.tensor([float(rank)])}, group)[1].item()
        dist.destroy_process_group(group)
    return got2[2].tolist(), both[1].tolist(), both[-1].tolist(), errors, sub


def test_exchange_layout_and_errors(dist_pool):
    """``exchange({s: x})`` delivers rank (r - s) % W's buffer under key s (negative offsets too); offsets 0 or equal
    mod W raise before any message; in a subgroup the offsets count group ranks (global ranks 0 and 2 swap)."""
    for rank, (got2, got1, got_m1, errors, sub) in enumerate(dist_pool(3).run(exchange_worker)):
        assert got2 == [float((rank - 2) % 3)] * 3
        assert got1 == [[10.0 * ((rank - 1) % 3)] * 2] * 2
        assert got_m1 == [(rank + 1) % 3 + i for i in range(4)]
        assert len(errors) == 2 and all("distinct and nonzero mod the group size 3" in e for e in errors), errors
        assert sub == {0: 2.0, 1: None, 2: 0.0}[rank]
