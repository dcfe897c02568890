"""EasyContext's per-backend names at EasyContext's module paths: thin wrappers over the one API.

Each prepare name returns what ``prepare_seq_parallel_inputs(<mode>, ...)`` returns; each monkey patch (given the
model, or before the model is built) computes exactly what ``apply_seq_parallel_monkey_patch(<mode>, model)`` does
on 2 gloo ranks; a patch that EasyContext's class patch would have applied to an already-built model is refused.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import easy_context as ec
from easy_context.legacy import names as compat
from tests.support.models import tiny_model
from tests.support.reference import rel_err

PATHS = {  # name -> EasyContext's module
    "prepare_zigzag_ring_attn_inputs": "easy_context.zigzag_ring_attn.prepare_inputs",
    "apply_zigzag_ring_attn_monkey_patch_llama": "easy_context.zigzag_ring_attn.monkey_patch",
    "apply_zigzag_ring_attn_monkey_patch_mistral": "easy_context.zigzag_ring_attn.monkey_patch",
    "prepare_dist_flash_attn_inputs": "easy_context.dist_flash_attn.prepare_input",
    "apply_dist_flash_attn_monkey_patch_llama": "easy_context.dist_flash_attn.monkey_patch",
    "prepare_ulysses_attn_inputs": "easy_context.ulysses_attn.prepare_inputs",
    "apply_ulysses_attn_monkey_patch_llama": "easy_context.ulysses_attn.monkey_patch",
    "prepare_usp_attn_inputs": "easy_context.usp.prepare_inputs",
    "apply_usp_attn_monkey_patch_llama": "easy_context.usp.monkey_patch",
}
ALSO = {  # our backend package names for the same objects
    "prepare_dist_flash_attn_inputs": "easy_context.dist_flash_attn.prepare_inputs",
    "prepare_usp_attn_inputs": "easy_context.usp_attn.prepare_inputs",
    "apply_usp_attn_monkey_patch_llama": "easy_context.usp_attn.monkey_patch",
}
PATCHES = {  # case -> (seq_algo, patch name, model type, USP (ring, Ulysses) degrees on 2 ranks)
    "zigzag_llama": ("zigzag_ring_attn", "apply_zigzag_ring_attn_monkey_patch_llama", "llama", None),
    "zigzag_mistral": ("zigzag_ring_attn", "apply_zigzag_ring_attn_monkey_patch_mistral", "mistral", None),
    "dist_flash_llama": ("dist_flash_attn", "apply_dist_flash_attn_monkey_patch_llama", "llama", None),
    "ulysses_llama": ("ulysses_attn", "apply_ulysses_attn_monkey_patch_llama", "llama", None),
    "usp_ring_llama": ("usp_attn", "apply_usp_attn_monkey_patch_llama", "llama", (2, 1)),
    "usp_ulysses_llama": ("usp_attn", "apply_usp_attn_monkey_patch_llama", "llama", (1, 2)),
}


def easycontext(name: str):
    """``name`` imported from EasyContext's module path."""
    return getattr(importlib.import_module(PATHS[name]), name)


def batch(length: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 128, (2, length + 1), generator=torch.Generator().manual_seed(seed))
    inputs = ids[:, :-1]
    return inputs, torch.arange(length).expand_as(inputs), ids[:, 1:]


def undo(model_type: str) -> None:
    ec.apply_seq_parallel_monkey_patch("data_parallel", model_type)  # models built later keep their attention
    compat._USP_RING_DEGREE.clear()


@pytest.mark.parametrize("name", list(PATHS))
def test_both_import_paths_give_one_object(name):
    paths = [PATHS[name], *([ALSO[name]] if name in ALSO else [])]
    assert all(getattr(importlib.import_module(p), name) is getattr(ec, name) for p in paths)
    assert name in ec.__all__


PREPARES = [
    ("zigzag_ring_attn", "prepare_zigzag_ring_attn_inputs", 1),
    ("zigzag_ring_attn", "prepare_zigzag_ring_attn_inputs", 4),
    ("dist_flash_attn", "prepare_dist_flash_attn_inputs", 1),
    ("dist_flash_attn", "prepare_dist_flash_attn_inputs", 4),
    ("ulysses_attn", "prepare_ulysses_attn_inputs", 1),
    ("ulysses_attn", "prepare_ulysses_attn_inputs", 4),
]


@pytest.mark.parametrize("seq_algo, name, world", PREPARES)
def test_prepare_returns_what_prepare_seq_parallel_inputs_returns(seq_algo, name, world):
    inputs, positions, targets = batch(24)
    for rank in range(world):
        got = easycontext(name)(inputs, positions, targets, rank, world, "cpu")
        want = ec.prepare_seq_parallel_inputs(seq_algo, inputs, positions, targets, rank, world, "cpu")
        assert list(got) == ["local_input_ids", "local_position_ids", "local_target_ids"] == list(want)
        assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("ring, ulysses", [(4, 1), (2, 2), (1, 4)])
