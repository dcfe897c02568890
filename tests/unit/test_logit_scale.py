"""Models that scale their logits after the LM head (Cohere multiplies by ``logit_scale``, Granite divides by
``logits_scaling``, ...): easy_context's loss (every implementation) and the evals' logits equal the model's own,
per model type; a model type with an unknown scaling is refused (easy_context/loss/logit_scale.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from easy_context.eval.forward import _head_logits
from easy_context.loss import LOGIT_SCALING, CausalLMWithLoss, logit_multiplier
from tests.support.models import TINY

# model type -> (config class name, the scaling attribute's value: far from 1, so a wrong rule shows)
SCALED = {
    "cohere": ("CohereConfig", 0.0625),
    "cohere2": ("Cohere2Config", 0.0625),
    "granite": ("GraniteConfig", 4.0),
    "granitemoe": ("GraniteMoeConfig", 4.0),
    "hyperclovax": ("HyperCLOVAXConfig", 4.0),
    "falcon_h1": ("FalconH1Config", 4.0),
    "minicpm3": ("MiniCPM3Config", None),  # logits_scaling is hidden_size / dim_model_base (a property): 64 / 16
}


def scaled_model(model_type: str):
    import transformers
    from transformers import AutoModelForCausalLM

    cls_name, value = SCALED[model_type]
    attr = LOGIT_SCALING[model_type][0]
    extra = {"head_dim": 16} if model_type in ("granite", "hyperclovax") else {}
    if model_type == "minicpm3":
        extra = dict(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                     dim_model_base=16, num_key_value_heads=4)  # fmt: skip  # MLA: a K/V head per query head
    if model_type == "granitemoe":
        extra = dict(num_local_experts=2, num_experts_per_tok=1)
    scaling = {} if value is None else {attr: value}
    cfg = getattr(transformers, cls_name)(**{**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, **extra,
                                             **scaling})  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager").float()
    assert model.config.model_type == model_type
    return model


@pytest.mark.parametrize(
    "model_type,impl", [(m, "chunked") for m in SCALED] + [("cohere", "plain"), ("granite", "plain")]
)  # the scale is applied before the implementation is chosen: two models suffice for the second one
def test_loss_and_gradients_equal_the_models_own(model_type, impl):
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 24))
    pos = torch.arange(24).expand(2, 24)
    labels = ids.clone()
    labels[0, :5] = -100  # a masked prompt
    reference = scaled_model(model_type)
    ref_loss = reference(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss
    ref_loss.backward()

    model = scaled_model(model_type)
    wrapped = CausalLMWithLoss(model, impl=impl)
    assert wrapped.logit_scale == pytest.approx(logit_multiplier(model.config)) and wrapped.logit_scale != 1.0
    targets = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1)  # what the model shifts internally
    loss_sum, n = wrapped(ids, pos, targets)
    (loss_sum / n).backward()
    assert (loss_sum / n).item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("model_type", list(SCALED))
def test_eval_logits_equal_the_models_own(model_type):
    model = scaled_model(model_type)
    ids = torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[0].float()
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
        assert torch.allclose(_head_logits(model, hidden), want, rtol=1e-5, atol=1e-5)


def test_unknown_scaling_is_refused_and_plain_models_are_unscaled():
    from transformers import LlamaConfig

    assert logit_multiplier(LlamaConfig(**TINY)) == 1.0
    with pytest.raises(NotImplementedError, match="config.logit_scale=2.0"):
        logit_multiplier(LlamaConfig(**TINY, logit_scale=2.0))
