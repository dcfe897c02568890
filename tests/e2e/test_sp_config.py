"""easy_context.sp_config: one resolved SP setup (backend, options, kernel, DP x SP ranks) per process."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig

import easy_context as ec
from easy_context.sp_config import SPConfig, resolve_sp_config
from tests.support import zygote
from tests.support.reference import reference_with_grads, rel_err


def mesh_worker(rank, world, backend, sp_size, options):
    """Resolve on every rank; return what each rank's config says, and its attention's error against one device."""
    ec.reset_groups()
    try:
        sp = resolve_sp_config(backend, sp_size=sp_size, kernel="auto", **options)
        assert (sp.sp_rank, sp.sp_size) == (dist.get_rank(ec.get_sp_group()), dist.get_world_size(ec.get_sp_group()))
        g = torch.Generator().manual_seed(7 + sp.dp_rank)  # one sample per replica
        ids = torch.randint(0, 50, (1, 48), generator=g)
        pos = torch.arange(48)[None]
        shard = sp.shard(ids, pos, ids, "cpu")
        expect = ec.prepare_seq_parallel_inputs(backend, ids, pos, ids, sp.sp_rank, sp.sp_size, "cpu", **sp.options)
        assert all(torch.equal(shard[k], expect[k]) for k in expect)
        q, dout = (torch.randn(1, 48, 4, 8, generator=g) for _ in range(2))
        k, v = (torch.randn(1, 48, 2, 8, generator=g) for _ in range(2))
        ref = reference_with_grads(q, k, v, dout, causal=True)
        local = lambda x: ec.extract_local(backend, x, sp.sp_rank, sp.sp_size, **sp.options)  # noqa: E731
        ql, kl, vl = (local(x).requires_grad_() for x in (q, k, v))
        out = sp.attn_func()(ql, kl, vl)
        out.backward(local(dout))
        err = max(rel_err(x, local(r)) for x, r in zip((out, ql.grad, kl.grad, vl.grad), ref))
        return sp, err
    finally:
        ec.reset_groups()


@pytest.mark.parametrize(
    "backend,sp_size,options,resolved",
    [
        ("zigzag_ring_attn", 2, {}, {}),
        ("usp_attn", 4, {"ring_degree": None}, {"ring_degree": 2}),  # the default ring degree, resolved once
        ("ulysses_attn", 2, {}, {}),
        ("data_parallel", None, {}, {}),
    ],
)
def test_resolved_on_every_rank_of_a_mesh(dist_pool, backend, sp_size, options, resolved):
    results = dist_pool(4).run(mesh_worker, backend, sp_size, options)
    configs = [sp for sp, _ in results]
    size = 4 if sp_size is None else sp_size
    assert [(c.sp_rank, c.sp_size, c.dp_rank, c.dp_size) for c in configs] == [
        (r % size, size, r // size, 4 // size) for r in range(4)
    ]
    assert all(c.options == resolved and c.world_size == 4 for c in configs)
    if backend == "data_parallel":  # every rank reads its own samples
        assert [(c.data_shards, c.data_rank) for c in configs] == [(4, r) for r in range(4)]
    else:  # the ranks of a sequence group read the same samples
        assert [(c.data_shards, c.data_rank) for c in configs] == [(4 // size, r // size) for r in range(4)]
    assert max(err for _, err in results) < 1e-5


def test_layout_questions_are_the_backends():
    llama = LlamaConfig(num_attention_heads=6, num_key_value_heads=2, hidden_size=48)
    sp = SPConfig("ulysses_attn", {}, "auto", sp_rank=0, sp_size=4)
    with pytest.raises(ValueError, match="6 query heads are not divisible by the Ulysses degree 4"):
        sp.check_model(llama)
    zigzag = SPConfig("zigzag_ring_attn", {}, "auto", sp_rank=1, sp_size=4)
    assert zigzag.check_model(llama).ring == 4 and zigzag.seq_multiple() == 8
    with pytest.raises(ValueError, match="not divisible by 8"):
        zigzag.check_model(llama).check_length(100)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"backend": "ring"}, "ring"),
        ({"backend": "zigzag_ring_attn", "kernel": "fa5"}, "unknown attention kernel 'fa5'"),
        ({"backend": "zigzag_ring_attn", "ring_degree": 2}, "ring_degree does not apply to zigzag_ring_attn"),
    ],
)
def test_bad_input_is_refused_before_any_process_group(kwargs, message):
    initialized = dist.is_initialized()
    with pytest.raises(ValueError, match=message):
        resolve_sp_config(**kwargs)
    assert dist.is_initialized() == initialized  # refused before joining or creating one


def test_resolved_for_a_size_without_process_groups():
    """What the planner and the recipe checks ask: a backend on N ranks, no process group needed."""
    from easy_context.sp_config import sp_config_for

    assert sp_config_for("usp_attn", 8).options == {"ring_degree": 2}
    assert sp_config_for("usp_attn", 8, ring_degree=8).options == {"ring_degree": 8}
    assert sp_config_for("zigzag_ring_attn", 4, kernel="math").seq_multiple() == 8
    with pytest.raises(ValueError, match="ring_degree=3 must divide the sequence-parallel size 8"):
        sp_config_for("usp_attn", 8, ring_degree=3)


def test_a_launched_process_without_its_process_group_is_refused():
    """WORLD_SIZE=2 but no group joined yet: a group of one would train this process alone (other math)."""
    code = ("import torch.distributed as dist\nfrom easy_context.sp_config import resolve_sp_config\n"
            "try:\n    resolve_sp_config('zigzag_ring_attn')\nexcept RuntimeError as exc:\n    print(exc)\n"
            "print(dist.is_initialized())\n")  # fmt: skip
    res = subprocess.run([zygote.python(), "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "WORLD_SIZE": "2"})  # fmt: skip
    assert "launched as one of 2 (WORLD_SIZE) but joined no process group yet" in res.stdout, res.stderr[-2000:]
    assert res.stdout.strip().endswith("False")  # refused before creating one
