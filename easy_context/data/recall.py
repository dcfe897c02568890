"""Key-value recall rows: ordinary training text with records written into it at line breaks and, later in the
row, questions about them, trained on the answers only.

A format of its own, unlike ``eval_needle.py``'s prompts (and the needle rows of :mod:`easy_context.data.needles`)
and unlike RULER's (:mod:`easy_context.eval.ruler`): the keys are made-up two-part names (``"valkor-prime"``, never a
city, never a RULER word), the values digit strings of 4..9 digits or short letter-digit codes, and each segment
writes its records and questions in one of :data:`STYLES` (a registry line, code, JSON, a log line, a note with
Q/A, an arrow map), none of which is the needle's "special magic ... number" sentence or RULER's "special magic
{kind}" / ``VAR X = ...`` / ``Question: ... Answer:`` lines. The haystack is the row's own text (the training corpus,
not the essays), so what is learnt is to look up exact strings anywhere in the row, not a template.

What is asked (:data:`KINDS`; ``RecallMix.kinds`` picks which):
    ``single``: one key -> its value;
    ``many_keys``: 2..4 keys asked in one line -> their values in the order asked;
    ``many_values``: a key recorded 2..4 times with different values -> every value, in the order written;
    ``chain``: a value given to one key and passed on by copy records (``b`` gets the code of ``a``, ``c`` that of
        ``b``) -> every name that holds the value, in the order written (tracking through copies).
Every record of a segment is a distractor for the others (keys of one shape, values of one shape).

A row is cut into 1..3 segments (boundaries uniform); each segment gets its own records at random line breaks of
its text and ends with a block of questions about a random subset of them, each question followed by its answer.
Segment lengths, record positions and the questions' order are random, so answers sit at every distance the row
allows and questions at every position. Keys and values are unique within a row. The row keeps its length: the
segment's text is shortened by what the records and questions add. Which tokens train: the answers' (from the first
answer item to the last, separators included; ``RecallMix.loss="answer"``), or every token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from easy_context.data.needles import check_mix, encode_answers

KINDS = ("single", "many_keys", "many_values", "chain")


@dataclass(frozen=True)
class Style:
    """One format of records and questions. Placeholders: ``{key}`` / ``{ident}`` (a name as written / as an
    identifier), ``{value}``, ``{source}`` / ``{source_ident}`` (the name a copy record takes its value from), and the
    answer lists ``{keys}`` / ``{idents}`` / ``{values}`` (items in ``key_quote`` / ``value_quote``, joined by ", ").
    Every question template ends with its answer placeholder (and closing characters only)."""

    name: str
    record: str  # key -> value
    copy: str  # key -> the value of source
    single: str  # question: {key}/{ident} -> {value}
    many_keys: str  # question: {keys}/{idents} -> {values}
    many_values: str  # question: {key}/{ident} -> {values}
    holders: str  # question: {value} -> {keys}/{idents}
    key_quote: str = ""
    value_quote: str = ""


STYLES: tuple[Style, ...] = (
    Style("registry",
          record="registry: the access code of {key} is {value}",
          copy="registry: the access code of {key} is the one of {source}",
          single="lookup: the access code of {key} is {value}",
          many_keys="lookup: the access codes of {keys} are {values}",
          many_values="lookup: every access code of {key}, in order: {values}",
          holders="lookup: the names whose access code is {value}: {keys}"),
    Style("code",
          record='{ident} = "{value}"  # recall entry',
          copy="{ident} = {source_ident}  # recall entry",
          single='assert {ident} == "{value}"',
          many_keys="assert ({idents}) == ({values})",
          many_values="assert history({ident}) == [{values}]",
          holders='assert holders("{value}") == [{idents}]',
          value_quote='"'),
    Style("json",
          record='{{"name": "{key}", "code": "{value}"}},',
          copy='{{"name": "{key}", "code_of": "{source}"}},',
          single='query {{"name": "{key}"}} -> "{value}"',
          many_keys='query {{"names": [{keys}]}} -> [{values}]',
          many_values='query {{"name": "{key}", "all": true}} -> [{values}]',
          holders='query {{"code": "{value}"}} -> [{keys}]',
          key_quote='"', value_quote='"'),
    Style("log",
          record="[log] token issued to {key}: {value}",
          copy="[log] token of {source} also issued to {key}",
          single="[check] token issued to {key}? {value}",
          many_keys="[check] tokens issued to {keys}? {values}",
          many_values="[check] every token issued to {key}? {values}",
          holders="[check] who holds token {value}? {keys}"),
    Style("note",
          record="Note: {key} was given the code {value}.",
          copy="Note: {key} was given the same code as {source}.",
          single="Q: Which code was {key} given?\nA: {value}",
          many_keys="Q: Which codes were {keys} given?\nA: {values}",
          many_values="Q: List every code {key} was given.\nA: {values}",
          holders="Q: Who holds the code {value}?\nA: {keys}"),
    Style("arrow",
          record="* {key} => {value}",
          copy="* {key} => {source}",
          single="Where does {key} lead?\n{value}",
          many_keys="Where do {keys} lead?\n{values}",
          many_values="Everything {key} has led to:\n{values}",
          holders="What leads to {value}?\n{keys}"),
)  # fmt: skip


_SYLLABLES = (
    "ka", "vo", "ril", "zan", "tor", "mek", "sul", "dra", "pim", "qua", "nel", "gor", "bex", "lun", "fyr", "osk",
    "tal", "wen", "cri", "hum", "jad", "yel", "ux", "ber", "mol", "sti", "var", "ped", "kin", "zor",
)  # fmt: skip
_SUFFIXES = ("prime", "north", "delta", "seven", "amber", "core", "node", "gate", "field", "stone", "vale", "arc")
_CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
MIN_SEGMENT_TOKENS = 256
GROUP_P = {"many_values": 0.15, "chain": 0.15}  # chance that the next group of records is of this kind
MANY_KEYS_P = 0.4  # chance that an asked single key starts a question about 2..4 keys


@dataclass(frozen=True)
class RecallMix:
    """Which share of the rows become recall rows, how many records and questions each segment holds, what is asked
    (:data:`KINDS`) and what the rows train on."""

    fraction: float  # of the packed rows, 0..1
    max_records: int = 24  # record lines per segment: uniform in 2..max_records
    max_questions: int = 8  # questions per segment: uniform in 1..min(askable, max_questions)
    loss: str = "answer"  # "answer": a recall row trains on its answers only; "all": on every token
    kinds: tuple[str, ...] = field(default=KINDS)  # of questions: "single" and any of the others

    def __post_init__(self) -> None:
        check_mix("recall", self.fraction, self.loss)
        if self.max_records < 2:
            raise ValueError(f"recall records per segment must be >= 2, got {self.max_records}")
        if self.max_questions < 1:
            raise ValueError(f"recall questions per segment must be >= 1, got {self.max_questions}")
        object.__setattr__(self, "kinds", tuple(self.kinds))
        unknown = [q for q in self.kinds if q not in KINDS]
        if unknown or "single" not in self.kinds:
            raise ValueError(
                f"recall kinds must include 'single' and come from {', '.join(KINDS)}; got "
                f"{','.join(self.kinds) or 'none'}"
            )


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


def _fresh(rng: random.Random, draw, taken: set[str]) -> str:
    """``draw(rng)`` until it gives an item not in ``taken``; the item joins ``taken``."""
    while (item := draw(rng)) in taken:
        pass
    taken.add(item)
    return item


def _ident(key: str) -> str:
    """A key as an identifier: ``"zantor-delta"`` -> ``"zantor_delta"``."""
    return key.replace("-", "_")


@dataclass
class _Group:
    """Records that belong together: ``single`` (one key, one value), ``many_values`` (one key, several values) or
    ``chain`` (keys[0] gets the value, each next key copies the one before)."""

    kind: str
    keys: list[str]
    values: list[str]

    def lines(self, style: Style) -> list[str]:
        if self.kind == "chain":
            first = style.record.format(key=self.keys[0], ident=_ident(self.keys[0]), value=self.values[0])
            return [first] + [style.copy.format(key=k, ident=_ident(k), source=s, source_ident=_ident(s))
                              for s, k in zip(self.keys, self.keys[1:])]  # fmt: skip
        key = self.keys[0]
        return [style.record.format(key=key, ident=_ident(key), value=v) for v in self.values]


def _draw_groups(rng: random.Random, mix: RecallMix, taken: set[str]) -> list[_Group]:
    """2..max_records record lines as groups; keys and values not in ``taken`` (which gets them)."""
    groups, left = [], rng.randint(2, mix.max_records)
    while left > 0:
        kind, r = "single", rng.random()
        for name, p in GROUP_P.items():
            if name in mix.kinds and left >= 2 and r < p:
                kind = name
                break
            r -= p
        size = rng.randint(2, min(4, left)) if kind != "single" else 1
        keys = [_fresh(rng, random_key, taken) for _ in range(size if kind == "chain" else 1)]
        values = [_fresh(rng, random_value, taken) for _ in range(size if kind == "many_values" else 1)]
        groups.append(_Group(kind, keys, values))
        left -= size
    return groups


def _answer_line(template: str, field_name: str, items: list[str], quote: str, **ctx: str
                 ) -> tuple[str, tuple[int, int]]:  # fmt: skip
    """``template`` filled, the ``{field_name}`` placeholder (its last) as ``items`` quoted and joined by ", ", and
    the character span from the first item to the last."""
    before, after = template.split("{" + field_name + "}")
    text = before.format(**ctx)
    start = len(text) + len(quote)
    text += ", ".join(f"{quote}{item}{quote}" for item in items)
    return text + after.format(**ctx), (start, len(text) - len(quote))


def _questions(rng: random.Random, style: Style, groups: list[_Group], mix: RecallMix
               ) -> list[tuple[str, tuple[int, int]]]:  # fmt: skip
    """The question lines (without line breaks around them) and each one's answer span."""
    chosen = rng.sample(groups, rng.randint(1, min(len(groups), mix.max_questions)))
    lines, i = [], 0
    while i < len(chosen):
        g = chosen[i]
        key = g.keys[0]
        if g.kind == "single" and "many_keys" in mix.kinds and rng.random() < MANY_KEYS_P:
            run = [g]
            for h in chosen[i + 1 : i + rng.randint(2, 4)]:
                if h.kind != "single":
                    break
                run.append(h)
            if len(run) > 1:
                i += len(run)
                names = [h.keys[0] for h in run]
                keys = ", ".join(f"{style.key_quote}{k}{style.key_quote}" for k in names)
                lines.append(_answer_line(style.many_keys, "values", [h.values[0] for h in run], style.value_quote,
                                          keys=keys, idents=", ".join(map(_ident, names))))  # fmt: skip
                continue
        i += 1
        if g.kind == "single":
            lines.append(_answer_line(style.single, "value", g.values, "", key=key, ident=_ident(key)))
        elif g.kind == "many_values":
            lines.append(_answer_line(style.many_values, "values", g.values, style.value_quote, key=key,
                                      ident=_ident(key)))  # fmt: skip
        else:
            field_name = "idents" if "{idents}" in style.holders else "keys"
            names = g.keys if field_name == "keys" else [_ident(k) for k in g.keys]
            lines.append(_answer_line(style.holders, field_name, names, style.key_quote, value=g.values[0]))
    return lines


