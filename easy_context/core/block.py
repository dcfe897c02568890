"""One block of attention work: query rows x key rows of a rank's local tensors (the unit every schedule, document
split and sliding-window cut speaks in)."""

from __future__ import annotations

from dataclasses import dataclass, field

from easy_context.kernels.base import Band

ALL = slice(None)


@dataclass(frozen=True)
class Block:
    """Query rows ``q_rows`` attend to key rows ``k_rows`` (local indices); ``causal`` only when square.

    ``batch``: the batch rows it covers (all of them, or one row when documents differ between rows).
    ``band``: (lo, hi), query row i sees key row j only when lo <= i - j <= hi (block-local; a sliding window's
    cut, :mod:`easy_context.core.windows`); None: every key row (or the causal triangle).
    """

    q_rows: slice
    k_rows: slice
    causal: bool
    batch: slice = field(default_factory=lambda: ALL)
    band: Band | None = None
