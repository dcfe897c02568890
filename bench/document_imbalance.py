"""Per-rank attention work under document masking (packed documents), counted from the schedules (no tensors), in
the row's order and in the balanced order of ``easy_context.core.document_order.balance_order``.

Each rank's work is the number of attention scores its sub-blocks compute (a causal block of n rows: n(n+1)/2;
FLOPs are proportional). Ring steps run in lockstep (a rank waits for the next K/V), so a step takes as long as its
busiest rank: ``step efficiency`` = (total work / W) / sum over steps of the busiest rank's work (1.0: balanced).
``imbalance`` = busiest rank's total / mean total - 1. ``time vs one document``: the lockstep time (sum over steps
of the busiest rank's work) relative to the same sequence as one document; ``work vs one document``: the total
work relative to it (what a perfect balance would reach). ``balanced``: the same rows with their documents
reordered by ``balance_documents`` (every count from the schedules' blocks, ``document_order.schedule_work``);
``host ms``: the time of ``balance_documents`` on the (1, S) row (document detection, the search, the gather; best
of 3 runs). ``--ceiling`` adds the efficiency no order can beat by more than the grid's rounding: the row's two
longest documents alone (nothing else in the row) at their best placement, offsets on a grid of 1/16 zigzag chunk.

    .venv/bin/python bench/document_imbalance.py --seq-length 131072 --world 8 --seeds 20
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np
import torch

from easy_context.core.document_order import balance_documents, lockstep_model, schedule_work, summarize_work
from easy_context.core.documents import Documents

ALGOS = ("zigzag_ring_attn", "dist_flash_attn")


def length_mix(total: int, rng: random.Random, long_share: float, short_median: int, long_range) -> list[int]:
    """Document lengths filling exactly ``total`` tokens: many short documents (log-normal around ``short_median``,
    16 to 8192 tokens) and, with probability ``long_share`` per document, a long one (uniform in ``long_range``); the
    order is shuffled and the last document cut by the excess. When the last one is shorter than the excess, the row
    is the first ``total`` tokens (the document across the end cut, those after it dropped; before this rule the
    list summed to more than ``total`` and the counts already covered only its first ``total`` tokens)."""
    lengths: list[int] = []
    while sum(lengths) < total:
        if rng.random() < long_share:
            lengths.append(rng.randint(*long_range))
        else:
            lengths.append(max(16, min(8192, int(rng.lognormvariate(0, 1.0) * short_median))))
    rng.shuffle(lengths)
    lengths[-1] -= sum(lengths) - total
    row: list[int] = []
    for n in (n for n in lengths if n > 0):
        row.append(min(n, total - sum(row)))
        if sum(row) == total:
            break
    return row


def documents_of(lengths: list[int]) -> Documents | None:
    if len(lengths) == 1:
        return None
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    return Documents(sum(lengths), (tuple(starts),))


def positions_of(lengths: list[int]) -> torch.Tensor:
    """(1, S) position ids restarting at 0 at each document."""
    return torch.cat([torch.arange(n) for n in lengths])[None]


def zigzag_work(world: int, seq: int, docs: Documents | None) -> tuple[list[list[int]], list[int]]:
    """(work[step][rank], kernel calls per rank) of zigzag ring attention's forward."""
    return schedule_work("zigzag_ring_attn", world, seq, docs)


def dist_flash_work(world: int, seq: int, docs: Documents | None) -> tuple[list[list[int]], list[int]]:
    """(work[step][rank], kernel calls per rank) of DistFlashAttn's forward (its balanced causal schedule)."""
    return schedule_work("dist_flash_attn", world, seq, docs)


summarize = summarize_work


