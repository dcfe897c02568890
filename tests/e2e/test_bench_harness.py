"""The benchmark harness on CPU: one measurement per fresh process (bench/isolated_run.py), the max-context probe
and its binary search (bench/max_context.py). The GPU numbers they produce live in results/."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
import time

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import isolated_run  # noqa: E402
import max_context  # noqa: E402

from tests.support import zygote  # noqa: E402


@pytest.fixture
def forked(monkeypatch):
    """The harness's fresh processes (a probe, ``accelerate launch`` and its ranks) forked from the zygote
    (tests/support/zygote.py): the same programs, without ~9 s of imports each; these tests are about the harness's
    search, rows and errors, not about process start."""
    monkeypatch.setattr(sys, "executable", zygote.python())


def _worker(tmp_path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {BENCH!r})
        from isolated_run import emit
        {textwrap.indent(textwrap.dedent(body), "        ").strip()}
    """)
    )
    return str(path)


def _run(tmp_path, body: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    out = tmp_path / "rows.jsonl"
    cmd = isolated_run.python_command(_worker(tmp_path, body), [])
    row = isolated_run.run_isolated(cmd, {"name": "probe"}, timeout, str(out))
    return row, [json.loads(line) for line in out.read_text().splitlines()]


def test_isolated_run_classifies_each_outcome(tmp_path):
    row, rows = _run(tmp_path, 'print("noise"); emit({"value": 3})')
    assert row["status"] == "ok" and row["value"] == 3 and rows == [row] and row["date"] and row["wall_s"] >= 0

    row, _ = _run(tmp_path, 'raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")')
    assert row["status"] == "oom" and any("out of memory" in ln for ln in row["error"])

    row, _ = _run(tmp_path, 'raise ValueError("bad flag")')
    assert row["status"] == "error" and row["returncode"] == 1 and row["error"][0] == "ValueError: bad flag"

    row, _ = _run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert row["status"] == "killed"  # what the host's OOM killer looks like
    launcher_report = 'print("  exitcode  : -9 (pid: 7)\\n  traceback : Signal 9 (SIGKILL) received", file=sys.stderr)'
    row, _ = _run(tmp_path, launcher_report + "; sys.exit(1)")
    assert row["status"] == "killed"  # a worker killed under torchrun/accelerate: too long, not a failure


def test_isolated_run_timeout_keeps_the_workers_progress_and_ends_its_children(tmp_path):
    """A launcher's workers (accelerate/torchrun children) must not outlive a timed-out probe."""
    pid_file = tmp_path / "child.pid"
    body = f"""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True)  # as torchrun starts its workers
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("[1 s] model ready", file=sys.stderr, flush=True)
        time.sleep(60)
    """
    row, rows = _run(tmp_path, body, timeout=5)
    assert row["status"] == "timeout" and row["error"] == ["[1 s] model ready"] and rows == [row]
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert _ended(child)  # killed with its process group


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_isolated_run_collects_a_result_file(tmp_path):
    out = tmp_path / "rows.jsonl"
    result = tmp_path / "metrics.json"
    cmd = isolated_run.python_command(_worker(tmp_path, f'open({str(result)!r}, "w").write("7")'), [])
    row = isolated_run.run_isolated(cmd, {"name": "x"}, 60, str(out), collect=lambda: {"v": int(result.read_text())})
    assert row["status"] == "ok" and row["v"] == 7
    cmd = isolated_run.python_command(_worker(tmp_path, "sys.exit(3)"), [])
    row = isolated_run.run_isolated(cmd, {"name": "x"}, 60, None, collect=lambda: {"v": 1})
    assert row["status"] == "error" and row["returncode"] == 3 and "v" not in row


@pytest.mark.parametrize("extra", [[], ["--chunked-rmsnorm", "--checkpoint-every", "3", "--attn-heads-per-call", "1"]])
def test_max_context_probe_runs_a_full_step_on_cpu(tmp_path, extra, forked):
    out = tmp_path / "mc.jsonl"
    max_context.main(["--model", "tiny-llama", "--seq", "512", "--timeout", "300", "--out", str(out), *extra])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok", row
    assert row["seq"] == 512 and row["optimizer"] == "host_adamw" and math.isfinite(row["loss"])
    assert row["params"] > 0 and 0 <= row["offload_layers"] and row["device"] == "cpu"
    assert ("--chunked-rmsnorm" in row["command"]) == bool(extra) and row["command"].endswith("--seq 512")
    assert row["checkpoint_every"] == (3 if extra else 1) and row["offload_layers"] <= (2 if extra else 4)  # stored


def test_max_context_gpu_mem_cap_needs_a_gpu():
    import torch

    with pytest.raises(SystemExit, match="--gpu-mem-cap needs a CUDA GPU"):
        max_context.cap_gpu_memory("24GB", torch.device("cpu"))


def test_max_context_refuses_a_bad_checkpoint_every(capsys):
    with pytest.raises(SystemExit):
        max_context.main(["--model", "tiny-llama", "--seq", "512", "--checkpoint-every", "0"])
    assert "--checkpoint-every must be >= 1, got 0" in capsys.readouterr().err


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


def _sp_train(tmp_path, *argv) -> list[dict]:
    import sp_train

    out = tmp_path / f"sp{len(list(tmp_path.glob('sp*.jsonl')))}.jsonl"  # one file per call
    sp_train.main(["--model", "tiny-llama", "--vocab-size", "256", "--dtype", "float32", "--steps", "2",
                   "--learning-rate", "1e-3", "--timeout", "600", "--out", str(out), *argv])  # fmt: skip
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_sp_train_runs_train_py_on_two_ranks_with_the_one_process_losses(tmp_path, forked):
    """bench/sp_train.py: train.py on random tokens; 2 gloo ranks under zigzag / Ulysses train exactly what one
    process trains (same model, same rows, one optimizer step, then the second step's loss)."""
    (one,) = _sp_train(tmp_path, "--nproc", "1", "--modes", "data_parallel", "--seq", "512")
    two = _sp_train(tmp_path, "--nproc", "2", "--modes", "zigzag_ring_attn", "ulysses_attn", "--seq", "512")
    assert one["status"] == "ok" and [r["status"] for r in two] == ["ok", "ok"], (one, two)
    assert 4.0 < one["loss"] < 7.0  # ~ln(256) on random tokens
    for r in two:
        assert r["loss"] == pytest.approx(one["loss"], abs=2e-4), (r["mode"], r["loss"], one["loss"])
        assert r["steps"] == 2 and r["tokens_per_s"] > 0 and r["peak_mem_gib"] > 0 and r["peak_host_gib"] > 0
        assert "MULTI_CPU x2" in r["engine"] and f"--modes {r['mode']} --seq 512" in r["command"]
        assert r["command"].startswith("python bench/sp_train.py --nproc 2 --model tiny-llama")


def test_sp_train_search_and_errors(tmp_path, forked):
    rows = _sp_train(tmp_path, "--nproc", "2", "--modes", "zigzag_ring_attn", "--search", "256", "512",
                     "--granularity", "256", "--max-probes", "2")  # fmt: skip
    assert [r["seq"] for r in rows[:-1]] == [256, 512] and rows[-1]["longest_ok"] == 512
    (bad,) = _sp_train(tmp_path, "--nproc", "2", "--modes", "zigzag_ring_attn", "--seq", "510")
    assert bad["status"] == "error" and any("multiple of" in ln for ln in bad["error"])  # train.py's own message
    import sp_train

    with pytest.raises(SystemExit):  # nothing to do: neither lengths nor a search
        sp_train.parse_args(["--nproc", "2"])
    for flag in (["--seq-length", "1024"], ["--max-train-steps=5"], ["--gradient-accumulate-every", "4"]):
        with pytest.raises(SystemExit):  # set by the script
            _sp_train(tmp_path, "--nproc", "2", "--seq", "512", *flag)


def test_sp_train_gpu_launch_follows_the_dtype_and_the_config(monkeypatch):
    """On GPUs the launch's mixed precision is train.py's --dtype (DeepSpeed ZeRO-3 creates the parameters in it),
    and a config's process count is kept unless --nproc is given."""
    import sp_train
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = "accelerate_configs/single_node.yaml"
    args, extra = sp_train.parse_args(["--accelerate-config", cfg, "--seq", "65536", "--kernel", "cudnn"])
    cmd, env = sp_train.launcher(args, extra)
    assert "--num_processes" not in cmd and cmd[cmd.index("--config_file") + 1] == cfg
    assert cmd[cmd.index("--mixed_precision") + 1] == "bf16" and env["NCCL_NVLS_ENABLE"] == "0"
    args, extra = sp_train.parse_args(["--nproc", "8", "--seq", "65536", "--dtype=float32"])
    cmd, _ = sp_train.launcher(args, extra)
    assert cmd[cmd.index("--num_processes") + 1] == "8" and "--multi_gpu" in cmd
    assert cmd[cmd.index("--mixed_precision") + 1] == "no"
