"""Attention kernels and sequence-parallel schedules on one GPU.

    python bench/attention.py --check                 # parity of every CUDA kernel and schedule (virtual ranks)
    python bench/attention.py --seqs 32768 65536 131072 --json out.json

Measures, for causal bf16 attention (batch 1, 32 heads, head_dim 128 by default):
* TFLOP/s of each local kernel, forward and forward+backward (fwd+bwd counted as 3.5x the forward FLOPs);
* the *step efficiency* of each SP schedule: its local kernel calls and merges for W virtual ranks over the
  same total sequence (no communication), as monolithic-kernel time / schedule time;
* with ``--windows W ...`` (the ``--kernels`` that compute band blocks: fa4, flex): causal sliding-window attention,
  fwd+bwd time of (a) full causal attention, (b) the window computed without skipping (SDPA with a dense window mask,
  what transformers' sdpa path runs on one GPU), (c) the window through each SP schedule on W virtual ranks (steps and
  tasks beyond the window make no kernel call; diagonal runs longer than the window are tiled) and (d) the
  monolithic window of each kernel (its own tile skipping: the single-GPU ideal). Gemma-3-270M's window layers,
  flash-attn-4 against FlexAttention (the kernel a GPU without flash-attn-4 gets)::

    python bench/attention.py --seqs 131072 --heads 4 --heads-kv 1 --head-dim 256 --windows 512 --kernels fa4 flex \
        --json window.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easy_context.backends.zigzag_ring_attn import simulate as zigzag_sim  # noqa: E402
from easy_context.backends.zigzag_ring_attn import zigzag_shard  # noqa: E402
from easy_context.kernels import KERNELS, kernel_works  # noqa: E402

SCHEDULES = {"zigzag_ring_attn": (zigzag_sim, zigzag_shard)}
try:
    from easy_context.backends.dist_flash_attn import simulate as dist_flash_sim  # noqa: E402
    from easy_context.backends.ulysses_attn import contiguous_shard  # noqa: E402

    SCHEDULES["dist_flash_attn"] = (dist_flash_sim, contiguous_shard)
except Exception:  # backend not present (or not importable) in this tree
    pass


def timed(fn, warmup: int = 2, reps: int = 5) -> float:
    """Median seconds of ``fn()`` with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def causal_fwd_flops(b: int, s: int, h: int, d: int) -> float:
    return 4 * b * h * s * s * d / 2


