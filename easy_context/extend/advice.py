"""What to change when a plan does not fit its hardware: each knob (more GPUs, more host memory, a larger GPU) tried
by planning again with it, so that the advice names only a value that fits, or says that none does.

    fitting_knobs(fits, gpus=1, gpu_bytes=80e9, host_bytes=2e9)  # "planned again, it fits with --host-mem 4GB a node"
"""

from __future__ import annotations

from collections.abc import Callable

from easy_context.models.shapes import GB
from easy_context.training.flops import GPUS

FACTORS = (2, 4, 8, 16, 32, 64)  # the multiples of the GPUs and of the host memory tried, smallest first


def _size(nbytes: float) -> str:
    """Bytes as a --host-mem value: 4GB, 512GB, 8.192TB."""
    return f"{nbytes / GB:.4g}GB" if nbytes < 1000 * GB else f"{nbytes / (1000 * GB):.4g}TB"


def smallest_factor(fits: Callable[[int], bool]) -> int | None:
    """The smallest of :data:`FACTORS` for which ``fits`` holds, or None when the largest does not (more of the knob
    is assumed to help, never hurt: a bisection over the factors)."""
    if not fits(FACTORS[-1]):
        return None
    lo, hi = -1, len(FACTORS) - 1  # FACTORS[hi] fits; FACTORS[lo] (none at -1) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(FACTORS[mid]) else (mid, hi)
    return FACTORS[hi]


def fitting_knobs(fits: Callable[[int, float, float], bool], gpus: int, gpu_bytes: float, host_bytes: float) -> str:
    """The changes that make the plan fit, each checked by ``fits(gpus, gpu_bytes, host_bytes)`` (planning again
    with it): the fewest GPUs (up to 64 x), the least host memory per node (up to 64 x), the largest GPU of the
    table; or the sentence that none of them does."""
    found = []
    more_gpus = smallest_factor(lambda f: fits(gpus * f, gpu_bytes, host_bytes))
    if more_gpus:
        found.append(f"--gpus {gpus * more_gpus}")
    more_host = smallest_factor(lambda f: fits(gpus, gpu_bytes, host_bytes * f))
    if more_host:
        found.append(f"--host-mem {_size(host_bytes * more_host)} a node")
    largest = max(GPUS.items(), key=lambda item: item[1].memory_gb)
    if largest[1].memory_gb * GB > gpu_bytes and fits(gpus, largest[1].memory_gb * GB, host_bytes):
        found.append(f"--gpu {largest[0]} ({largest[1].memory_gb} GB a GPU)")
    if found:
        return f"planned again, it fits with {' or with '.join(found)}"
    tried = (f"--gpus {gpus * FACTORS[-1]}, --host-mem {_size(host_bytes * FACTORS[-1])}, --gpu {largest[0]} "
             f"({largest[1].memory_gb} GB a GPU)")  # fmt: skip
    return f"no knob makes it fit (planned again with {tried}): give a shorter --to"
