"""train.py's progress bar ends at n of n (a bar wrapping the loop stopped at n-1: the loop breaks after its last
step, before the bar counts it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]


def test_train_bar_ends_at_the_last_step(tmp_path):
    res = run_job([sys.executable, "train.py", "--model", "tiny-llama", "--dataset", "random:8", "--vocab-size", "128",
                   "--seq-length", "64", "--max-train-steps", "3", "--gradient-accumulate-every", "1", "--dtype",
                   "float32", "--checkpointing", "none", "--parallel_mode", "data_parallel", "--no-save",
                   "--output-dir", str(tmp_path / "run")], timeout=300, cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    counts = re.findall(r"\| (\d+)/3 \[", res.stderr.replace("\r", "\n"))
    assert counts and counts[-1] == "3", res.stderr[-2000:]
