"""The model zoo (bench/model_zoo.py, docs/models.md) as regression tests.

Every decoder family that passed the sweep matches its single-process eager model under zigzag_ring_attn on 2 gloo
ranks (logits of each shard and every parameter gradient); every family easy_context refuses raises its one clear
error instead of computing something else. Tiny models (hidden 64, 2 layers, 2 rows of 24 tokens, weights off
their neutral init); several families share one distributed call.
"""

from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import model_zoo  # noqa: E402

# The families that pass the sweep (transformers 5.24), by group of similar cost; variants after the model types.
PASSING = [
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "beam", "biogpt", "bitnet", "codegen",
    "cohere", "cohere2", "cohere2_moe", "cohere_compass_text", "ctrl", "cwm", "dbrx", "deepseek_v2", "deepseek_v3",
    "dory", "dots1", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "flex_olmo", "flint", "gemma",
    "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "glm", "glm4", "glm4_moe",
    "glm4_moe_lite", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neox", "gpt_oss", "gptj", "granite", "granite_swa",
    "granitemoe", "granitemoe_swa", "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe",
    "hy_v3", "hyperclovax", "internlm3", "iquestcoder", "jais2", "jetmoe", "kolibri1", "laguna", "llama",
    "longcat_flash", "mellum", "mimo_v2_flash", "minicpm3", "minimax_m2", "minimax_m3_vl_text", "ministral",
    "ministral3", "mistral", "mixtral", "modernbert-decoder", "nanochat", "nemotron", "olmo", "olmo2", "olmo3",
    "olmoe", "opt", "persimmon", "phi", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "sarvam_mla",
    "sarvam_moe", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2", "vaultgemma", "youtu", "diffllama",
    "llama+dynamic_rope", "llama+llama3_rope", "llama+yarn", "phi3+longrope", "phimoe+longrope",
]  # fmt: skip

# fp32 rounding: these families' own fp32 eager model is 1.2e-5 .. 3e-5 (gradients) from the same model in fp64
# (bench/model_zoo.py fp32_noise); easy_context's error against fp64 is the same size. 2e-5 elsewhere.
TOLERANCE = {"diffllama": 1e-4, "gemma4_text": 1e-4, "gemma4_unified_text": 1e-4}

# CausalLMWithLoss refuses these: heads it would skip (logit-scaling families are scaled: loss/logit_scale.py).
LOSS_REFUSED = {
    "dory": "DoryLMHead computes more than a linear map",
    "modernbert-decoder": r"lm_head \(ModernBertDecoderPredictionHead\) has weights outside",
}

_RECURRENT = "'linear_attention': a recurrent layer"
_OWN_CODE = "computes attention in its own code, not through transformers' AttentionInterface"
# Every family the sweep refuses when the model is patched, with a fragment of its error.
REFUSED = {
    **dict.fromkeys(["bailing_hybrid", "bamba", "falcon_mamba", "granitemoehybrid", "jamba", "kimi_linear",
                     "lara_mini", "mamba", "mamba2", "minimax", "nemotron_h", "olmo_hybrid", "qwen3_5_moe_text",
                     "qwen3_5_text", "qwen3_next", "qwen4_exp_text", "recurrent_gemma", "zamba", "zamba2"], _RECURRENT),
    **dict.fromkeys(["falcon_h1", "zaya"], "'hybrid': attention combined with a recurrent"),
    **dict.fromkeys(["inkling_text", "inkling2_text", "inkling2_loop_text"], "'hybrid_sliding': sliding attention"),
    **dict.fromkeys(["lfm2", "lfm2_moe", "lfm3"], "'conv': a short-convolution layer"),
    **dict.fromkeys(["axk2", "deepseek_v32", "dots3_note_text", "glm_moe_dsa", "hy_v4"],
                    "'indexed_attention': sparse attention"),
    "deepseek_v4": "'heavily_compressed_attention'",
    "llama4_text": "'chunked_attention': chunked attention",
    **dict.fromkeys(["bloom", "falcon", "gpt_neo", "gpt_neox_japanese", "mpt", "openai-gpt", "rwkv", "xglm"],
                    _OWN_CODE),
}  # fmt: skip
# Refused at the first forward: no layer types to read (xLSTM), a mask the model builds itself (Doge).
REFUSED_AT_FORWARD = {"xlstm": "without calling easy_context's attention", "doge": r"Doge\w* made its own"}


