"""The on-disk shuffle of the streamed preparation: records sorted by random keys without holding them in memory.

Every record (a document instance or a packed row) draws a 64-bit key, a bijective hash of ``(seed, stream,
index)`` (:func:`random_keys`); :class:`KeySpill` scatters the records to files by their keys' top bits and reads
the files back one at a time, each sorted by key in memory (a file over its cap is split again by the next bits
first). The records come out sorted by key: a uniformly random order, a function of the seed only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

SPILL_BITS = 6  # 64 spill files, split again by the next 6 bits when one is over its cap
_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_RECORD_BYTES = 56  # a record's key, tag, length, start and sort order, when its spill file is sorted in memory


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
