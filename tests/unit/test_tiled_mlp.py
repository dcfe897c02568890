"""Tiled MLP on one module: equal to the plain MLP (fp32, bf16, frozen weights), its largest intermediate bounded by
the tile, and the model patch applied once per layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from easy_context.memory import (
    enable_tiled_mlp,
    tile_bounds,
    tiled_mlp,
)
from tests.distributed.test_memory import _model, _rel_err

# --- tiled MLP on one module ---------------------------------------------------------------------------------


def _mlp(dtype: torch.dtype = torch.float32, bias: bool = False):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=96, mlp_bias=bias)
    return LlamaMLP(cfg).to(dtype)


def _mlp_run(mlp, x: torch.Tensor, **tiling) -> tuple[torch.Tensor, ...]:
    mlp.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = tiled_mlp(mlp, x, **tiling) if tiling else mlp(x)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    return (out.detach(), x.grad, *[p.grad for p in mlp.parameters()])


@pytest.mark.parametrize("tiling", [{"num_tiles": n} for n in (1, 2, 3, 5, 37, 64)] + [{"tile_tokens": 8}, {}])
def test_tiled_mlp_equals_plain(tiling: dict[str, int]) -> None:
    mlp = _mlp(bias=True)
    x = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(2))
    ref = _mlp_run(mlp, x)
    got = _mlp_run(mlp, x, **tiling)
    assert len(got) == 2 + 6
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 1e-5


def test_tiled_mlp_bf16_and_frozen_weights() -> None:
    x = torch.randn(2, 50, 32, generator=torch.Generator().manual_seed(3))
    ref32 = _mlp_run(_mlp(), x)
    mlp = _mlp(torch.bfloat16)
    ref = _mlp_run(mlp, x.bfloat16())
    got = _mlp_run(mlp, x.bfloat16(), num_tiles=4)
    for a, b, c in zip(got, ref, ref32):
        assert a.dtype == torch.bfloat16
        assert _rel_err(a, c) < 2 * _rel_err(b, c) + 1e-2  # as close to fp32 as the plain bf16 MLP

    mlp = _mlp()  # fp32 weights under CPU autocast: the backward recompute must use bf16 matmuls too
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _mlp_run(mlp, x)
        dtypes: list[torch.dtype] = []
        handle = mlp.act_fn.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        got = _mlp_run(mlp, x, num_tiles=4)
        handle.remove()
    assert dtypes == [torch.bfloat16] * 8  # 4 tiles forward, 4 recomputed in the backward
    for a, b in zip(got, ref):
        assert _rel_err(a, b) < 1e-2

    mlp.gate_proj.weight.requires_grad_(False)
    got = _mlp_run(mlp, x, num_tiles=3)
    ref = _mlp_run(mlp, x)
    assert got[2] is None and ref[2] is None  # the frozen gate weight gets no gradient
    for a, b in zip(got[:2] + got[3:], ref[:2] + ref[3:]):
        assert _rel_err(a, b) < 1e-5


class _LargestIntermediate(TorchDispatchMode):
    """Largest (..., tokens, intermediate) tensor produced by any op, forward and backward."""

    def __init__(self, intermediate: int):
        super().__init__()
        self.intermediate, self.largest = intermediate, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 3 and t.shape[-1] == self.intermediate:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("num_tiles", [4, 7])
def test_tiled_mlp_intermediate_size(num_tiles: int) -> None:
    mlp = _mlp()
    x = torch.randn(2, 200, 32, generator=torch.Generator().manual_seed(4))
    calls: list[tuple[int, ...]] = []
    mlp.act_fn.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    with _LargestIntermediate(96) as plain:
        _mlp_run(mlp, x)
    assert plain.largest == 2 * 200 * 96 and calls == [(2, 200, 96)]

    calls.clear()
    with _LargestIntermediate(96) as tiled:
        _mlp_run(mlp, x, num_tiles=num_tiles)
    tile = math.ceil(200 / num_tiles)
    assert tiled.largest == 2 * tile * 96  # ~1/num_tiles of the plain MLP's, forward and backward
    assert len(calls) == 2 * num_tiles and max(c[1] for c in calls) == tile  # forward + backward recompute


def test_enable_tiled_mlp_patches_each_layer_once() -> None:
    model = _model("llama")
    enable_tiled_mlp(model, tile_tokens=16)
    enable_tiled_mlp(model, num_tiles=2)  # re-tiles, does not wrap twice
    for layer in model.model.layers:
        assert layer.mlp._ec_tiled_mlp_options == {"num_tiles": 2, "tile_tokens": None}
        assert layer.mlp._ec_plain_mlp_forward.__func__ is type(layer.mlp).forward
    with pytest.raises(ValueError):
        tile_bounds(10, num_tiles=2, tile_tokens=3)
    with pytest.raises(ValueError):
        enable_tiled_mlp(torch.nn.Linear(2, 2))
