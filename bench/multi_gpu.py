"""Every SP backend on several GPUs of one host with NCCL: parity vs one GPU, then speed.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 bench/multi_gpu.py --json out.json

Parity: forward output and dq/dk/dv of each rank's shard against single-GPU attention on the full sequence
(fp32 through the efficient kernel, bf16 through cuDNN; MHA and GQA). Speed: causal attention fwd+bwd
(batch 1, 32 heads, head_dim 128, bf16) per backend at the given lengths, against one GPU running the
monolithic cuDNN kernel on the whole sequence: scaling = t_one_gpu / (W * t_sp) (1.0 = perfect).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import easy_context as ec  # noqa: E402
from easy_context.kernels import KERNELS  # noqa: E402
from easy_context.training.process_exit import exit_process  # noqa: E402


def rel(x, ref):
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def algos(world: int, heads: int, kv_heads: int) -> list[tuple[str, dict]]:
    """(backend, options) of every SP backend: its default layout and, where its options offer more, the last
    choice too (usp_attn: ring_degree 2 x Ulysses and the pure ring, ring_degree = world)."""
    out = []
    for name in ec.SEQ_ALGOS:
        algo = ec.get_seq_algo(name)
        if not algo.distributed:
            continue
        choices = list(algo.option_choices(world))
        variants = [dict(algo.layout(world, heads, kv_heads, **c).options) for c in (choices[0], choices[-1])]
        out += [(name, opts) for i, opts in enumerate(variants) if opts not in variants[:i]]
    return out


def parity(rank, world, dev, rows):
    for dtype, kernel in ((torch.float32, "efficient"), (torch.bfloat16, "cudnn")):
        for hq, hkv in ((8, 8), (8, 2)):
            g = torch.Generator(device=dev).manual_seed(hq * 10 + hkv)
            s = 2 * world * 384
            q, dout = (torch.randn(1, s, hq, 128, device=dev, dtype=dtype, generator=g) for _ in range(2))
            k, v = (torch.randn(1, s, hkv, 128, device=dev, dtype=dtype, generator=g) for _ in range(2))
            leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
            ref = ec.get_attn_func("data_parallel", kernel="efficient")(*leaves)
            ref.backward(dout.float())
            refs = [ref.detach()] + [x.grad for x in leaves]
            for algo, opts in algos(world, hq, hkv):
                shard = lambda x, a=algo, o=opts: ec.extract_local(a, x, rank, world, **o)  # noqa: E731
                ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
                out = ec.get_attn_func(algo, kernel=kernel, **opts)(ql, kl, vl)
                out.backward(shard(dout))
                err = max(rel(a, shard(b)) for a, b in zip((out, ql.grad, kl.grad, vl.grad), refs))
                errs = [None] * world
                dist.all_gather_object(errs, err)
                tol = 1e-4 if dtype == torch.float32 else 2e-2
                row = {"name": f"parity/{algo}{opts or ''}/{str(dtype)[6:]}/{kernel}/h{hq}-{hkv}/W{world}",
                       "value": max(errs), "unit": "max rel err", "pass": max(errs) < tol}  # fmt: skip
                rows.append(row)
                if rank == 0:
                    print(row, flush=True)


def timed(fn, reps=5):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ts.append(start.elapsed_time(end) / 1e3)
    return statistics.median(ts)


def speed(rank, world, dev, seqs, rows):
    os.environ["EASY_CONTEXT_SHAPE_CHECK"] = "0"  # no per-call host sync in timings
    for s in seqs:
        speed_at(s, rank, world, dev, rows)
        torch.cuda.empty_cache()


def speed_at(s, rank, world, dev, rows):
    g = torch.Generator(device=dev).manual_seed(s)
    q, dout = (torch.randn(1, s, 32, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(1, s, 32, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
    kern = KERNELS["cudnn"]

    def mono():
        o, lse = kern.forward(q, k, v, True, 128**-0.5)
        kern.backward(dout, q, k, v, o, lse, True, 128**-0.5)

    t_one = timed(mono)
    for algo, opts in algos(world, 32, 32):
        shard = lambda x, a=algo, o=opts: ec.extract_local(a, x, rank, world, **o)  # noqa: E731
        ql, kl, vl, dl = (shard(x).requires_grad_(x is not dout) for x in (q, k, v, dout))
        attn = ec.get_attn_func(algo, kernel="cudnn", **opts)

        def step(ql=ql, kl=kl, vl=vl, dl=dl, attn=attn):
            attn(ql, kl, vl).backward(dl)

        t = timed(step)
        row = {"name": f"scaling/{algo}{opts or ''}/S{s}/W{world}", "value": round(t_one / (world * t), 3),
               "unit": "t_1gpu / (W * t_sp)", "seconds": t, "seconds_1gpu": t_one,
               "tflops_per_gpu": round(3.5 * 2 * 32 * s * s * 128 / t / world / 1e12, 1)}  # fmt: skip
        rows.append(row)
        if rank == 0:
            print(row, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="*", default=[65536, 131072])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    rows = [{"device": torch.cuda.get_device_name(dev), "gpus": world, "torch": torch.__version__,
             "date": datetime.date.today().isoformat()}]  # fmt: skip
    parity(rank, world, dev, rows)
    speed(rank, world, dev, args.seqs, rows)
    if rank == 0 and args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("pass", True) for r in rows) else 1


if __name__ == "__main__":
    exit_process(main())  # after the work: skips only torch's gloo teardown race
