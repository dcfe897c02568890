"""Every sequence-parallel attention on 2 CPU processes (gloo) against single-device float64 attention.

    python bench/cpu_sp_demo.py [--world 2] [--seq 2048] [--heads 8] [--heads-kv 2] [--head-dim 64]

Prints, per backend: the largest relative error of the output and of dq/dk/dv over all ranks, and the
forward+backward time of the distributed call (median of 3). `make demo` runs it first (the attention alone, in
seconds), then train_scripts/demo_cpu.sh (the extension experiment).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import easy_context as ec
from easy_context.kernels import KERNELS


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def demo_options(seq_algo: str, world: int, heads: int, kv_heads: int) -> dict:
    """The backend's options whose layout runs the most of its code on ``world`` ranks: an all-to-all where it has
    one, a ring where it has one (usp_attn: ring_degree 1 on 2 ranks, a 2 x 2 mesh on 4)."""
    layouts = ec.get_seq_algo(seq_algo).feasible_layouts(world, heads, kv_heads)
    best = max(layouts, key=lambda lay: (lay.ulysses > 1, lay.ring > 1), default=None)
    return {} if best is None else dict(best.options)  # none feasible: the attention call says why


def _worker(rank: int, world: int, port: int, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    g = torch.Generator().manual_seed(0)
    b, s, h, hkv, d = 1, args.seq, args.heads, args.heads_kv, args.head_dim
    dtype = getattr(torch, args.dtype)
    q, dout = (torch.randn(b, s, h, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, generator=g).to(dtype) for _ in range(2))
    # single-device reference in float64 (explicit softmax)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out = ec.get_attn_func("data_parallel", kernel="math")(*leaves, causal=True)
    ref_out.backward(dout.double())
    refs = [ref_out.detach()] + [x.grad for x in leaves]
    for algo in ec.SEQ_ALGOS:
        if not ec.get_seq_algo(algo).distributed:
            continue
        opts = demo_options(algo, world, h, hkv)
        shard = lambda x, algo=algo, opts=opts: ec.extract_local(algo, x, rank, world, **opts)
        attn = ec.get_attn_func(algo, **opts)
        times = []
        for _ in range(3):
            ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
            dist.barrier()
            t0 = time.perf_counter()
            out = attn(ql, kl, vl, causal=True)
            out.backward(shard(dout))
            dist.barrier()
            times.append(time.perf_counter() - t0)
        err = max(_rel(x, shard(r)) for x, r in zip((out, ql.grad, kl.grad, vl.grad), refs))
        errs = [None] * world
        dist.all_gather_object(errs, err)
        if rank == 0:
            results.put((algo, opts, max(errs), statistics.median(times)))
    if rank == 0:  # the single-process kernel on the whole sequence, for comparison
        kern = KERNELS["cpu"]
        t0 = time.perf_counter()
        out, lse = kern.forward(q, k, v, True, d**-0.5)
        kern.backward(dout, q, k, v, out, lse, True, d**-0.5)
        results.put(("single process (cpu kernel)", {}, _rel(out, refs[0]), time.perf_counter() - t0))
        results.put(None)
    dist.barrier()  # leave together: a gloo peer that exits early can abort the other one's teardown
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, args.world, port, args, results)) for r in range(args.world)]
    for p in procs:
        p.start()
    print(f"causal attention, seq {args.seq}, heads {args.heads}/{args.heads_kv} (q/kv), head_dim {args.head_dim}, "
          f"{args.dtype}, {args.world} CPU processes (gloo); errors vs float64 single-device attention")  # fmt: skip
    print(f"{'backend':<30} {'max rel err (out,dq,dk,dv)':>28} {'fwd+bwd s':>10} {'tokens/s':>10}")
    while (row := results.get(timeout=600)) is not None:
        algo, opts, err, t = row
        name = algo + (f" {opts}" if opts else "")
        print(f"{name:<30} {err:>28.2e} {t:>10.3f} {args.seq / t:>10.0f}")
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit("a demo process failed")


if __name__ == "__main__":
    main()
