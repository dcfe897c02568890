"""Data preparation: sources, tokenizer training, packing/upsampling, prepared datasets, the CLI, fetch.py.

Hermetic: synthetic text in temporary folders, no network (fetch.py is only exercised on its no-op path).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections import Counter

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

from easy_context.data import (  # noqa: E402
    load_documents,
    load_tokenizer,
    load_train_dataset,
    pack_documents,
    pack_stats,
    prepare_dataset,
    train_byte_level_bpe,
)
from easy_context.data.packing import pack_to_array  # noqa: E402
from tests.support import zygote  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EOS = 0


def synthetic_text(n_words: int, seed: int) -> str:
    """Pseudo-English: words from a fixed syllable set, sentences and paragraphs."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "so", "vi", "de", "pa", "qu", "ex", "th", "an", "or"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(n_words)]
    out = []
    for i, w in enumerate(words):
        out.append(w.capitalize() if i % 9 == 0 else w)
        out.append(".\n" if i % 9 == 8 else " ")
    return "".join(out)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return train_byte_level_bpe((synthetic_text(400, s) for s in range(20)), 300, str(out))


@pytest.fixture
def text_dir(tmp_path):
    """A folder of small .txt files (nested) plus a .jsonl; 13 documents in all."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for i in range(6):
        (root / f"doc{i}.txt").write_text(synthetic_text(150 + 40 * i, i), encoding="utf-8")
    for i in range(3):
        (root / "sub" / f"more{i}.txt").write_text(synthetic_text(120, 100 + i), encoding="utf-8")
    lines = [json.dumps({"text": synthetic_text(80, 200 + i)}) for i in range(4)]
    (root / "sub" / "extra.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "notes.md").write_text("ignored", encoding="utf-8")
    return root


# ----------------------------------------------------------------------------- packing


def eos_stream(docs: list[list[int]]) -> list[int]:
    return [t for d in docs for t in [*d, EOS]]


@pytest.mark.parametrize("seq_length", [1, 4, 7, 16])
def test_pack_in_order_is_prefix_of_eos_stream(seq_length):
    rng = random.Random(seq_length)
    docs = [[rng.randint(1, 99) for _ in range(rng.randint(0, 12))] for _ in range(15)]
    rows = pack_documents(docs, seq_length, EOS, seed=None)
    stream = eos_stream(docs)
    assert all(len(r) == seq_length + 1 for r in rows)
    assert len(rows) == len(stream) // (seq_length + 1)
    flat = [t for r in rows for t in r]
    assert flat == stream[: len(flat)]
    assert len(stream) - len(flat) < seq_length + 1  # only an incomplete tail is dropped


def test_pack_appends_one_eos_per_document():
    docs = [[1, 2, 3], [4], [5, 6], []]  # 4 + 2 + 3 + 1 = 10 tokens: rows of 5, nothing dropped
    rows = pack_documents(docs, 4, EOS, seed=None)
    assert rows == [[1, 2, 3, EOS, 4], [EOS, 5, 6, EOS, EOS]]


def test_pack_too_little_data_gives_no_rows():
    assert pack_documents([[1, 2]], 8, EOS) == []


def test_upsampling_repeats_only_long_documents():
    # short docs: 1 token (+EOS = 2), long docs: 5 tokens (+EOS = 6); rows of 2 tokens, so nothing is dropped
    short = [[10 + i] for i in range(6)]
    long = [[50 + i] * 5 for i in range(4)]
    docs = short + long
    rows, stats = pack_to_array(docs, 1, EOS, long_doc_tokens=5, upsample_factor=3, seed=7)
    counts = Counter(rows.reshape(-1).tolist())
    assert stats.dropped_tokens == 0
    assert stats.documents == 10 and stats.long_documents == 4 and stats.packed_documents == 6 + 4 * 3
    assert all(counts[10 + i] == 1 for i in range(6))
    assert all(counts[50 + i] == 5 * 3 for i in range(4))
    assert counts[EOS] == 6 + 4 * 3
    # the threshold is inclusive and counts document tokens without the EOS
    _, at_threshold = pack_to_array(docs, 1, EOS, long_doc_tokens=6, upsample_factor=3)
    assert at_threshold.long_documents == 0 and at_threshold.packed_documents == 10


def test_shuffle_is_deterministic_and_keeps_documents_whole():
    docs = [[i + 1] * 3 for i in range(40)]  # every doc + EOS fills exactly one row of 4
    a = pack_documents(docs, 3, EOS, seed=1)
    assert a == pack_documents(docs, 3, EOS, seed=1)
    assert a != pack_documents(docs, 3, EOS, seed=2)
    assert a != pack_documents(docs, 3, EOS, seed=None)
    assert sorted(a) == sorted(pack_documents(docs, 3, EOS, seed=None))  # a permutation of whole documents
    assert pack_documents(iter(docs), 3, EOS, seed=1) == a  # any iterable works


def test_pack_argument_errors():
    with pytest.raises(ValueError, match="seq_length"):
        pack_documents([[1]], 0, EOS)
    with pytest.raises(ValueError, match="long_doc_tokens"):
        pack_documents([[1]], 4, EOS, upsample_factor=2)
    with pytest.raises(ValueError, match="upsample_factor"):
        pack_documents([[1]], 4, EOS, long_doc_tokens=2, upsample_factor=0)
    with pytest.raises(ValueError, match="eos"):
        pack_documents([[1]], 4, None)


# ----------------------------------------------------------------------------- sources


def test_txt_file_is_one_document(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("héllo\nwörld\n", encoding="utf-8")
    assert list(load_documents(str(path))) == ["héllo\nwörld\n"]


def test_jsonl_reads_text_field_and_reports_bad_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one", "id": 1}\n\n{"text": "two"}\n{"text": ""}\n', encoding="utf-8")
    assert list(load_documents(str(path))) == ["one", "two"]
    path.write_text('{"text": "one"}\n{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"d.jsonl:2: .*'text'"):
        list(load_documents(str(path)))
    path.write_text('{"text": "one"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"d.jsonl:2: not valid JSON"):
        list(load_documents(str(path)))


def test_directory_is_recursive_and_sorted(text_dir):
    read = lambda *parts: text_dir.joinpath(*parts).read_text(encoding="utf-8")
    jsonl = [json.loads(line)["text"] for line in read("sub", "extra.jsonl").splitlines()]
    expected = [read(f"doc{i}.txt") for i in range(6)] + jsonl + [read("sub", f"more{i}.txt") for i in range(3)]
    assert list(load_documents(str(text_dir))) == expected  # notes.md is ignored


def test_save_to_disk_text_column(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a b", "", "c d e"], "meta": [1, 2, 3]})
    ds.save_to_disk(str(tmp_path / "flat"))
    assert list(load_documents(str(tmp_path / "flat"))) == ["a b", "c d e"]
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    assert list(load_documents(str(tmp_path / "dict"))) == ["a b", "c d e"]
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "notext"))
    with pytest.raises(ValueError, match="no 'text' column"):
        list(load_documents(str(tmp_path / "notext")))


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(load_documents(str(tmp_path / "missing.txt")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .txt or .jsonl files"):
        list(load_documents(str(tmp_path / "empty")))
    (tmp_path / "blank.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="no non-empty documents"):
        list(load_documents(str(tmp_path / "blank.txt")))


def test_hub_name_offline_error_suggests_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="pass a local path"):
        list(load_documents("no-such-user/no-such-dataset"))


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_and_reloads(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    text = "Kalo mine ruta.\n\n  Tabs\tand ünïcödé 😀 survive, as do unseen words: zyxwv!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 300
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    reloaded = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert reloaded.eos_token_id == tokenizer.eos_token_id
    assert load_tokenizer(tokenizer.name_or_path).decode(ids) == text
    with pytest.raises(ValueError, match="too small"):
        train_byte_level_bpe(["abc"], 100, str(tmp_path / "small"))


def test_load_tokenizer_error_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="--train-tokenizer"):
        load_tokenizer(str(tmp_path))  # a folder without tokenizer files


# ----------------------------------------------------------------------------- prepared datasets


def test_prepare_save_and_load_train_dataset(text_dir, tokenizer, tmp_path):
    out = str(tmp_path / "prepared")
    ds = prepare_dataset(str(text_dir), tokenizer, 32, output_dir=out, show_progress=False)
    assert ds.column_names == ["input_ids"] and len(ds) > 10
    assert all(len(r) == 33 for r in ds["input_ids"])
    stats = pack_stats(ds)
    assert stats.documents == 13 and stats.rows == len(ds)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in load_documents(str(text_dir))]
    assert stats.tokens == sum(len(i) + 1 for i in ids)
    assert ds["input_ids"] == pack_documents(ids, 32, tokenizer.eos_token_id, seed=0)

    train = load_train_dataset(out, tokenizer, 32)
    assert len(train) == len(ds)
    item = train[3]
    assert isinstance(item, torch.Tensor) and item.dtype == torch.long and item.shape == (33,)
    assert item.tolist() == ds[3]["input_ids"]

    shorter = load_train_dataset(out, None, 16)  # truncated rows; a prepared set needs no tokenizer
    assert shorter[3].shape == (17,) and shorter[3].tolist() == ds[3]["input_ids"][:17]
    batch = next(iter(torch.utils.data.DataLoader(shorter, batch_size=4)))
    assert batch.shape == (4, 17) and batch.dtype == torch.long

    with pytest.raises(ValueError, match=r"rows of 33 tokens .*--seq-length 32.*seq_length=64 needs 65"):
        load_train_dataset(out, tokenizer, 64)


def test_load_train_dataset_packs_raw_sources(text_dir, tokenizer):
    train = load_train_dataset(str(text_dir), tokenizer, 24, seed=3)
    assert len(train) > 10
    assert all(train[i].shape == (25,) and train[i].dtype == torch.long for i in range(len(train)))
    again = load_train_dataset(str(text_dir), tokenizer, 24, seed=3)
    assert torch.equal(train[5], again[5])


def test_prepare_errors(text_dir, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="fewer than one row"):
        prepare_dataset(["tiny"], tokenizer, 4096, show_progress=False)
    out = str(tmp_path / "big_vocab")
    datasets.Dataset.from_dict({"input_ids": [[5000] * 9] * 2}).save_to_disk(out)
    with pytest.raises(ValueError, match="different tokenizer"):
        load_train_dataset(out, tokenizer, 8)
    negative = str(tmp_path / "negative_ids")
    datasets.Dataset.from_dict({"input_ids": [[5] * 4 + [-100] * 5] * 2}).save_to_disk(negative)
    with pytest.raises(ValueError, match=r"token id -100: input ids must be >= 0"):
        load_train_dataset(negative, tokenizer, 8)


def test_prepare_upsampling_and_num_proc(text_dir, tokenizer):
    base = prepare_dataset(str(text_dir), tokenizer, 16, show_progress=False)
    up = prepare_dataset(str(text_dir), tokenizer, 16, long_doc_tokens=1, upsample_factor=2, show_progress=False)
    assert pack_stats(up).packed_tokens == 2 * pack_stats(base).tokens
    parallel = prepare_dataset(str(text_dir), tokenizer, 16, num_proc=2, show_progress=False)
    assert parallel["input_ids"] == base["input_ids"]


def test_digit_groups_make_number_tokens(tmp_path):
    from easy_context.data.tokenizer import digit_groups

    texts = [synthetic_text(300, s) + " In 1998 there were 40 of them." for s in range(5)]
    tok = train_byte_level_bpe(texts, 500, str(tmp_path / "grouped"), digit_group=2)
    assert tok.tokenize(" 1234567.") == ["\u0120", "12", "34", "56", "7", "."]
    vocab = tok.get_vocab()
    assert all(g in vocab for g in digit_groups(2)) and len(digit_groups(2)) == 110
    text = "Kalo 0099 mine 31415926535 ruta."
    reloaded = load_tokenizer(str(tmp_path / "grouped"))
    assert reloaded.decode(reloaded(text, add_special_tokens=False)["input_ids"]) == text
    assert reloaded.tokenize(" 31415") == ["\u0120", "31", "41", "5"]
    with pytest.raises(ValueError, match="plus 110 digit groups"):
        train_byte_level_bpe(texts, 300, str(tmp_path / "small"), digit_group=2)


def test_needle_rows_are_answerable_documents(tokenizer):
    """Mixed-in retrieval rows: the share asked for, whole EOS-terminated documents at varying offsets, every
    question's answer is the number its city's needle holds in that row, and (--needle-loss answer) the labels keep
    exactly the answers' tokens of a retrieval row and every token of the other rows."""
    import re

    from easy_context.data.needles import NeedleMix

    docs = [synthetic_text(600, s) for s in range(12)]
    plain = prepare_dataset(docs, tokenizer, 1024, show_progress=False)
    mixed = prepare_dataset(docs, tokenizer, 1024, show_progress=False, needles=NeedleMix(0.5, 5, 3))
    rows, labels = mixed["input_ids"], mixed["labels"]
    changed = [i for i, (a, b) in enumerate(zip(plain["input_ids"], rows)) if a != b]
    assert len(rows) == len(plain) and len(changed) == round(0.5 * len(rows))
    assert json.loads(mixed.info.description)["needle_rows"] == len(changed)
    asked, ends = 0, set()
    for i in range(len(rows)):
        if i not in changed:
            assert labels[i] == rows[i]
            continue
        assert len(rows[i]) == 1025
        text = tokenizer.decode(rows[i])
        end = text.index("</s>", text.rindex("<book>"))
        book = text[text.rindex("<book>") : end]
        needles = dict(re.findall(r"The special magic (\w+) number is: (\d{5})\. ", book))
        answers = re.findall(r"Answer: The special magic (\w+) number is: (\d+)\.", book)
        assert answers and 1 <= len(needles) <= 3 and book.endswith(answers[-1][1] + ".")
        for city, number in answers:
            assert needles[city] == number
        trained = tokenizer.decode([t for t, lab in zip(rows[i], labels[i]) if lab != -100])
        assert trained == "".join(" " + number for _, number in answers)
        assert all(lab in (-100, t) for t, lab in zip(rows[i], labels[i]))
        ends.add(len(rows[i]) - rows[i][::-1].index(tokenizer.eos_token_id))  # where the document ends
        asked += len(answers)
    assert asked > len(changed)  # several questions per document happen
    assert len(ends) > 1  # the documents sit at varying offsets of their rows
    everything = prepare_dataset(docs, tokenizer, 1024, show_progress=False, needles=NeedleMix(0.5, 5, 3, "all"))
    assert "labels" not in everything.column_names and everything["input_ids"] == rows
    with pytest.raises(ValueError, match="cannot hold a needle document"):
        prepare_dataset(docs, tokenizer, 200, show_progress=False, needles=NeedleMix(0.5, 5, 3))
    with pytest.raises(ValueError, match="needle loss"):
        NeedleMix(0.5, loss="question")


