"""FlashAttention-4 (``kernel="fa4"``) on one GPU: parity, schedules, speed and compile cost, in one run.

    python bench/fa4_check.py                       # everything, ~5 minutes on one H200; JSON to $OUT/fa4_check.json
    python bench/fa4_check.py --sections parity e2e --json /tmp/fa4.json
    python bench/fa4_check.py --large               # also one call past 2^31 elements (614,400 tokens, ~1-2 min more)

Sections (each runs on its own: a failure prints its traceback and the next one runs):

* ``env``: device, versions, what ``kernel="auto"`` picks, the first probe's seconds.
* ``parity``: our fa4 kernel's forward out / LSE and backward dq / dk / dv in bf16 (one case fp16) against the
  ``math`` kernel in fp32 on the same (upcast) inputs, for the block shapes the SP backends call: causal squares,
  full squares and rectangles (ring off-diagonal blocks), odd sizes, 1-row blocks (one-token documents), GQA 32q/8kv
  and 8q/2kv, MHA, head_dim 64 / 128 / 256, soft-cap 30 / 50, band blocks (sliding windows; both signs of flash-attn-4's
  window sides), non-contiguous inputs. cuDNN's errors on the plain cases are listed for comparison. Pass: max
  relative error (max |x - ref| / max |ref|) < 1e-2 for out and gradients, LSE max abs error < 1e-3.
* ``e2e``: zigzag_ring_attn and dist_flash_attn on 4 virtual ranks (their block calls and fp32 merges, no
  communication), zigzag with a sliding window, and the public ``get_attn_func("data_parallel", kernel=...)`` with
  soft-cap + window + sinks through autograd: fa4 and cudnn against an fp32 math reference.
* ``mla``: V head dim != Q/K head dim (MLA after projection, 192 / 128, 16 heads, S 4096): the public API through
  autograd with fa4, cudnn and auto, and zigzag / DistFlashAttn on 4 virtual ranks with the padded tensors each
  rank's kernel sees, against fp32 attention on the unpadded shapes (the padded output and dV columns must be 0).
* ``timing``: fwd and fwd+bwd TFLOP/s (fwd+bwd counted as 3.5x the forward FLOPs, causal as half) of ours-through-fa4,
  our cudnn kernel and the raw ``flash_attn_func`` (autograd backward): causal 16K h32, causal 64K 32q/8kv, full
  8Kx8K 32q/8kv, head_dim 128, batch 1, bf16; CUDA events, 2 warmups, median of 5.
* ``compile``: the first-call seconds of every fa4 configuration this run compiled (``fa4.COMPILE_SECONDS``), and
  flash-attn-4's on-disk cache across processes (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``): two fresh processes
  run the same configuration, the second loads what the first compiled.
* ``large`` (only with ``--large``): causal 614,400 x 32 x 128 (2.5e9 elements per tensor) in one fa4 call against
  the same attention split over heads (what easy_context does past 2^31 elements by default).

Needs only torch, easy_context and flash-attn-4 (found in /tmp/site when that exists).
"""

from __future__ import annotations

import os
import site
import sys

if os.path.isdir("/tmp/site"):
    site.addsitedir("/tmp/site")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import easy_context as ec  # noqa: E402
from easy_context.kernels import KERNELS, get_kernel, kernel_works  # noqa: E402
from easy_context.kernels import fa4 as fa4mod  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import timed  # noqa: E402  (bench/attention.py: median seconds with CUDA events)

SECTIONS = ("env", "parity", "e2e", "mla", "timing", "compile", "large")
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


# --- env ---------------------------------------------------------------------------------------------------------
def section_env(res: dict, args) -> None:
    from importlib.metadata import PackageNotFoundError, version

    env = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "cuda": torch.version.cuda}  # fmt: skip
    for pkg in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi", "flash-attn"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    env["fa4_import_error"] = fa4mod.fa4_import_error()
    env["fa4_unavailable_reason"] = fa4mod.unavailable_reason(torch.device("cuda"), torch.bfloat16, 128)
    t = time.perf_counter()
    env["fa4_works_bf16_d128"] = kernel_works("fa4", "cuda", torch.bfloat16, 128)
    env["first_probe_seconds"] = round(time.perf_counter() - t, 2)
    env["fa4_works_fp32_d128"] = kernel_works("fa4", "cuda", torch.float32, 128)
    env["auto_bf16_d128"] = get_kernel("auto", "cuda", torch.bfloat16, 128).name
    env["auto_bf16_d128_softcap_band"] = get_kernel("auto", "cuda", torch.bfloat16, 128, ("softcap", "band")).name
    env["auto_fp32_d128"] = get_kernel("auto", "cuda", torch.float32, 128).name
    res["env"] = env
    for k, v in env.items():
        log(f"env {k}: {v}")


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


