"""The step watchdog: a stuck rank or a killed launcher ends a 2-process job within a bound.

Before it, a SIGSTOPped rank held the job for the collective timeout (30 minutes) and a launcher killed with
SIGKILL left its ranks running as orphans. Every job here runs under the real launcher (torchrun) with gloo, and
under a timeout of its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from easy_context.training.watchdog import BACKSTOP_EXIT_CODE, EXIT_CODE, Watchdog

ROOT = Path(__file__).resolve().parents[2]

# one process of a 2-rank job: a step is one all_reduce; rank 1 misbehaves at step 3 as sys.argv[1] says
LOOP = """
import datetime, os, signal, sys, time
import torch, torch.distributed as dist
from easy_context.training.watchdog import StepTimeout, Watchdog

mode, timeout, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
wd = Watchdog(timeout, rank).start(within_s=60)  # the first step: startup
# auto_*: train.py's --step-timeout auto:<timeout> (10x the slowest step, at least <timeout> s)
budget = StepTimeout(None if mode.startswith("auto") else timeout, first_s=60, floor_s=timeout)
with open(os.path.join(out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
x = torch.ones(1)
for step in range(1, 100000):
    started = time.monotonic()
    dist.all_reduce(x)
    if rank == 1 and step == 3 and mode in ("sleep", "auto_sleep"):
        time.sleep(3600)
    if rank == 1 and step == 3 and mode == "stop":
        time.sleep(1)  # its heartbeat thread publishes step 2 first
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.05)
    wd.beat(step, within_s=budget.after(time.monotonic() - started))
"""


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


def launch(tmp_path: Path, mode: str, timeout_s: float) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    log = tmp_path / "job.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), mode,
           str(timeout_s), str(tmp_path)]  # fmt: skip
    with log.open("w") as f:  # a file, not a pipe: orphans would hold a pipe open
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, start_new_session=True)
    return proc, log


def wait_for_pids(tmp_path: Path, proc: subprocess.Popen, limit_s: float = 120) -> list[int]:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        files = [tmp_path / f"pid{r}" for r in range(2)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        assert proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def kill_group(proc: subprocess.Popen, pids=()) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def errors(log: Path) -> list[str]:
    return re.findall(r"error: watchdog: [^\n]*", log.read_text())


def run_single(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=timeout)  # fmt: skip


def test_watchdog_ends_a_process_that_stops_beating():
    code = ("import time\nfrom easy_context.training.watchdog import Watchdog\n"
            "wd = Watchdog(1.0, rank=5, store=False).start()\n"
            "wd.beat(1)\nt = time.monotonic()\ntime.sleep(60)\n")  # fmt: skip
    start = time.monotonic()
    res = run_single(code)
    assert res.returncode == EXIT_CODE, res.stderr[-2000:]
    assert time.monotonic() - start < 20
    last = res.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: watchdog: rank 5 stalled in step 2: no progress for 1\.\d s since step 1 ended "
                        r"\(watchdog timeout 1 s\); ending this rank \(exit 124\) so the launcher stops the job",
                        last), last  # fmt: skip
    assert "time.sleep(60)" in res.stderr or "line 6 in <module>" in res.stderr, res.stderr  # the stuck stack


def test_watchdog_is_quiet_while_beating_and_after_stop():
    code = ("import time\nfrom easy_context.training.watchdog import Watchdog\n"
            "wd = Watchdog(0.5, rank=0, store=False).start()\n"
            "for step in range(20):\n    time.sleep(0.1)\n    wd.beat(step)\n"
            "wd.beat(20, within_s=3)\ntime.sleep(1.5)\nwd.stop()\ntime.sleep(1.0)\nprint('ok')\n")  # fmt: skip
    res = run_single(code)
    assert res.returncode == 0 and res.stdout.strip() == "ok" and "watchdog" not in res.stderr, res.stderr


def test_watchdog_rejects_a_bad_timeout():
    with pytest.raises(ValueError, match="watchdog timeout must be > 0 seconds, got 0"):
        Watchdog(0, rank=0, store=False)


def run_to_the_end(tmp_path, mode: str, timeout: float, step_timeout: float = 4):
    """Launch the 2-rank job with ``mode``; wait until it exits. (exit code, seconds from both ranks running to the
    exit, log path, the ranks' pids); the ranks are killed whatever happens."""
    proc, log = launch(tmp_path, mode, step_timeout)
    pids = ()
    try:
        pids = wait_for_pids(tmp_path, proc)
        start = time.monotonic()
        rc = proc.wait(timeout=timeout)
        return rc, time.monotonic() - start, log, pids
    finally:
        kill_group(proc, pids)


def test_sleeping_rank_ends_the_job_within_the_bound(tmp_path):
    """Rank 1 sleeps inside step 3: its watchdog ends it after 4 s, then the launcher stops rank 0 (blocked in the
    all_reduce of step 4; its own watchdog fires too if the launcher is slower)."""
    rc, elapsed, log, pids = run_to_the_end(tmp_path, "sleep", timeout=90)
    assert rc != 0 and elapsed < 40, (rc, elapsed, log.read_text()[-3000:])
    found = errors(log)
    assert any(e.startswith("error: watchdog: rank 1 stalled in step 3: no progress for 4.") for e in found), found
    assert not any(alive(p) for p in pids)


def test_auto_step_timeout_ends_a_stalled_rank_after_its_floor(tmp_path):
    """--step-timeout auto:2 with steps of ~0.05 s: the bound is max(2 s, 10 x 0.05 s) = 2 s, so rank 1 sleeping in
    step 3 ends the job after ~2 s, not after a fixed 600 s."""
    rc, elapsed, log, pids = run_to_the_end(tmp_path, "auto_sleep", timeout=90, step_timeout=2)
    assert rc != 0 and elapsed < 40, (rc, elapsed, log.read_text()[-3000:])
    found = errors(log)
    assert any(e.startswith("error: watchdog: rank 1 stalled in step 3: no progress for 2.") and "timeout 2 s" in e
               for e in found), found  # fmt: skip
    assert not any(alive(p) for p in pids)


def test_step_timeout_policy():
    """auto: the first (compile) step keeps the long bound; then 10x the slowest step, at least the floor; a slow
    step raises the bound instead of being killed; a fixed value stays fixed; bad flags are one line."""
    from easy_context.training.watchdog import StepTimeout, parse_step_timeout

    auto = StepTimeout(None, first_s=1800, floor_s=120)
    assert auto.current == 1800 and auto.after(300.0) == 1800  # step 1: compile, not counted
    assert auto.after(2.0) == 120 and auto.after(2.5) == 120  # 2 s steps: 10x is under the floor
    assert auto.after(50.0) == 500 and auto.after(3.0) == 500  # the slowest so far decides
    assert StepTimeout(8.0, first_s=1800).after(100.0) == 8.0
    assert parse_step_timeout("auto") == (None, 120.0) and parse_step_timeout("auto:5") == (None, 5.0)
    assert parse_step_timeout("600") == (600.0, 120.0) and parse_step_timeout("0") == (0.0, 120.0)
    for bad in ("auto:0", "-3", "soon", "5:2"):
        with pytest.raises(ValueError, match="use auto, auto:MIN_SECONDS"):
            parse_step_timeout(bad)


def test_stopped_rank_is_named_by_its_peer(tmp_path):
    """Rank 1 is SIGSTOPped in step 3 (its own threads stop too): rank 0's watchdog names it from the heartbeats,
    ends rank 0, and the launcher kills the stopped rank (SIGTERM stays pending on a stopped process: torchrun's
    SIGKILL follows 30 s later)."""
    rc, elapsed, log, pids = run_to_the_end(tmp_path, "stop", timeout=120)
    assert rc != 0 and elapsed < 70, (rc, elapsed, log.read_text()[-3000:])
    found = errors(log)
    assert len(found) == 1, log.read_text()[-3000:]
    assert re.match(
        r"error: watchdog: rank 0 stalled in step 4: no progress for 4\.\d s since step 3 ended "
        r"\(watchdog timeout 4 s\); rank 1 not responding for \d+ s \(last done step 2, pid "
        rf"{pids[1]} on [^)]+\): stopped, hung or its host is down, look there first",
        found[0],
    ), found[0]
    assert not any(alive(p) for p in pids)


def test_killed_launcher_leaves_no_orphans(tmp_path):
    """SIGKILL of torchrun: both ranks notice their parent is gone and end within a second or two."""
    proc, log = launch(tmp_path, "run", 30)
    pids = []
    try:
        pids = wait_for_pids(tmp_path, proc)
        time.sleep(1.0)
        assert all(alive(p) for p in pids), log.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        start = time.monotonic()
        while any(alive(p) for p in pids) and time.monotonic() - start < 20:
            time.sleep(0.1)
        elapsed = time.monotonic() - start
    finally:
        kill_group(proc, pids)
    assert elapsed < 10, (elapsed, log.read_text()[-3000:])
    found = errors(log)
    assert sorted(e.split(":")[2] for e in found) == [" rank 0", " rank 1"], found
    assert all("its launcher (pid" in e and "is gone (killed?); ending this rank (exit 124)" in e for e in found)


def test_watchdog_names_what_was_running():
    code = ("import time\nfrom easy_context.training.watchdog import Watchdog\n"
            "wd = Watchdog(30, rank=0, store=False).start()\n"
            "wd.beat(4, within_s=0.5, doing='shutting down')\ntime.sleep(60)\n")  # fmt: skip
    res = run_single(code)
    assert res.returncode == EXIT_CODE, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: watchdog: rank 0 stalled shutting down: no progress for 0.") and (
        "s since step 4 ended (watchdog timeout 0.5 s)" in last
    ), last


def test_a_hang_that_holds_the_gil_is_ended_by_the_c_timer():
    """A C call that never releases the GIL (as gloo's group destructor in its teardown deadlock, which hung
    train.py's exit in 1 of 21 runs and a CI run for 90 minutes) stops the watchdog's Python threads; the C timer
    armed with each beat still dumps every stack and ends the process."""
    code = ("import ctypes\nfrom easy_context.training.watchdog import Watchdog\n"
            "wd = Watchdog(0.5, rank=0, store=False, backstop_s=1.0).start()\nwd.beat(3)\n"
            "ctypes.PyDLL(None).sleep(60)  # libc sleep(3) called with the GIL held\n")  # fmt: skip
    start = time.monotonic()
    res = run_single(code)
    elapsed = time.monotonic() - start
    assert res.returncode == BACKSTOP_EXIT_CODE and elapsed < 20, (res.returncode, elapsed, res.stderr[-2000:])
    assert "Timeout (0:00:01.5" in res.stderr and "line 5 in <module>" in res.stderr, res.stderr[-2000:]
    assert "error: watchdog" not in res.stderr  # the Python thread never got the GIL to print its line


def test_stop_disarms_the_c_timer():
    code = ("import time\nfrom easy_context.training.watchdog import Watchdog\n"
            ""
            "wd = Watchdog(0.3, rank=0, store=False, backstop_s=0.2).start()\nwd.beat(1)\nwd.stop()\n"
            "wd.beat(2)  # a beat after stop arms nothing\ntime.sleep(1.5)\nprint('ok')\n")  # fmt: skip
    res = run_single(code)
    assert res.returncode == 0 and res.stdout.strip() == "ok" and "Timeout" not in res.stderr, res.stderr
