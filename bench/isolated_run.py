"""Run one benchmark measurement in a fresh Python process and record it (shared by the bench scripts).

A worker prints ``RESULT <json>`` as its last such line; the parent classifies the outcome (ok, oom: a CUDA
out-of-memory error, killed: SIGKILL without a traceback, most likely the host's OOM killer, timeout, error),
adds the wall time, the date and the command, prints the row and appends it to a JSONL file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "RESULT "


def emit(result: dict) -> None:
    """Worker side: hand ``result`` to the parent."""
    print(MARK + json.dumps(result), flush=True)


def run_isolated(script: str, argv: list[str], row: dict, timeout: float, out: str | None) -> dict:
    """Parent side: ``python script *argv`` in a fresh process; returns ``row`` completed with its outcome."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, script, *argv], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
        if proc.returncode == 0 and lines:
            row |= json.loads(lines[-1][len(MARK) :]) | {"status": "ok"}
        else:
            oom = "OutOfMemoryError" in proc.stderr or "out of memory" in proc.stderr
            status = "oom" if oom else "killed" if proc.returncode == -9 else "error"
            row |= {"status": status, "returncode": proc.returncode, "error": proc.stderr.strip().splitlines()[-12:]}
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        row |= {"status": "timeout", "error": err.strip().splitlines()[-12:]}  # where the worker had got to
    row |= {"wall_s": round(time.time() - t0, 1), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row
