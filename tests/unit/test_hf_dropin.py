"""A switched transformers model used the transformers way on one process, against the same model with transformers'
own attention: the loss keywords, flags that change what attention returns, generate(), padding masks."""

from __future__ import annotations

import inspect

import pytest
import torch

import easy_context as ec
from easy_context.hf.attention import LOSS_KWARGS
from tests.support.models import tiny_model

FAMILIES = ["llama", "gemma2", "gpt_oss", "qwen3"]


def test_loss_keywords_are_transformers_own():
    """Every keyword transformers' causal-LM loss reads from the forward's kwargs is one the attention ignores: a
    transformers release that adds one fails here, not in a user's run."""
    from transformers.loss.loss_utils import ForCausalLMLoss, fixed_cross_entropy

    positional = {"logits", "labels", "vocab_size", "source", "target", "kwargs"}
    names = {p for f in (ForCausalLMLoss, fixed_cross_entropy) for p in inspect.signature(f).parameters} - positional
    assert names == LOSS_KWARGS, names


@pytest.mark.parametrize("model_type", FAMILIES)
def test_loss_keywords_reach_attention_and_are_ignored(model_type):
    """shift_labels / num_items_in_batch / ignore_index pass through every attention call of a switched model; the
    loss is transformers' own (float32, same weights: equal within 1e-6 relative)."""
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = -100
    reference = tiny_model(model_type)(ids, labels=labels).loss
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type), always=True)
    assert model.config._attn_implementation.startswith("easy_context_")
    targets = ec.shift_targets(labels)
    loss = model(ids, labels=labels, shift_labels=targets, num_items_in_batch=(targets != -100).sum(),
                 ignore_index=-100).loss  # fmt: skip
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss"])
def test_output_attentions_on_the_config_is_refused(model_type):
    """transformers does not pass the config's output_attentions to the attention function (it would return
    ``attentions=()`` silently): refused when switched, and at a forward when set afterwards past transformers' own
    setter; the forward's own keyword decides when given."""
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError, match=r"config.output_attentions = True .* attention weights"):
        ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type, output_attentions=True), always=True)
    with pytest.raises(NotImplementedError, match="output_attentions"):
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", tiny_model(model_type, output_attentions=True))
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type), always=True)
    with pytest.raises(ValueError, match="output_attentions"):  # transformers' own setter refuses it after a switch
        model.config.output_attentions = True
    model.config._output_attentions = True  # past the setter (as a config edited by hand or loaded around it)
    with pytest.raises(NotImplementedError, match=r"config.output_attentions = True"):
        model(ids)
    reference = tiny_model(model_type)(ids).logits
    torch.testing.assert_close(model(ids, output_attentions=False).logits, reference, rtol=1e-5, atol=1e-6)
    model.config._output_attentions = False
    with pytest.raises(NotImplementedError, match="output_attentions=True passed to forward"):
        model(ids, output_attentions=True)
