"""Greedy decoding after an SP prefill (easy_context.hf.kv_cache): the tokens transformers' own ``generate`` gives
on one process, under every backend, on 1-3 CPU ranks, for plain, sliding-window, soft-capped and sink attention."""

from __future__ import annotations

import copy

import pytest
import torch

import easy_context as ec
from easy_context.eval.forward import greedy_generate
from easy_context.eval.runtime import EvalRuntime
from easy_context.sp_config import resolve_sp_config
from tests.support.models import tiny_model

PROMPT = 45  # not a multiple of any backend's chunking: the prompt is padded, and pads must not enter the cache
NEW = 10


def _reference(model, ids: list[int]) -> list[int]:
    """transformers' greedy ``generate`` with its own attention and DynamicCache, one process."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                         eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def decode_worker(rank, world, algo, model_types, options):
    results = {}
    for model_type in model_types:
        model = tiny_model(model_type, heads=6 if world == 3 else 4, kv_heads=3 if world == 3 else 2,
                           hidden_size=96 if world == 3 else 64)  # fmt: skip
        model.generation_config.cache_implementation = None
        ids = torch.randint(3, model.config.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(7)).tolist()
        expected = _reference(copy.deepcopy(model).eval(), ids)
        sp = resolve_sp_config(algo, kernel="auto", **options)
        runtime = EvalRuntime(sp, torch.device("cpu"))
        sp.attach(model, through_easy_context=True)
        model.eval()
        got = greedy_generate(model, runtime, ids, NEW, pad_id=0)
        results[model_type] = (got, expected)
    return results


MODELS = ["llama", "gemma2", "gpt_oss", "mistral_sliding"]


@pytest.mark.parametrize(
    "world,algo,options",
    [
        (2, "zigzag_ring_attn", {}),
        (3, "dist_flash_attn", {}),
        (2, "ulysses_attn", {}),
        (2, "usp_attn", {"ring_degree": 2}),
        (2, "data_parallel", {}),
    ],  # fmt: skip
    ids=["zigzag2", "dist_flash3", "ulysses2", "usp2", "data_parallel"],
)
def test_sharded_cache_decodes_what_transformers_generates(dist_pool, world, algo, options):
    for rank, results in enumerate(dist_pool(world).run(decode_worker, algo, MODELS, options)):
        for model_type, (got, expected) in results.items():
            assert len(expected) == NEW
            assert got == expected, f"{algo} rank {rank} {model_type}: {got} != transformers' {expected}"


def stock_worker(rank, world):
    model = tiny_model("llama").eval()
    ids = list(range(3, 40))
    runtime = EvalRuntime(resolve_sp_config("data_parallel"), torch.device("cpu"))
    ec.apply_seq_parallel_monkey_patch("data_parallel", model)  # kernel auto: the model's own attention
    full = greedy_generate(model, runtime, ids, NEW, pad_id=0)
    stopped = greedy_generate(model, runtime, ids, NEW, pad_id=0, stop=lambda new: len(new) == 3)
    eos = greedy_generate(model, runtime, ids, NEW, pad_id=0, eos_id=full[1])
    return full, _reference(model, ids), stopped, eos


def test_stock_attention_uses_transformers_cache_and_stop_rule(dist_pool):
    full, expected, stopped, eos = dist_pool(1).run(stock_worker)[0]
    assert full == expected
    assert stopped == full[:3]
    assert eos == full[: full.index(full[1]) + 1]
