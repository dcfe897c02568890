"""How a causal LM scales its logits after the LM head, as one multiplier the loss and the evals apply.

transformers' Cohere models multiply the head's logits by ``config.logit_scale`` (0.0625 by default), Granite divides
them by ``config.logits_scaling``, HyperCLOVA X multiplies by the attribute of the same name, MiniCPM3 divides the
hidden states by it, Falcon-H1 multiplies by ``config.lm_head_multiplier``: the same attribute name means opposite
things in different models, so the rule is per ``model_type``, read from each model's causal-LM forward
(transformers 5.24). A model type outside the table that carries one of these attributes with a value other than 1
is refused: the loss would silently differ from the model's own.

Scaling the logits by ``m`` equals scaling the hidden states by ``m`` before the head (``(m h) W^T = m (h W^T)``),
which is how :class:`~easy_context.loss.LMHeadWithLoss` applies it: every loss implementation (chunked, Liger, CCE,
plain) then computes the model's loss unchanged.
"""

from __future__ import annotations

from typing import Any

MUL, DIV = "mul", "div"

LOGIT_SCALING: dict[str, tuple[str, str]] = {
    "cohere": ("logit_scale", MUL),
    "cohere2": ("logit_scale", MUL),
    "cohere2_moe": ("logit_scale", MUL),
    "granite": ("logits_scaling", DIV),
    "granite_swa": ("logits_scaling", DIV),
    "granitemoe": ("logits_scaling", DIV),
    "granitemoe_swa": ("logits_scaling", DIV),
    "granitemoeshared": ("logits_scaling", DIV),
    "granitemoehybrid": ("logits_scaling", DIV),
    "hyperclovax": ("logits_scaling", MUL),
    "minicpm3": ("logits_scaling", DIV),
    "falcon_h1": ("lm_head_multiplier", MUL),
}
SCALING_ATTRIBUTES = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier_scale",
                      "output_multiplier")  # fmt: skip


def logit_multiplier(config: Any) -> float:
    """The factor the model's causal-LM forward applies to ``lm_head(hidden)`` (1.0 for most models).

    Raises ``NotImplementedError`` for a model type this module does not know that carries a scaling attribute
    other than 1 (what it does with it is not known here)."""
    rule = LOGIT_SCALING.get(getattr(config, "model_type", None))
    if rule is not None:
        attr, op = rule
        value = float(getattr(config, attr, 1.0) or 1.0)
        return value if op == MUL else 1.0 / value
    for attr in SCALING_ATTRIBUTES:
        value = getattr(config, attr, None)
        if isinstance(value, (int, float)) and value != 1:
            raise NotImplementedError(
                f"models that scale their logits are supported per model type (easy_context/loss/logit_scale.py: "
                f"{', '.join(LOGIT_SCALING)}); model_type {config.model_type!r} has config.{attr}={value}: add its "
                "rule there after reading its causal-LM forward in transformers"
            )
    return 1.0