def _inputs(sq, sk, hq, hkv, d, dtype, seed, noncontig, q_scale=1.0):
    q, dout = rand((1, sq, hq, d), seed, dtype, q_scale), rand((1, sq, hq, d), seed + 1, dtype)
    k, v = rand((1, sk, hkv, d), seed + 2, dtype), rand((1, sk, hkv, d), seed + 3, dtype)
    if noncontig:  # heads sliced out of a wider tensor; K/V as transposed (b, h, s, d) storage
        q = torch.cat([q, q], dim=2)[:, :, :hq]
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        assert not q.is_contiguous() and not k.is_contiguous()
    return q, k, v, dout


def _errors(kern, q, k, v, dout, causal, scale, band, ref):
    out, lse = kern.forward(q, k, v, causal, scale, band)
    grads = kern.backward(dout, q, k, v, out, lse, causal, scale, band)
    r_out, r_lse, r_grads = ref
    errs = {"out": rel(out, r_out), "lse_abs": (lse - r_lse).abs().max().item()}
    errs.update({n: rel(g, rg) for n, g, rg in zip(("dq", "dk", "dv"), grads, r_grads)})
    finite = all(bool(torch.isfinite(x).all()) for x in (out, lse, *grads))
    shapes = out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and grads[1].shape == k.shape
    return errs, finite and shapes


def section_parity(res: dict, args) -> None:
    rows = res.setdefault("parity", [])
    math_k, fa4_k = KERNELS["math"], KERNELS["fa4"]
    for i, (name, sq, sk, hq, hkv, d, causal, cap, band, dtype, nc) in enumerate(PARITY):
        row = {"case": name, "sq": sq, "sk": sk, "hq": hq, "hkv": hkv, "d": d, "causal": causal, "softcap": cap,
               "band": band, "dtype": str(dtype)[6:]}  # fmt: skip
        try:
            # soft-capped cases: scores of std 4 (q scaled), so the cap bends the tail
            q, k, v, dout = _inputs(sq, sk, hq, hkv, d, dtype, 100 * i, nc, 4.0 if cap else 1.0)
            scale = d**-0.5
            m = math_k.with_softcap(cap)
            f32 = [x.float() for x in (q, k, v, dout)]
            r_out, r_lse = m.forward(*f32[:3], causal, scale, band)
            ref = (r_out, r_lse, m.backward(f32[3], *f32[:3], r_out, r_lse, causal, scale, band))
            t = time.perf_counter()
            errs, sane = _errors(fa4_k.with_softcap(cap), q, k, v, dout, causal, scale, band, ref)
            row["fa4_seconds_incl_first_call"] = round(time.perf_counter() - t, 2)
            row["fa4"] = {n: float(f"{e:.3g}") for n, e in errs.items()}
            row["lse_tol"] = lse_tol(cap)
            row["pass"] = (
                sane
                and errs["lse_abs"] < row["lse_tol"]
                and all(e < TOL_REL for n, e in errs.items() if n != "lse_abs")
            )
            if cap is None and band is None and kernel_works("cudnn", DEVICE, dtype, d):
                try:
                    c_errs, _ = _errors(KERNELS["cudnn"], q, k, v, dout, causal, scale, None, ref)
                    row["cudnn"] = {n: float(f"{e:.3g}") for n, e in c_errs.items()}
                except Exception as exc:  # cuDNN refusing a shape is not fa4's failure
                    row["cudnn"] = f"{type(exc).__name__}: {exc}"[:200]
            del q, k, v, dout, f32, ref, r_out, r_lse
        except Exception as exc:
            row["pass"] = False
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            traceback.print_exc()
        rows.append(row)
        f = row.get("fa4", {})
        log(
            f"parity {'PASS' if row['pass'] else 'FAIL'} {name:48s} "
            + " ".join(f"{n} {e:.2e}" for n, e in f.items())
            + (f" | cudnn {row['cudnn']}" if "cudnn" in row else "")
            + (f" | {row['error']}" if "error" in row else "")
        )
        torch.cuda.empty_cache()


