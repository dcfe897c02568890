"""One config object per switched model tree (easy_context.hf.tree_config), whatever parts were switched in whatever
order; a model merely built from the same config object is left alone; the backend is looked up once, at the switch."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import easy_context as ec
from easy_context.hf.attention import attention_calls
from tests.support.models import tiny_config, tiny_model
from tests.support.registry_lookups import count_lookups

DP = {"seq_algo": "data_parallel", "always": True, "kernel": "math"}

# each order names the parts switched, in turn: "top" the causal LM, "inner" its decoder (model.model)
ORDERS = [("inner", "top"), ("top", "inner"), ("top", "top"), ("inner", "inner", "top"), ("inner",)]


def _part(model, which: str):
    return model if which == "top" else model.model


def _switch(model, order) -> None:
    for which in order:
        ec.apply_seq_parallel_monkey_patch(model=_part(model, which), **DP)


def _one_config(model) -> None:
    held = {id(m.config) for m in model.modules() if hasattr(m, "config")}
    assert held == {id(model.config)} and model.config is model.model.config


@pytest.mark.parametrize("order", ORDERS, ids="-".join)
def test_every_switch_order_leaves_one_config_that_edits_and_experts_reach(order):
    """gpt-oss switched in each order: every module holds the model's one config, the config it was built from is
    untouched; ``config.use_cache`` set on the top model reaches the decoder, and ``set_experts_implementation``
    reaches the experts: the batched_mm kernel runs (and gives the eager experts' logits within 1e-5)."""
    from transformers.integrations import moe

    model = tiny_model("gpt_oss")
    built_from = model.config
    _switch(model, order)
    if order == ("inner",):  # the parent was never switched: it keeps the config it was built from, as a twin would
        assert model.config is built_from and model.model.config is not built_from
        return
    _one_config(model)
    assert built_from._attn_implementation == "eager" and model.config._attn_implementation.startswith("easy_context_")
    model.config.use_cache = False
    assert model.model.config.use_cache is False
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(ids).logits
    spy = mock.Mock(wraps=moe.batched_mm_experts_forward)
    with mock.patch.dict(moe.ALL_EXPERTS_FUNCTIONS._global_mapping, {"batched_mm": spy}):
        model.set_experts_implementation("batched_mm")
        calls = attention_calls()
        with torch.no_grad():
            batched = model(ids).logits
    assert spy.call_count == model.config.num_hidden_layers and attention_calls() > calls
    torch.testing.assert_close(batched, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [("inner", "top"), ("top", "inner"), ("inner",)], ids="-".join)
def test_a_twin_built_from_the_same_config_stays_unswitched(order):
    """Two models built from one config object share it (transformers' from_config keeps it): switching one, in any
    order of its parts, leaves the other on that config, on transformers' attention, with a model's logits."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    torch.manual_seed(0)
    switched = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    torch.manual_seed(0)
    twin = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    assert twin.config is switched.config is config
    _switch(switched, order)
    assert config._attn_implementation == "eager"
    assert all(m.config is config for m in twin.modules() if hasattr(m, "config"))
    ids = torch.randint(1, 128, (2, 13), generator=torch.Generator().manual_seed(0))
    calls = attention_calls()
    torch.testing.assert_close(twin(ids).logits, tiny_model("llama")(ids).logits, rtol=0, atol=0)
    assert attention_calls() == calls


def test_a_part_is_refused_another_backend_than_its_model():
    """A part of a switched model shares its config, so its backend: switching it to another is refused in one line
    naming the fix; the whole model switched afterwards replaces the backend of every part switched before (the
    decoder's zigzag guard, which asks for position_ids, is gone)."""
    model = ec.apply_seq_parallel_monkey_patch(model=tiny_model("llama"), **DP)
    with pytest.raises(ValueError, match=r"part of a LlamaForCausalLM .* switch the LlamaForCausalLM itself") as error:
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model.model)
    assert "\n" not in str(error.value)
    ec.apply_seq_parallel_monkey_patch(model=model.model, **DP)  # the same backend and options: fine

    model = tiny_model("llama")
    ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", model.model)
    ec.apply_seq_parallel_monkey_patch(model=model, **DP)
    _one_config(model)
    ids = torch.randint(1, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.model(ids).last_hidden_state, tiny_model("llama").model(ids).last_hidden_state,
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_a_type_patch_under_sp_keeps_one_config():
    """An SP type patch switches the decoder at the end of its construction, then the causal LM: one config."""
    from transformers import AutoModelForCausalLM

    from easy_context.hf import patch as hf_patch

    with mock.patch.dict(hf_patch._TYPE_PATCHES):
        ec.apply_seq_parallel_monkey_patch("zigzag_ring_attn", "gpt_oss")
        config = tiny_config("gpt_oss")
        model = AutoModelForCausalLM.from_config(config)
        twin = AutoModelForCausalLM.from_config(config)
    for built in (model, twin):
        _one_config(built)
        assert built.config._attn_implementation.startswith("easy_context_zigzag_ring_attn")
    assert model.config is not twin.config


def test_the_backend_is_looked_up_once_at_the_switch():
    """A switch looks its backend up once (the attention function it registers, its guards and its checks hold the
    backend object); the forward and backward of the switched model (a loss, documents marked by position_ids) look
    nothing up."""
    model = tiny_model("gpt_oss")
    assert count_lookups(lambda: ec.apply_seq_parallel_monkey_patch("data_parallel", model, always=True,
                                                                    kernel="cpu")) == 1  # fmt: skip
    ids = torch.randint(1, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(10), torch.arange(6)])[None]

    def step():
        model(ids, position_ids=positions, labels=ids).loss.backward()

    calls = attention_calls()
    assert count_lookups(step) == 0
    assert attention_calls() - calls == model.config.num_hidden_layers
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
