"""Linear cross-entropy implementations on one GPU: agreement with the plain loss, time and peak memory.

    python bench/loss_kernels.py --tokens 16384 --vocab 32000 --hidden 4096 --json loss.json

Every implementation of easy_context.loss.linear_cross_entropy that is importable ("plain", "chunked",
and "liger"/"cce" when liger-kernel / cut-cross-entropy are installed) gets the same bf16 hidden states,
LM-head weight and targets (30 % ignored); loss and gradients are compared with the plain implementation.
With liger-kernel, ``liger_bf16_accum`` is Liger's functional called as its own defaults have it (d_weight summed
over its chunks in bf16; our ``liger`` wrapper asks for fp32 accumulation): what the fp32 accumulation costs.
Each implementation also gets a shard whose targets are all -100 (an SP rank without labels): its loss and
gradients must be exactly 0 (``all_ignored_ok``). The first row records what ``--loss auto`` resolves to here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easy_context.loss import LCE_IMPLS, linear_cross_entropy, resolve_loss_impl  # noqa: E402


def liger_bf16_accum(hidden, weight, targets):
    """Liger's functional with its default accumulation (``accum_dtype=None``: the parameters' dtype)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    return liger_fused_linear_cross_entropy(h, weight, t, reduction="sum"), (t != -100).sum()


def call(impl, h, w, targets):
    if impl == "liger_bf16_accum":
        return liger_bf16_accum(h, w, targets)
    return linear_cross_entropy(h, w, targets, impl=impl)


def all_ignored_ok(impl, hidden, weight) -> bool:
    """An all -100 shard of 3-D (1, 256, H) hidden states: loss, count and both gradients exactly 0."""
    h = hidden[None, :256].detach().requires_grad_()
    w = weight.detach().requires_grad_()
    loss_sum, n = call(impl, h, w, torch.full((1, 256), -100, device=hidden.device))
    (loss_sum / n.clamp(min=1)).backward()
    return bool(loss_sum.item() == 0 and n.item() == 0 and (h.grad == 0).all() and (w.grad == 0).all())


def run(impl, hidden, weight, targets):
    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss_sum, n = call(impl, h, w, targets)
    (loss_sum / n).backward()
    end.record()
    torch.cuda.synchronize()
    return (
        loss_sum.detach().float(),
        h.grad,
        w.grad,
        start.elapsed_time(end) / 1e3,
        torch.cuda.max_memory_allocated() - base,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, device="cuda", generator=g).bfloat16()
    weight = (torch.randn(args.vocab, args.hidden, device="cuda", generator=g) * args.hidden**-0.5).bfloat16()
    targets = torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=g)
    targets[torch.rand(args.tokens, device="cuda", generator=g) < 0.3] = -100
    rows = [{"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), **vars(args),
             "auto": resolve_loss_impl("auto", "cuda")[1]}]  # fmt: skip
    print(rows[0], flush=True)
    ref = None
    for impl in (*LCE_IMPLS, "liger_bf16_accum"):
        try:
            for _ in range(2):  # warm-up (compilation), then the measured run
                res = run(impl, hidden, weight, targets)
        except ImportError as exc:
            print(f"{impl}: not installed ({exc})")
            continue
        loss, dh, dw, t, mem = res
        if ref is None:
            ref = res
        rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()  # noqa: E731
        row = {"name": f"lce/{impl}/N{args.tokens}/V{args.vocab}/H{args.hidden}", "seconds": t,
               "peak_extra_bytes": mem, "loss_rel_err": rel(loss, ref[0]), "dh_rel_err": rel(dh, ref[1]),
               "dw_rel_err": rel(dw, ref[2]), "all_ignored_ok": all_ignored_ok(impl, hidden, weight)}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
