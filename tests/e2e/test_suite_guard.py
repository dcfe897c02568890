"""The suite's own guard (tests/conftest.py): a test that hangs fails with its stacks, and the next ones run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]

HANGING = """
import time

def test_hangs():
    time.sleep(60)

def test_after():
    assert 1 + 1 == 2
"""


def test_a_hanging_test_fails_with_its_stack_and_the_suite_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGING)
    env = {**os.environ, "EC_TEST_LIMIT": "2", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:cacheprovider", "--rootdir",
           str(tmp_path), str(tmp_path / "test_hang.py")]  # fmt: skip
    res = run_job(cmd, cwd=ROOT, env=env, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "1 failed, 1 passed" in out, out[-3000:]
    assert "ran past 2 s ($EC_TEST_LIMIT)" in out and "in test_hangs" in out, out[-3000:]
