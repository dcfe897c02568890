"""Model-level parity: tiny Llama/Mistral/Qwen2/Qwen3 under every SP backend vs one process."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import easy_context as ec
from tests.support.dist_pool import RemoteError
from tests.support.models import tiny_model
from tests.support.reference import rel_err

ALGOS = [
    ("zigzag_ring_attn", {}),
    ("ulysses_attn", {}),
    ("usp_attn", {"ring_degree": 2}),
    ("dist_flash_attn", {}),
]


def _batch(world, seed=1, batch=2, chunks=3):
    g = torch.Generator().manual_seed(seed)
    s = 4 * world * chunks
    ids = torch.randint(0, 128, (batch, s + 1), generator=g)
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[torch.rand(targets.shape, generator=g) < 0.4] = -100  # many ignored targets
    return inputs, targets


def _token_loss_sum(logits, targets):
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum"
    )


def heads_for(world: int) -> dict[str, int]:
    """Tiny-model head counts every backend can split on ``world`` ranks: 4 query / 2 K/V heads, 6 / 3 (hidden 96)
    on 3 ranks (Ulysses needs the heads divisible by the world; head dim 16 either way)."""
    return {"heads": 6, "kv_heads": 3, "hidden_size": 96} if world == 3 else {}


def model_parity_worker(rank, world, algo, opts, model_type, checkpoint_every=None):
    """Logits and every parameter gradient of the patched tiny model on this rank's shard against the
    single-process model; ``opts`` may hold the patch's ``kernel`` / ``always`` (data_parallel)."""
    overrides = {**heads_for(world), **({"num_hidden_layers": 5} if checkpoint_every else {})}
    ref_model = tiny_model(model_type, **overrides)
    shard_opts = {k: v for k, v in opts.items() if k not in ("kernel", "always")}
    sharded = ec.get_seq_algo(algo).distributed
    inputs, targets = _batch(world)
    if sharded:  # the last rank's shard gets no valid target at all (it must contribute 0, never NaN)
        last = ec.extract_local(algo, torch.arange(inputs.shape[1])[None], world - 1, world, **shard_opts)[0]
        targets[:, last] = -100
    positions = torch.arange(inputs.shape[1]).expand_as(inputs)
    ref_logits = ref_model(inputs, position_ids=positions).logits
    n_valid = (targets != -100).sum()
    (_token_loss_sum(ref_logits, targets) / n_valid).backward()

    sp_model = copy.deepcopy(ref_model)
    sp_model.zero_grad(set_to_none=True)
    ec.apply_seq_parallel_monkey_patch(algo, sp_model, **opts)
    assert sp_model.config._attn_implementation.startswith("easy_context_"), "not patched: nothing would be tested"
    if checkpoint_every:  # strided checkpointing: regenerating forwards run the SP collectives inside the backward
        from easy_context.memory import apply_checkpointing

        apply_checkpointing(sp_model.train(), "full", checkpoint_every=checkpoint_every)
    local = ec.prepare_seq_parallel_inputs(algo, inputs, positions, targets, rank, world, "cpu", **shard_opts)
    logits = sp_model(local["local_input_ids"], position_ids=local["local_position_ids"]).logits
    loss_sum = _token_loss_sum(logits, local["local_target_ids"])
    global_count = (local["local_target_ids"] != -100).sum()
    if sharded:
        dist.all_reduce(global_count)
    (loss_sum / global_count).backward()
    assert torch.isfinite(loss_sum)
    errs = {"logits": rel_err(logits, ec.extract_local(algo, ref_logits.detach(), rank, world, **shard_opts))}
    for (name, p), (_, p_ref) in zip(sp_model.named_parameters(), ref_model.named_parameters()):
        grad = p.grad.clone()
        if sharded:
            dist.all_reduce(grad)  # the gradient of the global loss is the sum over SP ranks
        errs[name] = rel_err(grad, p_ref.grad)
    return errs


def models_parity_worker(rank, world, algo, opts, model_types):
    """:func:`model_parity_worker` for several model types in one distributed call: {model type: errors}."""
    return {m: model_parity_worker(rank, world, algo, opts, m) for m in model_types}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("algo,opts", ALGOS, ids=[a for a, _ in ALGOS])
def test_model_parity(dist_pool, world, algo, opts, model_type):
    if world == 2 and algo == "usp_attn":
        opts = {"ring_degree": 1}
    for rank, errs in enumerate(dist_pool(world).run(model_parity_worker, algo, opts, model_type)):
        worst = max(errs, key=errs.get)
        assert errs[worst] < 2e-5, f"rank {rank}: {worst} rel err {errs[worst]:.2e}"


