"""Training FLOPs per token (the MFU numerator): each layer's attention counted as it is masked."""

from __future__ import annotations

import pytest
from transformers import (
    Gemma3Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Qwen2Config,
)

from easy_context.training.flops import (
    attention_flops_per_token,
    layer_windows,
    mean_keys_per_query,
    non_embedding_params,
    train_flops_per_token,
)

K128 = 131072


def gemma3_270m(**kw) -> Gemma3TextConfig:
    """google/gemma-3-270m's shape (FIELD_NOTES): 18 layers, 5 sliding (window 512) per global one."""
    shape = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                 query_pre_attn_scalar=256, max_position_embeddings=32768)  # fmt: skip
    return Gemma3TextConfig(**{**shape, **kw})


def llama(**kw) -> LlamaConfig:
    shape = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32)  # fmt: skip
    return LlamaConfig(**{**shape, **kw})


def per_sequence(config, seq: int, attention_only: bool = False) -> float:
    fn = attention_flops_per_token if attention_only else train_flops_per_token
    return fn(config, seq) * seq


def test_a_model_without_windows_keeps_the_full_causal_formula():
    for config in (llama(), llama(num_key_value_heads=8), gemma3_270m(layer_types=["full_attention"] * 18)):
        h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        d = getattr(config, "head_dim", None) or h // heads
        n = config.num_hidden_layers * (2 * h * heads * d + 2 * h * kv * d + 3 * h * config.intermediate_size)
        n += h * config.vocab_size
        for seq in (4096, 65536, K128):
            want = 6 * n + 6 * config.num_hidden_layers * seq * heads * d  # the formula before windows were counted
            assert train_flops_per_token(config, seq) == want


def test_llama_2_7b_at_64k():
    # 6N = 6 x 6,607,343,616 (blocks + LM head, no input embedding); attention 6 x 32 x 65536 x 32 x 128
    assert non_embedding_params(llama()) == 6_607_077_376
    assert train_flops_per_token(llama(), 65536) == 6 * 6_607_077_376 + 6 * 32 * 65536 * 32 * 128


def test_gemma3_270m_at_128k_by_hand():
    config = gemma3_270m()
    assert [kind for kind, _ in layer_windows(config)] == (["sliding"] * 5 + ["full"]) * 3
    # N: per layer q/o 2 x 640 x 4 x 256 + k/v 2 x 640 x 1 x 256 = 1,638,400, gated MLP 3 x 640 x 2048 = 3,932,160;
    # 18 layers = 100,270,080; tied LM head 640 x 262,144 = 167,772,160 (counted once): 268,042,240; 6N = 1,608,253,440
    assert non_embedding_params(config) == 268_042_240
    # 3 global layers: 6 x 131,072 x 4 x 256 = 805,306,368 each -> 2,415,919,104
    # 15 window layers: keys per query (512 x 513 / 2 + (131,072 - 512) x 512) / 131,072 = 511.001953125,
    # x 12 x 4 x 256 = 6,279,192 each -> 94,187,880
    assert train_flops_per_token(config, K128) == 1_608_253_440 + 2_415_919_104 + 94_187_880  # 4,118,360,424
    # the count that treated every layer as full causal: 16,103,768,064 (3.9x too many: "75.6 % MFU" was 19.3 %)
    everything_full = gemma3_270m(layer_types=["full_attention"] * 18)
    assert train_flops_per_token(everything_full, K128) == 16_103_768_064
    # a multimodal config counts its language model
    assert train_flops_per_token(Gemma3Config(text_config=config.to_dict()), K128) == 4_118_360_424


