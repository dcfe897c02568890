"""AdamW with its fp32 master weights and moments in host memory (optimizer-state offload without DeepSpeed).

The device keeps only what the forward and backward need: the parameters in their training dtype (bf16) and
their gradients. The host keeps, per parameter, an fp32 master copy and the two Adam moments: 12 bytes per
parameter, nothing else. DeepSpeed's ZeRO-3 offload needs 18 B/param on the host (it also keeps an fp32 gradient
partition and a bf16 parameter partition there), which for an 8B model is more than a 128 GB host holds.

``step()`` goes parameter by parameter: the gradient is copied into a pinned staging buffer, upcast to fp32,
torch's fused CPU AdamW updates the master and the moments, and the master, cast to the parameter dtype, is
copied back into the device parameter. Host temporaries: one staging buffer of the largest parameter in the
parameter dtype, and its fp32 upcast.

One process holds the whole state: with several processes (data parallel) each would hold a full copy, so
``train.py`` allows it only in single-process runs (use DeepSpeed ZeRO-3 offload to shard states over ranks).

Use it like ``torch.optim.AdamW`` (``param_groups``, ``state_dict``, LR schedulers all work)::

    optimizer = HostAdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw


class HostAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) keeping fp32 master weights and moments on the host; see the module doc."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"invalid HostAdamW hyper-parameters: lr={lr}, betas={betas}, eps={eps}, wd={weight_decay}"
            )
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._staging: dict[object, torch.Tensor] = {}  # reusable host buffers by (role, dtype)

    def init_state(self) -> None:
        """Allocate every parameter's host state now (it is otherwise allocated at the first step)."""
        for group in self.param_groups:
            for p in group["params"]:
                self._host_state(p)

    def _host_state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:  # lazily, so that building the optimizer does not need the host memory yet
            master = p.detach().to("cpu", torch.float32, copy=True)
            state["master"] = master
            state["exp_avg"] = torch.zeros_like(master)
            state["exp_avg_sq"] = torch.zeros_like(master)
            state["step"] = torch.zeros((), dtype=torch.float32)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but the master weights and moments stay fp32 in host memory (torch casts optimizer state
        to each parameter's dtype and device)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for p, i in zip(params, ids):
            saved = state_dict["state"].get(i)
            if saved is None:
                continue
            for key in ("master", "exp_avg", "exp_avg_sq", "step"):
                self.state[p][key] = saved[key].to("cpu", torch.float32, copy=True)

    def _stage(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` copied into a reusable (pinned, when it comes from a GPU) host buffer."""
        if grad.device.type == "cpu":
            return grad
        buf = self._staging.get(grad.dtype)
        if buf is None or buf.numel() < grad.numel():
            buf = self._staging[grad.dtype] = torch.empty(grad.numel(), dtype=grad.dtype, pin_memory=True)
        host = buf[: grad.numel()].view(grad.shape)
        host.copy_(grad)  # synchronous: the host reads it next
        return host

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("HostAdamW does not support sparse gradients")
                state = self._host_state(p)
                grad = self._stage(p.grad).to(torch.float32)
                adamw([state["master"]], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                      fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)  # fmt: skip
                if p.device.type == "cpu":
                    p.copy_(state["master"])
                else:
                    staged = self._stage_param(state["master"], p.dtype)
                    p.copy_(staged, non_blocking=True)
                    torch.cuda.current_stream(p.device).synchronize()  # the staging buffer is reused next
        return loss

    def _stage_param(self, master: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        key = ("param", dtype)
        buf = self._staging.get(key)
        if buf is None or buf.numel() < master.numel():
            buf = self._staging[key] = torch.empty(master.numel(), dtype=dtype, pin_memory=True)
        host = buf[: master.numel()].view(master.shape)
        host.copy_(master)
        return host
