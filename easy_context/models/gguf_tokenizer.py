"""Gemma's tokenizer rebuilt from a GGUF file's metadata, the same under every transformers version.

A Gemma GGUF stores a SentencePiece BPE vocabulary (``tokenizer.ggml.model = "llama"``): the pieces in merge order,
no merge list, and scores that do not follow that order. transformers 5.17 converts it to a *Unigram* model over
those scores, which cuts text into different, far more numerous pieces (on one machine, one piece per character):
a model fed them still runs, and its perplexity is in the thousands. Newer transformers rebuild BPE merges from the
vocabulary. This module does that itself, so a converted Gemma folder holds the right tokenizer whatever version
converts it.

The rules (SentencePiece BPE, as the file lays it out):

- a merge joins two pieces into a piece of the vocabulary; merges rank by the merged piece's position in the file
  (earlier = applied first), ties by the two parts' positions;
- a piece of only blanks is stored as spaces and looked up as ``"▁" * n`` (spaces are replaced by ``▁`` first);
- characters outside the vocabulary fall back to the ``<0xNN>`` byte pieces;
- control pieces (type 3) are special tokens, user-defined pieces (type 4) are added tokens matched whole;
- ``<bos>`` is prepended when the file says ``add_bos_token``.
"""

from __future__ import annotations

from typing import Any

SPACE = "\u2581"
CONTROL, USER_DEFINED, BYTE = 3, 4, 6  # tokenizer.ggml.token_type values (llama.cpp's)
SENTENCEPIECE_BPE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")  # their files list no merges; the order is the rank


def needs_own_tokenizer(fields: dict[str, Any], architecture: str) -> bool:
    """Whether the file's tokenizer is a SentencePiece BPE vocabulary without merges that this module rebuilds."""
    return (
        architecture in SENTENCEPIECE_BPE_ARCHITECTURES
        and fields.get("tokenizer.ggml.model") == "llama"
        and "tokenizer.ggml.merges" not in fields
    )


def bpe_merges(pieces: list[str | None]) -> list[tuple[str, str]]:
    """The merges a vocabulary in merge order implies: every split of a piece into two pieces of the vocabulary,
    ranked by the piece's position, then by the parts' positions. ``pieces``: the vocabulary by id (None: a piece
    that is neither merged nor a part)."""
    index = {p: i for i, p in enumerate(pieces) if p is not None}
    ranked = []
    for rank, piece in enumerate(pieces):
        for cut in range(1, len(piece or "")):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                ranked.append((rank, index[left], index[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_gemma_tokenizer(fields: dict[str, Any]):
    """A transformers fast tokenizer of a Gemma GGUF's vocabulary (``fields``: the file's ``tokenizer.*`` metadata,
    :func:`easy_context.models.gguf.read_tokenizer_fields`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    types = list(fields.get("tokenizer.ggml.token_type") or [])
    pieces = [SPACE * len(p) if p and not p.strip(" ") else p for p in fields["tokenizer.ggml.tokens"]]
    types += [1] * (len(pieces) - len(types))
    # only ordinary pieces take part in merges: control and byte pieces are never the result of joining two others
    mergeable = [p if t not in (CONTROL, BYTE) else None for p, t in zip(pieces, types)]

    def piece(key: str, default: str | None = None) -> str | None:
        i = fields.get(f"tokenizer.ggml.{key}")
        return pieces[int(i)] if i is not None and 0 <= int(i) < len(pieces) else default

    unk = piece("unknown_token_id", "<unk>")
    core = Tokenizer(
        BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=bpe_merges(mergeable),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    core.normalizer = normalizers.Replace(" ", SPACE)
    core.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    core.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    whole = {CONTROL: core.add_special_tokens, USER_DEFINED: core.add_tokens}  # matched whole, never cut
    for kind, add in whole.items():
        add([AddedToken(p, normalized=False, special=kind == CONTROL) for p, t in zip(pieces, types) if t == kind])
    bos, eos, pad = piece("bos_token_id"), piece("eos_token_id"), piece("padding_token_id")
    if bos is not None and fields.get("tokenizer.ggml.add_bos_token", True):
        bos_id = pieces.index(bos)
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad), ("unk_token", unk)) if v}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **special)
    if fields.get("tokenizer.chat_template"):
        tokenizer.chat_template = fields["tokenizer.chat_template"]
    return tokenizer