# --- e2e ---------------------------------------------------------------------------------------------------------
def _schedule(sim, shard, kern, q, k, v, dout, world, causal=True):
    sh = lambda x: [shard(x, r, world) for r in range(world)]  # noqa: E731
    outs, lses = sim.virtual_forward(sh(q), sh(k), sh(v), kern, q.shape[-1] ** -0.5, causal)
    grads = sim.virtual_backward(sh(dout), sh(q), sh(k), sh(v), outs, lses, kern, q.shape[-1] ** -0.5, causal)
    return [torch.cat(x, 1) for x in (outs, *grads)], sh


def _windowed_zigzag(kern, q, k, v, dout, world, window):
    """Zigzag on virtual ranks with a sliding window: the backends' step blocks (full, causal, band) and merges."""
    from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
    from easy_context.zigzag_ring_attn import zigzag_shard
    from easy_context.zigzag_ring_attn.attention import step_blocks

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


def _record(rows: list, section: str, name: str, fn) -> None:
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


def section_e2e(res: dict, args) -> None:
    from easy_context.dist_flash_attn import simulate as dist_sim
    from easy_context.ulysses_attn import contiguous_shard
    from easy_context.zigzag_ring_attn import simulate as zz_sim
    from easy_context.zigzag_ring_attn import zigzag_shard

    rows = res.setdefault("e2e", [])
    record = lambda name, fn: _record(rows, "e2e", name, fn)  # noqa: E731
    world, s, hq, hkv, d, window = (E2E[n] for n in ("world", "seq", "hq", "hkv", "d", "window"))
    q, k, v, dout = _inputs(s, s, hq, hkv, d, BF16, 7, False)
    f32 = [x.float() for x in (q, k, v, dout)]
    m = KERNELS["math"]
    r_out, r_lse = m.forward(*f32[:3], True, d**-0.5)
    ref = [r_out, *m.backward(f32[3], *f32[:3], r_out, r_lse, True, d**-0.5)]
    names = GRADS

    for sched, sim, shard in (
        ("zigzag_ring_attn", zz_sim, zigzag_shard),
        ("dist_flash_attn", dist_sim, contiguous_shard),
    ):
        for kname in ("fa4", "cudnn"):

            def run(sim=sim, shard=shard, kname=kname):
                got, sh = _schedule(sim, shard, KERNELS[kname], q, k, v, dout, world)
                return {n: rel(g, torch.cat(sh(r), 1)) for n, g, r in zip(names, got, ref)}

            record(f"{sched} W{world} S{s} {hq}q/{hkv}kv causal, kernel {kname}", run)

    r_out_w, r_lse_w = m.forward(*f32[:3], True, d**-0.5, (0, window - 1))
    ref_w = [r_out_w, *m.backward(f32[3], *f32[:3], r_out_w, r_lse_w, True, d**-0.5, (0, window - 1))]

    def run_window():
        got, n_band = _windowed_zigzag(KERNELS["fa4"], q, k, v, dout, world, window)
        sh = lambda x: torch.cat([zigzag_shard(x, r, world) for r in range(world)], 1)  # noqa: E731
        return {"band_blocks": n_band, **{n: rel(g, sh(r)) for n, g, r in zip(names, got, ref_w)}}

    record(f"zigzag W{world} S{s} window {window}, kernel fa4 (band blocks)", run_window)

    # the public API, through autograd: soft-cap + sliding window + sinks on the whole sequence (data parallel)
    sinks = torch.randn(hq, device=DEVICE) * 0.5

    def api(kernel, dtype):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        sk = sinks.detach().to(dtype).requires_grad_()
        attn = ec.get_attn_func("data_parallel", kernel=kernel)
        out = attn(*leaves, softcap=30.0, sliding_window=window, sinks=sk)
        out.backward(dout.to(dtype))
        return [out.detach(), *(x.grad for x in leaves), sk.grad]

    def run_api():
        got, want = api("fa4", BF16), api("math", torch.float32)
        return {n: rel(g, w) for n, g, w in zip((*names, "dsinks"), got, want)}

    record(f"get_attn_func('data_parallel', kernel='fa4') S{s} softcap 30 + window {window} + sinks", run_api)

    def run_side_stream():
        """fa4 launched inside torch.cuda.stream(side) must run on that stream (ring schedules overlap streams):
        its input is produced there after a long matmul chain, so a kernel on another stream would read garbage."""
        kern = KERNELS["fa4"]
        want, _ = kern.forward(q, k, v, True, d**-0.5)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            busy = torch.randn(8192, 8192, device=DEVICE) / 8192**0.5
            for _ in range(30):
                busy = busy @ busy
            qq = q + (torch.nan_to_num(busy[0, 0], 0.0, 0.0, 0.0) * 0).to(q.dtype)
            got, _ = kern.forward(qq, k, v, True, d**-0.5)
            got = got.clone()
        torch.cuda.synchronize()
        return {"out": rel(got, want)}

    record("fa4 inside torch.cuda.stream(side): runs on that stream", run_side_stream)

    def run_api_auto():
        kern = get_kernel("auto", DEVICE, BF16, d, ("softcap", "band"))
        return {"auto_kernel": kern.name, "pass": kern.name == "fa4"}

    record("kernel='auto' with softcap + window resolves to", run_api_auto)


