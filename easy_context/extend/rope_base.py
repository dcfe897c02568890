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

The scan checks every integer distance in float64 (``m * theta`` reaches 1e6 radians at 1M tokens; float32 would lose
the phase). It is fast (seconds at 1M tokens on one CPU core; a term-by-term scan took minutes to hours) without
changing a decision: ``B`` over a block of distances is one batched matrix product (:func:`_decay_block`); the grid's
bases are checked many at once, a base leaving at its first negative block; a base is first checked at the distances
where it most likely fails (the first ones for a base far below the bound, the last ones for one just below it), and
only a base that holds there is checked over the rest. A value within :data:`_RECHECK` of zero is evaluated again
term by term (:func:`decay_sum`), so every sign, hence every decision and the result, is the term-by-term scan's.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Iterator

import torch

_FIRST_BLOCK = 1024  # distances in the first block of a check; each next block is 2x (most failing bases fail early)
_BLOCK_ELEMENTS = 1 << 22  # bases x distances evaluated at once (32 MB of float64)
_RECHECK = 1e-6  # |B(m)| below this is evaluated again as decay_sum does (the two forms differ by < 1e-8 at 1M tokens)
_NEAR, _FAR = 1024, 1 << 14  # a chunk's bases are checked together over this many first and last distances
_GROUP = 8  # bases checked over every distance at once, in order (groups of 1, 2, 4, then this many)
_FIRST_CHUNK = 16  # grid bases in the first chunk of a walk; x2 per chunk without a holding base
_MAX_CHUNK = 256  # each chunk's bases after the first that holds are checked in vain
_PROGRESS_AFTER = 2.0  # seconds before a search reports its progress on stderr


def decay_sum(distances: torch.Tensor, base: float, rotary_dim: int) -> torch.Tensor:
    """``B(m) = sum_i cos(m * base ** (-2 i / rotary_dim))`` for each distance (float64, ``distances``' shape)."""
    _check_dim(rotary_dim)
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    theta = torch.tensor(float(base), dtype=torch.float64) ** (-2.0 * i / rotary_dim)
    return torch.cos(distances.to(torch.float64).unsqueeze(-1) * theta).sum(-1)


def _check_dim(rotary_dim: int) -> None:
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be an even number >= 2, got {rotary_dim}")


