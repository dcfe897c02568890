"""train.py on two "machines" of one host (docs/training.md, "Multi-node"): two ``accelerate launch`` commands with
``--num_machines 2 --machine_rank 0|1 --main_process_ip 127.0.0.1``, 2 CPU processes each, as two nodes run them.
Zigzag SP spans all 4 ranks (both machines); a DP x SP mesh (``--sp-size 2``) keeps each SP group inside one machine
(groups are consecutive global ranks, and a machine holds consecutive ranks). Both machines print the same losses, and
those are the losses of the same training on one process (SP over both machines) or on one machine (DP x SP)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["train.py", "--model", "tiny-llama", "--dataset", "random:32", "--vocab-size", "256", "--seq-length", "128",
         "--batch-size", "2", "--gradient-accumulate-every", "1", "--max-train-steps", "3", "--learning-rate", "2e-3",
         "--warmup-steps", "0", "--lr-schedule", "constant", "--dtype", "float32", "--checkpointing", "none",
         "--no-save", "--seed", "5"]  # fmt: skip
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def printed_losses(stderr: str) -> list[float]:
    """The losses of the progress bar (each refresh prints the latest; consecutive repeats are one step)."""
    out: list[float] = []
    for value in re.findall(r"loss=([0-9.]+)", stderr):
        if not out or float(value) != out[-1]:
            out.append(float(value))
    return out


def metrics(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def two_machines(tmp_path: Path, *extra: str) -> tuple[list[str], Path]:
    """Both machines' stderr and machine 0's output dir (global rank 0 writes the metrics)."""
    port, procs, errs = free_port(), [], []
    for rank in (0, 1):
        cmd = [zygote.python(), *LAUNCH[1:], "--num_machines", "2", "--machine_rank", str(rank), "--num_processes",
               "4", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *TRAIN, "--output-dir",
               str(tmp_path / f"machine{rank}"), *extra]  # fmt: skip
        err = tempfile.TemporaryFile("w+")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                      start_new_session=True))  # fmt: skip
        errs.append(err)
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    texts = []
    for err in errs:
        err.seek(0)
        texts.append(err.read())
        err.close()
    assert codes == [0, 0], [t[-3000:] for t in texts]
    return texts, tmp_path / "machine0"


@pytest.mark.parametrize(
    "name,extra,reference",
    [
        ("sp-spans-both", ("--parallel_mode", "zigzag_ring_attn"), (1, ("--parallel_mode", "data_parallel"))),
        ("dp-x-sp", ("--parallel_mode", "zigzag_ring_attn", "--sp-size", "2"), (4, ())),
    ],
)
def test_two_machines_on_one_host_train_as_one(tmp_path, name, extra, reference):
    texts, out = two_machines(tmp_path, *extra)
    losses = [printed_losses(t) for t in texts]
    assert len(losses[0]) >= 2 and losses[0] == losses[1], losses  # (the 3 steps' losses, repeats merged)
    logged = metrics(out)
    assert len(logged) == 3 and not (tmp_path / "machine1" / "metrics.jsonl").exists()
    assert [round(x, 4) for x in logged][-1] == losses[0][-1]
    procs, ref_extra = reference
    ref_out = tmp_path / "reference"
    if procs == 1:
        cmd = [sys.executable, *TRAIN, "--output-dir", str(ref_out), *ref_extra]
    else:  # the same mesh on one machine
        cmd = [*LAUNCH, "--num_processes", str(procs), *TRAIN, "--output-dir", str(ref_out), *extra]
    res = run_job(cmd, cwd=ROOT, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert logged == pytest.approx(metrics(ref_out), rel=1e-4)
