"""Key-value recall rows (easy_context/data/recall.py), the code corpus builder and the side-by-side summary."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from easy_context.data import prepare_dataset
from easy_context.data.code_corpus import build_corpus
from easy_context.data.code_corpus import main as corpus_main
from easy_context.data.recall import KINDS, STYLES, RecallMix, newline_token_ids, recall_row, recall_segment
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.eval import compare
from easy_context.tasks.needle import NEEDLE, QUESTION

CODE = "\n".join(
    f"def function_{i}(x):\n    '''Return x plus {i}.'''\n    value = x + {i}\n    return value\n" for i in range(400)
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_byte_level_bpe([CODE, "registry lookup access code token issued query assert"], 600,
                                str(tmp_path_factory.mktemp("tok")))  # fmt: skip


def _row(tokenizer, n: int) -> np.ndarray:
    ids = np.asarray(tokenizer(CODE * 4, add_special_tokens=False)["input_ids"], dtype=np.int64)
    return ids[:n]


_FIELDS = {
    "key": "(?P<key>[a-z]+-[a-z]+)", "ident": "(?P<key>[a-z]+_[a-z]+)", "value": "(?P<value>[0-9A-Z]+)",
    "source": "(?P<source>[a-z]+-[a-z]+)", "source_ident": "(?P<source>[a-z]+_[a-z]+)",
    "keys": '(?P<keys>[a-z"_, -]+?)', "idents": '(?P<keys>[a-z"_, -]+?)', "values": '(?P<values>[0-9A-Z", ]+)',
}  # fmt: skip


def _pattern(template: str) -> re.Pattern:
    """A template of recall.STYLES as a regex over a whole line (names normalised by the oracle below)."""
    t = template.replace("{{", "\x00").replace("}}", "\x01")  # literal braces out of the way
    out, i = "", 0
    for m in re.finditer(r"\{(\w+)\}", t):
        out += re.escape(t[i : m.start()]) + _FIELDS[m.group(1)]
        i = m.end()
    out = (out + re.escape(t[i:])).replace("\x00", "\\{").replace("\x01", "\\}")
    return re.compile("^" + out + "$", re.M)


def _items(text: str) -> list[str]:
    return [s.strip().strip('"').replace("_", "-") for s in text.split(",")]


def _oracle(text: str) -> dict[str, int]:
    """Answer every question of a recall row from the records above it, in every style; count what was checked."""
    counts = dict.fromkeys(["records", "copies", *KINDS], 0)
    for style in STYLES:
        values: dict[str, list[str]] = {}  # name -> every value it was given, in order
        order: list[tuple[int, str]] = []  # (where, name) of every record
        events = []
        for kind in ("record", "copy", "single", "many_keys", "many_values", "holders"):
            events += [(m.start(), kind, m) for m in _pattern(getattr(style, kind)).finditer(text)]
        for at, kind, m in sorted(events, key=lambda e: e[0]):
            g = m.groupdict()
            key = g.get("key") and g["key"].replace("_", "-")
            if kind == "record":
                values.setdefault(key, []).append(g["value"])
                order.append((at, key))
                counts["records"] += 1
            elif kind == "copy":
                source = g["source"].replace("_", "-")
                assert len(values[source]) == 1 and key not in values  # a copy of a key recorded once, earlier
                values[key] = list(values[source])
                order.append((at, key))
                counts["copies"] += 1
            elif kind == "single":
                assert values[key] == [g["value"]]
                counts["single"] += 1
            elif kind == "many_keys":
                keys, answers = _items(g["keys"]), _items(g["values"])
                assert 2 <= len(keys) == len(answers) <= 4
                assert [values[k] for k in keys] == [[a] for a in answers]
                counts["many_keys"] += 1
            elif kind == "many_values":
                assert values[key] == _items(g["values"]) and len(values[key]) >= 2
                counts["many_values"] += 1
            else:
                holders = [k for _, k in order if values[k] == [g["value"]]]
                assert _items(g["keys"]) == holders and len(holders) >= 2
                counts["chain"] += 1
    return counts


@pytest.mark.parametrize("kinds", [KINDS, ("single",)])
def test_recall_row_answers_are_recoverable_and_format_is_not_the_needle(tokenizer, kinds):
    """An oracle answers every question from the records above it (1.0); the answers are what trains; no template of
    the needle eval or of RULER appears; keys are unique in a row; every kind of question is asked."""
    newline = newline_token_ids(tokenizer)
    assert len(newline) > 0
    total = dict.fromkeys(["records", "copies", *KINDS], 0)
    for seed in range(12):
        rng = random.Random(seed)
        row = _row(tokenizer, 2049)
        out, trained = recall_row(rng, row, tokenizer, newline, RecallMix(1.0, kinds=kinds))
        assert out.shape == row.shape and trained.shape == row.shape
        assert 0 < trained.sum() < 300
        text = tokenizer.decode(out)
        for foreign in ("special magic", NEEDLE.split("{")[0], QUESTION.split("{")[0], "Question:", "Answer:", "VAR "):
            assert foreign not in text
        counts = _oracle(text)
        assert counts["records"] >= 2 and sum(counts[q] for q in KINDS) >= 1
        total = {k: total[k] + v for k, v in counts.items()}
        # the trained tokens are the answers, in the question block(s)
        answers = tokenizer.decode(out[trained])
        assert answers and all(c.isalnum() or c in ' ,-_"' for c in answers)
    asked = {q for q in KINDS if total[q]}
    assert asked == set(kinds), total
    assert (total["copies"] > 0) == ("chain" in kinds)


def test_recall_kinds_refused_with_the_choices():
    with pytest.raises(ValueError, match="kinds must include 'single'"):
        RecallMix(0.5, kinds=("chain",))
    with pytest.raises(ValueError, match="single, many_keys, many_values, chain"):
        RecallMix(0.5, kinds=("single", "riddles"))


def test_recall_segment_too_short_names_the_fix(tokenizer):
    with pytest.raises(ValueError, match="longer --seq-length"):
        recall_segment(random.Random(0), _row(tokenizer, 12), tokenizer, newline_token_ids(tokenizer),
                       RecallMix(1.0, max_records=30))  # fmt: skip


@pytest.mark.parametrize("streaming", [False, True])
def test_prepare_dataset_recall_rows(tokenizer, tmp_path, streaming):
    docs = [CODE[i * 3000 : (i + 1) * 3000] for i in range(12)] * 3
    ds = prepare_dataset(docs, tokenizer, 1024, output_dir=str(tmp_path / "d"), show_progress=False,
                         recall=RecallMix(0.5), streaming=streaming, max_memory_gb=0.05)  # fmt: skip
    meta = json.loads(ds.info.description)
    assert meta["recall_rows"] == round(0.5 * len(ds)) > 0
    labels = np.asarray(ds["labels"])
    ids = np.asarray(ds["input_ids"])
    recall = (labels == -100).any(axis=1)
    assert recall.sum() == meta["recall_rows"]
    assert (labels[~recall] == ids[~recall]).all()  # the other rows train on every token
    kept = labels[recall] != -100
    assert 0 < kept.sum() < 0.1 * kept.size and (labels[recall][kept] == ids[recall][kept]).all()


def test_recall_rejects_needles_and_document_packing(tokenizer):
    from easy_context.data.needles import NeedleMix

    with pytest.raises(ValueError, match="not both"):
        prepare_dataset([CODE], tokenizer, 512, recall=RecallMix(0.5), needles=NeedleMix(0.5), show_progress=False)
    with pytest.raises(ValueError, match="--pack concat"):
        prepare_dataset([CODE], tokenizer, 512, recall=RecallMix(0.5), pack="documents", show_progress=False)
    with pytest.raises(ValueError, match="recall fraction"):
        RecallMix(1.5)


def test_code_corpus(tmp_path):
    root = tmp_path / "site"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "a.py").write_text("def a():\n    return 1\n" * 50)
    (root / "pkg" / "tests" / "test_a.py").write_text("assert False\n")
    (root / "single.py").write_text("print('single')\n")
    docs = list(build_corpus([str(root)], 10**9, 400, 10**6))
    text = "".join(docs)
    assert "# ===== file: pkg/__init__.py =====" in text and "pkg/sub/a.py" in text and "single.py" in text
    assert "test_a" not in text
    assert len(docs) >= 3  # pkg is cut at file boundaries every 400 characters
    out = tmp_path / "code.jsonl"
    assert corpus_main(["--root", str(root), "--output", str(out)]) == 0
    assert [json.loads(line)["text"] for line in out.read_text().splitlines()]


def _write_eval(folder, accuracy: dict[int, float], ppl: dict[int, float], needle: str = "needle") -> None:
    (folder / needle).mkdir(parents=True)
    lines = ["length,depth,sample,correct"]
    for length, acc in accuracy.items():
        for depth in (0, 50, 100):
            for sample in range(2):
                lines.append(f"{length},{depth},{sample},{int(sample < 2 * acc)}")
    (folder / needle / "results.csv").write_text("\n".join(lines) + "\n")
    if ppl:
        rows = ["model,tokens,ppl"] + [f"m,{n},{p}" for n, p in ppl.items()]
        (folder / "ppl.csv").write_text("\n".join(rows) + "\n")


def test_compare_summary(tmp_path):
    _write_eval(tmp_path / "base", {8192: 1.0, 16384: 0.0}, {2048: 20.0, 16384: 300.0})
    _write_eval(tmp_path / "extended", {8192: 1.0, 16384: 0.5}, {2048: 21.0, 16384: 22.0})
    # the needle beyond the trained length, as is and with YaRN at inference (extend_smollm2.sh's LONG)
    _write_eval(tmp_path / "extended", {24576: 0.5, 32768: 0.0}, {}, needle="long_none")
    _write_eval(tmp_path / "extended", {24576: 1.0, 32768: 0.5}, {}, needle="long_yarn_2_16384")
    (tmp_path / "extended" / "ruler").mkdir()  # another evaluation's results.csv is not a needle's
    (tmp_path / "extended" / "ruler" / "results.csv").write_text("task,length,score\nvt,8192,0.5\n")
    out = tmp_path / "out"
    assert compare.main(["--model", f"base={tmp_path / 'base'}", "--model", f"extended={tmp_path / 'extended'}",
                         "--base-length", "8192", "--target-length", "16384", "--output", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    base, ext = summary["models"]["base"]["needle"], summary["models"]["extended"]["needle"]
    assert base["within"] == 1.0 and base["beyond"] == 0.0 and ext["beyond"] == 0.5
    assert summary["models"]["extended"]["ppl"]["16384"] == 22.0
    assert "| extended |" in (out / "summary.md").read_text()
    long = summary["models"]["extended"]["needle_long"]
    assert long["as trained"]["by_length"] == {"24576": 0.5, "32768": 0.0}
    assert long["yarn:2:16384"]["by_length"] == {"24576": 1.0, "32768": 0.5} and long["yarn:2:16384"]["prompts"] == 12
    assert summary["models"]["base"]["needle_long"] is None
    assert "| extended | yarn:2:16384 | 1.00 / 0.50 | 0.75 | 0.50 at 32K/0% |" in (out / "summary.md").read_text()
    assert (out / "comparison.png").stat().st_size > 10_000
    # the second heatmap names its model: --after picks it (here the first, base), an unknown name is refused
    args = ["--model", f"base={tmp_path / 'base'}", "--model", f"extended={tmp_path / 'extended'}",
            "--base-length", "8192", "--target-length", "16384"]  # fmt: skip
    assert compare.main([*args, "--after", "base", "--output", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2" / "comparison.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        compare.main([*args, "--after", "extended_131072", "--output", str(tmp_path / "o3")])


def test_code_corpus_and_compare_refuse_bad_input(tmp_path, capsys):
    """A missing --root, a root without sources, a --model without NAME=DIR: one line each, naming the fix."""
    with pytest.raises(SystemExit):
        corpus_main(["--root", str(tmp_path / "nope"), "--output", str(tmp_path / "c.jsonl")])
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert corpus_main(["--root", str(tmp_path / "empty"), "--output", str(tmp_path / "c.jsonl")]) == 1
    assert "no packages or .py files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.main(["--model", str(tmp_path), "--base-length", "8", "--target-length", "16", "--output", "o"])
    assert "expected NAME=DIR" in capsys.readouterr().err