@pytest.mark.parametrize("world,algo,opts", [(3, "zigzag_ring_attn", {}), (3, "dist_flash_attn", {}),
                                             (4, "ulysses_attn", {}), (4, "usp_attn", {"ring_degree": 2})])  # fmt: skip
def test_model_parity_with_checkpoint_every(dist_pool, world, algo, opts):
    """5 layers in groups of 2 (inputs of layers 1 and 3 regenerated in the backward), on 3 and 4 ranks."""
    for rank, errs in enumerate(dist_pool(world).run(model_parity_worker, algo, opts, "llama", 2)):
        worst = max(errs, key=errs.get)
        assert errs[worst] < 2e-5, f"rank {rank}: {worst} rel err {errs[worst]:.2e}"


def bad_input_worker(rank, world, case):
    from transformers import AutoModelForCausalLM

    from tests.support.models import tiny_config

    overrides = {
        "dropout": {"attention_dropout": 0.1},
    }.get(case, {})
    cfg = tiny_config("llama", **overrides)
    model = AutoModelForCausalLM.from_config(cfg)
    ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model)
    ids = torch.randint(0, 128, (1, 16))
    pos = ec.extract_local("zigzag_ring_attn", torch.arange(16 * world)[None], rank, world)  # this rank's shard
    kwargs = {"position_ids": pos}
    if case == "padding_mask":
        kwargs["attention_mask"] = torch.tensor([[0] * 4 + [1] * 12])
    if case == "no_positions":
        kwargs = {}
    if case == "ones_mask":  # an all-ones mask is harmless and accepted (with contiguous positions, sharded)
        kwargs["attention_mask"] = torch.ones(1, 16, dtype=torch.long)
    if case == "kv_cache":
        from transformers import DynamicCache

        kwargs["past_key_values"] = DynamicCache()
    model(ids, **kwargs)
    return "ok"


@pytest.mark.parametrize(
    "case,message",
    [
        ("dropout", "attention dropout"),
        ("padding_mask", "zeros between real tokens"),  # each rank's shard pads its start: zeros inside the row
        ("no_positions", "pass position_ids"),
        ("kv_cache", "KV caches are not supported"),
    ],
)
def test_unsupported_features_raise(dist_pool, case, message):
    with pytest.raises(RemoteError, match=message):
        dist_pool(2).run(bad_input_worker, case)


def test_all_ones_mask_is_accepted(dist_pool):
    assert dist_pool(2).run(bad_input_worker, "ones_mask") == ["ok", "ok"]


def type_patch_worker(rank, world):
    """EasyContext style: patch a model type, then build the model."""
    ec.apply_seq_parallel_monkey_patch("ulysses_attn", "qwen2")
    try:
        model = tiny_model("qwen2")
        return model.config._attn_implementation
    finally:
        ec.apply_seq_parallel_monkey_patch("data_parallel", "qwen2")  # undo for later tests


def test_model_type_string_patch(dist_pool):
    names = dist_pool(2).run(type_patch_worker)
    assert all(n.startswith("easy_context_ulysses_attn") for n in names)


def test_prepare_inputs_and_padding():
    ids = torch.arange(2999)[None]
    with pytest.raises(ValueError, match="pad_seq_parallel_inputs"):
        ec.prepare_seq_parallel_inputs("zigzag_ring_attn", ids, None, ids, 0, 4, "cpu")
    p_ids, p_pos, p_tgt = ec.pad_seq_parallel_inputs("zigzag_ring_attn", ids, None, ids.clone(), 4, pad_token_id=7)
    assert p_ids.shape[1] == 3000 and p_ids[0, -1] == 7 and p_tgt[0, -1] == -100 and p_pos[0, -1] == 2999
    local = ec.prepare_seq_parallel_inputs("zigzag_ring_attn", p_ids, p_pos, p_tgt, 1, 4, "cpu")
    assert set(local) == {"local_input_ids", "local_position_ids", "local_target_ids"}
    assert local["local_position_ids"][0].tolist() == list(range(375, 750)) + list(range(2250, 2625))
    with pytest.raises(ValueError, match="unknown sequence-parallel mode"):
        ec.apply_seq_parallel_monkey_patch("ring", "llama")


