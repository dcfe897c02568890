"""Regional torch.compile (``--compile``, easy_context/training/compile.py): same loss and gradients as eager, and
the split MLP's down projection is not re-run by the checkpointed layer's recompute."""

from __future__ import annotations

import copy

import torch

from easy_context.memory import apply_checkpointing
from easy_context.sp_config import SPConfig
from easy_context.training.compile import compile_regions
from tests.support.models import tiny_model


def _loss_and_grads(model, ids):
    out = model(
        input_ids=ids[:, :-1], labels=ids[:, 1:], use_cache=False, position_ids=torch.arange(ids.shape[1] - 1)[None]
    )
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_compiled_regions_match_eager_and_skip_the_down_projection_recompute():
    torch._dynamo.reset()
    eager = tiny_model("llama", seed=3).float().train()
    SPConfig("data_parallel", kernel="cpu").attach(eager, through_easy_context=True)
    apply_checkpointing(eager, "attn")
    compiled = copy.deepcopy(eager)
    counts = compile_regions(compiled)
    layers = compiled.config.num_hidden_layers
    assert counts == {"norms": 2 * layers + 1, "mlp_split": layers, "mlp_whole": 0, "rope": 1, "float8_attn_linears": 0}
    calls = []
    for layer in compiled.get_decoder().layers:
        layer.mlp.down_proj.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, compiled.config.vocab_size, (2, 33), generator=torch.Generator().manual_seed(0))
    loss_e, grads_e = _loss_and_grads(eager, ids)
    loss_c, grads_c = _loss_and_grads(compiled, ids)
    assert torch.allclose(loss_c, loss_e, rtol=1e-5)
    assert grads_c.keys() == grads_e.keys()
    for name, g in grads_e.items():
        assert torch.allclose(grads_c[name], g, rtol=1e-4, atol=1e-6), name
    assert len(calls) == layers  # the forward's calls only: the recompute stopped before each down projection


def test_compile_under_deepspeed_is_refused_in_one_line(monkeypatch):
    """--compile with a DeepSpeed launch exits before anything is built, naming the fix."""
    import types

    import pytest
    from accelerate.utils import DistributedType

    import easy_context.train as train_mod

    monkeypatch.setattr(train_mod, "launch_error", lambda launched: None)
    monkeypatch.setattr(train_mod, "deepspeed_precision_error", lambda acc, dtype: None)
    state = types.SimpleNamespace(deepspeed_plugin=object())
    accelerator = types.SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, device=torch.device("cpu"),
                                        state=state, is_main_process=True)  # fmt: skip
    argv = ["--model", "tiny-llama", "--dataset", "random:4", "--vocab-size", "64", "--output-dir", "x", "--compile"]
    args = train_mod.parse_args(argv)
    with pytest.raises(SystemExit, match="--compile is not supported under DeepSpeed.*drop --compile"):
        train_mod.check_launch(accelerator, args)
    args.compile = False
    train_mod.check_launch(accelerator, args)  # the same launch without --compile passes this check