# --- mla -------------------------------------------------------------------------------------------------------
MLA = {"world": 4, "seq": 4096, "heads": 16, "d_qk": 192, "d_v": 128}  # DeepSeek-V3 / Kimi-K2 after projection
MLA_KERNELS = {"api": ("fa4", "cudnn", "auto"), "schedules": ("fa4", "cudnn")}


def _attention_fp32(q, k, v, dout, causal):
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


def section_mla(res: dict, args) -> None:
    """V head dim != Q/K head dim (MLA, 192 / 128): the public API through autograd with fa4, cudnn and auto (the
    backends pad V to 192 once, ``equal_head_dims``), and the zigzag / DistFlashAttn schedules on virtual ranks with
    the padded tensors each rank's kernel sees, against fp32 attention with the unpadded shapes."""
    import torch.nn.functional as F

    from easy_context.core.seq_algo import equal_head_dims
    from easy_context.dist_flash_attn import simulate as dist_sim
    from easy_context.ulysses_attn import contiguous_shard
    from easy_context.zigzag_ring_attn import simulate as zz_sim
    from easy_context.zigzag_ring_attn import zigzag_shard

    rows = res.setdefault("mla", [])
    world, s, h, d_qk, d_v = (MLA[n] for n in ("world", "seq", "heads", "d_qk", "d_v"))
    q, k = rand((1, s, h, d_qk), 11, BF16), rand((1, s, h, d_qk), 12, BF16)
    v, dout = rand((1, s, h, d_v), 13, BF16), rand((1, s, h, d_v), 14, BF16)
    ref = _attention_fp32(q, k, v, dout, True)

    for kernel in MLA_KERNELS["api"]:

        def run_api(kernel=kernel):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            out = ec.get_attn_func("data_parallel", kernel=kernel)(*leaves, causal=True)
            out.backward(dout)
            got = [out.detach(), *(x.grad for x in leaves)]
            shapes_ok = out.shape == v.shape and all(g.shape == x.shape for g, x in zip(got[1:], leaves))
            auto = get_kernel(kernel, DEVICE, BF16, d_qk).name
            errs = {n: rel(g, r) for n, g, r in zip(GRADS, got, ref)}
            return {**errs, "kernel": auto, "pass": shapes_ok and all(e < TOL_REL for e in errs.values())}

        _record(rows, "mla", f"get_attn_func('data_parallel', kernel='{kernel}') S{s} h{h} qk{d_qk}/v{d_v}", run_api)

    qp, kp, vp = equal_head_dims(q, k, v)
    doutp = F.pad(dout, (0, d_qk - d_v))
    for sched, sim, shard in (("zigzag_ring_attn", zz_sim, zigzag_shard), ("dist_flash_attn", dist_sim,
                                                                          contiguous_shard)):  # fmt: skip
        for kname in MLA_KERNELS["schedules"]:

            def run_sched(sim=sim, shard=shard, kname=kname):
                (out, dq, dk, dvp), sh = _schedule(sim, shard, KERNELS[kname], qp, kp, vp, doutp, world)
                got = [out[..., :d_v], dq, dk, dvp[..., :d_v]]
                pads = max(out[..., d_v:].abs().max().item(), dvp[..., d_v:].abs().max().item())
                errs = {n: rel(g, torch.cat(sh(r), 1)) for n, g, r in zip(GRADS, got, ref)}
                return {**errs, "pad_max_abs": pads, "pass": pads == 0 and all(e < TOL_REL for e in errs.values())}

            _record(rows, "mla", f"{sched} W{world} S{s} h{h} qk{d_qk}/v{d_v} (V padded), kernel {kname}", run_sched)


