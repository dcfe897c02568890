"""What keeps a training run bounded and resumable (easy_context/train.py): the step watchdog and its timeouts
(``--step-timeout``), the time limit (``--time-limit``), the stop step (``--stop-at-step``), a scheduler's stop
signal (SIGTERM / SIGUSR1: easy_context/training/preemption.py) and the checkpoint saves (``--save-every``, the
state at a stop, the final model)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from easy_context.cli import refuse
from easy_context.training.preemption import EXIT_CODE, StopSignals, agree_max, report_stop, signal_name
from easy_context.training.train_state import CheckpointError, DataLayout, save_hf_checkpoint, save_training_state
from easy_context.training.watchdog import StepTimeout, Watchdog, parse_step_timeout


@contextmanager
def exit_on(*errors: type[BaseException], flag: str = "", alike: bool = False):
    """Turn the expected failures of one setup step into a one-line ``error: [flag]message`` exit; ``alike``: every
    rank fails the same way (flags, layout), and only rank 0 prints the line (cli.refuse)."""
    try:
        yield
    except errors as exc:
        message = f"error: {flag}{' '.join(str(exc).split())}"  # one line, also for transformers' multi-line ones
        if alike:
            refuse(message)
        sys.exit(message)


def save_state(accelerator, directory: str, step: int, consumed: int, skipped: int, record: dict | None,
               layout: DataLayout, tokens: int) -> None:  # fmt: skip
    """A resumable state with the run's record (its ``config``, which --resume-from checks), its data layout and
    the tokens trained so far."""
    with exit_on(CheckpointError):
        save_training_state(accelerator, directory, step, consumed, skipped, layout=layout, tokens=tokens,
                            config=record)  # fmt: skip


class RunGuard:
    """The run's bounds and saves, around the steps::

        guard = RunGuard(args, accelerator, started, last_step, record, layout, stop)
        for step in range(start, guard.last_step):
            guard.step_begins()
            ...  # optimizer step step + 1
            last = guard.step_done(step + 1)  # watchdog beat; --time-limit or a stop signal may make it the last
            if guard.save_due(step + 1):
                guard.save_state(step + 1, consumed, skipped, tokens)
            if last:
                break
        if guard.stopped_by:
            return guard.stopped()  # a stop signal: the state is saved, no final model; exit with this code
        guard.save_final(model, tokenizer)

    ``guard.stop_before_start(start)`` before the loop ends a run whose stop signal came during start-up.

    The watchdog (``--step-timeout``; 0: none) ends a rank that makes no progress within the bound: 10x the
    slowest step so far (auto) or fixed; the first step (compile, warm-up) and saves get ``max(S, 1800)`` s. It is
    left running until the process exits (a teardown that hangs ends too)."""

    def __init__(self, args, accelerator, started: float, last_step: int, record: dict | None,
                 layout: DataLayout, stop: StopSignals) -> None:  # fmt: skip
        self.args, self.accelerator, self.started = args, accelerator, started
        self.last_step = last_step  # --max-train-steps or --stop-at-step; --time-limit or a signal may bring it forward
        self.record, self.layout = record, layout
        self.stop = stop  # the stop signals this rank received (installed at the start of the run)
        self.stopped_by = 0  # the signal every rank agreed to stop for (0: none)
        self.saved_state = args.resume_from  # the newest resumable state of this run (None: none yet)
        fixed, floor = parse_step_timeout(args.step_timeout)
        self.long_phase = max(fixed or 0, 1800)  # the first step (compile, warm-up) and checkpoint saves
        self.timeouts = StepTimeout(fixed, first_s=self.long_phase, floor_s=floor)  # fixed, or 10x the slowest step
        self.watchdog = Watchdog(fixed or self.long_phase, accelerator.process_index).start(
            within_s=self.long_phase) if fixed != 0 else None  # fmt: skip  # a stuck rank or a dead launcher: no hang
        self._step_started = time.monotonic()

    def stop_before_start(self, start_step: int) -> bool:
        """Whether a stop signal came during start-up (on any rank; one all-reduce): then the run ends before
        ``start_step + 1``, with nothing new to save."""
        signum = agree_max([self.stop.received])[0]
        if signum:
            self.last_step, self.stopped_by = start_step, signum
        return bool(signum)

    def step_begins(self) -> None:
        self._step_started = time.monotonic()

    def step_done(self, step: int) -> bool:
        """Optimizer step ``step`` (1-based) is done: tell the watchdog; True when it is the run's last: the planned
        last step, or one after which a stop signal came or ``--time-limit`` passed on any rank (every rank takes
        the same decision: one all-reduce of two ints per step)."""
        self._beat(step, self.timeouts.after(time.monotonic() - self._step_started))
        if step >= self.last_step:
            return True
        limit = self.args.time_limit
        late = limit is not None and time.monotonic() - self.started >= limit
        late, signum = agree_max([late, self.stop.received])
        main = self.accelerator.is_main_process
        if signum:  # log, save the state, exit with the documented code (no final model: the kill may come soon)
            self.last_step, self.stopped_by = step, signum
            if main:
                print(f"{signal_name(signum)} received: stopping after step {step} with a resumable state")
        elif late:  # log, save the state and the model, stop
            self.last_step = step
            if main:
                print(f"--time-limit {limit:g} s reached after step {step}: saving and stopping")
        return step == self.last_step

    def save_due(self, step: int) -> bool:
        """Whether a resumable state is saved after ``step``: every ``--save-every`` steps, and at a stop before
        ``--max-train-steps`` (``--stop-at-step``, ``--time-limit``)."""
        args = self.args
        stopping = step == args.stop_at_step or step == self.last_step < args.max_train_steps
        return bool(args.save_every and step % args.save_every == 0) or stopping

    def save_state(self, step: int, consumed: int, skipped: int, tokens: int) -> None:
        """``OUTPUT_DIR/state-stepN``: the state after ``step`` with ``consumed`` micro-batches, ``skipped`` steps
        and ``tokens`` trained (under the watchdog's long bound)."""
        self._beat(step, self.long_phase, doing=f"saving state-step{step}")
        directory = f"{self.args.output_dir}/state-step{step}"
        save_state(self.accelerator, directory, step, consumed, skipped, self.record, self.layout, tokens)
        self.saved_state = directory
        self._beat(step, self.timeouts.current)

    def stopped(self) -> int:
        """After a stop signal (its step's state saved, or during start-up): say where the state is and how to go
        on (main process), tell ``easy-context-launch`` (each node's local main process:
        preemption.report_stop); the exit code."""
        step, state, name = self.last_step, self.saved_state, signal_name(self.stopped_by)
        self._beat(step, 300, doing="shutting down")
        if self.accelerator.is_main_process:
            where = f"state in {state}" if state else "nothing trained yet, no state"
            print(f"stopped by {name} after step {step}: {where}; the same command with --resume-from auto "
                  f"continues (exit {EXIT_CODE})")  # fmt: skip
        if self.accelerator.is_local_main_process:
            report_stop(self.stopped_by, step, state)
        return EXIT_CODE

    def save_final(self, model, tokenizer) -> None:
        """The HF checkpoint in OUTPUT_DIR (unless ``--no-save``), then the watchdog's bound for the shutdown."""
        self._beat(self.last_step, self.long_phase, doing="saving the final model")
        if not self.args.no_save:
            with exit_on(CheckpointError):
                save_hf_checkpoint(self.accelerator, model, tokenizer, self.args.output_dir)
        self._beat(self.last_step, 300, doing="shutting down")

    def _beat(self, step: int, within_s: float, doing: str | None = None) -> None:
        if self.watchdog:
            self.watchdog.beat(step, within_s=within_s, doing=doing)
