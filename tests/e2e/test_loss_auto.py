"""``--loss auto`` and the Liger wrapper on CPU: the dispatch (chunked here; liger with a CUDA device and
liger-kernel), the arguments our wrapper hands Liger's functional (a stand-in that computes the plain CE, so the
loss and gradients must equal the chunked loss's), the one-line errors, train.py's record of the resolved loss,
and bench/train_step.py's peers (--baseline stock | liger) and its --loss resolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from easy_context.loss import (
    CausalLMWithLoss,
    chunked_linear_cross_entropy,
    fused_ce,
    global_mean_loss,
    linear_cross_entropy,
    resolve_loss_impl,
)
from tests.support import zygote
from tests.support.reference import rel_err

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture
def fake_liger(monkeypatch):
    """An importable ``liger_kernel`` whose functional computes the plain CE (fp32 logits of the inputs' dtype
    matmul) and, like Liger, no gradients when its input needs none; records each call's arguments."""
    calls: list[dict] = []

    def liger_fused_linear_cross_entropy(input, weight, target, bias=None, ce_weight=None, ignore_index=-100,
                                         lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
                                         return_z_loss=False, accum_dtype=None, **rest):  # fmt: skip
        calls.append(dict(input=input, weight=weight, target=target, bias=bias, ignore_index=ignore_index,
                          reduction=reduction, softcap=softcap, accum_dtype=accum_dtype, rest=rest,
                          autocast=torch.is_autocast_enabled(input.device.type)))  # fmt: skip
        assert input.dim() == 2 and target.dim() == 1 and reduction in ("mean", "sum")
        with torch.set_grad_enabled(input.requires_grad):  # Liger: d_weight only when its input needs a gradient
            logits = F.linear(input, weight, bias).float()
            if softcap is not None:
                logits = torch.tanh(logits / softcap) * softcap
            return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)

    applied: list[dict] = []
    package = types.ModuleType("liger_kernel")
    transformers = types.ModuleType("liger_kernel.transformers")
    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_fused_linear_cross_entropy = liger_fused_linear_cross_entropy
    transformers.functional = functional
    transformers.apply_liger_kernel_to_llama = lambda **kw: applied.append(kw)
    package.transformers = transformers
    for name, module in [("liger_kernel", package), ("liger_kernel.transformers", transformers),
                         ("liger_kernel.transformers.functional", functional)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(calls=calls, applied=applied)


def _problem(shape=(2, 45), h=16, v=40, ignore_frac=0.6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, h, generator=g).to(dtype)
    weight = (torch.randn(v, h, generator=g) * 0.5).to(dtype)
    bias = torch.randn(v, generator=g).to(dtype)
    targets = torch.randint(0, v, shape, generator=g)
    targets[torch.rand(shape, generator=g) < ignore_frac] = -100
    return hidden, weight, bias, targets


def _loss_and_grads(impl, hidden, weight, bias, targets, softcap=None, grad_scale=0.37):
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, weight, bias)]
    loss_sum, n = linear_cross_entropy(leaves[0], leaves[1], targets, leaves[2], impl=impl, chunk_size=16,
                                       logit_softcapping=softcap)  # fmt: skip
    (loss_sum * grad_scale).backward()
    return loss_sum.detach(), n, [x.grad for x in leaves]


# ----------------------------------------------------------------------------- the dispatch


def test_auto_is_chunked_on_cpu_even_with_liger(fake_liger):
    assert not torch.cuda.is_available()  # this suite's machine; the GPU case is faked below
    assert resolve_loss_impl("auto")[0] == "chunked"
    impl, why = resolve_loss_impl("auto", "cpu")
    assert impl == "chunked" and "cpu" in why
    from tests.support.models import tiny_model

    assert CausalLMWithLoss(tiny_model("llama"), impl="auto").impl == "chunked"
    with pytest.raises(ValueError, match="unknown loss 'bogus'"):
        resolve_loss_impl("bogus")


def test_auto_without_liger_is_chunked_and_says_why():
    impl, why = resolve_loss_impl("auto", "cuda")  # a GPU machine without liger-kernel
    assert impl == "chunked" and "pip install liger-kernel" in why