def zoo_parity_worker(rank: int, world: int, family: str) -> dict:
    """zigzag_ring_attn errors of ``family`` on this rank (model_zoo.sp_errors)."""
    _quiet()
    return model_zoo.sp_errors(rank, world, family)


@pytest.mark.parametrize("family", PASSING)
def test_zoo_parity(dist_pool, family):
    tol = TOLERANCE.get(family, model_zoo.TOLERANCE)
    for rank, r in enumerate(dist_pool(2).run(zoo_parity_worker, family)):
        assert r["attention_calls"] > 0, f"{family}: easy_context attention never ran"
        assert r["logits"] < tol and r["grad"] < tol, (family, rank, r)


@pytest.mark.parametrize("family", [f for f in PASSING if f not in LOSS_REFUSED])
def test_zoo_loss(family):
    """CausalLMWithLoss (train.py's loss) equals the model's own labels= loss and gradients, one process."""
    _quiet()
    r = model_zoo.loss_errors(family)
    tol = TOLERANCE.get(family, model_zoo.TOLERANCE)
    assert r["loss"] < tol and r["grad"] < tol, (family, r)


@pytest.mark.parametrize("family", list(LOSS_REFUSED))
def test_zoo_loss_refusals(family):
    from easy_context.loss import CausalLMWithLoss

    _quiet()
    with pytest.raises(NotImplementedError, match=LOSS_REFUSED[family]):
        CausalLMWithLoss(model_zoo.tiny_model(family))


def _quiet() -> None:
    import warnings

    import transformers

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity(transformers.logging.CRITICAL)


@pytest.mark.parametrize("family", list(REFUSED))
def test_zoo_refusals_at_patch_time(family):
    """Refused when the model is patched (no process group needed: before any collective)."""
    import easy_context as ec

    _quiet()
    with pytest.raises(NotImplementedError, match=re.escape(REFUSED[family])):
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model_zoo.tiny_model(family))


def test_recurrent_layers_are_fine_without_sharding():
    """data_parallel through easy_context's attention (always=True) keeps a hybrid's recurrent layers (nothing is
    split), but still refuses attention it does not compute (a sparse indexer)."""
    import easy_context as ec

    _quiet()
    hybrid = ec.apply_seq_parallel_monkey_patch("data_parallel", model_zoo.tiny_model("qwen3_next"), always=True)
    assert hybrid.config._attn_implementation.startswith("easy_context_data_parallel")
    with pytest.raises(NotImplementedError, match="'indexed_attention'"):
        ec.apply_seq_parallel_monkey_patch("data_parallel", model_zoo.tiny_model("deepseek_v32"), always=True)


def forward_refusal_worker(rank: int, world: int, family: str) -> str:
    """The error of the first zigzag forward of ``family`` ("no error" if there is none)."""
    import easy_context as ec

    _quiet()
    model = ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model_zoo.tiny_model(family))
    ids = torch.randint(3, 100, (1, 12))
    try:
        model(ids, position_ids=ec.extract_local("zigzag_ring_attn", torch.arange(12 * world)[None], rank, world))
    except NotImplementedError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("family", list(REFUSED_AT_FORWARD))
def test_zoo_refusals_at_forward(dist_pool, family):
    for message in dist_pool(2).run(forward_refusal_worker, family):
        assert re.search(REFUSED_AT_FORWARD[family], message), message