def _decay_block(theta: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``B(start .. start + count - 1)`` for each row of frequencies ``theta`` (n, rotary_dim / 2): (n, count).

    A distance is ``s + j`` with ``s`` on a stride-J grid and ``j < J``, so ``cos((s + j) t) = cos(s t) cos(j t) -
    sin(s t) sin(j t)`` and the sum over frequencies is one batched matrix product: (S + J) x h cosines instead of
    count x h."""
    stride = 1 << max(0, math.ceil(math.log2(count) / 2))
    starts = start + stride * torch.arange(math.ceil(count / stride), dtype=torch.float64)
    a = starts[None, :, None] * theta[:, None, :]  # (n, S, h)
    b = torch.arange(stride, dtype=torch.float64)[None, :, None] * theta[:, None, :]  # (n, J, h)
    left = torch.cat([torch.cos(a), torch.sin(a)], -1)  # (n, S, 2h)
    right = torch.cat([torch.cos(b), -torch.sin(b)], -1)  # (n, J, 2h)
    out = left @ right.mT  # (n, S, J): distance s + j at [s, j]
    return out.reshape(len(theta), -1)[:, :count]


def _negatives(bases: list[float], rotary_dim: int, lo: int, hi: int, descending: bool = False) -> dict[int, int]:
    """For each base (by index) with ``B(m) < 0`` at some distance ``lo <= m <= hi``, one such distance: the smallest
    when ascending; from the top down when descending (a base just below the bound fails near the length: there it
    fails in the first blocks).

    All bases advance together over blocks of distances that grow from :data:`_FIRST_BLOCK`; a base leaves at its
    first negative block. Values within :data:`_RECHECK` of zero are evaluated again with :func:`decay_sum`, so each
    sign is the one the term-by-term sum gives."""
    _check_dim(rotary_dim)
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    theta = torch.tensor(bases, dtype=torch.float64)[:, None] ** (-2.0 * i / rotary_dim)  # (n, h)
    found: dict[int, int] = {}
    alive = list(range(len(bases)))
    block = _FIRST_BLOCK
    while lo <= hi and alive:
        count = min(block, hi - lo + 1, max(_FIRST_BLOCK, _BLOCK_ELEMENTS // len(alive)))
        start = hi - count + 1 if descending else lo
        values = _decay_block(theta[alive], start, count)
        rows = torch.nonzero(values.amin(-1) < _RECHECK)[:, 0]  # a negative value, or one to evaluate again
        doubtful = values[rows]
        for row, col in torch.nonzero(doubtful.abs() < _RECHECK).tolist():
            base = bases[alive[int(rows[row])]]
            doubtful[row, col] = decay_sum(torch.tensor([float(start + col)]), base, rotary_dim)[0]
        negative = doubtful < 0
        first = negative.to(torch.int8).argmax(-1).tolist()
        for row, col, failed in zip(rows.tolist(), first, negative.any(-1).tolist()):
            if failed:
                found[alive[row]] = start + col
        alive = [k for k in alive if k not in found]
        lo, hi = (lo, hi - count) if descending else (lo + count, hi)
        block *= 2
    return found


def first_negatives(bases: list[float], rotary_dim: int, length: int) -> list[int | None]:
    """For each base, the smallest distance ``m <= length`` with ``B(m) < 0``, or None when there is none."""
    found = _negatives(bases, rotary_dim, 1, length)
    return [found.get(k) for k in range(len(bases))]


def first_negative(base: float, rotary_dim: int, length: int) -> int | None:
    """The smallest distance ``m <= length`` with ``B(m) < 0``, or None when there is none."""
    return first_negatives([base], rotary_dim, length)[0]


def satisfies_bound(base: float, rotary_dim: int, length: int) -> bool:
    """Whether ``base`` keeps ``B(m) >= 0`` for every distance up to ``length``."""
    return first_negative(base, rotary_dim, length) is None


def _first_holding(bases: list[float], rotary_dim: int, length: int) -> int | None:
    """The index of the first base that keeps the bound to ``length``, or None. Every base is checked over the first
    :data:`_NEAR` distances (a base far below the bound fails there) and the last :data:`_FAR` (one just below it
    fails there); the survivors over the rest, in order, :data:`_GROUP` at once."""
    near = min(length, _NEAR)
    far = max(near + 1, length - _FAR + 1)
    failing = _negatives(bases, rotary_dim, 1, near)
    survivors = [k for k in range(len(bases)) if k not in failing]
    failing = _negatives([bases[k] for k in survivors], rotary_dim, far, length, descending=True)
    survivors = [k for n, k in enumerate(survivors) if n not in failing]
    for group in _groups(survivors):
        failing = _negatives([bases[k] for k in group], rotary_dim, near + 1, far - 1, descending=True)
        holding = [k for n, k in enumerate(group) if n not in failing]
        if holding:
            return holding[0]
    return None


def _first_failing(bases: list[float], rotary_dim: int, length: int) -> int | None:
    """The index of the first base that fails the bound to ``length``, or None: in order, :data:`_GROUP` at once."""
    for group in _groups(list(range(len(bases)))):
        failing = _negatives([bases[k] for k in group], rotary_dim, 1, length, descending=True)
        if failing:
            return group[min(failing)]
    return None


def _groups(items: list[int]) -> Iterator[list[int]]:
    """``items`` in order, in groups of 1, 2, 4, ... :data:`_GROUP` (a group's later members are checked in vain once
    an earlier one decides, and often the first does)."""
    start, size = 0, 1
    while start < len(items):
        yield items[start : start + size]
        start, size = start + size, min(size * 2, _GROUP)


def min_rope_base(
    rotary_dim: int, length: int, ratio: float = 1.005, stable: bool = False, stable_span: float = 2.0,
    low: float = 100.0, high: float = 1e15,
) -> float:  # fmt: skip
    """The first base of the log grid ``low * ratio ** k`` that keeps ``B(m) >= 0`` for every ``m <= length``.

    ``rotary_dim``: the rotated dimensions of a head (head_dim, or head_dim * partial_rotary_factor). ``stable``: the
    first such base from which every base of a 2 % grid up to ``stable_span`` times it holds as well (a failing one
    restarts the grid just above it). Each base holds or fails exactly as a check of every distance says; the grid
    is walked in chunks, many bases at once. Reports progress on stderr past :data:`_PROGRESS_AFTER` seconds.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    _check_dim(rotary_dim)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is several times faster than two on a loaded machine
    try:
        return _walk(rotary_dim, length, ratio, stable, stable_span, low, high)
    finally:
        torch.set_num_threads(threads)


def _walk(rotary_dim: int, length: int, ratio: float, stable: bool, stable_span: float, low: float,
          high: float) -> float:  # fmt: skip
    """:func:`min_rope_base`'s walk over the grid."""
    checks = math.ceil(math.log(stable_span) / math.log(1.02)) if stable else 0
    t0, reported = time.monotonic(), 0.0
    base, chunk = low, _FIRST_CHUNK
    while base <= high:
        grid = [base]
        while len(grid) < chunk and grid[-1] * ratio <= high:
            grid.append(grid[-1] * ratio)  # the same floats as multiplying one base after another
        k = _first_holding(grid, rotary_dim, length)
        elapsed = time.monotonic() - t0
        if elapsed > _PROGRESS_AFTER and elapsed - reported > _PROGRESS_AFTER:
            reported = elapsed
            print(f"  RoPE base bound for rotary dim {rotary_dim} at {length:,} tokens: at base "
                  f"{grid[-1 if k is None else k]:.3g} after {elapsed:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        if k is None:
            base, chunk = grid[-1] * ratio, min(chunk * 2, _MAX_CHUNK)
            continue
        base = grid[k]
        j = _first_failing([base * 1.02**j for j in range(1, checks + 1)], rotary_dim, length)
        if j is None:
            return base
        base, chunk = base * 1.02 ** (j + 1) * ratio, _FIRST_CHUNK
    raise ValueError(f"no RoPE base in [{low:g}, {high:g}] keeps the decay bound for {length} tokens at rotary_dim "
                     f"{rotary_dim}")  # fmt: skip


# min_rope_base(d, L, stable=True) to 3 significant figures for (rotary dim, length): a derived recipe looks the bound
# up here first (the scan takes 0.3-3 s of one core for these). bench/rope_base_table.py computes entries;
# tests/unit/test_rope_base_bound.py checks every one against the scan.
STABLE_BOUNDS: dict[tuple[int, int], float] = {
    (128, 8192): 1.80e5,
    (128, 32768): 2.80e6,
    (64, 32768): 2.69e7,
    (64, 65536): 1.36e8,
    (256, 131072): 7.71e6,
    (256, 262144): 9.07e6,
    (128, 131072): 2.28e7,
    (128, 262144): 4.84e7,
    (128, 1048576): 1.31e9,
}


@functools.cache  # derive asks again for every layout it tries
def stable_rope_base(rotary_dim: int, length: int) -> tuple[float, str]:
    """``min_rope_base(rotary_dim, length, stable=True)`` and how it was found: from :data:`STABLE_BOUNDS` at the
    smallest tabled length >= ``length`` (a base that holds to a longer length holds to this one), else the scan."""
    tabled = sorted(n for d, n in STABLE_BOUNDS if d == rotary_dim and n >= length)
    if tabled:
        return STABLE_BOUNDS[(rotary_dim, tabled[0])], f"tabled for rotary dim {rotary_dim} at {tabled[0]} tokens"
    return min_rope_base(rotary_dim, length, stable=True), f"scanned for rotary dim {rotary_dim} at {length} tokens"
