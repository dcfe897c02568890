"""A run that ends must exit (issue 19 item 1): a 2-process run whose last act was writing a state (then
``--no-save``) hung forever at exit. ``all_gather_object`` (the state save's error agreement) dropped its tensors
while gloo's worker thread still held them; freeing the process group (the DDP model going out of scope) then joined
that thread with the GIL held, while the thread waited for the GIL to free them. Every run under a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from easy_context import train_state

ROOT = Path(__file__).resolve().parents[1]


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
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks (a session of their own)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the finished run did not exit within 150 s: {stdout[-2000:]}") from None
    assert proc.returncode == 0 and (out / "state-step2").is_dir(), stderr[-3000:]
    assert f"metrics in {out}" in stdout and time.monotonic() - start < 150
