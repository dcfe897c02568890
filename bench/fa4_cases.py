"""What ``bench/fa4_check.py`` runs and checks against: the case tables, the tolerances, the inputs, the
virtual-rank schedules and the fp32 references, and the one-check recorder its sections share."""

from __future__ import annotations

import time
import traceback

import torch
from attention import timed  # bench/attention.py: median seconds with CUDA events

from easy_context.kernels import KERNELS

TOL_REL, TOL_LSE = 1e-2, 1e-3


def lse_tol(softcap: float | None) -> float:
    """LSE max abs error allowed: flash-attn-4 soft-caps with tanh.approx.f32 (relative error ~2^-11), so a capped
    score may be off by ~5e-4 * cap."""
    return TOL_LSE + (5e-4 * softcap if softcap else 0.0)


T0 = time.monotonic()


def log(*a):
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def rel(x, ref) -> float:
    """max |x - ref| / max |ref|; the absolute error where the reference is zero (dq, dk of a one-key block)."""
    top = ref.float().abs().max()
    return ((x.float() - ref.float()).abs().max() / (top if top > 1e-6 else 1.0)).item()


DEVICE = "cuda"


def rand(shape, seed, dtype, scale=1.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, device=DEVICE, generator=g) * scale).to(dtype)


# --- parity ------------------------------------------------------------------------------------------------------
# (name, sq, sk, hq, hkv, d, causal, softcap, band, dtype, noncontig)
BF16, FP16 = torch.bfloat16, torch.float16
PARITY = [
    ("causal 2048 32q/8kv d128", 2048, 2048, 32, 8, 128, True, None, None, BF16, False),
    ("causal 2048 8q/2kv d64", 2048, 2048, 8, 2, 64, True, None, None, BF16, False),
    ("causal 2048 MHA 8/8 d128", 2048, 2048, 8, 8, 128, True, None, None, BF16, False),
    ("full 2048x2048 32q/8kv d128", 2048, 2048, 32, 8, 128, False, None, None, BF16, False),
    ("full 1024x2048 32q/8kv d128", 1024, 2048, 32, 8, 128, False, None, None, BF16, False),
    ("full 1024x2048 8q/2kv d64", 1024, 2048, 8, 2, 64, False, None, None, BF16, False),
    ("full 2048x1024 8q/2kv d128", 2048, 1024, 8, 2, 128, False, None, None, BF16, False),
    ("full 777x1531 8q/2kv d128 (odd sizes)", 777, 1531, 8, 2, 128, False, None, None, BF16, False),
    ("causal 1000 8q/2kv d128 (odd size)", 1000, 1000, 8, 2, 128, True, None, None, BF16, False),
    ("causal 1x1 8q/2kv d128 (one-token doc)", 1, 1, 8, 2, 128, True, None, None, BF16, False),
    ("full 1x37 8q/2kv d128", 1, 37, 8, 2, 128, False, None, None, BF16, False),
    ("causal 2048 32q/8kv d128 non-contiguous", 2048, 2048, 32, 8, 128, True, None, None, BF16, True),
    ("causal 2048 32q/8kv d128 fp16", 2048, 2048, 32, 8, 128, True, None, None, FP16, False),
    ("causal 2048 8q/2kv d128 softcap 30", 2048, 2048, 8, 2, 128, True, 30.0, None, BF16, False),
    ("full 1024x2048 8q/2kv d128 softcap 30", 1024, 2048, 8, 2, 128, False, 30.0, None, BF16, False),
    ("causal 1024 8q/4kv d256 softcap 50 (Gemma 2)", 1024, 1024, 8, 4, 256, True, 50.0, None, BF16, False),
    ("band causal 2048 tile (0, 511) 8q/2kv", 2048, 2048, 8, 2, 128, True, None, (0, 511), BF16, False),
    ("band 1024x2048 (-1500, 300) 8q/2kv", 1024, 2048, 8, 2, 128, False, None, (-1500, 300), BF16, False),
    ("band 1024x2048 (-600, 200): right < 0", 1024, 2048, 8, 2, 128, False, None, (-600, 200), BF16, False),
    ("band 2048x1024 (-100, 1500) 8q/2kv", 2048, 1024, 8, 2, 128, False, None, (-100, 1500), BF16, False),
    ("band 512x512 (-255, 0): keys at or after the query", 512, 512, 8, 2, 128, False, None, (-255, 0), BF16, False),
    ("band 1024x2048 (-600, 200) softcap 30", 1024, 2048, 8, 2, 128, False, 30.0, (-600, 200), BF16, False),
    ("causal 2048 MHA 16/16 d192 (MLA, V padded)", 2048, 2048, 16, 16, 192, True, None, None, BF16, False),
    ("full 1024x2048 MHA 16/16 d192 (MLA ring block)", 1024, 2048, 16, 16, 192, False, None, None, BF16, False),
]


