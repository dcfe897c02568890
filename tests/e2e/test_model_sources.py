"""Model sources without a checkpoint: a folder holding only config.json builds random weights of its shape (for
throughput and memory probes of a real model's shape without downloading its weights), in the API, train.py and
bench/train_step.py."""

from __future__ import annotations

import copy
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from easy_context.models import is_config_only, is_random_init, load_model
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip


@pytest.fixture
def config_dir(tmp_path) -> str:
    folder = tmp_path / "shape"
    copy.deepcopy(CONFIG).save_pretrained(folder)
    return str(folder)


def test_config_only_folder_builds_random_weights(config_dir, tmp_path):
    assert is_config_only(config_dir) and is_random_init(config_dir)
    with pytest.warns(UserWarning, match="no weights: random-init weights of its shape"):
        a = load_model(config_dir, dtype=torch.float32, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = load_model(config_dir, dtype=torch.float32, seed=3)
    assert a.config.num_hidden_layers == 2 and a.config.vocab_size == 64
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name  # seeded
    a.save_pretrained(tmp_path / "ckpt")  # with weights it is a checkpoint again: loaded, not random
    assert not is_config_only(str(tmp_path / "ckpt")) and not is_random_init(str(tmp_path / "ckpt"))
    c = load_model(str(tmp_path / "ckpt"), dtype=torch.float32, seed=99)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), c.state_dict().values()))


def test_train_and_bench_take_a_config_only_folder(config_dir, tmp_path):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    train = [zygote.python(), "train.py", "--model", config_dir, "--dataset", "random:4", "--output-dir", str(out),
             "--seq-length", "64", "--parallel_mode", "data_parallel", "--gradient-accumulate-every", "1",
             "--max-train-steps", "2", "--dtype", "float32", "--no-save"]  # fmt: skip
    res = subprocess.run(train, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (out / "metrics.jsonl").read_text().count('"step"') >= 1
    bench = [zygote.python(), "bench/train_step.py", "--model", config_dir, "--seq", "64", "--steps", "1",
             "--dtype", "float32", "--kernel", "auto", "--out", str(tmp_path / "bench.jsonl")]  # fmt: skip
    res = subprocess.run(bench, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "no such file" not in res.stderr.lower(), res.stderr[-2000:]
    assert '"tokens_per_s"' in (tmp_path / "bench.jsonl").read_text()
