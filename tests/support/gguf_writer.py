"""Write a tiny Llama GGUF file (llama.cpp tensor names, Q/K row permutation, gpt2-style BPE tokenizer metadata)
from a transformers model and tokenizer: what llama.cpp's convert_hf_to_gguf.py writes, in a few lines."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

# transformers parameter name (inside model.layers.N) -> llama.cpp tensor name (inside blk.N)
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation (rotary halves -> interleaved pairs); transformers reverses it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's weights as float32 arrays under llama.cpp names (no ``output.weight`` when embeddings are tied)."""
    cfg = model.config
    out = {}
    for name, value in model.state_dict().items():
        w = value.detach().float().cpu().numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = w
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.removesuffix(".weight")
            if module.endswith("q_proj"):
                w = _permute(w, cfg.num_attention_heads)
            elif module.endswith("k_proj"):
                w = _permute(w, cfg.num_key_value_heads)
            out[f"blk.{layer}.{_LAYER_NAMES[module]}.weight"] = w
    return out


def write_tiny_llama_gguf(
    path: str | os.PathLike,
    model,
    tokenizer_dir: str | os.PathLike | None,
    quant: str = "F32",
    arch: str = "llama",
    add_bos: bool = False,
) -> str:
    """Write ``model`` (a ``LlamaForCausalLM``) and the byte-level BPE in ``tokenizer_dir`` (its tokenizer.json;
    None: no tokenizer metadata) as a GGUF file. ``quant``: the type of the 2-D weights (``F32``, ``F16``, ``Q8_0``,
    ...; ``F64``: one gguf cannot dequantize); norms stay F32 as llama.cpp writes them. ``arch``: the
    ``general.architecture`` recorded. ``add_bos``: ``tokenizer.ggml.add_bos_token`` (False as in SmolLM2's file)."""
    import gguf

    cfg = model.config
    qtype = gguf.GGMLQuantizationType[quant]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0))
    if tokenizer_dir is not None:
        with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        vocab = spec["model"]["vocab"]
        tokens = [None] * len(vocab)
        for token, index in vocab.items():
            tokens[index] = token
        special = {t["content"] for t in spec["added_tokens"] if t["special"]}
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
        writer.add_token_merges(merges)
        writer.add_bos_token_id(vocab["<s>"])
        writer.add_eos_token_id(vocab["</s>"])
        writer.add_pad_token_id(vocab["<pad>"])
        writer.add_add_bos_token(add_bos)
    for name, w in gguf_tensors(model).items():
        if w.ndim == 2 and quant == "F64":  # a type gguf can write but not dequantize
            writer.add_tensor(name, w.astype(np.float64))
        elif w.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def train_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 300):
    """A byte-level BPE (specials ``<s>``, ``</s>``, ``<pad>``) trained on synthetic text, saved to ``out_dir``."""
    from easy_context.data.tokenizer import train_byte_level_bpe

    words = "the model reads a long context and learns where each word comes from in the text".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(400)) for i in range(8)]
    return train_byte_level_bpe(texts, vocab_size, str(out_dir))


def tiny_llama(tokenizer, seed: int = 0, **overrides):
    """A random-init float32 ``LlamaForCausalLM`` over ``tokenizer``'s vocabulary (hidden 64, 2 layers, 4 heads / 2
    kv heads, tied embeddings; its bos/eos/pad ids), norms random too so a mixed-up tensor shows in the logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = LlamaConfig(**{**shape, **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model
