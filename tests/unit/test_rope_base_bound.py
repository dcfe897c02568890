"""The RoPE base lower bound (easy_context.extend.rope_base) against the numbers Men et al. publish ("Base of RoPE
Bounds Context Length", 2024: rotary_dim 128, Llama's head; their Figure 1 / Table) and against the definition."""

from __future__ import annotations

import pytest
import torch

from easy_context.extend import decay_sum, min_rope_base, satisfies_bound
from easy_context.extend.rope_base import first_negative


@pytest.mark.parametrize("length, published", [(1024, 4.3e3), (4096, 2.7e4), (8192, 8.4e4)])
def test_bound_matches_the_paper(length, published):
    """The published bounds for rotary_dim 128, within 7 % (the paper's scan grid is not stated)."""
    assert min_rope_base(128, length) == pytest.approx(published, rel=0.07)


def test_bound_is_the_first_base_that_holds():
    """The result holds at every distance; the grid base before it does not (a negative score gap below length)."""
    base = min_rope_base(128, 4096)
    assert satisfies_bound(base, 128, 4096)
    m = first_negative(base / 1.005, 128, 4096)
    assert m is not None and m <= 4096
    assert decay_sum(torch.tensor([float(m)]), base / 1.005, 128).item() < 0


def test_the_stable_bound_has_margin():
    """Just above the first base that holds, some bases fail again (the property is not monotone in the base): the
    stable bound is larger and every base up to twice it holds."""
    first, stable = min_rope_base(128, 8192), min_rope_base(128, 8192, stable=True)
    assert stable > first
    assert not all(satisfies_bound(first * 1.02**j, 128, 8192) for j in range(1, 36))
    assert all(satisfies_bound(stable * 1.02**j, 128, 8192) for j in range(0, 36))


def test_decay_sum_is_the_cosine_sum():
    """B(0) = rotary_dim / 2; base 1 makes every frequency 1: B(m) = (rotary_dim / 2) cos(m)."""
    m = torch.arange(0, 5, dtype=torch.float64)
    torch.testing.assert_close(decay_sum(m, 1.0, 8), 4 * torch.cos(m))
    assert decay_sum(torch.tensor([0.0]), 5e5, 256).item() == 128


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rotary_dim must be an even number"):
        decay_sum(torch.arange(3.0), 1e4, 7)
    with pytest.raises(ValueError, match="length must be >= 1"):
        min_rope_base(128, 0)
    with pytest.raises(ValueError, match="no RoPE base in"):
        min_rope_base(128, 8192, high=1e3)
