"""Under DeepSpeed ZeRO-3 the parameters are created in the launch's mixed precision, not in the dtype the model
was asked for: ``accelerate launch --mixed_precision no`` (the default) builds a bf16 model in fp32 (twice the
memory, fp32 speed). A config naming a ``deepspeed_config_file`` cannot carry ``mixed_precision`` (accelerate
refuses it), so the launch must pass ``--mixed_precision``; this check says so instead of running the wrong model.
"""

from __future__ import annotations

import torch

_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def deepspeed_precision_error(accelerator, dtype: torch.dtype) -> str | None:
    """Why ``accelerator``'s DeepSpeed launch cannot build a ``dtype`` model (None: it can, or no DeepSpeed)."""
    if accelerator is None or accelerator.state.deepspeed_plugin is None:
        return None
    want = _PRECISION.get(dtype, "no")
    if accelerator.mixed_precision == want:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"a {name} model under DeepSpeed needs mixed precision '{want}', the launch has "
            f"'{accelerator.mixed_precision}': pass `accelerate launch --mixed_precision {want} ...` (a config "
            "with deepspeed_config_file cannot carry it)")  # fmt: skip
