"""The benchmark harness on CPU: one measurement per fresh process (bench/isolated_run.py), the max-context probe
and its binary search (bench/max_context.py). The GPU numbers they produce live in docs/results/."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import isolated_run  # noqa: E402
import max_context  # noqa: E402


def _worker(tmp_path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {BENCH!r})
        from isolated_run import emit
        {textwrap.indent(textwrap.dedent(body), "        ").strip()}
    """))
    return str(path)


def _run(tmp_path, body: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    out = tmp_path / "rows.jsonl"
    row = isolated_run.run_isolated(_worker(tmp_path, body), [], {"name": "probe"}, timeout, str(out))
    return row, [json.loads(line) for line in out.read_text().splitlines()]


def test_isolated_run_classifies_each_outcome(tmp_path):
    row, rows = _run(tmp_path, 'print("noise"); emit({"value": 3})')
    assert row["status"] == "ok" and row["value"] == 3 and rows == [row] and row["date"] and row["wall_s"] >= 0

    row, _ = _run(tmp_path, 'raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")')
    assert row["status"] == "oom" and any("out of memory" in ln for ln in row["error"])

    row, _ = _run(tmp_path, 'raise ValueError("bad flag")')
    assert row["status"] == "error" and row["returncode"] == 1 and "ValueError: bad flag" in row["error"][-1]

    row, _ = _run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert row["status"] == "killed"  # what the host's OOM killer looks like


def test_isolated_run_timeout_keeps_the_workers_progress(tmp_path):
    body = 'print("[1 s] model ready", file=sys.stderr, flush=True)\ntime.sleep(60)'
    row, rows = _run(tmp_path, body, timeout=5)
    assert row["status"] == "timeout" and row["error"] == ["[1 s] model ready"] and rows == [row]


@pytest.mark.parametrize("extra", [[], ["--chunked-rmsnorm"]])
def test_max_context_probe_runs_a_full_step_on_cpu(tmp_path, extra):
    out = tmp_path / "mc.jsonl"
    max_context.main(["--model", "tiny-llama", "--seq", "512", "--timeout", "300", "--out", str(out), *extra])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok", row
    assert row["seq"] == 512 and row["optimizer"] == "host_adamw" and math.isfinite(row["loss"])
    assert row["params"] > 0 and 0 <= row["offload_layers"] and row["device"] == "cpu"
    assert ("--chunked-rmsnorm" in row["command"]) == bool(extra) and row["command"].endswith("--seq 512")


def test_max_context_search_brackets_the_longest_ok(tmp_path, monkeypatch):
    """Binary search over multiples of --granularity: oom/killed shrink the bracket, anything else stops it."""
    limit, seen = 5000, []

    def fake_probe(args, seq, base):
        seen.append(seq)
        return {"status": "ok" if seq <= limit else ("oom" if seq % 2048 else "killed")}

    monkeypatch.setattr(max_context, "probe", fake_probe)
    out = tmp_path / "s.jsonl"
    max_context.main(["--model", "tiny-llama", "--search", "1024", "16384", "--max-probes", "10",
                      "--granularity", "512", "--out", str(out)])  # fmt: skip
    summary = json.loads(out.read_text().splitlines()[-1])
    assert seen[0] == 1024 and summary["longest_ok"] == 4608 and summary["stopped_on"] is None  # 9 x 512 <= 5000
    assert len(seen) <= 10 and all(s % 512 == 0 for s in seen)

    seen.clear()
    monkeypatch.setattr(max_context, "probe", lambda a, s, b: seen.append(s) or {"status": "timeout"})
    max_context.main(["--model", "tiny-llama", "--search", "1000", "16384", "--out", str(out)])
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["longest_ok"] is None and summary["stopped_on"] == "timeout" and seen == [8192]  # rounded up
    with pytest.raises(SystemExit, match="no multiple of --granularity 8192"):
        max_context.main(["--model", "tiny-llama", "--search", "1024", "2048"])
