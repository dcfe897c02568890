"""Tokenizers: train a small byte-level BPE from scratch, or load an existing one by name or path."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, PAD]
_BYTE_ALPHABET = 256
_GROUP_REPEATS = 30


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int, out_dir: str, digit_group: int = 0):
    """Train a byte-level BPE (specials ``<s>``, ``</s>``, ``<pad>``) on ``texts`` and save it to ``out_dir``.

    Returns a ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad set; ``AutoTokenizer.from_pretrained(out_dir)``
    loads the same tokenizer. Byte-level means any text round-trips through encode/decode.

    ``digit_group`` > 0: numbers are cut into groups of at most that many digits, left to right, and every group is
    one token (Llama 3 and GPT-4 tokenize numbers in groups of 3): ``" 8405721"`` -> ``" ", "840", "572", "1"``.
    Without it a BPE trained on prose splits numbers into single digits.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    groups = digit_groups(digit_group)
    minimum = _BYTE_ALPHABET + len(SPECIAL_TOKENS) + len(groups)
    if vocab_size < minimum:
        what = f" plus {len(groups)} digit groups" if groups else ""
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE{what} needs at least {minimum} tokens"
        )
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if groups:
        split = pre_tokenizers.Split(Regex(rf"\p{{N}}{{1,{digit_group}}}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
        # every group often enough that BPE merges each into one token before rarer merges of the text
        texts = itertools.chain(texts, [" ".join(groups)] * _GROUP_REPEATS)
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_non_empty(texts), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        name_or_path=out_dir,
    )
    vocab = tok.get_vocab()
    missing = [g for g in groups if g not in vocab]
    if missing:
        raise ValueError(
            f"vocab_size={vocab_size} left {len(missing)} of {len(groups)} digit groups without a token of their own "
            f"(e.g. {missing[0]!r}); use a larger vocab_size"
        )
    os.makedirs(out_dir, exist_ok=True)
    wrapped.save_pretrained(out_dir)
    _portable_class_name(out_dir)
    return wrapped


def digit_groups(size: int) -> list[str]:
    """Every string of 1..``size`` decimal digits ("0".."9", "00".."99", ...): the number tokens of ``size``."""
    if size < 0 or size > 4:
        raise ValueError(f"digit_group must be between 0 (off) and 4, got {size}")
    return ["".join(d) for n in range(1, size + 1) for d in itertools.product("0123456789", repeat=n)]


def _portable_class_name(out_dir: str) -> None:
    """Record ``tokenizer_class`` as ``PreTrainedTokenizerFast``, a name every transformers 4.x/5.x resolves."""
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _non_empty(texts: Iterable[str]) -> Iterable[str]:
    count = 0
    for text in texts:
        if text:
            count += 1
            yield text
    if count == 0:
        raise ValueError("cannot train a tokenizer on no text: the iterable of texts was empty")
