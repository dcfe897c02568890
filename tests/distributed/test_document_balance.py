"""Balancing packed documents over the ring (easy_context/document_order.py): the cost model against the schedules'
blocks, the order's gain on the benchmark's length mix, whole documents moved token for token, and the exactness of
the reorder (loss and every gradient) on one process and under zigzag, DistFlashAttn (2 and 4 gloo ranks) and USP
(4 ranks)."""

from __future__ import annotations

import copy
import random
import statistics

import numpy as np
import pytest
import torch
import torch.distributed as dist

import easy_context as ec
from easy_context.core import document_order as do
from easy_context.core.documents import Documents, find_documents
from easy_context.loss import CausalLMWithLoss
from tests.support.models import tiny_model
from tests.support.reference import rel_err


def _documents(lengths: list[int]) -> Documents | None:
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    return None if len(lengths) == 1 else Documents(sum(lengths), (tuple(starts),))


def _positions(lengths: list[int], first: int = 0) -> torch.Tensor:
    """Position ids restarting at 0 at each document (the first document may start at ``first``)."""
    return torch.cat([torch.arange(n) + (first if i == 0 else 0) for i, n in enumerate(lengths)])


def _random_lengths(total: int, rng: random.Random, p: float) -> list[int]:
    cuts = sorted(x for x in range(1, total) if rng.random() < p)
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _mix(seq: int, seeds: int = 20) -> list[list[int]]:
    """The rows of bench/document_imbalance.py (its default length mix)."""
    from tests.distributed.test_documents import _bench

    bench = _bench("document_imbalance")
    return [bench.length_mix(seq, random.Random(s), 0.03, 1000, (16384, 65536)) for s in range(seeds)]


# ------------------------------------------------------------------------------------------------ the cost