def test_output_attentions_and_masks_raise():
    """(Soft-capping, sinks and sliding windows are computed: tests/distributed/test_attention_variants2.py.)"""
    from types import SimpleNamespace

    from easy_context.hf import check_supported

    q = torch.zeros(1, 2, 8, 4)
    plain = SimpleNamespace(config=SimpleNamespace())
    with pytest.raises(NotImplementedError, match="output_attentions"):
        check_supported(plain, "data_parallel", q, None, 0.0, {"output_attentions": True})
    with pytest.raises(NotImplementedError, match="attention mask"):
        check_supported(plain, "data_parallel", q, torch.ones(1, 1, 8, 8), 0.0, {})
    check_supported(plain, "data_parallel", q, None, 0.0, {"sliding_window": 4, "softcap": 50.0})  # computed


def positional_mask_worker(rank, world):
    from tests.support.models import tiny_model

    model = tiny_model("llama")
    ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model)
    ids = torch.randint(0, 128, (1, 16))
    pos = ec.extract_local("zigzag_ring_attn", torch.arange(16 * world)[None], rank, world)  # this rank's shard
    errors = []
    for call in (
        lambda: model(ids, torch.tensor([[0] * 4 + [1] * 12]), pos),  # mask and positions passed positionally
        lambda: model.get_decoder()(ids),  # the decoder called directly (as CausalLMWithLoss does) is guarded
    ):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    model(ids, None, pos)  # positional position_ids are found
    return errors


def test_guard_sees_positional_arguments_and_the_decoder(dist_pool):
    for errors in dist_pool(2).run(positional_mask_worker):
        assert len(errors) == 2 and "zeros between real tokens" in errors[0] and "pass position_ids" in errors[1]


def test_data_parallel_patch_is_an_explicit_choice():
    """data_parallel with kernel auto keeps the model's own attention unless ``always`` asks for ours (what
    checkpoint-after-attention needs); the outputs are the same either way."""
    ids = torch.randint(0, 128, (1, 16))
    plain = tiny_model("llama")
    reference = plain(ids).logits
    assert ec.apply_seq_parallel_monkey_patch("data_parallel", plain) is plain
    assert plain.config._attn_implementation == "eager"
    ours = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model("llama"), always=True)
    assert ours.config._attn_implementation.startswith("easy_context_data_parallel")
    torch.testing.assert_close(ours(ids, position_ids=torch.arange(16)[None]).logits, reference)


def amp_parity_worker(rank, world, algo, opts):
    """fp32 weights under bf16 autocast (accelerate's default AMP): RoPE hands fp32 q/k next to a bf16 v."""
    ref_model = tiny_model("llama")
    inputs, targets = _batch(world)
    positions = torch.arange(inputs.shape[1]).expand_as(inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_logits = ref_model(inputs, position_ids=positions).logits
    (_token_loss_sum(ref_logits, targets) / (targets != -100).sum()).backward()
    sp_model = copy.deepcopy(ref_model)
    sp_model.zero_grad(set_to_none=True)
    ec.apply_seq_parallel_monkey_patch(algo, sp_model, **opts)
    local = ec.prepare_seq_parallel_inputs(algo, inputs, positions, targets, rank, world, "cpu", **opts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = sp_model(local["local_input_ids"], position_ids=local["local_position_ids"]).logits
    count = (targets != -100).sum()
    (_token_loss_sum(logits, local["local_target_ids"]) / count).backward()
    errs = {"logits": rel_err(logits.float(), ec.extract_local(algo, ref_logits.detach().float(), rank, world, **opts))}
    for (name, p), (_, p_ref) in zip(sp_model.named_parameters(), ref_model.named_parameters()):
        assert p.grad.dtype == torch.float32, name  # gradients come back in the weights' dtype
        grad = p.grad.clone()
        dist.all_reduce(grad)
        errs[name] = rel_err(grad, p_ref.grad)
    return errs


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algo,opts", ALGOS, ids=[a for a, _ in ALGOS])
def test_mixed_precision_autocast_parity(dist_pool, world, algo, opts):
    if world == 2 and algo == "usp_attn":
        opts = {"ring_degree": 1}
    for rank, errs in enumerate(dist_pool(world).run(amp_parity_worker, algo, opts)):
        worst = max(errs, key=errs.get)  # bf16 rounding (~1e-2), not a layout error (~1)
        assert errs["logits"] < 2e-2 and errs[worst] < 3e-2, (algo, rank, worst, errs[worst])


def test_fp64_inputs_are_refused_on_every_rank(dist_pool):
    errors = dist_pool(2).run(fp64_worker)
    assert all("float64 inputs are not supported" in e and "cast to float32" in e for e in errors)


def fp64_worker(rank, world):
    q = torch.randn(1, 8, 4, 8, dtype=torch.float64)
    try:
        ec.get_attn_func("zigzag_ring_attn")(q, q, q)
    except ValueError as exc:
        return str(exc)
    return "no error"
