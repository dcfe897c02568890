"""A step watchdog: a stuck rank (or a dead launcher) ends the job within a bound, naming the rank and the step.

A rank that stops making progress -- SIGSTOPped, hung in a driver or a file system, blocked in a collective whose
peer is stuck -- otherwise holds the whole job until the collective timeout (30 minutes by default), and a
launcher killed with SIGKILL leaves its ranks training on as orphans. A training loop starts one per process::

    wd = Watchdog(timeout_s=600, rank=rank).start()
    for step in ...:
        ...  # one optimizer step
        wd.beat(step)  # the step is done
    wd.stop()

A thread checks the time since the last :meth:`Watchdog.beat`; past ``timeout_s`` it prints every thread's stack
and one line, ``error: watchdog: rank R stalled in step N ...``, then ends the process with ``exit_code`` (124, as
``timeout(1)``), so the launcher (torchrun, ``accelerate launch``) stops the other ranks. The stalled rank of
the line is this one; when the job has a c10d store (``torch.distributed`` initialised), every rank also publishes
a heartbeat there from a second thread, and the line names the ranks that stopped responding (a SIGSTOPped or hung
process cannot report itself: its peers, blocked waiting for it, do). Launched by torchrun or ``accelerate
launch`` (``TORCHELASTIC_RUN_ID`` set) it also ends the process when the launcher is gone (its parent changed).

A step that may legitimately take longer (the first one, a checkpoint save) gets its own bound:
``beat(step, within_s=..., doing="saving state-step8")`` / ``start(within_s=...)``. Keep it running through the
end of the run (the teardown of the process groups can hang too); :func:`~.process_exit.exit_process`
ends the process, and the watchdog with it.

A hang that holds the GIL (a C++ call that never returns without releasing it, as gloo's group destructor in
its teardown deadlock) stops every Python thread, this watchdog's too. For that case each beat also arms a
timer in C, ``faulthandler.dump_traceback_later``, ``backstop_s`` seconds past the deadline: it prints
``Timeout (h:mm:ss)!`` and every thread's stack without the GIL and ends the process with exit code 1.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from typing import Any, TextIO

EXIT_CODE = 124  # what timeout(1) returns: the job was ended for taking too long
BACKSTOP_EXIT_CODE = 1  # what faulthandler's timer exits with (fixed in CPython)
_KEY = "easy_context/watchdog/{}"


def _default_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _default_store() -> tuple[Any, int] | None:
    """(the default process group's store, world size), or None without an initialised process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    try:
        return dist.distributed_c10d._get_default_store(), dist.get_world_size()
    except Exception:  # a private API: without it the watchdog still works, it only cannot name stuck peers
        return None


class StepTimeout:
    """How long the next step may take before the watchdog ends the job: a fixed ``--step-timeout S``, or (auto,
    ``fixed=None``) ``factor`` x the slowest step so far, at least ``floor_s`` — a 2 s step that hangs ends the job
    after 120 s instead of 10 minutes, a 500 s step is never killed for being slow. The first step (compile,
    warm-up) is not counted; until a second step is measured the bound is ``first_s`` (the long phase)."""

    def __init__(self, fixed: float | None, first_s: float, floor_s: float = 120.0, factor: float = 10.0) -> None:
        self.fixed, self.first_s, self.floor_s, self.factor = fixed, float(first_s), float(floor_s), float(factor)
        self.slowest: float | None = None
        self.steps = 0

    @property
    def current(self) -> float:
        """The bound for the next step, from what was measured so far."""
        if self.fixed is not None:
            return float(self.fixed)
        if self.slowest is None:
            return self.first_s
        return max(self.floor_s, self.factor * self.slowest)

    def after(self, seconds: float) -> float:
        """Record a step that took ``seconds``; return the bound for the next one."""
        self.steps += 1
        if self.steps > 1:  # the first step compiles and warms up: not a measure of a step
            self.slowest = max(self.slowest or 0.0, float(seconds))
        return self.current


def parse_step_timeout(text: str) -> tuple[float | None, float]:
    """``--step-timeout``: ``auto`` (adapt: :class:`StepTimeout`, floor 120 s), ``auto:MIN_S`` (adapt, floor
    MIN_S), ``S`` (fixed seconds) or ``0`` (off) -> (fixed seconds or None for auto, floor)."""
    kind, _, floor = text.strip().partition(":")
    try:
        if kind == "auto":
            floor_s = float(floor) if floor else 120.0
            if not floor_s > 0:
                raise ValueError
            return None, floor_s
        if floor:
            raise ValueError
        value = float(kind)
        if value < 0 or value != value:
            raise ValueError
        return value, 120.0
    except ValueError:
        usage = "use auto, auto:MIN_SECONDS, a number of seconds, or 0 (off)"
        raise ValueError(f"--step-timeout {text!r}: {usage}") from None


class Watchdog:
    """Ends this process when no :meth:`beat` came within ``timeout_s`` seconds (see the module doc).

    ``rank``: named in the messages (default: the process group's rank, else ``$RANK``). ``store``: a c10d store
    for heartbeats (None: the default process group's, when there is one; False: none) with ``world_size`` ranks.
    ``exit_if_orphaned``: end the process when its parent changes (None: only under torchrun / accelerate
    launch). ``stream``: where the stacks and the error line go (default stderr). ``backstop_s``: the GIL-free
    timer's margin past each deadline (None: a quarter of ``timeout_s``, 10 to 120 s; 0: no timer; it needs a
    stream with a file descriptor and is process-wide: one armed watchdog per process)."""

    def __init__(self, timeout_s: float, rank: int | None = None, *, exit_code: int = EXIT_CODE, store: Any = None,
                 world_size: int | None = None, exit_if_orphaned: bool | None = None,
                 stream: TextIO | None = None, backstop_s: float | None = None):  # fmt: skip
        if not timeout_s > 0:
            raise ValueError(f"watchdog timeout must be > 0 seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.rank = _default_rank() if rank is None else int(rank)
        self.exit_code = exit_code
        if store is None:
            found = _default_store()
            store, world_size = found if found else (False, world_size)
        self.store, self.world_size = (store or None), world_size
        if exit_if_orphaned is None:
            exit_if_orphaned = "TORCHELASTIC_RUN_ID" in os.environ
        self.parent = os.getppid() if exit_if_orphaned else None
        self.stream = stream
        self.backstop_s = min(120.0, max(10.0, self.timeout_s / 4)) if backstop_s is None else float(backstop_s)
        self._backstop_fd = self._file_descriptor() if self.backstop_s > 0 else None
        self.poll_s = min(1.0, max(self.timeout_s / 20, 0.05))
        self.heartbeat_s = min(5.0, max(self.timeout_s / 8, 0.2))
        self.step: int | None = None  # the last step done (beat), None before the first
        self.doing: str | None = None  # what runs until the next beat (None: the next step)
        self._last = self._deadline = 0.0
        self._stop = threading.Event()
        self._stop.set()  # until start()
        self._wake = threading.Event()  # a beat: publish the new step now
        self._rearm = threading.Event()  # a beat: the watcher recomputes its wait
        self._threads: list[threading.Thread] = []

    # -- the API -----------------------------------------------------------------------------------------------
    def start(self, within_s: float | None = None) -> Watchdog:
        """Start watching: the first :meth:`beat` must come within ``within_s`` (default ``timeout_s``)."""
        if self._threads:
            raise RuntimeError("this watchdog is already started")
        self._stop.clear()
        self._arm(within_s)
        self._threads = [threading.Thread(target=self._watch, name="easy_context-watchdog", daemon=True)]
        if self.store is not None and self.world_size:
            self._threads.append(threading.Thread(target=self._publish, name="easy_context-heartbeat", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def beat(self, step: int, within_s: float | None = None, doing: str | None = None) -> None:
        """Step ``step`` is done; the next beat must come within ``within_s`` (default ``timeout_s``). ``doing``:
        what runs until then, for the message when it stalls (default: step ``step + 1``), e.g. ``"saving
        state-step8"`` or ``"shutting down"``."""
        self.step, self.doing = step, doing
        self._arm(within_s)
        self._wake.set()
        self._rearm.set()

    def stop(self) -> None:
        """Stop watching (before the end of the run, or before a phase with no beats)."""
        self._stop.set()
        self._wake.set()
        self._rearm.set()
        if self._backstop_fd is not None and self._threads:
            faulthandler.cancel_dump_traceback_later()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.heartbeat_s + 1)
        self._threads = []

    def __enter__(self) -> Watchdog:
        return self if self._threads else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the threads -------------------------------------------------------------------------------------------
    def _arm(self, within_s: float | None) -> None:
        now = time.monotonic()
        self._last = now
        self._deadline = now + (self.timeout_s if within_s is None else float(within_s))
        if self._backstop_fd is not None and not self._stop.is_set():  # from start() on, until stop()
            faulthandler.dump_traceback_later(self._deadline - now + self.backstop_s, exit=True,
                                              file=self._backstop_fd)  # fmt: skip

    def _file_descriptor(self) -> int | None:
        """The stream's file descriptor for the C timer (None: the stream has none, no backstop)."""
        try:
            return (self.stream or sys.stderr).fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._rearm.wait(min(self.poll_s, max(self._deadline - time.monotonic(), 0.01)))
            self._rearm.clear()  # a beat moved the deadline: wait again with the new one
            if self._stop.is_set():
                return
            if self.parent is not None and os.getppid() != self.parent:
                self._end(f"rank {self.rank}: its launcher (pid {self.parent}) is gone (killed?); ending this rank "
                          f"(exit {self.exit_code}) instead of training on as an orphan", stacks=False)  # fmt: skip
            if time.monotonic() > self._deadline:
                self._end(self._stall_message())

    def _publish(self) -> None:
        """Heartbeats into the store (best effort: a store that fails or blocks only costs the peers' names)."""
        host, pid = socket.gethostname(), os.getpid()
        while not self._stop.is_set():
            beat = {"time": time.time(), "step": self.step, "pid": pid, "host": host}
            try:
                self.store.set(_KEY.format(self.rank), json.dumps(beat))
            except Exception:
                return
            self._wake.wait(self.heartbeat_s)
            self._wake.clear()

    # -- firing ------------------------------------------------------------------------------------------------
    def _stall_message(self) -> str:
        now = time.monotonic()
        where = "before its first step" if self.step is None else f"in step {self.step + 1}"
        if self.doing:
            where = self.doing
        done = "since it started" if self.step is None else f"since step {self.step} ended"
        allowed = self._deadline - self._last
        peers = self._peers()
        return (f"rank {self.rank} stalled {where}: no progress for {now - self._last:.1f} s {done} (watchdog "
                f"timeout {allowed:g} s){peers}; ending this rank (exit {self.exit_code}) so the launcher stops "
                "the job")  # fmt: skip

    def _peers(self) -> str:
        """'; rank 1 not responding for 41 s (last done step 3, pid 123 on host): ...' from the heartbeats."""
        if self.store is None or not self.world_size:
            return ""
        found: dict[int, dict] = {}
        keys = {r: _KEY.format(r) for r in range(self.world_size) if r != self.rank}

        def read():
            for r, key in keys.items():
                if self.store.check([key]):
                    found[r] = json.loads(self.store.get(key))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=min(5.0, self.timeout_s))
        if reader.is_alive() and not found:
            return "; the job's store did not answer (its host, often rank 0's, may be the stuck one)"
        now, stale_after = time.time(), max(2.5 * self.heartbeat_s, 1.0)
        done = lambda beat: "no step done" if beat["step"] is None else f"last done step {beat['step']}"  # noqa: E731
        silent = [f"rank {r} not responding for {now - beat['time']:.0f} s ({done(beat)}, pid {beat['pid']} on "
                  f"{beat['host']})" for r, beat in sorted(found.items())
                  if now - beat["time"] > stale_after]  # fmt: skip
        silent += [f"rank {r} never sent a heartbeat" for r in keys if r not in found and not reader.is_alive()]
        if silent:
            return "; " + ", ".join(silent) + ": stopped, hung or its host is down, look there first"
        steps = {r: beat["step"] for r, beat in found.items()} | {self.rank: self.step}
        lowest = min(-1 if s is None else s for s in steps.values())
        behind = sorted(r for r, s in steps.items() if (-1 if s is None else s) == lowest)
        if len(behind) == len(steps):
            return "; every rank is alive, all at the same step: one is blocked inside it (the stacks say where)"
        names = ", ".join("this rank" if r == self.rank else f"rank {r}" for r in behind)
        ahead = max(s for s in steps.values() if s is not None)
        return (
            f"; every rank is alive; behind the others (done step {ahead}): {names} (done "
            f"{'no step' if lowest < 0 else f'step {lowest}'}), look there first"
        )

    def _end(self, message: str, stacks: bool = True) -> None:
        stream = self.stream or sys.stderr
        try:
            if stacks:  # where the main thread is stuck (which collective, which call)
                try:
                    print(f"watchdog: the threads of rank {self.rank} (pid {os.getpid()}):", file=stream, flush=True)
                    faulthandler.dump_traceback(file=stream, all_threads=True)
                except (OSError, ValueError, AttributeError):  # a stream without a file descriptor
                    pass
            stream.write(f"error: watchdog: {message}\n")  # one write: lines of several ranks may share a log
            stream.flush()
            sys.stdout.flush()
        finally:
            os._exit(self.exit_code)
