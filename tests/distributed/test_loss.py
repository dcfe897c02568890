"""Losses: chunked linear CE vs the plain reference, its peak memory, and the exact global loss on gloo."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import easy_context as ec
from easy_context.loss import (
    chunked_linear_cross_entropy,
    global_mean_for_logging,
    global_mean_loss,
    linear_cross_entropy,
    plain_linear_cross_entropy,
)
from tests.support.reference import rel_err

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------- chunked vs plain


def _lce_problem(n, h, v, dtype, ignore_frac, seed=0, shape=None):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g) * 0.5
    bias = torch.randn(v, generator=g)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[torch.rand(n, generator=g) < ignore_frac] = -100
    if shape is not None:
        hidden, targets = hidden.reshape(*shape, h), targets.reshape(shape)
    return hidden.to(dtype), weight.to(dtype), bias.to(dtype), targets


def _run(fn, hidden, weight, bias, targets, grad_scale=0.37, **kw):
    """(loss_sum, count, d_hidden, d_weight, d_bias) of ``fn`` with upstream gradient ``grad_scale``."""
    leaves = [x.detach().clone().requires_grad_() for x in (hidden, weight, bias)]
    loss_sum, count = fn(leaves[0], leaves[1], targets, leaves[2], **kw)
    (loss_sum * grad_scale).backward()
    return (loss_sum.detach(), count, *(x.grad for x in leaves))


def _float64_reference(hidden, weight, bias, targets, grad_scale=0.37, softcap=None):
    """The same loss and gradients computed in float64 from the (possibly bf16) inputs."""
    return _run(
        plain_linear_cross_entropy,
        hidden.double(),
        weight.double(),
        bias.double(),
        targets,
        grad_scale,
        logit_softcapping=softcap,
    )


@pytest.mark.parametrize(
    "n, chunk, ignore_frac, softcap, shape",
    [
        (300, 64, 0.6, None, None),  # N not a multiple of the chunk, many -100
        (300, 64, 0.6, 2.0, None),  # soft-capped logits
        (50, 1024, 0.3, None, None),  # chunk larger than N
        (96, 7, 0.0, None, (2, 48)),  # (B, S, H) input, no ignored targets
        (130, 32, 1.0, None, None),  # every target ignored
    ],
)
def test_chunked_equals_plain_fp32(n, chunk, ignore_frac, softcap, shape):
    inputs = _lce_problem(n, 32, 500, torch.float32, ignore_frac, shape=shape)
    kw = dict(logit_softcapping=softcap)
    got = _run(chunked_linear_cross_entropy, *inputs, chunk_size=chunk, **kw)
    ref = _run(plain_linear_cross_entropy, *inputs, **kw)
    assert got[1].dtype == torch.long and got[1].item() == ref[1].item() == (inputs[3] != -100).sum().item()
    assert got[2].shape == inputs[0].shape and got[2].dtype == torch.float32
    for name, x, r in zip(("loss_sum", "d_hidden", "d_weight", "d_bias"), (got[0], *got[2:]), (ref[0], *ref[2:])):
        assert torch.isfinite(x).all(), name
        if ignore_frac == 1.0:
            assert (x == 0).all(), name  # exactly zero, no NaN
        else:
            assert rel_err(x, r) < 1e-5, (name, rel_err(x, r))


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_chunked_equals_plain_bf16(softcap):
    inputs = _lce_problem(300, 64, 500, torch.bfloat16, 0.6)
    got = _run(chunked_linear_cross_entropy, *inputs, chunk_size=64, logit_softcapping=softcap)
    ref = _run(plain_linear_cross_entropy, *inputs, logit_softcapping=softcap)
    exact = _float64_reference(*inputs, softcap=softcap)
    assert got[1].item() == ref[1].item()
    assert got[0].dtype == torch.float32 and all(x.dtype == torch.bfloat16 for x in got[2:])
    for name, x, r, e in zip(
        ("loss_sum", "d_hidden", "d_weight", "d_bias"), (got[0], *got[2:]), (ref[0], *ref[2:]), (exact[0], *exact[2:])
    ):
        assert torch.isfinite(x).all(), name
        assert rel_err(x, r) < 2e-2, (name, rel_err(x, r))
        # fp32 accumulation: at least as close to the float64 truth as the plain bf16 autograd path
        assert rel_err(x, e) <= rel_err(r, e) + 4e-3, (name, rel_err(x, e), rel_err(r, e))


def test_chunked_under_autocast():
    """fp32 parameters under bf16 autocast: both run the LM head in bf16, gradients come back in fp32."""
    inputs = _lce_problem(200, 32, 300, torch.float32, 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(chunked_linear_cross_entropy, *inputs, chunk_size=48)
        ref = _run(plain_linear_cross_entropy, *inputs)
    assert all(x.dtype == torch.float32 for x in got[2:])
    for name, x, r in zip(("loss_sum", "d_hidden", "d_weight", "d_bias"), (got[0], *got[2:]), (ref[0], *ref[2:])):
        assert rel_err(x, r) < 2e-2, (name, rel_err(x, r))


def test_dispatcher_and_errors():
    inputs = _lce_problem(40, 8, 30, torch.float32, 0.5)
    a = linear_cross_entropy(*inputs[:2], inputs[3], inputs[2], impl="chunked", chunk_size=16)
    b = linear_cross_entropy(*inputs[:2], inputs[3], inputs[2], impl="plain")
    assert rel_err(a[0], b[0]) < 1e-6 and a[1] == b[1]
    with pytest.raises(ValueError, match="unknown linear_cross_entropy impl"):
        linear_cross_entropy(*inputs[:2], inputs[3], impl="bogus")
    with pytest.raises(ValueError, match="share a dtype"):
        chunked_linear_cross_entropy(inputs[0], inputs[1].double(), inputs[3])
    for impl, module, pip_name in [
        ("liger", "liger_kernel", "liger-kernel"),
        ("cce", "cut_cross_entropy", "cut-cross-entropy"),
    ]:
        if importlib.util.find_spec(module) is None:  # the fused kernels are CUDA-only: only the error is tested
            with pytest.raises(ImportError, match=f"pip install {pip_name}"):
                linear_cross_entropy(*inputs[:2], inputs[3], impl=impl)


# ----------------------------------------------------------------------------- peak memory

_MEMORY_SCRIPT = """
import sys, torch
from easy_context.loss import linear_cross_entropy
def peak_kib():  # VmHWM starts anew at exec; ru_maxrss keeps the forking pytest's peak (a big suite hid the logits)
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
impl = sys.argv[1]
g = torch.Generator().manual_seed(0)
n, h, v = 8192, 256, 32000
hidden = torch.randn(n, h, generator=g).requires_grad_()
weight = (torch.randn(v, h, generator=g) * 0.05).requires_grad_()
targets = torch.randint(0, v, (n,), generator=g)
targets[::3] = -100
# warm up on 8 tokens (one-time allocations, weight.grad) so only the extra memory of the full call counts
linear_cross_entropy(hidden[:8], weight, targets[:8], impl=impl)[0].backward()
hidden.grad = None
before = peak_kib()
loss_sum, count = linear_cross_entropy(hidden, weight, targets, impl=impl)
loss_sum.backward()
after = peak_kib()
print(after - before, loss_sum.item())
"""


def _peak_growth_kib(impl: str) -> tuple[int, float]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, impl], env=env, capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()
    return int(out[0]), float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux-specific")
def test_chunked_peak_memory_is_small():
    """N=8192, V=32000, H=256 fp32: plain materialises (N, V) fp32 logits (1 GiB) several times over."""
    chunked, loss_c = _peak_growth_kib("chunked")
    plain, loss_p = _peak_growth_kib("plain")
    assert abs(loss_c - loss_p) <= 1e-5 * abs(loss_p)
    assert plain > 8192 * 32000 * 4 // 1024, plain  # sanity: the reference did hold the logits
    assert chunked < plain / 4, (chunked, plain)


# ----------------------------------------------------------------------------- global loss on gloo

H, V = 16, 40


def _global_problem(world: int, sp: int, all_ignored: bool = False):
    """Full (B, S, H) inputs and (B, S) targets; rank ``world - 1`` gets no valid target."""
    dp = world // sp
    g = torch.Generator().manual_seed(1234 + world * 10 + sp)
    b, s = 2 * dp, 8 * sp
    x = torch.randn(b, s, H, generator=g)
    targets = torch.randint(0, V, (b, s), generator=g)
    targets[torch.rand(b, s, generator=g) < 0.6] = -100
    if all_ignored:
        targets.fill_(-100)
    positions = torch.arange(b * s).reshape(b, s)
    targets.view(-1)[_shard(positions, world - 1, world, sp).reshape(-1)] = -100
    return x, targets


def _shard(full: torch.Tensor, rank: int, world: int, sp: int) -> torch.Tensor:
    """DP x SP: rank = dp_rank * sp + sp_rank holds 2 rows, and its zigzag shard of the sequence."""
    dp_rank, sp_rank = divmod(rank, sp)
    return ec.extract_local("zigzag_ring_attn", full[2 * dp_rank : 2 * dp_rank + 2], sp_rank, sp, dim=1)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"body": torch.nn.Linear(H, H), "head": torch.nn.Linear(H, V)})


def _token_loss_sum(model, x, targets, impl):
    hidden = torch.tanh(model["body"](x))
    return linear_cross_entropy(hidden, model["head"].weight, targets, model["head"].bias, impl=impl, chunk_size=5)


def global_loss_worker(rank, world, sp, grad_average_world, all_ignored, impl):
    x, targets = _global_problem(world, sp, all_ignored)
    model = _model()
    loss_sum, count = _token_loss_sum(model, _shard(x, rank, world, sp), _shard(targets, rank, world, sp), impl)
    loss = global_mean_loss(loss_sum, count, grad_average_world=grad_average_world)
    loss.backward()
    logged = global_mean_for_logging(loss_sum, count)
    return {
        "loss": loss.item(),
        "logged": logged.item(),
        "count": count.item(),
        "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
    }


def _reference(world, sp, all_ignored=False):
    """Single-process global mean loss and its parameter gradients."""
    x, targets = _global_problem(world, sp, all_ignored)
    model = _model()
    loss_sum, count = _token_loss_sum(model, x, targets, "plain")
    loss = loss_sum / count  # the definition: token-weighted mean over every valid target
    loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("world, sp", [(2, 2), (4, 2), (4, 4)])
def test_global_loss_matches_single_process(dist_pool, world, sp):
    ref_loss, ref_grads = _reference(world, sp)
    pool = dist_pool(world)
    summed = pool.run(global_loss_worker, sp, None, False, "chunked")
    averaged = pool.run(global_loss_worker, sp, world, False, "plain")
    assert summed[-1]["count"] == 0 and all(r["count"] > 0 for r in summed[:-1])  # one rank without targets
    assert summed[-1]["loss"] == 0 and all((g == 0).all() for g in summed[-1]["grads"].values())
    for res in summed + averaged:
        assert all(math.isfinite(r) for r in (res["loss"], res["logged"]))
        assert all(torch.isfinite(g).all() for g in res["grads"].values())
        assert abs(res["logged"] - ref_loss) < 1e-5 * ref_loss  # the value to log is the true global mean
    assert abs(sum(r["loss"] for r in summed) - ref_loss) < 1e-5 * ref_loss
    assert abs(sum(r["loss"] for r in averaged) / world - ref_loss) < 1e-5 * ref_loss
    for name, ref in ref_grads.items():
        grad_sum = sum(r["grads"][name] for r in summed)  # trainer that SUMS gradients
        grad_avg = sum(r["grads"][name] for r in averaged) / world  # DDP/Accelerate/DeepSpeed AVERAGE them
        assert rel_err(grad_sum, ref) < 1e-5, (name, rel_err(grad_sum, ref))
        assert rel_err(grad_avg, ref) < 1e-5, (name, rel_err(grad_avg, ref))


def test_global_loss_all_ignored(dist_pool):
    results = dist_pool(2).run(global_loss_worker, 2, 2, True, "chunked")
    for res in results:
        assert res["count"] == 0 and res["loss"] == 0 and res["logged"] == 0
        assert all((g == 0).all() for g in res["grads"].values())


def test_global_loss_without_torch_distributed():
    """Single process (no process group): the global mean is the local one."""
    assert not dist.is_initialized()
    inputs = _lce_problem(64, 8, 30, torch.float32, 0.5)
    loss_sum, count = chunked_linear_cross_entropy(*inputs[:2], inputs[3], inputs[2], chunk_size=16)
    expected = F.cross_entropy(F.linear(inputs[0], inputs[1], inputs[2]), inputs[3], ignore_index=-100)
    assert rel_err(global_mean_loss(loss_sum, count), expected) < 1e-6
    assert rel_err(global_mean_loss(loss_sum, count, grad_average_world=3), 3 * expected) < 1e-6
    assert rel_err(global_mean_for_logging(loss_sum, count), expected) < 1e-6
    zero = global_mean_loss(loss_sum * 0, 0)
    assert zero.item() == 0


def test_lm_head_loss_modes_and_missing_flash_attn():
    """The LM head keeps acting as the head (logits) and its loss equals plain CE; --loss flash_attn without
    the package fails with an error naming it."""
    from easy_context.loss import CausalLMWithLoss
    from tests.support.models import tiny_model

    model = tiny_model("qwen2")
    ids = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(16).expand(2, 16)
    logits = model(ids[:, :-1], position_ids=pos).logits
    wrapped = CausalLMWithLoss(model)
    loss_sum, n = wrapped(ids[:, :-1], pos, ids[:, 1:])
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    assert n == 32 and torch.allclose(loss_sum, ref, rtol=1e-5)
    assert torch.allclose(model(ids[:, :-1], position_ids=pos).logits, logits)  # still a normal HF model
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ImportError, match="flash-attn"):
            CausalLMWithLoss(tiny_model("llama"), impl="flash_attn")(ids[:, :-1], pos, ids[:, 1:])