def test_usp_prepare_returns_what_prepare_seq_parallel_inputs_returns(ring, ulysses):
    inputs, positions, targets = batch(32)
    for rank in range(4):  # EasyContext's argument order: ..., device, ring_degree, ulysses_degree
        got = easycontext("prepare_usp_attn_inputs")(inputs, positions, targets, rank, 4, "cpu", ring, ulysses)
        want = ec.prepare_seq_parallel_inputs("usp_attn", inputs, positions, targets, rank, 4, "cpu", ring_degree=ring)
        assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def patch_worker(rank: int, world: int, case: str) -> float:
    seq_algo, name, model_type, degrees = PATCHES[case]
    opts, deg = ({"ring_degree": degrees[0]}, {"ring_degree": degrees[0]}) if degrees else ({}, {})
    inputs, positions, targets = batch(8 * world)
    reference = tiny_model(model_type)(inputs, position_ids=positions).logits  # one process, the model's attention
    prepare = easycontext(f"prepare_{seq_algo}_inputs")
    local = prepare(inputs, positions, targets, rank, world, "cpu", *(degrees or ()))
    ids, pos = local["local_input_ids"], local["local_position_ids"]
    try:
        plain = ec.apply_seq_parallel_monkey_patch(seq_algo, tiny_model(model_type), **opts)  # not wrapped
        want = plain(ids, position_ids=pos).logits
        given = tiny_model(model_type)
        assert easycontext(name)(model=given, **deg) is given  # EasyContext's train.py order: build, then patch
        got_given = given(ids, position_ids=pos).logits
        undo(model_type)
        assert easycontext(name)(**deg) is None  # EasyContext's other order: patch, then build
        later = tiny_model(model_type)
        assert later.config._attn_implementation == plain.config._attn_implementation
        got_later = later(ids, position_ids=pos).logits
        assert torch.equal(got_given, want) and torch.equal(got_later, want)
        return rel_err(want, ec.extract_local(seq_algo, reference, rank, world, **opts))
    finally:
        undo(model_type)


@pytest.mark.parametrize("case", list(PATCHES))
def test_monkey_patch_computes_what_apply_seq_parallel_monkey_patch_computes(dist_pool, case):
    for err in dist_pool(2).run(patch_worker, case):
        assert err < 1e-5, (case, err)


def test_patch_refuses_a_built_model_it_cannot_reach():
    built = tiny_model("llama")
    other = tiny_model("mistral")  # another type does not matter  # noqa: F841
    fix = r"apply_ulysses_attn_monkey_patch_llama\(model=model\)"
    try:
        with pytest.raises(RuntimeError, match=rf"1 llama model\(s\) already built \(LlamaForCausalLM, .*{fix}"):
            ec.apply_ulysses_attn_monkey_patch_llama()
        assert tiny_model("llama").config._attn_implementation == "eager"  # refused: nothing was patched
        ec.apply_ulysses_attn_monkey_patch_llama(model=built)
        ec.apply_ulysses_attn_monkey_patch_llama()  # every built llama model is on Ulysses now
        assert tiny_model("llama").config._attn_implementation == built.config._attn_implementation
        with pytest.raises(RuntimeError, match=r"apply_usp_attn_monkey_patch_llama\(model=model\)"):
            ec.apply_usp_attn_monkey_patch_llama(ring_degree=2)  # another attention: still refused
    finally:
        undo("llama")


def test_patch_names_the_generic_call_for_another_model_type():
    mistral = tiny_model("mistral")
    with pytest.raises(TypeError, match=r"switches llama models, got 'mistral'.*apply_seq_parallel_monkey_patch"):
        ec.apply_dist_flash_attn_monkey_patch_llama(model=mistral)
    assert mistral.config._attn_implementation == "eager"


@pytest.mark.parametrize("seq_algo, name, world", PREPARES[1::2])
def test_prepare_without_targets_gives_none_targets(seq_algo, name, world):
    """EasyContext's inference call: target_ids None shards the inputs and gives local_target_ids None."""
    inputs, positions, _ = batch(24)
    got = easycontext(name)(inputs, positions, None, 1, world, "cpu")
    want = ec.prepare_seq_parallel_inputs(seq_algo, inputs, positions, inputs, 1, world, "cpu")
    assert got["local_target_ids"] is None
    assert torch.equal(got["local_input_ids"], want["local_input_ids"])
    assert torch.equal(got["local_position_ids"], want["local_position_ids"])
