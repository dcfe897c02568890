"""GPU check of kernel ``flex`` (PyTorch FlexAttention): parity with the fp32 math reference, forward and backward.

What CPU CI cannot run (FlexAttention has no CPU backward; tests/unit/test_kernel_flex.py covers the forward and the
backward's algebra on CPU). On one CUDA GPU, in bf16 and fp32, GQA 4/1:

- causal sliding windows 4, 7, 16 (head_dim 32) and 512 (head_dim 256, Gemma 3's shape) on lengths that are not
  multiples of FlexAttention's 128-row tiles: out, LSE, dq, dk, dv of one call;
- band blocks at other positions (a query block against an earlier key block, as core.windows cuts them), full
  non-causal blocks and soft-capping;
- the zigzag ring schedule with a window on virtual ranks: the backward from the *merged* out/LSE of every row;
- ``kernel="auto"`` picks flex for window blocks when flash-attn-4 is absent, cuDNN for full blocks;
- the compiled kernel is not recompiled per band (informational: the number of Dynamo graphs);
- one timing (informational): monolithic window 512 at ``--seq`` (default 131072) tokens, 4q/1kv, head_dim 256,
  fwd+bwd, flex and fa4 when installed (``bench/attention.py --windows 512 --kernels fa4 flex`` measures more).

Exit status 0 only when every required check passes. Not collected by pytest (CPU CI has no GPU)::

    python tests/gpu/check_flex.py [--seq 131072] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from easy_context import kernels  # noqa: E402
from easy_context.backends.zigzag_ring_attn import zigzag_shard, zigzag_unshard  # noqa: E402
from easy_context.backends.zigzag_ring_attn.simulate import virtual_backward, virtual_forward  # noqa: E402
from easy_context.core.block import Block  # noqa: E402
from easy_context.core.spans import Span  # noqa: E402
from easy_context.core.windows import window_blocks  # noqa: E402
from easy_context.kernels import KERNELS, get_kernel, kernel_works  # noqa: E402
from easy_context.kernels.flex import FLEX  # noqa: E402
from easy_context.kernels.math_ref import MATH  # noqa: E402
from tests.gpu.report import Report, rel  # noqa: E402

DEV = "cuda"
TOL = {torch.bfloat16: 2e-2, torch.float32: 2e-3}  # relative to the largest reference entry; LSE: absolute
REPORT = Report()
record = REPORT.record


def rand(*shape, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32).to(dtype)


def compare(name: str, dtype, got: tuple, want: tuple) -> None:
    """got/want: (out, lse, dq, dk, dv); the LSE compared in absolute terms, the rest relative."""
    errs = {"out": rel(got[0], want[0]), "lse_abs": (got[1] - want[1]).abs().max().item()}
    errs.update({n: rel(g, w) for n, g, w in zip(("dq", "dk", "dv"), got[2:], want[2:])})
    tol = TOL[dtype]
    record(name, all(e <= tol for e in errs.values()), **errs)


def one_block(name: str, dtype, q, k, v, dout, causal: bool, band, softcap=None) -> None:
    scale = q.shape[-1] ** -0.5
    kern, ref = FLEX.with_softcap(softcap), MATH.with_softcap(softcap)
    out, lse = kern.forward(q, k, v, causal, scale, band)
    grads = kern.backward(dout, q, k, v, out, lse, causal, scale, band)
    qf, kf, vf, df = (x.float() for x in (q, k, v, dout))
    r_out, r_lse = ref.forward(qf, kf, vf, causal, scale, band)
    r_grads = ref.backward(df, qf, kf, vf, r_out, r_lse, causal, scale, band)
    compare(name, dtype, (out, lse, *grads), (r_out, r_lse, *r_grads))


def check_blocks(dtype) -> None:
    tag = str(dtype).removeprefix("torch.")
    for d, windows, seqs in ((32, (4, 7, 16), (100, 333)), (256, (512,), (1500,))):
        for w in windows:
            for s in seqs:
                q, dout = rand(2, s, 4, d, dtype=dtype, seed=s + w), rand(2, s, 4, d, dtype=dtype, seed=s + w + 1)
                k, v = rand(2, s, 1, d, dtype=dtype, seed=s + w + 2), rand(2, s, 1, d, dtype=dtype, seed=s + w + 3)
                one_block(f"{tag}/causal_window/w{w}/s{s}/d{d}", dtype, q, k, v, dout, True, (0, w - 1))
    for q_start, k_start, n, m, w in ((300, 100, 130, 250, 256), (64, 0, 16, 80, 9), (1000, 700, 200, 300, 512)):
        q, dout = rand(1, n, 4, 64, dtype=dtype, seed=n), rand(1, n, 4, 64, dtype=dtype, seed=n + 1)
        k, v = rand(1, m, 1, 64, dtype=dtype, seed=m + 2), rand(1, m, 1, 64, dtype=dtype, seed=m + 3)
        blocks = window_blocks([Block(slice(0, n), slice(0, m), False)], (Span(0, q_start, n),),
                               (Span(0, k_start, m),), w)  # fmt: skip
        for blk in blocks:
            qq, kk, vv, dd = q[:, blk.q_rows], k[:, blk.k_rows], v[:, blk.k_rows], dout[:, blk.q_rows]
            one_block(f"{tag}/offset_band/q{q_start}k{k_start}/w{w}/{blk.band}", dtype, qq, kk, vv, dd, blk.causal,
                      blk.band)  # fmt: skip
    q, dout = rand(1, 200, 8, 128, dtype=dtype, seed=5), rand(1, 200, 8, 128, dtype=dtype, seed=6)
    k, v = rand(1, 300, 2, 128, dtype=dtype, seed=7), rand(1, 300, 2, 128, dtype=dtype, seed=8)
    one_block(f"{tag}/full_noncausal/200x300", dtype, q, k, v, dout, False, None)
    one_block(f"{tag}/full_causal/200", dtype, q, k[:, :200], v[:, :200], dout, True, None)
    one_block(f"{tag}/softcap30_window64/200", dtype, q * 4, k[:, :200], v[:, :200], dout, True, (0, 63), 30.0)


def check_ring(dtype) -> None:
    tag = str(dtype).removeprefix("torch.")
    for world, s, w, d in ((4, 2 * 4 * 200, 100, 64), (8, 8192, 512, 256)):
        scale = d**-0.5
        q, dout = rand(1, s, 4, d, dtype=dtype, seed=world), rand(1, s, 4, d, dtype=dtype, seed=world + 1)
        k, v = rand(1, s, 1, d, dtype=dtype, seed=world + 2), rand(1, s, 1, d, dtype=dtype, seed=world + 3)
        shard = lambda x, world=world: [zigzag_shard(x, r, world) for r in range(world)]  # noqa: E731
        outs, lses = virtual_forward(shard(q), shard(k), shard(v), FLEX, scale, True, window=w)
        grads = virtual_backward(shard(dout), shard(q), shard(k), shard(v), outs, lses, FLEX, scale, True, window=w)
        qf, kf, vf, df = (x.float() for x in (q, k, v, dout))
        r_out, r_lse = MATH.forward(qf, kf, vf, True, scale, (0, w - 1))
        r_grads = MATH.backward(df, qf, kf, vf, r_out, r_lse, True, scale, (0, w - 1))
        got = (zigzag_unshard(outs), zigzag_unshard(lses, dim=2), *(zigzag_unshard(g) for g in grads))
        compare(f"{tag}/zigzag_ring/W{world}/s{s}/w{w}/d{d}", dtype, got, (r_out, r_lse, *r_grads))


def check_auto() -> None:
    real = kernels.fa4_unavailable_reason
    try:
        kernels.fa4_unavailable_reason = lambda *a: "flash-attn-4 hidden by this check"
        kernels._PROBED.clear()
        for dtype in (torch.bfloat16, torch.float32):
            band = get_kernel("auto", DEV, dtype, 256, ("band",)).name
            full = get_kernel("auto", DEV, dtype, 256).name
            record(f"auto_without_fa4/{str(dtype)[6:]}", band == "flex" and full == "cudnn", band=band, full=full)
    finally:
        kernels.fa4_unavailable_reason = real
        kernels._PROBED.clear()


def check_recompiles() -> None:
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    q, k, v = (rand(1, 640, h, 64, dtype=torch.bfloat16, seed=h) for h in (4, 1, 1))
    for lo in range(-200, 200, 20):
        FLEX.forward(q, k, v, False, 0.125, (lo, lo + 100))
    torch.cuda.synchronize()
    graphs = counters["stats"]["unique_graphs"] - before
    record("no_recompile_per_band/20_bands", graphs <= 1, required=False, new_graphs=graphs)


def time_window(seq: int) -> None:
    d, scale, band = 256, 256**-0.5, (0, 511)
    q, dout = rand(1, seq, 4, d, dtype=torch.bfloat16, seed=1), rand(1, seq, 4, d, dtype=torch.bfloat16, seed=2)
    k, v = rand(1, seq, 1, d, dtype=torch.bfloat16, seed=3), rand(1, seq, 1, d, dtype=torch.bfloat16, seed=4)
    for name in ("flex", "fa4"):
        if not kernel_works(name, DEV, torch.bfloat16, d):
            record(f"time/{name}/w512/s{seq}", True, required=False, skipped="kernel unavailable")
            continue
        kern = KERNELS[name]

        def step(kern=kern):
            out, lse = kern.forward(q, k, v, True, scale, band)
            kern.backward(dout, q, k, v, out, lse, True, scale, band)

        step()  # compile
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        record(f"time/{name}/w512/s{seq}/h4-1/d256", True, required=False, fwd_bwd_ms=1e3 * sorted(times)[2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=131072, help="length of the timing row (0: none)")
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("check_flex.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        works = kernel_works("flex", DEV, dtype, 256)
        key = ("flex", kernels._device_key(torch.device(DEV)), dtype, 256)
        record(f"probe/{str(dtype)[6:]}/d256", works, error=kernels._PROBE_ERRORS.get(key, ""))
    groups = {"blocks/bf16": lambda: check_blocks(torch.bfloat16), "blocks/fp32": lambda: check_blocks(torch.float32),
              "ring/bf16": lambda: check_ring(torch.bfloat16), "ring/fp32": lambda: check_ring(torch.float32),
              "auto": check_auto, "recompiles": check_recompiles,
              "timing": lambda: time_window(args.seq) if args.seq else None}  # fmt: skip
    return REPORT.run(groups, args.json)


if __name__ == "__main__":
    sys.exit(main())