# --- timing ------------------------------------------------------------------------------------------------------
TIMING = [("causal 16K h32", 16384, 16384, 32, 32, True), ("causal 64K 32q/8kv", 65536, 65536, 32, 8, True),
          ("full 8Kx8K 32q/8kv", 8192, 8192, 32, 8, False)]  # fmt: skip


def _time_shape(name, sq, sk, hq, hkv, causal, d=128) -> dict:
    from flash_attn.cute import flash_attn_func

    q, k, v, dout = _inputs(sq, sk, hq, hkv, d, BF16, 11, False)
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


def section_timing(res: dict, args) -> None:
    rows = res.setdefault("timing", [])
    for case in TIMING:
        rows.append(_time_shape(*case))
        torch.cuda.empty_cache()


# --- compile -----------------------------------------------------------------------------------------------------
CHILD = r"""
import json, os, site, sys, time
if os.path.isdir("/tmp/site"):
    site.addsitedir("/tmp/site")
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import torch
from easy_context.kernels import fa4
from flash_attn.cute import interface  # noqa: F401
t_import = time.perf_counter() - t0
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 2048, 16, 128, device="cuda", generator=g).bfloat16()
k = torch.randn(1, 2048, 4, 128, device="cuda", generator=g).bfloat16()
t = time.perf_counter()
out, lse = fa4.FA4.with_softcap(41.0).forward(q, k, k, True, 128 ** -0.5)
fa4.FA4.with_softcap(41.0).backward(torch.ones_like(out), q, k, k, out, lse, True, 128 ** -0.5)
torch.cuda.synchronize()
print(json.dumps({"import_s": round(t_import, 2), "first_fwd_bwd_s": round(time.perf_counter() - t, 2),
                  "per_config": {str(key): round(s, 2) for key, s in fa4.COMPILE_SECONDS.items()}}))
"""


def section_compile(res: dict, args) -> None:
    res["compile_seconds"] = [
        {"config": list(k), "first_call_s": round(s, 2)} for k, s in fa4mod.COMPILE_SECONDS.items()
    ]
    for r in res["compile_seconds"]:
        log(f"compile {r['first_call_s']:7.2f}s  {fa4mod._describe(tuple(r['config']))}")
    if time.monotonic() - T0 > args.budget - 90:
        res["disk_cache"] = "skipped: not enough of the time budget left"
        log("compile: disk-cache check skipped (time budget)")
        return
    cache_dir = tempfile.mkdtemp(prefix="fa4_cache_")
    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": cache_dir}
    runs = []
    for i in range(2):
        p = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], env=env, capture_output=True, text=True,
                           timeout=240)  # fmt: skip
        line = (p.stdout.strip().splitlines() or [""])[-1]
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            runs.append({"rc": p.returncode, "stderr_tail": p.stderr[-1500:]})
        log(f"compile: fresh process {i + 1} with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1: {runs[-1]}")
    files = sorted(str(p.relative_to(cache_dir)) for p in Path(cache_dir).rglob("*.o"))
    res["disk_cache"] = {"cache_dir": cache_dir, "runs": runs, "object_files": len(files)}