def make_inputs(sq, sk, hq, hkv, d, dtype, seed, noncontig, q_scale=1.0):
    q, dout = rand((1, sq, hq, d), seed, dtype, q_scale), rand((1, sq, hq, d), seed + 1, dtype)
    k, v = rand((1, sk, hkv, d), seed + 2, dtype), rand((1, sk, hkv, d), seed + 3, dtype)
    if noncontig:  # heads sliced out of a wider tensor; K/V as transposed (b, h, s, d) storage
        q = torch.cat([q, q], dim=2)[:, :, :hq]
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        assert not q.is_contiguous() and not k.is_contiguous()
    return q, k, v, dout


def kernel_errors(kern, q, k, v, dout, causal, scale, band, ref):
    out, lse = kern.forward(q, k, v, causal, scale, band)
    grads = kern.backward(dout, q, k, v, out, lse, causal, scale, band)
    r_out, r_lse, r_grads = ref
    errs = {"out": rel(out, r_out), "lse_abs": (lse - r_lse).abs().max().item()}
    errs.update({n: rel(g, rg) for n, g, rg in zip(("dq", "dk", "dv"), grads, r_grads)})
    finite = all(bool(torch.isfinite(x).all()) for x in (out, lse, *grads))
    shapes = out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and grads[1].shape == k.shape
    return errs, finite and shapes


# --- e2e ---------------------------------------------------------------------------------------------------------
def virtual_schedule(sim, shard, kern, q, k, v, dout, world, causal=True):
    sh = lambda x: [shard(x, r, world) for r in range(world)]  # noqa: E731
    outs, lses = sim.virtual_forward(sh(q), sh(k), sh(v), kern, q.shape[-1] ** -0.5, causal)
    grads = sim.virtual_backward(sh(dout), sh(q), sh(k), sh(v), outs, lses, kern, q.shape[-1] ** -0.5, causal)
    return [torch.cat(x, 1) for x in (outs, *grads)], sh


def windowed_zigzag(kern, q, k, v, dout, world, window):
    """Zigzag on virtual ranks with a sliding window: the backends' step blocks (full, causal, band) and merges."""
    from easy_context.backends.zigzag_ring_attn import zigzag_shard
    from easy_context.backends.zigzag_ring_attn.attention import step_blocks
    from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks

    scale = q.shape[-1] ** -0.5
    qs, ks, vs, ds = ([zigzag_shard(x, r, world) for r in range(world)] for x in (q, k, v, dout))
    accs = [ForwardAccumulator(x) for x in qs]
    blocks = {(r, s): step_blocks(r, s, world, qs[r], True, None, window) for r in range(world) for s in range(world)}
    for (r, s), blks in blocks.items():
        forward_blocks(kern, qs[r], ks[s], vs[s], blks, scale, accs[r])
    outs, lses = zip(*(a.result(x.dtype) for a, x in zip(accs, qs)))
    dqs = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in qs]
    dkvs = [torch.zeros((2, *x.shape), dtype=torch.float32, device=x.device) for x in ks]
    for (r, s), blks in blocks.items():
        add_kv_grads_(dkvs[s], backward_blocks(kern, ds[r], qs[r], ks[s], vs[s], outs[r], lses[r], blks, scale, dqs[r]))
    n_band = sum(b.band is not None for blks in blocks.values() for b in blks)
    got = [
        torch.cat(outs, 1),
        torch.cat(dqs, 1),
        torch.cat([x[0] for x in dkvs], 1),
        torch.cat([x[1] for x in dkvs], 1),
    ]
    return got, n_band


