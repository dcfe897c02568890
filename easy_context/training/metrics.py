"""Per-step training metrics: a progress bar, ``metrics.jsonl`` and accelerate's trackers."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import torch

from easy_context.training.flops import peak_flops, train_flops_per_token


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory allocated on ``device``, or this process's peak resident memory on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class MetricsLogger:
    """Writes one JSON object per optimizer step to ``<output_dir>/metrics.jsonl`` (main process only).

    Fields: step, loss, lr, tokens (cumulative, all ranks), tokens_per_s, peak_mem_bytes (GPU allocated; host RSS
    on CPU), peak_host_bytes (this process's peak RSS), skipped_steps (cumulative count of steps whose update
    ``--nonfinite skip`` dropped), grad_norm (the step's global gradient norm before clipping, with ``--grad-clip``
    > 0 or DeepSpeed), and mfu on GPUs (6N + each layer's attention FLOPs per token, window layers
    counted as window x length, recompute not counted, against the datasheet bf16 peak).

    A run starting at ``start_step`` (0, or the step it resumed at) keeps only the rows up to that step: a run
    killed after its last saved state logged steps that its resumption logs again. ``start_tokens``: the tokens
    trained before ``start_step`` (a resumed state's record; default ``start_step * tokens_per_step``).
    """

    def __init__(self, accelerator, output_dir: str, config, seq_length: int, tokens_per_step: int, start_step: int,
                 start_tokens: int | None = None):  # fmt: skip
        self.accelerator = accelerator
        self.path = Path(output_dir) / "metrics.jsonl"
        self.flops_per_token = train_flops_per_token(config, seq_length)
        device = accelerator.device
        peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        self.peak_total = None if peak is None else peak * accelerator.num_processes
        self.tokens_per_step = tokens_per_step
        self.start_step = start_step
        self.start_tokens = start_step * tokens_per_step if start_tokens is None else start_tokens
        self.tokens = self.start_tokens
        self.last, self.last_step = time.perf_counter(), start_step
        if accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
            self._truncate(start_step)

    def _truncate(self, start_step: int) -> None:
        """Drop the rows after ``start_step`` and any torn line (atomically: a kill now loses nothing)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                step = json.loads(line)["step"]
            except ValueError:  # a line a kill left half-written
                continue
            if step <= start_step:
                kept.append(line + "\n")
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)

    def log(self, step: int, loss: float, lr: float, skipped_steps: int, grad_norm: float | None = None) -> dict:
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        steps, self.last_step = step - self.last_step, step  # since the previous row (--log-every N: N steps)
        self.tokens = self.start_tokens + (step - self.start_step) * self.tokens_per_step  # resumed on another layout:
        # the tokens the state recorded, then this layout's per step
        row = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "tokens": self.tokens,
            "tokens_per_s": steps * self.tokens_per_step / max(elapsed, 1e-9),
            "peak_mem_bytes": peak_memory_bytes(self.accelerator.device),
            "peak_host_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,  # this process
            "skipped_steps": skipped_steps,
        }
        if grad_norm is not None:
            row["grad_norm"] = grad_norm
        if self.peak_total:
            row["mfu"] = row["tokens_per_s"] * self.flops_per_token / self.peak_total
        if self.accelerator.is_main_process:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        self.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=step)
        return row
