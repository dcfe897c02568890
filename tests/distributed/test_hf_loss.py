"""transformers' own causal-LM loss on a switched model under SP, against the one-process model with its own attention.

Each rank passes ``shift_labels=`` (its shard of the globally shifted targets) and ``num_items_in_batch=`` (the global
count of valid targets): its loss is its share of the token mean, and the sum over ranks is the one-process loss;
the gradients summed over ranks are the one-process gradients. ``labels=`` alone on a shard is refused."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import easy_context as ec
from tests.support.models import tiny_model
from tests.support.reference import rel_err

ALGOS = [("zigzag_ring_attn", {}), ("ulysses_attn", {}), ("usp_attn", {"ring_degree": 2}), ("dist_flash_attn", {})]


def _batch(world: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) of 2 rows, transformers-style labels (unshifted) with many -100."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 4 * world * 3), generator=g)
    labels = ids.clone()
    labels[torch.rand(labels.shape, generator=g) < 0.3] = -100
    return ids, labels


def hf_loss_worker(rank: int, world: int, model_type: str) -> dict[str, dict[str, float | str]]:
    """Per backend: the all-reduced transformers loss of the switched model, the one-process loss, the worst parameter
    gradient error, and the error ``labels=`` alone raises."""
    ids, labels = _batch(world)
    ref_model = tiny_model(model_type)
    ref_loss = ref_model(ids, labels=labels).loss  # transformers' attention and loss on one process
    ref_loss.backward()
    targets = ec.shift_targets(labels)
    count = (targets != -100).sum()
    results = {}
    for algo, opts in ALGOS:
        model = copy.deepcopy(ref_model)
        model.zero_grad(set_to_none=True)
        ec.apply_seq_parallel_monkey_patch(algo, model, **opts)
        local = ec.prepare_seq_parallel_inputs(algo, ids, None, targets, rank, world, "cpu", **opts)
        shard = local["local_target_ids"]
        loss = model(local["local_input_ids"], position_ids=local["local_position_ids"], labels=shard,
                     shift_labels=shard, num_items_in_batch=count).loss  # fmt: skip
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        grad_err = 0.0
        for p, p_ref in zip(model.parameters(), ref_model.parameters()):
            grad = p.grad.clone()
            dist.all_reduce(grad)
            grad_err = max(grad_err, rel_err(grad, p_ref.grad))
        try:
            model(local["local_input_ids"], position_ids=local["local_position_ids"], labels=local["local_input_ids"])
            refused = ""
        except ValueError as exc:
            refused = str(exc)
        results[algo] = {"loss": total.item(), "ref": ref_loss.item(), "grad_err": grad_err, "refused": refused}
    return results


@pytest.mark.parametrize("world", [2, 4])
def test_hf_loss_with_shift_labels_matches_one_process(dist_pool, world):
    for rank, results in enumerate(dist_pool(world).run(hf_loss_worker, "llama")):
        for algo, r in results.items():
            assert abs(r["loss"] - r["ref"]) < 1e-5 * r["ref"], (rank, algo, r)
            assert r["grad_err"] < 2e-5, (rank, algo, r)
            assert "\n" not in r["refused"], r["refused"]
            for needle in ("labels=", "shift_labels=", "prepare_seq_parallel_inputs", "shift_targets"):
                assert needle in r["refused"], (algo, r["refused"])
