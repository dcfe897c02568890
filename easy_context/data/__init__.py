"""Data preparation for long-context training: raw text -> tokenizer -> packed ``seq_length + 1`` rows.

    from easy_context.data import load_documents, train_byte_level_bpe, prepare_dataset, load_train_dataset
    tok = train_byte_level_bpe(load_documents("PaulGrahamEssays"), vocab_size=8000, out_dir="out/tok")
    ds = prepare_dataset("PaulGrahamEssays", tok, seq_length=4096, output_dir="out/pg_4k")
    train_set = load_train_dataset("out/pg_4k", tok, seq_length=4096)   # items: LongTensor (4097,)

CLI: ``python -m easy_context.data --dataset SRC --output DIR --seq-length N (--tokenizer T | --train-tokenizer V)``.
A source larger than ``max_memory_gb`` (``--max-memory-gb``, default 4) allows is streamed in that much memory
(:mod:`easy_context.data.streaming`, docs/data.md).
"""

from easy_context.data.packing import PACK_MODES, PackStats, document_positions, pack_documents
from easy_context.data.prepare import load_train_dataset, pack_stats, prepare_dataset
from easy_context.data.random_tokens import RandomTokens, random_source_rows
from easy_context.data.sources import load_documents
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.models.tokenizer import load_tokenizer

__all__ = [
    "PACK_MODES",
    "PackStats",
    "RandomTokens",
    "document_positions",
    "load_documents",
    "load_tokenizer",
    "load_train_dataset",
    "pack_documents",
    "pack_stats",
    "prepare_dataset",
    "random_source_rows",
    "train_byte_level_bpe",
]
