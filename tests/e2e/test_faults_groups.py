"""Collective timeouts: the groups easy_context makes keep the job's timeout, and a rank
whose ring backward raised (but lives on) leaves its peer blocked only for that timeout, not forever.

torch gives every ``new_group`` a 30-minute default whatever the world's timeout is: an SP or DP subgroup waited
half an hour for a peer that raised. Jobs run under torchrun (2 gloo processes) with a timeout of their own."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from easy_context.core import groups
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]

JOB = """
import datetime, json, sys, time
import torch, torch.distributed as dist
import easy_context as ec
from easy_context.core import blockwise, groups

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
_, dp = groups.init_sp_groups(1)  # SP groups of one rank; the DP group [0, 1] is a new_group
seconds = lambda g: groups._timeout_of(g).total_seconds()
print(json.dumps({"rank": rank, "world": seconds(dist.group.WORLD), "dp": seconds(dp)}), flush=True)
groups.set_collective_timeout(3)  # the existing groups' collectives; the groups made from now on entirely
old_dp = seconds(dp)
groups.reset_groups()
_, dp = groups.init_sp_groups(1)
print(json.dumps({"rank": rank, "after": [seconds(dist.group.WORLD), old_dp, seconds(dp)]}), flush=True)
if rank == 0:  # raises in its ring backward, before its part of the exchange, and lives on
    import easy_context.backends.zigzag_ring_attn.attention as zigzag

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure")

    zigzag.backward_blocks = fail
q = torch.randn(1, 16, 2, 8).requires_grad_()
out = ec.get_attn_func("zigzag_ring_attn")(q, q, q, group=dp)  # a 2-rank ring over the subgroup
start = time.monotonic()
try:
    out.sum().backward()
    error = None
except RuntimeError as exc:
    error = str(exc).splitlines()[0][:200]
print(json.dumps({"rank": rank, "raised_after_s": time.monotonic() - start, "error": error}), flush=True)
if rank == 0:
    time.sleep(20)  # alive: rank 1 cannot learn of the failure from a closed connection
"""


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed in ``text``, also when two ranks' lines landed on one line."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            obj, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        found.append(obj)
        at = text.find("{", end)
    return found


def test_json_objects_splits_interleaved_lines():
    assert json_objects('x {"rank": 0}{"rank": 1, "a": [1]}\n{"rank": 2} {bad') == [{"rank": 0}, {"rank": 1, "a": [1]},
                                                                                 {"rank": 2}]  # fmt: skip


def test_subgroups_keep_the_job_timeout_and_a_failed_ring_backward_is_bounded(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    env.pop(groups.TIMEOUT_ENV, None)
    cmd = [zygote.python(), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)  # forked: same program
    rows = json_objects(res.stdout)
    by = lambda key: {r["rank"]: r for r in rows if key in r}  # noqa: E731
    assert by("dp") == {r: {"rank": r, "world": 600.0, "dp": 600.0} for r in (0, 1)}, res.stdout + res.stderr[-3000:]
    assert all(r["after"] == [3.0, 3.0, 3.0] for r in by("after").values()) and len(by("after")) == 2
    done = by("raised_after_s")
    assert done[0]["error"] == "injected failure", (done, res.stderr[-4000:])
    assert done[1]["error"] and "Timed out" in done[1]["error"] and 2.5 < done[1]["raised_after_s"] < 12, done


def test_collective_timeout_from_the_environment(monkeypatch):
    monkeypatch.setattr(groups, "_TIMEOUT", None)
    monkeypatch.setenv(groups.TIMEOUT_ENV, "90")
    assert groups.collective_timeout(default_s=5) == datetime.timedelta(seconds=90)
    monkeypatch.delenv(groups.TIMEOUT_ENV)
    if not __import__("torch").distributed.is_initialized():
        assert groups.collective_timeout(default_s=5) == datetime.timedelta(seconds=5)
        assert groups.collective_timeout() is None
    monkeypatch.setenv(groups.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"\$EASY_CONTEXT_COLLECTIVE_TIMEOUT must be a number of seconds > 0"):
        groups.collective_timeout()
    with pytest.raises(ValueError, match="collective timeout must be a number of seconds > 0, got -1"):
        groups.set_collective_timeout(-1)
