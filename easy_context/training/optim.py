"""The optimizer for train.py: AdamW, DeepSpeed's CPU AdamW when ZeRO offloads optimizer states, or
:class:`~easy_context.training.host_adamw.HostAdamW` (optimizer states in host memory without DeepSpeed)."""

from __future__ import annotations

import torch

OPTIMIZERS = ("adamw", "host_adamw")


def build_optimizer(
    params,
    accelerator,
    lr: float,
    weight_decay: float = 0.0,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    name: str = "adamw",
):
    """AdamW over ``params``; with a DeepSpeed plugin whose ZeRO config offloads the optimizer to CPU/NVMe,
    DeepSpeed's vectorised ``DeepSpeedCPUAdam`` (the states live and update in host memory). ``name="host_adamw"``:
    fp32 master weights and moments in host memory (12 B/param), bf16 weights and grads on the GPU, no DeepSpeed."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    ds = accelerator.state.deepspeed_plugin
    if name == "host_adamw":
        if ds is not None:
            raise ValueError("--optimizer host_adamw replaces DeepSpeed's optimizer offload; drop the DeepSpeed config "
                             "or use --optimizer adamw (DeepSpeed then offloads per its json)")  # fmt: skip
        if accelerator.num_processes > 1:
            raise ValueError(f"--optimizer host_adamw keeps the whole optimizer state in each process's host memory "
                             f"({accelerator.num_processes} processes would hold {accelerator.num_processes} copies); "
                             "use it on one GPU, or DeepSpeed ZeRO-3 offload (accelerate_configs/single_node.yaml) "
                             "to shard the states")  # fmt: skip
        from easy_context.training.host_adamw import HostAdamW

        return HostAdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    offload = (ds.deepspeed_config.get("zero_optimization", {}).get("offload_optimizer") or {}) if ds else {}
    if offload.get("device") in ("cpu", "nvme"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
