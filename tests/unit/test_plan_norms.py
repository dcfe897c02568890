"""The planner's RMSNorm terms (eager vs chunked) and checkpoint groups: predictions against the probes."""

from __future__ import annotations

import pytest

from easy_context.plan import (
    NORM_CHUNK_ROWS,
    Setup,
    budget_at,
    build_budget,
    load_model_shape,
    parse_config,
    parse_size,
    predict,
    validate_probe,
)
from tests.e2e.test_plan import H200_PROBES, SPLIT, _h200, _main, _setup


# ------------------------------------------------------------------------ RMSNorm: eager vs chunked
def test_chunked_norm_predicts_longer_host_adamw_split(capsys):
    """enable_chunked_rmsnorm: no (s, h) fp32 copies saved, no 5 fp32 temporaries in the backward; the same H200
    host_adamw split configuration reaches a longer S (the 8B one validated by H200_CHUNKED_PROBE)."""
    longest = {}
    for model in ("llama-3-8b", "llama-2-7b"):
        shape, eager = _h200(model)
        chunked = _h200(model, norm="chunked")[1]
        pe, pc = (predict(shape, s, "data_parallel", SPLIT) for s in (eager, chunked))
        print(f"\n{model}: eager {pe.max_seq:,} ({pe.limited_by}), chunked {pc.max_seq:,} ({pc.limited_by})")
        assert pe.limited_by.startswith("gpu:norm bwd")
        assert pc.max_seq > pe.max_seq and pc.limited_by.startswith("gpu:") and "norm bwd" not in pc.limited_by
        b = budget_at(shape, chunked, "data_parallel", SPLIT, pc.max_seq)
        assert b.at(pc.max_seq)["gpu_total"] <= chunked.gpu_mem and b.at(pc.max_seq)["host_total"] <= chunked.host_mem
        longest[model] = pc.max_seq
    text = _main(capsys, "--model", "llama-3-8b", "--gpus", "1", "--gpu-mem", "139.8GiB", "--host-mem", "125GiB",
                 "--optim", "host_adamw", "--sp", "data_parallel", "--options", "offload-split+tiled+chunked",
                 "--mlp-tile-tokens", "8192", "--norm", "chunked")  # fmt: skip
    assert "chunked RMSNorm" in text and "eager RMSNorm backward" not in text
    assert f"S = {longest['llama-3-8b']:,} tokens" in text  # the breakdown at the predicted max S
    with pytest.raises(ValueError):
        _setup(norm="fused")


def test_chunked_norm_phase_terms():
    shape, eager = _h200("llama-3-8b", pinned_pow2=False)
    chunked = _h200("llama-3-8b", pinned_pow2=False, norm="chunked")[1]
    h, A = shape.hidden, 2 * shape.hidden
    seq, k = 1 << 18, 12
    be, bc = (build_budget(shape, s, "data_parallel", SPLIT, offload_layers=k) for s in (eager, chunked))
    assert set(be.phases) == set(bc.phases)  # host_adamw: the '@ layer 0' moments too
    names = [t.name for terms in bc.phases.values() for t in terms]
    assert not any("5 x s x h" in n or "eager RMSNorm" in n or "fp32 h1 copy" in n or "fp32 x copy" in n for n in names)
    assert any("5 x s x h" in t.name for t in be.phases["norm bwd"])
    for phase in ("norm bwd", "norm bwd @ layer 0"):  # the chunked backward's temporaries: fixed, (4096, h) fp32
        temps = [t for t in bc.phases[phase] if "chunked RMSNorm backward" in t.name]
        assert len(temps) == 1 and temps[0].per_token == 0
        assert temps[0].fixed == pytest.approx(5 * NORM_CHUNK_ROWS * h * 4 + 4 * h)

    def per_token(b, phase):
        return sum(t.per_token for t in b.phases[phase])

    # bytes per token saved by the chunked norm, per moment: input norm 3A (x saved by reference), post norm 2A
    # (h1 kept instead of its fp32 copy + x_hat), final norm 2A; its backward: 10A + 2A - (d n2 + dx + h1 = 3A)
    # the top layer's input is resident (on the GPU anyway); layer 0's comes back from the host for its recompute,
    # and the chunked norm keeps it alive through the layer's backward (eager frees it): A less saved there
    for at, kept in (("", 0), (" @ layer 0", A)):
        assert per_token(be, "attn fwd" + at) - per_token(bc, "attn fwd" + at) == pytest.approx(3 * A)
        assert per_token(be, "attn bwd" + at) - per_token(bc, "attn bwd" + at) == pytest.approx(3 * A - kept)
        assert per_token(be, "mlp bwd" + at) - per_token(bc, "mlp bwd" + at) == pytest.approx(5 * A - kept)
        assert per_token(be, "norm bwd" + at) - per_token(bc, "norm bwd" + at) == pytest.approx(12 * A - kept)
        # chunked: the norm backward is a moment below the tiled MLP's backward (same bytes per token)
        assert per_token(bc, "norm bwd" + at) == pytest.approx(per_token(bc, "mlp bwd" + at))
    assert per_token(be, "loss") - per_token(bc, "loss") == pytest.approx(2 * A)
    re_, rc = be.at(seq), bc.at(seq)
    assert re_["peak_phase"] == "norm bwd" and rc["peak_phase"] in ("mlp bwd", "attn bwd")
    assert rc["phase_totals"]["norm bwd"] < rc["phase_totals"]["mlp bwd"]
    assert rc["gpu_total"] < re_["gpu_total"] and rc["host_total"] == pytest.approx(re_["host_total"])


