"""bench/peers.py on CPU/gloo: DeepSpeed's Ulysses DistributedAttention and our backends agree with one
single-process attention call on the same inputs (the comparison harness itself is right)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]


def test_peers_agree_on_cpu(tmp_path):
    out = tmp_path / "peers.json"
    impls = ["ours:zigzag_ring_attn:cpu", "ours:ulysses_attn:cpu", "deepspeed_ulysses"]
    cmd = [zygote.python(), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "bench/peers.py",
           "--device", "cpu", "--seq", "128", "--heads", "4", "--heads-kv", "2", "--head-dim", "16", "--iters", "1",
           "--json", str(out), "--impls", *impls]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert rows.keys() == set(impls)
    assert rows["deepspeed_ulysses"]["version"] == importlib.metadata.version("deepspeed")  # which peer was run
    for row in rows.values():
        assert row["status"] == "ok", row
        assert max(row[k] for k in ("out", "dq", "dk", "dv")) < 1e-5, row
