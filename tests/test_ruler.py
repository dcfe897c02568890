"""eval_ruler.py (easy_context/eval/ruler): every task's answer is recoverable from its prompt by a rule (an oracle
scores 1.0), keys are unique, prompts hit their token target, prompts are reproducible from the seed; a random-init
model scores near 0; and the same prompts give the same generated answers under data_parallel and every SP mode."""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from easy_context.eval.ruler import DEFAULT_TASKS, TASKS, make_case, string_match_all
from easy_context.eval.ruler.fit import largest_fitting
from easy_context.eval.ruler.scoring import averages, effective_length
from easy_context.eval.run_ruler import parse_args

ESSAY = (
    "How do you find a good idea? Look at what seems missing. Most startups begin that way, and the founders were "
    "often their own first users! Work on what you would want yourself. That is the test."
)


def _training_text() -> list[str]:
    rng = random.Random(0)
    from easy_context.eval.ruler.tasks import NOISE

    parts = [ESSAY * 20, " ".join(NOISE) * 20]
    for task in TASKS.values():  # the tasks' own vocabulary, so the BPE is not pure bytes
        case = make_case(task, 4000, rng.randint(0, 99), len, lambda b, p: b + p, ESSAY.split())
        parts.append(case.text)
    return parts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from easy_context.data.tokenizer import train_byte_level_bpe

    return train_byte_level_bpe(_training_text(), 600, str(tmp_path_factory.mktemp("ruler_tok")))


def _count(tokenizer):
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _plain(body: str, prefix: str) -> str:
    return body + prefix


def oracle(task_name: str, text: str) -> str:
    """The answer by rule from the prompt text alone (what a perfect reader outputs)."""
    task = TASKS[task_name]
    if task.kind == "niah":
        needles = re.findall(r"One of the special magic \w+ for (\S+) is: (\S+?)\.(?= |$|\n)", text)
        keys = [k for k, _ in needles]
        assert len({v for _, v in needles}) == len(needles), "a value occurs twice"
        query = re.search(r"What are all the special magic \w+ for (.+?) mentioned in the provided text\?", text)[1]
        asked = [q.strip() for q in re.split(r", and |, ", query)]
        by_key: dict[str, list[str]] = {}
        for key, value in needles:
            by_key.setdefault(key, []).append(value)
        if task.num_values == 1:  # keys of single-value needles are unique over the whole haystack
            assert len(keys) == len(set(keys)), "a key occurs twice"
        return ", ".join(v for key in asked for v in by_key[key])
    if task.kind == "vt":
        value = re.search(r"assigned the value (\d+) in the text above", text)[1]
        binds = dict(re.findall(r"VAR ([A-Z]{5}) = (\d+|VAR [A-Z]{5})\.", text))
        held = {name for name, rhs in binds.items() if rhs == value}
        while True:  # follow the chain
            more = {name for name, rhs in binds.items() if rhs.startswith("VAR ") and rhs[4:] in held} - held
            if not more:
                return " ".join(sorted(held))
            held |= more
    if task.kind == "cwe":
        words = re.findall(r"\d+\. ([a-z]+)", text.split("Question:")[0])
        counts = Counter(words).most_common()
        assert counts[task.top - 1][1] > counts[task.top][1], "the common words are not unambiguous"
        return " ".join(w for w, _ in counts[: task.top])
    words = text.split("appeared coded words.\n")[1].split("\nQuestion:")[0].split()
    counts = Counter(words).most_common()
    assert counts[task.top - 1][1] > counts[task.top][1], "the most frequent words are not unambiguous"
    return " ".join(w for w, _ in counts[: task.top])


@pytest.mark.parametrize("task_name", list(TASKS))
def test_every_answer_is_recoverable_and_prompts_hit_their_length(tokenizer, task_name):
    count = _count(tokenizer)
    task = TASKS[task_name]
    for length, sample in [(1024, 0), (1024, 1), (4096, 0)]:
        case = make_case(task, length, sample, count, _plain, ESSAY.split(), seed=3)
        assert string_match_all(oracle(task_name, case.text), case.answers) == 1.0
        assert len(case.answers) == len(set(case.answers))
        tokens = count(case.text)
        again = make_case(task, length, sample, count, _plain, ESSAY.split(), seed=3)
        assert (again.text, again.answers) == (case.text, case.answers), "not reproducible from the seed"
        assert tokens <= length
        if length >= 4096:  # within 1% of the target (one haystack unit; UUID needles are ~1% of 4K tokens)
            assert tokens >= 0.985 * length, (tokens, length)
    other = make_case(task, 1024, 1, count, _plain, ESSAY.split(), seed=4)
    assert other.text != case.text and other.answers != case.answers


def test_the_haystack_is_what_each_task_says():
    plain = make_case(TASKS["niah_single_1"], 800, 0, len, _plain)
    assert "The grass is green." in plain.text and "startups" not in plain.text
    essay = make_case(TASKS["niah_single_2"], 800, 0, len, _plain, ESSAY.split())
    assert "startups" in essay.text and "The grass is green." not in essay.text
    needles = make_case(TASKS["niah_multikey_2"], 2000, 0, len, _plain)
    assert len(re.findall("One of the special magic numbers", needles.text)) > 10
    uuids = make_case(TASKS["niah_multikey_3"], 2000, 0, len, _plain)
    assert re.search(r"for [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12} is", uuids.text)
    multi = make_case(TASKS["niah_multivalue"], 800, 0, len, _plain, ESSAY.split())
    assert len(multi.answers) == 4
    with pytest.raises(ValueError, match="--haystack_dir"):
        make_case(TASKS["niah_single_2"], 800, 0, len, _plain)
    with pytest.raises(ValueError, match="longer length"):
        make_case(TASKS["niah_single_1"], 64, 0, len, _plain)