def test_validate_reads_the_probes_norm():
    row = dict(H200_PROBES[3], command="python bench/max_context.py --model shape:llama-2-7b --chunked-rmsnorm")
    chunked = validate_probe(row)
    assert chunked["norm"] == "chunked" and not chunked["gpu_phase"].startswith("norm bwd")
    assert validate_probe(row, norm="eager")["pred_gpu_allocated"] == pytest.approx(
        validate_probe(H200_PROBES[3])["pred_gpu_allocated"])  # fmt: skip
    assert chunked["pred_gpu_allocated"] < validate_probe(H200_PROBES[3])["pred_gpu_allocated"]


def test_shape_models_build_the_published_architectures():
    """``shape:<name>`` builds the planner's built-in shape (params counted on the meta device, no memory)."""
    import torch

    from easy_context.models import load_model, shape_config

    with torch.device("meta"):
        model = load_model("shape:llama-3-8b", max_position_embeddings=8192)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # what the H200 probes measured
    assert shape_config("shape:Meta-Llama-3.1-8B").num_key_value_heads == 8  # aliases, any case
    with pytest.raises(ValueError, match="unknown model shape"):
        shape_config("shape:llama-9b")


def test_checkpoint_every_stores_one_input_per_group():
    """checkpoint_every=K: ceil(L/K) layer inputs held (GPU and host), K-1 regenerated inputs in a group's backward,
    K=1 exactly the ordinary budget; the 8 x H200 Llama-3-8B limit grows past the 5M-token target at K=2."""
    from dataclasses import replace

    shape = load_model_shape("llama-3-8b")
    base = Setup(gpus=8, gpu_mem=parse_size("141GB"), host_mem=parse_size("560GB"), norm="chunked")
    cfg = parse_config("offload-split+tiled+chunked")
    s = 1 << 20
    for k, stored in ((1, 32), (2, 16), (3, 11), (40, 1)):
        setup = replace(base, checkpoint_every=k)
        assert setup.stored_inputs(32) == stored
        full = build_budget(shape, setup, "ulysses_attn", parse_config("full+tiled+chunked")).at(s)
        ckpt = [b for name, b in full["gpu"] if name.startswith("layer-input checkpoints")]
        assert ckpt == [pytest.approx(stored * 2 * 4096 * full["local_tokens"])]
        per_input = 2 * 4096 * full["local_tokens"]
        regen = [b for name, b in full["gpu"] if name.startswith("regenerated layer inputs")]
        assert regen == ([pytest.approx((min(k, 32) - 1) * per_input)] if k > 1 else [])
        off = build_budget(shape, setup, "ulysses_attn", parse_config("offload+tiled+chunked")).at(s)
        regen = [b for name, b in off["gpu"] if name.startswith("regenerated layer inputs")]  # own input: x back
        assert regen == ([pytest.approx((min(k, 32) - 2) * per_input)] if k > 2 else [])
        host_ckpt = [b for name, b in off["host"] if name.startswith("offloaded checkpoints")]
        assert host_ckpt == [pytest.approx(8 * stored * 2 * 4096 * full["local_tokens"])]  # 8 processes per node
    one, two = (predict(shape, replace(base, checkpoint_every=k), "ulysses_attn", cfg).max_seq for k in (1, 2))
    assert one == predict(shape, base, "ulysses_attn", cfg).max_seq and one < 5_000_000 < two
    with pytest.raises(ValueError, match="checkpoint_every"):
        replace(base, checkpoint_every=0)


