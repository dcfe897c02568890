"""The parts of preemption handling that need no launch (the launched runs: tests/e2e/test_preemption.py): the
recorded signal, the stop during start-up, the report to easy-context-launch, --resume-from auto's choice."""

from __future__ import annotations

import os
import signal
import types

import pytest
import torch

from easy_context.training import preemption
from easy_context.training.guard import RunGuard


@pytest.fixture
def restore_handlers():
    saved = {sig: signal.getsignal(sig) for sig in preemption.STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_the_first_stop_signal_is_recorded_and_the_process_lives_on(restore_handlers):
    stop = preemption.StopSignals().install()
    assert stop.received == 0
    os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler before the next bytecode of this thread
    os.kill(os.getpid(), signal.SIGTERM)  # ignored: a stop is under way
    assert stop.received == signal.SIGUSR1
    assert preemption.agree_max([0, stop.received]) == [0, signal.SIGUSR1]  # no process group


def guard(tmp_path, stop: preemption.StopSignals, resume_from: str | None = None) -> RunGuard:
    args = types.SimpleNamespace(step_timeout="0", time_limit=None, output_dir=str(tmp_path), resume_from=resume_from,
                                 save_every=0, stop_at_step=None, max_train_steps=10, no_save=True)  # fmt: skip
    accelerator = types.SimpleNamespace(process_index=0, is_main_process=True, is_local_main_process=True,
                                        device=torch.device("cpu"))  # fmt: skip
    return RunGuard(args, accelerator, 0.0, 10, None, None, stop)


def test_a_stop_during_start_up_ends_the_run_before_its_first_step_and_tells_the_launcher(tmp_path, monkeypatch,
                                                                                           capsys):  # fmt: skip
    report = tmp_path / "stopped.json"
    monkeypatch.setenv(preemption.STOPPED_FILE_ENV, str(report))
    assert not guard(tmp_path, preemption.StopSignals()).stop_before_start(4)
    stop = preemption.StopSignals()
    stop.received = signal.SIGTERM
    run = guard(tmp_path, stop, resume_from=f"{tmp_path}/state-step4")
    assert run.stop_before_start(4) and run.stopped() == preemption.EXIT_CODE == 75
    assert capsys.readouterr().out == (f"stopped by SIGTERM after step 4: state in {tmp_path}/state-step4; the same "
                                       "command with --resume-from auto continues (exit 75)\n")  # fmt: skip
    assert preemption.reported_stop(str(report)) == {"exit_code": 75, "signal": "SIGTERM", "step": 4,
                                                     "state": f"{tmp_path}/state-step4"}  # fmt: skip
    assert preemption.reported_stop(str(tmp_path / "missing.json")) is None


def test_a_stop_after_a_step_makes_it_the_last_one_and_saves_its_state(tmp_path, capsys):
    stop = preemption.StopSignals()
    run = guard(tmp_path, stop)
    assert not run.step_done(2) and not run.stopped_by
    stop.received = signal.SIGUSR1
    assert run.step_done(3) and run.stopped_by == signal.SIGUSR1 and run.last_step == 3
    assert run.save_due(3)  # a stop before --max-train-steps saves a state
    assert "SIGUSR1 received: stopping after step 3 with a resumable state" in capsys.readouterr().out
