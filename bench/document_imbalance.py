"""Per-rank attention work under document masking (packed documents), counted from the schedules (no tensors).

Each rank's work is the number of attention scores its sub-blocks compute (a causal block of n rows: n(n+1)/2;
FLOPs are proportional). Ring steps run in lockstep (a rank waits for the next K/V), so a step takes as long as its
busiest rank: ``step efficiency`` = (total work / W) / sum over steps of the busiest rank's work (1.0: balanced).
``imbalance`` = busiest rank's total / mean total - 1. ``time vs one document``: the lockstep time (sum over steps
of the busiest rank's work) relative to the same sequence as one document; ``work vs one document``: the total
work relative to it (what a perfect balance would reach).

    .venv/bin/python bench/document_imbalance.py --seq-length 131072 --world 8 --seeds 20
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from easy_context.dist_flash_attn.schedule import build_schedule, task_document_blocks
from easy_context.documents import Documents, block_cost, split_blocks
from easy_context.zigzag_ring_attn import zigzag_blocks, zigzag_spans


def length_mix(total: int, rng: random.Random, long_share: float, short_median: int, long_range) -> list[int]:
    """Document lengths filling ``total`` tokens: many short documents (log-normal around ``short_median``, 16 to
    8192 tokens) and, with probability ``long_share`` per document, a long one (uniform in ``long_range``); the
    order is shuffled and the last document cut at the end."""
    lengths: list[int] = []
    while sum(lengths) < total:
        if rng.random() < long_share:
            lengths.append(rng.randint(*long_range))
        else:
            lengths.append(max(16, min(8192, int(rng.lognormvariate(0, 1.0) * short_median))))
    rng.shuffle(lengths)
    lengths[-1] -= sum(lengths) - total
    return [n for n in lengths if n > 0]


def documents_of(lengths: list[int]) -> Documents | None:
    if len(lengths) == 1:
        return None
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    return Documents(sum(lengths), (tuple(starts),))


def zigzag_work(world: int, seq: int, docs: Documents | None) -> tuple[list[list[int]], list[int]]:
    """(work[step][rank], kernel calls per rank) of zigzag ring attention's forward."""
    s = seq // world
    work = [[0] * world for _ in range(world)]
    calls = [0] * world
    for step in range(world):
        for rank in range(world):
            src = (rank - step) % world
            blocks = split_blocks(zigzag_blocks(rank, src, s, True), zigzag_spans(rank, world, s),
                                  zigzag_spans(src, world, s), docs, 1)  # fmt: skip
            work[step][rank] = sum(block_cost(b) for b in blocks)
            calls[rank] += len(blocks)
    return work, calls


def dist_flash_work(world: int, seq: int, docs: Documents | None) -> tuple[list[list[int]], list[int]]:
    """(work[step][rank], kernel calls per rank) of DistFlashAttn's forward (its balanced causal schedule)."""
    s = seq // world
    steps = build_schedule(world, True)
    work = [[0] * world for _ in steps]
    calls = [0] * world
    for t, step in enumerate(steps):
        for task in step:
            blocks = task_document_blocks(task, s, True, docs, 1)
            work[t][task.runner] += sum(block_cost(b) for b in blocks)
            calls[task.runner] += len(blocks)
    return work, calls


def summarize(work: list[list[int]], calls: list[int]) -> dict:
    world = len(work[0])
    totals = [sum(step[r] for step in work) for r in range(world)]
    mean = sum(totals) / world
    busiest_steps = sum(max(step) for step in work)
    return {
        "work": sum(totals),
        "lockstep": busiest_steps,
        "imbalance": max(totals) / mean - 1 if mean else 0.0,
        "step_efficiency": mean / busiest_steps if busiest_steps else 1.0,
        "kernel_calls_max": max(calls),
        "kernel_calls_mean": sum(calls) / world,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-length", type=int, default=131072)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--long-share", type=float, default=0.03, help="chance that a document is long")
    p.add_argument("--short-median", type=int, default=1000, help="median length of the short documents")
    p.add_argument("--long-min", type=int, default=16384)
    p.add_argument("--long-max", type=int, default=65536)
    args = p.parse_args(argv)
    if args.seq_length % (2 * args.world):
        p.error(f"--seq-length must be a multiple of 2 x --world = {2 * args.world}")
    rows: dict[str, list[dict]] = {"zigzag_ring_attn": [], "dist_flash_attn": []}
    docs_per_row = []
    for seed in range(args.seeds):
        rng = random.Random(seed)
        lengths = length_mix(args.seq_length, rng, args.long_share, args.short_median, (args.long_min, args.long_max))
        docs_per_row.append(len(lengths))
        docs = documents_of(lengths)
        rows["zigzag_ring_attn"].append(summarize(*zigzag_work(args.world, args.seq_length, docs)))
        rows["dist_flash_attn"].append(summarize(*dist_flash_work(args.world, args.seq_length, docs)))
    baseline = {
        "zigzag_ring_attn": summarize(*zigzag_work(args.world, args.seq_length, None)),
        "dist_flash_attn": summarize(*dist_flash_work(args.world, args.seq_length, None)),
    }
    print(f"S={args.seq_length} W={args.world} seeds={args.seeds}: documents per row "
          f"{min(docs_per_row)}-{max(docs_per_row)} (median {statistics.median(docs_per_row)})")  # fmt: skip
    for algo, results in rows.items():
        imb = [r["imbalance"] for r in results]
        eff = [r["step_efficiency"] for r in results]
        base = baseline[algo]
        time = statistics.mean(r["lockstep"] / base["lockstep"] for r in results)
        work = statistics.mean(r["work"] / base["work"] for r in results)
        print(
            f"{algo:17s} one document: imbalance {base['imbalance']:.1%}, step efficiency {base['step_efficiency']:.1%}"
            f" | documents: imbalance mean {statistics.mean(imb):.1%} max {max(imb):.1%}, step efficiency mean "
            f"{statistics.mean(eff):.1%} min {min(eff):.1%}, kernel calls/rank max "
            f"{max(r['kernel_calls_max'] for r in results)}; time vs one document {time:.1%} (work {work:.1%})"
        )
    print(json.dumps({"args": vars(args), "baseline": baseline, "documents": rows}))


if __name__ == "__main__":
    main()
