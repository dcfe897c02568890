"""Which layers a RoPE change reaches under per-layer-type RoPE (Gemma 3: sliding-window layers with base 1e4, global
layers with 1e6): the RoPE base raise and every scaling change the global layers only, checked against the
frequencies transformers' own rotary module computes and against a forward pass."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from easy_context.models import (
    get_rope_theta,
    long_range_layer_types,
    parse_rope_scaling,
    rope_position_limit,
    set_rope_scaling,
    set_rope_theta,
)

HEAD_DIM = 16


def gemma3_config(max_positions: int = 64) -> Gemma3TextConfig:
    """Gemma-3-270M's pattern in miniature: five sliding layers (window 4, base 1e4), then a global one (base 1e6)."""
    return Gemma3TextConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
        head_dim=HEAD_DIM, vocab_size=64, sliding_window=4, query_pre_attn_scalar=HEAD_DIM,
        max_position_embeddings=max_positions,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
    )  # fmt: skip


def inv_freq(config: Gemma3TextConfig, layer_type: str, seq_len: int | None = None) -> torch.Tensor:
    """The inverse frequencies transformers' Gemma 3 rotary module uses for ``layer_type`` (at ``seq_len`` for the
    sequence-dependent scalings)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    rotary = model.model.rotary_emb
    if seq_len is not None:
        x = torch.zeros(1, seq_len, config.hidden_size)
        rotary(x, torch.arange(seq_len)[None], layer_type)
    return getattr(rotary, f"{layer_type}_inv_freq").clone()


def default_inv_freq(base: float) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)


def test_long_range_layer_types():
    assert long_range_layer_types(gemma3_config()) == ["full_attention"]
    from transformers import LlamaConfig

    assert long_range_layer_types(LlamaConfig()) is None
    both_global = gemma3_config()
    both_global.rope_parameters = {"a": {"rope_theta": 1.0}, "b": {"rope_theta": 2.0}}
    assert long_range_layer_types(both_global) == ["a", "b"]  # no sliding type named: every type is long-range


def test_rope_theta_raises_the_global_layers_only():
    config = gemma3_config()
    assert get_rope_theta(config) == 1e6  # the global layers' base, not the first type's (sliding, 1e4)
    set_rope_theta(config, 1e8)
    assert get_rope_theta(config) == 1e8
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    torch.testing.assert_close(inv_freq(config, "sliding_attention"), default_inv_freq(1e4))
    torch.testing.assert_close(inv_freq(config, "full_attention"), default_inv_freq(1e8))


@pytest.mark.parametrize("text", ["linear:8", "yarn:8", "dynamic:8"])
def test_scalings_reach_the_global_layers_only(text):
    base = gemma3_config()
    config = gemma3_config()
    set_rope_scaling(config, parse_rope_scaling(text, config))
    assert config.rope_parameters["sliding_attention"] == base.rope_parameters["sliding_attention"]
    full = config.rope_parameters["full_attention"]
    assert full["rope_type"] == text.split(":")[0] and full["factor"] == 8.0 and full["rope_theta"] == 1e6
    seq = 4 * base.max_position_embeddings  # beyond the original length: dynamic NTK rescales here
    torch.testing.assert_close(inv_freq(config, "sliding_attention", seq), inv_freq(base, "sliding_attention", seq))
    scaled, unscaled = inv_freq(config, "full_attention", seq), inv_freq(base, "full_attention", seq)
    if text.startswith("linear"):
        torch.testing.assert_close(scaled, unscaled / 8)
    else:  # yarn and NTK keep the highest frequency and lower the lowest ones
        torch.testing.assert_close(scaled[0], unscaled[0])
        assert scaled[-1] < unscaled[-1] * 0.5
    limit, _ = rope_position_limit(config)
    assert limit is None if text.startswith("dynamic") else limit == 8 * base.max_position_embeddings


def test_scaled_model_matches_transformers_own_per_layer_config():
    """A model built through set_rope_scaling computes what the same scaling written by hand in transformers'
    per-layer-type format computes: identical logits."""
    ours = gemma3_config()
    set_rope_theta(ours, 5e6)
    set_rope_scaling(ours, parse_rope_scaling("yarn:4", ours))
    by_hand = gemma3_config()
    by_hand.rope_parameters = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e6,
                           "original_max_position_embeddings": 64},
    }  # fmt: skip
    ids = torch.randint(0, 64, (1, 200), generator=torch.Generator().manual_seed(0))
    logits = []
    for config in (ours, by_hand):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
        with torch.no_grad():
            logits.append(model(ids).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
