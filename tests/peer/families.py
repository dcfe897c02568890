"""Tiny configs and inputs of the decoder families the peer tests run, with the ``model_tester`` interface that
transformers' ``ModelTesterMixin`` reads (``prepare_config_and_inputs_for_common``, ``batch_size``, ``seq_length``,
``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``is_training``, ...).

Each family keeps what makes its attention its own: GQA everywhere (4 query heads on 2 K/V heads), a sliding window
shorter than the sequence on the layers that have one (Mistral, Qwen2, Starcoder2, Gemma 2/3, gpt-oss), Gemma 2's logit
soft-capping, gpt-oss' sinks and experts, Cohere's and Granite's logit scaling, Olmo 2's and Qwen 3's q/k norms.
Inputs are as transformers' causal-LM testers build them: random ids and a lower-triangular ``attention_mask``
(the first rows right-padded, the others all ones); all ones when the test case's ``padded`` is False (on one process
a padding mask sends a forward to the model's own attention: with all ones every forward runs easy_context's).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers


@dataclass(frozen=True)
class Family:
    name: str
    config: str
    base_model: str
    causal_lm: str
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    # whether the config class builds without arguments and without a warning (ConfigTester checks it when true)
    config_inits_quietly: bool = True

    @property
    def classes(self) -> tuple[type, type, type]:
        return tuple(getattr(transformers, n) for n in (self.config, self.base_model, self.causal_lm))


WINDOW = 4  # shorter than DecoderTester.seq_length: the sliding layers mask something

FAMILIES = (
    Family("cohere", "CohereConfig", "CohereModel", "CohereForCausalLM", {"logit_scale": 0.5, "use_qk_norm": True}),
    Family("gemma2", "Gemma2Config", "Gemma2Model", "Gemma2ForCausalLM",
           {"sliding_window": WINDOW, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    Family("gemma3", "Gemma3TextConfig", "Gemma3TextModel", "Gemma3ForCausalLM",
           {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}),
    Family("gpt_oss", "GptOssConfig", "GptOssModel", "GptOssForCausalLM",
           {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2,
            "intermediate_size": 32,  # its experts' grouped matmul needs 16-byte strides
            "layer_types": ["sliding_attention", "full_attention"]}),
    Family("granite", "GraniteConfig", "GraniteModel", "GraniteForCausalLM",
           {"embedding_multiplier": 2.0, "logits_scaling": 4.0, "residual_multiplier": 0.5,
            "attention_multiplier": 0.25}),
    Family("llama", "LlamaConfig", "LlamaModel", "LlamaForCausalLM"),
    Family("mistral", "MistralConfig", "MistralModel", "MistralForCausalLM", {"sliding_window": WINDOW}),
    Family("olmo2", "Olmo2Config", "Olmo2Model", "Olmo2ForCausalLM"),
    Family("phi3", "Phi3Config", "Phi3Model", "Phi3ForCausalLM", {"original_max_position_embeddings": 512}),
    Family("qwen2", "Qwen2Config", "Qwen2Model", "Qwen2ForCausalLM",
           {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    Family("qwen3", "Qwen3Config", "Qwen3Model", "Qwen3ForCausalLM"),
    # Starcoder2Config()'s default bos/eos ids (50256) lie outside its default vocabulary (49152): transformers warns
    Family("starcoder2", "Starcoder2Config", "Starcoder2Model", "Starcoder2ForCausalLM", {"sliding_window": WINDOW},
           config_inits_quietly=False),
)  # fmt: skip


class DecoderTester:
    """The ``model_tester`` of one family: a 2-layer model of hidden size 32 on 13 rows of 7 tokens."""

    batch_size = 13
    seq_length = 7
    is_training = True
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    num_key_value_heads = 2
    head_dim = 8
    intermediate_size = 37
    max_position_embeddings = 512
    initializer_range = 0.02
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    num_labels = 3
    type_sequence_label_size = 2

    def __init__(self, parent, family: Family, ids_tensor):
        self.parent = parent
        self.family = family
        self.config_class, self.base_model_class, self.causal_lm_class = family.classes
        self._ids_tensor = ids_tensor

    @property
    def all_model_classes(self) -> tuple[type, ...]:
        return (self.base_model_class, self.causal_lm_class)

    def config_inputs(self) -> dict[str, Any]:
        """The keyword arguments of the family's config (the tester's sizes its config class takes, and its own)."""
        names = set(inspect.signature(self.config_class.__init__).parameters) | {"pad_token_id"}
        sizes = {name: getattr(self, name) for name in names if hasattr(type(self), name) and name != "is_training"}
        return {**sizes, **self.family.config_kwargs}

    def get_config(self):
        return self.config_class(**self.config_inputs())

    def prepare_config_and_inputs(self):
        input_ids = self._ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.ones_like(input_ids)
        if getattr(self.parent, "padded", True):
            attention_mask = torch.tril(attention_mask)
        return self.get_config(), input_ids, attention_mask

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, attention_mask = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}
