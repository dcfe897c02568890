"""Streamed data preparation (easy_context/data/streaming.py): bounded memory on a corpus several times the budget,
and the same packing as the in-memory path (statistics, token multiset, documents kept whole, position ids, needle
rows, repeats, upsampling spread), read by ``load_train_dataset``.

Hermetic: generated text, no network. The large corpus is tokenized byte by byte (a byte-level BPE trained here runs
at ~1M tokens/s on this CPU, too slow for 160 MB in a test; the pipeline after the tokenizer is the same)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

from easy_context.data import document_positions, load_train_dataset, pack_stats, prepare_dataset  # noqa: E402
from easy_context.data.shuffle import KeySpill, random_keys  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_GB = 2 / 1024  # 2 MiB: streams the small corpora below, with spill files re-split and many shards


class IdTokenizer:
    """Document ``"ID LENGTH"`` -> ``LENGTH`` tokens ``ID + 3`` (0-2: specials, EOS 1): every packed token tells its
    document, so rows can be checked against the documents they were cut from."""

    eos_token_id = 1
    name_or_path = "ids"

    def __len__(self) -> int:
        return 5000

    def __call__(self, texts, add_special_tokens=False, **kwargs):
        """No BOS: any text not of the ``"ID LENGTH"`` form (the start-ids probe) is no tokens."""
        ids = []
        for text in [texts] if isinstance(texts, str) else texts:
            doc, length = map(int, text.split()) if text.replace(" ", "").isdigit() else (0, 0)
            ids.append([doc + 3] * length)
        return {"input_ids": ids[0] if isinstance(texts, str) else ids}


def id_documents(count: int, seed: int = 0, long_every: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, count)
    lengths[::long_every] += 200  # a long document every long_every
    return [f"{i} {n}" for i, n in enumerate(lengths.tolist())]


def flat_ids(ds) -> np.ndarray:
    return np.asarray(ds.with_format("numpy")["input_ids"]).reshape(-1)


def check_runs(flat: np.ndarray, lengths: dict[int, int]) -> list[int]:
    """Every run between EOS is one whole document (the first and last may be cut by the packing's ends); return
    the documents in output order."""
    order = []
    ends = np.flatnonzero(flat == IdTokenizer.eos_token_id)
    for k, (a, b) in enumerate(zip(np.r_[-1, ends][:-1] + 1, ends)):
        run = flat[a:b]
        doc = int(run[0]) - 3
        assert (run == doc + 3).all()
        assert len(run) == lengths[doc] or k == 0, (doc, len(run), lengths[doc])
        order.append(doc)
    return order


# ----------------------------------------------------------------------------- the on-disk shuffle


def test_random_keys_are_a_permutation_and_depend_on_the_seed():
    index = np.arange(100_000)
    keys = random_keys(3, 1, index)
    assert len(np.unique(keys)) == len(index) and keys.dtype == np.uint64
    assert not np.array_equal(keys, random_keys(4, 1, index)) and not np.array_equal(keys, random_keys(3, 2, index))
    order = np.argsort(keys)
    assert abs(np.corrcoef(order, index)[0, 1]) < 0.02  # no trace of the input order
    top = np.bincount((keys >> np.uint64(58)).astype(np.int64), minlength=64)
    assert top.min() > 0.8 * top.mean()  # the spill files fill evenly


def test_key_spill_returns_every_record_in_key_order_and_splits_large_files(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, 20_000)
    tokens = rng.integers(0, 60_000, lengths.sum()).astype(np.uint16)
    starts = np.cumsum(lengths) - lengths
    keys = random_keys(0, 1, np.arange(len(lengths)))
    spill = KeySpill(str(tmp_path / "s"), np.uint16, cap_bytes=20_000, stage_bytes=50_000)
    for a in range(0, len(lengths), 3000):  # several batches, several blocks per file
        b = min(a + 3000, len(lengths))
        spill.add(keys[a:b], np.arange(a, b), starts[a:b] - starts[a], lengths[a:b], tokens[starts[a] : starts[b - 1] +
                  lengths[b - 1]])  # fmt: skip
    seen, split = [], False
    for tags, run_starts, run_lengths, data in spill.groups():
        split |= any(name.endswith(".d") for name in os.listdir(tmp_path / "s"))
        for tag, s, n in zip(tags.tolist(), run_starts.tolist(), run_lengths.tolist()):
            assert n == lengths[tag] and np.array_equal(data[s : s + n], tokens[starts[tag] : starts[tag] + n])
            seen.append(tag)
    assert split  # 20K records of ~2 KB files over a 20 KB cap: files were split by the next key bits
    assert sorted(seen) == list(range(len(lengths)))
    assert np.all(keys[seen][1:] > keys[seen][:-1])  # globally in key order
    assert os.listdir(tmp_path / "s") == []  # every file deleted once read


# ----------------------------------------------------------------------------- the same packing as in memory


@pytest.mark.parametrize(
    "options",
    [{}, {"pack": "documents"}, {"long_doc_tokens": 200, "upsample_factor": 3}, {"repeat": 3}, {"seed": None},
     {"seed": None, "repeat": 2}, {"pack": "documents", "repeat": 2, "long_doc_tokens": 200, "upsample_factor": 2}],
)  # fmt: skip
def test_streamed_rows_pack_the_same_documents(tmp_path, options):
    """Stats as in memory; every run between EOS one whole document; tokens = the packed stream less the dropped
    tails; position ids restart after each EOS; shuffled (not the input order) unless seed=None, where the rows are
    exactly the in-memory ones; the same rows whatever the budget and batching."""
    docs = id_documents(600)
    lengths = {i: int(d.split()[1]) for i, d in enumerate(docs)}
    tok, seq = IdTokenizer(), 127
    memory = prepare_dataset(docs, tok, seq, show_progress=False, **options)
    streamed = prepare_dataset(docs, tok, seq, output_dir=str(tmp_path / "a"), show_progress=False, streaming=True,
                               max_memory_gb=TINY_GB, **options)  # fmt: skip
    meta = json.loads(streamed.info.description)
    assert meta["streamed"] and "streamed" not in json.loads(memory.info.description)
    assert pack_stats(streamed) == pack_stats(memory)
    assert streamed.features == memory.features and len(streamed) == len(memory)
    stats, flat = pack_stats(streamed), flat_ids(streamed)
    assert flat.size == stats.rows * (seq + 1)
    copies = options.get("repeat", 1)
    factor = {i: options.get("upsample_factor", 1) if n >= options.get("long_doc_tokens", 1e9) else 1
              for i, n in lengths.items()}  # fmt: skip
    stream = Counter({i + 3: n * factor[i] * copies for i, n in lengths.items()})
    stream[tok.eos_token_id] = sum(factor.values()) * copies
    missing = stream - Counter(flat.tolist())
    assert not Counter(flat.tolist()) - stream and sum(missing.values()) == stats.dropped_tokens
    if copies == 1:
        order = check_runs(flat, lengths)
        if options.get("seed", 0) is None:
            assert np.array_equal(flat, flat_ids(memory))  # in the input order: exactly the in-memory rows
        else:
            assert abs(np.corrcoef(order, np.arange(len(order)))[0, 1]) < 0.2  # a shuffle, not the input order
    if options.get("pack") == "documents":
        rows = np.asarray(streamed.with_format("numpy")["input_ids"])
        positions = np.asarray(streamed.with_format("numpy")["position_ids"])
        assert np.array_equal(positions, document_positions(rows, tok.eos_token_id))
    again = prepare_dataset(docs, tok, seq, output_dir=str(tmp_path / "b"), show_progress=False, max_memory_gb=0.01,
                            streaming=True, **options)  # fmt: skip
    assert np.array_equal(flat_ids(again), flat)  # another budget: other batches and files, the same rows
    train = load_train_dataset(str(tmp_path / "a"), tok, seq)
    item = train[0]["input_ids"] if options.get("pack") == "documents" else train[0]
    assert len(train) == stats.rows and item.shape == (seq + 1,)


def test_upsampled_copies_are_spread_over_the_set(tmp_path):
    """The copies of a long document draw independent keys: they land anywhere in the rows, not together."""
    docs = id_documents(900, long_every=9)
    tok = IdTokenizer()
    ds = prepare_dataset(docs, tok, 255, output_dir=str(tmp_path / "o"), show_progress=False, long_doc_tokens=200,
                         upsample_factor=3, max_memory_gb=TINY_GB, streaming=True)  # fmt: skip
    flat = flat_ids(ds)
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])  # run starts: a long copy is one run
    spans = []
    for doc in range(0, 900, 9):
        at = starts[flat[starts] == doc + 3] / flat.size
        assert 2 <= len(at) <= 3  # its copies, one maybe in the dropped tail
        spans.append(at.max() - at.min())
    assert np.mean(spans) > 0.35  # 3 uniform positions span 0.5 of the set on average; copies together span ~0


def test_streamed_needles_num_proc_and_auto_choice(tmp_path):
    """Needle rows in the share asked for (labels on their answers only), as many as in memory; --num-proc gives
    the same rows; the default budget keeps a small source in memory (exactly the old rows), a small one streams."""
    from easy_context.data import train_byte_level_bpe
    from easy_context.data.needles import NeedleMix
    from tests.e2e.test_data import synthetic_text

    tok = train_byte_level_bpe((synthetic_text(400, s) for s in range(20)), 300, str(tmp_path / "tok"))
    docs = [synthetic_text(200 + 31 * (s % 9), s) for s in range(120)]
    mix = NeedleMix(0.25, 4, 2)
    memory = prepare_dataset(docs, tok, 511, show_progress=False, needles=mix)
    streamed = prepare_dataset(docs, tok, 511, output_dir=str(tmp_path / "a"), show_progress=False, needles=mix,
                               max_memory_gb=TINY_GB)  # fmt: skip
    meta = json.loads(streamed.info.description)
    assert meta["needle_rows"] == json.loads(memory.info.description)["needle_rows"] == round(0.25 * len(streamed))
    labels = np.asarray(streamed.with_format("numpy")["labels"])
    rows = np.asarray(streamed.with_format("numpy")["input_ids"])
    needle = (labels == -100).any(axis=1)
    assert needle.sum() == meta["needle_rows"] and np.array_equal(labels[~needle], rows[~needle])
    for i in np.flatnonzero(needle)[:5]:
        text = tok.decode(rows[i])
        answer = tok.decode(rows[i][labels[i] != -100]).split()
        assert "<book>" in text and answer and all(f"is: {a}." in text for a in answer)
    parallel = prepare_dataset(docs, tok, 511, output_dir=str(tmp_path / "b"), show_progress=False, num_proc=2,
                               max_memory_gb=TINY_GB)  # fmt: skip
    single = prepare_dataset(docs, tok, 511, output_dir=str(tmp_path / "c"), show_progress=False,
                             max_memory_gb=TINY_GB)  # fmt: skip
    assert np.array_equal(flat_ids(parallel), flat_ids(single))
    assert "streamed" not in json.loads(prepare_dataset(docs, tok, 511, show_progress=False).info.description)
    with pytest.raises(ValueError, match="fewer than one row"):
        prepare_dataset(docs[:2], tok, 100_000, output_dir=str(tmp_path / "d"), show_progress=False, streaming=True)
    assert not [n for n in os.listdir(tmp_path / "d") if n.startswith(".spill")]  # the spill is removed on error


def test_cli_max_memory_gb_streams(tmp_path, capsys):
    """``--max-memory-gb``: a source over it is streamed (said so in the summary) with every other flag working."""
    from easy_context.data.__main__ import main
    from tests.e2e.test_data import synthetic_text

    (tmp_path / "src").mkdir()
    for i in range(8):
        (tmp_path / "src" / f"d{i}.txt").write_text(synthetic_text(400 + 50 * i, i), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--dataset", str(tmp_path / "src"), "--output", str(out), "--seq-length", "63", "--train-tokenizer",
            "300", "--pack", "documents", "--repeat", "2", "--long-doc-tokens", "500", "--upsample-factor", "2",
            "--no-progress", "--max-memory-gb", "0.002"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "streamed within --max-memory-gb 0.002" in printed and "long documents" in printed
    train = load_train_dataset(str(out), str(out / "tokenizer"), 63)
    assert len(train) > 10 and train[0]["position_ids"].shape == (64,)
    assert not [n for n in os.listdir(out) if n.startswith(".spill") or n.endswith(".partial")]
    with pytest.raises(SystemExit):
        main([*argv[:-1], "0"])
    assert "--max-memory-gb must be at least" in capsys.readouterr().err


# ----------------------------------------------------------------------------- memory bound on a large corpus

BUDGET_MB = 48
CORPUS_MB = 160
LONG = 20_000  # characters (= tokens here) from which a document is long: upsampled x2

CHILD = r"""
import json, sys, time
import numpy as np
import datasets, pyarrow, tqdm.auto  # the baseline: everything prepare_dataset imports
import easy_context.data.shuffle as shuffle
from easy_context.data import pack_stats, prepare_dataset

class ByteTokenizer:
    eos_token_id = 1
    name_or_path = "bytes"
    def __len__(self):
        return 259
    def __call__(self, texts, add_special_tokens=False, **kwargs):
        return {"input_ids": [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.int64) + 3 for t in texts]}

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

