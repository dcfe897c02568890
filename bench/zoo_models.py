"""The tiny models of ``bench/model_zoo.py``: a small random config for every causal-LM family of the installed
transformers (hidden 64, 2 layers, 4 query / 2 K/V heads of 16 where the family allows, vocab 128, windows of 5
tokens), the per-family overrides and variant families it needs, the model built from it, and the batch it runs."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import torch

SEQ, BATCH, WINDOW = 24, 2, 5  # 12 tokens per rank on 2 ranks (zigzag halves of 6): the window is shorter

GENERIC = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, vocab_size=128, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, tie_word_embeddings=False, dff=96, ffn_dim=96)  # fmt: skip
MOE = dict(num_experts=4, n_routed_experts=4, num_local_experts=4, moe_num_experts=4, num_experts_per_tok=2, moe_k=2,
           moe_topk=2, top_k_experts=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
           shared_experts_intermediate_size=32, moe_shared_expert_intermediate_size=32, expert_ffn_hidden_size=32,
           n_shared_experts=1, num_shared_experts=1, moe_num_shared_experts=1, n_group=1, topk_group=1)  # fmt: skip
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
ATTENTION_LAYERS = ("full_attention", "sliding_attention")

# Per-family config overrides on top of the generic tiny config (applied last), and variant families: name ->
# (model type, overrides). Comments say why.
PER_LAYER_ROPE = {kind: {"rope_type": "default", "rope_theta": 10000.0}
                  for kind in ("full_attention", "sliding_attention", "hybrid", "hybrid_sliding")}  # fmt: skip
OVERRIDES: dict[str, dict[str, Any]] = {
    "cohere_compass_text": {"rope_parameters": PER_LAYER_ROPE},
    "codegen": {"rotary_dim": 8},  # partial rotary (8 of 16 head dims), GPT-J style
    "gptj": {"rotary_dim": 8},
    "dbrx": {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256,
             "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}},
    "gemma3n_text": {"intermediate_size": [96, 96], "activation_sparsity_pattern": [0.0, 0.0],
                     "num_kv_shared_layers": 0, "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16,
                     "laurel_rank": 8,
                     "layer_types": ["sliding_attention", "full_attention"]},
    "gemma4_text": {"vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": WINDOW},
    "llama4_text": {"attention_chunk_size": 8, "floor_scale": 4},  # chunks and NoPE query scaling within 24 tokens
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # a short-convolution layer next to an attention layer
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "longcat_flash": {"head_dim": MLA["qk_rope_head_dim"], "num_layers": 2},  # its RoPE tables follow head_dim
    "minimax_m3_vl_text": {"shared_intermediate_size": 32, "dense_intermediate_size": 96},
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1},
    "zamba": {"layers_block_type": ["linear_attention", "hybrid"], "attention_head_dim": 16},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"]},
    "zaya": {"num_experts_per_tok": 1, "rope_parameters": PER_LAYER_ROPE, "layer_types": ["hybrid", "hybrid_sliding"]},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 4},
}  # fmt: skip
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama+llama3_rope": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16}}),
    "llama+yarn": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 16}}),
    # frequencies chosen from max(position_ids) + 1: the 24 tokens pass 20, zigzag rank 1's 18 do not
    "llama+dynamic_rope": ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                                     "max_position_embeddings": 20}),
    "phi3+longrope": ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "short_factor": [1.0 + i / 8 for i in range(8)],
                                                   "long_factor": [2.0 + i / 4 for i in range(8)],
                                                   "original_max_position_embeddings": 20},
                               "original_max_position_embeddings": 20, "max_position_embeddings": 64}),
    # Phi-MoE's own rotary class: frequencies and cos/sin scale (short / long mscale) chosen the same way
    "phimoe+longrope": ("phimoe", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                       "short_factor": [1.0 + i / 8 for i in range(8)],
                                                       "long_factor": [2.0 + i / 4 for i in range(8)],
                                                       "short_mscale": 1.0, "long_mscale": 1.25,
                                                       "original_max_position_embeddings": 20},
                                   "max_position_embeddings": 64}),
}  # fmt: skip


def families() -> list[str]:
    """Every causal-LM model type of the installed transformers, then the variant families."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) + sorted(VARIANTS)


def _fields(cls) -> set[str]:
    try:
        names = {f.name for f in dataclasses.fields(cls)}
    except TypeError:
        names = set()
    return names | set(getattr(cls, "attribute_map", {}))


def tiny_config(family: str):
    """The tiny config of ``family`` (a model type or a :data:`VARIANTS` name)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, variant = VARIANTS.get(family, (family, {}))
    cls = CONFIG_MAPPING[model_type]
    fields = _fields(cls)
    kw = dict(GENERIC)
    if any(k in fields for k in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")):
        kw.update(MOE)
    if "kv_lora_rank" in fields:  # multi-head latent attention: one K/V head per query head
        kw.update(MLA, num_key_value_heads=GENERIC["num_attention_heads"])
        kw.pop("head_dim")
    for name in fields:  # deterministic: no dropout, no router noise
        if "dropout" in name or "pdrop" in name or "jitter" in name:
            kw[name] = 0.0
    if "sliding_window" in fields:
        kw["sliding_window"] = WINDOW
    if "use_sliding_window" in fields:
        kw["use_sliding_window"] = True
    own = {f.name for f in dataclasses.fields(cls)}
    for alias, target in getattr(cls, "attribute_map", {}).items():  # GPT-J's hidden_size is its n_embd field
        if alias in kw and alias not in own:
            kw.setdefault(target, kw.pop(alias))
    kw = {k: v for k, v in kw.items() if k in own}
    kw.update(OVERRIDES.get(family, {}), **variant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = cls(**kw)
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types and "layer_types" in fields and "layer_types" not in kw and len(layer_types) == 2:
            others = [t for t in layer_types if t not in ATTENTION_LAYERS]
            if others:  # a hybrid: keep one layer of its other kind next to a full-attention layer
                wanted = [others[0], "full_attention"]
            elif getattr(cfg, "sliding_window", None):  # one sliding and one full layer
                wanted = ["sliding_attention", "full_attention"]
            else:
                wanted = list(layer_types)
            if wanted != list(layer_types):
                try:
                    cfg = cls(**{**kw, "layer_types": wanted})
                except Exception:  # the family fixes its own pattern: keep it
                    pass
    return cfg


def tiny_model(family: str, seed: int = 0):
    """A tiny fp32 eager model of ``family`` with seeded random weights."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(family)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    with torch.no_grad():  # off every neutral init (zero sinks and biases, unit norms and scales): all weights matter
        for p in model.parameters():
            if p.is_floating_point():
                p.mul_(1 + 0.1 * torch.randn_like(p)).add_(0.02 * torch.randn_like(p))
    return model.float().train()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, shifted targets) of BATCH rows of SEQ tokens; 40% of the targets ignored (-100)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, GENERIC["vocab_size"], (BATCH, SEQ + 1), generator=g)
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[torch.rand(targets.shape, generator=g) < 0.4] = -100
    return inputs, targets
