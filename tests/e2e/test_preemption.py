"""A preempted job keeps its work: a stop signal (SIGUSR1 / SIGTERM) to the launcher or to one rank ends 2-process
train.py after one step on every rank, with a resumable state and exit 75; the same command continues it, and the
per-step losses equal an uninterrupted run's. The SLURM example (train_scripts/slurm_requeue.sh) runs for real with a
fake ``srun`` and ``scontrol`` on PATH: preempted, it requeues its job; requeued, it finishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from easy_context.training import preemption
from easy_context.training.train_state import check_training_state
from tests.e2e import test_train
from tests.e2e.test_train import losses, run_train
from tests.e2e.test_train_faults import FAST, launch_command, leftovers
from tests.support import zygote
from tests.support.jobs import run_job

data_dir = test_train.data_dir  # its packed dataset and tokenizer (a module fixture)

STEPS = 6
ONE_ROW = ("--batch-size", "1", "--gradient-accumulate-every", "1")  # short steps: over run_train's 2 x 2
SCRIPT = test_train.ROOT / "train_scripts" / "slurm_requeue.sh"
FAKE_SRUN = """#!/usr/bin/env bash
# srun on one node: its options dropped, the command run as the job step's one task (its pid noted for the test)
while [[ "${1:-}" == -* ]]; do shift; done
echo $$ > "$FAKE_SRUN_PID"
exec "$@"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_SCONTROL_LOG"
"""


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> list[float]:
    """The per-step losses of the uninterrupted run."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_train(data_dir, out, *FAST, *ONE_ROW, procs=2, steps=STEPS)
    return losses(out)


def train_flags(data_dir: Path, out: Path, monkeypatch) -> list[str]:
    """train.py's flags of the 2-process run (run_train's, with one-row steps)."""
    cmd = launch_command(data_dir, out, monkeypatch, *FAST, *ONE_ROW, procs=2, steps=STEPS)["cmd"]
    return cmd[cmd.index("train.py") + 1 :]


def rows(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def signal_mid_run(cmd: list[str], env: dict, out: Path, target, signum: int, log: Path) -> tuple[int, str]:
    """Start ``cmd``; once step 1 is logged send ``signum`` to ``target(job)`` (a pid); (exit code, output)."""
    with log.open("w") as f:  # a file, not a pipe: a rank left behind would hold a pipe open
        job = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=test_train.ROOT,
                               start_new_session=True)  # fmt: skip
    seen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while rows(out) < 1:
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        seen = psutil.Process(job.pid).children(recursive=True)
        os.kill(target(job), signum)
        code = job.wait(timeout=120)
    finally:  # whatever happened: nothing of the job outlives the test
        for proc in [psutil.Process(job.pid), *seen] if job.poll() is None else seen:
            try:
                proc.kill()
            except psutil.Error:
                pass
    return code, log.read_text()


def assert_stopped(out: Path, text: str, name: str) -> int:
    """The run stopped for ``name`` after one step k < STEPS on every rank, with the state of step k saved and no
    final model; returns k."""
    step = rows(out)
    assert 1 <= step < STEPS, text[-3000:]
    assert f"{name} received: stopping after step {step} with a resumable state" in text, text[-3000:]
    assert f"stopped by {name} after step {step}: state in {out}/state-step{step}; the same command" in text
    state = out / f"state-step{step}"
    assert check_training_state(state, 1)["step"] == step  # both ranks' RNG states are in it
    assert sorted(p.name for p in out.glob("state-step*")) == [state.name]
    assert leftovers(out) == [] and not (out / "model.safetensors").exists()
    return step


def test_a_signal_to_one_rank_stops_every_rank_at_one_step_and_the_same_command_resumes(
    data_dir, tmp_path, monkeypatch, reference
):
    """SIGTERM to rank 1 alone (a node's scheduler, a kill): rank 0 stops after the same step (the all-reduced flag),
    the launcher reports the ranks' exit 75; the same command (--resume-from auto) continues to the uninterrupted
    run's losses."""
    out = tmp_path / "run"
    cmd = [zygote.python(), "-m", "easy_context.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "train.py", *train_flags(data_dir, out, monkeypatch), "--resume-from", "auto"]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}

    def rank_1(job) -> int:  # its process (under the zygote a shim: not the launcher's child, it passes signals on)
        for proc in psutil.process_iter():
            try:
                if str(out) in proc.cmdline() and proc.environ().get("RANK") == "1":
                    return proc.pid
            except psutil.Error:  # gone, or not ours to read
                continue
        raise AssertionError("rank 1's process not found")

    code, text = signal_mid_run(cmd, env, out, rank_1, signal.SIGTERM, tmp_path / "job.log")
    assert code == preemption.EXIT_CODE, text[-3000:]
    assert f"--resume-from auto: no state in {out} yet" in text
    step = assert_stopped(out, text, "SIGTERM")
    res = run_job(cmd, cwd=test_train.ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"--resume-from auto: resuming from {out}/state-step{step}" in res.stdout
    assert losses(out, "step") == list(range(1, STEPS + 1))
    assert losses(out) == reference  # exact: the same layout on CPU in fp32


def test_slurm_example_requeues_on_preemption_and_the_requeued_job_finishes(data_dir, tmp_path, monkeypatch, reference):
    """train_scripts/slurm_requeue.sh with a fake srun / scontrol: SLURM's SIGUSR1 (--signal=USR1@120) to the job step
    (easy-context-launch) reaches both ranks through the launcher; they stop after one step with the state saved,
    the step exits 75 and the script requeues its job. The requeued job (the same script and arguments) resumes and
    finishes without a requeue; its losses are the uninterrupted run's."""
    header = SCRIPT.read_text()
    for line in ("#SBATCH --signal=USR1@120", "#SBATCH --requeue"):
        assert line in header.splitlines()
    assert re.search(r"^PREEMPTED=(\d+)\b", header, re.M).group(1) == str(preemption.EXIT_CODE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "run"
    requeues = tmp_path / "scontrol.log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ACCELERATE_USE_CPU": "1",
           "OMP_NUM_THREADS": "1", "FAKE_SRUN_PID": str(tmp_path / "srun.pid"), "FAKE_SCONTROL_LOG": str(requeues),
           "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(test_train.ROOT), "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node1", "PY": zygote.python(),
           "LAUNCH_CONFIG": "accelerate_configs/cpu_2proc.yaml", "GPUS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "0"}  # fmt: skip
    cmd = ["bash", str(SCRIPT), *train_flags(data_dir, out, monkeypatch)]

    def job_step(job) -> int:
        return int((tmp_path / "srun.pid").read_text())

    code, text = signal_mid_run(cmd, env, out, job_step, signal.SIGUSR1, tmp_path / "job.log")
    assert code == preemption.EXIT_CODE, text[-3000:]
    assert_stopped(out, text, "SIGUSR1")
    assert "easy_context.launch: the launcher got SIGUSR1 and passed it to the ranks" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert requeues.read_text().splitlines() == ["requeue 4242"]
    res = run_job(cmd, cwd=test_train.ROOT, env=env, timeout=300)  # the requeued job
    assert res.returncode == 0, res.stderr[-3000:]
    assert requeues.read_text().splitlines() == ["requeue 4242"]  # finished: not requeued again
    assert losses(out, "step") == list(range(1, STEPS + 1))
    assert losses(out) == reference  # exact: the same layout on CPU in fp32
    assert (out / "model.safetensors").exists()
