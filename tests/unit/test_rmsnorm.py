"""Chunked RMSNorm: same values and gradients as transformers' eager RMSNorm, without fp32 (seq, hidden) copies."""

from __future__ import annotations

import copy

import pytest
import torch

import easy_context.memory.rmsnorm as rn
from easy_context.memory import enable_chunked_rmsnorm
from tests.distributed.test_memory import _loss_and_grads, _model, _rel_err


def _norm_and_input(dtype: torch.dtype, hidden: int = 48):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(hidden, eps=1e-5)
    norm.weight.data = (torch.randn(hidden, generator=g) * 0.1 + 1).to(dtype)
    x = (torch.randn(2, 37, hidden, generator=g) * 2).to(dtype)
    dy = torch.randn(2, 37, hidden, generator=g).to(dtype)
    return norm, x, dy


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_matches_eager_rmsnorm(monkeypatch, dtype, tol):
    monkeypatch.setattr(rn, "CHUNK_ROWS", 10)  # 74 rows: 8 chunks, the last one short
    norm, x, dy = _norm_and_input(dtype)
    fused = copy.deepcopy(norm)
    assert enable_chunked_rmsnorm(fused) == [""]
    grads = []
    for module in (norm, fused):
        xg = x.clone().requires_grad_()
        y = module(xg)
        y.backward(dy)
        grads.append((y, xg.grad, module.weight.grad))
    (y_ref, dx_ref, dw_ref), (y, dx, dw) = grads
    assert y.dtype == y_ref.dtype and torch.equal(y, y_ref)  # the forward is bit-identical
    assert _rel_err(dx, dx_ref) < tol and _rel_err(dw, dw_ref) < tol


def test_saves_no_fp32_copy():
    """Eager saves x.float() (2x the bf16 input) and more; the chunked norm saves the input and a per-row rstd."""
    norm, x, _ = _norm_and_input(torch.bfloat16)
    fused = copy.deepcopy(norm)
    enable_chunked_rmsnorm(fused)
    saved = {}
    for name, module in (("eager", norm), ("chunked", fused)):
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.numel() * t.element_size() if t.data_ptr() != x.data_ptr() else 0)  # x itself is free
            return t

        xg = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(xg)
        saved[name] = sum(sizes)
    rows = x.shape[0] * x.shape[1]
    assert saved["chunked"] <= xg.numel() * 2 + rows * 4 + 48 * 2  # the input (a clone here), rstd, weight
    assert saved["eager"] >= 2 * saved["chunked"]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_model_parity_with_checkpointing(model_type):
    from easy_context.memory import enable_offloaded_checkpointing

    ref_loss, ref_grads = _loss_and_grads(_model(model_type))
    model = _model(model_type)
    patched = enable_chunked_rmsnorm(model)
    per_layer = 4 if model_type == "qwen3" else 2  # qwen3 also normalises q and k per head
    assert len(patched) == 2 * per_layer + 1  # 2 layers + the final norm
    enable_offloaded_checkpointing(model)
    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-6
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5


def _gemma3(layers: int = 2):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=128,
        sliding_window=8,
        query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"][:layers],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float().train()
    for name, p in model.named_parameters():  # Gemma initialises its norm weights to 0: make (1 + w) matter
        if name.endswith("norm.weight"):
            p.data = torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3
    return model


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_gemma_norm_on_a_transposed_input(monkeypatch, dtype, tol):
    """Gemma's (1 + weight) norm, as its q/k norms see it: the (batch, heads, seq, head_dim) transpose of the
    projection. Same values bit for bit, the eager output's strides, gradients within ``tol`` of the eager ones."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    monkeypatch.setattr(rn, "CHUNK_ROWS", 7)
    g = torch.Generator().manual_seed(0)
    norm = Gemma3RMSNorm(16, eps=1e-6)
    norm.weight.data = (torch.randn(16, generator=g) * 0.3).to(dtype)
    proj = (torch.randn(2, 9, 3 * 16, generator=g) * 2).to(dtype)  # (batch, seq, heads x head_dim)
    dy = torch.randn(2, 3, 9, 16, generator=g).to(dtype)
    chunked = copy.deepcopy(norm)
    assert enable_chunked_rmsnorm(chunked) == [""] and chunked._chunked_norm_style is rn.GEMMA
    results = []
    for module in (norm, chunked):
        pg = proj.clone().requires_grad_()
        x = pg.view(2, 9, 3, 16).transpose(1, 2)
        y = module(x)
        y.backward(dy)
        results.append((y, pg.grad, module.weight.grad))
    (y_ref, dx_ref, dw_ref), (y, dx, dw) = results
    assert y.dtype == y_ref.dtype and y.stride() == y_ref.stride() and torch.equal(y, y_ref)
    assert _rel_err(dx, dx_ref) < tol and _rel_err(dw, dw_ref) < tol


def test_gemma3_model_parity_and_every_norm_patched():
    """A tiny Gemma 3 (4 norms a layer, per-head q/k norms, the final norm): every norm is chunked, and the loss and
    every gradient equal transformers' eager model's under offloaded checkpointing."""
    from easy_context.memory import enable_offloaded_checkpointing
    from easy_context.memory.rmsnorm import unpatched_norms

    ref_loss, ref_grads = _loss_and_grads(_gemma3())
    model = _gemma3()
    patched = enable_chunked_rmsnorm(model)
    assert len(patched) == 2 * 6 + 1 and unpatched_norms(model) == {}
    enable_offloaded_checkpointing(model)
    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-6
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5


def test_leaves_other_norms_alone_and_names_them():
    """A LayerNorm (it subtracts the mean, and has a bias) is norm-shaped but no style reproduces it: it keeps its
    forward, and unpatched_norms names it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from easy_context.memory.rmsnorm import unpatched_norms, unpatched_note

    module = torch.nn.Sequential(torch.nn.LayerNorm(16), LlamaRMSNorm(16))
    assert enable_chunked_rmsnorm(module) == ["1"]
    assert unpatched_norms(module) == {"LayerNorm": 1}
    assert unpatched_note(module) == ("note: --chunked-rmsnorm: LayerNorm x1 kept transformers' forward (math neither "
                                      "norm style reproduces)")  # fmt: skip
    only_llama = torch.nn.Sequential(LlamaRMSNorm(16))
    assert unpatched_note(only_llama) is not None  # before the patch every norm keeps its forward
    enable_chunked_rmsnorm(only_llama)
    assert unpatched_note(only_llama) is None


def test_gemma3_model_under_bf16_autocast_matches_transformers():
    """The Gemma recipes' precision: fp32 weights under bf16 autocast. The chunked norms give transformers' eager
    loss and gradients (same autocast): the loss bit for bit (measured), the gradients within 1e-5 (1.8e-7 measured)."""
    ref, model = _gemma3(), _gemma3()
    assert len(enable_chunked_rmsnorm(model)) == 2 * 6 + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grads = _loss_and_grads(ref)
        loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-6
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5
