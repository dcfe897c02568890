"""The optimizer for train.py: AdamW, or DeepSpeed's CPU AdamW when ZeRO offloads optimizer states."""

from __future__ import annotations

import torch


def build_optimizer(params, accelerator, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
    """AdamW over ``params``; with a DeepSpeed plugin whose ZeRO config offloads the optimizer to CPU/NVMe,
    DeepSpeed's vectorised ``DeepSpeedCPUAdam`` (the states live and update in host memory)."""
    ds = accelerator.state.deepspeed_plugin
    offload = (ds.deepspeed_config.get("zero_optimization", {}).get("offload_optimizer") or {}) if ds else {}
    if offload.get("device") in ("cpu", "nvme"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