def _order(rng: random.Random, groups: list[_Group], encoded: list[list[list[int]]]) -> list[list[int]]:
    """Every group's encoded lines in a random interleaving that keeps each group's own order."""
    slots = [gi for gi, lines in enumerate(encoded) for _ in lines]
    rng.shuffle(slots)
    nxt = [0] * len(groups)
    out = []
    for gi in slots:
        out.append(encoded[gi][nxt[gi]])
        nxt[gi] += 1
    return out


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
    rng: random.Random,
    text: np.ndarray,
    tokenizer,
    newline_ids: np.ndarray,
    mix: RecallMix,
    taken: set[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``text`` (n,) token ids -> (n,) ids of the same length holding records and a question block, and (n,) bool:
    the answers' tokens. Fewer records are written when the segment is short. ``taken``: keys and values already
    used in the row (the segment's are added)."""
    n = len(text)
    style = rng.choice(STYLES)
    groups = _draw_groups(rng, mix, set() if taken is None else taken)
    encoded = [[tokenizer("\n" + line, add_special_tokens=False)["input_ids"] for line in g.lines(style)]
               for g in groups]  # fmt: skip
    size = sum(len(ids) for lines in encoded for ids in lines)
    while len(groups) > 1 and size > n // 4:  # records take at most a quarter of the segment
        size -= sum(map(len, encoded.pop()))
        groups.pop()
    records = _order(rng, groups, encoded)
    block, spans = "", []
    for line, (a, b) in _questions(rng, style, groups, mix):
        spans.append((len(block) + 1 + a, len(block) + 1 + b))
        block += "\n" + line
    block += "\n"
    q_ids, q_answer = encode_answers(tokenizer, block, spans, flag="--recall-loss")
    room = n - len(q_ids) - size
    if room < len(records) + 1:
        raise ValueError(
            f"a recall segment of {n} tokens cannot hold {len(records)} records and their questions; use a longer "
            f"--seq-length (>= {MIN_SEGMENT_TOKENS} tokens per segment)"
        )
    body = text[:room]
    at = np.sort(rng.choices(line_breaks(body, newline_ids), k=len(records)))
    pieces, answer, prev = [], [], 0
    for where, ids in zip(at, records):
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
    ids, trained, taken = [], [], set()
    for a, b in zip(bounds, bounds[1:]):
        seg_ids, seg_trained = recall_segment(rng, np.asarray(row[a:b], dtype=np.int64), tokenizer, newline_ids, mix,
                                              taken)  # fmt: skip
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
