"""Attention variants under every SP backend (docs/attention_variants.md): Gemma-2 logit soft-capping, gpt-oss
attention sinks and causal sliding windows (Mistral, Qwen2, Gemma 2/3, gpt-oss), forward and backward.

Attention level: out, dq, dk, dv (and the sinks' gradient) of each variant under each backend equal an fp64 reference
with transformers' conventions, on 2, 3 and 4 ranks. Block level: the window's cut of every zigzag step and
DistFlashAttn task covers exactly the window mask, once, and steps beyond the window make no kernel call. Model level:
tiny Gemma 2, Gemma 3, gpt-oss, Mistral with a window shorter than a rank's chunk and DeepSeek-V3 (MLA) match the
single-process eager transformers model (logits and every gradient) under every backend on 2, 3 and 4 ranks.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

import easy_context as ec
from easy_context.backends.dist_flash_attn.schedule import build_schedule, rank_task, task_document_blocks, task_spans
from easy_context.backends.zigzag_ring_attn.attention import step_blocks
from easy_context.backends.zigzag_ring_attn.prepare_inputs import zigzag_spans
from easy_context.core.block import Block
from easy_context.core.registry import get_seq_algo
from easy_context.core.spans import Span
from easy_context.core.windows import window_blocks
from easy_context.kernels import VariantError, get_kernel
from tests.distributed.test_hf_models import models_parity_worker
from tests.support.reference import rel_err

CASES = {  # name -> (attn keywords, causal); "sinks" stands for a (heads,) tensor
    "softcap": ({"softcap": 2.0}, True),
    "softcap-full": ({"softcap": 2.0}, False),
    "sinks": ({"sinks": True}, True),
    "sinks-full": ({"sinks": True}, False),
    "window-3": ({"sliding_window": 3}, True),
    "window-20": ({"sliding_window": 20}, True),
    "window-70": ({"sliding_window": 70}, True),
    "all": ({"softcap": 3.0, "sliding_window": 9, "sinks": True}, True),
}


def reference(q, k, v, causal, softcap=None, sliding_window=None, sinks=None):
    """fp64 attention with transformers' conventions: tanh cap after the scale, keys i - w < j <= i, and a sink
    logit per head appended to the softmax (gpt-oss' eager attention); q (b, s, h, d), k/v (b, s, h_kv, d)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    dist_ = torch.arange(q.shape[1])[:, None] - torch.arange(k.shape[1])[None]
    ok = torch.ones(dist_.shape, dtype=torch.bool)
    if causal:
        ok &= dist_ >= 0
    if sliding_window:
        ok &= dist_ < sliding_window
    s = s.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(*s.shape[:3], 1)], dim=-1)
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1)[..., :-1], v)
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def variants_worker(rank, world, algo, opts, cases):
    warnings.simplefilter("ignore")  # math-kernel notices for soft-capping on CPU
    g = torch.Generator().manual_seed(5)
    seq = 32 * world
    hq, hkv = (6, 3) if world == 3 else (4, 2)  # Ulysses splits the heads over the world
    q, dout = torch.randn(2, seq, hq, 8, generator=g), torch.randn(2, seq, hq, 8, generator=g)
    k, v = torch.randn(2, seq, hkv, 8, generator=g), torch.randn(2, seq, hkv, 8, generator=g)
    sinks = torch.randn(hq, generator=g)
    shard_opts = {k_: v_ for k_, v_ in opts.items() if k_ != "kernel"}

    def local(x):
        return ec.extract_local(algo, x, rank, world, **shard_opts)

    results = {}
    for case in cases:
        kw, causal = CASES[case]
        leaves = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
        ref = reference(*leaves[:3], causal, **{**kw, "sinks": leaves[3] if "sinks" in kw else None})
        ref.backward(dout.double())
        mine = [local(x).detach().clone().requires_grad_() for x in (q, k, v)]
        sink_leaf = sinks.clone().requires_grad_()
        out = ec.get_attn_func(algo, **opts)(*mine, causal=causal, **{**kw, "sinks": sink_leaf if "sinks" in kw
                                                                        else None})  # fmt: skip
        out.backward(local(dout))
        errs = {"out": rel_err(out, local(ref.detach()))}
        for name, x, leaf in zip("qkv", mine, leaves):
            errs["d" + name] = rel_err(x.grad, local(leaf.grad))
        if "sinks" in kw:
            grad = sink_leaf.grad.clone()
            if get_seq_algo(algo).distributed:  # each rank's queries' share, summed as for every parameter gradient
                dist.all_reduce(grad)
            errs["dsinks"] = rel_err(grad, leaves[3].grad)
        results[case] = errs
    return results


