"""Peers side by side: the same sequence-parallel attention problem through other projects' code and ours.

Every implementation gets the same global q, k, v, dout (batch 1, causal, bf16 on GPU / fp32 on CPU), sharded
the way it expects; its output and gradients are gathered back and compared with one single-device attention
call (max relative error), and forward + backward is timed (median of ``--iters`` after a warm-up). An
implementation without a backward is timed and checked on its forward only (``ms_forward_only``).

- ``ours:<backend>:<kernel>`` — easy_context backends (zigzag_ring_attn, dist_flash_attn, ulysses_attn,
  usp_attn) on a local kernel (cudnn, flash, efficient, cpu).
- ``deepspeed_ulysses`` — DeepSpeed's ``DistributedAttention`` (its all-to-all) around torch SDPA.
- ``yunchang_ulysses:<attn_type>`` — yunchang's ``LongContextAttention`` (ulysses degree = world, ring degree 1)
  with one of its torch attention types (``torch_cudnn``, ``torch_flash``, ...), when yunchang is importable.
  yunchang 0.6.4's torch types have no backward ("Not implemented backward for PyTorch attention types"): it
  trains only through the flash-attn package, so these rows are forward-only.
- ``ringflash_standin`` — ring-flash-attn cannot run without the flash-attn package; its zigzag algorithm on
  the same FA2 kernel family is our ``zigzag_ring_attn`` with ``kernel=flash``: labelled as that stand-in.

::

    torchrun --nproc_per_node 2 bench/peers.py --seq 65536 --heads 32 --heads-kv 8 --json peers.json
    torchrun --nproc_per_node 2 bench/peers.py --device cpu --seq 256 --heads 4 --heads-kv 2   # CPU/gloo
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import easy_context as ec  # noqa: E402
from easy_context.kernels import get_kernel  # noqa: E402
from easy_context.training.process_exit import exit_process  # noqa: E402

Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # local (b, s, h, d) -> local out


def contiguous_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return x.chunk(world, dim=1)[rank].contiguous()


def build(name: str, group, device: torch.device, dtype: torch.dtype, head_dim: int):
    """(attention over local shards, shard fn(x, rank, world), label) for ``name``; raises if unavailable."""
    if name.startswith("ours:") or name == "ringflash_standin":
        _, algo, kernel = name.split(":") if name != "ringflash_standin" else ("", "zigzag_ring_attn", "flash")
        attn = ec.get_attn_func(algo, kernel=kernel)  # the backend's default options (usp_attn: its ring degree)
        shard = lambda x, r, w: ec.extract_local(algo, x, r, w)  # noqa: E731
        label = "ring-flash-attn stand-in: our zigzag on the FA2 kernel" if name == "ringflash_standin" else name
        return (lambda q, k, v: attn(q, k, v, causal=True, group=group)), shard, label
    if name == "deepspeed_ulysses":
        import deepspeed.comm as ds_comm
        from deepspeed.sequence.layer import DistributedAttention

        if not ds_comm.is_initialized():
            ds_comm.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)

        def local_sdpa(q, k, v, *args, **kwargs):  # (b, s, h, d), full sequence, heads / world
            rep = q.shape[2] // k.shape[2]
            k, v = (t.repeat_interleave(rep, dim=2) for t in (k, v))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            return out.transpose(1, 2)

        layer = DistributedAttention(local_sdpa, group, scatter_idx=2, gather_idx=1)
        return (lambda q, k, v: layer(q, k, v, 0)), contiguous_shard, "DeepSpeed Ulysses DistributedAttention + SDPA"
    if name.startswith("yunchang_ulysses"):
        from yunchang import LongContextAttention, set_seq_parallel_pg
        from yunchang.kernels import AttnType

        attn_type = AttnType.from_string(name.partition(":")[2] or "torch_cudnn")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        set_seq_parallel_pg(world, 1, rank, world)
        layer = LongContextAttention(ring_impl_type="basic", attn_type=attn_type)
        label = f"yunchang LongContextAttention (Ulysses, {attn_type.value})"
        return (lambda q, k, v: layer(q, k, v, causal=True)), contiguous_shard, label
    raise ValueError(f"unknown implementation {name!r}")


def gather(x: torch.Tensor, shard, world: int, group) -> torch.Tensor:
    """Undo ``shard`` along the sequence: all-gather the local pieces and put each position back."""
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    s_full = x.shape[1] * world
    index = torch.arange(s_full, device=x.device)[None, :, None, None].float()
    where = torch.cat([shard(index, r, world) for r in range(world)], dim=1).long().flatten()
    out = torch.empty((x.shape[0], s_full, *x.shape[2:]), dtype=x.dtype, device=x.device)
    out[:, where] = torch.cat(parts, dim=1)
    return out


def run(args, rank: int, world: int, group, device: torch.device) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    shape = lambda h: (1, args.seq, h, args.head_dim)  # noqa: E731
    q, dout = (torch.randn(shape(args.heads), device=device, generator=g, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(shape(args.heads_kv), device=device, generator=g, dtype=dtype) for _ in range(2))
    kernel = get_kernel("auto", device, dtype, args.head_dim)
    ref_out, ref_lse = kernel.forward(q, k, v, True, args.head_dim**-0.5)
    ref = (ref_out, *kernel.backward(dout, q, k, v, ref_out, ref_lse, True, args.head_dim**-0.5))
    rows = []
    for name in args.impls:
        row = {"name": name, "seq": args.seq, "heads": args.heads, "heads_kv": args.heads_kv, "world": world}
        package = name.split("_")[0]
        if package in ("deepspeed", "yunchang"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                row["version"] = importlib.metadata.version(package)
        try:
            attn, shard, row["label"] = build(name, group, device, dtype, args.head_dim)
            local = [shard(t, rank, world).detach().requires_grad_(t is not dout) for t in (q, k, v, dout)]
            times, backward = [], True
            for it in range(args.iters + 1):
                for t in local[:3]:
                    t.grad = None
                dist.barrier(group)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = attn(*local[:3])
                if backward:
                    try:
                        out.backward(local[3])
                    except (RuntimeError, NotImplementedError) as exc:  # e.g. yunchang's torch types: forward only
                        backward, row["no_backward"] = False, f"{type(exc).__name__}: {exc}"[:200]
                        continue
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if it:
                    times.append(time.perf_counter() - t0)
            tensors = (out.detach(), local[0].grad, local[1].grad, local[2].grad)[: 4 if backward else 1]
            got = [gather(t, shard, world, group) for t in tensors]
            errs = {key: ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
                    for key, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}  # fmt: skip
            timing = "ms" if backward else "ms_forward_only"
            row |= {"status": "ok", timing: round(1e3 * statistics.median(times), 2), **errs}
        except Exception as exc:  # a peer that cannot run here is reported, not fatal
            row |= {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=65536)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-kv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--impls", nargs="+", default=["ours:zigzag_ring_attn:cudnn", "ours:dist_flash_attn:cudnn",
                   "ours:ulysses_attn:cudnn", "ours:usp_attn:cudnn", "ringflash_standin", "deepspeed_ulysses",
                   "yunchang_ulysses:torch_cudnn", "yunchang_ulysses:torch_flash"])  # fmt: skip
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = run(args, rank, world, dist.group.WORLD, device)
    if rank == 0:
        for row in rows:
            print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
    exit_process()  # after the work: skips only torch's gloo teardown race (easy_context/process_exit.py)
