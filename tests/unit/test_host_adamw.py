"""HostAdamW equals torch's AdamW (fp32), keeps bf16 parameters as the cast of an fp32 master, and schedules."""

from __future__ import annotations

import torch

from easy_context.training.host_adamw import HostAdamW


def _params(dtype: torch.dtype) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in [(5, 7), (7,), (3, 2, 4)]]


def _grads(step: int, params) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def test_matches_torch_adamw_fp32() -> None:
    ours, ref = _params(torch.float32), _params(torch.float32)
    opt = HostAdamW(ours, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for step in range(4):
        _grads(step, ours), _grads(step, ref)
        opt.step(), ref_opt.step()
    for p, r, init in zip(ours, ref, _params(torch.float32)):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-6)
        assert (p - init).abs().mean() > 5e-3  # the weights moved (Adam steps ~lr each)


def test_bf16_params_follow_fp32_master() -> None:
    """bf16 parameters are the rounding of an fp32 master that follows fp32 AdamW on the same (bf16) grads."""
    ours = _params(torch.bfloat16)
    master = [torch.nn.Parameter(p.detach().float()) for p in ours]
    opt, ref_opt = HostAdamW(ours, lr=1e-3), torch.optim.AdamW(master, lr=1e-3)
    for step in range(3):
        _grads(step, ours)
        for p, m in zip(ours, master):
            m.grad = p.grad.float()
        opt.step(), ref_opt.step()
    for p, m in zip(ours, master):
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(opt.state[p]["master"], m.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(p, m.detach().to(torch.bfloat16))
    # 3 steps of lr 1e-3 move weights by ~3e-3: less than bf16 resolves near 1, so a bf16-only AdamW would lose it
    assert max((opt.state[p]["master"] - p.float()).abs().max() for p in ours) > 0


def test_scheduler_and_state_dict() -> None:
    params = _params(torch.float32)
    opt = HostAdamW(params, lr=1.0)
    opt.init_state()
    assert all(opt.state[p]["master"].dtype == torch.float32 for p in params)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    for step in range(2):
        _grads(step, params)
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.25
    state = opt.state_dict()
    again = HostAdamW(_params(torch.float32), lr=1.0)
    again.load_state_dict(state)
    assert float(again.state_dict()["state"][0]["step"]) == 2.0
    torch.testing.assert_close(again.state_dict()["state"][1]["exp_avg"], state["state"][1]["exp_avg"])


def test_bf16_state_dict_round_trip_keeps_fp32_host_state() -> None:
    """torch's load_state_dict casts state to the parameter dtype; HostAdamW keeps fp32 masters and moments."""
    params = _params(torch.bfloat16)
    opt = HostAdamW(params, lr=1e-3)
    _grads(0, params)
    opt.step()
    state = opt.state_dict()
    fresh = _params(torch.bfloat16)
    again = HostAdamW(fresh, lr=1e-3)
    again.load_state_dict(state)
    for p, q in zip(params, fresh):
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert again.state[q][key].dtype == torch.float32 and again.state[q][key].device.type == "cpu"
            assert torch.equal(again.state[q][key], opt.state[p][key])
    _grads(1, params), _grads(1, fresh)
    opt.step(), again.step()  # the next step runs and continues identically
    assert all(torch.equal(p, q) for p, q in zip(params, fresh))


def test_build_optimizer_refuses_host_adamw_with_several_processes() -> None:
    from types import SimpleNamespace

    import pytest

    from easy_context.training.optim import build_optimizer

    acc = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None), num_processes=2)
    with pytest.raises(ValueError, match="ZeRO-3"):
        build_optimizer(_params(torch.float32), acc, lr=1e-3, name="host_adamw")
    acc.num_processes = 1
    assert isinstance(build_optimizer(_params(torch.float32), acc, lr=1e-3, name="host_adamw"), HostAdamW)


def test_bad_settings_and_inputs_raise() -> None:
    from types import SimpleNamespace

    import pytest

    from easy_context.training.optim import build_optimizer

    with pytest.raises(ValueError, match="invalid HostAdamW"):
        HostAdamW(_params(torch.float32), lr=-1.0)
    params = _params(torch.float32)
    params[0].grad = torch.zeros(params[0].shape).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        HostAdamW(params).step()
    acc = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace()), num_processes=1)
    with pytest.raises(ValueError, match="replaces DeepSpeed's optimizer offload"):
        build_optimizer(_params(torch.float32), acc, lr=1e-3, name="host_adamw")
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer(_params(torch.float32), acc, lr=1e-3, name="sgd")
