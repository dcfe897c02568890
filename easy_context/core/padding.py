"""The padding helper that meets the SP layouts' length multiples (the check and its message: core.layout)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int = 1, value: float | int = 0) -> torch.Tensor:
    """Pad ``x`` at the end of ``dim`` with ``value`` so its size is a multiple of ``multiple``.

    Pad input ids with the pad token, targets with -100 (ignored by the loss) and position ids with
    anything. Under causal attention padding at the end is harmless (no real token attends to a later
    position); with ``causal=False`` real tokens would attend to the padded keys, and there is no key mask.
    """
    size = x.shape[dim]
    extra = (-size) % multiple
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, extra]
    return F.pad(x, pad, value=value)
