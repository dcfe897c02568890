"""The streamed preparation's output: rows written as arrow record batches into files in ``save_to_disk``'s layout,
which ``datasets.load_from_disk`` reads as any saved dataset."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from easy_context.data.columns import INPUT_IDS, LABELS, POSITION_IDS
from easy_context.data.needle_stream import NeedleStream
from easy_context.data.packing import begin_rows, document_positions

SHARD_FILE_BYTES = 500 << 20  # per output file (datasets' default max_shard_size)


class ShardWriter:
    """Rows in, a ``save_to_disk``-layout dataset out: arrow stream files ``data-XXXXX-of-NNNNN.arrow`` of up to
    ``file_bytes`` each, one record batch per ``batch_rows`` rows (the rows held in memory), and ``state.json`` and
    ``dataset_info.json`` (written by :meth:`close`). A file is named ``*.arrow.partial`` until :meth:`close`.
    ``start``: the tokenizer's start ids, written at the head of each row that lacks them (:func:`begin_rows`)."""

    def __init__(self, folder: str, row_len: int, batch_rows: int, eos_id: int, positions: bool,
                 needles: NeedleStream | None, file_bytes: int = SHARD_FILE_BYTES,
                 start: list[int] | None = None) -> None:  # fmt: skip
        import pyarrow as pa

        self.folder, self.row_len, self.eos_id, self.positions = folder, row_len, eos_id, positions
        self.needles, self.file_bytes, self.start = needles, file_bytes, start or []
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
        begin_rows(rows, self.start, self.eos_id)
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
