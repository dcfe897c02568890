"""``kernel_works`` probes a kernel with a tiny forward and backward checked against the fp32 ``math`` reference:
a kernel that runs but computes other numbers is never picked by ``auto`` and is refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from easy_context import kernels
from easy_context.kernels import CPU, get_kernel, kernel_works


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_kernel_passes_its_probe(dtype):
    assert kernel_works("cpu", "cpu", dtype, 64)


def _broken(monkeypatch, name: str, **overrides) -> None:
    monkeypatch.setitem(kernels.KERNELS, name, replace(CPU, name=name, **overrides))
    monkeypatch.setattr(kernels, "_PROBED", {})


@pytest.mark.parametrize("where", ["out", "lse", "dk"])
def test_a_kernel_with_wrong_numbers_is_refused(monkeypatch, where):
    def forward(q, k, v, causal, scale, **kw):
        out, lse = CPU.forward_impl(q, k, v, causal, scale, **kw)
        return (out * 1.1, lse) if where == "out" else (out, lse + 0.1 if where == "lse" else lse)

    def backward(dout, q, k, v, out, lse, causal, scale, **kw):
        dq, dk, dv = CPU.backward_impl(dout, q, k, v, out, lse, causal, scale, **kw)
        return dq, (dk * 0.9 if where == "dk" else dk), dv

    _broken(monkeypatch, "cpu", forward_impl=forward, backward_impl=backward)
    assert not kernel_works("cpu", "cpu", torch.float32, 64)
    with pytest.raises(RuntimeError, match="cannot run here"):
        get_kernel("cpu", "cpu", torch.float32, 64)
