"""Compute the table of stable RoPE-base bounds that easy_context/extend/rope_base.py holds (STABLE_BOUNDS).

    python bench/rope_base_table.py --out rope_table.json   # seconds an entry on one CPU core (--device cuda: a GPU)

Runs :func:`easy_context.extend.rope_base.min_rope_base` (``stable=True``) for each rotary dim and power-of-two
length; ``--device cuda`` makes torch's default device the GPU (the same code, float64 throughout).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from easy_context.extend.rope_base import min_rope_base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--log2-lengths", default="12-22", help="a range of powers of two, inclusive")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_default_device(args.device)
    lo, hi = map(int, args.log2_lengths.split("-"))
    table: dict[str, float] = {}
    for dim in map(int, args.dims.split(",")):
        for k in range(lo, hi + 1):
            t0 = time.time()
            base = min_rope_base(dim, 1 << k, stable=True)
            table[f"{dim},{1 << k}"] = base
            print(f"{dim:4d} {1 << k:8d} {base:.6g} ({time.time() - t0:.1f} s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
