"""Checkpoints: resumable training state (accelerate) and the final HF checkpoint (safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """A fresh permutation per epoch from ``seed + epoch``: the data order is a pure function of
    (seed, epoch), so a resumed run replays it exactly by skipping the batches already consumed."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


def save_training_state(accelerator, directory: str | Path, step: int, micro_batches: int, skipped_steps: int) -> None:
    """Model, optimizer, scheduler and RNG states (accelerate) plus the data position and the count of steps
    whose update ``--nonfinite skip`` dropped."""
    accelerator.save_state(str(directory))
    if accelerator.is_main_process:
        (Path(directory) / "easy_context_state.json").write_text(
            json.dumps({"step": step, "micro_batches": micro_batches, "skipped_steps": skipped_steps})
        )
    accelerator.wait_for_everyone()


def read_training_position(directory: str | Path) -> dict:
    """{"step", "micro_batches", "skipped_steps"} of a state dir, without loading its state (cheap: a run can
    tell it has nothing to do before it builds a model)."""
    path = Path(directory) / "easy_context_state.json"
    if not path.exists():
        raise FileNotFoundError(f"--resume-from {directory}: no easy_context_state.json (not a training state dir)")
    return {"skipped_steps": 0, **json.loads(path.read_text())}  # states written before skips were counted


def load_training_state(accelerator, directory: str | Path) -> None:
    """Restore the states :func:`save_training_state` wrote (its data position: :func:`read_training_position`)."""
    accelerator.load_state(str(directory))


def save_hf_checkpoint(accelerator, train_model, tokenizer, output_dir: str | Path) -> None:
    """Full weights as safetensors + config (with the RoPE base in use) + tokenizer, loadable by
    ``AutoModelForCausalLM.from_pretrained`` (under ZeRO-3 the shards are gathered first)."""
    state = accelerator.get_state_dict(train_model)
    if accelerator.is_main_process:
        hf_model = accelerator.unwrap_model(train_model).model
        state = {k.removeprefix("model."): v for k, v in state.items()}
        attn = hf_model.config._attn_implementation
        hf_model.config._attn_implementation_internal = "sdpa"  # do not save our runtime attention name
        hf_model.save_pretrained(str(output_dir), state_dict=state, safe_serialization=True)
        hf_model.config._attn_implementation_internal = attn
        if tokenizer is not None:
            tokenizer.save_pretrained(str(output_dir))
    accelerator.wait_for_everyone()
