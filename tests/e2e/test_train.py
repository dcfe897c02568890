"""train.py end to end on CPU: SP reproduces data parallel, loss goes down, DP x SP, resume, bad flags."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A packed dataset (seq 256) and a byte-level BPE tokenizer from synthetic text with structure."""
    root = tmp_path_factory.mktemp("train_data")
    rng = random.Random(0)
    words = "the model reads a long context and learns where each word comes from in the text".split()
    for i in range(12):
        text = " ".join(
            words[(j * 7 + i) % len(words)] if rng.random() < 0.8 else rng.choice(words) for j in range(3000)
        )
        (root / f"doc{i}.txt").write_text(text)
    out = root / "prepared"
    cmd = [zygote.python(), "-m", "easy_context.data", "--dataset", str(root), "--output", str(out),
           "--seq-length", "256", "--train-tokenizer", "300"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return out


def run_train(
    data_dir: Path,
    out: Path,
    *extra: str,
    procs: int = 1,
    steps: int = 4,
    check: bool = True,
    config: str = "accelerate_configs/cpu_2proc.yaml",
):
    args = ["train.py", "--model", "tiny-llama", "--tokenizer", str(data_dir / "tokenizer"), "--dataset",
            str(data_dir), "--output-dir", str(out), "--seq-length", "256", "--batch-size", "2",
            "--gradient-accumulate-every", "2", "--max-train-steps", str(steps), "--learning-rate", "2e-3",
            "--warmup-steps", "2", "--lr-schedule", "linear", "--dtype", "float32", "--seed", "3", *extra]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "TORCH_EXTENSIONS_DIR": str(ROOT / ".venv" / "torch_extensions")}  # fmt: skip
    if config.endswith("cpu_zero3.yaml"):  # DeepSpeed on CPU: accelerate ignores DeepSpeed under ACCELERATE_USE_CPU
        env.pop("ACCELERATE_USE_CPU")
    if procs == 1 and config.endswith("cpu_2proc.yaml"):
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
               "--num_processes", str(procs), *args]  # fmt: skip
    res = run_job(cmd, cwd=ROOT, env=env, timeout=600)
    if check:
        assert res.returncode == 0, res.stderr[-3000:]
    return res


def run_injected(hook: str, data_dir: Path, out: Path, monkeypatch, *args: str, **kwargs):
    """``run_train`` with ``hook`` run first in every process (fault injection at interpreter start): a forked
    process's prelude, a fresh interpreter's sitecustomize (tests/support/zygote.py). ``hook`` patches attributes
    (``torch.save``, a class's method): the forked processes imported the modules already."""
    inject = out.parent / f"inject-{out.name}"
    inject.mkdir(exist_ok=True)
    with monkeypatch.context() as env:
        for key, value in zygote.prelude_env(hook, str(inject)).items():
            env.setenv(key, value, prepend=os.pathsep if key == "PYTHONPATH" else None)
        return run_train(data_dir, out, *args, **kwargs)


