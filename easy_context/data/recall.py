"""Key-value recall rows: ordinary training text with records written into it at line breaks and, later in the
row, questions about some of them, trained on the answers only.

A format of its own, unlike ``eval_needle.py``'s prompts (and the needle rows of :mod:`easy_context.data.needles`):
the keys are made-up two-part names (``"valkor-prime"``, never a city), the values digit strings of 4..9 digits or
short letter-digit codes, and each row writes its records and questions in one of :data:`STYLES` (a registry line,
a code assignment, a JSON entry, a log line), none of which is the needle's "special magic ... number" sentence.
The haystack is the row's own text (the training corpus, not the essays), so what is learnt is to look up an
exact string anywhere in the row, not a template.

A row is cut into 1..3 segments (boundaries uniform); each segment gets its own records at random line breaks of
its text and ends with a block of questions about a random subset of them, each question followed by its answer.
Segment lengths, record positions and the questions' order are random, so answers sit at every distance the row
allows and questions at every position. The row keeps its length: the segment's text is shortened by what the
records and questions add. Which tokens train: the answers' (``RecallMix.loss="answer"``), or every token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .needles import check_mix, encode_answers

# (record, question + answer): {key}, {value}; the answer is the {value} of the question line
STYLES: tuple[tuple[str, str], ...] = (
    ("registry: the access code of {key} is {value}", "lookup: the access code of {key} is {value}"),
    ('{ident} = "{value}"  # recall entry', 'assert {ident} == "{value}"'),
    ('{{"name": "{key}", "code": "{value}"}},', 'query {{"name": "{key}"}} -> "{value}"'),
    ("[log] token issued to {key}: {value}", "[check] token issued to {key}? {value}"),
)
_SYLLABLES = (
    "ka", "vo", "ril", "zan", "tor", "mek", "sul", "dra", "pim", "qua", "nel", "gor", "bex", "lun", "fyr", "osk",
    "tal", "wen", "cri", "hum", "jad", "yel", "ux", "ber", "mol", "sti", "var", "ped", "kin", "zor",
)  # fmt: skip
_SUFFIXES = ("prime", "north", "delta", "seven", "amber", "core", "node", "gate", "field", "stone", "vale", "arc")
_CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
MIN_SEGMENT_TOKENS = 256


@dataclass(frozen=True)
class RecallMix:
    """Which share of the rows become recall rows, how many records and questions each segment holds, and what
    the rows train on."""

    fraction: float  # of the packed rows, 0..1
    max_records: int = 24  # records per segment: uniform in 2..max_records
    max_questions: int = 8  # questions per segment: uniform in 1..min(records, max_questions)
    loss: str = "answer"  # "answer": a recall row trains on its answers only; "all": on every token

    def __post_init__(self) -> None:
        check_mix("recall", self.fraction, self.loss)
        if self.max_records < 2:
            raise ValueError(f"recall records per segment must be >= 2, got {self.max_records}")
        if self.max_questions < 1:
            raise ValueError(f"recall questions per segment must be >= 1, got {self.max_questions}")


def random_key(rng: random.Random) -> str:
    """A made-up name: two or three syllables, a dash, a suffix (``"zantor-delta"``)."""
    word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
    return f"{word}-{rng.choice(_SUFFIXES)}"


def random_value(rng: random.Random) -> str:
    """A digit string of 4..9 digits (no leading zero; 3 in 4 values) or a 6-character letter-digit code."""
    if rng.random() < 0.75:
        digits = rng.randint(4, 9)
        return str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    return "".join(rng.choice(_CODE_CHARS) for _ in range(6))


def _fill(template: str, key: str, value: str) -> str:
    return template.format(key=key, ident=key.replace("-", "_"), value=value)


def line_breaks(tokens: np.ndarray, newline_ids: np.ndarray) -> np.ndarray:
    """Indices ``i`` where a record (``"\\n" + record``) may go: right before a token that starts a line break, so
    the record gets a line of its own and the text after it keeps its own break and indentation (every index when
    no token does)."""
    before = np.nonzero(np.isin(tokens, newline_ids))[0]
    return before if len(before) else np.arange(len(tokens) + 1)


def newline_token_ids(tokenizer) -> np.ndarray:
    """The ids of every vocabulary token whose text starts with a line break (``"\\n"``, ``"\\n    "``, ...)."""
    vocab = tokenizer.get_vocab()
    ids = [i for i in vocab.values() if tokenizer.decode([i]).startswith("\n")]
    return np.asarray(sorted(ids), dtype=np.int64)


def recall_segment(
    rng: random.Random, text: np.ndarray, tokenizer, newline_ids: np.ndarray, mix: RecallMix
) -> tuple[np.ndarray, np.ndarray]:
    """``text`` (n,) token ids -> (n,) ids of the same length holding records and a question block, and (n,) bool:
    the answers' tokens. Fewer records are written when the segment is short."""
    n = len(text)
    record_t, question_t = rng.choice(STYLES)
    records = rng.randint(2, mix.max_records)
    keys: list[str] = []
    while len(keys) < records:  # unique keys
        key = random_key(rng)
        if key not in keys:
            keys.append(key)
    values = [random_value(rng) for _ in keys]
    encoded = [tokenizer("\n" + _fill(record_t, k, v), add_special_tokens=False)["input_ids"]
               for k, v in zip(keys, values)]  # fmt: skip
    while len(encoded) > 2 and sum(map(len, encoded)) > n // 4:  # records take at most a quarter of the segment
        encoded.pop(), keys.pop(), values.pop()
    asked = rng.sample(range(len(keys)), rng.randint(1, min(len(keys), mix.max_questions)))
    block, spans = "", []
    for i in asked:
        line = "\n" + _fill(question_t, keys[i], values[i])
        at = len(block) + line.rindex(values[i])
        spans.append((at, at + len(values[i])))
        block += line
    block += "\n"
    q_ids, q_answer = encode_answers(tokenizer, block, spans, flag="--recall-loss")
    room = n - len(q_ids) - sum(map(len, encoded))
    if room < len(encoded) + 1:
        raise ValueError(
            f"a recall segment of {n} tokens cannot hold {len(encoded)} records and {len(asked)} questions; use a "
            f"longer --seq-length (>= {MIN_SEGMENT_TOKENS} tokens per segment)"
        )
    body = text[:room]
    at = np.sort(rng.choices(line_breaks(body, newline_ids), k=len(encoded)))
    pieces, answer, prev = [], [], 0
    for where, ids in zip(at, encoded):
        pieces += [body[prev:where], np.asarray(ids, dtype=np.int64)]
        answer += [np.zeros(where - prev, bool), np.zeros(len(ids), bool)]
        prev = where
    pieces += [body[prev:], np.asarray(q_ids, dtype=np.int64)]
    answer += [np.zeros(room - prev, bool), np.asarray(q_answer, dtype=bool)]
    ids, trained = np.concatenate(pieces), np.concatenate(answer)
    assert len(ids) == n, (len(ids), n)
    return ids, trained