@pytest.mark.parametrize("window", [1, 64, 512])
def test_a_window_layer_grows_linearly_a_full_layer_quadratically(window):
    base = 8 * window
    windowed = MistralConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=window)  # fmt: skip
    full = MistralConfig(**{**windowed.to_dict(), "sliding_window": None})
    assert [k for k, _ in layer_windows(windowed)] == ["sliding"] * 2 and layer_windows(full) == [("full", None)] * 2
    for attention_only in (True, False):
        f = [per_sequence(windowed, base * m, attention_only) for m in (1, 2, 4)]
        assert f[2] - f[1] == pytest.approx(2 * (f[1] - f[0]), rel=1e-12)  # linear: equal steps per added length
    a = [per_sequence(full, base * m, attention_only=True) for m in (1, 2, 4)]
    assert a[2] - a[1] == pytest.approx(4 * (a[1] - a[0]), rel=1e-12)  # quadratic
    # a window layer costs ~window keys per query, far below a full layer at long lengths
    assert per_sequence(windowed, 64 * window, True) < per_sequence(full, 64 * window, True) / 30


def test_mean_keys_per_query():
    for seq in (1, 5, 100):
        assert mean_keys_per_query("full", None, seq) == seq / 2
        assert mean_keys_per_query("sliding", seq, seq) == seq / 2  # a window covering the sequence is full
    for seq, w in ((10, 3), (100, 7), (4096, 512)):
        assert mean_keys_per_query("sliding", w, seq) == pytest.approx(sum(min(p + 1, w) for p in range(seq)) / seq)
        assert mean_keys_per_query("chunked", w, seq) == pytest.approx(sum(p % w + 1 for p in range(seq)) / seq)
    with pytest.raises(ValueError, match="unknown attention layer kind"):
        mean_keys_per_query("other", 4, 10)


def test_which_layers_have_a_window():
    qwen = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2)  # fmt: skip
    assert layer_windows(Qwen2Config(**qwen)) == [("full", None)] * 4  # use_sliding_window defaults to False
    on = Qwen2Config(**qwen, use_sliding_window=True, sliding_window=32, max_window_layers=2)
    assert layer_windows(on) == [("full", None)] * 2 + [("sliding", 32)] * 2
    # Mistral without layer types: the window on every layer (its mask windows them all), unless switched off
    mistral = MistralConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, sliding_window=16)  # fmt: skip
    assert layer_windows(mistral) == [("sliding", 16)] * 3
    mistral.use_sliding_window = False
    assert layer_windows(mistral) == [("full", None)] * 3
    chunked = llama(num_hidden_layers=4, layer_types=["chunked_attention", "full_attention"] * 2)
    chunked.attention_chunk_size = 8192
    assert layer_windows(chunked) == [("chunked", 8192), ("full", None)] * 2


def test_mlp_and_head_counts():
    # GPT-NeoX: two-matmul MLP (4h), MHA: per layer 4 h^2 + 2 h x 4h; untied LM head h x V
    neox = GPTNeoXConfig(vocab_size=50304, hidden_size=512, intermediate_size=2048, num_hidden_layers=6,
                         num_attention_heads=8)  # fmt: skip
    assert non_embedding_params(neox) == 6 * (4 * 512**2 + 2 * 512 * 2048) + 512 * 50304
    # GPT-2 names its sizes n_embd / n_inner (None: 4h)
    gpt2 = GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=1000)
    assert non_embedding_params(gpt2) == 2 * (4 * 256**2 + 2 * 256 * 1024) + 256 * 1000
    # head_dim that is not hidden / heads (Gemma 3: 256, not 640 / 4 = 160) sizes the projections and attention
    g = gemma3_270m()
    assert attention_flops_per_token(gemma3_270m(layer_types=["full_attention"] * 18), 1000) == 6 * 18 * 1000 * 4 * 256
    assert non_embedding_params(g) - non_embedding_params(gemma3_270m(head_dim=160)) == 18 * 2 * 640 * 96 * (4 + 1)
    # a mixture of experts: the experts a token is routed to
    moe = MixtralConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                        num_experts_per_tok=2)  # fmt: skip
    assert non_embedding_params(moe) == 2 * (2 * 128 * 128 + 2 * 128 * 64 + 2 * 3 * 128 * 256) + 128 * 1000