# --- large -------------------------------------------------------------------------------------------------------
def section_large(res: dict, args) -> None:
    import easy_context.kernels.base as base

    s, h, d = 614_400, 32, 128
    q, k, v, dout = (rand((1, s, h, d), 20 + i, BF16) for i in range(4))
    kern = KERNELS["fa4"]
    row = {"case": f"causal {s} x {h} x {d}", "elements": q.numel()}
    results = {}
    saved = base.MAX_KERNEL_ELEMENTS
    try:
        for how, limit in (("one call", 2**62), ("split over heads", saved)):
            base.MAX_KERNEL_ELEMENTS = limit
            t = time.perf_counter()
            out, lse = kern.forward(q, k, v, True, d**-0.5)
            grads = kern.backward(dout, q, k, v, out, lse, True, d**-0.5)
            torch.cuda.synchronize()
            row[f"{how}_s"] = round(time.perf_counter() - t, 1)
            results[how] = [out, lse, *grads]  # on the GPU (~25 GB each)
            del out, lse, grads
    finally:
        base.MAX_KERNEL_ELEMENTS = saved
    a, b = results["one call"], results["split over heads"]
    row.update({n: rel(x, y) for n, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b)})
    row["pass"] = all(row[n] < 1e-3 for n in ("out", "lse", "dq", "dk", "dv"))
    res["large"] = row
    log(f"large {row}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", nargs="*", default=["env", "parity", "e2e", "mla", "timing", "compile"],
                    choices=SECTIONS)  # fmt: skip
    ap.add_argument("--large", action="store_true", help="also run the 'large' section (past 2^31 elements)")
    ap.add_argument("--json", default=None, help="output path (default: $OUT/fa4_check.json, else ./fa4_check.json)")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds; sections past it are skipped")
    args = ap.parse_args()
    sections = list(args.sections) + (["large"] if args.large and "large" not in args.sections else [])
    out_path = Path(args.json or Path(os.environ.get("OUT", ".")) / "fa4_check.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "sections": sections,
                 "errors": {}, "skipped": []}  # fmt: skip
    if not torch.cuda.is_available():
        print("fa4_check: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference really in fp32
    for name in sections:
        if time.monotonic() - T0 > args.budget and name != "compile":
            res["skipped"].append(name)
            log(f"{name}: skipped (time budget {args.budget:.0f}s spent)")
            continue
        log(f"=== {name}")
        try:
            globals()[f"section_{name}"](res, args)
        except Exception as exc:
            res["errors"][name] = f"{type(exc).__name__}: {exc}"[:1000]
            traceback.print_exc()
        out_path.write_text(json.dumps(res, indent=1, default=str))  # after every section: a timeout keeps the rest
    checks = [row for name in ("parity", "e2e", "mla") for row in res.get(name, [])]
    checks += [res["large"]] if "large" in res else []
    res["ok"] = bool(checks) and all(r.get("pass") for r in checks) and not res["errors"]
    res["wall_s"] = round(time.monotonic() - T0, 1)
    out_path.write_text(json.dumps(res, indent=1, default=str))
    print_table(res)
    log(f"wrote {out_path}; ok={res['ok']}")
    sys.exit(0 if res["ok"] else 1)


def print_table(res: dict) -> None:
    print("\n## parity vs fp32 math (max rel err; LSE max abs err)")
    print(f"| case | out | lse | dq | dk | dv | pass | cuDNN out/dq/dk/dv |\n|{'---|' * 8}")
    for r in res.get("parity", []):
        f = r.get("fa4", {})
        c = r.get("cudnn")
        cs = "/".join(f"{c[n]:.1e}" for n in ("out", "dq", "dk", "dv")) if isinstance(c, dict) else (c or "")
        vals = " | ".join(f"{f[n]:.1e}" if n in f else "-" for n in ("out", "lse_abs", "dq", "dk", "dv"))
        print(f"| {r['case']} | {vals} | {'yes' if r['pass'] else 'NO ' + r.get('error', '')} | {cs} |")
    print("\n## schedules / API vs fp32 math (max rel err)")
    for r in res.get("e2e", []) + res.get("mla", []):
        print(f"| {r['case']} | " + " | ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in r.items() if k not in ("case", "pass")) + " |")  # fmt: skip
    print("\n## TFLOP/s, bf16, batch 1, d 128 (fwd / fwd+bwd, fwd+bwd = 3.5x fwd FLOPs)")
    impls = ("fa4 (ours)", "cudnn (ours)", "fa4 raw flash_attn_func")
    print("| shape | " + " | ".join(impls) + " |\n|" + "---|" * (len(impls) + 1))
    for r in res.get("timing", []):
        cells = [f"{r[i]['fwd_tflops']} / {r[i]['fwd_bwd_tflops']}" if isinstance(r.get(i), dict) else str(r.get(i))
                 for i in impls]  # fmt: skip
        print(f"| {r['case']} | " + " | ".join(cells) + " |")
    if res.get("compile_seconds"):
        print("\n## first-call seconds per fa4 configuration (compile + one call)")
        for c in res["compile_seconds"]:
            print(f"| {fa4mod._describe(tuple(c['config']))} | {c['first_call_s']} |")
    if "disk_cache" in res:
        print(f"\n## disk cache across processes: {res['disk_cache']}")
    if "large" in res:
        print(f"\n## past 2^31 elements: {res['large']}")
    if res["errors"] or res["skipped"]:
        print(f"\nsection errors: {res['errors']}; skipped: {res['skipped']}")


if __name__ == "__main__":
    main()
