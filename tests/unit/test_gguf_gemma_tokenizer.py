"""Gemma's GGUF tokenizer (easy_context.models.gguf_tokenizer) against the tokenizer the file was written from.

A SentencePiece-style BPE is trained here with the ``tokenizers`` library on the essays (spaces as ``▁``, byte
fallback, Gemma's special pieces), and its vocabulary is written as a Gemma GGUF lays one out: pieces in merge order,
no merge list, scores that do not follow that order, blank pieces stored as spaces. The tokenizer rebuilt from the
file must cut text exactly as the trained one does, whatever transformers' own GGUF conversion does (transformers
5.17 made a Unigram model of such files: thousands of perplexity on the real Gemma 3).
"""

from __future__ import annotations

import pytest

from tests.support.gemma_gguf import essays, train_pieces, write_gemma_gguf

pytest.importorskip("gguf")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two  spaces\tand a tab\n\n\nnewlines, then    four",
    "startups grow, and founders learn -- Über 123!",
    "<start_of_turn>user\nhi there<end_of_turn>",
    "emoji 🙂 and 日本語: bytes the vocabulary lacks",
    "",
]


@pytest.fixture(scope="module")
def trained():
    """(the trained tokenizer, its pieces by id): specials, the 256 byte pieces, then the alphabet and merges."""
    lines = essays()
    if len(lines) < 100:
        raise AssertionError("PaulGrahamEssays/ holds too little text (python PaulGrahamEssays/fetch.py)")
    return train_pieces(lines)


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
