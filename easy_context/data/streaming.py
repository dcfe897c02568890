"""Bounded-memory preparation: tokenize in batches, shuffle on disk, pack rows incrementally, write arrow shards.

:func:`prepare_streaming` is what :func:`easy_context.data.prepare_dataset` runs for a source too large for the
in-memory path (or when asked). Its memory is bounded by ``budget`` bytes (plus the interpreter and its imports,
and the largest single document, which the source and the tokenizer hold whole anyway); the corpus lives on disk.

How (``B`` = the budget):

1. **Tokenize** batches of at most ``B / 256`` characters (one document at least). Each document instance (the
   document itself, its ``upsample_factor - 1`` extra copies when it is long, and one more of each per
   ``repeat`` copy) draws a 64-bit random key, a bijective hash of ``(seed, instance number)``, and is written with
   its EOS to one of 64 spill files chosen by the key's top 6 bits (:class:`~easy_context.data.shuffle.KeySpill`).
2. **Shuffle** the documents: the spill files are read back one at a time in bit order; each is sorted by key in
   memory (a file over ``B / 8`` is split again by the key's next bits first). The documents come out sorted by
   their random keys: a uniformly random order of all instances, so the upsampled copies of a long document are
   spread over the whole set, as the in-memory permutation spreads them. The order is a function of the seed only
   (not of the budget or the batching).
3. **Pack**: each ``repeat`` copy's documents are concatenated and cut into ``seq_length + 1`` rows as they come,
   its incomplete tail dropped. With ``repeat`` > 1 the rows of all copies get random keys too and go through a
   second spill (rows sorted by key), so the copies' rows are interleaved uniformly as in memory.
4. **Write** record batches of ``B / 4`` bytes of ``input_ids`` (``B / 9`` with position ids, ``B / 18`` with
   needle rows too: :meth:`MemoryBudget.batch_bytes`) into files of up to 500 MB in ``save_to_disk``'s layout
   (``data-00000-of-000NN.arrow`` arrow streams, ``state.json``, ``dataset_info.json``), which
   ``datasets.load_from_disk`` and :func:`easy_context.data.load_train_dataset` read as any saved dataset.
   ``position_ids`` (``pack="documents"``) and needle rows (their filler text from the same batch, their haystack
   from the first ``min(16M, B / 128)`` characters of the source) are made per batch.

Disk: the spill holds every document instance once (2 bytes a token for vocabularies up to 65,536, else 4), the
row spill (``repeat`` > 1) every row once; each spill file is deleted once read. The output holds 4 bytes a token
per column. The spill lives in a hidden folder inside the output folder and is removed at the end, also on error.

This module runs the stages; their parts live beside it: :mod:`.token_batches` (tokenizing), :mod:`.shuffle` (the
keys and the spill), :mod:`.needle_stream` (needle rows) and :mod:`.arrow_shards` (the output files).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from easy_context.data.arrow_shards import ShardWriter
from easy_context.data.columns import HAYSTACK_CHARS, keep_text
from easy_context.data.needle_stream import NeedleStream
from easy_context.data.packing import PackStats, _check_args
from easy_context.data.recall import RecallMixer
from easy_context.data.shuffle import KeySpill, random_keys
from easy_context.data.token_batches import token_batches
from easy_context.models.tokenizer import start_ids

_DOCS, _ROWS = 1, 2  # key streams


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """How :func:`prepare_streaming` divides ``total`` bytes between its stages (see the module docstring)."""

    total: int

    def __post_init__(self) -> None:
        if self.total < 1 << 20:
            raise ValueError(f"the memory budget must be at least 1 MiB, got {self.total} bytes")

    @property
    def batch_chars(self) -> int:  # text tokenized at once: token lists cost ~40 bytes a token
        return max(4096, self.total // 256)

    @property
    def stage_bytes(self) -> int:  # records gathered before they are scattered to the spill files
        return self.total // 16

    @property
    def bucket_bytes(self) -> int:  # the largest spill file sorted in memory
        return self.total // 8

    @property
    def block_bytes(self) -> int:  # the rows a packer gathers before it hands them on
        return self.total // 32

    def batch_bytes(self, positions: bool, needles: bool) -> int:
        """``input_ids`` bytes per output record batch: a quarter of the budget for plain rows, less when each batch
        also makes its position ids (~1.25x the rows' bytes at once) or needle rows and labels (~2.25x)."""
        return self.total // (4 + 5 * positions + 9 * needles)

    @property
    def haystack_chars(self) -> int:  # needle haystack text kept in memory
        return min(HAYSTACK_CHARS, self.total // 128)


class RowPacker:
    """Concatenates the runs pushed into it and hands on complete rows of ``row_len`` tokens, ``block_rows`` at a
    time, to ``sink`` (an int32 array ``(rows, row_len)`` it must consume before returning)."""

    def __init__(self, row_len: int, block_rows: int, sink: Callable[[np.ndarray], None]) -> None:
        self.row_len, self.sink = row_len, sink
        self.buffer = np.empty(max(1, block_rows) * row_len, dtype=np.int32)
        self.fill = 0
        self.rows = 0
        self.dropped = 0

    def push(self, run: np.ndarray) -> None:
        """Append ``run`` (token ids) to the stream."""
        pos = 0
        while pos < len(run):
            n = min(len(run) - pos, self.buffer.size - self.fill)
            self.buffer[self.fill : self.fill + n] = run[pos : pos + n]
            self.fill += n
            pos += n
            if self.fill == self.buffer.size:
                self._emit(self.buffer.size // self.row_len)

    def _emit(self, rows: int) -> None:
        if rows:
            self.sink(self.buffer[: rows * self.row_len].reshape(rows, self.row_len))
            self.rows += rows
        self.fill = 0

    def finish(self) -> None:
        """Hand on the last complete rows; the incomplete tail is dropped (counted in ``dropped``)."""
        rows = self.fill // self.row_len
        self.dropped = self.fill - rows * self.row_len
        self._emit(rows)


class _SequentialRows:
    """Rows kept in their order on disk (the in-order packing of ``seed=None``), read back in blocks."""

    def __init__(self, path: str, row_len: int) -> None:
        self.path, self.row_len = path, row_len
        self.file = None

    def write(self, rows: np.ndarray) -> None:
        if self.file is None:
            self.file = open(self.path, "wb")  # noqa: SIM115 (closed in blocks)
        self.file.write(memoryview(np.ascontiguousarray(rows, dtype=np.int32)).cast("B"))

    def blocks(self, rows_per_block: int) -> Iterator[np.ndarray]:
        if self.file is None:
            return
        self.file.close()
        with open(self.path, "rb") as f:
            while True:
                data = np.fromfile(f, dtype=np.int32, count=max(1, rows_per_block) * self.row_len)
                if data.size == 0:
                    break
                yield data.reshape(-1, self.row_len)
        os.remove(self.path)


def prepare_streaming(
    documents: Iterable[str],
    tokenizer,
    seq_length: int,
    output_dir: str,
    budget: int,
    long_doc_tokens: int | None = None,
    upsample_factor: int = 1,
    seed: int | None = 0,
    num_proc: int = 1,
    show_progress: bool = True,
    needles=None,
    pack: str = "concat",
    repeat: int = 1,
    meta: dict | None = None,
    recall=None,
) -> tuple[PackStats, int]:
    """Prepare ``documents`` into ``output_dir`` within about ``budget`` bytes (see the module docstring); the
    arguments are :func:`easy_context.data.prepare_dataset`'s. ``meta``: more keys for the JSON description.
    Returns the packing statistics and the number of needle rows (nothing is written when there are no rows)."""
    _check_args(seq_length, tokenizer.eos_token_id, long_doc_tokens, upsample_factor)
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    os.makedirs(output_dir, exist_ok=True)
    spill = tempfile.mkdtemp(prefix=".spill-", dir=output_dir)
    try:
        run = _Run(tokenizer, seq_length, output_dir, spill, MemoryBudget(budget), long_doc_tokens, upsample_factor,
                   seed, needles, pack, repeat, recall)  # fmt: skip
        run.scatter(documents, num_proc, show_progress)
        if run.stats.rows == 0:
            return run.stats, 0
        run.pack(show_progress)
        return run.write(show_progress, dict(meta or {}))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        for name in os.listdir(output_dir):  # a failed run's unfinished shards
            if name.startswith("data-") and name.endswith(".arrow.partial"):
                os.remove(os.path.join(output_dir, name))


class _Run:
    """One streamed preparation: :meth:`scatter` (tokenize, spill the document instances), :meth:`pack` (read
    them back in key order into rows), :meth:`write` (shuffle the rows of several copies, write the shards)."""

    def __init__(self, tokenizer, seq_length: int, output_dir: str, spill: str, plan: MemoryBudget,
                 long_doc_tokens: int | None, upsample_factor: int, seed: int | None, needles, pack: str,
                 repeat: int, recall=None) -> None:  # fmt: skip
        self.tokenizer, self.output_dir, self.plan = tokenizer, output_dir, plan
        self.long_doc_tokens, self.upsample_factor, self.seed = long_doc_tokens, upsample_factor, seed
        self.needles, self.pack_mode, self.repeat = needles, pack, repeat
        self.eos_id, self.vocab = tokenizer.eos_token_id, len(tokenizer)
        self.dtype = np.dtype(np.uint16 if self.vocab <= 1 << 16 else np.int32)
        self.row_len = seq_length + 1
        self.key_seed = 0 if seed is None else seed
        self.block_rows = max(1, plan.block_bytes // (4 * self.row_len * repeat))
        self.recall = recall if recall is not None and recall.fraction > 0 else None
        needle_rows = (needles is not None and needles.fraction > 0) or self.recall is not None
        self.batch_rows = max(1, plan.batch_bytes(pack == "documents", needle_rows) // (4 * self.row_len))
        self.stats = PackStats()
        self.per_copy_documents = self.per_copy_tokens = 0
        self.kept: list[str] = []
        self.docs = KeySpill(os.path.join(spill, "docs"), self.dtype, plan.bucket_bytes, plan.stage_bytes)
        self.rows = None
        if repeat > 1:
            self.rows = KeySpill(os.path.join(spill, "rows"), self.dtype, plan.bucket_bytes, plan.stage_bytes,
                                 fixed=self.row_len)  # fmt: skip
        self.in_order = None
        if seed is None and repeat == 1:
            self.in_order = _SequentialRows(os.path.join(spill, "rows.bin"), self.row_len)
        self.shuffled = list(range(1 if seed is None else 0, repeat))  # the copies whose documents are spilled
        self.packers: dict[int, RowPacker] = {}
        if seed is None:  # copy 0 keeps the input order: packed while tokenizing
            self.packers[0] = RowPacker(self.row_len, self.block_rows, self._sink(0, None))
        self.writer: ShardWriter | None = None
        self.mixer: NeedleStream | RecallMixer | None = None

    def _sink(self, copy: int, writer: ShardWriter | None) -> Callable[[np.ndarray], None]:
        """Where ``copy``'s rows go: the row spill (keyed by row number and copy), the in-order file, or ``writer``."""
        if self.rows is None:
            return writer.write if writer is not None else self.in_order.write

        def to_spill(rows: np.ndarray) -> None:
            first = self.packers[copy].rows
            index = np.arange(first, first + len(rows), dtype=np.uint64) * np.uint64(self.repeat) + np.uint64(copy)
            count = len(rows)
            self.rows.add(random_keys(self.key_seed, _ROWS, index), np.full(count, copy),
                          np.arange(count) * self.row_len, np.full(count, self.row_len), rows.reshape(-1))  # fmt: skip

        return to_spill

    def scatter(self, documents: Iterable[str], num_proc: int, show_progress: bool) -> None:
        """Pass 1: tokenize ``documents`` in batches; spill every instance (copies, upsampling) with its key."""
        if self.needles is not None and self.needles.fraction > 0:
            documents = keep_text(documents, self.kept, self.plan.haystack_chars)
        stats, first_doc = self.stats, 0
        for ids, lengths in token_batches(documents, self.tokenizer, self.plan.batch_chars, num_proc, show_progress):
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
                raise ValueError(f"the tokenizer gave ids outside its vocabulary of {self.vocab}")
            tokens = np.insert(ids.astype(self.dtype), np.cumsum(lengths), self.eos_id)  # each document + its EOS
            del ids
            sizes = lengths + 1
            starts = np.cumsum(sizes) - sizes
            long = lengths >= self.long_doc_tokens if self.long_doc_tokens is not None else np.zeros(len(sizes), bool)
            copies = np.where(long, self.upsample_factor, 1)
            stats.documents += len(sizes)
            stats.tokens += int(sizes.sum())
            stats.long_documents += int(long.sum())
            self.per_copy_documents += int(copies.sum())
            self.per_copy_tokens += int((sizes * copies).sum())
            if self.seed is None:
                for s, n, k in zip(starts.tolist(), sizes.tolist(), copies.tolist()):
                    for _ in range(k):
                        self.packers[0].push(tokens[s : s + n])
            if self.shuffled:
                self._spill(tokens, starts, sizes, copies, first_doc)
            first_doc += len(sizes)
        rows_per_copy = self.per_copy_tokens // self.row_len
        stats.packed_documents = self.per_copy_documents * self.repeat
        stats.packed_tokens = self.per_copy_tokens * self.repeat
        stats.rows = rows_per_copy * self.repeat
        stats.dropped_tokens = (self.per_copy_tokens - rows_per_copy * self.row_len) * self.repeat

    def _spill(self, tokens: np.ndarray, starts: np.ndarray, sizes: np.ndarray, copies: np.ndarray,
               first_doc: int) -> None:  # fmt: skip
        """Every instance of a batch's documents: per document, ``len(shuffled)`` copies x ``copies[i]`` instances,
        numbered ``((doc * repeat) + copy) * upsample_factor + instance`` for its key."""
        per_copy = len(self.shuffled)
        doc = np.repeat(np.arange(len(sizes)), copies * per_copy)
        group = np.repeat(copies, per_copy)
        copy = np.repeat(np.tile(np.asarray(self.shuffled), len(sizes)), group)
        instance = np.arange(len(doc)) - np.repeat(np.cumsum(group) - group, group)
        index = (doc + first_doc).astype(np.uint64) * np.uint64(self.repeat) + copy.astype(np.uint64)
        index = index * np.uint64(self.upsample_factor) + instance.astype(np.uint64)
        self.docs.add(random_keys(self.key_seed, _DOCS, index), copy, starts[doc], sizes[doc], tokens)

    def pack(self, show_progress: bool) -> None:
        """Pass 2: the spilled documents in key order, each copy's into its packer."""
        from tqdm.auto import tqdm

        if self.kept:
            from easy_context.tasks.haystack import Haystack

            haystack = Haystack.from_text("\n\n".join(self.kept), self.tokenizer)
            self.kept.clear()
            self.mixer = NeedleStream(haystack, self.tokenizer, self.needles, self.seed, self.stats.rows)
        elif self.recall is not None:
            self.mixer = RecallMixer(self.tokenizer, self.recall, self.seed, self.stats.rows)
        self.writer = ShardWriter(self.output_dir, self.row_len, self.batch_rows, self.eos_id,
                                  self.pack_mode == "documents", self.mixer,
                                  start=start_ids(self.tokenizer))  # fmt: skip
        for c in self.shuffled:
            self.packers[c] = RowPacker(self.row_len, self.block_rows, self._sink(c, self.writer))
        if self.seed is None:
            self.packers[0].finish()
        total = self.per_copy_documents * len(self.shuffled)
        with tqdm(desc="packing", unit="doc", total=total, disable=not show_progress) as bar:
            for tags, starts, lengths, tokens in self.docs.groups():
                for c, s, n in zip(tags.tolist(), starts.tolist(), lengths.tolist()):
                    self.packers[c].push(tokens[s : s + n])
                bar.update(len(tags))
                del tags, starts, lengths, tokens  # before the next file is loaded: one in memory at a time
        for c in self.shuffled:
            self.packers[c].finish()
        expected = self.stats.rows // self.repeat
        if any(p.rows != expected for p in self.packers.values()):  # the streams must agree with the counts
            raise RuntimeError(f"packed {[p.rows for p in self.packers.values()]} rows per copy, expected {expected}")

    def write(self, show_progress: bool, meta: dict) -> tuple[PackStats, int]:
        """Pass 3 (``repeat`` > 1: the rows in key order; ``seed=None``: in order) and the metadata."""
        from tqdm.auto import tqdm

        writer, step = self.writer, self.batch_rows
        if self.rows is not None:
            with tqdm(desc="shuffling rows", unit="row", total=self.stats.rows, disable=not show_progress) as bar:
                for _, starts, _, tokens in self.rows.groups():
                    rows, index = tokens.reshape(-1, self.row_len), starts // self.row_len
                    for k in range(0, len(index), step):
                        writer.write(rows[index[k : k + step]])
                        bar.update(len(index[k : k + step]))
                    del starts, tokens, rows, index  # before the next file is loaded
        elif self.in_order is not None:
            for rows in self.in_order.blocks(step):
                writer.write(rows)
        needle_rows = self.mixer.count if self.mixer is not None else 0
        counted = "recall_rows" if self.recall is not None else "needle_rows"
        meta.update({**dataclasses.asdict(self.stats), "needle_rows": 0, counted: needle_rows})
        writer.close(json.dumps(meta))
        if writer.rows != self.stats.rows:
            raise RuntimeError(f"wrote {writer.rows} rows, expected {self.stats.rows}")
        return self.stats, needle_rows
