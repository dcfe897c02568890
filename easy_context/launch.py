"""``easy-context-launch``: ``accelerate launch`` with one readable line when the ranks fail.

When every rank of a job stops on the same user error (``error: --seq-length 1022 is not divisible by 4 ...``),
``accelerate launch`` / torchrun print that line once per rank, then torch elastic's own ~40-line
``ChildFailedError`` traceback and failure table, which bury it. This wrapper runs ``accelerate launch`` with the
same arguments and filters only its stderr:

* an ``error: ...`` line printed by several ranks is shown once;
* the launcher's ``ChildFailedError`` traceback and table become one line naming the ranks and exit codes, its
  ``SignalException`` traceback (it got a signal and passed it to the ranks) one line naming the signal;
* torch elastic's log lines about stopping the other ranks are dropped once a rank printed an ``error:`` line.

Everything else passes through unchanged and as it comes (a rank's own traceback, warnings, progress bars, the
standard output), and the exit code is the launcher's. ``EASY_CONTEXT_LAUNCH_RAW=1`` turns the filter off.

A scheduler's stop signal (SIGTERM, SIGUSR1: easy_context/training/preemption.py) sent to this process is passed
to the launcher, which passes it to the ranks (SIGUSR1 too: ``PET_SIGNALS_TO_HANDLE`` is set to torch's default
plus SIGUSR1 unless given); when the ranks stopped for it with their state saved, this command exits with
``preemption.EXIT_CODE`` (75) whatever the launcher's own code (torch elastic ends with 1 after a signal)::

    easy-context-launch --config_file accelerate_configs/cpu_2proc.yaml train.py --model tiny-llama ...
    python -m easy_context.launch --num_processes 8 -m easy_context.train --config recipe.yaml
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from easy_context.training import preemption

RAW_ENV = "EASY_CONTEXT_LAUNCH_RAW"
_ELASTIC_LOG = re.compile(r"^[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/elastic/")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_SIGNALLED = re.compile(r"^torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: .* got signal: (\d+)")


def _summary(report: list[str]) -> str:
    """One line for torch elastic's failure table: the ranks and their exit codes."""
    failed: dict[int, str] = {}
    rank = None
    for line in report:
        if m := _RANK.match(line):
            rank = int(m.group(1))
        elif (m := _EXIT.match(line)) and rank is not None:
            failed[rank] = m.group(1)
    ranks = ", ".join(f"rank {r} exited with {code}" for r, code in sorted(failed.items())) or "a rank failed"
    return f"easy_context.launch: {ranks} (the launcher's report shortened; {RAW_ENV}=1 shows it)\n"


def _signalled(signum: int) -> str:
    """One line for the launcher's traceback after it got a signal (and passed it to the ranks)."""
    return (f"easy_context.launch: the launcher got {preemption.signal_name(signum)} and passed it to the ranks (its "
            f"traceback shortened; {RAW_ENV}=1 shows it)\n")  # fmt: skip


def filter_launcher_stderr(lines: Iterable[str]) -> Iterator[str]:
    """The stderr lines of ``accelerate launch`` to show (see the module doc); yields as the lines come."""
    errors: set[str] = set()
    held: list[str] = []  # a traceback being read: the launcher's (dropped) or a rank's (shown)
    in_report = False  # inside torch elastic's failure table, after its ChildFailedError line
    for line in lines:
        if in_report:
            held.append(line)
            if line.startswith("=") and any(x.startswith("Root Cause") for x in held):
                yield _summary(held)
                held, in_report = [], False
            continue
        if held:  # a traceback: indented frames until the exception line
            held.append(line)
            if line.startswith((" ", "\t")):
                continue
            if "ChildFailedError" in line:
                in_report = True
                continue
            if m := _SIGNALLED.search(line):
                yield _signalled(int(m.group(1)))
                held = []
                continue
            yield from held
            held = []
            continue
        if line.startswith("Traceback (most recent call last):"):
            held = [line]
            continue
        if line.startswith("error: "):
            if line in errors:
                continue
            errors.add(line)
        elif errors and _ELASTIC_LOG.match(line):
            continue
        yield line
    if in_report:
        yield _summary(held)
    else:
        yield from held


def main(argv: list[str] | None = None) -> int:
    """Run ``accelerate launch`` with ``argv`` (default: this command's arguments); returns its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *argv]
    if argv in (["-h"], ["--help"]):  # ours, then accelerate launch's (through sys.stdout, so it can be captured)
        print("usage: easy-context-launch [accelerate launch arguments] SCRIPT [script arguments]\n")
        print(__doc__.split("\n\n")[1], "\n\naccelerate launch --help:\n")
        print(subprocess.run(cmd, capture_output=True, text=True).stdout)
        return 0
    raw = os.environ.get(RAW_ENV) == "1"
    with tempfile.TemporaryDirectory(prefix="easy_context_launch-") as tmp:
        stopped_file = str(Path(tmp) / "stopped.json")
        env = {**os.environ, preemption.STOPPED_FILE_ENV: stopped_file}
        env.setdefault(preemption.LAUNCHER_SIGNALS_ENV, preemption.LAUNCHER_SIGNALS)
        proc = subprocess.Popen(cmd, env=env, stderr=None if raw else subprocess.PIPE)
        previous = _pass_signals(proc)
        try:
            if not raw:
                # newline="": a progress bar's "\r" ends a piece that is passed on as it is (not a new line)
                stderr = io.TextIOWrapper(proc.stderr, encoding="utf-8", errors="replace", newline="")
                for line in filter_launcher_stderr(stderr):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        stop = preemption.reported_stop(stopped_file)
    return code if stop is None else stop["exit_code"]


def _pass_signals(proc: subprocess.Popen) -> dict[int, object]:
    """While ``proc`` (the launcher) runs: Ctrl-C is left to it (it is in this process group and gets it itself),
    a stop signal is passed on to it. Returns the handlers to restore."""

    def pass_on(signum: int, frame) -> None:
        try:
            proc.send_signal(signum)
        except OSError:  # it has just ended
            pass

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for sig in preemption.STOP_SIGNALS:
        previous[sig] = signal.signal(sig, pass_on)
    return previous


def run() -> None:
    """The ``easy-context-launch`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    run()
