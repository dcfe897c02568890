"""Model shapes for the planner: the built-in published architectures, the tiny presets, size parsing.

The one home of the model shapes: :mod:`easy_context.models` builds its ``shape:<name>`` configs and presets from
these tables; :func:`load_model_shape` reads a model name as every command does (:mod:`easy_context.models.resolve`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9
GIB = 2**30

# The published shapes of these models (their config.json on the hub), for offline use.
BUILTIN_MODELS: dict[str, dict] = {
    "llama-2-7b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
    "llama-3-70b": dict(model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, intermediate_size=28672, vocab_size=128256),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=32000),
    "qwen2-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, intermediate_size=18944, vocab_size=152064),
    # Gemma 3's smallest: 5 sliding-window layers to 1 global, q/k norms, 4 norms a layer, a 262K tied vocabulary
    "gemma-3-270m": dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                         layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, query_pre_attn_scalar=256,
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                         max_position_embeddings=32768, vocab_size=262144, tie_word_embeddings=True),
}  # fmt: skip
ALIASES = {"llama-2-7b-hf": "llama-2-7b", "meta-llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b",
           "meta-llama-3.1-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b", "llama-3.1-70b": "llama-3-70b",
           "meta-llama-3.1-70b": "llama-3-70b", "mistral-7b-v0.1": "mistral-7b", "qwen2.5-7b": "qwen2-7b",
           "gemma-3-270m-it": "gemma-3-270m"}  # fmt: skip

# The random-init presets (offline demos and tests; llama-100m: the H200 demo): name -> (model_type, config
# overrides); vocab_size comes from the tokenizer (easy_context.models.load_model), the planner assumes 32000 unless
# given.
PRESETS: dict[str, tuple[str, dict]] = {
    "tiny-llama": ("llama", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2)),
    # the same with tied input/output embeddings: the demo's base model (tied, a tiny model learns to copy a
    # retrieved token far sooner: measured in docs/benchmarks.md)
    "tiny-llama-tied": ("llama", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "tiny-mistral": ("mistral", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2)),
    "tiny-qwen3": ("qwen3", dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=32)),
    # the H200 demo's base (train_scripts/demo_h200.sh): GPT-2-small-like, 14 layers x 768, 12 heads of 64, tied;
    # 99.9M parameters with the demo's 1000-token vocabulary (123.7M with a 32K one)
    "llama-100m": ("llama", dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=14, num_attention_heads=12,
                                 num_key_value_heads=12, tie_word_embeddings=True)),
}  # fmt: skip


def parse_size(text: str | float | int) -> float:
    """Bytes of "80GB" (1e9), "512GiB" (2**30), "1TB", "1.5T", "2048MiB"; a bare number is GB."""
    if isinstance(text, (int, float)):
        return float(text) * GB
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGTP]?)(I?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"cannot parse size {text!r} (examples: 80GB, 141GB, 1TB, 512GiB)")
    value, prefix, binary = float(m.group(1)), m.group(2) or "G", bool(m.group(3))
    power = "KMGTP".index(prefix) + 1
    return value * (1024**power if binary else 1000**power)


@dataclass
class ModelShape:
    """The dimensions of a Llama-style decoder that the byte budget needs, and its parameter counts."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorms on q and k (Qwen3, Gemma 3, OLMo 2)
    sandwich_norms: bool = False  # norms on the attention's and the MLP's outputs too: 4 per layer (Gemma 2/3)
    gemma_norm: bool = False  # (1 + weight) applied in fp32: eager saves an fp32 x_hat, not a bf16 one
    rope_tables: int = 1  # RoPE cos/sin tables the model keeps for the whole sequence (Gemma 3: local + global)

    @classmethod
    def from_config(cls, name: str, cfg: dict) -> ModelShape:
        """The shape of a config.json dict (its ``text_config`` for multimodal configs)."""
        cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        model_type = cfg.get("model_type", "")
        gemma = model_type.startswith("gemma")
        gemma3 = model_type in ("gemma3", "gemma3_text")
        return cls(
            name=name,
            hidden=h,
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or h // heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", False)) or model_type == "qwen2",
            qk_norm=gemma3 or model_type in ("qwen3", "qwen3_moe", "olmo2"),
            sandwich_norms=gemma and model_type != "gemma",
            gemma_norm=gemma,
            rope_tables=2 if gemma3 else 1,
        )

    @property
    def qd(self) -> int:
        """The q width n_h x d."""
        return self.heads * self.head_dim

    @property
    def kvd(self) -> int:
        """The K (or V) width n_kv x d."""
        return self.kv_heads * self.head_dim

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights and biases: below ZeRO-3's persistence threshold (10 h), kept whole on every GPU."""
        norms = (4 if self.sandwich_norms else 2) * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return norms + ((self.qd + 2 * self.kvd) if self.qkv_bias else 0)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention projections, gated MLP, norms, biases)."""
        h = self.hidden
        return 2 * h * self.qd + 2 * h * self.kvd + 3 * h * self.intermediate + self.small_params_per_layer

    @property
    def params(self) -> int:
        """All parameters P: the layers, the embedding, the LM head unless tied, the final norm."""
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params + embed * (1 if self.tied else 2) + self.hidden

    @property
    def largest_param(self) -> int:
        """Elements of the largest parameter tensor (the embedding / LM head for every supported model)."""
        h = self.hidden
        return max(self.vocab * h, self.intermediate * h, self.qd * h)
