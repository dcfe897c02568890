"""Document masking (packed documents) with every local kernel of a device, against each document attended alone.

Runs the zigzag and DistFlashAttn schedules on W virtual ranks (the same sub-blocks and merges as the distributed
backends, no communication) and the local per-document path (Ulysses' inner call, data parallel), forward and
backward, and reports the relative error of out/dq/dk/dv against an fp64 per-document reference. The length mix
has one-token documents, documents starting at shard boundaries and long ones across several shards.

    python bench/documents_check.py --device cuda --dtype bfloat16 --seq 4096      # every CUDA kernel
    python bench/documents_check.py --device cpu --dtype float32 --seq 256
    python bench/documents_check.py --time --seq 131072 --world 8 --heads 32 --kv-heads 8   # GPU seconds, cuDNN

``--time``: forward+backward seconds of the zigzag and DistFlashAttn schedules on W virtual ranks (all kernel calls
and merges, no communication) with the length mix of ``bench/document_imbalance.py`` against the same sequence as
one document: the kernel-call overhead of the split (the per-rank imbalance is counted by document_imbalance.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import easy_context as ec  # noqa: E402
from easy_context.backends.dist_flash_attn import simulate as dist_flash_sim  # noqa: E402
from easy_context.backends.zigzag_ring_attn import simulate as zigzag_sim  # noqa: E402
from easy_context.core.documents import Documents  # noqa: E402
from easy_context.core.local_attn import local_attention  # noqa: E402
from easy_context.kernels import KERNELS, get_kernel, kernel_works  # noqa: E402


def mixed_lengths(seq: int, world: int, seed: int) -> list[int]:
    """Short and long documents, one-token ones, and starts at every zigzag chunk boundary of the first half."""
    rng = random.Random(seed)
    chunk = seq // (2 * world)
    cuts = {1, 2, seq - 1} | {chunk * i for i in range(1, world)}
    at = world * chunk
    while at < seq - 2:
        at += rng.choice([1, 3, rng.randint(4, chunk), rng.randint(chunk, 3 * chunk)])
        cuts.add(min(at, seq - 1))
    bounds = [0, *sorted(c for c in cuts if 0 < c < seq), seq]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def per_document_reference(q, k, v, dout, lengths):
    """fp64 (out, dq, dk, dv) with each document attended alone (causal)."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    rep = q.shape[2] // k.shape[2]
    outs, a = [], 0
    for n in lengths:
        qs, ks, vs = (x[:, a : a + n] for x in leaves)
        ks, vs = ks.repeat_interleave(rep, 2), vs.repeat_interleave(rep, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", qs, ks) * q.shape[-1] ** -0.5
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        outs.append(torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vs))
        a += n
    out = torch.cat(outs, 1)
    out.backward(dout.double())
    return out.detach(), *(x.grad for x in leaves)