def test_size_search_finds_the_largest_fitting_size():
    for per, base, target in [(3, 10, 1000), (7, 100, 100), (1, 0, 5), (13, 50, 40_000)]:
        calls = []

        def count(n, per=per, base=base, calls=calls):
            calls.append(n)
            return base + per * n + (n // 5)  # not exactly linear

        n = largest_fitting(count, target)
        assert count(n) <= target < count(n + 1)
        assert len(calls) <= 16
    with pytest.raises(ValueError, match="longer length"):
        largest_fitting(lambda n: 100 + n, 50)


def test_effective_length_and_average():
    scores = {"a": {1: 1.0, 2: 0.9, 4: 0.5, 8: 0.9}, "b": {1: 0.8, 2: 0.7, 4: 0.5, 8: 0.9}}
    average = averages(scores, ["a", "b"])
    assert average == pytest.approx({1: 0.9, 2: 0.8, 4: 0.5, 8: 0.9})
    assert effective_length(average, 0.8) == 2  # stops at the first length below: 8 does not count
    assert effective_length(average, 0.95) == 0


@pytest.mark.parametrize(
    "argv,message",
    [(["--tasks", "niah_single_9"], "unknown task"), (["--lengths", "12"], "lengths must be >= 64"),
     (["--threshold", "85"], "score in \\[0, 1\\]"), (["--threshold_from", "/nonexistent.json"], "no such file")],
)  # fmt: skip
def test_bad_arguments_name_the_fix(argv, message, capsys):
    """Each bad argument stops before any model is loaded, with one line naming the fix."""
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny-llama", "--tokenizer", "x", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_threshold_from_a_run_without_its_native_length_is_refused_up_front(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"native_length": 8192, "native_score": None}))
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    for path, message in [(results, "no score at a native length.*8192.*--threshold"), (garbled, "not a results.json")]:
        with pytest.raises(SystemExit):
            parse_args(["--model", "tiny-llama", "--tokenizer", "x", "--threshold_from", str(path)])
        assert re.search(message, capsys.readouterr().err)
    results.write_text(json.dumps({"native_length": 8192, "native_score": 0.8}))
    assert parse_args(["--model", "tiny-llama", "--tokenizer", "x", "--threshold_from", str(results)]).threshold_from


def ruler_worker(rank, world, model_dir, out_dir, mode, options, lengths):
    os.environ["ACCELERATE_USE_CPU"] = "1"  # accelerate inside the pool's already-initialised gloo ranks
    from easy_context.eval.run_ruler import main

    argv = ["--model", model_dir, "--lengths", lengths, "--num_samples", "1", "--tasks", "all",
            "--haystack_dir", str(Path(model_dir) / "essays"), "--max_new_tokens", "6", "--output-dir", out_dir,
            "--parallel_mode", mode, "--dtype", "float32", *options]  # fmt: skip
    main(argv)
    return rank


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    from tests.gguf_writer import tiny_llama

    root = tmp_path_factory.mktemp("ruler_model")
    model = tiny_llama(tokenizer)  # max_position_embeddings 512: the native length
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    (root / "essays").mkdir()
    (root / "essays" / "essay.txt").write_text(ESSAY)
    return root


MODES = [("data_parallel", 2, []), ("zigzag_ring_attn", 2, []), ("dist_flash_attn", 3, []), ("ulysses_attn", 2, []),
         ("usp_attn", 2, ["--ring_degree", "2"])]  # fmt: skip


def test_same_answers_under_every_sp_mode_and_random_init_scores_near_zero(dist_pool, tiny_dir, tmp_path):
    results = {}
    for mode, world, options in [("data_parallel", 1, []), *MODES]:
        out = tmp_path / f"{mode}{world}"
        lengths = "512,768" if world == 1 else "768"  # the reference: both (effective length); SP modes: the longer
        dist_pool(world).run(ruler_worker, str(tiny_dir), str(out), mode, options, lengths, timeout=600)
        results[(mode, world)] = json.loads((out / "results.json").read_text())
    reference = results[("data_parallel", 1)]
    assert {r["task"] for r in reference["rows"]} == set(TASKS) and len(reference["rows"]) == 2 * len(TASKS)
    assert all(r["new_tokens"] > 0 for r in reference["rows"])
    assert max(reference["average"].values()) <= 0.1, reference["average"]  # random init: near 0
    assert reference["average_tasks"] == list(DEFAULT_TASKS)
    assert reference["native_length"] == 512 and reference["effective_length"] is not None
    for (mode, world), summary in results.items():
        assert summary["parallel_mode"] == mode and summary["processes"] == world
        got = [(r["task"], r["length"], r["output"], r["prompt_tokens"]) for r in summary["rows"]]
        want = [(r["task"], r["length"], r["output"], r["prompt_tokens"]) for r in reference["rows"]
                if world == 1 or r["length"] == 768]  # fmt: skip
        assert got == want, f"{mode} on {world} processes generated other answers"
    assert (tmp_path / "zigzag_ring_attn2" / "ruler.png").stat().st_size > 10_000
    assert "| **average** |" in (tmp_path / "zigzag_ring_attn2" / "summary.md").read_text()