@pytest.mark.parametrize("algo", ["zigzag_ring_attn", "dist_flash_attn"])
@pytest.mark.parametrize("causal", [True, False])
def test_cost_model_is_the_schedules_count(algo, causal):
    """LockstepModel's per-(step, rank) work equals split_blocks' count on every step of the schedule, including
    one-token documents, documents across chunk edges and the odd halves of DistFlashAttn's split step."""
    rng = random.Random(0)
    for world in (2, 3, 4):
        for seq in (2 * world * 5, 2 * world * 7 + (world if algo == "dist_flash_attn" else 0)):
            model = do.lockstep_model(algo, world, seq, causal)
            for trial in range(6):
                lengths = _random_lengths(seq, rng, (0.05, 0.2, 0.5)[trial % 3])
                work, _ = do.schedule_work(algo, world, seq, _documents(lengths), causal)
                assert model.work(lengths) == work, (world, seq, lengths)
                assert model.lockstep(lengths) == sum(max(step) for step in work)
            # the per-document work's short cut (documents within two adjacent segments) is the general formula
            starts = np.array([rng.randrange(seq) for _ in range(300)])
            lens = np.array([rng.randint(1, min(seq - x, (seq // world, 3)[k % 2] + 1)) for k, x in enumerate(starts)])
            np.testing.assert_array_equal(model.doc_work(starts, lens), model.features(starts, lens) @ model.weights)


def test_incremental_moves_score_exactly():
    """_insertions (every move of one document to another index, scored incrementally) equals scoring each moved
    order from scratch."""
    rng = random.Random(1)
    for algo, world, seq in (("zigzag_ring_attn", 3, 60), ("dist_flash_attn", 4, 64)):
        model = do.lockstep_model(algo, world, seq)
        lengths = np.array(_random_lengths(seq, rng, 0.15), dtype=np.float64)
        n = len(lengths)
        got = do._insertions(model, lengths, np.arange(n))
        for i in range(n):
            for j in range(n):
                moved = lengths[do._move(list(range(n)), i, j)]
                np.testing.assert_array_equal(got[i, j], model.layout_features(moved) @ model.weights)


def test_the_bench_counts_through_the_library():
    """bench/document_imbalance.py counts with schedule_work; its mix fills exactly the row."""
    from tests.distributed.test_documents import _bench

    bench = _bench("document_imbalance")
    assert all(sum(row) == 131072 for row in _mix(131072))
    docs = bench.documents_of([10, 1, 30, 23])
    assert bench.zigzag_work(4, 64, docs) == do.schedule_work("zigzag_ring_attn", 4, 64, docs)
    assert bench.dist_flash_work(4, 64, docs) == do.schedule_work("dist_flash_attn", 4, 64, docs)


# ------------------------------------------------------------------------------------------------ the order


BALANCED = [  # (algo, world, mean / worst step efficiency the balanced order must reach on the bench's mix)
    ("zigzag_ring_attn", 4, 0.55, 0.45),  # measured 57.0 % / 47.5 % (row order 45.9 % / 30.4 %)
    ("zigzag_ring_attn", 8, 0.47, 0.37),  # 48.8 % / 39.3 % (36.8 % / 22.3 %)
    ("dist_flash_attn", 4, 0.46, 0.35),  # 47.9 % / 37.0 % (42.0 % / 31.7 %)
    ("dist_flash_attn", 8, 0.335, 0.24),  # 34.2 % / 25.1 % (31.8 % / 23.2 %)
]


@pytest.mark.parametrize("algo,world,mean_eff,worst_eff", BALANCED)
def test_balanced_order_beats_the_row_order(algo, world, mean_eff, worst_eff):
    seq = 131072
    before, after = [], []
    for lengths in _mix(seq):
        order = do.balance_order(lengths, algo, world)
        assert sorted(order) == list(range(len(lengths)))  # a permutation of the documents
        total = sum(n * (n + 1) // 2 for n in lengths)
        cost0 = do.lockstep_cost(lengths, algo, world)
        cost1 = do.lockstep_cost([lengths[d] for d in order], algo, world)
        assert cost1 <= cost0  # never worse than the row order
        if order != list(range(len(lengths))):
            assert cost1 < cost0
        before.append(total / world / cost0)
        after.append(total / world / cost1)
    assert statistics.mean(after) >= mean_eff and min(after) >= worst_eff, (statistics.mean(after), min(after))
    assert statistics.mean(after) > statistics.mean(before) and min(after) > min(before)
    # the exact count from the schedules' blocks agrees on one balanced row
    lengths = _mix(seq, 1)[0]
    balanced = [lengths[d] for d in do.balance_order(lengths, algo, world)]
    work, _ = do.schedule_work(algo, world, seq, _documents(balanced))
    assert do.summarize_work(work)["step_efficiency"] == pytest.approx(after[0], rel=1e-12)


def test_order_edge_cases():
    zz = "zigzag_ring_attn"
    assert do.balance_order([64], zz, 4) == [0]
    assert do.balance_order([], zz, 4) == []
    assert do.balance_order([8] * 8, zz, 4) == list(range(8))  # equal documents: nothing to gain
    lengths = [40, 3, 5, 4, 4, 3, 5]  # a long document in the row's middle
    assert do.balance_order(lengths, zz, 4) != list(range(7))
    assert do.balance_order(lengths, zz, 1) == list(range(7))  # one rank: nothing to balance
    for algo, opts in (("ulysses_attn", {}), ("data_parallel", {}), ("usp_attn", {"ring_degree": 1})):
        assert do.ring_world(algo, 4, **opts) is None
        assert do.balance_order(lengths, algo, 4, **opts) == list(range(7))
        assert do.lockstep_cost(lengths, algo, 4, **opts) == 0
    # USP's ring is zigzag over the ring degree (default 2 on an even SP size)
    assert do.ring_world("usp_attn", 4) == 2 and do.ring_world("usp_attn", 8, ring_degree=4) == 4
    assert do.balance_order(lengths, "usp_attn", 4) == do.balance_order(lengths, zz, 2)
    with pytest.raises(ValueError, match="unknown sequence-parallel mode"):
        do.balance_order(lengths, "ring", 4)
    with pytest.raises(ValueError, match="must be positive"):
        do.balance_order([3, 0, 5], zz, 2)
    with pytest.raises(ValueError):  # 63 rows do not shard over 2 x 4 zigzag chunks
        do.balance_order([40, 23], zz, 4)


# ------------------------------------------------------------------------------------------------ the batch


def _packed_batch(rows: list[list[int]], seed: int = 0, first: tuple[int, ...] = ()):
    """(inputs, positions, targets) of packed rows (document lengths per row), -100s among the targets."""
    g = torch.Generator().manual_seed(seed)
    length = sum(rows[0])
    ids = torch.randint(0, 128, (len(rows), length + 1), generator=g)
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[torch.rand(targets.shape, generator=g) < 0.2] = -100
    positions = torch.stack([_positions(r, first[b] if b < len(first) else 0) for b, r in enumerate(rows)])
    return inputs, positions, targets


ROWS = [[3, 22, 1, 5, 2, 4, 11, 16], [40, 4, 2, 6, 3, 1, 4, 4], [64]]  # 64 tokens: shards over 2 x 4 chunks


def test_balance_documents_moves_whole_documents():
    inputs, positions, targets = _packed_batch(ROWS, first=(0, 5))  # row 1's first document continues at 5
    new = do.balance_documents(inputs, positions, targets, "zigzag_ring_attn", 4)
    for b, lengths in enumerate(ROWS):
        order = do.balance_order(lengths, "zigzag_ring_attn", 4)
        if b < 2:
            assert order != list(range(len(lengths)))  # the rows do move
        starts = np.cumsum([0, *lengths[:-1]]).tolist()
        at = 0
        for d in order:  # document d's tokens, positions and targets, contiguous, in the new order
            for old, moved in zip((inputs, positions, targets), new):
                assert torch.equal(moved[b, at : at + lengths[d]], old[b, starts[d] : starts[d] + lengths[d]])
            at += lengths[d]
        docs = find_documents(new[1][b : b + 1])  # the backends' rule finds exactly the moved documents
        assert (docs.lengths()[0] if docs else [64]) == [lengths[d] for d in order]
    assert torch.equal(new[0][2], inputs[2])  # one document: unchanged
    # nothing to move: the very same tensors back
    for args in ((positions, "ulysses_attn", 4), (None, "zigzag_ring_attn", 4), (positions, "zigzag_ring_attn", 1)):
        out = do.balance_documents(inputs, args[0], targets, *args[1:])
        assert all(a is b for a, b in zip(out, (inputs, args[0], targets)))
    out = do.balance_documents(inputs, positions, None, "zigzag_ring_attn", 4)
    assert out[2] is None and torch.equal(out[0], new[0])
    with pytest.raises(ValueError, match="one shape"):
        do.balance_documents(inputs, positions[:, :-1], targets, "zigzag_ring_attn", 4)


def test_row_documents_is_find_documents():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        pos = torch.arange(24) + int(torch.randint(0, 4, (1,), generator=g))
        for i in torch.randint(0, 24, (int(torch.randint(0, 5, (1,), generator=g)),), generator=g).tolist():
            pos[i:] += int(torch.randint(-5, 3, (1,), generator=g))
        docs = find_documents(pos[None])
        assert do.row_documents(pos) == ([24] if docs is None else docs.lengths()[0])


def test_a_row_whose_documents_would_merge_keeps_its_order(monkeypatch):
    """Positions [0 1 2 | 7 8 | 3 4 5 6 ...]: moving the third document right after the first would continue its
    positions (one document then): such a row is returned as it was."""
    lengths = [3, 2, 11]
    pos = torch.cat([torch.arange(3), torch.arange(7, 9), torch.arange(3, 14)])[None]
    assert do.row_documents(pos[0]) == lengths
    ids = torch.arange(16)[None]
    monkeypatch.setattr(do, "balance_order", lambda lengths, *a, **k: [0, 2, 1])
    out = do.balance_documents(ids, pos, ids, "zigzag_ring_attn", 2)
    assert all(a is b for a, b in zip(out, (ids, pos, ids)))
    monkeypatch.setattr(do, "balance_order", lambda lengths, *a, **k: [2, 0, 1])  # no merge: moves
    out = do.balance_documents(ids, pos, ids, "zigzag_ring_attn", 2)
    assert out[1][0].tolist() == [*range(3, 14), 0, 1, 2, 7, 8]


# ------------------------------------------------------------------------------------------------ exactness


def _loss_and_grads(model, inputs, positions, targets):
    model.zero_grad(set_to_none=True)
    loss_sum, n = CausalLMWithLoss(model)(inputs, positions, targets)
    loss_sum.backward()
    return loss_sum.detach(), int(n), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_reordered_batch_gives_the_same_loss_and_gradients():
    """One process, transformers' own document masking: the balanced batch's summed loss and every parameter
    gradient equal the original batch's (fp32, summation order only); attending across documents would differ."""
    model = tiny_model("llama")
    batch = _packed_batch(ROWS[:2], seed=3)
    balanced = do.balance_documents(*batch, "zigzag_ring_attn", 4)
    assert not torch.equal(balanced[0], batch[0])
    loss, n, grads = _loss_and_grads(model, *batch)
    loss_b, n_b, grads_b = _loss_and_grads(model, *balanced)
    assert n == n_b and rel_err(loss_b, loss) < 1e-6
    for name, grad in grads.items():
        assert rel_err(grads_b[name], grad) < 2e-6, name
    # the documents matter: the balanced row read as one sequence gives another loss
    across, _, _ = _loss_and_grads(model, balanced[0], torch.arange(64).expand(2, 64), balanced[2])
    assert rel_err(across, loss) > 1e-3


def sp_worker(rank, world, algo, opts):
    """The original batch on one process (reference) against its balanced batch sharded over the SP ranks."""
    ref_model = tiny_model("llama")
    batch = _packed_batch(ROWS[:2], seed=4)
    ref_loss, ref_n, ref_grads = _loss_and_grads(ref_model, *batch)
    balanced = do.balance_documents(*batch, algo, world, **opts)
    moved = not torch.equal(balanced[0], batch[0])
    sp_model = ec.apply_seq_parallel_monkey_patch(algo, copy.deepcopy(ref_model), **opts)
    local = ec.prepare_seq_parallel_inputs(algo, *balanced, rank, world, "cpu", **opts)
    loss, n, grads = _loss_and_grads(sp_model, local["local_input_ids"], local["local_position_ids"],
                                     local["local_target_ids"])  # fmt: skip
    total = torch.tensor([float(loss), float(n)], dtype=torch.float64)
    dist.all_reduce(total)
    errs = {"loss": rel_err(total[0], ref_loss), "count": abs(int(total[1]) - ref_n)}
    for name, grad in grads.items():
        dist.all_reduce(grad)
        errs[name] = rel_err(grad, ref_grads[name])
    return moved, errs


@pytest.mark.parametrize("algo,world", [("zigzag_ring_attn", 2), ("dist_flash_attn", 2), ("zigzag_ring_attn", 4),
                                        ("dist_flash_attn", 4), ("usp_attn", 4)])  # fmt: skip
def test_balanced_batch_under_sequence_parallelism(dist_pool, algo, world):
    """The balanced batch sharded over 2 and 4 gloo ranks (USP: its zigzag ring of 2 x Ulysses 2) gives the original
    batch's loss and every gradient on one process."""
    for rank, (moved, errs) in enumerate(dist_pool(world).run(sp_worker, algo, {})):
        assert moved, "the balanced batch must differ from the original"
        worst = max(errs, key=errs.get)
        assert errs["count"] == 0 and errs[worst] < 2e-5, f"rank {rank}: {worst} {errs[worst]:.2e}"


def test_the_backend_object_and_its_name_give_one_order():
    """Callers that hold the backend (``SPConfig.algo``) pass it, not its name: the same order, and no lookup."""
    from easy_context.core.registry import get_seq_algo

    lengths = [3, 17, 5, 29, 8, 10]  # 72 tokens: a multiple of every backend's length on these worlds
    for name, world in (("zigzag_ring_attn", 4), ("dist_flash_attn", 3), ("usp_attn", 4), ("ulysses_attn", 4)):
        algo = get_seq_algo(name)
        assert get_seq_algo(algo) is algo
        assert do.balance_order(lengths, algo, world) == do.balance_order(lengths, name, world)
        assert do.ring_world(algo, world) == do.ring_world(name, world)


def test_a_backend_without_a_lockstep_ring_has_no_schedule_to_count():
    """Asking for the schedule of a backend that declares no RingSchedule names the backends that have one."""
    for name in ("ulysses_attn", "data_parallel"):
        with pytest.raises(ValueError) as e:
            do.schedule_work(name, 4, 64, None)
        assert str(e.value) == (f"no lockstep schedule for {name!r}; balanced backends: zigzag_ring_attn, "
                                "dist_flash_attn, usp_attn")  # fmt: skip
