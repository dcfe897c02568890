"""Packed documents (document masking) under every SP backend: the rule, the block split, attention and model
parity against per-document / transformers references, the data path and train.py."""

from __future__ import annotations

import itertools
import random
import sys

import pytest
import torch

import easy_context as ec
from easy_context.core.block import Block
from easy_context.core.blockwise import ForwardAccumulator
from easy_context.core.documents import Documents, block_cost, documents_from_cu_seqlens, find_documents, split_blocks
from easy_context.core.spans import Span, spans_of
from tests.support.reference import reference_with_grads, rel_err

TOL = 1e-5  # fp32, as tests/distributed/test_attention_parity.py


# ------------------------------------------------------------------------------------------------ the rule


def positions_of(lengths: list[int], first: int = 0) -> torch.Tensor:
    """Position ids restarting at 0 at each document (the first document may start at ``first``)."""
    return torch.cat([torch.arange(n) + (first if i == 0 else 0) for i, n in enumerate(lengths)])


def test_rule_matches_transformers_on_random_position_ids():
    from transformers.masking_utils import find_packed_sequence_indices

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        b, s = 1 + trial % 3, 1 + trial % 17
        pos = torch.arange(s).repeat(b, 1) + torch.randint(0, 4, (b, 1), generator=g)
        for r in range(b):  # restarts, jumps, repeats, decreases
            for i in torch.randint(0, s, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist():
                pos[r, i:] += int(torch.randint(-5, 3, (1,), generator=g))
        ref = find_packed_sequence_indices(pos)
        ours = find_documents(pos)
        assert (ref is None) == (ours is None), (pos, ref, ours)
        if ours is None:
            continue
        doc_ids = torch.zeros_like(pos)
        for rows, starts in ours.row_groups(b):
            for i, start in enumerate(starts):
                doc_ids[rows, start:] = i
        assert torch.equal(doc_ids, ref), (pos, doc_ids, ref)


def test_documents_object():
    docs = find_documents(positions_of([3, 1, 4])[None].repeat(2, 1))
    assert docs == Documents(8, ((0, 3, 4),)) and docs.lengths() == [[3, 1, 4]]  # identical rows: one entry
    assert find_documents(torch.arange(9)[None] + 5) is None  # one document (positions need not start at 0)
    per_row = find_documents(torch.stack([positions_of([3, 5]), torch.arange(8)]))
    assert per_row.starts == ((0, 3), (0,)) and per_row.row_groups(2)[1] == (slice(1, 2), (0,))
    with pytest.raises(ValueError, match="2 batch rows but the batch has 3"):
        per_row.row_groups(3)
    with pytest.raises(ValueError, match="must begin at 0"):
        Documents(4, ((1, 2),))
    assert documents_from_cu_seqlens(torch.tensor([0, 3, 4, 8])) == docs
    assert documents_from_cu_seqlens([0, 8]) is None
    with pytest.raises(ValueError, match="start at 0 and increase"):
        documents_from_cu_seqlens([0, 3, 3])


def test_every_backend_answers_its_layout():
    """global_rows(rank) (the backend's layout) places exactly the rows its shard function gives the rank."""
    cases = [("zigzag_ring_attn", {}, (1, 2, 3, 4)), ("dist_flash_attn", {}, (1, 2, 3, 4)),
             ("ulysses_attn", {}, (1, 2, 4)), ("usp_attn", {"ring_degree": 2}, (2, 4, 6)),
             ("usp_attn", {"ring_degree": 1}, (2, 3)), ("usp_attn", {"ring_degree": 3}, (3, 6)),
             ("data_parallel", {}, (1, 2))]  # fmt: skip
    for algo, opts, worlds in cases:
        for world in worlds:
            full = 3 * ec.seq_multiple(algo, world, **opts)
            for rank in range(world):
                rows = ec.extract_local(algo, torch.arange(full)[None], rank, world, **opts)[0]
                spans = ec.get_seq_algo(algo).global_rows(rank, world, rows.numel(), **opts)
                assert [sp.start + i for sp in spans for i in range(sp.length)] == rows.tolist(), (algo, world, rank)
    assert spans_of([4, 5, 6, 0, 1, 9]) == (Span(0, 4, 3), Span(3, 0, 2), Span(5, 9, 1))


# ------------------------------------------------------------------------------------------------ the block split


def _pairs(blocks, q_spans, k_spans, batch):
    """Every (batch row, global query, global key) score a list of blocks computes (asserting none twice)."""
    to_global = lambda spans: {sp.local + i: sp.start + i for sp in spans for i in range(sp.length)}  # noqa: E731
    qg, kg = to_global(q_spans), to_global(k_spans)
    seen = []
    for blk in blocks:
        for b in range(batch)[blk.batch]:
            for i in range(blk.q_rows.start, blk.q_rows.stop):
                for j in range(blk.k_rows.start, blk.k_rows.stop):
                    if not blk.causal or j - blk.k_rows.start <= i - blk.q_rows.start:
                        seen.append((b, qg[i], kg[j]))
    assert len(seen) == len(set(seen)), "a score computed twice"
    return set(seen)


def _random_documents(length: int, rng: random.Random, batch: int = 1) -> Documents:
    rows = [tuple([0] + sorted(rng.sample(range(1, length), rng.randint(0, min(length - 1, 6))))) for _ in range(batch)]
    return Documents(length, (rows[0],) if batch == 1 else tuple(rows))


def _doc_of(docs: Documents, b: int, row: int) -> int:
    starts = docs.starts[0 if docs.rows == 1 else b]
    return max(i for i, s in enumerate(starts) if s <= row)


def test_split_is_exactly_the_document_mask():
    """For every zigzag step and DistFlashAttn task on 1-4 ranks and random documents (also per batch row), the
    sub-blocks compute exactly the scores of the unsplit blocks that stay inside a document, each once."""
    from easy_context.backends.dist_flash_attn.schedule import build_schedule, task_blocks, task_spans
    from easy_context.backends.zigzag_ring_attn import zigzag_blocks, zigzag_spans

    rng = random.Random(0)
    for trial in range(60):
        world, c, batch = 1 + trial % 4, 1 + trial % 3, 1 + trial % 2
        causal = trial % 5 != 0
        length = 2 * world * c
        docs = _random_documents(length, rng, batch)
        jobs = []
        s = length // world
        for rank, src in itertools.product(range(world), repeat=2):
            jobs.append(
                (zigzag_blocks(rank, src, s, causal), zigzag_spans(rank, world, s), zigzag_spans(src, world, s))
            )
        for step in build_schedule(world, causal):
            for task in step:
                jobs.append((task_blocks(task, s, causal), *task_spans(task, s)))
        for blocks, q_spans, k_spans in jobs:
            full = _pairs(blocks, q_spans, k_spans, batch)
            want = {(b, i, j) for b, i, j in full if _doc_of(docs, b, i) == _doc_of(docs, b, j)}
            sub = split_blocks(blocks, q_spans, k_spans, docs, batch)
            assert _pairs(sub, q_spans, k_spans, batch) == want, (world, causal, docs, blocks)
            assert all(b.q_rows.stop > b.q_rows.start and b.k_rows.stop > b.k_rows.start for b in sub)


def test_split_is_free_without_documents_and_inside_one():
    blocks = [Block(slice(0, 8), slice(0, 8), True)]
    whole = (Span(0, 0, 4), Span(4, 12, 4))  # zigzag rank 0 of 2: chunks 0 and 3
    assert split_blocks(blocks, whole, whole, None, 1) == blocks
    two = Documents(16, ((0, 3),))  # rows 0-2 and 3-15
    assert len(split_blocks(blocks, whole, whole, two, 1)) == 4  # A x A (2 documents), B x A and B x B (document 1)
    assert split_blocks(blocks, whole, whole, Documents(16, ((0, 2),)), 1)[-1] == Block(slice(4, 8), slice(4, 8), True)
    inside = Documents(32, ((0, 16),))  # the block lies inside the first document: unchanged, one kernel call
    assert split_blocks(blocks, whole, whole, inside, 1) == blocks
    one = Documents(16, ((0, 1),))  # rows 1..15 one document: only row 0 alone
    assert split_blocks([Block(slice(4, 8), slice(0, 4), False)], whole, whole, one, 1) == [
        Block(slice(4, 8), slice(1, 4), False)
    ]
    late = Documents(16, ((0, 12),))  # chunk 3 is its own document: it shares nothing with chunk 0
    assert split_blocks([Block(slice(4, 8), slice(0, 4), False)], whole, whole, late, 1) == []
    assert sum(block_cost(b) for b in split_blocks(blocks, whole, whole, late, 1)) == 10 + 10  # two diagonals


def test_accumulator_merges_rows_without_keys_without_nan():
    q = torch.zeros(1, 4, 2, 3)
    acc = ForwardAccumulator(q)
    out, lse = torch.ones(1, 2, 2, 3), torch.zeros(1, 2, 2)
    acc.add(slice(0, 2), out, lse)  # rows 0-1
    acc.add(slice(1, 4), 2 * torch.ones(1, 3, 2, 3), torch.zeros(1, 2, 3))  # row 1 merges, rows 2-3 fresh
    partial_lse = torch.tensor([[[0.0, float("-inf"), float("-inf")]] * 2])
    acc.add(slice(1, 4), torch.zeros(1, 3, 2, 3), partial_lse, complete=False)  # rows without keys: no change
    got, got_lse = acc.result(torch.float32)
    assert torch.isfinite(got).all() and torch.isfinite(got_lse).all()
    torch.testing.assert_close(got[0, :, 0, 0], torch.tensor([1.0, 1.5 * 2 / 3, 2.0, 2.0]))
    empty = ForwardAccumulator(q)
    empty.add(slice(0, 4), torch.zeros(1, 4, 2, 3), torch.full((1, 2, 4), float("-inf")), complete=False)
    empty.add(slice(0, 4), torch.zeros(1, 4, 2, 3), torch.full((1, 2, 4), float("-inf")), complete=False)
    o, lse = empty.result(torch.float32, require_covered=False)
    assert not o.isnan().any() and torch.isneginf(lse).all()
    with pytest.raises(AssertionError, match="without any key"):
        empty.result(torch.float32)


def test_checkpoint_replay_checks_the_documents():
    from easy_context.core.attn_checkpoint import AttnCache, forward_or_replay

    q = torch.zeros(1, 2, 1, 1)
    record, replay = AttnCache().contexts()
    a, b = Documents(2, ((0, 1),)), Documents(2, ((0,),))
    with record:
        forward_or_replay("t", q, lambda: (q, torch.zeros(1, 1, 2)), a)
    with replay, pytest.raises(RuntimeError, match="other documents"):
        forward_or_replay("t", q, lambda: (q, torch.zeros(1, 1, 2)), b)


# ------------------------------------------------------------------------------------------------ attention parity


def _bench(name: str):
    import importlib
    import os

    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module(name)


def test_virtual_ranks_and_every_cpu_kernel_with_documents():
    """bench/documents_check.py (the GPU check) on CPU: zigzag and DistFlashAttn on 4 virtual ranks and the local
    per-document path, each CPU kernel, forward and backward, against each document attended alone."""
    check = _bench("documents_check")
    for kernel in ("cpu", "math"):
        for path, errs in check.check_kernel(kernel, torch.device("cpu"), torch.float32, 128, 4, 4, 2, 8).items():
            assert max(errs.values()) < TOL, (kernel, path, errs)


def test_cudnn_backward_sends_one_by_one_blocks_to_math():
    """cuDNN's backward refuses s_q = s_kv = 1 (a one-token document's block; seen on the H200): math runs it."""
    from easy_context.kernels.cuda_sdpa import cudnn_backward
    from easy_context.kernels.math_ref import MATH

    g = torch.Generator().manual_seed(0)
    q, dout = torch.randn(2, 1, 4, 8, generator=g), torch.randn(2, 1, 4, 8, generator=g)
    k, v = torch.randn(2, 1, 2, 8, generator=g), torch.randn(2, 1, 2, 8, generator=g)
    out, lse = MATH.forward(q, k, v, True, 0.3)
    lse = lse + 0.5  # a merged LSE (other keys elsewhere): the gradients are not zero
    for got, want in zip(cudnn_backward(dout, q, k, v, out, lse, True, 0.3),
                         MATH.backward(dout, q, k, v, out, lse, True, 0.3)):  # fmt: skip
        torch.testing.assert_close(got, want)


def test_imbalance_bench_counts_the_masked_work():
    """bench/document_imbalance.py: one document is balanced; documents remove work (each score once)."""
    imb = _bench("document_imbalance")
    for work_fn in (imb.zigzag_work, imb.dist_flash_work):
        base = imb.summarize(*work_fn(4, 64, None))
        assert base["imbalance"] == 0 and base["work"] == 64 * 65 // 2
        docs = imb.documents_of([10, 1, 30, 23])
        masked = imb.summarize(*work_fn(4, 64, docs))
        assert masked["work"] == sum(n * (n + 1) // 2 for n in (10, 1, 30, 23))


def doc_lengths(length: int, chunk: int, seed: int) -> list[int]:
    """Random documents over ``length`` rows with one-token documents (rows 1 and length - 1), documents starting
    exactly at the chunk boundaries ``chunk`` and ``2 * chunk`` and one long document across chunk boundaries."""
    rng = random.Random(seed)
    cuts = {1, 2, chunk, 2 * chunk, length - 1}
    cuts |= {x for x in range(3, length - 1) if rng.random() < 0.25 and not 2 * chunk < x <= 4 * chunk + 1}
    bounds = [0, *sorted(c for c in cuts if 0 < c < length), length]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def per_document_reference(q, k, v, dout, lengths_per_row, causal):
    """(out, dq, dk, dv) in float64, each document of each row attended alone."""
    refs = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, q, k, k)]
    for r, lengths in enumerate(lengths_per_row):
        a = 0
        for n in lengths:
            part = reference_with_grads(*(x[r : r + 1, a : a + n] for x in (q, k, v, dout)), causal=causal)
            for acc, x in zip(refs, part):
                acc[r : r + 1, a : a + n] = x
            a += n
    return refs


