"""Local attention kernels returning the log-sum-exp, selected by name or ``"auto"``.

``get_kernel(name, device, dtype, head_dim)`` returns an :class:`AttnKernel`. Names: ``cpu``, ``cudnn``,
``flash``, ``efficient``, ``flash_attn`` (the flash-attn package, FlashAttention-2), ``fa4`` (the flash-attn-4
package, FlashAttention-4, on sm90/sm100), ``flex`` (PyTorch's FlexAttention, CUDA only) and ``math`` (explicit
softmax reference). ``auto`` picks the fastest kernel that works for the device, dtype and head_dim
(:data:`CUDA_PREFERENCE` on GPUs); an explicit name that cannot run raises an error saying what to install or choose
instead.

``needs``: the variants (:data:`~easy_context.kernels.base.VARIANTS`) the call computes. ``auto`` then picks the
fastest kernel that supports them all (on a GPU without flash-attn-4, sliding-window blocks and soft-capping:
``flex``; on CPU, soft-capping: ``math``); an explicit kernel that lacks one raises
:class:`~easy_context.kernels.base.VariantError` naming the kernels that have it (never a silent switch).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from easy_context.kernels.base import SUPPORTS, AttnKernel, VariantError, default_scale, kernels_supporting
from easy_context.kernels.cpu import CPU
from easy_context.kernels.cuda_sdpa import CUDNN, EFFICIENT, FLASH
from easy_context.kernels.fa4 import CAPABILITIES as FA4_CAPABILITIES
from easy_context.kernels.fa4 import FA4
from easy_context.kernels.fa4 import unavailable_reason as fa4_unavailable_reason
from easy_context.kernels.flash_attn_pkg import FLASH_ATTN, flash_attn_available
from easy_context.kernels.flex import FLEX
from easy_context.kernels.flex import unavailable_reason as flex_unavailable_reason
from easy_context.kernels.math_ref import MATH

# (math before fa4: a VariantError names the kernels that compute a variant in this order, the one that runs anywhere
# first)
KERNELS: dict[str, AttnKernel] = {k.name: k for k in (CPU, CUDNN, FLASH, EFFICIENT, FLASH_ATTN, MATH, FA4, FLEX)}
KERNEL_NAMES = ("auto", *KERNELS)
SUPPORTS.update({name: frozenset(kern.supports) for name, kern in KERNELS.items()})
# fastest first, measured on an H200 (docs/benchmarks.md, docs/kernels.md): flash-attn-4 (sm90/sm100 only: its
# kernel_works refuses other GPUs without compiling anything) > cuDNN > flash-attn pkg > flash > efficient.
# FlexAttention last: slower than cuDNN on full blocks, it is what auto picks for the variants only it computes without
# fa4 (band blocks of sliding-window layers, soft-capping), instead of the explicit-softmax math kernel
CPU_PREFERENCE = ("cpu",)
CUDA_PREFERENCE = ("fa4", "cudnn", "flash_attn", "flash", "efficient", "flex")

# kernels that take CUDA tensors only (cpu: CPU tensors only; math and auto: any device)
CUDA_ONLY = ("cudnn", "flash", "efficient", "flash_attn", "fa4", "flex")

__all__ = ["AttnKernel", "CUDA_ONLY", "KERNELS", "KERNEL_NAMES", "VariantError", "default_scale", "get_kernel",
           "kernel_works", "kernels_supporting", "machine_reason"]  # fmt: skip


_PROBED: dict[tuple, bool] = {}
_PROBE_ERRORS: dict[tuple, str] = {}  # why a probe call failed (shown by an explicit request for that kernel)


def _flash_attn2_available() -> bool:
    """The FlashAttention-2 package is importable. ``flash_attn_available()`` alone also holds for a flash-attn-4-only
    install, whose ``flash_attn`` is a namespace package holding just ``flash_attn.cute``: FA2 has ``flash_attn_func``
    at the top level."""
    if not flash_attn_available():
        return False
    try:
        from flash_attn import flash_attn_func  # noqa: F401
    except Exception:
        return False
    return True


def _static_reason(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why ``name`` cannot run, from checks that call no kernel (None: a probe call decides)."""
    if name == "flash_attn" and not _flash_attn2_available():
        return "the flash-attn package is not importable; install it with `pip install easy_context[gpu]`"
    if name == "fa4":
        return fa4_unavailable_reason(device, dtype, head_dim)
    if name == "flex":
        return flex_unavailable_reason(device, dtype, head_dim)
    return None