# ----------------------------------------------------------------------------- CLI and fetch.py


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [zygote.python(), "-m", "easy_context.data", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_end_to_end(text_dir, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        "--dataset", str(text_dir), "--output", str(out), "--seq-length", "32", "--train-tokenizer", "300",
        "--long-doc-tokens", "200", "--upsample-factor", "2", "--seed", "5", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "documents: 13" in proc.stdout and "rows:" in proc.stdout and "long documents" in proc.stdout
    tok = load_tokenizer(str(out / "tokenizer"))
    assert len(tok) == 300
    train = load_train_dataset(str(out), tok, 32)
    assert len(train) > 0 and train[0].shape == (33,)
    meta = json.loads(datasets.load_from_disk(str(out)).info.description)
    assert meta["seq_length"] == 32 and meta["upsample_factor"] == 2 and meta["seed"] == 5


def test_cli_errors(tmp_path):
    proc = run_cli("--dataset", str(tmp_path / "nope"), "--output", str(tmp_path / "o"), "--seq-length", "8",
                   "--train-tokenizer", "300")  # fmt: skip
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    proc = run_cli("--dataset", "x", "--output", "o", "--seq-length", "8")
    assert proc.returncode == 2 and "--tokenizer" in proc.stderr


def test_fetch_is_a_no_op_when_essays_exist(tmp_path):
    (tmp_path / "essay.txt").write_text("already here", encoding="utf-8")
    script = os.path.join(REPO, "PaulGrahamEssays", "fetch.py")
    proc = subprocess.run(
        [zygote.python(), script, "--dest", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["essay.txt"]


# ------------------------------------------------------------------------------------------- random tokens
def test_random_tokens_source():
    from easy_context.data import RandomTokens, random_source_rows

    assert random_source_rows("random") == 1024 and random_source_rows("random:7") == 7
    assert random_source_rows("PaulGrahamEssays") is None and random_source_rows("random_dir") is None
    for bad in ("random:0", "random:x", "random:-3"):
        with pytest.raises(ValueError, match="random:ROWS"):
            random_source_rows(bad)
    ds = load_train_dataset("random:5", None, seq_length=64, seed=3, vocab_size=100)
    assert isinstance(ds, RandomTokens) and len(ds) == 5
    rows = [ds[i] for i in range(5)]
    assert all(r.shape == (65,) and r.dtype == torch.int64 and 0 <= r.min() and r.max() < 100 for r in rows)
    assert torch.equal(rows[2], RandomTokens(100, 64, 5, seed=3)[2])  # the same on every rank
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], RandomTokens(100, 64, 5, seed=4)[0])
    with pytest.raises(IndexError):
        ds[5]
    with pytest.raises(ValueError, match="positive sizes"):
        RandomTokens(0, 64)
    with pytest.raises(ValueError, match="vocabulary size"):
        load_train_dataset("random", None, seq_length=64)


def test_needle_labels_reach_train_targets(tokenizer):
    """A dataset with needle rows trained on their answers yields labels, and train.py makes the targets from them
    (-100 elsewhere), with the inputs unchanged."""
    from easy_context.data.needles import NeedleMix
    from easy_context.data.prepare import PackedRows
    from train import split_batch

    docs = [synthetic_text(600, s) for s in range(12)]
    ds = prepare_dataset(docs, tokenizer, 512, show_progress=False, needles=NeedleMix(0.5, 3, 2))
    rows = PackedRows(ds, 512)
    batch = torch.utils.data.default_collate([rows[i] for i in range(len(rows))])
    assert set(batch) == {"input_ids", "labels"}
    inputs, positions, targets = split_batch(batch)
    assert positions is None and torch.equal(inputs, batch["input_ids"][:, :-1])
    assert torch.equal(targets, batch["labels"][:, 1:])
    masked = (targets == -100).all(dim=1) | (targets != -100).all(dim=1)
    assert not masked.all() and (targets != -100).any(dim=1).all()  # needle rows train on a few tokens, the rest all
    plain = split_batch(batch["input_ids"])
    assert plain[1] is None and torch.equal(plain[2], batch["input_ids"][:, 1:])


def test_repeat_packs_other_rows_and_fresh_needles(tokenizer):
    """--repeat K: K copies of the source in other document orders (rows with other boundaries, not the same rows
    again), shuffled together, and needle rows that are all different."""
    from easy_context.data.needles import NeedleMix

    docs = [synthetic_text(300, s) for s in range(12)]
    once = prepare_dataset(docs, tokenizer, 256, show_progress=False)
    thrice = prepare_dataset(docs, tokenizer, 256, show_progress=False, repeat=3)
    assert len(thrice) == 3 * len(once) and json.loads(thrice.info.description)["rows"] == len(thrice)
    rows = [tuple(r) for r in thrice["input_ids"]]
    assert len(set(rows)) > 2.5 * len(once)  # mostly new boundaries, not copies
    assert sorted(np.concatenate(thrice["input_ids"][: len(once)]).tolist()) != sorted(
        np.concatenate(once["input_ids"]).tolist()
    )  # the copies are interleaved at random
    mixed = prepare_dataset(docs, tokenizer, 256, show_progress=False, repeat=3, needles=NeedleMix(0.5, 3))
    needle_rows = [tuple(r) for r, lab in zip(mixed["input_ids"], mixed["labels"]) if -100 in lab]
    assert len(needle_rows) == round(0.5 * len(mixed)) and len(set(needle_rows)) == len(needle_rows)
    with pytest.raises(ValueError, match="repeat"):
        prepare_dataset(docs, tokenizer, 256, show_progress=False, repeat=0)