def reference(q, k, v, dout, causal=True):
    """fp32 math reference on the GPU (small sizes only)."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    rep = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(rep, 2) for x in leaves[1:])
    out = torch.nn.functional.scaled_dot_product_attention(
        leaves[0].transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), is_causal=causal
    ).transpose(1, 2)
    out.backward(dout.float())
    return [out.detach()] + [x.grad for x in leaves]


def rel(x, ref):
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def check(results: list) -> bool:
    """Kernel and virtual-rank schedule parity vs an fp32 reference on the GPU."""
    ok = True
    dev = "cuda"
    for name in ("cudnn", "flash", "efficient", "flex", "math"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for d in (64, 128):
                works = kernel_works(name, "cuda", dtype, d)
                row = {"name": f"check/{name}/{str(dtype)[6:]}/d{d}", "works": works}
                if works:
                    errs = []
                    for hq, hkv, causal in ((8, 8, True), (8, 2, True), (8, 2, False)):
                        g = torch.Generator(device=dev).manual_seed(hq + hkv)
                        q, dout = (torch.randn(2, 384, hq, d, device=dev, generator=g, dtype=dtype) for _ in range(2))
                        k, v = (torch.randn(2, 384, hkv, d, device=dev, generator=g, dtype=dtype) for _ in range(2))
                        kern = KERNELS[name]
                        out, lse = kern.forward(q, k, v, causal, d**-0.5)
                        grads = kern.backward(dout, q, k, v, out, lse, causal, d**-0.5)
                        ref = reference(q, k, v, dout, causal)
                        errs.append(max(rel(a, b) for a, b in zip((out, *grads), ref)))
                    row["max_rel_err"] = max(errs)
                    tol = 2e-2 if dtype != torch.float32 else 2e-3
                    row["pass"] = row["max_rel_err"] < tol
                    ok &= row["pass"]
                results.append(row)
                print(row, flush=True)
    # the fused Triton merge vs the eager merge, on strided views like the ring uses
    from easy_context.core.lse_merge import merge_eager_, merge_into_

    for h, d in ((32, 128), (5, 64), (96, 80)):
        g = torch.Generator(device=dev).manual_seed(h)
        acc = torch.randn(2, 300, h, d, device=dev, generator=g)
        acc_lse = torch.randn(2, h, 300, device=dev, generator=g)
        out = torch.randn(2, 150, h, d, device=dev, generator=g).bfloat16()
        lse = torch.randn(2, h, 150, device=dev, generator=g)
        a1, l1, a2, l2 = acc.clone(), acc_lse.clone(), acc.clone(), acc_lse.clone()
        merge_into_(a1[:, 150:], l1[:, :, 150:], out, lse)
        merge_eager_(a2[:, 150:], l2[:, :, 150:], out, lse)
        err = max(rel(a1, a2), rel(l1, l2))
        row = {"name": f"check/merge_triton_vs_eager/h{h}d{d}", "max_rel_err": err, "pass": err < 1e-5}
        ok &= row["pass"]
        results.append(row)
        print(row, flush=True)
    # schedules on virtual ranks through the CUDA kernels
    for sched, (sim, shard) in SCHEDULES.items():
        for name in ("cudnn", "flash", "efficient"):
            for world, (hq, hkv) in ((4, (8, 2)), (8, (4, 4)), (3, (6, 3))):
                dtype = torch.bfloat16
                if not kernel_works(name, "cuda", dtype, 128):
                    continue
                s = 2 * world * 96
                g = torch.Generator(device=dev).manual_seed(world)
                q, dout = (torch.randn(1, s, hq, 128, device=dev, generator=g, dtype=dtype) for _ in range(2))
                k, v = (torch.randn(1, s, hkv, 128, device=dev, generator=g, dtype=dtype) for _ in range(2))
                sh = lambda x, shard=shard, world=world: [shard(x, r, world) for r in range(world)]
                kern = KERNELS[name]
                outs, lses = sim.virtual_forward(sh(q), sh(k), sh(v), kern, 128**-0.5, True)
                grads = sim.virtual_backward(sh(dout), sh(q), sh(k), sh(v), outs, lses, kern, 128**-0.5, True)
                ref = reference(q, k, v, dout)
                err = max(rel(torch.cat(got, 1), torch.cat(sh(want), 1)) for got, want in zip((outs, *grads), ref))
                row = {"name": f"check/{sched}/{name}/W{world}/h{hq}-{hkv}", "max_rel_err": err, "pass": err < 2e-2}
                ok &= row["pass"]
                results.append(row)
                print(row, flush=True)
    return ok


def _fwd_bwd(kern, q, k, v, dout, d):
    def run():
        o, lse = kern.forward(q, k, v, True, d**-0.5)
        kern.backward(dout, q, k, v, o, lse, True, d**-0.5)

    return run


def _schedule_fwd_bwd(sim, kern, qs, ks, vs, ds, d):
    def run():
        outs, lses = sim.virtual_forward(qs, ks, vs, kern, d**-0.5, True)
        sim.virtual_backward(ds, qs, ks, vs, outs, lses, kern, d**-0.5, True)

    return run


def _zigzag_kernels_only(kern, qs, ks, vs, ds, d):
    """The zigzag schedule's kernel calls without merges or gradient accumulation (the ceiling)."""
    from easy_context.backends.zigzag_ring_attn import zigzag_blocks

    world = len(qs)

    def run():
        for r in range(world):
            for st in range(world):
                src = (r - st) % world
                for b in zigzag_blocks(r, src, qs[r].shape[1], True):
                    qq, kk, vv = qs[r][:, b.q_rows], ks[src][:, b.k_rows], vs[src][:, b.k_rows]
                    o, lse = kern.forward(qq, kk, vv, b.causal, d**-0.5)
                    kern.backward(ds[r][:, b.q_rows], qq, kk, vv, o, lse, b.causal, d**-0.5)

    return run


JSON_OUT: Path | None = None  # --json: rewritten after every row, so a run cut short keeps what it measured