ATTN_CASES = {  # batch rows: document lengths from a seed (None: one document), causal
    "one_row": ((0,), True),
    "rows_differ": ((1, None), True),  # per-row documents; the second row is one document
    "rows_same": ((2, 2), True),
    "noncausal": ((3,), False),
}


def attention_worker(rank, world, algo, opts, kernel, case):
    seeds, causal = ATTN_CASES[case]
    hq, hkv, d = (6, 3, 8) if world == 3 else (4, 2, 8)
    chunk = 5
    length = 2 * world * chunk
    lengths = [[length] if s is None else doc_lengths(length, chunk, s) for s in seeds]
    g = torch.Generator().manual_seed(len(case))
    b = len(seeds)
    q, dout = (torch.randn(b, length, hq, d, generator=g) for _ in range(2))
    k, v = (torch.randn(b, length, hkv, d, generator=g) for _ in range(2))
    positions = torch.stack([positions_of(lens, first=3 * r) for r, lens in enumerate(lengths)])
    ref = per_document_reference(q, k, v, dout, lengths, causal)
    shard = lambda x: ec.extract_local(algo, x, rank, world, **opts)  # noqa: E731
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    out = ec.get_attn_func(algo, kernel, **opts)(ql, kl, vl, causal=causal, position_ids=shard(positions))
    out.backward(shard(dout))
    return {
        n: rel_err(x, shard(r)) for n, x, r in zip(("out", "dq", "dk", "dv"), (out, ql.grad, kl.grad, vl.grad), ref)
    }


