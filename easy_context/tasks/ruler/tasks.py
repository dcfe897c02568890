"""RULER's task definitions: one :class:`RulerTask` per task with the parameters of NVIDIA's ``synthetic.yaml``
(main c3f5e3b), the prompt record :class:`RulerCase`, and the types the task families share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

LONG = 4096  # from here on CWE uses its full frequencies and 40-word example (shorter prompts: 6 / 1 and 20 words)


@dataclass(frozen=True)
class RulerTask:
    """One task's definition (RULER's ``synthetic.yaml`` parameters)."""

    name: str
    kind: str  # "niah" | "vt" | "cwe" | "fwe"
    max_new_tokens: int  # RULER's tokens_to_generate: reserved in the prompt's budget, the generation budget
    haystack: str = "essay"  # niah: noise | essay | needles
    keys: str = "words"  # niah: words | uuids
    values: str = "numbers"  # niah: numbers | words | uuids
    num_keys: int = 1  # niah: needles of different keys (the first num_queries are asked)
    num_values: int = 1  # niah: values per key
    num_queries: int = 1
    chains: int = 1  # vt
    hops: int = 4
    top: int = 10  # cwe: how many common words are asked
    common_freq: int = 30  # cwe: occurrences of each common word ...
    rare_freq: int = 3  # ... and of each other one
    alpha: float = 2.0  # fwe: Zipf exponent
    in_average: bool = True  # one of RULER's tasks (the average and the effective length use those)

    @property
    def needs_essays(self) -> bool:
        return self.kind == "niah" and self.haystack == "essay"

    @property
    def needs_word_lists(self) -> bool:
        """English words (the wonderwords lists): word keys or values, or CWE's list."""
        return self.kind == "cwe" or (self.kind == "niah" and "words" in (self.keys, self.values))

    @property
    def singular(self) -> bool:
        """One value asked: RULER words the prompt in the singular."""
        return self.kind == "niah" and self.num_queries * self.num_values == 1


TASKS: dict[str, RulerTask] = {t.name: t for t in (
    RulerTask("niah_single_1", "niah", 128, haystack="noise"),
    RulerTask("niah_single_2", "niah", 128),
    RulerTask("niah_single_3", "niah", 128, values="uuids"),
    RulerTask("niah_multikey_1", "niah", 128, num_keys=4),
    RulerTask("niah_multikey_2", "niah", 128, haystack="needles"),
    RulerTask("niah_multikey_3", "niah", 128, haystack="needles", keys="uuids", values="uuids"),
    RulerTask("niah_multivalue", "niah", 128, num_values=4),
    RulerTask("niah_multiquery", "niah", 128, num_keys=4, num_queries=4),
    RulerTask("vt", "vt", 30),
    RulerTask("cwe", "cwe", 120),
    RulerTask("fwe", "fwe", 50),
    RulerTask("niah_single_words", "niah", 128, values="words", in_average=False),
)}  # fmt: skip
DEFAULT_TASKS = tuple(name for name, task in TASKS.items() if task.in_average)
RULER_TASK_COUNT = 13  # RULER's tasks: the 11 above in the average and its 2 QA tasks


@dataclass
class RulerCase:
    """One prompt: the full model input ``text`` (ends with the answer prefix), what the output must contain."""

    task: str
    length: int  # the target: prompt tokens + max_new_tokens <= length
    sample: int
    text: str
    answers: list[str]
    max_new_tokens: int  # RULER's tokens_to_generate for the task
    units: int  # haystack units that fit (lines, essay words, list words, coded words)
    deviation: str = ""  # where a prompt too short for RULER's setting had to use a smaller one
    sizing: str = "ruler"  # how the haystack was sized (SIZINGS)


Count = Callable[[str], int]
Render = Callable[[int], tuple[str, str, list[str]]]  # units -> (prompt body, answer prefix, answers)


def unit_name(task: RulerTask) -> str:
    """What one haystack unit of ``task`` is (the audit file's ``units``)."""
    if task.kind == "niah":
        return {"essay": "essay words", "noise": "noise lines", "needles": "needle lines"}[task.haystack]
    return {"vt": "noise lines", "cwe": "other words", "fwe": "coded words"}[task.kind]