def two_longest_ceiling(algo: str, world: int, lengths: list[int]) -> float:
    """Step efficiency no order of ``lengths`` beats (up to the grid): total work / W over the least lockstep cost of
    the two longest documents alone (the rest of the row empty: their cost is a lower bound on any order's, which
    also holds them), over both orders and offsets on a grid of 1/16 of a zigzag chunk."""
    seq = sum(lengths)
    model = lockstep_model(algo, world, seq)
    total = sum(n * (n + 1) // 2 for n in lengths)
    big = sorted(lengths)[-2:] if len(lengths) > 1 else [lengths[0], 0]
    grid = max(1, seq // (32 * world))
    best = float("inf")
    for a, b in ((big[1], big[0]), (big[0], big[1])):
        free = seq - a - b
        offsets = np.arange(0, free + 1, grid)
        first, gap = (x.ravel() for x in np.meshgrid(offsets, offsets, indexing="ij"))
        keep = first + gap <= free
        first, gap = first[keep], gap[keep]
        for lo in range(0, len(first), 4096):
            f, g = first[lo : lo + 4096], gap[lo : lo + 4096]
            feats = model.features(f, np.full_like(f, a)) + model.features(f + a + g, np.full_like(f, b))
            best = min(best, float(model.cost(feats).min()))
    return total / world / best


def host_ms(algo: str, world: int, lengths: list[int], repeats: int = 3) -> tuple[float, list[int]]:
    """(milliseconds of ``balance_documents`` on the (1, S) row, best of ``repeats`` runs: other processes share
    the host; the balanced lengths)."""
    pos = positions_of(lengths)
    ids = torch.arange(pos.shape[1])[None]
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        new_ids, new_pos, _ = balance_documents(ids, pos, ids, algo, world)
        best = min(best, (time.perf_counter() - t) * 1e3)
    starts = (torch.diff(new_pos[0]) != 1).nonzero().flatten().add(1).tolist()
    bounds = [0, *starts, pos.shape[1]]
    return best, [b - a for a, b in zip(bounds, bounds[1:])]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-length", type=int, default=131072)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--long-share", type=float, default=0.03, help="chance that a document is long")
    p.add_argument("--short-median", type=int, default=1000, help="median length of the short documents")
    p.add_argument("--long-min", type=int, default=16384)
    p.add_argument("--long-max", type=int, default=65536)
    p.add_argument("--ceiling", action="store_true", help="also the two-longest-documents ceiling (slower)")
    args = p.parse_args(argv)
    if args.seq_length % (2 * args.world):
        p.error(f"--seq-length must be a multiple of 2 x --world = {2 * args.world}")
    seq, world = args.seq_length, args.world
    rows: dict[str, dict[str, list]] = {a: {"before": [], "after": [], "ms": [], "ceiling": []} for a in ALGOS}
    docs_per_row = []
    for algo in ALGOS:  # build the cached cost models outside the timings
        balance_documents(*(positions_of([seq // 2, seq // 2]),) * 2, None, algo, world)
    for seed in range(args.seeds):
        rng = random.Random(seed)
        lengths = length_mix(seq, rng, args.long_share, args.short_median, (args.long_min, args.long_max))
        docs_per_row.append(len(lengths))
        for algo in ALGOS:
            ms, balanced = host_ms(algo, world, lengths)
            assert sorted(balanced) == sorted(lengths)
            rows[algo]["before"].append(summarize_work(*schedule_work(algo, world, seq, documents_of(lengths))))
            rows[algo]["after"].append(summarize_work(*schedule_work(algo, world, seq, documents_of(balanced))))
            rows[algo]["ms"].append(ms)
    for seed in range(args.seeds if args.ceiling else 0):  # after the timings: its large arrays would disturb them
        rng = random.Random(seed)
        lengths = length_mix(seq, rng, args.long_share, args.short_median, (args.long_min, args.long_max))
        for algo in ALGOS:
            rows[algo]["ceiling"].append(two_longest_ceiling(algo, world, lengths))
    baseline = {algo: summarize_work(*schedule_work(algo, world, seq, None)) for algo in ALGOS}
    print(f"S={seq} W={world} seeds={args.seeds}: documents per row "
          f"{min(docs_per_row)}-{max(docs_per_row)} (median {statistics.median(docs_per_row)})")  # fmt: skip
    for algo in ALGOS:
        base = baseline[algo]
        print(
            f"{algo:17s} one document: imbalance {base['imbalance']:.1%}, step efficiency {base['step_efficiency']:.1%}"
        )
        for when in ("before", "after"):
            results = rows[algo][when]
            imb = [r["imbalance"] for r in results]
            eff = [r["step_efficiency"] for r in results]
            lock = statistics.mean(r["lockstep"] / base["lockstep"] for r in results)
            work = statistics.mean(r["work"] / base["work"] for r in results)
            print(
                f"  {'row order' if when == 'before' else 'balanced':9s} imbalance mean {statistics.mean(imb):.1%} "
                f"max {max(imb):.1%}, step efficiency mean {statistics.mean(eff):.1%} min {min(eff):.1%}, "
                f"kernel calls/rank max {max(r['kernel_calls_max'] for r in results)}; time vs one document "
                f"{lock:.1%} (work {work:.1%})"
            )
        gain = [b["lockstep"] / a["lockstep"] for b, a in zip(rows[algo]["before"], rows[algo]["after"])]
        ms = rows[algo]["ms"]
        line = (f"  lockstep time before / after: mean {statistics.mean(gain):.2f}x, max {max(gain):.2f}x, "
                f"min {min(gain):.2f}x; host ms per row mean {statistics.mean(ms):.1f} max {max(ms):.1f}")  # fmt: skip
        if args.ceiling:
            ceil = rows[algo]["ceiling"]
            line += f"; ceiling (two longest alone) mean {statistics.mean(ceil):.1%} min {min(ceil):.1%}"
        print(line)
    print(json.dumps({"args": vars(args), "baseline": baseline, "documents": rows}))


if __name__ == "__main__":
    main()
