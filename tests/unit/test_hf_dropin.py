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


def _left_padded(rows: int = 3, width: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a left-padded batch as a tokenizer makes it for generate(): pad id 0."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (rows, width), generator=g)
    mask = torch.ones_like(ids)
    for row, pads in enumerate([4, 2, 0, 7][:rows]):
        mask[row, :pads] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "qwen2", "gpt_oss"])
@pytest.mark.parametrize("how", ["data_parallel", "named_kernel"])
def test_generate_matches_transformers(model_type, how):
    """Greedy generate() of one prompt and of a left-padded batch on a switched model gives transformers' tokens.
    Which path: every forward that carries transformers' KV cache (prefill and decode steps alike) runs the model's
    own attention, so easy_context's attention is never called (counted) and the model is switched back after."""
    from easy_context.hf.attention import attention_calls

    reference = tiny_model(model_type)
    kernel = {"kernel": "math"} if how == "named_kernel" else {}
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type), **kernel)
    switched = model.config._attn_implementation
    assert switched.startswith("easy_context_") == (how == "named_kernel" or model_type == "gpt_oss")
    prompt = torch.randint(1, 128, (1, 13), generator=torch.Generator().manual_seed(0))
    ids, mask = _left_padded()
    calls = attention_calls()
    for inputs in ({"input_ids": prompt}, {"input_ids": ids, "attention_mask": mask}):
        want = reference.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=0)
        got = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(got, want), (inputs.keys(), got, want)
    assert attention_calls() == calls
    assert model.config._attn_implementation == switched
    if switched.startswith("easy_context_"):  # a forward without a cache is ours again
        model(prompt)
        assert attention_calls() > calls


@pytest.mark.parametrize("model_type", FAMILIES)
def test_any_padding_mask_matches_transformers_on_one_process(model_type):
    """Left, right and inner zeros in a 2-D attention_mask: a switched model on one process runs the model's own
    attention for that forward (easy_context's is not called), so every unmasked position is transformers' number
    (1e-6 relative); a forward without a mask is ours again."""
    from easy_context.hf.attention import attention_calls

    ids, mask = _left_padded(rows=4, width=12)
    mask[2, 8:] = 0  # right padding
    mask[3, 3:5] = 0  # zeros inside a row
    reference = tiny_model(model_type)(ids, attention_mask=mask).logits
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type), kernel="math")
    calls = attention_calls()
    logits = model(ids, attention_mask=mask).logits
    assert attention_calls() == calls
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[real], rtol=1e-6, atol=1e-6)
    model(ids)
    assert attention_calls() > calls


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_padded_training_with_gradient_checkpointing_matches_transformers(model_type):
    """Gradient checkpointing recomputes a padded forward after the switched model went back to easy_context's
    attention: the recompute's mask (built for the model's own attention) goes to the model's own attention function,
    so the loss and every gradient are transformers' (1e-5 relative); the recompute did not run easy_context's math."""
    from easy_context.hf.attention import attention_calls

    ids, mask = _left_padded(rows=3, width=12)
    labels = ids.masked_fill(mask == 0, -100)
    reference = tiny_model(model_type).train()
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type).train(), kernel="math")
    for m in (reference, model):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    want = reference(ids, attention_mask=mask, labels=labels).loss
    want.backward()
    calls = attention_calls()
    got = model(ids, attention_mask=mask, labels=labels).loss
    got.backward()
    assert attention_calls() == calls
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_type_patch_keeps_an_explicit_attention_on_one_process_only():
    """A data_parallel type patch switches models built without attn_implementation and keeps one asked for by name
    (the same numbers either way); an SP type patch switches every model of the type (another attention would compute
    each rank's shard alone: EasyContext's scripts load with attn_implementation="flash_attention_2", then patch)."""
    from unittest import mock

    from transformers import AutoModelForCausalLM

    from easy_context.hf import patch as hf_patch
    from tests.support.models import tiny_config

    with mock.patch.dict(hf_patch._TYPE_PATCHES):
        ec.apply_seq_parallel_monkey_patch("data_parallel", "llama", kernel="math")
        assert AutoModelForCausalLM.from_config(tiny_config("llama")).config._attn_implementation.startswith(
            "easy_context_data_parallel"
        )
        kept = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="eager")
        assert kept.config._attn_implementation == "eager"
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", "llama")
        switched = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="eager")
        assert switched.config._attn_implementation.startswith("easy_context_zigzag_ring_attn")


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_use_cache_asked_for_returns_transformers_cache(model_type):
    """use_cache=True on a switched model (one process, no cache passed) returns the cache transformers fills during
    the forward (easy_context's attention computes the forward); its keys and values are transformers' own. Unasked,
    no cache is built (at long lengths it would hold every layer's K/V)."""
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    reference = tiny_model(model_type)(ids, use_cache=True)
    model = ec.apply_seq_parallel_monkey_patch("data_parallel", tiny_model(model_type), kernel="math")
    out = model(ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    want = getattr(reference, "cache", None) or reference.past_key_values
    assert cache is not None and cache.get_seq_length() == 9
    for got_layer, want_layer in zip(cache.layers, want.layers):  # past layer 0 the keys carry the attention's fp32
        torch.testing.assert_close(got_layer.keys, want_layer.keys, rtol=1e-5, atol=1e-6)  # summation order
    torch.testing.assert_close(out.logits, reference.logits, rtol=1e-5, atol=1e-6)
    unasked = model(ids)
    assert (getattr(unasked, "cache", None) or unasked.past_key_values) is None


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
@pytest.mark.parametrize("seq_algo", ["data_parallel", "zigzag_ring_attn"])
def test_a_patch_leaves_a_twin_of_the_same_config_alone(model_type, seq_algo):
    """transformers' from_config keeps the config object it is given: two models built from one config share it.
    Switching one leaves the other on transformers' own attention: its logits and greedy generate() are those of a
    model that was never patched (built alone, same weights); the switched one keeps its parity (data_parallel:
    1e-5 against transformers' attention, through easy_context's attention)."""
    from transformers import AutoModelForCausalLM

    from easy_context.hf.attention import attention_calls
    from tests.support.models import tiny_config

    config = tiny_config(model_type)
    twins = []
    for _ in range(2):
        torch.manual_seed(0)  # tiny_model's seed: the reference has the same weights
        twins.append(AutoModelForCausalLM.from_config(config, attn_implementation="eager").float())
    patched, twin = twins
    assert patched.config is twin.config
    reference = tiny_model(model_type)
    kernel = {"kernel": "math"} if seq_algo == "data_parallel" else {}
    ec.apply_seq_parallel_monkey_patch(seq_algo, patched, **kernel)
    assert patched.config._attn_implementation.startswith("easy_context_")
    assert twin.config._attn_implementation == "eager" and config._attn_implementation == "eager"
    assert all(m.config is twin.config for m in twin.modules() if hasattr(m, "config"))
    ids = torch.randint(1, 128, (2, 13), generator=torch.Generator().manual_seed(0))
    calls = attention_calls()
    torch.testing.assert_close(twin(ids).logits, reference(ids).logits, rtol=0, atol=0)
    want = reference.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(twin.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0), want)
    assert attention_calls() == calls  # the twin never reached easy_context's attention
    if seq_algo == "data_parallel":
        torch.testing.assert_close(patched(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-6)
        assert attention_calls() > calls