def _record(results, row):
    results.append(row)
    print(row, flush=True)
    if JSON_OUT is not None:
        JSON_OUT.write_text(json.dumps(results, indent=1))


def bench_one_length(s, heads, heads_kv, d, world, results, date, kernels=("fa4", "cudnn", "flash", "efficient")):
    dev, dtype = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(s)
    q, dout = (torch.randn(1, s, heads, d, device=dev, dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(1, s, heads_kv, d, device=dev, dtype=dtype, generator=g) for _ in range(2))
    flops = causal_fwd_flops(1, s, heads, d)
    tag = f"S{s}/h{heads}-{heads_kv}"
    mono = {}
    for name in kernels:
        if not kernel_works(name, "cuda", dtype, d):
            continue
        kern = KERNELS[name]
        t_f = timed(lambda kern=kern: kern.forward(q, k, v, True, d**-0.5))
        t_fb = mono[name] = timed(_fwd_bwd(kern, q, k, v, dout, d))
        for what, t, f in (("fwd", t_f, flops), ("fwd+bwd", t_fb, 3.5 * flops)):
            _record(results, {"name": f"kernel/{name}/{what}/{tag}", "value": round(f / t / 1e12, 1),
                              "unit": "TFLOP/s", "seconds": t, "date": date})  # fmt: skip
    for sched, (sim, shard) in SCHEDULES.items():
        qs, ks, vs, ds = ([shard(x, r, world) for r in range(world)] for x in (q, k, v, dout))
        for name in ("fa4", "cudnn", "flash"):
            if name not in mono or name not in kernels:
                continue
            kern = KERNELS[name]
            if sched == "zigzag_ring_attn":
                t_k = timed(_zigzag_kernels_only(kern, qs, ks, vs, ds, d), warmup=1, reps=3)
                _record(results, {"name": f"kernels_only/{sched}/{name}/W{world}/{tag}",
                                  "value": round(mono[name] / t_k, 3), "unit": "x monolithic fwd+bwd",
                                  "seconds": t_k, "date": date})  # fmt: skip
            t = timed(_schedule_fwd_bwd(sim, kern, qs, ks, vs, ds, d), warmup=1, reps=3)
            for base in sorted({"cudnn", name}):
                _record(results, {"name": f"step_eff/{sched}/{name}/W{world}/{tag}/vs_mono_{base}",
                                  "value": round(mono[base] / t, 3), "unit": "x monolithic fwd+bwd",
                                  "seconds": t, "tflops": round(3.5 * flops / t / 1e12, 1), "date": date})  # fmt: skip


def _masked_sdpa_fwd_bwd(q, k, v, dout, mask):
    """SDPA (memory-efficient kernel) with a dense boolean mask: every tile computed, the mask applied."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = q.shape[2] // k.shape[2]
    leaves = [
        x.detach().repeat_interleave(r, 2).transpose(1, 2).requires_grad_() for x, r in ((q, 1), (k, rep), (v, rep))
    ]
    d_t = dout.transpose(1, 2)

    def run():
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask)
        out.backward(d_t)

    return run


def bench_window(s, heads, heads_kv, d, world, windows, results, date, kernels=("fa4",), dev="cuda"):
    """Sliding-window fwd+bwd times at one length (see the module docstring), for each of ``kernels`` that computes
    band blocks here."""
    dtype = torch.bfloat16
    band_kernels = [n for n in kernels
                    if n in KERNELS and "band" in KERNELS[n].supports and kernel_works(n, dev, dtype, d)]  # fmt: skip
    if not band_kernels:
        _record(results, {"name": f"window/S{s}", "error": f"none of {list(kernels)} computes band blocks here",
                          "date": date})  # fmt: skip
        return
    scale = d**-0.5
    g = torch.Generator(device=dev).manual_seed(s)
    q, dout = (torch.randn(1, s, heads, d, device=dev, dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(1, s, heads_kv, d, device=dev, dtype=dtype, generator=g) for _ in range(2))
    tag = f"S{s}/h{heads}-{heads_kv}"
    rec = lambda name, t, **kw: _record(results, {"name": f"window/{name}/{tag}", "value": round(t, 5),  # noqa: E731
                                                  "unit": "s fwd+bwd", "date": date, **kw})  # fmt: skip
    t_full = {}
    for name in band_kernels:
        t_full[name] = timed(_fwd_bwd(KERNELS[name], q, k, v, dout, d))
        rec(f"full_causal/{name}", t_full[name])
    if "cudnn" in KERNELS and kernel_works("cudnn", dev, dtype, d):
        rec("full_causal/cudnn", timed(_fwd_bwd(KERNELS["cudnn"], q, k, v, dout, d)))
    shards = {name: [[shard(x, r, world) for r in range(world)] for x in (q, k, v, dout)]
              for name, (_, shard) in SCHEDULES.items()}  # fmt: skip
    sched_full = {}
    for kname in band_kernels:
        for name, (sim, _) in SCHEDULES.items():
            qs, ks, vs, ds = shards[name]
            sched_full[name, kname] = timed(_schedule_fwd_bwd(sim, KERNELS[kname], qs, ks, vs, ds, d), warmup=1, reps=3)
            rec(f"full_causal/{name}/{kname}/W{world}", sched_full[name, kname])
    w = max(windows)  # a dense mask computes every tile whatever the window: timed once
    first = band_kernels[0]
    try:
        i = torch.arange(s, device=dev)
        mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < w)
        t_mask = timed(_masked_sdpa_fwd_bwd(q, k, v, dout, mask), warmup=1, reps=2)
        rec(f"w{w}/dense_mask/efficient", t_mask, speedup_vs_full=round(t_full[first] / t_mask, 2))
        del mask
    except torch.OutOfMemoryError as e:
        rec(f"w{w}/dense_mask/efficient", float("nan"), error=str(e)[:120])
    torch.cuda.empty_cache()
    for w in windows:
        band, t_monos = (0, w - 1), {}
        for kname in band_kernels:
            kern = KERNELS[kname]

            def mono(kern=kern, band=band):
                o, lse = kern.forward(q, k, v, True, scale, band)
                kern.backward(dout, q, k, v, o, lse, True, scale, band)

            t_mono = t_monos[kname] = timed(mono)
            extra = {} if kname == first else {f"time_vs_{first}": round(t_mono / t_monos[first], 3)}
            rec(f"w{w}/monolithic/{kname}", t_mono, speedup_vs_full=round(t_full[kname] / t_mono, 2), **extra)
            torch.cuda.empty_cache()
            for name, (sim, _) in SCHEDULES.items():
                qs, ks, vs, ds = shards[name]

                def run(sim=sim, qs=qs, ks=ks, vs=vs, ds=ds, w=w, kern=kern):
                    outs, lses = sim.virtual_forward(qs, ks, vs, kern, scale, True, window=w)
                    sim.virtual_backward(ds, qs, ks, vs, outs, lses, kern, scale, True, window=w)

                t = timed(run, warmup=1, reps=3)
                rec(f"w{w}/{name}/{kname}/W{world}", t,
                    speedup_vs_same_schedule_full=round(sched_full[name, kname] / t, 2),
                    speedup_vs_full=round(t_full[kname] / t, 2),
                    efficiency_vs_monolithic_window=round(t_mono / t, 3))  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="parity checks only")
    ap.add_argument("--seqs", type=int, nargs="*", default=[32768, 65536, 131072])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, nargs="*", default=[32])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--world", type=int, default=8, help="virtual ranks of the SP schedules")
    ap.add_argument("--kernels", nargs="*", default=["fa4", "cudnn", "flash", "efficient"],
                    help="kernels to time (or flex); with --windows, the ones that compute band blocks")  # fmt: skip
    ap.add_argument("--windows", type=int, nargs="*", default=None, help="sliding windows to time (fa4, flex)")
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    global JSON_OUT
    JSON_OUT = Path(args.json) if args.json else None
    date = datetime.date.today().isoformat()
    results: list = [{"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date}]
    ok = True
    if args.check:
        ok = check(results)
    elif args.windows:
        for s in args.seqs:
            bench_window(s, args.heads, args.heads_kv[0], args.head_dim, args.world, args.windows, results, date,
                         args.kernels)  # fmt: skip
            torch.cuda.empty_cache()
    else:
        for hkv in args.heads_kv:
            for s in args.seqs:
                bench_one_length(s, args.heads, hkv, args.head_dim, args.world, results, date, args.kernels)
                torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