def rel(x, ref) -> float:
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def check_kernel(kernel_name, device, dtype, seq, world, heads, kv_heads, d, seed=0) -> dict[str, dict[str, float]]:
    g = torch.Generator(device=device).manual_seed(seed)
    q, dout = (torch.randn(1, seq, heads, d, device=device, dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(1, seq, kv_heads, d, device=device, dtype=dtype, generator=g) for _ in range(2))
    lengths = mixed_lengths(seq, world, seed)
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    docs = Documents(seq, (tuple(starts),))
    ref = per_document_reference(q, k, v, dout, lengths)
    kern = get_kernel(kernel_name, device, dtype, d)
    scale = d**-0.5
    results = {}
    for algo, sim in (("zigzag_ring_attn", zigzag_sim), ("dist_flash_attn", dist_flash_sim)):
        shard = lambda x: [ec.extract_local(algo, x, r, world) for r in range(world)]  # noqa: E731,B023
        qs, ks, vs, ds = (shard(x) for x in (q, k, v, dout))
        outs, lses = sim.virtual_forward(qs, ks, vs, kern, scale, True, documents=docs)
        dqs, dks, dvs = sim.virtual_backward(ds, qs, ks, vs, outs, lses, kern, scale, True, documents=docs)
        got = [torch.cat([x[r] for r in range(world)], 1) for x in (outs, dqs, dks, dvs)]
        want = [torch.cat(shard(x), 1) for x in ref]
        results[algo] = {n: rel(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, want)}
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = local_attention(*leaves, kern, scale, True, documents=docs)
    out.backward(dout)
    got = (out, *(x.grad for x in leaves))
    results["local"] = {n: rel(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}
    return results


def time_schedules(kernel_name, device, dtype, seq, world, heads, kv_heads, d, seeds=3) -> dict:
    """Median fwd+bwd seconds of each virtual schedule (every rank's calls in sequence), with documents (mean over
    ``seeds`` length mixes) and without."""
    import statistics

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from document_imbalance import documents_of, length_mix

    g = torch.Generator(device=device).manual_seed(0)
    q, dout = (torch.randn(1, seq, heads, d, device=device, dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(1, seq, kv_heads, d, device=device, dtype=dtype, generator=g) for _ in range(2))
    kern = get_kernel(kernel_name, device, dtype, d)
    scale = d**-0.5

    from attention import timed  # bench/attention.py: median seconds with CUDA events

    out = {}
    for algo, sim in (("zigzag_ring_attn", zigzag_sim), ("dist_flash_attn", dist_flash_sim)):
        qs, ks, vs, ds = ([ec.extract_local(algo, x, r, world) for r in range(world)] for x in (q, k, v, dout))

        def run(docs, qs=qs, ks=ks, vs=vs, ds=ds, sim=sim):
            o, lse = sim.virtual_forward(qs, ks, vs, kern, scale, True, documents=docs)
            sim.virtual_backward(ds, qs, ks, vs, o, lse, kern, scale, True, documents=docs)

        base = timed(lambda: run(None), warmup=1, reps=3)
        with_docs = [timed(lambda s=s: run(documents_of(length_mix(seq, random.Random(s), 0.03, 1000,
                                                                   (16384, 65536)))), warmup=1, reps=3)
                     for s in range(seeds)]  # fmt: skip
        out[algo] = {"one_document_s": base, "documents_s": statistics.mean(with_docs)}
        docs_s = out[algo]["documents_s"]
        print(f"{algo:17s} {kernel_name}: one document {base * 1e3:.1f} ms, documents {docs_s * 1e3:.1f} ms "
              f"({docs_s / base:.1%}; all W virtual ranks' calls in sequence)")  # fmt: skip
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--kernels", nargs="*", default=None, help="default: every kernel that works on the device")
    p.add_argument("--tol", type=float, default=None, help="fail above this (default: 2e-2 bf16/fp16, 1e-5 fp32)")
    p.add_argument("--json", default=None)
    p.add_argument("--time", action="store_true", help="time the virtual schedules (GPU) instead of checking")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.time:
        res = time_schedules((args.kernels or ["auto"])[0], torch.device(args.device), dtype, args.seq, args.world,
                             args.heads, args.kv_heads, args.head_dim)  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "time": res}, indent=1))
        return 0
    tol = args.tol or (1e-5 if dtype == torch.float32 else 2e-2)
    names = args.kernels or [n for n in KERNELS if kernel_works(n, args.device, dtype, args.head_dim)]
    rows, ok = {}, True
    for name in names:
        try:
            res = check_kernel(name, torch.device(args.device), dtype, args.seq, args.world, args.heads,
                               args.kv_heads, args.head_dim)  # fmt: skip
        except Exception as exc:  # a kernel that cannot run some sub-block: report it, check the others
            print(f"{name:10s} FAIL {type(exc).__name__}: {exc}")
            rows[name], ok = {"error": str(exc)}, False
            continue
        rows[name] = res
        for path, errs in res.items():
            worst = max(errs.values())
            ok &= worst < tol
            print(f"{name:10s} {path:17s} " + " ".join(f"{k} {v:.2e}" for k, v in errs.items())
                  + ("" if worst < tol else f"  FAIL (tol {tol})"))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
