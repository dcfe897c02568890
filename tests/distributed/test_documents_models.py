"""Packed documents through whole models under every SP backend: logits and gradients against transformers' own
packed forward on one device and against each document run alone; variant models; refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import easy_context as ec
from tests.distributed.test_documents import doc_lengths, positions_of
from tests.support.dist_pool import RemoteError
from tests.support.models import tiny_model
from tests.support.reference import rel_err

# ------------------------------------------------------------------------------------------------ model parity


def _packed_batch(world: int, seed: int = 1):
    """Two rows of packed documents (a continuation starting at position 5, one-token documents), many -100s."""
    g = torch.Generator().manual_seed(seed)
    length = 4 * world * 3
    ids = torch.randint(0, 128, (2, length + 1), generator=g)
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[torch.rand(targets.shape, generator=g) < 0.3] = -100
    rows = [doc_lengths(length, length // (2 * world), 7), doc_lengths(length, length // world, 8)]
    positions = torch.stack([positions_of(rows[0]), positions_of(rows[1], first=5)])
    return inputs, positions, targets


def _loss_sum(logits, targets):
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum"
    )


def model_per_document_reference(model, inputs, positions, targets, backward: bool = True):
    """Each document of each row run alone through the single-process model (the ground truth of document masking):
    the (batch, seq, vocab) logits; ``backward``: the token-mean loss's gradient is accumulated in the model's
    ``.grad``."""
    n_valid = (targets != -100).sum()
    rows = []
    for r in range(inputs.shape[0]):
        restarts = (positions[r, 1:] != positions[r, :-1] + 1).nonzero().flatten() + 1
        bounds = [0, *restarts.tolist(), inputs.shape[1]]
        parts = []
        for a, b in zip(bounds, bounds[1:]):
            logits = model(inputs[r : r + 1, a:b], position_ids=positions[r : r + 1, a:b], use_cache=False).logits
            if backward:
                (_loss_sum(logits, targets[r : r + 1, a:b]) / n_valid).backward()
            parts.append(logits.detach())
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows)


# transformers 5.24's GptOssModel builds its eager masks without position_ids, so on one process it attends across
# packed documents (its flash-attention path does mask them, from the position ids); every other model here masks them
ACROSS_IN_TRANSFORMERS = {"gpt_oss"}


def model_worker(rank, world, algo, opts, model_types, checkpointing=None):
    """{model type: errors} of the patched tiny models' logits and every parameter gradient on a packed batch against
    transformers' own packed forward on one process (gpt-oss: against each document run alone)."""
    from tests.distributed.test_hf_models import heads_for

    inputs, positions, targets = _packed_batch(world)
    shard_opts = {k: v for k, v in opts.items() if k not in ("kernel", "always")}
    sharded = ec.get_seq_algo(algo).distributed
    results = {}
    for model_type in model_types:
        ref_model = tiny_model(model_type, **heads_for(world))
        if model_type in ACROSS_IN_TRANSFORMERS:
            ref_logits = model_per_document_reference(ref_model, inputs, positions, targets)
        else:  # transformers' own masking (equal to each document alone: test_transformers_masks_documents)
            ref_logits = ref_model(inputs, position_ids=positions, use_cache=False).logits
            (_loss_sum(ref_logits, targets) / (targets != -100).sum()).backward()
            ref_logits = ref_logits.detach()
        with torch.no_grad():  # the documents matter: attending across them gives other logits
            across = ref_model(inputs, position_ids=positions, attention_mask=torch.ones_like(inputs), use_cache=False)
        assert rel_err(across.logits, ref_logits) > 1e-2

        sp_model = copy.deepcopy(ref_model)
        sp_model.zero_grad(set_to_none=True)
        ec.apply_seq_parallel_monkey_patch(algo, sp_model, **opts)
        assert sp_model.config._attn_implementation.startswith("easy_context_"), "not patched: nothing tested"
        if checkpointing:
            from easy_context.memory import apply_checkpointing

            apply_checkpointing(sp_model.train(), checkpointing)
        local = ec.prepare_seq_parallel_inputs(algo, inputs, positions, targets, rank, world, "cpu", **shard_opts)
        logits = sp_model(local["local_input_ids"], position_ids=local["local_position_ids"]).logits
        count = (local["local_target_ids"] != -100).sum()
        if sharded:
            dist.all_reduce(count)
        (_loss_sum(logits, local["local_target_ids"]) / count).backward()
        errs = {"logits": rel_err(logits, ec.extract_local(algo, ref_logits, rank, world, **shard_opts))}
        for (name, p), (_, p_ref) in zip(sp_model.named_parameters(), ref_model.named_parameters()):
            grad = p.grad.clone()
            if sharded:
                dist.all_reduce(grad)
            errs[name] = rel_err(grad, p_ref.grad)
        results[model_type] = errs
    return results


def test_transformers_masks_documents():
    """The reference: transformers' packed forward (``use_cache=False``) equals each document run alone, for every
    tiny model the parity tests use but gpt-oss, whose packed forward attends across the documents (if this changes
    with a transformers upgrade, drop it from ACROSS_IN_TRANSFORMERS and from docs/documents.md)."""
    inputs, positions, targets = _packed_batch(2)
    for model_type in ("llama", "qwen3", "gemma2", "gemma3_text", "gpt_oss", "mistral_sliding", "deepseek_v3"):
        model = tiny_model(model_type)
        with torch.no_grad():
            packed = model(inputs, position_ids=positions, use_cache=False).logits
            alone = model_per_document_reference(model, inputs, positions, targets, backward=False)
        err = rel_err(packed, alone)
        assert (err > 1e-2) if model_type in ACROSS_IN_TRANSFORMERS else (err < 1e-5), (model_type, err)


