"""Bounded-memory preparation: tokenize in batches, shuffle on disk, pack rows incrementally, write arrow shards.

:func:`prepare_streaming` is what :func:`easy_context.data.prepare_dataset` runs for a source too large for the
in-memory path (or when asked). Its memory is bounded by ``budget`` bytes (plus the interpreter and its imports,
and the largest single document, which the source and the tokenizer hold whole anyway); the corpus lives on disk.

How (``B`` = the budget):

1. **Tokenize** batches of at most ``B / 256`` characters (one document at least). Each document instance (the
   document itself, its ``upsample_factor - 1`` extra copies when it is long, and one more of each per
   ``repeat`` copy) draws a 64-bit random key, a bijective hash of ``(seed, instance number)``, and is written with
   its EOS to one of 64 spill files chosen by the key's top 6 bits (:class:`KeySpill`).
2. **Shuffle** the documents: the spill files are read back one at a time in bit order; each is sorted by key in
   memory (a file over ``B / 8`` is split again by the key's next bits first). The documents come out sorted by
   their random keys: a uniformly random order of all instances, so the upsampled copies of a long document are
   spread over the whole set, as the in-memory permutation spreads them. The order is a function of the seed only
   (not of the budget or the batching).
3. **Pack**: each ``repeat`` copy's documents are concatenated and cut into ``seq_length + 1`` rows as they come,
   its incomplete tail dropped. With ``repeat`` > 1 the rows of all copies get random keys too and go through a
   second spill (rows sorted by key), so the copies' rows are interleaved uniformly as in memory.
4. **Write** record batches of ``B / 4`` bytes of ``input_ids`` (``B / 9`` with position ids, ``B / 18`` with
   needle rows too: :meth:`Budget.batch_bytes`) into files of up to 500 MB in ``save_to_disk``'s layout
   (``data-00000-of-000NN.arrow`` arrow streams, ``state.json``, ``dataset_info.json``), which
   ``datasets.load_from_disk`` and :func:`easy_context.data.load_train_dataset` read as any saved dataset.
   ``position_ids`` (``pack="documents"``) and needle rows (their filler text from the same batch, their haystack
   from the first ``min(16M, B / 128)`` characters of the source) are made per batch.

Disk: the spill holds every document instance once (2 bytes a token for vocabularies up to 65,536, else 4), the
row spill (``repeat`` > 1) every row once; each spill file is deleted once read. The output holds 4 bytes a token
per column. The spill lives in a hidden folder inside the output folder and is removed at the end, also on error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from .columns import HAYSTACK_CHARS, INPUT_IDS, LABELS, POSITION_IDS, keep_text
from .packing import PackStats, _check_args, document_positions
from .recall import RecallMixer

SPILL_BITS = 6  # 64 spill files, split again by the next 6 bits when one is over its cap
_DOCS, _ROWS = 1, 2  # key streams
_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_RECORD_BYTES = 56  # a record's key, tag, length, start and sort order, when its spill file is sorted in memory
SHARD_FILE_BYTES = 500 << 20  # per output file (datasets' default max_shard_size)


@dataclasses.dataclass(frozen=True)
class Budget:
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


def random_keys(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """A uint64 key per ``index`` (an array of non-negative ints): a bijective mix of ``index`` salted by
    ``(seed, stream)``, so distinct indices get distinct keys, and sorting by key is a random permutation."""
    salt = _splitmix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    salt = _splitmix(salt ^ np.uint64(stream))
    return _splitmix(np.asarray(index, dtype=np.uint64) + salt)


def _splitmix(x: np.ndarray) -> np.ndarray:
    g, m1, m2 = (np.uint64(c) for c in _MIX)
    with np.errstate(over="ignore"):
        x = x + g
        x = (x ^ (x >> np.uint64(30))) * m1
        x = (x ^ (x >> np.uint64(27))) * m2
        return x ^ (x >> np.uint64(31))


def _gather(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, fixed: int | None) -> np.ndarray:
    """The records ``tokens[starts[i] : starts[i] + lengths[i]]`` concatenated in order."""
    if len(starts) == 0:
        return tokens[:0].copy()
    if fixed is not None:
        return tokens.reshape(-1, fixed)[starts // fixed].reshape(-1)
    return np.concatenate([tokens[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())])


class KeySpill:
    """Records (a uint64 key, an int32 tag, a run of tokens) spilled to ``2 ** bits`` files by their keys' bits
    ``[shift - bits, shift)``, and read back file by file in key order (:meth:`groups`).

    A file is a sequence of blocks: ``int64 [records, tokens]``, keys, tags, lengths (int64), tokens. Records are
    staged until ``stage_bytes`` and then written, one block per file. A file over ``cap_bytes`` is split again by
    the next bits (as few files as bring each to half the cap) before it is read. ``fixed``: every record has that
    length (rows), which lets the gathers be vectorised.
    """

    def __init__(self, folder: str, dtype: np.dtype, cap_bytes: int, stage_bytes: int, shift: int = 64,
                 fixed: int | None = None, bits: int | None = None) -> None:  # fmt: skip
        os.makedirs(folder, exist_ok=True)
        self.folder, self.dtype, self.cap, self.stage_bytes = folder, np.dtype(dtype), cap_bytes, stage_bytes
        self.shift, self.fixed = shift, fixed
        self.bits = min(SPILL_BITS if bits is None else bits, shift)
        count = 1 << self.bits
        self.records = np.zeros(count, dtype=np.int64)
        self.tokens = np.zeros(count, dtype=np.int64)
        self._files: list = [None] * count
        self._stage: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._staged = 0

    def _path(self, j: int) -> str:
        return os.path.join(self.folder, f"{j:02d}.bin")

    def _bucket(self, keys: np.ndarray) -> np.ndarray:
        shifted = keys >> np.uint64(self.shift - self.bits)
        return (shifted & np.uint64((1 << self.bits) - 1)).astype(np.int64)

    def add(self, keys: np.ndarray, tags: np.ndarray, starts: np.ndarray | None, lengths: np.ndarray,
            tokens: np.ndarray) -> None:  # fmt: skip
        """Stage records ``i``: ``keys[i]``, ``tags[i]`` and the tokens ``tokens[starts[i] : +lengths[i]]``
        (``starts`` None: ``tokens`` is the records' runs back to back)."""
        keys = np.asarray(keys, dtype=np.uint64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if starts is None:
            data = np.asarray(tokens, dtype=self.dtype)
        else:
            data = _gather(tokens, np.asarray(starts, dtype=np.int64), lengths, self.fixed).astype(self.dtype)
        self._stage.append((keys, np.asarray(tags, dtype=np.int32), lengths, data))
        self._staged += data.nbytes + _RECORD_BYTES * len(keys)
        if self._staged >= self.stage_bytes:
            self._flush()

    def _flush(self) -> None:
        """Write the staged records, sorted by file, one block per file (at most twice the stage in memory)."""
        keys, tags, lengths, data = (np.concatenate(column) for column in zip(*self._stage))
        self._stage, self._staged = [], 0
        buckets = self._bucket(keys)
        order = np.argsort(buckets, kind="stable")
        keys, tags, buckets = keys[order], tags[order], buckets[order]
        data = _gather(data, (np.cumsum(lengths) - lengths)[order], lengths[order], self.fixed)
        lengths = lengths[order]
        bounds = np.searchsorted(buckets, np.arange((1 << self.bits) + 1))
        ends = np.r_[0, np.cumsum(lengths)]
        for j in np.flatnonzero(np.diff(bounds)).tolist():
            lo, hi = bounds[j], bounds[j + 1]
            self._write(j, keys[lo:hi], tags[lo:hi], lengths[lo:hi], data[ends[lo] : ends[hi]])

    def _write(self, j: int, keys: np.ndarray, tags: np.ndarray, lengths: np.ndarray, data: np.ndarray) -> None:
        if self._files[j] is None:
            self._files[j] = open(self._path(j), "wb")  # noqa: SIM115 (closed in finish)
        f = self._files[j]
        for array in (np.array([len(keys), len(data)], dtype=np.int64), keys, tags, lengths, data):
            f.write(memoryview(np.ascontiguousarray(array)).cast("B"))
        self.records[j] += len(keys)
        self.tokens[j] += len(data)

    def finish(self) -> None:
        """Write what is staged and close the files."""
        if self._stage:
            self._flush()
        for j, f in enumerate(self._files):
            if f is not None:
                f.close()
                self._files[j] = None

    def _size(self, j: int) -> int:
        return int(self.tokens[j]) * self.dtype.itemsize + int(self.records[j]) * _RECORD_BYTES

    def _blocks(self, j: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        with open(self._path(j), "rb") as f:
            header = np.empty(2, dtype=np.int64)
            while f.readinto(header) == header.nbytes:
                n, t = (int(v) for v in header)
                block = (np.empty(n, np.uint64), np.empty(n, np.int32), np.empty(n, np.int64), np.empty(t, self.dtype))
                for array in block:
                    if f.readinto(memoryview(array).cast("B")) != array.nbytes:
                        raise OSError(f"spill file {self._path(j)} is truncated")
                yield block

    def _load(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n, t = int(self.records[j]), int(self.tokens[j])
        out = (np.empty(n, np.uint64), np.empty(n, np.int32), np.empty(n, np.int64), np.empty(t, self.dtype))
        at = [0, 0]
        for block in self._blocks(j):
            for k, array in enumerate(block):
                pos = at[k == 3]
                out[k][pos : pos + len(array)] = array
            at = [at[0] + len(block[0]), at[1] + len(block[3])]
        return out

    def _split_bits(self, size: int) -> int:
        """Bits to split a file of ``size`` bytes by: as few as bring each part to half the cap (keys are uniform)."""
        bits = 1
        while bits < min(SPILL_BITS, self.shift - self.bits) and size >> bits > self.cap // 2:
            bits += 1
        return bits

    def groups(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Yield, file by file in key order, ``(tags, starts, lengths, tokens)``: the file's records sorted by key
        (``tokens[starts[i] : starts[i] + lengths[i]]`` is record ``i``'s run). Each file is deleted once read."""
        self.finish()
        for j in range(1 << self.bits):
            if self.records[j] == 0:
                continue
            if self._size(j) > self.cap and self.records[j] > 1 and self.shift > self.bits:
                child = KeySpill(self._path(j) + ".d", self.dtype, self.cap, self.stage_bytes,
                                 self.shift - self.bits, self.fixed, self._split_bits(self._size(j)))  # fmt: skip
                for keys, tags, lengths, data in self._blocks(j):
                    child.add(keys, tags, None, lengths, data)
                os.remove(self._path(j))
                yield from child.groups()
                os.rmdir(child.folder)
                continue
            keys, tags, lengths, data = self._load(j)
            os.remove(self._path(j))
            order = np.argsort(keys, kind="stable")
            starts = np.cumsum(lengths) - lengths
            yield tags[order], starts[order], lengths[order], data
            del keys, tags, lengths, data, order, starts


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


class NeedleStream:
    """Needle-retrieval rows mixed into a stream of rows: of ``total_rows``, exactly ``round(fraction * total)``
    are replaced, each row chosen with probability (still to choose) / (rows left) (selection sampling, O(1)
    memory), their filler text from the rows of the same block."""

    def __init__(self, haystack, tokenizer, mix, seed: int | None, total_rows: int) -> None:
        self.haystack, self.tokenizer, self.mix = haystack, tokenizer, mix
        self.rng = random.Random(f"needles:{seed}")
        self.count = round(mix.fraction * total_rows)
        self.left, self.rows_left = self.count, total_rows

    @property
    def labels(self) -> bool:
        """Whether the output gets a ``labels`` column (needle rows trained on their answers only)."""
        return self.count > 0 and self.mix.loss != "all"

    def apply(self, rows: np.ndarray) -> np.ndarray | None:
        """Replace the chosen rows of ``rows`` (int32, in place); return which tokens train (None: all)."""
        from .needles import retrieval_row

        chosen = []
        for i in range(len(rows)):
            if self.left and self.rng.random() * self.rows_left < self.left:
                chosen.append(i)
                self.left -= 1
            self.rows_left -= 1
        if not chosen:
            return None
        filler = rows.reshape(-1)
        trained = np.ones(rows.shape, dtype=bool)
        made = []  # all made before any is written in: the filler text is the block's own rows
        for _ in chosen:
            row, mask = retrieval_row(self.rng, self.haystack, self.tokenizer, rows.shape[1], filler, self.mix)
            made.append((row.astype(np.int32), mask))
        for i, (row, mask) in zip(chosen, made):
            rows[i], trained[i] = row, mask
        return None if trained.all() else trained


class ShardWriter:
    """Rows in, a ``save_to_disk``-layout dataset out: arrow stream files ``data-XXXXX-of-NNNNN.arrow`` of up to
    ``file_bytes`` each, one record batch per ``batch_rows`` rows (the rows held in memory), and ``state.json`` and
    ``dataset_info.json`` (written by :meth:`close`). A file is named ``*.arrow.partial`` until :meth:`close`."""

    def __init__(self, folder: str, row_len: int, batch_rows: int, eos_id: int, positions: bool,
                 needles: NeedleStream | None, file_bytes: int = SHARD_FILE_BYTES) -> None:  # fmt: skip
        import pyarrow as pa

        self.folder, self.row_len, self.eos_id, self.positions = folder, row_len, eos_id, positions
        self.needles, self.file_bytes = needles, file_bytes
        self.buffer = np.empty((max(1, batch_rows), row_len), dtype=np.int32)
        self.fill = 0
        self.shards: list[str] = []
        self.rows = 0
        self._sink = self._writer = None
        names = [INPUT_IDS] + [POSITION_IDS] * positions + [LABELS] * bool(needles and needles.labels)
        self.schema = pa.schema([(n, pa.list_(pa.int32(), row_len)) for n in names])

    def write(self, rows: np.ndarray) -> None:
        """Append ``rows`` ``(k, row_len)`` (any integer dtype)."""
        pos = 0
        while pos < len(rows):
            n = min(len(rows) - pos, len(self.buffer) - self.fill)
            self.buffer[self.fill : self.fill + n] = rows[pos : pos + n]
            self.fill += n
            pos += n
            if self.fill == len(self.buffer):
                self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.fill:
            return
        rows = self.buffer[: self.fill]
        trained = self.needles.apply(rows) if self.needles is not None else None
        columns = [_fixed_list(rows)]
        if self.positions:
            columns.append(_fixed_list(document_positions(rows, self.eos_id, dtype=np.int32)))
        if LABELS in self.schema.names:
            columns.append(_fixed_list(rows.copy() if trained is None else np.where(trained, rows, np.int32(-100))))
        if self._writer is None:
            self.shards.append(os.path.join(self.folder, f"data-{len(self.shards):05d}.arrow.partial"))
            self._sink = pa.OSFile(self.shards[-1], "wb")
            self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self._writer.write_batch(pa.record_batch(columns, schema=self.schema))
        self.rows += self.fill
        self.fill = 0
        if self._sink.tell() >= self.file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._sink = self._writer = None

    def close(self, description: str):
        """Write the last rows and the dataset's metadata; return the ``datasets.Features``."""
        import datasets

        self._flush()
        self._close_file()
        count = len(self.shards)
        names = []
        for i, path in enumerate(self.shards):
            names.append(f"data-{i:05d}-of-{count:05d}.arrow")
            os.replace(path, os.path.join(self.folder, names[-1]))
        features = datasets.Features.from_arrow_schema(self.schema)
        datasets.DatasetInfo(description=description, features=features).write_to_directory(self.folder)
        state = {
            "_data_files": [{"filename": n} for n in names],
            "_fingerprint": hashlib.sha256(description.encode()).hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        with open(os.path.join(self.folder, "state.json"), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        return features


def _fixed_list(rows: np.ndarray):
    import pyarrow as pa

    flat = np.ascontiguousarray(rows, dtype=np.int32).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), rows.shape[1])


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


def token_batches(documents: Iterable[str], tokenizer, batch_chars: int, num_proc: int = 1,
                  show_progress: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Yield ``(tokens, lengths)`` per batch of documents (at most ``batch_chars`` characters, one document at
    least): their token ids concatenated (int64, no special tokens) and each document's token count.
    ``num_proc`` > 1 tokenizes in that many processes, at most ``2 * num_proc`` batches in flight."""
    from tqdm.auto import tqdm

    batches = _char_batches(documents, batch_chars)
    with tqdm(desc="tokenizing", unit="doc", disable=not show_progress) as bar:
        if num_proc <= 1:
            for batch in batches:
                bar.update(len(batch))
                yield encode_batch(tokenizer, batch)
            return
        import concurrent.futures
        import multiprocessing

        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with concurrent.futures.ProcessPoolExecutor(num_proc, mp_context=context, initializer=_init_worker,
                                                    initargs=(tokenizer,)) as pool:  # fmt: skip
            pending: list = []
            for batch in itertools.chain(batches, [None]):
                if batch is not None:
                    pending.append((len(batch), pool.submit(_encode_in_worker, batch)))
                while pending and (batch is None or len(pending) >= 2 * num_proc):
                    count, future = pending.pop(0)
                    bar.update(count)
                    yield future.result()


_WORKER_TOKENIZER = None


def _init_worker(tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _encode_in_worker(batch: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_batch(_WORKER_TOKENIZER, batch)


def encode_batch(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` tokenized (no special tokens): the ids concatenated (int64) and the count per text."""
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)[INPUT_IDS]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    if not lengths.sum():
        return np.zeros(0, dtype=np.int64), lengths
    return np.concatenate([np.asarray(x, dtype=np.int64) for x in ids]), lengths


def _char_batches(documents: Iterable[str], limit: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in documents:
        if batch and size + len(text) > limit:
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


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
        run = _Run(tokenizer, seq_length, output_dir, spill, Budget(budget), long_doc_tokens, upsample_factor, seed,
                   needles, pack, repeat, recall)  # fmt: skip
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

    def __init__(self, tokenizer, seq_length: int, output_dir: str, spill: str, plan: Budget,
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
            from ..eval.haystack import Haystack

            haystack = Haystack.from_text("\n\n".join(self.kept), self.tokenizer)
            self.kept.clear()
            self.mixer = NeedleStream(haystack, self.tokenizer, self.needles, self.seed, self.stats.rows)
        elif self.recall is not None:
            self.mixer = RecallMixer(self.tokenizer, self.recall, self.seed, self.stats.rows)
        self.writer = ShardWriter(self.output_dir, self.row_len, self.batch_rows, self.eos_id,
                                  self.pack_mode == "documents", self.mixer)  # fmt: skip
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