def test_unknown_attention_keywords_are_refused():
    """A keyword the model expects the attention to use (Inkling's position_bias) is refused, not ignored; keywords
    that leave attention as it is pass."""
    from easy_context.hf import check_supported

    q, module = torch.zeros(1, 2, 8, 4), SimpleNamespace(config=SimpleNamespace())
    with pytest.raises(NotImplementedError, match="position_bias"):
        check_supported(module, "zigzag_ring_attn", q, None, 0.0, {"position_bias": torch.zeros(1, 2, 8, 8)})
    harmless = {"num_items_in_batch": torch.tensor(5), "output_router_logits": False, "layer_idx": None}
    check_supported(module, "zigzag_ring_attn", q, None, 0.0, harmless)


def test_sliding_window_when_the_model_does_not_pass_it():
    """transformers' keyword first (None on full layers), else the module's, else the config's on the layers it
    marks sliding (every layer without layer types: Phi-MoE), never with use_sliding_window False."""
    from easy_context.hf.attention import sliding_window

    cfg = SimpleNamespace(sliding_window=5, layer_types=["sliding_attention", "full_attention"])
    assert sliding_window(SimpleNamespace(config=cfg), {"sliding_window": None}) is None
    assert sliding_window(SimpleNamespace(config=cfg, sliding_window=7), {}) == 7
    assert [sliding_window(SimpleNamespace(config=cfg, layer_idx=i), {}) for i in (0, 1)] == [5, None]
    assert sliding_window(SimpleNamespace(config=SimpleNamespace(sliding_window=5)), {}) == 5
    off = SimpleNamespace(sliding_window=5, use_sliding_window=False)
    assert sliding_window(SimpleNamespace(config=off), {}) is None


@pytest.mark.parametrize("config_cap", [None, 50.0])
def test_softcap_passed_only_as_the_keyword(config_cap):
    """transformers' ``softcap`` keyword reaches the attention, with no ``attn_logit_softcapping`` on the config (or
    another value there: the keyword wins); out and dq/dk/dv equal a plain torch tanh-capped causal attention with
    GQA (4 query / 2 KV heads, KV not repeated, as transformers passes them)."""
    from easy_context.hf.attention import make_hf_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g, dtype=torch.float64)  # (b, h, s, d) as transformers passes it
    k, v = (torch.randn(2, 2, 16, 8, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(2, 16, 4, 8, generator=g, dtype=torch.float64)
    cap, scale = 2.0, 0.7  # logits of a few units: the cap of 2 changes them a lot
    module = torch.nn.Module()
    module.config = SimpleNamespace() if config_cap is None else SimpleNamespace(attn_logit_softcapping=config_cap)
    module.is_causal = True

    def plain(q, k, v):
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        s = torch.tanh(q @ k.transpose(-1, -2) * scale / cap) * cap
        s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2)

    fn = make_hf_attention("data_parallel")
    results = []
    for attend in (lambda q, k, v: fn(module, q, k, v, None, scaling=scale, dropout=0.0, softcap=cap)[0], plain):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = attend(*leaves)
        out.backward(dout)
        results.append([out.detach(), *(x.grad for x in leaves)])
    uncapped = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(
        2, 1), is_causal=True, scale=scale).transpose(1, 2)  # fmt: skip
    assert (uncapped - results[1][0]).abs().max() > 0.05  # the cap matters at these logits
    for name, got, ref in zip(("out", "dq", "dk", "dv"), *results):
        assert (got - ref).abs().max() <= 1e-6 * ref.abs().max(), name


def test_decoder_of_finds_the_decoder_stack():
    """transformers' get_decoder() returns the LM itself for Llama 4 text and the output Linear for ModernBERT's
    decoder; easy_context's loss and guards need the module returning hidden states."""
    from easy_context.hf.support import decoder_of

    _quiet()
    for family in ("llama4_text", "modernbert-decoder", "llama"):
        model = model_zoo.tiny_model(family)
        assert decoder_of(model) is model.model, family
