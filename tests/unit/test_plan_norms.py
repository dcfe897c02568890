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
