"""Every layout question is answered by the backend: ``get_seq_algo(name).layout(world, heads, kv_heads, **opts)``.

Each real backend's answers (multiple, head split, K/V replication, resolved options, the reason a layout cannot
run), the one length check, the option flags, and a toy fifth backend that runs through train.py, the planner and
the eval runtime with nothing but its registration.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

import easy_context as ec
from easy_context import cli
from easy_context.backends.data_parallel import identity_shard, identity_spans
from easy_context.backends.ulysses_attn import kv_replication
from easy_context.core import registry
from easy_context.core.layout import local_rule
from easy_context.core.local_attn import local_attention
from easy_context.core.seq_algo import OptionFlag, SeqAlgo
from easy_context.eval.runtime import EvalRuntime, add_runtime_args, check_layout
from easy_context.plan import ModelShape, Setup, mode_layout, parse_config, parse_size, plan, predict
from easy_context.sp_config import SPConfig


@pytest.mark.parametrize(
    "seq_algo,world,heads,kv,opts,expect",
    [
        ("zigzag_ring_attn", 4, 32, 8, {}, dict(multiple=8, shard=4, ring=4, ulysses=1, kv_rep=1, blockwise=True)),
        ("zigzag_ring_attn", 1, 32, 8, {}, dict(multiple=2, shard=1, ring=1, blockwise=True, borrows_queries=False)),
        ("dist_flash_attn", 3, 5, 1, {}, dict(multiple=3, shard=3, ring=3, ulysses=1, kv_rep=1, borrows_queries=True)),
        ("dist_flash_attn", 1, 5, 1, {}, dict(multiple=1, ring=1, blockwise=True, borrows_queries=False)),
        ("ulysses_attn", 4, 32, 8, {}, dict(multiple=4, shard=4, ring=1, ulysses=4, kv_rep=1, blockwise=False)),
        ("ulysses_attn", 8, 32, 2, {}, dict(multiple=8, shard=8, ring=1, ulysses=8, kv_rep=4)),
        ("usp_attn", 8, 32, 2, {}, dict(multiple=8, ring=2, ulysses=4, kv_rep=2, options={"ring_degree": 2})),
        ("usp_attn", 3, 6, 6, {}, dict(multiple=6, ring=3, ulysses=1, options={"ring_degree": 3})),  # odd: a ring
        ("usp_attn", 4, 6, 6, {"ring_degree": 4}, dict(multiple=8, ring=4, ulysses=1, kv_rep=1, blockwise=True)),
        ("usp_attn", 2, 8, 2, {"ring_degree": 1}, dict(multiple=2, ring=1, ulysses=2, blockwise=True)),
        ("data_parallel", 4, 32, 8, {}, dict(multiple=1, shard=1, ring=1, ulysses=1, kv_rep=1, blockwise=False)),
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


@pytest.mark.parametrize("heads,kv,world", [(4, 2, 3), (8, 3, 4), (28, 4, 8)])
def test_the_attention_raises_what_the_layout_says(heads, kv, world):
    """The Ulysses all-to-all refuses exactly the head splits the layout calls infeasible, with the same words."""
    why = ec.get_seq_algo("ulysses_attn").layout(world, heads, kv).infeasible
    with pytest.raises(ValueError) as info:
        kv_replication(heads, kv, world)
    assert why == str(info.value)


def test_one_length_check_and_message():
    layout = ec.get_seq_algo("usp_attn").layout(4, 8, 8)
    assert layout.check_length(16) is layout
    with pytest.raises(ValueError, match=r"1022 is not divisible by 4 \(it must be a multiple of 4 on 4 ranks with "
                                         r"ring_degree=2\).*seq_multiple\('usp_attn', 4, ring_degree=2\)"):  # fmt: skip
        layout.check_length(1022)
    # sharding and the EasyContext input helper raise the same message (naming both padding helpers)
    with pytest.raises(ValueError, match=r"dist_flash_attn: sequence length 10 is not divisible by 3 .*"
                                         r"pad_seq_parallel_inputs.*pad_to_multiple"):  # fmt: skip
        ec.extract_local("dist_flash_attn", torch.zeros(1, 10), 0, 3)
    ids = torch.zeros(1, 10, dtype=torch.long)
    with pytest.raises(ValueError, match=r"zigzag_ring_attn: sequence length 10 is not divisible by 4 .*"
                                         r"pad_seq_parallel_inputs"):  # fmt: skip
        ec.prepare_seq_parallel_inputs("zigzag_ring_attn", ids, None, ids, 0, 2, "cpu")


def test_options_from_flags():
    assert ec.get_seq_algo("usp_attn").options_from({"ring_degree": 2}) == {"ring_degree": 2}
    assert ec.get_seq_algo("usp_attn").options_from({"ring_degree": None}) == {"ring_degree": None}
    assert ec.get_seq_algo("zigzag_ring_attn").options_from({"ring_degree": None}) == {}
    with pytest.raises(ValueError, match=r"ring_degree does not apply to zigzag_ring_attn \(its options: \[\]\)"):
        ec.get_seq_algo("zigzag_ring_attn").options_from({"ring_degree": 2})


def test_option_flags_and_choices_come_from_the_backends():
    p = cli.ArgumentParser()
    registry.add_backend_args(p, default="zigzag_ring_attn")
    args = p.parse_args(["--ring-degree", "2", "--kernel", "math"])
    assert (args.parallel_mode, args.kernel, registry.option_values(args)) == ("zigzag_ring_attn", "math",
                                                                             {"ring_degree": 2})  # fmt: skip
    assert "usp_attn: ring size" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--kernel", "fa9"])
    usp = ec.get_seq_algo("usp_attn")
    assert list(usp.option_choices(6)) == [{}, *({"ring_degree": r} for r in (1, 2, 3, 6))]
    assert list(usp.option_choices(6, ring_degree=3)) == [{"ring_degree": 3}]
    assert list(ec.get_seq_algo("ulysses_attn").option_choices(4)) == [{}]
    # 28 query heads on 8 ranks: the default (Ulysses degree 4) first, then every other split the heads allow
    assert [dict(lay.options) for lay in usp.feasible_layouts(8, 28, 4)] == [{"ring_degree": r} for r in (2, 4, 8)]
    assert registry.document_masking_algos() == ec.SEQ_ALGOS
    assert registry.unknown_mode_error("usp_attn") is None
    assert "unknown --parallel_mode 'ring'" in registry.unknown_mode_error("ring")


def test_planner_asks_the_backend():
    qwen = ModelShape("qwen", 3584, 2, heads=28, kv_heads=4, head_dim=128, intermediate=18944, vocab=32000)
    setup = Setup(gpus=8, gpu_mem=parse_size("80GB"), host_mem=parse_size("1TB"))
    assert mode_layout("usp_attn", qwen, setup).options == {"ring_degree": 2}
    assert mode_layout("ulysses_attn", qwen, setup).infeasible.startswith("ulysses_attn: 28 query heads")
    given = Setup(gpus=8, gpu_mem=parse_size("80GB"), host_mem=parse_size("1TB"), ring_degree=8)
    assert mode_layout("usp_attn", qwen, given).ring == 8
    assert predict(qwen, given, "usp_attn", parse_config("offload")).ring_degree == 8
    with pytest.raises(ValueError, match="unknown sequence-parallel mode 'ring'"):
        mode_layout("ring", qwen, setup)


# ---------------------------------------------------------------------------------------------------- a fifth backend
def toy_rule(world_size: int, heads: int, kv_heads: int, block: int | None = None) -> dict:
    """Whole sequences on every rank, lengths in blocks; refuses odd head counts (to show an infeasible layout)."""
    why = f"{heads} query heads are odd; use zigzag_ring_attn" if heads % 2 else None
    return {**local_rule(world_size, heads, kv_heads), "options": {"block": block or 4}, "infeasible": why}


TOY = SeqAlgo(
    name="toy_attn",
    shard=lambda value, rank, world_size, dim=1, block=None: identity_shard(value, rank, world_size, dim),
    multiple=lambda world_size, block=None: block or 4,
    impl=lambda q, k, v, kernel, scale, causal, group, block=None: local_attention(q, k, v, kernel, scale, causal),
    distributed=False,
    options={"block": None},
    layout_rule=toy_rule,
    spans=lambda rank, world_size, seq_local, block=None: identity_spans(rank, world_size, seq_local),
    flags={"block": OptionFlag("length multiple", int, lambda world_size: [4, 8])},
)


@pytest.fixture
def toy():
    registry.register_seq_algo(TOY)
    yield TOY
    registry._ALGOS.pop(TOY.name)
    registry.SEQ_ALGOS = tuple(registry._ALGOS)


def test_a_fifth_backend_needs_only_its_registration(toy):
    assert ec.SEQ_ALGOS[-1] == "toy_attn" and ec.seq_multiple("toy_attn", 4, block=8) == 8
    q, k, v = (torch.randn(1, 16, 2, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(ec.get_attn_func("toy_attn")(q, k, v), ec.get_attn_func("data_parallel")(q, k, v))
    assert "toy_attn" not in registry.document_masking_algos()  # its attention takes no documents
    with pytest.raises(NotImplementedError, match="use one of zigzag_ring_attn, dist_flash_attn, ulysses_attn"):
        ec.get_attn_func("toy_attn")(q, k, v, position_ids=torch.tensor([[*range(8), *range(8)]]))
    refused = {"sliding-window attention": {"sliding_window": 4}, "attention sinks": {"sinks": torch.zeros(2)}}
    for what, variant in refused.items():
        message = f"toy_attn: this backend does not implement {what}; use one of zigzag_ring_attn, dist_flash_attn"
        with pytest.raises(NotImplementedError, match=message):
            ec.get_attn_func("toy_attn")(q, k, v, **variant)

    import train  # train.py: its flag, its options, its layout and length checks

    base = ["--model", "tiny-llama", "--tokenizer", "X", "--dataset", "D", "--output-dir", "O"]
    args = train.parse_args([*base, "--parallel_mode", "toy_attn", "--block", "8", "--seq-length", "12"])
    opts = train.backend_options(args)
    assert opts == {"block": 8}
    sp = SPConfig("toy_attn", opts, sp_rank=1, sp_size=4)  # what train.sp_config resolves on rank 1 of 4
    assert (sp.distributed, sp.data_shards, sp.seq_multiple()) == (False, 4, 8)
    config = SimpleNamespace(num_attention_heads=8, num_key_value_heads=2)
    with pytest.raises(SystemExit, match=r"toy_attn: --seq-length 12 is not divisible by 8 .* on 4 ranks with "
                                         r"block=8"):  # fmt: skip
        train.check_layout(args, sp, config)
    args.seq_length = 16
    train.check_layout(args, sp, config)
    with pytest.raises(SystemExit, match="toy_attn: 7 query heads are odd; use zigzag_ring_attn"):
        train.check_layout(args, sp, SimpleNamespace(num_attention_heads=7))
    with pytest.raises(SystemExit, match="--ring_degree does not apply to toy_attn"):
        train.backend_options(SimpleNamespace(parallel_mode="toy_attn", ring_degree=2, block=None))
    with pytest.raises(SystemExit, match="--block does not apply to usp_attn"):
        train.backend_options(SimpleNamespace(parallel_mode="usp_attn", ring_degree=None, block=8))

    # the planner: in its modes, its layout rule (length multiple, infeasible heads) and its option search
    shape = ModelShape("toy", 1024, 4, heads=8, kv_heads=8, head_dim=128, intermediate=2816, vocab=32000)
    setup = Setup(gpus=2, gpu_mem=parse_size("80GB"), host_mem=parse_size("1TB"))
    preds = {p.mode: p for p in plan(shape, setup, options=[parse_config("offload")])}
    assert preds["toy_attn"].max_seq > 0 and preds["toy_attn"].max_seq == preds["data_parallel"].max_seq
    odd = ModelShape("odd", 1024, 4, heads=7, kv_heads=7, head_dim=128, intermediate=2816, vocab=32000)
    p = predict(odd, setup, "toy_attn", parse_config("offload"))
    assert p.limited_by == "infeasible" and p.reason == "toy_attn: 7 query heads are odd; use zigzag_ring_attn"

    # the eval runtime: its flags, and the layout check before a model is patched
    parser = argparse.ArgumentParser()
    add_runtime_args(parser)
    assert registry.option_values(parser.parse_args(["--block", "4"])) == {"ring_degree": None, "block": 4}
    runtime = EvalRuntime(SPConfig("toy_attn", {"block": 8}, sp_rank=0, sp_size=4), torch.device("cpu"))
    assert not runtime.distributed and runtime.my_share(8) == [0, 4]
    check_layout(runtime, SimpleNamespace(num_attention_heads=8, num_key_value_heads=8))
    with pytest.raises(ValueError, match="toy_attn: 7 query heads are odd"):
        check_layout(runtime, SimpleNamespace(num_attention_heads=7, num_key_value_heads=7))


def test_position_layout_error_accepts_real_rows_and_refuses_misordered_shards():
    """Real rows pass: packed documents restarting at 0, a row starting mid-document (balanced or not), forward
    skips, DataCollatorWithFlattening's position_ids_start=1. A jump back to another position (what the whole
    sequence on every zigzag rank puts together) is refused, naming the fix."""
    import torch

    from easy_context.core.layout import position_layout_error

    row = lambda *runs: torch.cat([torch.arange(a, b) for a, b in runs])[None]  # noqa: E731
    valid = [row((0, 8), (0, 5)), row((500, 563), (0, 4)), row((0, 58), (0, 4), (500, 563), (0, 3)),
             row((0, 4), (100, 104)), row((1, 4), (1, 5), (1, 3))]  # fmt: skip
    for positions in valid:
        assert position_layout_error("zigzag_ring_attn", positions) is None, positions
    whole_on_two_ranks = row((0, 4), (0, 4), (4, 8), (4, 8))  # zigzag's gather of [0..7] passed on both ranks
    error = position_layout_error("zigzag_ring_attn", whole_on_two_ranks)
    assert error and "jump from 7 to 4 at token 12" in error and "extract_local('zigzag_ring_attn'" in error
