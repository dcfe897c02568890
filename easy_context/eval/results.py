"""Result files: CSV rows (one dict per row) and JSON, written by the main process; CSV reading with numbers."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict


def _parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def _one_line(value):
    """Strings with line breaks escaped (``\\n``), so each record is one line of the CSV."""
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
    return value


def write_csv(rows: list[dict], path: str) -> None:
    """``rows`` as CSV with the union of their keys as columns (first-seen order), one line per row (line breaks
    inside strings are written as ``\\n``)."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    _parent(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: _one_line(v) for k, v in row.items()} for row in rows)


def write_json(value, path: str) -> None:
    _parent(path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_csv(path: str, numeric: tuple[str, ...] = ()) -> list[dict]:
    """Rows of a CSV as dicts; the ``numeric`` columns are parsed as int/float (missing ones raise)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in numeric if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing} (columns: {reader.fieldnames})")
        rows = list(reader)
    for row in rows:
        for column in numeric:
            row[column] = _number(row[column])
    return rows


def cell_scores(rows: list[dict], key: str = "correct") -> dict[tuple[float, int], float]:
    """Mean of ``key`` per (depth, length) cell."""
    sums: dict[tuple[float, int], list[float]] = defaultdict(list)
    for row in rows:
        sums[(float(row["depth"]), int(row["length"]))].append(float(row[key]))
    return {cell: sum(values) / len(values) for cell, values in sums.items()}