try:  # start the peak (VmHWM) afresh at the baseline; ru_maxrss would carry the parent's peak over exec
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
source, output, gb, long = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
shuffle.SPILL_BITS = 3  # 8 spill files of ~50 MB: each is over its cap (budget / 4) and split again
base, start = status("VmRSS"), time.perf_counter()
ds = prepare_dataset(source, ByteTokenizer(), 1023, output_dir=output, max_memory_gb=gb, show_progress=False,
                     pack="documents", long_doc_tokens=long, upsample_factor=2)
seconds = time.perf_counter() - start
s = pack_stats(ds)
print(json.dumps({"base": base, "peak": status("VmHWM"),
                  "seconds": seconds, "tokens": s.tokens, "packed_tokens": s.packed_tokens, "rows": s.rows,
                  "dropped": s.dropped_tokens, "documents": s.documents, "long": s.long_documents,
                  "streamed": json.loads(ds.info.description).get("streamed", False)}))
"""


def write_corpus(path: str, total_bytes: int, long_chars: int, seed: int = 0, mean_doc: int = 6000) -> dict:
    """A .jsonl of random lowercase 'words' (numpy, ~2 s for 160 MB). Returns the byte histograms of all the text
    and of the documents of at least ``long_chars`` characters, and the counts of both."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz     ", dtype=np.uint8)
    out = {"all": np.zeros(256, dtype=np.int64), "long": np.zeros(256, dtype=np.int64), "documents": 0, "longs": 0}
    written = 0
    with open(path, "wb") as f:
        while written < total_bytes:
            chunk = alphabet[rng.integers(0, len(alphabet), 8 << 20)]
            ends = np.cumsum(rng.geometric(1 / mean_doc, size=(len(chunk) // mean_doc) * 2))
            ends = ends[ends < len(chunk)]
            sizes = np.diff(np.r_[0, ends])
            text = chunk[: ends[-1]]
            out["all"] += np.bincount(text, minlength=256)
            out["long"] += np.bincount(text[np.repeat(sizes >= long_chars, sizes)], minlength=256)
            out["documents"] += len(sizes)
            out["longs"] += int((sizes >= long_chars).sum())
            data = text.tobytes()
            lines = [b'{"text": "' + data[a:b] + b'"}\n' for a, b in zip(np.r_[0, ends[:-1]].tolist(), ends.tolist())]
            written += f.write(b"".join(lines))
    return out


def test_streaming_a_corpus_larger_than_the_budget_stays_within_it(tmp_path):
    """160 MB of text (~200M tokens, byte-level, long documents upsampled) with a 48 MB budget: the child's peak RSS
    stays within its baseline (Python, torch, datasets imported) plus the budget, where the in-memory path holds the
    packed tokens as int64 at least (1.6 GB, 30x the budget). The output is right: its rows' token histogram is the
    packed stream's (the long documents twice) less the dropped tail, position ids restart after each EOS, the rows
    are shuffled, and load_train_dataset reads them."""
    source, output = str(tmp_path / "corpus.jsonl"), str(tmp_path / "out")
    corpus = write_corpus(source, CORPUS_MB << 20, long_chars=LONG)
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-c", CHILD, source, output, str(BUDGET_MB / 1024), str(LONG)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    budget, growth = BUDGET_MB << 20, got["peak"] - got["base"]
    print(f"peak RSS {got['peak'] / 2**20:.0f} MB = baseline {got['base'] / 2**20:.0f} MB + {growth / 2**20:.1f} MB "
          f"(budget {BUDGET_MB} MB); {got['packed_tokens']:,} tokens in {got['seconds']:.1f} s")  # fmt: skip
    assert got["streamed"] and (got["documents"], got["long"]) == (corpus["documents"], corpus["longs"])
    assert growth < budget, f"the prep grew {growth / 2**20:.1f} MB over its baseline, past the {BUDGET_MB} MB budget"
    assert got["packed_tokens"] * 8 > 25 * budget  # what the in-memory path holds at least: the tokens as int64

    stream = np.zeros(259, dtype=np.int64)  # byte b is token b + 3; EOS is 1; long documents twice
    stream[3:] = corpus["all"] + corpus["long"]
    stream[1] = corpus["documents"] + corpus["longs"]
    assert stream.sum() == got["packed_tokens"]
    ds = datasets.load_from_disk(output)
    assert len(ds) == got["rows"] and ds.features["input_ids"].length == ds.features["position_ids"].length == 1024
    rows_hist, first = np.zeros(259, dtype=np.int64), None
    for batch in ds.data.table.to_batches():
        ids = batch.column("input_ids").values.to_numpy().reshape(-1, 1024)
        positions = batch.column("position_ids").values.to_numpy().reshape(-1, 1024)
        rows_hist += np.bincount(ids.reshape(-1), minlength=259)
        assert np.array_equal(positions, document_positions(ids, 1, dtype=np.int32))
        first = ids[:8] if first is None else first
    dropped = stream - rows_hist
    assert dropped.min() >= 0 and dropped.sum() == got["dropped"] < 1024  # the rows are the stream less its tail
    with open(source, "rb") as f:
        head = json.loads(f.readline())["text"].encode()[:1024]
    assert not any(bytes((row[: len(head)] - 3).astype(np.uint8)) == head for row in first)  # not the input order
    train = load_train_dataset(output, None, 1023)
    item = train[len(train) // 2]
    assert set(item) == {"input_ids", "position_ids"} and item["input_ids"].shape == (1024,)