E2E = {"world": 4, "seq": 4096, "hq": 32, "hkv": 8, "d": 128, "window": 700}
GRADS = ("out", "dq", "dk", "dv")


def record_check(rows: list, section: str, name: str, fn) -> None:
    """Run one check ``fn() -> {metric: value}``; it passes when every relative error in GRADS (and dsinks) is
    below TOL_REL (or as ``fn`` sets "pass"); an exception fails it with its message."""
    row = {"case": name}
    try:
        row.update(fn())
        row.setdefault("pass", all(e < TOL_REL for n, e in row.items() if n in (*GRADS, "dsinks")))
    except Exception as exc:
        row.update({"pass": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
        traceback.print_exc()
    rows.append(row)
    log(f"{section} {'PASS' if row['pass'] else 'FAIL'} {name:52s} "
        + " ".join(f"{n} {e:.2e}" if isinstance(e, float) else f"{n} {e}" for n, e in row.items()
                   if n not in ("case", "pass")))  # fmt: skip


# --- mla -------------------------------------------------------------------------------------------------------
MLA = {"world": 4, "seq": 4096, "heads": 16, "d_qk": 192, "d_v": 128}  # DeepSeek-V3 / Kimi-K2 after projection
MLA_KERNELS = {"api": ("fa4", "cudnn", "auto"), "schedules": ("fa4", "cudnn")}


def attention_fp32(q, k, v, dout, causal):
    """fp32 attention through autograd, V's head dim free: [out, dq, dk, dv], each (batch, seq, heads, dim)."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    qh, kh, vh = (x.transpose(1, 2) for x in leaves)
    scores = (qh @ kh.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    out = (scores.softmax(-1) @ vh).transpose(1, 2)
    out.backward(dout.float())
    return [out.detach(), *(x.grad for x in leaves)]


# --- timing ------------------------------------------------------------------------------------------------------
TIMING = [("causal 16K h32", 16384, 16384, 32, 32, True), ("causal 64K 32q/8kv", 65536, 65536, 32, 8, True),
          ("full 8Kx8K 32q/8kv", 8192, 8192, 32, 8, False)]  # fmt: skip


def time_case(name, sq, sk, hq, hkv, causal, d=128) -> dict:
    """One TIMING row: fwd and fwd+bwd times and TFLOP/s of our fa4 and cudnn kernels and the raw flash_attn_func."""
    from flash_attn.cute import flash_attn_func

    q, k, v, dout = make_inputs(sq, sk, hq, hkv, d, BF16, 11, False)
    flops = 4 * sq * sk * hq * d * (0.5 if causal else 1.0)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def raw_fwd():
        with torch.no_grad():
            return flash_attn_func(q, k, v, softmax_scale=d**-0.5, causal=causal, return_lse=True)

    def raw_fwd_bwd():
        for x in leaves:
            x.grad = None
        out, _ = flash_attn_func(*leaves, softmax_scale=d**-0.5, causal=causal, return_lse=True)
        out.backward(dout)

    def ours(kern):
        def fwd():
            return kern.forward(q, k, v, causal, d**-0.5)

        def fwd_bwd():
            out, lse = kern.forward(q, k, v, causal, d**-0.5)
            kern.backward(dout, q, k, v, out, lse, causal, d**-0.5)

        return fwd, fwd_bwd

    impls = {"fa4 (ours)": ours(KERNELS["fa4"]), "cudnn (ours)": ours(KERNELS["cudnn"]),
             "fa4 raw flash_attn_func": (raw_fwd, raw_fwd_bwd)}  # fmt: skip
    row = {"case": name, "fwd_flops": flops}
    for impl, (fwd, fwd_bwd) in impls.items():
        try:
            t_f, t_fb = timed(fwd), timed(fwd_bwd)
            row[impl] = {"fwd_ms": round(t_f * 1e3, 2), "fwd_bwd_ms": round(t_fb * 1e3, 2),
                         "fwd_tflops": round(flops / t_f / 1e12, 1),
                         "fwd_bwd_tflops": round(3.5 * flops / t_fb / 1e12, 1)}  # fmt: skip
        except Exception as exc:
            row[impl] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
        log(f"timing {name:22s} {impl:24s} {row[impl]}")
    return row
