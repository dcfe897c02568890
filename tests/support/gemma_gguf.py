"""A Gemma-style GGUF tokenizer written here: a SentencePiece-style BPE trained on the essays (spaces as ``▁``, byte
fallback, Gemma's special pieces), its vocabulary laid out as a Gemma GGUF lays it out (pieces in merge order, no
merge list, scores that do not follow that order, blank pieces stored as spaces, ``add_bos_token`` True)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def essays(n_chars: int = 400_000) -> list[str]:
    """The non-blank lines of the first essays in PaulGrahamEssays/ (fetched first when absent: a test that needs them
    fails rather than skips), at least ``n_chars`` characters."""
    if not any((ROOT / "PaulGrahamEssays").glob("*.txt")):
        subprocess.run([sys.executable, str(ROOT / "PaulGrahamEssays" / "fetch.py")], check=True)
    lines = []
    for path in sorted((ROOT / "PaulGrahamEssays").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").splitlines()
        if sum(map(len, lines)) > n_chars:
            break
    return [line for line in lines if line.strip()]


def train_pieces(lines: list[str], vocab_size: int = 1200):
    """(the trained ``tokenizers.Tokenizer``, its pieces by id): specials, the 256 byte pieces, then the merges."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")  # none: \u2581 is not " "
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL + BYTES, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    pieces = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True) for p in SPECIAL])
    return tok, pieces


def write_gemma_gguf(path: Path, pieces: list[str], architecture: str = "gemma3",
                     chat_template: str = "{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>"
                                          "{% endfor %}") -> str:  # fmt: skip
    """A tokenizer-only GGUF of ``pieces`` as Gemma's files write one; returns its path."""
    import gguf

    rng = random.Random(0)
    types = [
        gguf.TokenType.CONTROL if p in SPECIAL else gguf.TokenType.BYTE if p in BYTES else gguf.TokenType.NORMAL
        for p in pieces
    ]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([" " * len(p) if p and set(p) == {"\u2581"} and len(p) > 1 else p for p in pieces])
    writer.add_token_scores([-rng.uniform(0, 1e4) for _ in pieces])  # not the merge order, as in Gemma's files
    writer.add_token_types(types)
    writer.add_bos_token_id(pieces.index("<bos>"))
    writer.add_eos_token_id(pieces.index("<eos>"))
    writer.add_unk_token_id(pieces.index("<unk>"))
    writer.add_pad_token_id(pieces.index("<pad>"))
    writer.add_add_bos_token(True)
    writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