def test_auto_is_liger_with_cuda_and_liger(fake_liger, monkeypatch):
    impl, why = resolve_loss_impl("auto", "cuda")
    assert impl == "liger" and "liger-kernel" in why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device None: this machine's GPU
    assert resolve_loss_impl("auto")[0] == "liger"
    from tests.support.models import tiny_model

    model = tiny_model("llama")
    wrapped = CausalLMWithLoss(model, impl="auto")
    assert wrapped.impl == "liger" and model.get_output_embeddings().impl == "liger"
    # the resolved wrapper runs Liger's functional (allowed on CPU tensors here) and gives the chunked loss
    monkeypatch.setattr(fused_ce, "LIGER_DEVICE_TYPES", ("cuda", "cpu"))
    ids = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(16).expand(2, 16)
    loss_sum, n = wrapped(ids[:, :-1], pos, ids[:, 1:])
    head = model.get_output_embeddings()
    hidden = model.get_decoder()(input_ids=ids[:, :-1], position_ids=pos, use_cache=False).last_hidden_state
    ref, ref_n = chunked_linear_cross_entropy(hidden, head.weight, ids[:, 1:])
    assert len(fake_liger.calls) == 1 and n == ref_n == 32 and rel_err(loss_sum, ref) < 1e-6


def test_explicit_liger_errors(fake_liger, monkeypatch):
    with pytest.raises(ValueError, match="runs on CUDA GPUs only .*device is cpu.*--loss chunked"):
        resolve_loss_impl("liger", "cpu")
    hidden, weight, _, targets = _problem()
    with pytest.raises(ValueError, match="CUDA GPUs only"):  # the wrapper itself, on CPU tensors
        linear_cross_entropy(hidden, weight, targets, impl="liger")
    assert resolve_loss_impl("liger", "cuda")[0] == "liger"
    for name in ("liger_kernel", "liger_kernel.transformers", "liger_kernel.transformers.functional"):
        monkeypatch.setitem(sys.modules, name, None)  # liger-kernel not installed
    with pytest.raises(ImportError, match="pip install liger-kernel") as err:
        resolve_loss_impl("liger", "cuda")
    assert "\n" not in str(err.value)
    with pytest.raises(ImportError, match="pip install cut-cross-entropy"):
        resolve_loss_impl("cce", "cuda")


# ----------------------------------------------------------------------------- the wrapper's math


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_liger_wrapper_gives_the_chunked_loss_and_grads(fake_liger, monkeypatch, softcap):
    monkeypatch.setattr(fused_ce, "LIGER_DEVICE_TYPES", ("cuda", "cpu"))
    problem = _problem()
    got = _loss_and_grads("liger", *problem, softcap=softcap)
    ref = _loss_and_grads("chunked", *problem, softcap=softcap)
    assert got[1] == ref[1] and rel_err(got[0], ref[0]) < 1e-6
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(got[2], ref[2]))
    (call,) = fake_liger.calls
    assert call["reduction"] == "sum" and call["ignore_index"] == -100 and call["softcap"] == softcap
    assert call["accum_dtype"] is torch.float32 and call["bias"] is not None and call["input"].shape == (90, 16)


def test_liger_wrapper_all_ignored_shard_is_zero_not_nan(fake_liger, monkeypatch):
    """An SP rank holding no valid target: loss 0, count 0, gradients 0 through the global mean."""
    monkeypatch.setattr(fused_ce, "LIGER_DEVICE_TYPES", ("cuda", "cpu"))
    hidden, weight, bias, _ = _problem()
    targets = torch.full((2, 45), -100)
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, weight, bias)]
    loss_sum, n = linear_cross_entropy(leaves[0], leaves[1], targets, leaves[2], impl="liger")
    loss = global_mean_loss(loss_sum, n)
    loss.backward()
    assert loss_sum.item() == 0 and n.item() == 0 and loss.item() == 0
    assert all(torch.equal(x.grad, torch.zeros_like(x)) for x in leaves)


