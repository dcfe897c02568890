"""GPU check: tensors past 2**31 elements (>= 600K tokens x 4096 hidden on one GPU) in every long-context op.

ALST hit "illegal memory access" at ~555K tokens in Triton kernels that index with int32. This script runs, at
``--tokens`` (default 614400 = 600K) x hidden 4096 in bf16, forward and backward of:

- RMSNorm (transformers' Llama module), eager and ``torch.compile``d (Triton);
- the gated MLP (4096 -> 11008): plain forward (its (tokens, 11008) tensors have 6.8e9 elements), and the tiled
  MLP forward + backward;
- the chunked linear cross-entropy (vocab 32000) forward + backward;
- cuDNN attention (32 heads x 128) forward + backward through our kernel interface;
- the fp32 LSE merge (the Triton kernel of the ring backends) on (tokens, 32, 128) partial results;

and checks each against the same op on a small slice of rows at the END of the tensor (row-wise ops give the
same rows; attention's last query rows against an fp32 reference over all keys; the loss against the sum of its
two halves). Exit status 0 only when every check passes. Not collected by pytest (CPU CI has no GPU)::

    python tests/gpu/check_large_tensors.py [--tokens 614400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from easy_context.core.lse_merge import merge_eager_, merge_into_  # noqa: E402
from easy_context.kernels import get_kernel  # noqa: E402
from easy_context.loss import chunked_linear_cross_entropy  # noqa: E402
from easy_context.memory import tiled_mlp  # noqa: E402

HIDDEN, INTER, HEADS, HEAD_DIM, VOCAB, TAIL = 4096, 11008, 32, 128, 32000, 256
RESULTS: list[dict] = []


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check(name: str, err: float, tol: float, numel: int, seconds: float, expect_ok: bool | None = True,
          **parts) -> None:  # fmt: skip
    """Record one check. ``expect_ok=None``: informational (a raw kernel call we guard against), not in the exit
    status; a NaN error fails."""
    ok = bool(err <= tol)
    RESULTS.append(dict(name=name, rel_err=err, tol=tol, max_numel=numel, past_2_31=numel > 2**31, ok=ok,
                        required=expect_ok is True, seconds=round(seconds, 2), **parts))  # fmt: skip
    detail = " ".join(f"{k} {v:.1e}" for k, v in parts.items())
    note = "" if expect_ok else "  (informational)"
    print(f"{'PASS' if ok else 'FAIL'} {name}: rel err {err:.2e} (tol {tol:.0e}) {detail}, "
          f"{numel / 2**31:.2f} x 2^31 elements{note}")  # fmt: skip


def norm_check(x: torch.Tensor, compiled: bool) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(HIDDEN).to(x.device, x.dtype)
    fn = torch.compile(norm) if compiled else norm
    t0 = time.time()
    xg = x.detach().requires_grad_()
    y = fn(xg)
    y.backward(torch.ones_like(y))
    sync()
    tail = x[:, -TAIL:].detach().requires_grad_()
    y_ref = norm(tail)
    y_ref.backward(torch.ones_like(y_ref))
    err = max(rel(y[:, -TAIL:], y_ref), rel(xg.grad[:, -TAIL:], tail.grad))
    check(f"rmsnorm{' compiled' if compiled else ''} fwd+bwd", err, 1e-2, x.numel(), time.time() - t0)


def mlp_check(x: torch.Tensor) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = LlamaMLP(LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER)).to(x.device, x.dtype)
    t0 = time.time()
    with torch.no_grad():
        y = mlp(x)  # plain: (tokens, 11008) intermediates
        err = rel(y[:, -TAIL:], mlp(x[:, -TAIL:]))
    sync()
    check("mlp plain fwd", err, 1e-2, x.shape[1] * INTER, time.time() - t0)
    del y
    t0 = time.time()
    xg = x.detach().requires_grad_()
    y = tiled_mlp(mlp, xg, tile_tokens=65536)
    y.backward(torch.ones_like(y))
    sync()
    tail = x[:, -TAIL:].detach().requires_grad_()
    y_ref = mlp(tail)
    y_ref.backward(torch.ones_like(y_ref))
    err = max(rel(y[:, -TAIL:], y_ref), rel(xg.grad[:, -TAIL:], tail.grad))
    check("mlp tiled fwd+bwd", err, 1e-2, x.numel(), time.time() - t0)


def loss_check(x: torch.Tensor) -> None:
    g = torch.Generator(device=x.device).manual_seed(1)
    weight = (torch.randn(VOCAB, HIDDEN, device=x.device, generator=g) * 0.02).to(x.dtype)
    targets = torch.randint(0, VOCAB, x.shape[:2], device=x.device, generator=g)
    t0 = time.time()
    h = x.detach().requires_grad_()
    loss_sum, n = chunked_linear_cross_entropy(h, weight, targets)
    loss_sum.backward()
    sync()
    half = x.shape[1] // 2
    halves = sum(chunked_linear_cross_entropy(x[:, a:b], weight, targets[:, a:b])[0] for a, b in
                 [(0, half), (half, x.shape[1])])  # fmt: skip
    tail = x[:, -TAIL:].detach().requires_grad_()
    chunked_linear_cross_entropy(tail, weight, targets[:, -TAIL:])[0].backward()
    assert int(n) == x.shape[1]
    loss_err, grad_err = rel(loss_sum, halves), rel(h.grad[:, -TAIL:], tail.grad)  # bf16 grads: other GEMM shapes
    check("chunked linear CE fwd+bwd", max(loss_err * 100, grad_err), 1e-2, x.numel(), time.time() - t0,
          loss=loss_err, dh=grad_err)  # fmt: skip


def attention_check(tokens: int, device: torch.device, name: str, raw: bool = False, heads_kv: int = HEADS,
                    expect_ok: bool | None = True) -> None:  # fmt: skip
    """Attention through our kernel interface (``raw``: one kernel call, bypassing the head split). The last
    query rows are checked against an fp32 reference over all keys: out, lse, dq, and dk/dv of the last keys
    (under the causal mask only the last queries reach them), for a few K/V heads and all their query heads."""
    kernel = get_kernel(name, device, torch.bfloat16, HEAD_DIM)
    fwd = kernel.forward_impl if raw else kernel.forward
    bwd = kernel.backward_impl if raw else kernel.backward
    g = torch.Generator(device=device).manual_seed(2)
    randn = lambda h: torch.randn(1, tokens, h, HEAD_DIM, device=device, generator=g, dtype=torch.bfloat16)
    q, k, v, dout = randn(HEADS), randn(heads_kv), randn(heads_kv), randn(HEADS)
    scale, rep = HEAD_DIM**-0.5, HEADS // heads_kv
    t0 = time.time()
    out, lse = fwd(q, k, v, True, scale)
    dq, dk, dv = bwd(dout, q, k, v, out, lse, True, scale)
    sync()
    seconds = time.time() - t0
    errs = {"out": 0.0, "lse": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    for hk in range(0, heads_kv, max(1, heads_kv // 4)):
        kt, vt = (t[0, :, hk].float().requires_grad_() for t in (k, v))
        for h in range(hk * rep, (hk + 1) * rep):
            qt = q[0, -TAIL:, h].float().requires_grad_()
            s = qt @ kt.T * scale
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).tril(tokens - TAIL).logical_not(), float("-inf"))
            ref = torch.softmax(s, -1) @ vt
            ref.backward(dout[0, -TAIL:, h].float())
            errs["out"] = max(errs["out"], rel(out[0, -TAIL:, h], ref))
            errs["lse"] = max(errs["lse"], rel(lse[0, h, -TAIL:], torch.logsumexp(s.detach(), -1)))
            errs["dq"] = max(errs["dq"], rel(dq[0, -TAIL:, h], qt.grad))
        errs["dk"] = max(errs["dk"], rel(dk[0, -TAIL:, hk], kt.grad[-TAIL:]))
        errs["dv"] = max(errs["dv"], rel(dv[0, -TAIL:, hk], vt.grad[-TAIL:]))
    label = f"{kernel.name} attention {HEADS}q/{heads_kv}kv fwd+bwd{' (one raw call)' if raw else ''} at {tokens}"
    check(label, max(errs.values()), 2e-2, q.numel(), seconds, expect_ok=expect_ok, **errs)
    del dq, dk, dv, dout, q, k, v
    if raw or heads_kv != HEADS:
        return

    # LSE merge of two partial results over the full length (what every ring step does)
    acc_out, acc_lse = out.float(), lse.clone()
    other_out = torch.randn(out.shape, device=device, generator=g, dtype=out.dtype)
    other_lse = lse + torch.randn(lse.shape, device=device, generator=g)
    t0 = time.time()
    merge_into_(acc_out, acc_lse, other_out, other_lse)
    sync()
    ref_out, ref_lse = out[:, -TAIL:].float(), lse[:, :, -TAIL:].clone()
    merge_eager_(ref_out, ref_lse, other_out[:, -TAIL:], other_lse[:, :, -TAIL:])
    err = max(rel(acc_out[:, -TAIL:], ref_out), rel(acc_lse[:, :, -TAIL:], ref_lse))
    check("lse merge (fused) fp32", err, 1e-5, acc_out.numel(), time.time() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=614400)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", help="cpu: a small smoke run of the same code")
    p.add_argument("--raw-kernels", action="store_true", help="also single raw kernel calls (cudnn, flash)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("this check needs a CUDA GPU (or --device cpu --tokens 4096 for a smoke run)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, args.tokens, HIDDEN, device=device, generator=g, dtype=torch.bfloat16)
    for step, *extra in ((norm_check, False), (norm_check, True), (mlp_check,), (loss_check,)):
        step(x, *extra)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del x
    if device.type == "cuda":
        torch.cuda.empty_cache()
    name = "cudnn" if device.type == "cuda" else "cpu"
    attention_check(args.tokens, device, name)  # what the library runs: split over heads past 2^31 elements
    attention_check(args.tokens, device, name, heads_kv=8)  # GQA (Llama-3): query heads share K/V heads per call
    if args.raw_kernels and device.type == "cuda":  # the kernels themselves: one call under and past 2^31 elements
        under = (2**31 - 1) // (HEADS * HEAD_DIM) // 1024 * 1024  # must pass: else MAX_KERNEL_ELEMENTS is wrong
        for kname, tokens, expect in (
            ("cudnn", under, True),
            ("cudnn", args.tokens, None),
            ("flash", args.tokens, None),
        ):
            attention_check(tokens, device, kname, raw=True, expect_ok=expect)
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": args.tokens, "device": str(device),
                                               "torch": torch.__version__, "checks": RESULTS}, indent=1))  # fmt: skip
    required = [r for r in RESULTS if r["required"]]
    return 0 if required and all(r["ok"] for r in required) else 1


if __name__ == "__main__":
    sys.exit(main())
