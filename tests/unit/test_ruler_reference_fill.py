"""bench/ruler_reference_fill.py drives RULER's niah.py per seed: run here on a stand-in checkout whose niah.py has
RULER's interface (module-level ``args``, ``generate_input_output``, ``generate_samples`` looping under ``tqdm``) and
a search whose outcome depends on the seed, so the reported searched size and fills can be computed by hand."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SYNTHETIC_YAML = """\
niah_multikey_3:
  task: niah
  args:
    type_haystack: needle
    type_needle_k: uuids
vt:
  task: variable_tracking
  args:
    num_chains: 1
"""

CONSTANTS = """\
TASKS = {"niah": {"tokens_to_generate": 128, "template": "T {context}", "answer_prefix": " A"}}
"""

# RULER's interface with a made-up search: probes 5, 9, 7, then the searched size 7 + randint(0, 2) of the seeded
# stream; every odd sample is too long at that size once and steps back one unit; a prompt of n units "has"
# 100 * n + 1 tokens where the haystack is the needle type (so the task's arguments must arrive)
NIAH = """\
import argparse
import random

from tqdm import tqdm
from tokenizer import select_tokenizer
from manifest_utils import write_manifest
from nltk.tokenize import sent_tokenize
from constants import TASKS

parser = argparse.ArgumentParser()
for name in ("save_dir", "save_name", "tokenizer_path", "tokenizer_type", "template", "type_haystack",
             "type_needle_k"):
    parser.add_argument(f"--{name}", type=str)
for name in ("max_seq_length", "tokens_to_generate", "num_samples"):
    parser.add_argument(f"--{name}", type=int)
parser.add_argument("--random_seed", type=int, default=42)
args = parser.parse_args()
assert args.template == "T {context} A" and args.tokens_to_generate == 128
random.seed(args.random_seed)


def generate_input_output(n):
    return "x" * n, ["answer"]


def generate_samples(num_samples, max_seq_length, save_dir):
    for probe in (5, 9, 7):
        generate_input_output(probe)
    num_haystack = 7 + random.randint(0, 2)
    rows = []
    for index in tqdm(range(num_samples)):
        used = num_haystack
        generate_input_output(used)
        if index % 2:
            used -= 1
            generate_input_output(used)
        rows.append({"length": 100 * used + (args.type_haystack == "needle")})
    return rows
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A stand-in RULER checkout; the modules and path entries the run adds are removed afterwards."""
    synthetic = tmp_path / "RULER" / "scripts" / "data" / "synthetic"
    synthetic.mkdir(parents=True)
    (tmp_path / "RULER" / "scripts" / "synthetic.yaml").write_text(SYNTHETIC_YAML)
    (synthetic / "constants.py").write_text(CONSTANTS)
    (synthetic / "niah.py").write_text(NIAH)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path / "RULER"
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("tokenizer", "manifest_utils", "constants", "nltk", "ruler_reference_fill"):
            del sys.modules[name]


def test_each_seed_reports_rulers_searched_size_and_fills(checkout, capsys):
    import ruler_reference_fill

    ruler_reference_fill.main(["--ruler", str(checkout), "--tokenizer", "unused", "--length", "1000", "--seeds",
                               "3-5,42", "--samples", "4"])  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    landed: dict[int, int] = {}
    for line, seed in zip(lines, (3, 4, 5, 42)):
        random.seed(seed)
        searched = 7 + random.randint(0, 2)  # the stand-in's search, by hand
        fills = sorted([(100 * searched + 1) / 1000] * 2 + [(100 * (searched - 1) + 1) / 1000] * 2)
        median = (fills[1] + fills[2]) / 2
        landed[searched] = landed.get(searched, 0) + 1
        assert line == (f"seed {seed}: searched {searched}, fill median {median:.3f} "
                        f"[{fills[0]:.3f}-{fills[-1]:.3f}]"), line  # fmt: skip
    assert lines[-1] == "searched sizes over the seeds: " + ", ".join(f"{n}: {k}" for n, k in sorted(landed.items()))
    assert len(set(landed)) > 1  # the seeds reach the stand-in's stream: they do not all land alike


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", "vt"], "is not one of RULER's NIAH tasks: niah_multikey_3"),
        (["--samples", "0"], "--samples must be at least 1"),
    ],
)
def test_bad_arguments_name_the_fix(checkout, argv, message, capsys):
    import ruler_reference_fill

    with pytest.raises(SystemExit) as exc:
        ruler_reference_fill.main(["--ruler", str(checkout), "--tokenizer", "unused", *argv])
    assert message in str(exc.value) + capsys.readouterr().err


def test_a_folder_that_is_not_a_ruler_checkout_is_named(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import ruler_reference_fill
    finally:
        sys.path.remove(str(ROOT / "bench"))
    with pytest.raises(SystemExit, match="not found: --ruler is a checkout of github.com/NVIDIA/RULER"):
        ruler_reference_fill.main(["--ruler", str(tmp_path), "--tokenizer", "unused"])