def recall_row(
    rng: random.Random, row: np.ndarray, tokenizer, newline_ids: np.ndarray, mix: RecallMix
) -> tuple[np.ndarray, np.ndarray]:
    """A natural ``row`` (row_length,) -> the same length with 1..3 recall segments, and which tokens train."""
    n = len(row)
    most = max(1, min(3, n // MIN_SEGMENT_TOKENS))
    count = rng.choices(range(1, most + 1), weights=[5, 3, 2][:most])[0]
    # count - 1 cuts, uniform among those that leave every segment MIN_SEGMENT_TOKENS or more
    slack = sorted(rng.randint(0, n - count * MIN_SEGMENT_TOKENS) for _ in range(count - 1))
    bounds = [0, *((i + 1) * MIN_SEGMENT_TOKENS + s for i, s in enumerate(slack)), n]
    ids, trained = [], []
    for a, b in zip(bounds, bounds[1:]):
        seg_ids, seg_trained = recall_segment(rng, np.asarray(row[a:b], dtype=np.int64), tokenizer, newline_ids, mix)
        ids.append(seg_ids)
        trained.append(seg_trained)
    out = np.concatenate(ids)
    mask = np.concatenate(trained)
    if mix.loss == "all":
        mask[:] = True
    return out, mask


class RecallMixer:
    """Replaces exactly ``round(fraction * total_rows)`` of a stream of rows with recall rows (each row chosen with
    probability (still to choose) / (rows left): selection sampling, O(1) memory), the same rows whether they come
    all at once (:func:`mix_recall_rows`) or block by block (the streamed path's ``apply``)."""

    def __init__(self, tokenizer, mix: RecallMix, seed: int | None, total_rows: int) -> None:
        self.tokenizer, self.mix = tokenizer, mix
        self.rng = random.Random(f"recall:{seed}")
        self.count = round(mix.fraction * total_rows)
        self.left, self.rows_left = self.count, total_rows
        self.newline_ids = newline_token_ids(tokenizer)

    @property
    def labels(self) -> bool:
        """Whether the output gets a ``labels`` column (recall rows trained on their answers only)."""
        return self.count > 0 and self.mix.loss != "all"

    def apply(self, rows: np.ndarray) -> np.ndarray | None:
        """Rewrite the chosen rows of ``rows`` (rows, row_length) in place; return which tokens train (None: all)."""
        trained = np.ones(rows.shape, dtype=bool)
        for i in range(len(rows)):
            if self.left and self.rng.random() * self.rows_left < self.left:
                self.left -= 1
                row, trained[i] = recall_row(self.rng, rows[i], self.tokenizer, self.newline_ids, self.mix)
                rows[i] = row.astype(rows.dtype)
            self.rows_left -= 1
        return None if trained.all() else trained


def mix_recall_rows(
    rows: np.ndarray, tokenizer, mix: RecallMix, seed: int | None = 0
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Rewrite ``round(mix.fraction * len(rows))`` random rows of ``rows`` (rows, row_length) as recall rows.

    Returns the new array, a bool array of the same shape saying which tokens are trained on (None when every one
    is), and how many rows were rewritten."""
    mixer = RecallMixer(tokenizer, mix, seed, len(rows))
    if mixer.count == 0:
        return rows, None, 0
    out = rows.copy()
    return out, mixer.apply(out), mixer.count
