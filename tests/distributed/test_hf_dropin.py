"""A switched transformers model used the transformers way with the sequence split over ranks: what runs gives the
one-process numbers, what cannot is refused in one line naming the way that works."""

from __future__ import annotations

import pytest
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


def _padded_batch(world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of 3 rows: left padding with generate()'s positions (restarting at
    the first real token, pads at 1), right padding, left padding with positions counting from the row's start."""
    seq = 4 * world * 3
    ids = torch.randint(1, 128, (3, seq), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5], mask[1, seq - 7 :], mask[2, :3] = 0, 0, 0
    positions = torch.arange(seq).expand(3, seq).clone()
    positions[0] = (mask[0].cumsum(-1) - 1).masked_fill(mask[0] == 0, 1)
    return ids.masked_fill(mask == 0, 0), mask, positions


def padding_worker(rank: int, world: int, model_type: str) -> dict[str, float | str]:
    """Per backend: the worst relative error of this rank's logits at its real tokens against the one-process model
    with transformers' attention and the full mask; then the error a mask with a zero between real tokens raises."""
    from easy_context.sp_config import sp_config_for
    from tests.support.reference import rel_err

    ids, mask, positions = _padded_batch(world)
    reference = tiny_model(model_type)(ids, attention_mask=mask, position_ids=positions).logits.detach()
    results: dict[str, float | str] = {}
    for algo, opts in ALGOS:
        model = ec.apply_seq_parallel_monkey_patch(algo, tiny_model(model_type), **opts)
        local = ec.prepare_seq_parallel_inputs(algo, ids, positions, None, rank, world, "cpu", attention_mask=mask,
                                               **opts)  # fmt: skip
        logits = model(local["local_input_ids"], attention_mask=local["local_attention_mask"],
                       position_ids=local["local_position_ids"]).logits  # fmt: skip
        batch = sp_config_for(algo, world, sp_rank=rank, **opts).local_batch(ids, positions, None, "cpu",
                                                                             attention_mask=mask)  # fmt: skip
        assert torch.equal(batch.attention_mask, local["local_attention_mask"])
        want = ec.extract_local(algo, reference, rank, world, **opts)
        real = local["local_attention_mask"].bool()
        results[algo] = rel_err(logits[real], want[real])
    inner = mask.clone()
    inner[1, 3] = 0
    local = ec.prepare_seq_parallel_inputs("zigzag_ring_attn", ids, positions, None, rank, world, "cpu",
                                           attention_mask=inner)  # fmt: skip
    try:
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", tiny_model(model_type))(
            local["local_input_ids"], attention_mask=local["local_attention_mask"],
            position_ids=local["local_position_ids"])  # fmt: skip
        results["inner"] = ""
    except ValueError as exc:
        results["inner"] = str(exc)
    return results


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_padding_masks_under_sp_match_one_process(dist_pool, world, model_type):
    """Left and right padding, sharded with the inputs, give transformers' one-process logits at every real token
    (float32, 2e-5 relative) under every backend; zeros between real tokens are refused on every rank."""
    for rank, results in enumerate(dist_pool(world).run(padding_worker, model_type)):
        inner = results.pop("inner")
        assert "zeros between real tokens" in inner and "\n" not in inner, inner
        for algo, err in results.items():
            assert err < 2e-5, (rank, algo, err)


def _lookups(algo: str, opts: dict, rank: int, world: int) -> tuple[int, int]:
    """The registry lookups of switching a tiny Llama to ``algo``, and of one forward + backward of this rank's shard
    (a loss through shift_labels, two packed documents)."""
    from tests.support.registry_lookups import count_lookups

    seq = 8 * world
    ids = torch.randint(1, 128, (1, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(seq // 2), torch.arange(seq - seq // 2)])[None]
    model = tiny_model("llama")
    switch = count_lookups(lambda: ec.apply_seq_parallel_monkey_patch(algo, model, **opts))
    local = ec.prepare_seq_parallel_inputs(algo, ids, positions, ec.shift_targets(ids), rank, world, "cpu", **opts)

    def step():
        out = model(local["local_input_ids"], position_ids=local["local_position_ids"], labels=ids,
                    shift_labels=local["local_target_ids"])  # fmt: skip
        out.loss.backward()

    return switch, count_lookups(step)


def lookups_worker(rank: int, world: int) -> dict[str, tuple[int, int]]:
    return {algo: _lookups(algo, opts, rank, world) for algo, opts in ALGOS}


def test_the_backend_is_looked_up_once_at_the_switch(dist_pool):
    """Every SP backend is looked up once when a model is switched; its forward and backward on 2 ranks look nothing
    up (the attention function, the guards and the checks hold the backend object)."""
    for counts in dist_pool(2).run(lookups_worker):
        assert counts == {algo: (1, 0) for algo, _ in ALGOS}, counts
