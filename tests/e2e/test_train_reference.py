"""train.py's first optimizer step against plain torch (not train.py against itself): the logged loss is the next-token
cross-entropy of the same rows under the same initial weights, and with ``--gradient-accumulate-every 2`` the logged
gradient norm and the weights after the step are those of one step over both micro-batches' rows (the accumulation
scale: gradients of 1/K would halve the norm; the target shift: unshifted targets change the loss)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.support.jobs import run_job
from tests.support.models import tiny_config
from tests.support.trainer_job import word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SEQ, ROWS, LR, CLIP = 64, 4, 1e-3, 1.0  # batch 2 x accumulation 2: the first step trains all ROWS rows


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, torch.Tensor]:
    """(model folder with its tokenizer, prepared dataset of ROWS rows of SEQ + 1 tokens, those rows)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("train_reference")
    tok = word_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=len(tok)))
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(4, len(tok), (ROWS, SEQ + 1), generator=g)
    Dataset.from_dict({"input_ids": rows.tolist()}).save_to_disk(str(root / "data"))
    return root / "model", root / "data", rows


def run_one_step(model: Path, data: Path, out: Path, mode: str, procs: int) -> dict:
    args = ["train.py", "--model", str(model), "--dataset", str(data), "--output-dir", str(out), "--seq-length",
            str(SEQ), "--batch-size", "2", "--gradient-accumulate-every", "2", "--max-train-steps", "1",
            "--learning-rate", str(LR), "--warmup-steps", "0", "--lr-schedule", "constant", "--grad-clip", str(CLIP),
            "--dtype", "float32", "--checkpointing", "none", "--parallel_mode", mode, "--seed", "0"]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    if procs == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
               "--num_processes", str(procs), *args]  # fmt: skip
    res = run_job(cmd, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return row


def plain_torch_step(model_dir: Path, rows: torch.Tensor) -> tuple[float, float, dict[str, torch.Tensor]]:
    """(mean next-token loss over every row, gradient norm, weights after one clipped AdamW step) in plain torch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.train()
    logits = model(rows[:, :-1]).logits.double()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in params)).item()
    for p in params:  # clip to CLIP as the step does
        p.grad.mul_(min(1.0, CLIP / (norm + 1e-6)))
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt.step()
    return loss.item(), norm, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode,procs", [("data_parallel", 1), ("zigzag_ring_attn", 2)])
def test_first_step_matches_plain_torch(setup, tmp_path, mode, procs):
    from transformers import AutoModelForCausalLM

    model_dir, data, rows = setup
    row = run_one_step(model_dir, data, tmp_path / "run", mode, procs)
    ref_loss, ref_norm, ref_weights = plain_torch_step(model_dir, rows)
    assert row["loss"] == pytest.approx(ref_loss, rel=1e-5), "train.py's loss is not the next-token loss of its rows"
    assert row["grad_norm"] == pytest.approx(ref_norm, rel=1e-4), (
        "the accumulated gradient is not the gradient of one step over both micro-batches' rows"
    )
    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run", dtype=torch.float32).state_dict()
    for name, ref in ref_weights.items():
        moved = (ref - before[name]).abs().max().item()
        assert moved > LR / 2, name  # every tensor takes a step of about LR (Adam's first step)
        # elements whose gradient is near Adam's eps move by a fraction of LR that rounding decides (measured
        # up to 5.5e-3 LR); a wrong gradient moves elements by up to 2 LR
        err = (after[name] - ref).abs().max().item()
        assert err <= 5e-2 * LR, (name, err)
