"""easy_context.training.process_exit: 2-rank gloo scripts that end right after a collective exit cleanly.

A reference to the world group held past destroy_process_group (HOLD=1) made this very script abort with SIGABRT
("terminate called without an active exception") in 4 of 16 runs when it ended with destroy_process_group and a
normal exit (END=plain, 2-core machine, 2026-11-29); with the library's own cached world group, before it stopped
holding it, 6 of 20. 8 clean runs in a row would happen by chance with probability 0.75**8 = 10 %; with
exit_process: 0 of 30.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.dist_pool import _free_port

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import atexit, os, sys
import torch, torch.distributed as dist
from easy_context.core.groups import get_sp_group, init_sp_groups
from easy_context.training.process_exit import exit_process

dist.init_process_group("gloo")
init_sp_groups()  # SP over the world: the library must not keep the world group alive
held = dist.group.WORLD if os.environ["HOLD"] == "1" else None  # as a user's script or another library may
rank = dist.get_rank()
atexit.register(lambda: open(os.environ["MARKER"] + str(rank), "w").write("atexit ran"))
total = 0.0
for step in range(20):  # fresh tensors each step, as a training loop makes them
    x = torch.full((64, 64), float(rank + step))
    dist.all_reduce(x, group=get_sp_group())
    total += x[0, 0].item()
print(f"rank {rank} sum {total:g}", end="")  # no newline: exit_process must flush it
dist.all_reduce(torch.ones(64, 64), group=get_sp_group())  # a last collective right before the end (a final barrier)
if os.environ["END"] == "plain":
    dist.destroy_process_group()
else:
    exit_process(int(os.environ["CODE"]))
"""


def _run_pair(tmp_path: Path, end: str, code: int = 0, hold: bool = True) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": str(ROOT), "END": end, "CODE": str(code), "HOLD": str(int(hold)),
           "MARKER": str(tmp_path / "atexit")}  # fmt: skip
    procs = [subprocess.Popen([zygote.python(), "-c", WORKER], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def test_exit_process_after_a_gloo_collective_never_aborts(tmp_path):
    for attempt in range(8):
        for f in tmp_path.glob("atexit*"):
            f.unlink()
        runs = _run_pair(tmp_path, "exit_process")
        for rank, res in enumerate(runs):
            assert res.returncode == 0, (attempt, rank, res.returncode, res.stderr[-2000:])
            assert res.stdout == f"rank {rank} sum 400", res.stdout  # sum over steps of (2 * step + 1); flushed
            assert "terminate called" not in res.stderr
            assert (tmp_path / f"atexit{rank}").read_text() == "atexit ran"


def test_the_library_holds_no_reference_to_the_world_group(tmp_path):
    """SP over the whole world: after destroy_process_group and a plain exit nothing of ours keeps the group alive
    (holding it aborted 10 runs of 12)."""
    for attempt in range(6):
        runs = _run_pair(tmp_path, "plain", hold=False)
        assert [r.returncode for r in runs] == [0, 0], (attempt, [r.stderr[-2000:] for r in runs])


def test_exit_process_passes_its_exit_code(tmp_path):
    runs = _run_pair(tmp_path, "exit_process", code=3)
    assert [r.returncode for r in runs] == [3, 3], [r.stderr[-1000:] for r in runs]
    assert all((tmp_path / f"atexit{rank}").exists() for rank in range(2))


SCRIPTS = ["train.py", "eval_needle.py", "eval_ppl.py", "bench/multi_gpu.py", "bench/peers.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_distributed_scripts_end_with_exit_process(script):
    """Every script that joins a process group ends through exit_process, after its main()."""
    text = (ROOT / script).read_text()
    main_block = text[text.index('if __name__ == "__main__":') :]
    assert "main()" in main_block and "exit_process(" in main_block, main_block
