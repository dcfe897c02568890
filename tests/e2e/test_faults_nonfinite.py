"""train.py on a step whose loss or gradient norm is inf/NaN (--nonfinite stop|skip): the decision comes before
the update, the same on every rank, also under DeepSpeed (whose optimizer steps inside the last backward). Real runs
on CPU through tests.e2e.test_train's launcher."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e import test_train
from tests.e2e.test_train import losses, run_injected, run_train

data_dir = test_train.data_dir  # its packed dataset and tokenizer (a fixture: built once for this module too)

FAST = ("--parallel_mode", "data_parallel", "--checkpointing", "none")
HUGE_LR = ("--learning-rate", "1e30", "--lr-schedule", "constant")  # finite step 1, then non-finite gradients

# run first in every process (run_injected): the loss of the 3rd forward, step 2's first micro-batch, is NaN
NAN_AT_STEP_2 = """
import easy_context.loss as loss


_forward, calls = loss.CausalLMWithLoss.forward, []


def forward(self, *args):
    loss_sum, n = _forward(self, *args)
    calls.append(1)
    return (loss_sum * float("nan") if len(calls) == 3 else loss_sum), n


loss.CausalLMWithLoss.forward = forward
"""


# run first in every process (run_injected): the loss of the 3rd forward, step 2's first micro-batch, is NaN in value
# while its gradients stay finite (as a loss kernel that overflows only in its reported sum): the gradient norm cannot
# tell, only the loss can, and under DeepSpeed it must be checked before the last backward, which runs the update
NAN_VALUE_AT_STEP_2 = """
import easy_context.loss as loss


_forward, calls = loss.CausalLMWithLoss.forward, []


def forward(self, *args):
    loss_sum, n = _forward(self, *args)
    calls.append(1)
    if len(calls) == 3:
        loss_sum = loss_sum + loss_sum.detach() * float("nan")
    return loss_sum, n


loss.CausalLMWithLoss.forward = forward
"""


def all_finite(path: Path) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in load_file(path).values())


def test_nonfinite_stop_two_processes(data_dir, tmp_path):
    """--nonfinite stop (the default): the first non-finite step ends the run before its update, no checkpoint
    from it, periodic or final; the same decision on both ranks."""
    out = tmp_path / "run"
    res = run_train(data_dir, out, "--parallel_mode", "zigzag_ring_attn", "--checkpointing", "none", *HUGE_LR,
                    "--save-every", "1", procs=2, steps=4, check=False)  # fmt: skip
    assert res.returncode != 0
    found = re.findall(r"error: step (\d+): non-finite [^;\n]*; stopped before updating the weights", res.stderr)
    assert len(found) == 2 and len(set(found)) == 1, res.stderr[-3000:]  # one line per rank, the same step
    bad = int(found[0])
    assert bad >= 2
    assert losses(out, "step") == list(range(1, bad))
    assert sorted(p.name for p in out.glob("state-step*")) == [f"state-step{s}" for s in range(1, bad)]
    assert all(all_finite(out / f"state-step{s}" / "model.safetensors") for s in range(1, bad))
    assert not (out / "model.safetensors").exists()


def test_nonfinite_skip_drops_the_update(data_dir, tmp_path, monkeypatch):
    """--nonfinite skip: a NaN loss at step 2 leaves the weights as they were, the run goes on, the count is
    logged and survives a resume."""
    out = tmp_path / "run"
    run_injected(NAN_AT_STEP_2, data_dir, out, monkeypatch, *FAST, "--nonfinite", "skip", "--save-every", "1", steps=4)
    got = losses(out, "loss")
    assert math.isnan(got[1]) and all(map(math.isfinite, got[:1] + got[2:])), got
    assert losses(out, "skipped_steps") == [0, 1, 1, 1]
    one, two = (load_file(out / f"state-step{s}" / "model.safetensors") for s in (1, 2))
    assert all(torch.equal(one[k], two[k]) for k in one)  # the skipped step changed nothing
    assert all_finite(out / "model.safetensors")
    run_train(data_dir, out, *FAST, "--nonfinite", "skip", "--resume-from", str(out / "state-step2"), steps=4)
    assert losses(out, "skipped_steps") == [0, 1, 1, 1]
    assert losses(out, "loss")[2:] == pytest.approx(got[2:], rel=1e-5)


def test_nonfinite_skip_stops_after_too_many_in_a_row(data_dir, tmp_path):
    out = tmp_path / "run"
    res = run_train(data_dir, out, *FAST, *HUGE_LR, "--nonfinite", "skip", "--max-skips-in-a-row", "2", steps=8,
                    check=False)  # fmt: skip
    assert res.returncode != 0
    assert re.search(r"error: step \d+: non-finite .*; 3 steps in a row skipped \(--max-skips-in-a-row 2\)",
                     res.stderr), res.stderr[-3000:]  # fmt: skip
    assert losses(out, "skipped_steps")[-2:] == [1, 2]
    assert not (out / "model.safetensors").exists()


def test_nonfinite_loss_under_deepspeed_leaves_the_weights(data_dir, tmp_path, monkeypatch):
    """ZeRO-3 (CPU offload, DeepSpeedCPUAdam), --nonfinite skip: step 2's loss is NaN, its gradients finite. The
    DeepSpeed optimizer steps inside the last micro-batch's backward; the step's loss, checked before that backward,
    keeps the update out: the final weights are those after step 1 (a run stopped there), the count is logged."""
    pytest.importorskip("deepspeed")
    ds = "accelerate_configs/cpu_zero3.yaml"
    common = (*FAST, "--warmup-steps", "0", "--lr-schedule", "constant", "--nonfinite", "skip")
    ref, out = tmp_path / "ref", tmp_path / "run"
    run_train(data_dir, ref, *common, "--stop-at-step", "1", steps=2, config=ds)
    run_injected(NAN_VALUE_AT_STEP_2, data_dir, out, monkeypatch, *common, steps=2, config=ds)
    got = losses(out)
    assert math.isnan(got[1]) and losses(out, "skipped_steps") == [0, 1], got
    assert got[:1] == pytest.approx(losses(ref), rel=1e-6)
    after_step_1, final = load_file(ref / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(final) == sorted(after_step_1)
    assert all(torch.equal(final[k], after_step_1[k]) for k in final)  # the skipped step changed nothing


def test_poisoned_loss_gives_nan_gradients_only_when_the_step_is_not_finite():
    """The DeepSpeed guard: times 1 (exact, the same gradients) for a finite step loss, NaN gradients everywhere for
    a non-finite one (what DeepSpeed's gradient-norm check skips)."""
    from easy_context.training.step import poison_unless_finite

    w = torch.tensor([1.5, -2.0, 0.0], requires_grad=True)
    for step_loss, finite in [(torch.tensor(3.25), True), (torch.tensor(math.inf), False),
                              (torch.tensor(math.nan), False)]:  # fmt: skip
        w.grad = None
        loss = (w * w).sum()
        poisoned = poison_unless_finite(loss, step_loss)
        poisoned.backward()
        if finite:
            assert torch.equal(poisoned, loss) and torch.equal(w.grad, 2 * w.detach())
        else:
            assert torch.isnan(w.grad).all()
    bf16 = torch.tensor(2.0, dtype=torch.bfloat16)
    assert poison_unless_finite(bf16, torch.tensor(1.0)).dtype == torch.bfloat16