ATTN_ALGOS = [  # (world, algo, options, kernel)
    *[(w, a, {}, "auto") for w in (2, 3, 4) for a in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn")],
    (2, "usp_attn", {"ring_degree": 2}, "auto"),
    (2, "usp_attn", {"ring_degree": 1}, "auto"),
    (4, "usp_attn", {"ring_degree": 2}, "auto"),
    (3, "usp_attn", {"ring_degree": 3}, "auto"),
    (3, "usp_attn", {"ring_degree": 1}, "auto"),
    (2, "data_parallel", {}, "cpu"),
    (2, "data_parallel", {}, "math"),
    (4, "zigzag_ring_attn", {}, "math"),
]


@pytest.mark.parametrize("world,algo,opts,kernel", ATTN_ALGOS, ids=lambda x: str(x) if not isinstance(x, dict) else "")
def test_attention_parity_with_documents(dist_pool, world, algo, opts, kernel):
    for case in ATTN_CASES:
        for rank, errs in enumerate(dist_pool(world).run(attention_worker, algo, opts, kernel, case)):
            assert max(errs.values()) < TOL, f"{case} rank {rank}: {errs}"


def explicit_documents_worker(rank, world):
    """documents= passed explicitly; ranks passing different documents all raise (no silent mismatch)."""
    q = torch.randn(1, 8, 2, 4)
    attn = ec.get_attn_func("zigzag_ring_attn")
    attn(q, q, q, documents=Documents(8 * world, ((0, 3),)))
    try:
        attn(q, q, q, documents=Documents(8 * world, ((0, 3 + rank),)))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_ranks_must_agree_on_documents(dist_pool):
    for msg in dist_pool(2).run(explicit_documents_worker):
        assert "same documents" in msg


def test_hf_attention_accepts_cu_seq_lens():
    from types import SimpleNamespace

    from easy_context.hf.attention import make_hf_attention

    fn = make_hf_attention("data_parallel", kernel="cpu")
    module = SimpleNamespace(is_causal=True, config=SimpleNamespace())
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))  # (b, h, s, d) as transformers passes
    pos = positions_of([4, 1, 7])[None]
    by_positions, _ = fn(module, q, k, v, None, position_ids=pos)
    cu = torch.tensor([0, 4, 5, 12], dtype=torch.int32)
    by_cu, _ = fn(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    torch.testing.assert_close(by_cu, by_positions)
    ref = per_document_reference(*(x.transpose(1, 2) for x in (q, k, v, q)), [[4, 1, 7]], True)[0]
    assert rel_err(by_positions, ref) < TOL
    with pytest.raises(ValueError, match="describe different documents"):
        fn(module, q, k, v, None, position_ids=torch.arange(12)[None], cu_seq_lens_q=cu)
    with pytest.raises(ValueError, match="whole \\(global\\) sequence"):
        fn(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 4, 10]))


