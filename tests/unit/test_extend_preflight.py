"""What the extension pipeline refuses before any stage because this machine cannot run it
(easy_context.extend.preflight): the attention kernels each stage would pass, held to the machine the stages'
interpreter reports."""

from __future__ import annotations

import sys

import pytest
import torch

from easy_context.extend import cli, pipeline
from easy_context.extend.preflight import Machine, machine_problem, run_kernels
from easy_context.extend.settings import resolve

RECIPE = """seq-length: 64
rope-theta: 100000
max-train-steps: 3
pipeline:
  base_length: 32
  fetch: tiny
  baselines: [base, yarn]
  ruler: 0
  long: null
"""
HOPPER, AMPERE, NO_GPU = ((9, 0),), ((8, 0), (8, 0)), ()


@pytest.fixture
def recipe(tmp_path, monkeypatch) -> str:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    for name in ("DEVICE", "KERNEL", "EVAL_KERNEL", "KERNEL_FALLBACK", "MICRO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL", str(tmp_path / "base"))
    monkeypatch.setenv("WORK", str(tmp_path / "w"))
    return str(path)


def settings(path: str, **env: str):
    return resolve(path, {"MODEL": "base", **env})


def test_the_kernel_each_stage_passes_is_one_that_runs_on_the_machine(recipe):
    """KERNEL unset: fa4 where it imports and the GPUs are Hopper or Blackwell, else KERNEL_FALLBACK; cpu on CPU;
    the evaluations the training's unless EVAL_KERNEL."""
    s = settings(recipe)
    assert run_kernels(s, Machine(HOPPER, fa4_imports=True))[0] == ("fa4", "KERNEL")
    assert run_kernels(s, Machine(AMPERE, fa4_imports=True))[0] == ("cudnn", "KERNEL_FALLBACK")  # fa4 would fail
    assert run_kernels(s, Machine(HOPPER, fa4_imports=False))[0] == ("cudnn", "KERNEL_FALLBACK")
    assert run_kernels(s, None)[0] == ("cudnn", "KERNEL_FALLBACK")  # the machine unknown: no fa4
    assert run_kernels(settings(recipe, DEVICE="cpu"), None) == (("cpu", "DEVICE"), ("cpu", "DEVICE"))
    chosen = run_kernels(settings(recipe, KERNEL="flash", EVAL_KERNEL="auto"), None)
    assert chosen == (("flash", "KERNEL"), ("auto", "EVAL_KERNEL"))
    for machine in (Machine(HOPPER, True), Machine(AMPERE, True), None):
        assert machine_problem(s, machine) is None
    assert machine_problem(settings(recipe, DEVICE="cpu"), Machine(NO_GPU, False)) is None


@pytest.mark.parametrize(("env", "machine", "want"), [
    ({}, Machine(NO_GPU, False), ["the training runs' attention kernel 'cudnn' (KERNEL_FALLBACK, the recipe's "
     "pipeline.kernel_fallback, as KERNEL is unset) cannot run here: it needs CUDA tensors, and this machine has no "
     "CUDA GPU (torch.cuda.is_available() is False); fix: DEVICE=cpu"]),
    ({"KERNEL": "fa4"}, Machine(AMPERE, True), ["the training runs' attention kernel 'fa4' (KERNEL, the recipe's "
     "kernel:) cannot run here: it needs GPUs of compute capability 9.x or 10.x (Hopper, Blackwell); this machine's "
     "are 8.0; fix: KERNEL=auto (one that runs here)"]),
    ({"KERNEL": "fa4"}, Machine(HOPPER, False), ["'fa4'", "flash_attn.cute (FlashAttention-4) does not import"]),
    ({"DEVICE": "cpu", "KERNEL": "cudnn"}, None, ["'cudnn' (KERNEL, the recipe's kernel:) cannot run here: it needs "
     "CUDA tensors, and the run is on cpu; fix: KERNEL=cpu"]),
    ({"DEVICE": "cpu", "EVAL_KERNEL": "flash_attn"}, None, ["the evaluations' attention kernel 'flash_attn' "
     "(EVAL_KERNEL) cannot run here", "fix: EVAL_KERNEL=cpu"]),
    ({"KERNEL": "cpu"}, Machine(HOPPER, True), ["'cpu'", "it runs on CPU tensors only, and the run is on cuda; fix: "
     "KERNEL=auto"]),
])  # fmt: skip
def test_a_kernel_the_machine_cannot_run_is_one_line_naming_the_setting_to_change(recipe, env, machine, want):
    problem = machine_problem(settings(recipe, **env), machine)
    assert problem is not None and "\n" not in problem
    assert all(part in problem for part in want), problem


def test_on_a_machine_without_cuda_the_run_is_refused_before_any_stage(recipe, tmp_path, monkeypatch, capsys):
    """The CUDA default (DEVICE=cuda, cuDNN) on this CPU machine (torch says no CUDA: the reference), ONLY=before:
    exit 2 with one line naming the kernel and DEVICE=cpu, no work folder made; the same through
    ``easy_context.extend --recipe``."""
    assert not torch.cuda.is_available()
    monkeypatch.setenv("PY", sys.executable)  # the stages' interpreter, which the machine is asked through
    monkeypatch.setenv("ONLY", "before")
    assert pipeline.main([recipe]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {recipe}: the training runs' attention kernel 'cudnn'")
    assert "this machine has no CUDA GPU" in err[0] and "fix: DEVICE=cpu" in err[0]
    assert not (tmp_path / "w").exists()
    assert cli.main(["--recipe", recipe]) == 2
    assert "fix: DEVICE=cpu" in capsys.readouterr().err and not (tmp_path / "w").exists()