def losses(out: Path, key: str = "loss") -> list[float]:
    return [json.loads(line)[key] for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_lrs(steps: int, lr: float = 2e-3, warmup: int = 2) -> list[float]:
    """The linear schedule stepped once per optimizer step (what metrics.jsonl logs after each step)."""
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = get_scheduler("linear", opt, warmup, steps)
    out = []
    for _ in range(steps):
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_sp_reproduces_data_parallel_and_saves_hf_checkpoint(data_dir, tmp_path):
    run_train(data_dir, tmp_path / "dp", "--parallel_mode", "data_parallel")
    run_train(data_dir, tmp_path / "zz", "--parallel_mode", "zigzag_ring_attn", "--checkpoint-every", "3",
              procs=2)  # fmt: skip  # groups of layers 0-2 and 3: inputs of 1, 2 regenerated through the ring
    run_train(data_dir, tmp_path / "uly", "--parallel_mode", "ulysses_attn", "--checkpointing", "offload",
              "--checkpoint-every", "2", "--tiled-mlp", "3", procs=2)  # fmt: skip  # inputs of layers 1, 3 regenerated
    run_train(data_dir, tmp_path / "host", "--parallel_mode", "data_parallel", "--checkpointing", "attn",
              "--optimizer", "host_adamw", "--chunked-rmsnorm")  # fmt: skip  # one-GPU long-context stack
    ref = losses(tmp_path / "dp")
    assert len(ref) == 4
    assert "HostAdamW" in (tmp_path / "host" / "engine.txt").read_text()
    for name in ("dp", "zz", "uly"):  # the schedule advances once per optimizer step, whatever the process count
        assert losses(tmp_path / name, "lr") == pytest.approx(expected_lrs(4)), name
    for name in ("zz", "uly", "host"):
        got = losses(tmp_path / name)
        assert got == pytest.approx(ref, rel=1e-4), (name, got, ref)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "zz")
    AutoTokenizer.from_pretrained(tmp_path / "zz")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert model(ids).logits.shape == (1, 4, model.config.vocab_size)
    rows = [json.loads(line) for line in (tmp_path / "zz" / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "tokens", "tokens_per_s", "peak_mem_bytes"} <= set(rows[0])
    assert rows[-1]["tokens"] == 4 * 2 * 2 * 256  # steps x accumulation x batch x seq (one SP group)


def test_deepspeed_zero3_cpu_offload(data_dir, tmp_path):
    """The main GPU recipe's code path (ZeRO-3, optimizer + params offloaded, DeepSpeedCPUAdam) on CPU:
    2-process zigzag SP reproduces 1-process DeepSpeed, and the gathered checkpoint loads."""
    pytest.importorskip("deepspeed")
    ds = "accelerate_configs/cpu_zero3.yaml"
    run_train(data_dir, tmp_path / "one", "--parallel_mode", "data_parallel", steps=3, config=ds, procs=1)
    run_train(data_dir, tmp_path / "sp", "--parallel_mode", "zigzag_ring_attn", steps=3, config=ds, procs=2)
    run_train(data_dir, tmp_path / "mem", "--parallel_mode", "ulysses_attn", "--tiled-mlp", "3", "--checkpointing",
              "offload", "--checkpoint-every", "2", "--chunked-rmsnorm", steps=3, config=ds,
              procs=2)  # fmt: skip  # memory stack, ZeRO-3 weights gathered again for the regenerating forwards
    bf16 = run_train(data_dir, tmp_path / "bf16", "--dtype", "bfloat16", steps=1, config=ds, check=False)
    assert bf16.returncode != 0 and "--mixed_precision bf16" in bf16.stderr  # ZeRO-3 would build an fp32 model
    assert "DEEPSPEED" in (tmp_path / "sp" / "engine.txt").read_text()
    assert losses(tmp_path / "sp") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    assert losses(tmp_path / "mem") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sp")  # ZeRO-3 shards gathered into one file
    assert all(p.numel() > 0 for p in model.parameters())


def test_loss_decreases(data_dir, tmp_path):
    # 30 steps x 2 micro-batches of 2 rows: several epochs of the small dataset, so epoch boundaries fall
    # inside optimizer steps; the schedule must still advance exactly once per step
    run_train(data_dir, tmp_path / "run", "--parallel_mode", "data_parallel", "--checkpointing", "none", steps=30)
    assert losses(tmp_path / "run", "lr") == pytest.approx(expected_lrs(30))
    got = losses(tmp_path / "run")
    assert sum(got[-5:]) / 5 < 0.7 * sum(got[:5]) / 5, got


@pytest.fixture(scope="module")
def zigzag_losses(data_dir, tmp_path_factory) -> list[float]:
    """The losses of one uninterrupted 6-step zigzag run on 2 processes (what the resumed runs must reproduce)."""
    out = tmp_path_factory.mktemp("zigzag_full")
    run_train(data_dir, out, "--parallel_mode", "zigzag_ring_attn", procs=2, steps=6)
    return losses(out)


def test_resume_continues_exactly(data_dir, tmp_path, zigzag_losses):
    run_train(data_dir, tmp_path / "part", "--parallel_mode", "zigzag_ring_attn", "--stop-at-step", "3", procs=2,
              steps=6)  # fmt: skip
    assert len(losses(tmp_path / "part")) == 3
    run_train(data_dir, tmp_path / "part", "--parallel_mode", "zigzag_ring_attn", "--resume-from",
              str(tmp_path / "part" / "state-step3"), procs=2, steps=6)  # fmt: skip
    assert losses(tmp_path / "part") == pytest.approx(zigzag_losses, rel=1e-5)


def test_time_limit_stops_saves_and_resumes(data_dir, tmp_path, zigzag_losses):
    """--time-limit 0: every rank stops after the first step together (the decision is all-reduced), with the model
    and a resumable state saved; resuming without the limit trains the remaining steps as an uninterrupted run."""
    res = run_train(data_dir, tmp_path / "part", "--parallel_mode", "zigzag_ring_attn", "--time-limit", "0",
                    procs=2, steps=6)  # fmt: skip
    assert "--time-limit 0 s reached after step 1" in res.stdout
    assert len(losses(tmp_path / "part")) == 1
    assert (tmp_path / "part" / "config.json").exists() and (tmp_path / "part" / "state-step1").is_dir()
    run_train(data_dir, tmp_path / "part", "--parallel_mode", "zigzag_ring_attn", "--resume-from",
              str(tmp_path / "part" / "state-step1"), procs=2, steps=6)  # fmt: skip
    assert losses(tmp_path / "part") == pytest.approx(zigzag_losses, rel=1e-5)


def test_tensorboard_tracker(data_dir, tmp_path):
    run_train(data_dir, tmp_path / "tb", "--parallel_mode", "data_parallel", "--tracker", "tensorboard", steps=2)
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events and max(e.stat().st_size for e in events) > 0


def test_dp_x_sp_four_processes(data_dir, tmp_path):
    run_train(data_dir, tmp_path / "dpsp", "--parallel_mode", "usp_attn", "--ring_degree", "1", "--sp-size", "2",
              procs=4, steps=2)  # fmt: skip
    assert losses(tmp_path / "dpsp", "lr") == pytest.approx(expected_lrs(2))
    rows = [json.loads(line) for line in (tmp_path / "dpsp" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["tokens"] == 2 * 2 * 2 * 256 * 2  # two DP groups


@pytest.mark.parametrize(
    "extra,message",
    [
        (("--seq-length", "255", "--parallel_mode", "zigzag_ring_attn"), "must be a multiple of"),
        (("--parallel_mode", "ring_attn"), "unknown --parallel_mode"),
        (("--parallel_mode", "ulysses_attn", "--seq-length", "255"), "not divisible by the Ulysses degree"),
        (("--dataset", "/nonexistent/dataset"), "/nonexistent/dataset"),
        (("--model", "tiny-llama", "--tokenizer", ""), "needs --tokenizer"),
        (("--dataset", "random:0"), "random:ROWS"),
        (("--dataset", "random", "--tokenizer", ""), "give --vocab-size"),
        (("--checkpointing", "full", "--offload-layers", "2"), "needs a checkpointing mode that offloads"),
        (("--checkpointing", "attn", "--checkpoint-every", "2"), "needs checkpointing mode 'full' or 'offload'"),
        (("--checkpoint-every", "0"), "argument --checkpoint-every: must be an integer >= 1, got 0"),
        (("--vocab-size", "512"), "--vocab-size is for --dataset random"),
        (("--sp-size", "3"), "error: --sp-size 3:"),
        (("--parallel_mode", "zigzag_ring_attn", "--ring_degree", "2"), "--ring_degree does not apply to zigzag"),
        (("--time-limit", "-1"), "argument --time-limit: must be a number >= 0, got -1"),
    ],
)
def test_bad_flags_fail_with_one_line(data_dir, tmp_path, extra, message):
    args = list(extra)
    if "ulysses_attn" in args:  # 4 heads cannot be split over 3 ranks: use a 3-process launch
        res = run_train(data_dir, tmp_path / "bad", *args, procs=3, check=False)
    else:
        res = run_train(data_dir, tmp_path / "bad", *args, check=False)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr[-2000:]