def test_padding_continues_each_rows_last_position():
    pos = torch.stack([positions_of([3, 4]), torch.arange(7)])
    ids = torch.zeros(2, 7, dtype=torch.long)
    _, p_pos, _ = ec.pad_seq_parallel_inputs("zigzag_ring_attn", ids, pos, ids, 2, pad_token_id=0)
    assert p_pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], list(range(8))]  # the padding joins the last document


# ------------------------------------------------------------------------------------------------ data path


def test_document_positions():
    from easy_context.data import document_positions

    rows = torch.tensor([[5, 0, 3, 4, 0, 0, 7], [1, 2, 3, 4, 5, 6, 0]]).numpy()
    assert document_positions(rows, eos_id=0).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 1, 2, 3, 4, 5, 6]]


@pytest.fixture(scope="module")
def packed_dirs(tmp_path_factory):
    """The same short documents prepared twice with the CLI: ``--pack concat`` and ``--pack documents``."""
    from easy_context.data.__main__ import main

    root = tmp_path_factory.mktemp("docs_data")
    rng = random.Random(0)
    words = "the model reads a long context and learns where each word comes from in the text".split()
    src = root / "src"
    src.mkdir()
    for i in range(120):  # many documents per 256-token row
        n = rng.randint(5, 50)
        (src / f"doc{i:02d}.txt").write_text(" ".join(words[(j * 7 + i) % len(words)] for j in range(n)))
    out = {}
    for pack in ("concat", "documents"):
        out[pack] = root / pack
        argv = ["--dataset", str(src), "--output", str(out[pack]), "--seq-length", "256", "--train-tokenizer",
                "300", "--pack", pack, "--no-progress"]  # fmt: skip
        assert main(argv) == 0
    return out


