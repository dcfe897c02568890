"""Run one benchmark measurement in a fresh Python process and record it (shared by the bench scripts).

A worker prints ``RESULT <json>`` as its last such line (or the parent collects a file it wrote); the parent
classifies the outcome (ok, oom, killed, timeout, error: see :func:`classify_failure`), adds the wall time, the
date and the command, prints the row and appends it to a JSONL file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "RESULT "
EXCEPTION_LINE = re.compile(r"(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b")  # a traceback's last line, any rank


def emit(result: dict) -> None:
    """Worker side: hand ``result`` to the parent."""
    print(MARK + json.dumps(result), flush=True)


def error_lines(stderr: str, tail: int = 8) -> list[str]:
    """What a failed run said: its error lines (``error: ...``, ``...Error: ...``, from any rank, kept even when a
    launcher's summary follows them), then the last ``tail`` lines."""
    lines = stderr.strip().splitlines()
    key = [ln for ln in lines if ln.startswith("error:") or EXCEPTION_LINE.match(ln)]
    key = list(dict.fromkeys(key))[-4:]  # unique, the last few (every rank prints the same)
    return key + [ln for ln in lines[-tail:] if ln not in key]


def python_command(script: str, argv: list[str]) -> list[str]:
    """``python script *argv`` with this interpreter."""
    return [sys.executable, script, *argv]


def run_isolated(cmd: list[str], row: dict, timeout: float, out: str | None,
                 collect: Callable[[], dict] | None = None, env: dict | None = None,
                 cwd: str | None = None) -> dict:  # fmt: skip
    """Parent side: run ``cmd`` in a fresh process; returns ``row`` completed with its outcome.

    The result is the worker's last ``RESULT <json>`` line, or ``collect()`` (e.g. a file the command wrote) when
    given. ``env`` is added to this process's environment. On a timeout the command and every process it started
    are killed (launchers such as torchrun start their workers in sessions of their own).
    """
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, **(env or {}))
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        _, stderr = proc.communicate(timeout=60)
        row |= {"status": "timeout", "error": stderr.strip().splitlines()[-12:]}  # where the worker had got to
    else:
        lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
        if proc.returncode == 0 and (lines or collect):
            row |= (collect() if collect else json.loads(lines[-1][len(MARK) :])) | {"status": "ok"}
        else:
            row |= {"status": classify_failure(proc.returncode, stderr), "returncode": proc.returncode,
                    "error": error_lines(stderr)}  # fmt: skip
    row |= {"wall_s": round(time.time() - t0, 1), "date": time.strftime("%Y-%m-%d")}
    return record(row, out)


def classify_failure(returncode: int, stderr: str) -> str:
    """oom (a CUDA out-of-memory error), killed (SIGKILL: most likely the host's OOM killer, also of a launcher's
    worker, which torchrun reports as "Signal 9 (SIGKILL)"), or error."""
    if "OutOfMemoryError" in stderr or "out of memory" in stderr:
        return "oom"
    if returncode in (-9, 137) or "Signal 9 (SIGKILL)" in stderr or "exitcode  : -9" in stderr:
        return "killed"
    return "error"


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, all its descendants (found before any dies, so none escapes by being reparented) and its
    process group."""
    try:
        import psutil  # accelerate's dependency
    except ImportError:  # without it: the process group (a launcher's own-session workers may survive)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)


def record(row: dict, out: str | None) -> dict:
    """Print ``row`` as one JSON line and append it to the JSONL file ``out`` (when given)."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row
