"""The RoPE base lower bound (easy_context.extend.rope_base) against the numbers Men et al. publish ("Base of RoPE
Bounds Context Length", 2024: rotary_dim 128, Llama's head; their Figure 1 / Table), against the definition, and
against a term-by-term scan written here (every base, every distance, one cosine each)."""

from __future__ import annotations

import math

import pytest
import torch

from easy_context.extend import decay_sum, min_rope_base, rope_base, satisfies_bound
from easy_context.extend.rope_base import STABLE_BOUNDS, first_negative, first_negatives


def _holds(base: float, rotary_dim: int, length: int) -> bool:
    """The definition: B(m) >= 0 at every distance 1..length, each a sum of cosines."""
    return bool((decay_sum(torch.arange(1, length + 1, dtype=torch.float64), base, rotary_dim) >= 0).all())


def _term_by_term_scan(rotary_dim: int, length: int, stable: bool) -> float:
    """The grid walk min_rope_base documents, base by base: the first base of the 0.5 % grid from 100 that holds;
    stable: every base of the 2 % grid up to 2x it holds too, else the walk goes on just above the first that fails."""
    base, checks = 100.0, math.ceil(math.log(2.0) / math.log(1.02)) if stable else 0
    while True:
        if _holds(base, rotary_dim, length):
            failing = next((base * 1.02**j for j in range(1, checks + 1)
                            if not _holds(base * 1.02**j, rotary_dim, length)), None)  # fmt: skip
            if failing is None:
                return base
            base = failing
        base *= 1.005


@pytest.fixture
def one_thread():
    """Thousands of small cosine sums: one thread is several times faster than two on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("rotary_dim, length", [(16, 1024), (32, 2048), (128, 2048), (64, 4096)])
def test_the_fast_scan_is_the_term_by_term_scan(rotary_dim, length, one_thread):
    """The same float, first and stable bound (the stable walks restart 7-22 times here)."""
    for stable in (False, True):
        assert min_rope_base(rotary_dim, length, stable=stable) == _term_by_term_scan(rotary_dim, length, stable)


def test_first_negatives_are_the_definitions():
    """The smallest negative distance of each base, many bases at once, equals a term-by-term search; a base that
    holds has none."""
    length, bases = 20000, [3e3, 2e4, 9e4, 1.2e5, 5e5, 2e6]
    m = torch.arange(1, length + 1, dtype=torch.float64)
    want = []
    for base in bases:
        negative = torch.nonzero(decay_sum(m, base, 128) < 0)
        want.append(int(negative[0, 0]) + 1 if len(negative) else None)
    assert first_negatives(bases, 128, length) == want
    assert want[0] is not None and want[-1] is None


@pytest.mark.parametrize("key", sorted(STABLE_BOUNDS))
def test_every_tabled_bound_is_the_scan(key):
    """The table's entries (3 significant figures) are the scan's stable bounds; up to 1M tokens each takes seconds."""
    assert min_rope_base(*key, stable=True) == pytest.approx(STABLE_BOUNDS[key], rel=5e-3)


def test_a_long_scan_reports_progress(monkeypatch, capsys):
    """A scan past the progress threshold says where it is on stderr (a dry run must not look hung)."""
    monkeypatch.setattr(rope_base, "_PROGRESS_AFTER", 0.0)
    min_rope_base(32, 2048, stable=True)
    assert "RoPE base bound for rotary dim 32 at 2,048 tokens: at base" in capsys.readouterr().err


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