def test_pack_documents_writes_restarting_positions(packed_dirs):
    import datasets

    from easy_context.data import load_train_dataset, pack_stats

    concat = datasets.load_from_disk(str(packed_dirs["concat"]))
    docs = datasets.load_from_disk(str(packed_dirs["documents"]))
    assert concat.column_names == ["input_ids"] and docs.column_names == ["input_ids", "position_ids"]
    assert docs["input_ids"] == concat["input_ids"]  # the same rows; only the positions are added
    assert pack_stats(docs).rows == len(docs)
    from easy_context.models.tokenizer import load_tokenizer

    eos = load_tokenizer(str(packed_dirs["documents"] / "tokenizer")).eos_token_id
    restarts = 0
    for ids, pos in zip(docs["input_ids"], docs["position_ids"]):
        assert pos[0] == 0
        for i in range(1, len(ids)):
            assert pos[i] == (0 if ids[i - 1] == eos else pos[i - 1] + 1)
            restarts += pos[i] == 0
    assert restarts > 2 * len(docs)  # several documents per row
    item = load_train_dataset(str(packed_dirs["documents"]), None, 256)[0]
    assert set(item) == {"input_ids", "position_ids"} and item["position_ids"].shape == (257,)
    assert isinstance(load_train_dataset(str(packed_dirs["concat"]), None, 256)[0], torch.Tensor)


def test_train_with_packed_documents(packed_dirs, tmp_path):
    """train.py passes the dataset's positions through: 2-rank zigzag reproduces the 1-process run (transformers'
    own document masking), and differs from the same rows packed without documents."""
    from tests.e2e.test_train import losses, run_train

    def train(data, out, mode, procs, *extra):
        data_dir = packed_dirs[data]
        return run_train(data_dir, out, "--parallel_mode", mode, "--checkpointing", "none", *extra, procs=procs,
                         steps=2)  # fmt: skip

    train("documents", tmp_path / "dp", "data_parallel", 1)
    train("documents", tmp_path / "zz", "zigzag_ring_attn", 2)
    train("documents", tmp_path / "zz_bal", "zigzag_ring_attn", 2, "--balance-documents")  # documents reordered
    train("concat", tmp_path / "concat", "data_parallel", 1)
    ref = losses(tmp_path / "dp")
    assert losses(tmp_path / "zz") == pytest.approx(ref, rel=1e-4)
    assert losses(tmp_path / "zz_bal") == pytest.approx(ref, rel=1e-4)  # exact: the same loss
    assert abs(losses(tmp_path / "concat")[0] - ref[0]) > 1e-3


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
