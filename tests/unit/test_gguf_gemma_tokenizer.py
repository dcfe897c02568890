"""Gemma's GGUF tokenizer (easy_context.models.gguf_tokenizer) against the tokenizer the file was written from.

A SentencePiece-style BPE is trained here with the ``tokenizers`` library on the essays (spaces as ``▁``, byte
fallback, Gemma's special pieces), and its vocabulary is written as a Gemma GGUF lays one out: pieces in merge order,
no merge list, scores that do not follow that order, blank pieces stored as spaces. The tokenizer rebuilt from the
file must cut text exactly as the trained one does, whatever transformers' own GGUF conversion does (transformers
5.17 made a Unigram model of such files: thousands of perplexity on the real Gemma 3).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two  spaces\tand a tab\n\n\nnewlines, then    four",
    "startups grow, and founders learn -- Über 123!",
    "<start_of_turn>user\nhi there<end_of_turn>",
    "emoji 🙂 and 日本語: bytes the vocabulary lacks",
    "",
]


def essays(n_chars: int = 400_000) -> list[str]:
    lines = []
    for path in sorted((ROOT / "PaulGrahamEssays").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").splitlines()
        if sum(map(len, lines)) > n_chars:
            break
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="module")
def trained():
    """(the trained tokenizer, its pieces by id): specials, the 256 byte pieces, then the alphabet and merges."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    lines = essays()
    if len(lines) < 100:
        pytest.skip("PaulGrahamEssays/ holds too little text (python PaulGrahamEssays/fetch.py)")
    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")  # none: \u2581 is not " "
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL + BYTES, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    pieces = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True) for p in SPECIAL])
    return tok, pieces


def write_gemma_gguf(path: Path, pieces: list[str], architecture: str = "gemma3") -> str:
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
    writer.add_chat_template("{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_gemma_gguf_tokenizer_cuts_text_as_the_tokenizer_it_was_written_from(trained, tmp_path):
    from easy_context.models.gguf import load_gguf_tokenizer

    ref, pieces = trained
    assert sum(set(p) == {"\u2581"} and len(p) > 1 for p in pieces) >= 1  # a blank piece is stored as spaces
    tok = load_gguf_tokenizer(write_gemma_gguf(tmp_path / "gemma.gguf", pieces))
    bos = pieces.index("<bos>")
    held_out = essays(900_000)[-300:]  # lines past the training text
    for text in TEXTS + held_out:
        want = [bos] + ref.encode(text).ids
        assert tok(text)["input_ids"] == want, text
        assert tok.decode(want[1:]) == text
    assert (tok.bos_token_id, tok.eos_token, tok.pad_token, tok.unk_token) == (bos, "<eos>", "<pad>", "<unk>")
    ids = tok("emoji 🙂")["input_ids"]
    assert {pieces.index(f"<0x{b:02X}>") for b in "🙂".encode()} <= set(ids)  # byte fallback, not <unk>
    assert len(tok("<start_of_turn>")["input_ids"]) == 2  # <bos> and the control piece, whole
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<start_of_turn>hi<end_of_turn>"  # the file's template


def test_gemma_gguf_tokenizer_does_not_use_transformers_conversion(trained, tmp_path, monkeypatch):
    """The rebuilt tokenizer does not go through transformers' GGUF conversion (its result depends on the version);
    other architectures still do."""
    import transformers

    from easy_context.models.gguf import load_gguf_tokenizer

    def refuse(*args, **kwargs):
        raise AssertionError("transformers' GGUF tokenizer conversion was used")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    ref, pieces = trained
    for arch in ("gemma", "gemma2", "gemma3"):
        tok = load_gguf_tokenizer(write_gemma_gguf(tmp_path / f"{arch}.gguf", pieces, arch))
        assert tok(TEXTS[0])["input_ids"][1:] == ref.encode(TEXTS[0]).ids
    with pytest.raises(AssertionError, match="conversion was used"):
        load_gguf_tokenizer(write_gemma_gguf(tmp_path / "llama.gguf", pieces, "llama"))


def test_merges_rank_by_the_merged_pieces_position():
    from easy_context.models.gguf_tokenizer import bpe_merges

    pieces = ["a", "b", "c", "ab", "bc", "abc", None]
    assert bpe_merges(pieces) == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]
