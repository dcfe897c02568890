"""A switched transformers model used the transformers way with the sequence split over ranks: what runs gives the
one-process numbers, what cannot is refused in one line naming the way that works."""

from __future__ import annotations

import torch

import easy_context as ec
from tests.support.models import tiny_model

ALGOS = [("zigzag_ring_attn", {}), ("ulysses_attn", {}), ("usp_attn", {"ring_degree": 2}), ("dist_flash_attn", {})]


def generate_worker(rank: int, world: int) -> list[str]:
    """generate() on this rank's shard under each backend: the error of each (every one must refuse)."""
    errors = []
    for algo, opts in ALGOS:
        model = ec.apply_seq_parallel_monkey_patch(algo, tiny_model("llama"), **opts)
        local = ec.prepare_seq_parallel_inputs(algo, torch.arange(1, 8 * world + 1)[None], None, None, rank, world,
                                               "cpu", **opts)  # fmt: skip
        try:
            model.generate(local["local_input_ids"], max_new_tokens=2, do_sample=False, pad_token_id=0)
            errors.append("")
        except NotImplementedError as exc:
            errors.append(str(exc))
    return errors


def test_generate_is_refused_under_sp(dist_pool):
    """generate() gives transformers' cache to a sharded model: refused on every rank, naming the library's own
    generation (its cache stays sharded)."""
    for errors in dist_pool(2).run(generate_worker):
        for error in errors:
            assert "KV caches are not supported" in error and "greedy_generate" in error and "\n" not in error, error
