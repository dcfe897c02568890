"""The stage runner of the extension pipeline: each stage a command whose output goes to ``WORK/logs/NAME.log`` and
whose exit status and seconds go to ``RESULTS/stages.tsv``; a failed stage remembered as one line (its name, log and
error) and, unless the run keeps going, no stage started after it; work beside the training in background threads;
and the decisions about a training run's output folder (the newest complete state, whether it reached its steps).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# a log line that states an error: a Python exception (``RuntimeError: ...``), ``error: ...`` (argparse, our CLIs)
_ERROR = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)|error|ERROR|fatal|FATAL)\b.*:")


def training_finished(out: str | Path, steps: int) -> bool:
    """Whether the run in ``out`` logged step ``steps`` (its last metrics row)."""
    try:
        lines = Path(out, "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):
        return False
    return bool(rows) and rows[-1].get("step", 0) >= int(steps)


def newest_state(out: str | Path) -> str | None:
    """The newest complete ``state-step*`` saved in ``out`` (train.py's own check of a state), or None: where a
    chunked run resumes."""
    from easy_context.training.train_state import last_good_checkpoint

    state = last_good_checkpoint(out)
    return None if state is None else str(state)


def last_lines(path: str | Path, count: int = 3) -> list[str]:
    """The last ``count`` non-blank lines of a log (carriage returns as line ends: progress bars)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    lines = [line for line in text.replace("\r", "\n").split("\n") if line.strip()]
    return lines[-count:]


def error_line(path: str | Path) -> str:
    """A failed stage's error: the last line of its log that states one (``RuntimeError: ...``, ``error: ...``), else
    its last line."""
    lines = [line.strip() for line in last_lines(path, 200)]
    errors = [line for line in lines if _ERROR.match(line)]
    return (errors or lines or ["(its log is empty)"])[-1]


@dataclass(frozen=True)
class Failure:
    """A stage that exited non-zero: its name, exit status, log and the error its log ends with."""

    name: str
    rc: int
    log: Path
    error: str

    def line(self) -> str:
        return f"stage {self.name} failed (rc {self.rc}, log {self.log}): {self.error}"


class StageFailed(Exception):
    """Raised by :meth:`StageRunner.run` for a failed stage, and for every stage asked to start after it, when the
    run does not keep going: the pipeline stops there."""


class StageRunner:
    """Runs the pipeline's commands, logs their start and end, and records each in stages.tsv (thread-safe: the
    evaluations run beside the training)."""

    def __init__(self, logs: str | Path, stages_tsv: str | Path, env: Mapping[str, str],
                 echo: Callable[[str], None] | None = None, keep_going: bool = True) -> None:  # fmt: skip
        self.logs = Path(logs)
        self.stages_tsv = Path(stages_tsv)
        self.env = dict(env)
        self.keep_going = keep_going
        self.failures: list[Failure] = []
        self.start = time.time()
        self._lock = threading.Lock()
        self._echo = echo or (lambda line: print(line, flush=True))

    @property
    def stopped(self) -> bool:
        """Whether no further stage starts: one failed and the run does not keep going."""
        return bool(self.failures) and not self.keep_going

    def log(self, message: str) -> None:
        """``[N s] message``: N seconds since the pipeline started."""
        with self._lock:
            self._echo(f"[{int(time.time() - self.start)} s] {message}")

    def run(self, name: str, command: Sequence[str], stdin: str | None = None,
            env: Mapping[str, str] | None = None) -> int:  # fmt: skip
        """Run ``command`` as stage ``name``: its output into logs/NAME.log, its exit status returned and recorded
        with its seconds in stages.tsv, the log's last lines echoed. A failure is remembered (:attr:`failures`);
        unless ``keep_going``, it raises :class:`StageFailed`, and so does every later call, starting nothing."""
        if self.stopped:
            raise StageFailed(f"{name}: not started, {self.failures[0].name} failed")
        self.log(f"{name}: start")
        t0 = time.time()
        log_path = self.logs / f"{name}.log"
        try:
            with open(log_path, "wb") as log:
                full_env = {**self.env, **(env or {})}
                rc = subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                    input=None if stdin is None else stdin.encode(),
                                    stdin=subprocess.DEVNULL if stdin is None else None).returncode  # fmt: skip
        except OSError as exc:  # not executable: recorded like a failed command
            log_path.write_text(f"{command[0]}: {exc}\n")
            rc = 127
        seconds = int(time.time() - t0)
        with self._lock:
            with open(self.stages_tsv, "a") as tsv:
                tsv.write(f"{name}\t{rc}\t{seconds}\n")
        self.log(f"{name}: rc {rc} after {seconds} s")
        tail = last_lines(log_path)
        if tail:
            with self._lock:
                for line in tail:
                    self._echo(f"    {name}| {line}")
        if rc != 0:
            failure = Failure(name, rc, log_path, error_line(log_path))
            with self._lock:
                self.failures.append(failure)
            if not self.keep_going:
                raise StageFailed(failure.line())
        return rc


class Background:
    """Work started beside the pipeline's main line (evaluations, data packing): threads that can be waited for."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def start(self, work: Callable[[], Any], name: str = "") -> threading.Thread:
        def body() -> None:
            try:
                work()
            except StageFailed:  # the runner holds the failure; the pipeline reports it once
                pass
            except Exception as exc:  # a background job's failure must not stop the others; say why it ended
                print(f"{name or 'background'}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def wait(self, threads: Sequence[threading.Thread | None] | None = None) -> None:
        for thread in self.threads if threads is None else threads:
            if thread is not None:
                thread.join()


def wait_until(ready: Callable[[], bool], producer: threading.Thread | None, poll_s: float) -> None:
    """Until ``ready()`` or ``producer`` (the background packing) has ended without making it so."""
    while not ready() and producer is not None and producer.is_alive():
        time.sleep(poll_s)
