"""EasyContext's per-backend names: each prepare/patch pair reproduces the single-process model on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch

import easy_context as ec
from easy_context.legacy import names as compat
from tests.support.models import tiny_model
from tests.support.reference import rel_err

PAIRS = {  # name -> (seq_algo, prepare, patch, model type, extra prepare args on 2 ranks)
    "zigzag_llama": ("zigzag_ring_attn", "prepare_zigzag_ring_attn_inputs",
                     "apply_zigzag_ring_attn_monkey_patch_llama", "llama", ()),
    "zigzag_mistral": ("zigzag_ring_attn", "prepare_zigzag_ring_attn_inputs",
                       "apply_zigzag_ring_attn_monkey_patch_mistral", "mistral", ()),
    "dist_flash_llama": ("dist_flash_attn", "prepare_dist_flash_attn_inputs",
                         "apply_dist_flash_attn_monkey_patch_llama", "llama", ()),
    "ulysses_llama": ("ulysses_attn", "prepare_ulysses_attn_inputs", "apply_ulysses_attn_monkey_patch_llama",
                      "llama", ()),
    "usp_llama": ("usp_attn", "prepare_usp_attn_inputs", "apply_usp_attn_monkey_patch_llama", "llama", (1, 2)),
}  # fmt: skip


def pair_worker(rank: int, world: int, name: str) -> float:
    seq_algo, prepare, patch, model_type, extra = PAIRS[name]
    if extra and world == 4:
        extra = (2, 2)  # ring 2 x Ulysses 2
    ids = torch.randint(0, 128, (2, 8 * world + 1), generator=torch.Generator().manual_seed(3))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    positions = torch.arange(inputs.shape[1]).expand_as(inputs)
    reference = tiny_model(model_type)(inputs, position_ids=positions).logits
    getattr(ec, patch)(*((extra[0],) if extra else ()))  # EasyContext: patch the type, then build the model
    try:
        model = tiny_model(model_type)
        assert model.config._attn_implementation.startswith(f"easy_context_{seq_algo.replace('flash', 'fl4sh')}")
        local = getattr(ec, prepare)(inputs, positions, targets, rank, world, "cpu", *extra)
        logits = model(local["local_input_ids"], position_ids=local["local_position_ids"]).logits
        opts = {"ring_degree": extra[0]} if extra else {}
        assert torch.equal(local["local_target_ids"], ec.extract_local(seq_algo, targets, rank, world, **opts))
        return rel_err(logits, ec.extract_local(seq_algo, reference, rank, world, **opts))
    finally:
        ec.apply_seq_parallel_monkey_patch("data_parallel", model_type)  # undo for later tests
        compat._USP_RING_DEGREE.clear()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", list(PAIRS))
def test_easycontext_names_match_one_process(dist_pool, world, name):
    for err in dist_pool(world).run(pair_worker, name):
        assert err < 1e-5, (name, err)


def test_usp_degrees_must_agree():
    ids = torch.zeros(1, 16, dtype=torch.long)
    with pytest.raises(ValueError, match="must equal world_size 4"):
        ec.prepare_usp_attn_inputs(ids, None, ids, 0, 4, "cpu", 2, 1)
    ec.apply_usp_attn_monkey_patch_llama(ring_degree=2)
    try:
        with pytest.raises(ValueError, match=r"patched for ring_degree 2; call .*ring_degree=4"):
            ec.prepare_usp_attn_inputs(ids, None, ids, 0, 4, "cpu", 4, 1)
        local = ec.prepare_usp_attn_inputs(ids, None, ids, 0, 4, "cpu", 2, 2)
        assert local["local_input_ids"].shape == (1, 4)
    finally:
        ec.apply_seq_parallel_monkey_patch("data_parallel", "llama")
        compat._USP_RING_DEGREE.clear()
