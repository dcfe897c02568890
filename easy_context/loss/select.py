"""Which LM-head loss runs: ``--loss auto`` resolved once, at start, to a concrete implementation.

``auto`` is ``liger`` (Liger-Kernel's fused linear cross-entropy, measured 2.3x faster than ``chunked`` at
16K tokens x 32K vocab on an H200) on a CUDA device where ``liger-kernel`` imports, ``chunked`` everywhere else.
Both compute the same quantity (the sum of the per-token cross-entropy over the targets that are not -100, and
their count; see :mod:`easy_context.loss.fused_ce`), so the choice changes speed and rounding, not the math.

Explicit CUDA-only choices are checked here too, so a run fails at start with one line naming the fix rather
than at its first step: ``liger`` / ``cce`` on a CPU device, or without their package.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import torch

from easy_context.loss.fused_ce import LCE_IMPLS

HEAD_LOSS_IMPLS = (*LCE_IMPLS, "flash_attn")  # what the LM head with loss computes (easy_context.loss.lm_head)

LOSS_CHOICES = ("auto", *HEAD_LOSS_IMPLS)
# impl -> (module that must import, pip name): the Triton kernels, CUDA devices only
CUDA_PACKAGES = {"liger": ("liger_kernel.transformers.functional", "liger-kernel"),
                 "cce": ("cut_cross_entropy", "cut-cross-entropy")}  # fmt: skip


def _device(device: torch.device | str | None) -> torch.device:
    if device is None:  # the device a run on this machine trains on
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def import_problem(impl: str) -> str | None:
    """Why ``impl``'s package cannot be used here (its import fails, any exception: an installed but broken
    package counts as absent), in one line; None when it imports or ``impl`` needs no package."""
    if impl not in CUDA_PACKAGES:
        return None
    try:
        importlib.import_module(CUDA_PACKAGES[impl][0])
    except Exception as exc:  # noqa: BLE001 - Triton without a driver raises RuntimeError at import
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return None


def _version(pip_name: str) -> str:
    try:
        return importlib.metadata.version(pip_name)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def resolve_loss_impl(impl: str, device: torch.device | str | None = None) -> tuple[str, str]:
    """``(concrete impl, one-line reason)`` for ``--loss impl`` on ``device``.

    Args:
        impl: one of :data:`LOSS_CHOICES`.
        device: where the loss runs; None: CUDA when ``torch.cuda.is_available()``, else CPU.

    Raises:
        ValueError: an unknown ``impl``, or a CUDA-only one (``liger``, ``cce``) on another device.
        ImportError: ``liger`` / ``cce`` asked for explicitly whose package does not import (names the pip install).
    """
    if impl not in LOSS_CHOICES:
        raise ValueError(f"unknown loss {impl!r}; choose one of {LOSS_CHOICES}")
    dev = _device(device)
    if impl == "auto":
        if dev.type != "cuda":
            return "chunked", f"auto -> chunked (the device is {dev.type}: liger's kernels need a CUDA GPU)"
        problem = import_problem("liger")
        if problem:
            return "chunked", f"auto -> chunked (liger-kernel does not import: {problem}; pip install liger-kernel)"
        return "liger", f"auto -> liger (liger-kernel {_version('liger-kernel')} on {dev.type})"
    if impl in CUDA_PACKAGES:
        pip_name = CUDA_PACKAGES[impl][1]
        if dev.type != "cuda":
            raise ValueError(f"loss {impl!r} runs on CUDA GPUs only (this run's device is {dev.type}); "
                             "use --loss chunked (or auto)")  # fmt: skip
        problem = import_problem(impl)
        if problem:
            raise ImportError(f"loss {impl!r} needs the {pip_name} package: pip install {pip_name} ({problem}); "
                              "--loss chunked (or auto) runs without it")  # fmt: skip
        return impl, f"{impl} ({pip_name} {_version(pip_name)})"
    return impl, impl
