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
from fa4_cases import (  # noqa: E402  (bench/fa4_cases.py: the cases, inputs and references)
    BF16,
    DEVICE,
    E2E,
    GRADS,
    MLA,
    MLA_KERNELS,
    PARITY,
    T0,
    TIMING,
    TOL_REL,
    attention_fp32,
    kernel_errors,
    log,
    lse_tol,
    make_inputs,
    rand,
    record_check,
    rel,
    time_case,
    virtual_schedule,
    windowed_zigzag,
)

SECTIONS = ("env", "parity", "e2e", "mla", "timing", "compile", "large")


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
def section_parity(res: dict, args) -> None:
    rows = res.setdefault("parity", [])
    math_k, fa4_k = KERNELS["math"], KERNELS["fa4"]
    for i, (name, sq, sk, hq, hkv, d, causal, cap, band, dtype, nc) in enumerate(PARITY):
        row = {"case": name, "sq": sq, "sk": sk, "hq": hq, "hkv": hkv, "d": d, "causal": causal, "softcap": cap,
               "band": band, "dtype": str(dtype)[6:]}  # fmt: skip
        try:
            # soft-capped cases: scores of std 4 (q scaled), so the cap bends the tail
            q, k, v, dout = make_inputs(sq, sk, hq, hkv, d, dtype, 100 * i, nc, 4.0 if cap else 1.0)
            scale = d**-0.5
            m = math_k.with_softcap(cap)
            f32 = [x.float() for x in (q, k, v, dout)]
            r_out, r_lse = m.forward(*f32[:3], causal, scale, band)
            ref = (r_out, r_lse, m.backward(f32[3], *f32[:3], r_out, r_lse, causal, scale, band))
            t = time.perf_counter()
            errs, sane = kernel_errors(fa4_k.with_softcap(cap), q, k, v, dout, causal, scale, band, ref)
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
                    c_errs, _ = kernel_errors(KERNELS["cudnn"], q, k, v, dout, causal, scale, None, ref)
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


def section_e2e(res: dict, args) -> None:
    from easy_context.backends.dist_flash_attn import simulate as dist_sim
    from easy_context.backends.ulysses_attn import contiguous_shard
    from easy_context.backends.zigzag_ring_attn import simulate as zz_sim
    from easy_context.backends.zigzag_ring_attn import zigzag_shard

    rows = res.setdefault("e2e", [])
    record = lambda name, fn: record_check(rows, "e2e", name, fn)  # noqa: E731
    world, s, hq, hkv, d, window = (E2E[n] for n in ("world", "seq", "hq", "hkv", "d", "window"))
    q, k, v, dout = make_inputs(s, s, hq, hkv, d, BF16, 7, False)
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
                got, sh = virtual_schedule(sim, shard, KERNELS[kname], q, k, v, dout, world)
                return {n: rel(g, torch.cat(sh(r), 1)) for n, g, r in zip(names, got, ref)}

            record(f"{sched} W{world} S{s} {hq}q/{hkv}kv causal, kernel {kname}", run)

    r_out_w, r_lse_w = m.forward(*f32[:3], True, d**-0.5, (0, window - 1))
    ref_w = [r_out_w, *m.backward(f32[3], *f32[:3], r_out_w, r_lse_w, True, d**-0.5, (0, window - 1))]

    def run_window():
        got, n_band = windowed_zigzag(KERNELS["fa4"], q, k, v, dout, world, window)
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


def section_mla(res: dict, args) -> None:
    """V head dim != Q/K head dim (MLA, 192 / 128): the public API through autograd with fa4, cudnn and auto (the
    backends pad V to 192 once, ``equal_head_dims``), and the zigzag / DistFlashAttn schedules on virtual ranks with
    the padded tensors each rank's kernel sees, against fp32 attention with the unpadded shapes."""
    import torch.nn.functional as F

    from easy_context.backends.dist_flash_attn import simulate as dist_sim
    from easy_context.backends.ulysses_attn import contiguous_shard
    from easy_context.backends.zigzag_ring_attn import simulate as zz_sim
    from easy_context.backends.zigzag_ring_attn import zigzag_shard
    from easy_context.core.seq_algo import equal_head_dims

    rows = res.setdefault("mla", [])
    world, s, h, d_qk, d_v = (MLA[n] for n in ("world", "seq", "heads", "d_qk", "d_v"))
    q, k = rand((1, s, h, d_qk), 11, BF16), rand((1, s, h, d_qk), 12, BF16)
    v, dout = rand((1, s, h, d_v), 13, BF16), rand((1, s, h, d_v), 14, BF16)
    ref = attention_fp32(q, k, v, dout, True)

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

        record_check(
            rows, "mla", f"get_attn_func('data_parallel', kernel='{kernel}') S{s} h{h} qk{d_qk}/v{d_v}", run_api
        )

    qp, kp, vp = equal_head_dims(q, k, v)
    doutp = F.pad(dout, (0, d_qk - d_v))
    for sched, sim, shard in (("zigzag_ring_attn", zz_sim, zigzag_shard), ("dist_flash_attn", dist_sim,
                                                                          contiguous_shard)):  # fmt: skip
        for kname in MLA_KERNELS["schedules"]:

            def run_sched(sim=sim, shard=shard, kname=kname):
                (out, dq, dk, dvp), sh = virtual_schedule(sim, shard, KERNELS[kname], qp, kp, vp, doutp, world)
                got = [out[..., :d_v], dq, dk, dvp[..., :d_v]]
                pads = max(out[..., d_v:].abs().max().item(), dvp[..., d_v:].abs().max().item())
                errs = {n: rel(g, torch.cat(sh(r), 1)) for n, g, r in zip(GRADS, got, ref)}
                return {**errs, "pad_max_abs": pads, "pass": pads == 0 and all(e < TOL_REL for e in errs.values())}

            record_check(
                rows, "mla", f"{sched} W{world} S{s} h{h} qk{d_qk}/v{d_v} (V padded), kernel {kname}", run_sched
            )


# --- timing ------------------------------------------------------------------------------------------------------


def section_timing(res: dict, args) -> None:
    rows = res.setdefault("timing", [])
    for case in TIMING:
        rows.append(time_case(*case))
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
