"""Preemption: a scheduler's stop signal ends the run at a step boundary with its work saved.

SLURM (``scancel``, ``--signal=USR1@120`` before the time limit, preemption), spot instances and Kubernetes stop a
job with SIGTERM or SIGUSR1 and kill it seconds later. train.py installs :class:`StopSignals` on every rank: the
first SIGTERM or SIGUSR1 only records its number. At each step boundary (and once before the first step) the ranks
agree on it (one all-reduce of two ints with the time limit's flag, on the host: :func:`agree_max`), so every rank
stops after the same step, saves the resumable state (``state-stepN``, the atomic save of train_state) and exits with
:data:`EXIT_CODE`; the same command with ``--resume-from auto`` continues from that state.

A launcher passes the signal on: torchrun / ``accelerate launch`` forward SIGTERM to the ranks, and SIGUSR1 too once
it is in ``PET_SIGNALS_TO_HANDLE`` (torchrun's ``--signals-to-handle``; otherwise SIGUSR1 kills the launcher and its
ranks end as orphans); ``easy-context-launch`` sets that and passes both signals to the launcher it runs. The
launcher's own exit code after a stop is 1 (torch elastic reports a signal or a failed rank), so each node's local
main process also writes :data:`EXIT_CODE` into the file ``$EASY_CONTEXT_STOPPED_FILE`` names, and
``easy-context-launch`` exits with it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Sequence

import torch

from easy_context.core.groups import collective_timeout

# sysexits.h EX_TEMPFAIL, "try again later": stopped by a signal with a resumable state saved. Not 143 (128 +
# SIGTERM): a process killed by SIGTERM without saving reports that, and a requeue script must tell the two apart.
EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOPPED_FILE_ENV = "EASY_CONTEXT_STOPPED_FILE"  # where a stopped run's local main process writes EXIT_CODE
# torch elastic's list of the signals its launcher handles and passes to the ranks (torchrun --signals-to-handle;
# accelerate launch reads it from the environment only): torch's default plus SIGUSR1
LAUNCHER_SIGNALS_ENV = "PET_SIGNALS_TO_HANDLE"
LAUNCHER_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


class StopSignals:
    """Records the first SIGTERM / SIGUSR1 this process receives instead of dying of it::

        stop = StopSignals().install()    # main thread, before the work
        ...
        if agree_max([stop.received])[0]:   # at a step boundary, on every rank
            ...  # save and exit with EXIT_CODE

    ``received``: the signal's number, 0 before any. Later signals are ignored (the stop is under way). The
    handler does no I/O (a print could re-enter the stream the main thread is writing)."""

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received = 0

    def install(self) -> StopSignals:
        """Handle the signals from now on (the main thread only: elsewhere Python cannot, and nothing changes)."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                signal.signal(sig, self._record)
        return self

    def _record(self, signum: int, frame) -> None:
        if not self.received:
            self.received = signum


_HOST_GROUP: list = []  # the process group agree_max reduces over on the host (one per process, made once)


def _host_group():
    """The world's ranks in a gloo group: the world group itself under gloo, else one made on first use (every rank
    makes it at the same call: the first agreement), so that an agreement never waits on a GPU stream."""
    dist = torch.distributed
    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.new_group(backend="gloo", timeout=collective_timeout()))
    return _HOST_GROUP[0]


def agree_max(values: Sequence[int]) -> list[int]:
    """The element-wise maximum of ``values`` over every rank (one all-reduce of a few ints on the host, through gloo:
    no GPU sync; the values themselves without a process group), so that every rank takes the same decision (stop,
    time out) after the same step."""
    flags = torch.tensor([int(v) for v in values], dtype=torch.int64)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=_host_group())
    return [int(v) for v in flags.tolist()]


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15 (the number itself when it names no signal)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def report_stop(signum: int, step: int, state: str | None) -> None:
    """Tell the launcher (``easy-context-launch``) that this run stopped for ``signum`` after ``step`` with
    ``state`` its newest state (None: none yet): a JSON line into ``$EASY_CONTEXT_STOPPED_FILE`` when it is set (one
    local main process per node calls this)."""
    path = os.environ.get(STOPPED_FILE_ENV)
    if path:
        record = {"exit_code": EXIT_CODE, "signal": signal_name(signum), "step": step, "state": state}
        with open(path, "w") as f:
            f.write(json.dumps(record) + "\n")


def reported_stop(path: str) -> dict | None:
    """What :func:`report_stop` wrote into ``path``, or None (no stop reported, or an unreadable file)."""
    try:
        with open(path) as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("exit_code"), int) else None
