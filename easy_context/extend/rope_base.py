"""The lower bound of the RoPE base for a context length (Men et al., "Base of RoPE Bounds Context Length", 2024).

With frequencies ``theta_i = base ** (-2 i / rotary_dim)``, i = 0 .. rotary_dim/2 - 1, the paper's long-term-decay
property asks that a query still attends more to a similar key than to a random one at every distance ``m`` of the
context: ``B(m) = sum_i cos(m * theta_i) >= 0`` for every integer ``0 <= m <= length`` (``B`` is that expected score
gap up to a positive factor). The bound is the smallest base for which this holds.

Whether a base holds is not monotone in the base: just below the bound, narrow windows of bases hold with failing
bases between them (at 8K tokens and rotary_dim 128, 8.4e4 holds while 8.6e4-9.8e4 do not). So the bound is found
by a scan upward over a log grid, not by bisection: the first base of the grid that holds (the paper's figure takes
the same). :func:`min_rope_base` returns it; ``stable=True`` returns the first base after which every grid point up to
``stable_span`` times it holds too, the choice with margin for a recipe.

The scan is over every integer distance in float64 (``m * theta`` reaches 1e6 radians at 1M tokens; float32 would lose
the phase); a failing base stops at its first negative distance (blocks of distances that grow from 1,024).
"""

from __future__ import annotations

import functools
import math

import torch

_FIRST_BLOCK = 1024  # distances in the first block of a scan; each next block is 4x (most failing bases fail early)


def decay_sum(distances: torch.Tensor, base: float, rotary_dim: int) -> torch.Tensor:
    """``B(m) = sum_i cos(m * base ** (-2 i / rotary_dim))`` for each distance (float64, ``distances``' shape)."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be an even number >= 2, got {rotary_dim}")
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    theta = torch.tensor(float(base), dtype=torch.float64) ** (-2.0 * i / rotary_dim)
    return torch.cos(distances.to(torch.float64).unsqueeze(-1) * theta).sum(-1)


def first_negative(base: float, rotary_dim: int, length: int) -> int | None:
    """The smallest distance ``m <= length`` with ``B(m) < 0``, or None when there is none."""
    start, block = 1, _FIRST_BLOCK
    while start <= length:
        m = torch.arange(start, min(start + block, length + 1), dtype=torch.float64)
        negative = torch.nonzero(decay_sum(m, base, rotary_dim) < 0)
        if len(negative):
            return start + int(negative[0, 0])
        start, block = start + block, min(block * 4, 1 << 18)
    return None


def satisfies_bound(base: float, rotary_dim: int, length: int) -> bool:
    """Whether ``base`` keeps ``B(m) >= 0`` for every distance up to ``length``."""
    return first_negative(base, rotary_dim, length) is None


def min_rope_base(
    rotary_dim: int, length: int, ratio: float = 1.005, stable: bool = False, stable_span: float = 2.0,
    low: float = 100.0, high: float = 1e15,
) -> float:  # fmt: skip
    """The first base of the log grid ``low * ratio ** k`` that keeps ``B(m) >= 0`` for every ``m <= length``.

    ``rotary_dim``: the rotated dimensions of a head (head_dim, or head_dim * partial_rotary_factor). ``stable``: the
    first such base from which every base of a 2 % grid up to ``stable_span`` times it holds as well.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    base = low
    while base <= high:
        if satisfies_bound(base, rotary_dim, length):
            checks = math.ceil(math.log(stable_span) / math.log(1.02)) if stable else 0
            failing = next((base * 1.02**j for j in range(1, checks + 1)
                            if not satisfies_bound(base * 1.02**j, rotary_dim, length)), None)  # fmt: skip
            if failing is None:
                return base
            base = failing
        base *= ratio
    raise ValueError(f"no RoPE base in [{low:g}, {high:g}] keeps the decay bound for {length} tokens at rotary_dim "
                     f"{rotary_dim}")  # fmt: skip


# min_rope_base(d, L, stable=True) to 3 significant figures for (rotary dim, length): the scan takes from seconds
# (d 64, 32K) to many minutes (d 128, 1M) on CPU, so a derived recipe looks the bound up here first.
# bench/rope_base_table.py computes entries; tests/unit/test_extend_derive.py checks the fast ones against the scan.
STABLE_BOUNDS: dict[tuple[int, int], float] = {
    (128, 8192): 1.80e5,
    (128, 32768): 2.80e6,
    (64, 32768): 2.69e7,
    (64, 65536): 1.36e8,
    (256, 131072): 7.71e6,
    (256, 262144): 8.99e6,
    (128, 131072): 2.28e7,
    (128, 262144): 4.84e7,
    (128, 1048576): 1.31e9,
}


@functools.cache  # a scan takes seconds; derive asks again for every layout it tries
def stable_rope_base(rotary_dim: int, length: int) -> tuple[float, str]:
    """``min_rope_base(rotary_dim, length, stable=True)`` and how it was found: from :data:`STABLE_BOUNDS` at the
    smallest tabled length >= ``length`` (a base that holds to a longer length holds to this one), else the scan."""
    tabled = sorted(n for d, n in STABLE_BOUNDS if d == rotary_dim and n >= length)
    if tabled:
        return STABLE_BOUNDS[(rotary_dim, tabled[0])], f"tabled for rotary dim {rotary_dim} at {tabled[0]} tokens"
    return min_rope_base(rotary_dim, length, stable=True), f"scanned for rotary dim {rotary_dim} at {length} tokens"
