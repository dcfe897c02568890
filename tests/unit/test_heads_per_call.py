"""``heads_per_call`` (``train.py --attn-heads-per-call``): the local kernel called on a few query heads at a time gives
plain torch's attention and transformers' model, and its calls never hold more heads than asked."""

from __future__ import annotations

import copy

import pytest
import torch

from easy_context.kernels import KERNELS, get_kernel
from easy_context.kernels.base import AttnKernel
from easy_context.sp_config import sp_config_for
from tests.support.reference import rel_err


def _rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_split_calls_match_plain_torch(heads):
    """6 query heads on 2 K/V heads (GQA 3): calls of <= ``heads`` query heads (1: heads of one group sharing its
    K/V head, their dK/dV summed; 2: no call of 2 stays inside one group, so 1; 3: whole groups), out / lse / dq /
    dk / dv equal to fp64 torch SDPA."""
    q, dout = _rand(2, 20, 6, 16, seed=1), _rand(2, 20, 6, 16, seed=2)
    k, v = _rand(2, 20, 2, 16, seed=3), _rand(2, 20, 2, 16, seed=4)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    rep = lambda x: x.repeat_interleave(3, 2).transpose(1, 2)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(leaves[0].transpose(1, 2), rep(leaves[1]), rep(leaves[2]),
                                                           is_causal=True, scale=0.25).transpose(1, 2)  # fmt: skip
    ref.backward(dout.double())
    seen = []
    cpu = KERNELS["cpu"]
    spy = AttnKernel("spy", lambda *a, **kw: seen.append(a[0].shape[2]) or cpu.forward_impl(*a, **kw),
                     lambda *a, **kw: seen.append(a[1].shape[2]) or cpu.backward_impl(*a, **kw)).with_heads_per_call(
        heads)  # fmt: skip
    out, lse = spy.forward(q, k, v, True, 0.25)
    dq, dk, dv = spy.backward(dout, q, k, v, out, lse, True, 0.25)
    assert max(seen) == {1: 1, 2: 1, 3: 3}[heads] and len(seen) == 2 * 6 // max(seen)
    assert rel_err(out, ref) < 1e-5
    for got, leaf in zip((dq, dk, dv), leaves):
        assert got.shape == leaf.shape and got.dtype == torch.float32 and rel_err(got, leaf.grad) < 1e-5


def test_bad_values_are_refused_before_any_group():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="heads_per_call must be a positive integer"):
            sp_config_for("data_parallel", 1, heads_per_call=bad)


def test_a_gemma3_model_through_split_calls_equals_transformers(monkeypatch):
    """A tiny Gemma 3 (4 query heads on 1 K/V head, a sliding layer and a global one) switched to data_parallel with
    one query head per call: every kernel call holds one head, and the loss and every gradient equal transformers'
    own sdpa model's."""
    from tests.distributed.test_memory import _loss_and_grads
    from tests.unit.test_rmsnorm import _gemma3

    cpu, seen = KERNELS["cpu"], []
    spy = AttnKernel("cpu", lambda *a, **kw: seen.append(a[0].shape[2]) or cpu.forward_impl(*a, **kw),
                     lambda *a, **kw: seen.append(a[1].shape[2]) or cpu.backward_impl(*a, **kw),
                     supports=cpu.supports)  # fmt: skip
    monkeypatch.setitem(KERNELS, "cpu", spy)
    get_kernel("cpu", "cpu", torch.float32, 16)  # the kernel's one-time probe (whole calls) before we count
    seen.clear()
    ref = _gemma3()
    model = copy.deepcopy(ref)
    sp = sp_config_for("data_parallel", 1, kernel="cpu", heads_per_call=1)
    assert sp.attn_func() is not None and sp.heads_per_call == 1
    sp.attach(model)
    ref_loss, ref_grads = _loss_and_grads(ref)
    loss, grads = _loss_and_grads(model)
    assert set(seen) == {1} and len(seen) >= 2 * 2 * 4  # 2 layers x (forward + backward) x 4 heads (+ band tiles)
    assert rel_err(loss, ref_loss) < 1e-5
    assert max(rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4


def test_a_kernel_probe_inside_a_checkpointed_layer_keeps_its_tensors_out_of_it(monkeypatch):
    """The first attention call probes the kernel, usually inside a checkpointed layer's forward. A probe that runs
    autograd and fails (flex on a GPU where its compiled backward does not build: seen on an H100 with head_dim 256)
    left the tensors it saved in the checkpoint's count; the recompute (the verdict cached: no probe) saved fewer and
    torch.utils.checkpoint refused the step. Now the probe's tensors stay out of it: the kernel is refused, and the
    layer's gradient equals the same layer's without checkpointing."""
    import easy_context.kernels as kernels

    def failing_autograd_probe(kernel, device, dtype, head_dim):
        x = torch.randn(4, requires_grad=True)
        (x.exp() * x.sin()).sum()  # saves tensors, as a recompute-based backward's forward does
        raise RuntimeError("the kernel's backward does not build here")

    monkeypatch.setattr(kernels, "_probe", failing_autograd_probe)
    monkeypatch.setattr(kernels, "_PROBED", {})

    def layer(x):
        assert not kernels.kernel_works("cpu", "cpu", torch.float32, 16)
        return (x.tanh() * x).sum()

    x = torch.randn(8, requires_grad=True)
    torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False).backward()
    xr = x.detach().requires_grad_()
    layer(xr).backward()
    assert torch.allclose(x.grad, xr.grad)


def test_the_math_fallback_names_why_each_band_kernel_was_not_taken(monkeypatch):
    """A sliding window on a machine where no fused kernel computes a band falls back to the math kernel (slow at long
    context): the warning names each band-capable kernel and why it was refused, its probe's error included (what
    would have told us at once that FlexAttention fails at head_dim 256 on an H100)."""
    import dataclasses

    import easy_context.kernels as kernels

    no_band = dataclasses.replace(KERNELS["cpu"], supports=frozenset())  # works, computes no band (as cuDNN)
    flexlike = dataclasses.replace(KERNELS["cpu"], name="flexlike")  # computes a band, but its probe failed
    monkeypatch.setitem(kernels.KERNELS, "cpu", no_band)
    monkeypatch.setitem(kernels.KERNELS, "flexlike", flexlike)
    monkeypatch.setattr(kernels, "CPU_PREFERENCE", ("cpu", "flexlike"))
    monkeypatch.setattr(kernels, "kernel_works", lambda name, *a: name == "cpu")
    key = ("flexlike", kernels._device_key(torch.device("cpu")), torch.float32, 16)
    monkeypatch.setitem(kernels._PROBE_ERRORS, key, "OutOfResources: shared memory")
    want = r"computes band here \(flexlike: its probe call failed \(OutOfResources: shared memory\)\)"
    with pytest.warns(UserWarning, match=want):
        assert kernels.get_kernel("auto", "cpu", torch.float32, 16, needs=("band",)) is kernels.MATH