# ------------------------------------------------------------------------ Gemma 3's layer and split kernel calls
def _gemma_budget(**kw):
    setup = Setup(gpus=1, gpu_mem=parse_size("24GB"), host_mem=parse_size("128GB"), optim="host_adamw", **kw)
    return build_budget(load_model_shape("shape:gemma-3-270m"), setup, "data_parallel",
                        parse_config("offload+tiled+chunked"))  # fmt: skip


def _per_token(budget, phase: str) -> float:
    return sum(t.per_token for t in budget.phases[phase])


def test_gemma3_layer_terms_counted_by_hand():
    """Gemma-3-270M (h 640, 4 query heads of 256 on 1 K/V head): its per-token bytes in the attention's backward,
    summed by hand from what each op of the layer keeps (bf16 activations: A = 1280, Q = 2048, K = 512 bytes):
    the RoPE tables of both layer types, the q/k norms' saved inputs, and, chunked, no fp32 copy anywhere."""
    shape = load_model_shape("shape:gemma-3-270m")
    assert (shape.qk_norm, shape.sandwich_norms, shape.gemma_norm, shape.rope_tables) == (True, True, True, 2)
    assert shape.params == 268_098_176  # what transformers builds (test_shape_models_build...: the meta device)
    A, Q, K, LSE = 1280, 2048, 512, 16
    rope, ids = 2 * 2 * 256 * 2, 24  # cos + sin of 256 bf16 per table, 2 tables; ids, labels, positions
    chunked = _gemma_budget(norm="chunked")
    layer = (A + 4) + A + (Q + K + 4 * 5) + (2 * Q + 2 * K + LSE)  # x (+ rstd), n1, q/k norms, attention saved
    grads = A + Q  # d h1, d out
    kernel = (Q + 2 * K) + (2 * Q + LSE) + 2 * Q  # dq, dk, dv; fp32 dq accumulator + delta; GQA dK, dV per q head
    assert _per_token(chunked, "attn bwd @ layer 0") == pytest.approx(layer + grads + kernel)
    assert sum(t.per_token for t in chunked.gpu_persistent) == pytest.approx(rope + ids)
    eager = _gemma_budget(norm="eager")
    # eager: the input norm keeps an fp32 copy + fp32 x_hat (4A) instead of x, the q/k norms the same of q and k
    diff = (4 * A - A) + 4 * (Q + K) - (Q + K)
    assert _per_token(eager, "attn bwd @ layer 0") - _per_token(chunked, "attn bwd @ layer 0") == pytest.approx(diff)
    assert max(_per_token(eager, p) for p in eager.phases) > 1.9 * _per_token(chunked, "attn bwd @ layer 0")


def test_split_kernel_calls_shrink_the_attention_backward():
    """``attn_heads_per_call`` 1 on Gemma-3-270M: the kernel's whole-call dq/dk/dv, workspace and GQA expansion
    (Q + 2K + 2Q + LSE + 2Q per token) become dq assembled whole + fp32 dK/dV accumulators + one call's dK, dV of
    the one K/V head + a quarter of the rest (Q + 4K + 2K + (3Q slices + Q + 2Q + LSE) / 4); the longest 24 GB step
    grows."""
    Q, K, LSE = 2048, 512, 16
    whole, split = _gemma_budget(norm="chunked"), _gemma_budget(norm="chunked", attn_heads_per_call=1)
    before = (Q + 2 * K) + (2 * Q + LSE) + 2 * Q
    after = Q + 4 * K + 2 * K + (3 * Q + Q + 2 * Q + LSE) / 4
    got = _per_token(whole, "attn bwd") - _per_token(split, "attn bwd")
    assert got == pytest.approx(before - after)
    setup = dict(gpus=1, gpu_mem=parse_size("24GB"), host_mem=parse_size("128GB"), optim="host_adamw", norm="chunked")
    shape, option = load_model_shape("shape:gemma-3-270m"), parse_config("offload+tiled+chunked")
    p_whole = predict(shape, Setup(**setup), "data_parallel", option)
    p_split = predict(shape, Setup(**setup, attn_heads_per_call=1), "data_parallel", option)
    assert p_split.max_seq > 1.1 * p_whole.max_seq