LLAMA_QWEN3 = ("llama", "qwen3")
MODEL_CASES = [  # (world, algo, options, model types, checkpointing); 6 query / 3 K/V heads on 3 ranks
    *[
        (w, a, {}, LLAMA_QWEN3, None)
        for w in (2, 3, 4)
        for a in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn")
    ],  # fmt: skip
    (2, "usp_attn", {"ring_degree": 2}, LLAMA_QWEN3, None),
    (3, "usp_attn", {"ring_degree": 1}, LLAMA_QWEN3, None),  # 3 is prime: Ulysses or ring inside USP
    (3, "usp_attn", {"ring_degree": 3}, LLAMA_QWEN3, None),
    (4, "usp_attn", {"ring_degree": 2}, LLAMA_QWEN3, None),
    (2, "data_parallel", {"kernel": "cpu"}, LLAMA_QWEN3, None),
    (2, "zigzag_ring_attn", {}, ("llama",), "attn"),  # checkpoint-after-attention: the replay keeps the documents
    (2, "dist_flash_attn", {}, ("qwen3",), "full"),  # the recompute runs attention again (cached documents)
    # attn-global: the global layer's attention replayed, the sliding layer's re-run (Gemma 3's pattern in miniature)
    (2, "zigzag_ring_attn", {}, ("gemma3_text",), "attn-global"),
    (4, "ulysses_attn", {}, ("gemma3_text",), "attn-global"),
]


@pytest.mark.parametrize("world,algo,opts,model_types,checkpointing", MODEL_CASES,
                         ids=lambda x: str(x) if not isinstance(x, (dict, tuple)) else "")  # fmt: skip
def test_model_parity_with_packed_documents(dist_pool, world, algo, opts, model_types, checkpointing):
    for rank, per_model in enumerate(dist_pool(world).run(model_worker, algo, opts, model_types, checkpointing)):
        for model_type, errs in per_model.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"{model_type} rank {rank}: {worst} rel err {errs[worst]:.2e}"


VARIANTS = ("gemma2", "gemma3_text", "gpt_oss", "mistral_sliding", "deepseek_v3")
VARIANT_CASES = [("zigzag_ring_attn", {}, 2), ("dist_flash_attn", {}, 3), ("ulysses_attn", {}, 4),
                 ("usp_attn", {"ring_degree": 2}, 4), ("data_parallel", {"always": True}, 2)]  # fmt: skip


@pytest.mark.parametrize("algo,opts,world", VARIANT_CASES, ids=[f"{a}-w{w}" for a, _, w in VARIANT_CASES])
def test_variant_models_with_packed_documents(dist_pool, algo, opts, world):
    """Packed documents through the attention-variant models (Gemma 2 soft-cap + window, Gemma 3 and Mistral windows,
    gpt-oss window + sinks, DeepSeek-V3 MLA), one backend per world: each document attended alone, exactly."""
    for rank, per_model in enumerate(dist_pool(world).run(model_worker, algo, opts, VARIANTS)):
        for model_type, errs in per_model.items():
            worst = max(errs, key=errs.get)
            assert errs[worst] < 2e-5, f"{model_type} rank {rank}: {worst} rel err {errs[worst]:.2e}"


def ones_mask_worker(rank, world, packed):
    model = ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", tiny_model("llama"))
    ids = torch.randint(0, 128, (1, 16))
    pos = positions_of([5, 11])[None] if packed else torch.arange(16)[None]
    local = ec.prepare_seq_parallel_inputs("zigzag_ring_attn", ids, pos, ids, rank, world, "cpu")
    model(local["local_input_ids"], position_ids=local["local_position_ids"],
          attention_mask=torch.ones_like(local["local_input_ids"]))  # fmt: skip
    return "ok"


def test_all_ones_mask_with_packed_documents_is_refused(dist_pool):
    """transformers attends across documents when given an attention_mask: refused, never guessed."""
    assert dist_pool(2).run(ones_mask_worker, False) == ["ok", "ok"]
    with pytest.raises(RemoteError, match="drop attention_mask to train with document masking"):
        dist_pool(2).run(ones_mask_worker, True)


def test_data_parallel_masks_documents_where_transformers_does_not():
    """gpt-oss's own attention ignores position_ids in its masks (above): data_parallel with the default kernel routes
    it through easy_context's attention, so a packed batch equals each document alone, as under every SP backend."""
    from easy_context.hf.patch import OWN_MASKS_IGNORE_POSITION_IDS

    assert set(ACROSS_IN_TRANSFORMERS) <= OWN_MASKS_IGNORE_POSITION_IDS
    inputs, positions, targets = _packed_batch(2)
    model = tiny_model("gpt_oss")
    with pytest.warns(UserWarning, match="ignores position_ids"):
        ec.apply_seq_parallel_monkey_patch("data_parallel", model)
    assert model.config._attn_implementation.startswith("easy_context_data_parallel")
    with torch.no_grad():
        packed = model(inputs, position_ids=positions, use_cache=False).logits
        alone = model_per_document_reference(model, inputs, positions, targets, backward=False)
    assert rel_err(packed, alone) < 1e-5
