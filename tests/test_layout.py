"""Every layout question is answered by the backend: ``get_seq_algo(name).layout(world, heads, kv_heads, **opts)``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import easy_context as ec
from easy_context import registry
from easy_context.eval.runtime import EvalRuntime, check_layout
from easy_context.seq_algo import SeqAlgo


@pytest.mark.parametrize(
    "seq_algo,world,heads,kv,opts,expect",
    [
        ("zigzag_ring_attn", 4, 32, 8, {}, dict(multiple=8, shard=4, ring=4, ulysses=1, kv_rep=1)),
        ("dist_flash_attn", 3, 5, 1, {}, dict(multiple=3, shard=3, ring=3, ulysses=1, kv_rep=1)),
        ("ulysses_attn", 4, 32, 8, {}, dict(multiple=4, shard=4, ring=1, ulysses=4, kv_rep=1)),
        ("ulysses_attn", 8, 32, 2, {}, dict(multiple=8, shard=8, ring=1, ulysses=8, kv_rep=4)),
        ("usp_attn", 8, 32, 2, {}, dict(multiple=8, ring=2, ulysses=4, kv_rep=2, options={"ring_degree": 2})),
        ("usp_attn", 4, 6, 6, {"ring_degree": 4}, dict(multiple=8, ring=4, ulysses=1, kv_rep=1)),
        ("data_parallel", 4, 32, 8, {}, dict(multiple=1, shard=1, ring=1, ulysses=1, kv_rep=1)),
    ],
)
def test_layout_of_each_backend(seq_algo, world, heads, kv, opts, expect):
    layout = ec.get_seq_algo(seq_algo).layout(world, heads, kv, **opts).require()
    for name, value in expect.items():
        assert getattr(layout, name) == value, (name, layout)
    assert layout.multiple == ec.seq_multiple(seq_algo, world, **opts)


@pytest.mark.parametrize(
    "seq_algo,world,heads,kv,opts,message",
    [
        ("ulysses_attn", 3, 4, 2, {}, r"ulysses_attn: 4 query heads are not divisible by the Ulysses degree 3; use"),
        ("ulysses_attn", 4, 8, 3, {}, r"3 key/value heads cannot be split over the Ulysses degree 4"),
        ("usp_attn", 4, 6, 2, {"ring_degree": 3}, r"usp_attn: ring_degree=3 must divide"),
        ("usp_attn", 8, 6, 6, {"ring_degree": 2}, r"6 query heads .* Ulysses degree 4"),
    ],
)
def test_infeasible_layouts_name_the_fix(seq_algo, world, heads, kv, opts, message):
    layout = ec.get_seq_algo(seq_algo).layout(world, heads, kv, **opts)
    assert layout.infeasible
    with pytest.raises(ValueError, match=message):
        layout.require()


def test_options_from_flags():
    assert ec.get_seq_algo("usp_attn").options_from({"ring_degree": 2}) == {"ring_degree": 2}
    assert ec.get_seq_algo("usp_attn").options_from({"ring_degree": None}) == {"ring_degree": None}
    assert ec.get_seq_algo("zigzag_ring_attn").options_from({"ring_degree": None}) == {}
    with pytest.raises(ValueError, match=r"ring_degree does not apply to zigzag_ring_attn \(its options: \[\]\)"):
        ec.get_seq_algo("zigzag_ring_attn").options_from({"ring_degree": 2})


def test_length_check_names_the_padding():
    layout = ec.get_seq_algo("usp_attn").layout(4, 8, 8)
    layout.check_length(16)
    with pytest.raises(ValueError, match=r"1022 must be a multiple of 4 .*ring_degree=2"):
        layout.check_length(1022)


def test_a_fifth_backend_needs_only_its_registration():
    """A toy backend (contiguous shards, heads split in pairs of ranks) answers the eval runtime's layout check."""

    def rule(world_size, heads, kv_heads):
        return {"infeasible": None if heads % 2 == 0 else f"{heads} heads are odd; use zigzag_ring_attn"}

    toy = SeqAlgo(
        name="toy_attn",
        shard=lambda value, rank, world_size, dim=1: value.chunk(world_size, dim)[rank],
        multiple=lambda world_size: world_size,
        impl=lambda q, k, v, kernel, scale, causal, group: q,
        layout_rule=rule,
    )
    registry.register_seq_algo(toy)
    try:
        assert "toy_attn" in ec.SEQ_ALGOS and ec.seq_multiple("toy_attn", 4) == 4
        runtime = EvalRuntime(0, 4, torch.device("cpu"), "toy_attn")
        check_layout(runtime, SimpleNamespace(num_attention_heads=8, num_key_value_heads=8))
        with pytest.raises(ValueError, match="toy_attn: 7 heads are odd"):
            check_layout(runtime, SimpleNamespace(num_attention_heads=7, num_key_value_heads=7))
        import train  # train.py's checks ask the backend too

        args = SimpleNamespace(parallel_mode="toy_attn", seq_length=12, ring_degree=None)
        opts = train.backend_options(args)
        train.check_layout(args, 4, SimpleNamespace(num_attention_heads=8, num_key_value_heads=2), opts)
        with pytest.raises(SystemExit, match="toy_attn: 7 heads are odd"):
            train.check_layout(args, 4, SimpleNamespace(num_attention_heads=7), opts)
        with pytest.raises(SystemExit, match=r"--seq-length 12 must be a multiple of 8 for toy_attn on 8 ranks"):
            train.check_layout(args, 8, SimpleNamespace(num_attention_heads=8), opts)
        with pytest.raises(SystemExit, match="--ring_degree does not apply to toy_attn"):
            train.backend_options(SimpleNamespace(parallel_mode="toy_attn", ring_degree=2))
    finally:
        registry._ALGOS.pop("toy_attn")
        registry.SEQ_ALGOS = tuple(registry._ALGOS)
