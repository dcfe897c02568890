"""``python -m easy_context.data``: tokenize and pack a text source into a ``save_to_disk`` training set.

    python -m easy_context.data --dataset PaulGrahamEssays --output out/pg_1k --seq-length 1024 --train-tokenizer 8000
    python -m easy_context.data --dataset data.jsonl --output out/d_32k --seq-length 32768 --tokenizer PATH \\
        --long-doc-tokens 32768 --upsample-factor 4 --pack documents

A source larger than ``--max-memory-gb`` allows is streamed (tokenized in batches, shuffled on disk, written shard by
shard) in about that much memory; see docs/data.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from easy_context import cli
from easy_context.data.needles import LOSSES, NeedleMix
from easy_context.data.packing import PACK_MODES
from easy_context.data.prepare import DEFAULT_MAX_MEMORY_GB, pack_stats, prepare_dataset
from easy_context.data.recall import KINDS as RECALL_KINDS
from easy_context.data.recall import RecallMix
from easy_context.data.sources import load_documents
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.models.tokenizer import load_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m easy_context.data", description=__doc__.splitlines()[0])
    p.add_argument(
        "--dataset", required=True, help=".txt/.jsonl file, folder of them, save_to_disk folder, or hub name"
    )
    p.add_argument("--output", required=True, help="folder for the prepared dataset (save_to_disk)")
    p.add_argument("--seq-length", type=int, required=True, help="tokens per training sequence (rows hold N+1)")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", help="tokenizer name or local path (AutoTokenizer)")
    tok.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB_SIZE",
        help="train a byte-level BPE on the source; saved to DIR/tokenizer",
    )
    p.add_argument(
        "--digit-groups",
        type=int,
        default=0,
        metavar="N",
        help="with --train-tokenizer: numbers become tokens of up to N digits (3 as in Llama 3; 0: off)",
    )
    p.add_argument("--long-doc-tokens", type=int, default=None, help="documents with >= T tokens count as long")
    p.add_argument("--upsample-factor", type=int, default=1, help="repeat long documents K times")
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help="pack the source K times, each in another document order (epochs with other row boundaries "
                        "and fresh needle rows)")  # fmt: skip
    p.add_argument(
        "--needle-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="this share of the rows becomes needle-retrieval rows in eval_needle.py's format",
    )
    p.add_argument("--needle-digits", type=int, default=7, help="digits of each needle's number")
    p.add_argument("--needles-per-doc", type=int, default=1, help="needles and questions per retrieval row")
    p.add_argument("--needle-loss", default="answer", choices=list(LOSSES),
                   help="what a retrieval row trains on: its answers only (the rest is context), or all")  # fmt: skip
    p.add_argument("--recall-fraction", type=float, default=0.0, metavar="F",
                   help="this share of the rows becomes key-value recall rows: records and questions of a format of "
                        "their own (not eval_needle.py's) written into the row's own text (docs/data.md)")  # fmt: skip
    p.add_argument("--recall-records", type=int, default=24, metavar="N", help="at most N records per segment")
    p.add_argument("--recall-questions", type=int, default=8, metavar="Q", help="at most Q questions per segment")
    p.add_argument("--recall-loss", default="answer", choices=list(LOSSES),
                   help="what a recall row trains on: its answers only (the rest is context), or all")  # fmt: skip
    p.add_argument("--recall-kinds", default=",".join(RECALL_KINDS), metavar="K,K",
                   help=f"what recall questions ask, comma-separated ('single' and any of the others): "
                        f"{', '.join(RECALL_KINDS)} (docs/data.md)")  # fmt: skip
    p.add_argument("--pack", default="concat", choices=list(PACK_MODES),
                   help="; ".join(f"{k}: {v}" for k, v in PACK_MODES.items()))  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--num-proc", type=int, default=1, help="tokenizer processes")
    p.add_argument("--max-memory-gb", type=float, default=DEFAULT_MAX_MEMORY_GB, metavar="GB",
                   help="memory budget: a source too large for it to be prepared in memory is streamed (batches, an "
                        "on-disk shuffle, shards) within about this much, plus the interpreter (~0.3 GB) and the "
                        "largest document; spill files go to a hidden folder in --output (docs/data.md)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = p.parse_args(argv)
    if args.upsample_factor > 1 and args.long_doc_tokens is None:
        p.error("--upsample-factor needs --long-doc-tokens")
    if args.max_memory_gb < 0.001:
        p.error(f"--max-memory-gb must be at least 0.001 (1 MB), got {args.max_memory_gb}")
    if args.digit_groups and args.train_tokenizer is None:
        p.error("--digit-groups applies to --train-tokenizer (an existing tokenizer keeps its own number splits)")
    try:
        args.needles = NeedleMix(args.needle_fraction, args.needle_digits, args.needles_per_doc, args.needle_loss)
        args.recall = RecallMix(args.recall_fraction, args.recall_records, args.recall_questions, args.recall_loss,
                                tuple(k for k in args.recall_kinds.split(",") if k))  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        if args.train_tokenizer is not None:
            tok_dir = os.path.join(args.output, "tokenizer")
            tokenizer = train_byte_level_bpe(
                load_documents(args.dataset), args.train_tokenizer, tok_dir, digit_group=args.digit_groups
            )
            print(f"trained byte-level BPE (vocab {len(tokenizer)}) -> {tok_dir}")
        else:
            tokenizer = load_tokenizer(args.tokenizer)
        ds = prepare_dataset(
            args.dataset,
            tokenizer,
            args.seq_length,
            output_dir=args.output,
            long_doc_tokens=args.long_doc_tokens,
            upsample_factor=args.upsample_factor,
            repeat=args.repeat,
            seed=args.seed,
            num_proc=args.num_proc,
            show_progress=not args.no_progress,
            needles=args.needles,
            pack=args.pack,
            max_memory_gb=args.max_memory_gb,
            recall=args.recall,
        )
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = pack_stats(ds)
    print(f"documents: {s.documents:,}  tokens: {s.tokens:,} (EOS included)")
    if args.long_doc_tokens is not None:
        print(
            f"long documents (>= {args.long_doc_tokens:,} tokens): {s.long_documents:,}, x{args.upsample_factor} -> "
            f"{s.packed_documents:,} documents, {s.packed_tokens:,} tokens"
        )
    if args.needles.fraction:
        print(f"needle-retrieval rows: {json.loads(ds.info.description).get('needle_rows', 0):,} of {s.rows:,}")
    if args.recall.fraction:
        print(f"recall rows: {json.loads(ds.info.description).get('recall_rows', 0):,} of {s.rows:,}")
    streamed = f", streamed within --max-memory-gb {args.max_memory_gb:g}" if _streamed(ds) else ""
    print(
        f"rows: {s.rows:,} x {args.seq_length + 1:,} tokens{' + position_ids' if args.pack == 'documents' else ''} "
        f"(dropped tail: {s.dropped_tokens:,} tokens) "
        f"-> {args.output}  [{time.perf_counter() - start:.1f} s{streamed}]"
    )
    return 0


def _streamed(ds) -> bool:
    try:
        return bool(json.loads(ds.info.description).get("streamed"))
    except (json.JSONDecodeError, TypeError, AttributeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
