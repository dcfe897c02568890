"""Evaluations refuse up front what the model's own attention cannot hold: transformers builds a (length x length)
mask for sliding-window layers (an H200 run of Gemma-3-270M ran out of memory at ~100K tokens so), and a named kernel
routes the model through easy_context's attention, which builds none."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import AutoConfig

from easy_context.eval.runtime import own_mask_error

GIB = 2**30


def runtime(kernel: str = "auto", distributed: bool = False, device: str = "cuda"):
    return SimpleNamespace(distributed=distributed, sp=SimpleNamespace(kernel=kernel), device=torch.device(device))


def gemma3():
    return AutoConfig.for_model("gemma3_text", num_hidden_layers=6, sliding_window=512)


def test_sliding_window_model_through_its_own_attention_is_refused_with_the_fix():
    message = own_mask_error(gemma3(), runtime(), 131072, free_bytes=100 * GIB)  # 16 GiB of mask: fits
    assert message is None
    message = own_mask_error(gemma3(), runtime(), 262144, free_bytes=100 * GIB)  # 64 GiB: more than half the free
    assert message == ("262144 tokens through the model's own attention: its sliding-window layers need a 262144 x "
                       "262144 mask (64.0 GiB; 100.0 GiB free): pass --kernel (fa4 or flex on a GPU) to attend "
                       "through easy_context's kernels, which build no mask")  # fmt: skip
    assert "--kernel (cpu)" in own_mask_error(gemma3(), runtime(device="cpu"), 262144, free_bytes=GIB)


def test_no_refusal_where_no_mask_is_built():
    assert own_mask_error(gemma3(), runtime(kernel="fa4"), 1 << 20, free_bytes=GIB) is None  # easy_context's attention
    assert own_mask_error(gemma3(), runtime(distributed=True), 1 << 20, free_bytes=GIB) is None  # an SP backend
    llama = AutoConfig.for_model("llama", num_hidden_layers=2)
    assert own_mask_error(llama, runtime(), 1 << 20, free_bytes=GIB) is None  # causal only: SDPA needs no mask