def test_liger_wrapper_autocast_and_weight_only_grads(fake_liger, monkeypatch):
    monkeypatch.setattr(fused_ce, "LIGER_DEVICE_TYPES", ("cuda", "cpu"))
    hidden, weight, bias, targets = _problem()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # cast as lm_head would run, then autocast off inside
        linear_cross_entropy(hidden, weight, targets, impl="liger")
    call = fake_liger.calls[-1]
    assert call["input"].dtype == call["weight"].dtype == torch.bfloat16 and not call["autocast"]
    # a frozen decoder (hidden needs no grad): Liger would skip d_weight; the wrapper still gets it
    w = weight.detach().clone().requires_grad_()
    linear_cross_entropy(hidden, w, targets, impl="liger")[0].backward()
    w_ref = weight.detach().clone().requires_grad_()
    chunked_linear_cross_entropy(hidden, w_ref, targets)[0].backward()
    assert w.grad is not None and rel_err(w.grad, w_ref.grad) < 1e-5


# ----------------------------------------------------------------------------- train.py


def test_train_exits_with_one_line_for_liger_on_cpu(fake_liger, capsys):
    from easy_context import train

    args = types.SimpleNamespace(loss="liger")
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
    with pytest.raises(SystemExit, match=r"^error: loss 'liger' runs on CUDA GPUs only"):
        train.resolve_loss(args, accelerator)
    args.loss = "auto"
    assert train.resolve_loss(args, accelerator) == "chunked"
    assert "loss: auto -> chunked" in capsys.readouterr().out
    defaults = train.build_parser().parse_args(["--model", "m", "--dataset", "d", "--output-dir", "o"])
    assert defaults.loss == "auto"


def test_train_records_the_resolved_loss(tmp_path):
    out = tmp_path / "run"
    cmd = [zygote.python(), "train.py", "--model", "tiny-llama", "--dataset", "random:4", "--vocab-size", "128",
           "--seq-length", "32", "--batch-size", "1", "--max-train-steps", "1", "--dtype", "float32",
           "--checkpointing", "none", "--output-dir", str(out), "--no-save"]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "loss: auto -> chunked" in res.stdout
    assert json.loads((out / "run_config.json").read_text())["args"]["loss"] == "chunked"


# ----------------------------------------------------------------------------- bench/train_step.py


def test_train_step_flags_and_loss_resolution(capsys):
    import train_step

    assert train_step.parse_args([]).baseline is None and train_step.parse_args([]).loss == "auto"
    assert train_step.parse_args(["--baseline"]).baseline == "stock"  # the bare flag keeps its old meaning
    assert train_step.parse_args(["--baseline", "--seq", "64"]).baseline == "stock"
    assert train_step.parse_args(["--baseline", "liger"]).baseline == "liger"
    with pytest.raises(SystemExit):
        train_step.parse_args(["--baseline", "bogus"])
    assert train_step.config_of(train_step.parse_args(["--baseline"]))["loss"] == "hf (fp32 logits)"
    liger = train_step.config_of(train_step.parse_args(["--baseline", "liger"]))
    assert liger["peer"] == "liger" and "liger" in liger["loss"] and "gradient_checkpointing" in liger["checkpointing"]
    for argv in (["--seq", "64", "--loss", "auto", "--compile"], ["--loss=auto", "--seq", "64"], ["--seq", "64"]):
        args = train_step.parse_args(argv)
        child = train_step.resolve_loss_flag(args, argv)
        assert args.loss == "chunked" and child[-2:] == ["--loss", "chunked"] and child.count("--loss") == 1
        assert "auto" not in " ".join(child) and train_step.config_of(args)["loss"] == "chunked"
    assert "loss: auto -> chunked" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^error: loss 'liger' runs on CUDA GPUs only"):
        train_step.resolve_loss_flag(train_step.parse_args(["--loss", "liger"]), ["--loss", "liger"])


def test_train_step_liger_peer_builds_and_steps(fake_liger):
    """The peer: stock sdpa model, Liger's patch applied to it with its defaults, HF checkpointing; one CPU step."""
    import train_step

    args = train_step.parse_args(["--model", "tiny-llama", "--vocab-size", "128", "--seq", "32", "--dtype",
                                  "float32", "--steps", "1", "--baseline", "liger"])  # fmt: skip
    result = train_step.run_worker(args)
    (applied,) = fake_liger.applied
    model = applied["model"]
    assert set(applied) == {"model"} and model.is_gradient_checkpointing
    assert model.config._attn_implementation == "sdpa"
    assert result["final_loss"] > 0 and "liger_kernel" in result
