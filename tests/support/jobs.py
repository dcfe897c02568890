"""Run a launcher (``accelerate launch``, torchrun, a shell script that starts one) from a test, bounded.

torchrun and ``accelerate launch`` start each rank in a session of its own, so killing the launcher's process
group leaves the ranks running, and a rank that inherited a pipe keeps ``communicate()`` waiting for ever (a CI
run hung 90 minutes so). :func:`run_job` writes the output to files instead of pipes, notes every process the
job starts while it runs, and kills all of them that are still alive when it ends or times out: no hang, no
orphan slowing the tests after it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

import psutil

from tests.support import zygote


def _note_descendants(pid: int, seen: dict[int, psutil.Process]) -> None:
    try:
        for child in psutil.Process(pid).children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.Error:  # the job ended between the poll and this look
        pass


def _kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()  # psutil checks the process is the one noted (a reused pid is left alone)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def run_job(cmd: Sequence[str], *, timeout: float, cwd=None, env: Mapping[str, str] | None = None,
            check: bool = False, fork: bool = True) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)`` for a job that starts processes
    of its own: on timeout every process of the job is killed and ``subprocess.TimeoutExpired`` (with the output
    so far) is raised; ``check``: raise ``CalledProcessError`` on a non-zero exit. ``fork``: a command that starts
    with ``sys.executable`` runs forked from the session's warm interpreter (tests/support/zygote.py), and so do the
    Python processes it starts; False for a test about the process tree itself."""
    cmd = list(cmd)
    if fork and cmd and cmd[0] == sys.executable:
        cmd[0] = zygote.python()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, cwd=cwd, env=None if env is None else dict(env),
                                text=True, start_new_session=True)  # fmt: skip
        seen: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + timeout
        timed_out = False
        while True:
            try:
                proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                _note_descendants(proc.pid, seen)
                if time.monotonic() > deadline:
                    timed_out = True
                    break
        try:
            leader = [psutil.Process(proc.pid)] if proc.poll() is None else []
        except psutil.Error:
            leader = []
        _kill_all(leader + list(seen.values()))
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    res = subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)
    if check:
        res.check_returncode()
    return res
