"""Linear cross-entropy implementations on one GPU: agreement with the plain loss, time and peak memory.

    python bench/loss_kernels.py --tokens 16384 --vocab 32000 --hidden 4096 --json loss.json

Every implementation of easy_context.loss.linear_cross_entropy that is importable ("plain", "chunked",
and "liger"/"cce" when liger-kernel / cut-cross-entropy are installed) gets the same bf16 hidden states,
LM-head weight and targets (30 % ignored); loss and gradients are compared with the plain implementation.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easy_context.loss import LCE_IMPLS, linear_cross_entropy  # noqa: E402


def run(impl, hidden, weight, targets):
    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss_sum, n = linear_cross_entropy(h, w, targets, impl=impl)
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
    rows = [{"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), **vars(args)}]
    ref = None
    for impl in LCE_IMPLS:
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
               "dw_rel_err": rel(dw, ref[2])}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
