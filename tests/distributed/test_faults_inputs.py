"""Bad attention inputs refused up front with the fix: an empty sequence or shard names the
length the backend needs; q/k/v of mixed dtypes (bf16 autocast over fp32 weights) meet in one compute dtype under
every backend, with each gradient in its input's dtype. 2 gloo ranks (the shared pool), every call under its
timeout."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from tests.support.reference import reference_with_grads, rel_err

WORLD = 2
ALGOS = [("zigzag_ring_attn", {}), ("ulysses_attn", {}), ("usp_attn", {"ring_degree": 2}), ("dist_flash_attn", {}),
         ("data_parallel", {})]  # fmt: skip


@pytest.mark.parametrize("algo,opts", ALGOS[:4], ids=[a for a, _ in ALGOS[:4]])
def test_an_empty_sequence_is_refused_before_sharding(algo, opts):
    """A length-0 sequence passed the length check (0 is a multiple of anything) and gave every rank an empty
    shard."""
    need = ec.seq_multiple(algo, 4, **opts)
    with pytest.raises(ValueError) as err:
        ec.extract_local(algo, torch.zeros(1, 0), 0, 4, **opts)
    assert str(err.value).startswith(f"{algo}: sequence length 0: every rank would hold an empty shard; a sequence "
                                     f"over 4 ranks needs at least {need} tokens (a multiple of {need}: "
                                     f"easy_context.seq_multiple('{algo}', 4"), str(err.value)  # fmt: skip


def empty_shard_worker(rank, world, algo, opts):
    q = torch.randn(1, 0, 2, 16)
    try:
        ec.get_attn_func(algo, **opts)(q, q, q)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("algo,opts", ALGOS, ids=[a for a, _ in ALGOS])
def test_empty_shards_name_the_length_that_fixes_them(dist_pool, algo, opts):
    world = WORLD if algo != "data_parallel" else 1  # data parallel: each rank its own sequence
    need = ec.seq_multiple(algo, world, **opts)
    per_rank = f" ({need // world} per rank)" if world > 1 else ""
    for message in dist_pool(WORLD).run(empty_shard_worker, algo, opts):
        assert message.startswith(f"{algo}: empty sequence:" if world > 1 else "empty sequence:"), message
        assert message.endswith(f": {algo} on {world} rank{'s' * (world > 1)} needs a full sequence of at least "
                                f"{need} tokens{per_rank}, a multiple of easy_context.seq_multiple('{algo}', "
                                f"{world}{', ring_degree=2' if opts else ''})"), message  # fmt: skip


def mixed_dtype_worker(rank, world, algo, opts, autocast):
    """RoPE under bf16 autocast hands fp32 q/k next to a bf16 v (autocast: compute in bf16); without autocast a
    bf16 q next to fp32 k/v computes in the widest, fp32."""
    g = torch.Generator().manual_seed(7)
    s = ec.seq_multiple(algo, world, **opts) * 4
    q, k, v, dout = (torch.randn(1, s, 4, 16, generator=g) for _ in range(4))
    dtypes = (torch.float32, torch.float32, torch.bfloat16)
    if not autocast:
        dtypes = (torch.bfloat16, torch.float32, torch.float32)
    full = [x.to(dt) for x, dt in zip((q, k, v), dtypes)]
    ref = reference_with_grads(*full, dout, causal=True)
    shard = (lambda x: ec.extract_local(algo, x, rank, world, **opts)) if algo != "data_parallel" else (lambda x: x)
    local = [shard(x).detach().requires_grad_() for x in full]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = ec.get_attn_func(algo, **opts)(*local)
    out.backward(shard(dout).to(out.dtype))
    grads = [x.grad for x in local]
    errs = [rel_err(x, shard(r)) for x, r in zip((out, *grads), ref)]
    return str(out.dtype), [str(x.dtype) for x in grads], max(errs)


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast_bf16", "widest"])
@pytest.mark.parametrize("algo,opts", ALGOS, ids=[a for a, _ in ALGOS])
def test_mixed_dtypes_compute_in_one_dtype_and_return_each_inputs_grad_dtype(dist_pool, algo, opts, autocast):
    want_out = "torch.bfloat16" if autocast else "torch.float32"
    want_grads = ["torch.float32", "torch.float32", "torch.bfloat16"]  # each input's dtype
    if not autocast:
        want_grads = ["torch.bfloat16", "torch.float32", "torch.float32"]
    for out_dtype, grad_dtypes, err in dist_pool(WORLD).run(mixed_dtype_worker, algo, opts, autocast):
        assert (out_dtype, grad_dtypes) == (want_out, want_grads)
        assert err < (3e-2 if autocast else 1e-2), err  # bf16 rounding of the inputs, not a layout error (~1)


def train_flag_worker(rank, world, flags):
    """train.py's own resolution of the SP flags (its ``sp_config``) on this rank: the ``error: ...`` line it exits
    with, or "no error"."""
    from easy_context.core import groups
    from easy_context.train import parse_args, sp_config

    args = parse_args(["--model", "tiny-llama", "--dataset", "random:8", "--vocab-size", "300", "--output-dir", "o",
                       *flags])  # fmt: skip
    try:
        sp_config(args)
    except SystemExit as exc:
        return str(exc.code)
    finally:
        groups.reset_groups()
    return "no error"


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--parallel_mode", "zigzag_ring_attn", "--ring_degree", "2"],
         "error: --ring_degree does not apply to zigzag_ring_attn (its options: [])"),
        (["--parallel_mode", "usp_attn", "--ring_degree", "3"],  # was "--sp-size None: usp_attn: ..."
         "error: usp_attn: ring_degree=3 must divide the sequence-parallel size 2 (ulysses_degree = sp_size // "
         "ring_degree) (2 ranks per sequence)"),
        (["--sp-size", "3"], "error: --sp-size 3: sp_size=3 must divide the world size 2"),
    ],
)  # fmt: skip
def test_train_sp_flag_errors_are_one_line_naming_the_flag(dist_pool, flags, message):
    """--ring_degree with zigzag is refused, not ignored; a bad --ring_degree / --sp-size is one line naming that
    flag (not a traceback, not blamed on --sp-size None). Rank 0 exits with that line, the others quietly with exit
    code 1, so a launch shows it once."""
    assert dist_pool(WORLD).run(train_flag_worker, flags) == [message] + ["1"] * (WORLD - 1)
