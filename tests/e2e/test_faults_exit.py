"""A run that ends must exit: a 2-process run whose last act was writing a state (then
``--no-save``) hung at exit. accelerate's ``end_training()`` destroyed the world group while the DDP model held it;
freeing it when ``main()`` returned ran gloo's group destructor with the GIL held, while gloo's worker thread,
freeing the last all-gather, waited for the GIL (gdb). Holding the all-gather's tensors made it rarer (1 hang in 21
runs, one CI run hung 90 minutes); train.py no longer destroys a group and ``exit_process`` leaves them to the
operating system. Every run under a timeout that kills the launcher's ranks too (tests/support/jobs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from easy_context.training import train_state
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]


def agree_worker(rank, world, errors):
    return train_state._agree(errors[rank])


@pytest.mark.parametrize(
    "errors,expected",
    [
        ([None, None], None),
        ([None, "saving x: disk full ✗"], "saving x: disk full ✗"),  # the first rank with an error, on every rank
        (["a", "bb" * 300], "a"),
        (["", None], ""),  # an empty message is still an error
    ],
)
def test_every_rank_gets_the_first_error(dist_pool, errors, expected):
    assert dist_pool(2).run(agree_worker, errors) == [expected, expected]


def test_run_ending_with_a_state_save_and_no_final_model_exits(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "--num_processes", "2", "train.py", "--model", "tiny-llama", "--dataset", "random:40", "--vocab-size",
           "300", "--output-dir", str(out), "--seq-length", "64", "--batch-size", "2", "--gradient-accumulate-every",
           "2", "--max-train-steps", "4", "--dtype", "float32", "--checkpointing", "none", "--parallel_mode",
           "data_parallel", "--warmup-steps", "1", "--no-save", "--stop-at-step", "2"]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}  # fmt: skip
    try:  # the launcher and its ranks (each in a session of its own), killed and reported if the exit hangs
        res = run_job(cmd, cwd=ROOT, env=env, timeout=150)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the finished run did not exit within 150 s: {exc.stdout[-2000:]}") from None
    assert res.returncode == 0 and (out / "state-step2").is_dir(), res.stderr[-3000:]
    assert f"metrics in {out}" in res.stdout