# every backend on 2, 3 and 4 ranks (6 query / 3 K/V heads on 3, else 4 / 2: replicated K/V under Ulysses on 4);
# USP: on 2 and 3 ranks a ring x Ulysses grid is degenerate (2 = 1 x 2 or 2 x 1, 3 prime): both factorisations;
# on 4 the 2 x 2 grid. data_parallel attends locally: the world size does not enter.
WORLDS = [(algo, {}, w) for w in (2, 3, 4) for algo in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn")]
WORLDS += [("usp_attn", {"ring_degree": r}, w) for w, r in ((2, 1), (2, 2), (3, 1), (3, 3), (4, 2))]
WORLDS += [("data_parallel", {}, 2)]


@pytest.mark.parametrize("algo,opts,world", WORLDS, ids=[f"{a}-{o.get('ring_degree', '')}w{w}" for a, o, w in WORLDS])
def test_variants_match_reference(dist_pool, algo, opts, world):
    """Soft-capping, sinks (with their gradient), windows of 3 / 20 / 70 tokens (shorter than a zigzag half chunk,
    between, longer than a rank's chunk) and all three at once, causal and full where they apply, in one call."""
    results = dist_pool(world).run(variants_worker, algo, opts, list(CASES))
    for rank, per_case in enumerate(results):
        for case, errs in per_case.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"rank {rank} {case}: {worst} rel err {errs[worst]:.2e}"


def _covered(blocks, q_spans, k_spans, n):
    """(n, n) count of how often each global (query, key) pair is computed by ``blocks``; asserts every row of a
    band block has a key."""
    from easy_context.kernels.base import allowed_keys

    cover = torch.zeros(n, n, dtype=torch.int64)
    q_glob = [sp.start + i for sp in q_spans for i in range(sp.length)]
    k_glob = [sp.start + i for sp in k_spans for i in range(sp.length)]
    for blk in blocks:
        qr, kr = range(blk.q_rows.start, blk.q_rows.stop), range(blk.k_rows.start, blk.k_rows.stop)
        ok = allowed_keys(len(qr), len(kr), blk.causal, blk.band, "cpu")
        ok = torch.ones(len(qr), len(kr), dtype=torch.bool) if ok is None else ok
        assert bool(ok.any(dim=1).all()), f"a query row of {blk} has no key"
        for a, i in enumerate(qr):
            for b, j in enumerate(kr):
                cover[q_glob[i], k_glob[j]] += int(ok[a, b])
    return cover


@pytest.mark.parametrize("window", [1, 3, 7, 8, 15, 40, 200])
def test_window_blocks_cover_the_window_once(window):
    """Every zigzag step (1-4 ranks) and DistFlashAttn task (2-4 ranks) and a long local sequence: the window's blocks
    compute each (query, key) pair of the window exactly once and nothing else; steps beyond it make no call."""
    for world in (1, 2, 3, 4):
        s_local = 16
        n = s_local * world
        dist_ = torch.arange(n)[:, None] - torch.arange(n)[None]
        want = ((dist_ >= 0) & (dist_ < window)).long()
        q = torch.zeros(1, s_local, 1, 1)
        cover = torch.zeros(n, n, dtype=torch.int64)
        for rank in range(world):
            for src in range(world):
                blocks = step_blocks(rank, src, world, q, True, None, window)
                cover += _covered(blocks, zigzag_spans(rank, world, s_local), zigzag_spans(src, world, s_local), n)
                far = min(a.start for a in zigzag_spans(rank, world, s_local)) - max(
                    b.start + b.length - 1 for b in zigzag_spans(src, world, s_local))  # fmt: skip
                if far > window - 1:
                    assert blocks == []
        assert torch.equal(cover, want), (world, window)
        if world > 1:
            cover = torch.zeros(n, n, dtype=torch.int64)
            for step in build_schedule(world, True):
                for rank in range(world):
                    task = rank_task(step, rank)
                    if task is not None:
                        blocks = task_document_blocks(task, s_local, True, None, 1, window)
                        cover += _covered(blocks, *task_spans(task, s_local), n)
            assert torch.equal(cover, want), ("dist_flash_attn", world, window)
    whole = (Span(0, 0, 300),)
    blocks = window_blocks([Block(slice(0, 300), slice(0, 300), True)], whole, whole, window)
    dist_ = torch.arange(300)[:, None] - torch.arange(300)[None]
    assert torch.equal(_covered(blocks, whole, whole, 300), ((dist_ >= 0) & (dist_ < window)).long())


def test_kernels_name_the_kernel_that_can():
    """An explicit kernel that cannot compute a variant raises naming the one that can; auto picks it."""
    with pytest.raises(VariantError, match="'cpu' cannot compute logit soft-capping; use kernel='math'"):
        get_kernel("cpu", "cpu", torch.float32, 8, ("softcap",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert get_kernel("auto", "cpu", torch.float32, 8, ("softcap",)).name == "math"
    assert get_kernel("auto", "cpu", torch.float32, 8, ("band",)).name == "cpu"
    q = torch.randn(1, 8, 2, 8)
    with pytest.raises(VariantError, match="soft-capping"):
        ec.get_attn_func("data_parallel", kernel="cpu")(q, q, q, softcap=5.0)
    with pytest.raises(NotImplementedError, match="non-causal"):
        ec.get_attn_func("data_parallel")(q, q, q, causal=False, sliding_window=3)
    with pytest.raises(ValueError, match="sinks must be a \\(2,\\) tensor"):
        ec.get_attn_func("data_parallel")(q, q, q, sinks=torch.zeros(3))


VARIANT_MODELS = ["gemma2", "gemma3_text", "gpt_oss", "mistral_sliding", "deepseek_v3"]
MODEL_WORLDS = [(algo, {}, w) for w in (2, 3, 4) for algo in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn")]
MODEL_WORLDS += [("usp_attn", {"ring_degree": r}, w) for w, r in ((2, 1), (3, 1), (3, 3), (4, 2))]
MODEL_WORLDS += [("data_parallel", {"always": True}, 2)]  # our local attention (kernel auto), not the model's own


@pytest.mark.parametrize("algo,opts,world", MODEL_WORLDS, ids=[f"{a}-{o.get('ring_degree', '')}w{w}"
                                                               for a, o, w in MODEL_WORLDS])  # fmt: skip
def test_variant_model_parity(dist_pool, algo, opts, world):
    """Tiny Gemma 2 (soft-cap 5 + 5-token window on alternate layers), Gemma 3 (window layers), gpt-oss (window
    layers + sinks), Mistral (window 5) and DeepSeek-V3 (MLA: Q/K heads of 24 dims, V heads of 16; MoE) under each
    backend on 2, 3 and 4 ranks (12 tokens per rank, zigzag halves of 6: the window is shorter than a rank's chunk;
    6 query / 3 K/V heads on 3 ranks), all five models in one distributed call: logits and every parameter gradient
    equal the single-process eager transformers model."""
    for rank, per_model in enumerate(dist_pool(world).run(models_parity_worker, algo, opts, VARIANT_MODELS)):
        for model_type, errs in per_model.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"{model_type} rank {rank}: {worst} rel err {errs[worst]:.2e}"