def _device_key(device: torch.device) -> str:
    """'cpu' or 'cuda:<index> <name>' so different GPUs in one process are probed separately."""
    if device.type != "cuda":
        return device.type
    return _cuda_key(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_key(index: int) -> str:  # called on every attention call: no driver query after the first
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def kernel_works(name: str, device: torch.device | str, dtype: torch.dtype, head_dim: int) -> bool:
    """Probe a kernel once per (device, dtype, head_dim) with a tiny GQA forward and backward.

    Kernels that cannot run here for a reason known without calling them (a missing package, the wrong device or
    GPU generation: :func:`_static_reason`) are refused without a probe (for ``fa4``: without compiling anything).
    An out-of-memory failure is not remembered (the next call probes again); any other failure means
    the kernel does not support this configuration.
    """
    device = torch.device(device)
    key = (name, _device_key(device), dtype, head_dim)
    if key not in _PROBED:
        if _static_reason(name, device, dtype, head_dim) is not None:
            _PROBED[key] = False
            return False
        ctx = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        try:
            # the first call often comes inside a checkpointed layer's forward: a probe whose backward runs autograd
            # (flex recomputes its block) must not save tensors into that checkpoint, or its recompute (no probe
            # then, the verdict is cached) saves fewer and torch.utils.checkpoint refuses the step
            with ctx, torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
                _PROBED[key] = _probe(KERNELS[name], device, dtype, head_dim)
        except torch.OutOfMemoryError:
            return False
        except Exception as exc:  # not usable here (this is a probe, not a user call)
            _PROBED[key] = False
            _PROBE_ERRORS[key] = f"{type(exc).__name__}: {exc}"[:300]
    return _PROBED[key]


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _probe(kernel: AttnKernel, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """A tiny causal GQA forward and backward that must agree with the fp32 ``math`` reference on the same inputs: a
    kernel that runs but computes other numbers here (a broken build, a wrong adapter) is never picked."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, dout = (torch.randn(1, 8, 4, head_dim, generator=g).to(device, dtype) for _ in range(2))
    k, v = (torch.randn(1, 8, 2, head_dim, generator=g).to(device, dtype) for _ in range(2))
    scale = head_dim**-0.5
    out, lse = kernel.forward(q, k, v, True, scale)
    grads = kernel.backward(dout, q, k, v, out, lse, True, scale)
    qf, kf, vf = q.float(), k.float(), v.float()
    ref_out, ref_lse = MATH.forward(qf, kf, vf, True, scale)
    ref_grads = MATH.backward(dout.float(), qf, kf, vf, ref_out, ref_lse, True, scale)
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # relative to the largest reference entry (TF32 / bf16 rounding)

    def close(x: torch.Tensor, ref: torch.Tensor) -> bool:
        err = (x.float() - ref).abs().max()
        return (
            x.shape == ref.shape
            and bool(torch.isfinite(x).all())
            and float(err) <= tol * max(1.0, float(ref.abs().max()))
        )

    return all(close(x, r) for x, r in zip((out, lse, *grads), (ref_out, ref_lse, *ref_grads)))


def _unavailable_reason(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    static = _static_reason(name, device, dtype, head_dim)
    if static is not None:
        return static
    if name == "cpu" and device.type != "cpu":
        return "it runs on CPU tensors only"
    if name in ("cudnn", "flash", "efficient") and device.type != "cuda":
        return "it needs CUDA tensors (a GPU build of torch)"
    probe_error = _PROBE_ERRORS.get((name, _device_key(device), dtype, head_dim))
    if probe_error:
        return f"its probe call failed ({probe_error})"
    return f"it does not support {dtype} with head_dim={head_dim} on {device.type} in this torch build"


def machine_reason(name: str, device: str, capabilities: tuple[tuple[int, int], ...] | None = None,
                   fa4_imports: bool | None = None) -> str | None:  # fmt: skip
    """Why kernel ``name`` cannot run on ``device`` (``cuda`` or ``cpu``) of a machine whatever the model, from what
    is known of it without a GPU call: ``capabilities``, the compute capability of each of its GPUs (empty: no CUDA
    GPU; None: not known), ``fa4_imports`` (None: not known). None: nothing known forbids it (a probe call at run
    time decides)."""
    if name not in KERNELS:
        return None  # auto, or a name train.py itself refuses
    if name == "cpu":
        return None if device == "cpu" else f"it runs on CPU tensors only, and the run is on {device}"
    if name not in CUDA_ONLY:
        return None
    if device != "cuda":
        return f"it needs CUDA tensors, and the run is on {device}"
    if capabilities is not None and not capabilities:
        return "it needs CUDA tensors, and this machine has no CUDA GPU (torch.cuda.is_available() is False)"
    if name == "fa4":
        if capabilities and any(major not in FA4_CAPABILITIES for major, _ in capabilities):
            found = ", ".join(sorted({f"{major}.{minor}" for major, minor in capabilities}))
            return f"it needs GPUs of compute capability 9.x or 10.x (Hopper, Blackwell); this machine's are {found}"
        if fa4_imports is False:
            return "flash_attn.cute (FlashAttention-4) does not import; install it with `pip install flash-attn-4`"
    return None


def get_kernel(
    name: str, device: torch.device | str, dtype: torch.dtype, head_dim: int, needs: tuple[str, ...] = ()
) -> AttnKernel:
    """Resolve a kernel name (or ``"auto"``) for tensors of this device, dtype and head_dim that computes the
    variants ``needs``."""
    device = torch.device(device)
    if name == "auto":
        candidates = CUDA_PREFERENCE if device.type == "cuda" else CPU_PREFERENCE
        for cand in candidates:
            if all(n in KERNELS[cand].supports for n in needs) and kernel_works(cand, device, dtype, head_dim):
                return KERNELS[cand]
        if needs and any(kernel_works(c, device, dtype, head_dim) for c in candidates):
            able = [c for c in candidates if all(n in KERNELS[c].supports for n in needs)]
            why = "; ".join(f"{c}: {_unavailable_reason(c, device, dtype, head_dim)}" for c in able)
            warnings.warn(  # same math; shown once per call site
                f"no fused attention kernel on {device.type} computes {', '.join(needs)} here ({why}); using the "
                "explicit-softmax 'math' kernel (O(seq_q x seq_k) memory per block, slow at long context)",
                stacklevel=3,
            )
            return MATH
        warnings.warn(
            f"no fused attention kernel supports {dtype} with head_dim={head_dim} on {device}; using the "
            "explicit-softmax 'math' kernel (O(seq^2) memory)",
            stacklevel=3,
        )
        return MATH
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; choose one of {KERNEL_NAMES}")
    if name != "math" and not kernel_works(name, device, dtype, head_dim):
        raise RuntimeError(
            f"attention kernel {name!r} cannot run here: {_unavailable_reason(name, device, dtype, head_dim)}. "
            "Use kernel='auto' to pick one that works."
        )
    for variant in needs:
        KERNELS[name].require(variant)
    return KERNELS[name]
