"""Prepared datasets: tokenize a source, pack it into ``seq_length + 1`` rows, save/load for training."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from easy_context.data.columns import HAYSTACK_CHARS, INPUT_IDS, LABELS, POSITION_IDS, keep_text
from easy_context.data.needles import NeedleMix, mix_retrieval_rows
from easy_context.data.packing import PACK_MODES, PackStats, _check_args, begin_rows, document_positions, pack_to_array
from easy_context.data.random_tokens import RandomTokens, random_source_rows
from easy_context.data.recall import RecallMix, mix_recall_rows
from easy_context.data.sources import is_saved_dataset, load_documents, load_saved_dataset
from easy_context.models.tokenizer import encode_documents, load_tokenizer, start_ids

_BATCH = 256
DEFAULT_MAX_MEMORY_GB = 4.0
# The in-memory path's peak, measured (docs/data.md): 45 bytes per token (concat), 65 (documents), 136 per source
# token with documents + upsampling x2 + repeat 2. Counted per source character (a byte-level tokenizer's worst
# case: a token a character), times repeat and upsampling; needle rows add their haystack's tokenization.
IN_MEMORY_BYTES_PER_CHAR = 80
NEEDLE_BYTES_PER_CHAR = 64


def prepare_dataset(
    source: str | Iterable[str],
    tokenizer,
    seq_length: int,
    output_dir: str | None = None,
    long_doc_tokens: int | None = None,
    upsample_factor: int = 1,
    seed: int | None = 0,
    num_proc: int = 1,
    show_progress: bool = True,
    needles: NeedleMix | None = None,
    pack: str = "concat",
    repeat: int = 1,
    max_memory_gb: float | None = DEFAULT_MAX_MEMORY_GB,
    streaming: bool | None = None,
    recall: RecallMix | None = None,
):
    """Tokenize ``source`` and pack it into a ``datasets.Dataset`` with one column ``"input_ids"``.

    ``source``: anything :func:`load_documents` accepts, or an iterable of document strings. ``tokenizer``: a
    transformers tokenizer or a name/path for :func:`load_tokenizer`. Every row holds ``seq_length + 1`` token ids
    (see :func:`pack_documents` for EOS, upsampling and shuffling). Written with ``save_to_disk(output_dir)`` when
    given. The packing statistics are stored as JSON in ``dataset.info.description``.

    ``needles``: that share of the rows becomes retrieval rows (:mod:`easy_context.data.needles`), their haystacks
    cut from the source's own text (its first 16 M characters).

    ``recall``: that share of the rows becomes key-value recall rows (:mod:`easy_context.data.recall`: records and
    questions of a format of their own written into the row's own text, trained on the answers); not together with
    ``needles``.

    ``pack``: ``"concat"`` (the rows only) or ``"documents"``: a second column ``"position_ids"`` restarting at 0 at
    each document (after every EOS, and at each row start; :func:`document_positions`), so training masks
    attention to each document. A needle row's filler text and its needle document are one document there.

    ``repeat``: the source is packed that many times, each in another document order (``seed + i``), so the rows of
    a multi-epoch run differ in their boundaries (measured: a tiny model trained 68 epochs over the same 710 rows
    memorised each row by its position and scored perplexity 50K on the essays it had learnt), and every copy gets
    its own, fresh needle rows.

    ``max_memory_gb``: the memory budget. A source whose text fits in it (at most ``max_memory_gb * 2**30 /
    (80 * repeat * upsample_factor [+ 64 with needles])`` characters, read ahead to find out) is prepared in memory
    as above; a larger one is streamed (:mod:`easy_context.data.streaming`): tokenized in batches, shuffled on
    disk, packed incrementally and written shard by shard, in about that much memory whatever the corpus size (its
    rows are another random order of the same kind). ``None``: always in memory. ``streaming``: True/False forces
    one path (None: decide by the size). A streamed dataset is returned memory-mapped from ``output_dir`` (a
    temporary folder, removed at exit, when None).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if pack not in PACK_MODES:
        raise ValueError(f"pack must be one of {sorted(PACK_MODES)}, got {pack!r}")
    if recall is not None and recall.fraction > 0 and needles is not None and needles.fraction > 0:
        raise ValueError("choose needle rows or recall rows, not both (--needle-fraction or --recall-fraction)")
    if recall is not None and recall.fraction > 0 and pack == "documents":
        raise ValueError("recall rows write records into the row's text across its documents: use --pack concat")
    import datasets
    import pyarrow as pa

    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos_token; set tokenizer.eos_token first")
    _check_args(seq_length, eos_id, long_doc_tokens, upsample_factor)
    if max_memory_gb is not None and max_memory_gb <= 0:
        raise ValueError(f"max_memory_gb must be > 0 (or None: no bound), got {max_memory_gb}")
    documents = load_documents(source) if isinstance(source, str) else iter(source)
    budget = int((max_memory_gb or DEFAULT_MAX_MEMORY_GB) * 2**30)
    if streaming is None:
        streaming = False
        if max_memory_gb is not None:
            per_char = IN_MEMORY_BYTES_PER_CHAR * repeat * upsample_factor
            per_char += NEEDLE_BYTES_PER_CHAR if needles is not None and needles.fraction > 0 else 0
            documents, streaming = _read_ahead(documents, budget // per_char)
    if streaming:
        settings = {
            "long_doc_tokens": long_doc_tokens,
            "upsample_factor": upsample_factor,
            "seed": seed,
            "num_proc": num_proc,
            "show_progress": show_progress,
            "needles": needles,
            "pack": pack,
            "repeat": repeat,
            "recall": recall,
        }
        return _prepare_streaming(documents, source, tokenizer, seq_length, output_dir, budget, settings)
    kept: list[str] = []
    if needles is not None and needles.fraction > 0:
        documents = keep_text(documents, kept, HAYSTACK_CHARS)
    token_lists = tokenize_documents(documents, tokenizer, num_proc=num_proc, show_progress=show_progress)
    if repeat > 1:
        token_lists = list(token_lists)
    packed = [pack_to_array(token_lists, seq_length, eos_id, long_doc_tokens, upsample_factor,
                            None if seed is None and i == 0 else (seed or 0) + i) for i in range(repeat)]  # fmt: skip
    rows, stats = np.concatenate([r for r, _ in packed]), packed[0][1]
    if repeat > 1:  # the copies' rows interleaved at random, and the stats of all of them
        rows = rows[np.random.default_rng(seed).permutation(len(rows))]
        stats = dataclasses.replace(stats, rows=len(rows), packed_tokens=sum(st.packed_tokens for _, st in packed),
                                    packed_documents=sum(st.packed_documents for _, st in packed),
                                    dropped_tokens=sum(st.dropped_tokens for _, st in packed))  # fmt: skip
    if stats.rows == 0:
        raise _too_little_text(source, stats, seq_length)
    needle_rows, trained = 0, None
    if kept:
        from easy_context.tasks.haystack import Haystack

        haystack = Haystack.from_text("\n\n".join(kept), tokenizer)
        rows, trained, needle_rows = mix_retrieval_rows(rows, haystack, tokenizer, needles, seed)
    recall_rows = 0
    if recall is not None and recall.fraction > 0:
        rows, trained, recall_rows = mix_recall_rows(rows, tokenizer, recall, seed)
    begin_rows(rows, start_ids(tokenizer), eos_id)
    row_len = seq_length + 1
    column = pa.FixedSizeListArray.from_arrays(pa.array(rows.astype(np.int32).reshape(-1)), row_len)
    columns = {INPUT_IDS: column}
    if pack == "documents":
        positions = document_positions(rows, eos_id).astype(np.int32).reshape(-1)
        columns[POSITION_IDS] = pa.FixedSizeListArray.from_arrays(pa.array(positions), row_len)
    if trained is not None:
        labels = np.where(trained, rows, -100).astype(np.int32).reshape(-1)
        columns[LABELS] = pa.FixedSizeListArray.from_arrays(pa.array(labels), row_len)
    meta = {
        **_settings(source, tokenizer, seq_length, long_doc_tokens, upsample_factor, seed, pack, repeat),
        **dataclasses.asdict(stats),
        "needle_rows": needle_rows,
        **_needle_settings(needles),
        **_recall_settings(recall, recall_rows),
    }
    ds = datasets.Dataset(pa.table(columns), info=datasets.DatasetInfo(description=json.dumps(meta)))
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        with _datasets_progress(show_progress):
            ds.save_to_disk(output_dir)
    return ds


def _too_little_text(source, stats: PackStats, seq_length: int) -> ValueError:
    return ValueError(
        f"{_describe(source)} has {stats.packed_tokens} tokens, fewer than one row of seq_length + 1 = "
        f"{seq_length + 1}; use a smaller seq_length or more text"
    )


def _settings(source, tokenizer, seq_length, long_doc_tokens, upsample_factor, seed, pack, repeat) -> dict:
    return {
        "seq_length": seq_length,
        "source": _describe(source),
        "tokenizer": getattr(tokenizer, "name_or_path", None),
        "vocab_size": len(tokenizer),
        "eos_id": tokenizer.eos_token_id,
        "long_doc_tokens": long_doc_tokens,
        "upsample_factor": upsample_factor,
        "seed": seed,
        "pack": pack,
        "repeat": repeat,
    }


def _needle_settings(needles: NeedleMix | None) -> dict:
    return {f"needle_{k}": v for k, v in dataclasses.asdict(needles).items()} if needles else {}


def _recall_settings(recall: RecallMix | None, rows: int = 0) -> dict:
    if recall is None or recall.fraction == 0:
        return {}
    return {"recall_rows": rows, **{f"recall_{k}": v for k, v in dataclasses.asdict(recall).items()}}


def _read_ahead(documents: Iterable[str], limit: int) -> tuple[Iterator[str], bool]:
    """Read ``documents`` until more than ``limit`` characters: the same documents again, and whether the
    source is larger than that (the read-ahead text is all that is held)."""
    head: list[str] = []
    size = 0
    documents = iter(documents)
    for text in documents:
        head.append(text)
        size += len(text)
        if size > limit:
            return _replay(head, documents), True
    return iter(head), False


def _replay(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    """``head`` then ``rest``, letting go of each read-ahead document as it is handed on."""
    head.reverse()
    while head:
        yield head.pop()
    yield from rest


def _prepare_streaming(documents: Iterator[str], source, tokenizer, seq_length: int, output_dir: str | None,
                       budget: int, settings: dict):  # fmt: skip
    """:func:`prepare_dataset`'s streamed path (``settings``: its other arguments): the dataset written to
    ``output_dir`` and loaded from it."""
    from easy_context.data.streaming import prepare_streaming

    if output_dir is None:
        output_dir = tempfile.mkdtemp(prefix="easy_context_prepared-")
        atexit.register(shutil.rmtree, output_dir, ignore_errors=True)
    keys = ("long_doc_tokens", "upsample_factor", "seed", "pack", "repeat")
    meta = {
        **_settings(source, tokenizer, seq_length, *(settings[k] for k in keys)),
        "streamed": True,
        "max_memory_gb": budget / 2**30,
        **_needle_settings(settings["needles"]),
        **_recall_settings(settings["recall"]),
    }
    with _datasets_progress(settings["show_progress"]):
        stats, _ = prepare_streaming(documents, tokenizer, seq_length, output_dir, budget, meta=meta, **settings)
    if stats.rows == 0:
        raise _too_little_text(source, stats, seq_length)
    return load_saved_dataset(output_dir)


def pack_stats(dataset) -> PackStats | None:
    """The :class:`PackStats` recorded by :func:`prepare_dataset` in ``dataset.info.description`` (or None)."""
    try:
        meta = json.loads(dataset.info.description or "")
    except (json.JSONDecodeError, TypeError):
        return None
    fields = {f.name for f in dataclasses.fields(PackStats)}
    return PackStats(**{k: v for k, v in meta.items() if k in fields}) if isinstance(meta, dict) else None


def tokenize_documents(
    documents: Iterable[str], tokenizer, num_proc: int = 1, show_progress: bool = True
) -> Iterator[list[int]]:
    """Yield the token ids of each document (:func:`encode_documents`: the tokenizer's start ids first, no EOS), with
    a tqdm bar over documents."""
    if num_proc > 1:
        yield from _tokenize_parallel(documents, tokenizer, num_proc, show_progress)
        return
    from tqdm.auto import tqdm

    with tqdm(desc="tokenizing", unit="doc", disable=not show_progress) as bar:
        for batch in _batches(documents, _BATCH):
            encoded = encode_documents(tokenizer, batch)
            bar.update(len(batch))
            yield from encoded


def _tokenize_parallel(documents: Iterable[str], tokenizer, num_proc: int, show_progress: bool) -> Iterator[list[int]]:
    import datasets

    texts = datasets.Dataset.from_dict({"text": list(documents)})

    def encode(batch):
        return {INPUT_IDS: encode_documents(tokenizer, batch["text"])}

    with _datasets_progress(show_progress):
        encoded = texts.map(encode, batched=True, batch_size=_BATCH, num_proc=num_proc, remove_columns=["text"])
    for batch in encoded.iter(batch_size=1024):
        yield from batch[INPUT_IDS]


@contextlib.contextmanager
def _datasets_progress(show: bool) -> Iterator[None]:
    """Hide the ``datasets`` progress bars inside the block unless ``show``."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    if was_enabled and not show:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled and not show:
            datasets.enable_progress_bars()


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _describe(source) -> str:
    return source if isinstance(source, str) else f"<{type(source).__name__} of documents>"


class PackedRows(torch.utils.data.Dataset):
    """A torch view of a prepared ``datasets.Dataset``: item ``i`` is a LongTensor of shape ``(seq_length + 1,)``,
    or, for a dataset with more columns (``"position_ids"`` from ``--pack documents``, ``"labels"`` from needle rows
    trained on their answers), a dict of such tensors keyed by column (``"input_ids"`` and those present)."""

    def __init__(self, dataset, seq_length: int):
        self.names = [n for n in (INPUT_IDS, POSITION_IDS, LABELS) if n in dataset.column_names]
        self.has_positions = POSITION_IDS in self.names
        self.dataset = dataset.select_columns(self.names).with_format("numpy")
        self.seq_length = seq_length

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> torch.Tensor | dict[str, torch.Tensor]:
        item = self.dataset[int(index)]
        columns = {n: torch.from_numpy(np.asarray(item[n])[: self.seq_length + 1].astype(np.int64)) for n in self.names}
        return columns[INPUT_IDS] if len(columns) == 1 else columns


def load_train_dataset(
    dataset: str, tokenizer, seq_length: int, seed: int = 0, show_progress: bool = True,
    vocab_size: int | None = None,
) -> torch.utils.data.Dataset:  # fmt: skip
    """The training set for ``train.py``: items are LongTensors of shape ``(seq_length + 1,)``.

    ``dataset`` is either a prepared ``save_to_disk`` folder (``"input_ids"`` rows of at least ``seq_length + 1``
    tokens, truncated to that length), or a raw source for :func:`load_documents`, tokenized with ``tokenizer``
    (a tokenizer or a name/path) and packed in memory with ``seed`` (deterministic: every rank gets the same rows).
    A prepared folder is used as saved (``seed`` is ignored: it was shuffled when prepared); ``tokenizer`` may then
    be None, and when given its vocabulary is checked against the largest token id. ``random`` / ``random:ROWS``
    is :class:`RandomTokens` over ``vocab_size`` ids (default: the tokenizer's), for throughput and memory probes.
    """
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    rows = random_source_rows(dataset)
    if rows is not None:
        if not vocab_size and tokenizer is not None:
            vocab_size = len(load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer)
        if not vocab_size:
            raise ValueError(f"--dataset {dataset}: random tokens need a vocabulary size (a model or a tokenizer)")
        return RandomTokens(vocab_size, seq_length, rows, seed)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    if is_saved_dataset(dataset):
        saved = load_saved_dataset(dataset)
        if INPUT_IDS in saved.column_names:
            _check_prepared(saved, dataset, seq_length, tokenizer)
            return PackedRows(saved, seq_length)
    if tokenizer is None:
        raise ValueError(f"{dataset!r} is raw text (not a prepared 'input_ids' dataset): it needs a tokenizer")
    return PackedRows(
        prepare_dataset(dataset, tokenizer, seq_length, seed=seed, show_progress=show_progress), seq_length
    )


def _check_prepared(saved, path: str, seq_length: int, tokenizer) -> None:
    import pyarrow.compute as pc

    if len(saved) == 0:
        raise ValueError(f"prepared dataset {path!r} has no rows")
    column = saved.data.column(INPUT_IDS)
    shortest = pc.min(pc.list_value_length(column)).as_py()
    if shortest < seq_length + 1:
        prepared = _prepared_seq_length(saved, shortest)
        raise ValueError(
            f"prepared dataset {path!r} has rows of {shortest} tokens (prepared with --seq-length {prepared}), "
            f"but seq_length={seq_length} needs {seq_length + 1} tokens per row. Re-run "
            f"`python -m easy_context.data --dataset SRC --output {path} --seq-length {seq_length} ...`, "
            f"or train with --seq-length <= {prepared}."
        )
    smallest = pc.min(pc.list_flatten(column)).as_py()
    if smallest is not None and smallest < 0:
        raise ValueError(
            f"prepared dataset {path!r} contains token id {smallest}: input ids must be >= 0 (a -100 'ignore' "
            "label belongs in the targets, which train.py derives from the ids); re-prepare it with "
            "`python -m easy_context.data`"
        )
    if tokenizer is not None:
        largest = pc.max(pc.list_flatten(column)).as_py()
        if largest is not None and largest >= len(tokenizer):
            raise ValueError(
                f"prepared dataset {path!r} contains token id {largest}, but the tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '')!r} has only {len(tokenizer)} tokens: "
                "it was prepared with a different tokenizer"
            )


def _prepared_seq_length(saved, shortest: int) -> int:
    try:
        return int(json.loads(saved.info.description)["seq_length"])
    except (json.JSONDecodeError, TypeError, KeyError, ValueError):
        return shortest - 1
