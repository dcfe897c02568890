"""FP8 linears (easy_context.training.fp8, ``--fp8``) on CPU through torchao's emulation (the float8 casts and
scales of the GPU path, the GEMMs in fp32): which linears convert, training numerics against fp32, what it
composes with, and the one-line refusals. The GPU path (torch._scaled_mm, speed) is gpu_runs/fp8_check.sh's."""

from __future__ import annotations

import copy
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

from easy_context.training import fp8
from tests.support.jobs import run_job
from tests.support.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
# torchao lives outside the venv (`make test` installs it with pip --target into .venv/extras, $EC_EXTRAS): installed
# in the venv, transformers would import it in every process that builds a model, the other tests' included
EXTRAS = os.environ.get("EC_EXTRAS", str(ROOT / ".venv" / "extras"))
if EXTRAS not in sys.path:
    sys.path.insert(0, EXTRAS)
DECODER_LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    """2 shared cores: more threads than cores makes these small GEMMs 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(step: int, vocab: int = 128, rows: int = 4, seq: int = 64) -> torch.Tensor:
    """(rows, seq + 1) token ids of a learnable task: arithmetic progressions mod ``vocab`` (start and stride per
    row drawn from ``step``)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    stride = torch.randint(1, 4, (rows, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % vocab


def train(model, steps: int, lr: float = 3e-3) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        ids = batch(step)
        loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1], use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def loss_and_grads(model) -> tuple[float, dict[str, torch.Tensor]]:
    ids = batch(0)
    loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1], use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# ------------------------------------------------------------------------------------------------ selection
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_converts_exactly_the_decoder_linears(model_type: str) -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_model(model_type)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    expected = [f"{i}.{name}" for i in range(2) for name in DECODER_LINEARS]
    assert sorted(fp8.select_fp8_linears(model).convert) == sorted(expected)
    assert fp8.enable_fp8_linears(model, emulate=True) == len(expected) == 14
    converted = sorted(n.removeprefix("model.layers.") for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(expected)
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding
    assert list(model.state_dict()) == keys  # checkpoints load with or without fp8
    assert all(p is params[n] for n, p in model.named_parameters())  # an optimizer built before still works
    assert fp8.enable_fp8_linears(model, emulate=True) == 14  # again: nothing is wrapped twice
    assert type(model.model.layers[0].mlp.up_proj) is Float8Linear


def test_skips_and_names_linears_not_multiples_of_16() -> None:
    model = tiny_model("llama", intermediate_size=72)  # the MLP's 72 features: not a float8 GEMM shape
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fp8.enable_fp8_linears(model, emulate=True) == 8  # the attention projections of 2 layers
    (message,) = [str(w.message) for w in caught if str(w.message).startswith("fp8:")]
    assert "6 decoder linears stay in high precision" in message and "0.mlp.gate_proj (64 -> 72 features" in message
    assert type(model.model.layers[0].mlp.gate_proj) is torch.nn.Linear


# ------------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_training_tracks_fp32(model_type: str) -> None:
    """30 AdamW steps on a learnable task: the loss falls by > 2 nats and stays within 0.04 of the fp32 run at
    every step. Measured (torch 2.13, torchao 0.18): max |fp8 - fp32| over the steps 0.007-0.018 for seeds 0 and
    1 of both models, while two fp32 runs with different seeds differ by up to 0.047-0.059: the tolerance is
    about twice the fp8 error and below the seed-to-seed spread."""
    ref = train(tiny_model(model_type), 30)
    model = tiny_model(model_type)
    fp8.enable_fp8_linears(model, emulate=True)
    got = train(model, 30)
    assert got[-1] < got[0] - 2.0, got
    assert max(abs(a - b) for a, b in zip(got, ref)) < 0.04, list(zip(got, ref))


# ------------------------------------------------------------------------------------------------ composition
def test_composes_with_checkpointing_offload_and_tiled_mlp() -> None:
    """Checkpointing (full, after-attention, offloaded) recomputes the float8 layers exactly: same loss and grads.
    A tiled MLP gives the same loss (row-wise scales of inputs and weights do not depend on the tiling) and
    gradients within 2e-2: the weight-gradient GEMM scales its operands per column over the tokens of each tile."""
    import easy_context as ec
    from easy_context.memory import apply_checkpointing, enable_tiled_mlp

    def build(mode: str = "none", tiles: int = 0):
        model = tiny_model("llama")
        ec.apply_seq_parallel_monkey_patch("data_parallel", model, kernel="cpu")
        apply_checkpointing(model, mode)
        if tiles:
            enable_tiled_mlp(model, num_tiles=tiles)
        fp8.enable_fp8_linears(model, emulate=True)  # after the memory options: the order does not matter
        return model

    ref_loss, ref_grads = loss_and_grads(build())
    for mode in ("full", "attn", "attn-offload"):
        loss, grads = loss_and_grads(build(mode))
        assert loss == pytest.approx(ref_loss, rel=1e-6), mode
        assert max(rel(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5, mode
    loss, grads = loss_and_grads(build("attn", tiles=3))
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    errs = {n: rel(grads[n], ref_grads[n]) for n in ref_grads}
    assert max(errs.values()) < 2e-2, sorted(errs.items(), key=lambda kv: -kv[1])[:3]


def fsdp2_worker(rank: int, world: int, shard: bool) -> list[float]:
    """Loss of 6 steps of the tiny Llama with float8 linears, every layer and the root under FSDP2 when
    ``shard`` (both ranks see the same batches: the sharded run must equal the single-process one)."""
    torch.set_num_threads(1)
    from torch.distributed.fsdp import fully_shard

    model = tiny_model("llama")
    fp8.enable_fp8_linears(model, emulate=True)  # before wrapping, as torchao documents
    if shard:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    return train(model, 6)


def test_composes_with_fsdp2(dist_pool) -> None:
    pool = dist_pool(2)
    plain, sharded = pool.run(fsdp2_worker, False), pool.run(fsdp2_worker, True)
    assert sharded[0] == pytest.approx(plain[0], rel=1e-6) and sharded[1] == sharded[0]
    assert sharded[0][-1] < sharded[0][0]


# ------------------------------------------------------------------------------------------------ refusals
def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_refuses_cpu_without_emulation_and_old_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama")
    with pytest.raises(fp8.FP8Error) as exc:
        fp8.enable_fp8_linears(model)  # the model is on the CPU
    assert "compute capability 8.9+" in one_line(exc) and "emulate=True" in str(exc.value)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # nothing converted
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert "A100-SXM4-80GB is 8.0" in fp8.fp8_device_error("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.fp8_device_error("cuda") is None and fp8.fp8_device_error("cpu", emulate=True) is None


def test_refuses_without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import torchao.float8 -> ImportError
    with pytest.raises(fp8.FP8Error) as exc:
        fp8.enable_fp8_linears(tiny_model("llama"), emulate=True)
    assert f"pip install torchao=={fp8.TORCHAO_PIN}" in one_line(exc)


def test_refuses_deepspeed_bad_shapes_and_recipes() -> None:
    assert fp8.fp8_composition_error() is None
    assert "FSDP2" in fp8.fp8_composition_error(deepspeed=True)
    model = tiny_model("llama")
    model.model.layers[0].mlp.up_proj.weight.ds_id = 0  # what deepspeed.zero.Init leaves on its parameters
    with pytest.raises(fp8.FP8Error) as exc:
        fp8.enable_fp8_linears(model, emulate=True)
    assert "DeepSpeed" in one_line(exc)
    assert fp8.fp8_shape_error(2, 4096) is None and fp8.fp8_shape_error(1, 4096, mlp_tiles=4) is None
    assert "1 x 1000 = 1000 tokens" in fp8.fp8_shape_error(1, 1000)
    assert fp8.fp8_shape_error(2, 1000) is None  # 2000 tokens per call
    assert "tiles of [341, 342] tokens" in fp8.fp8_shape_error(1, 1024, mlp_tiles=3)
    with pytest.raises(fp8.FP8Error) as exc:
        fp8.enable_fp8_linears(tiny_model("llama"), recipe="blockwise", emulate=True)
    assert "rowwise" in one_line(exc)


# ------------------------------------------------------------------------------------------------ train.py
def run_train(out: Path, *extra: str):
    cmd = [sys.executable, "train.py", "--model", "tiny-llama", "--dataset", "random:16", "--vocab-size", "256",
           "--output-dir", str(out), "--seq-length", "128", "--batch-size", "2", "--gradient-accumulate-every", "1",
           "--max-train-steps", "3", "--dtype", "float32", "--parallel_mode", "data_parallel", "--kernel", "cpu",
           "--checkpointing", "attn", *extra]  # fmt: skip
    path = os.pathsep.join(p for p in (EXTRAS, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return run_job(cmd, cwd=ROOT, env=env, timeout=300)


def test_train_py_fp8(tmp_path: Path) -> None:
    """--fp8 on a CPU exits with one line before building anything; --fp8-emulate trains through the whole program
    (checkpoint-after-attention, tiled MLP) and saves a checkpoint that loads as a plain model."""
    res = run_train(tmp_path / "refused", "--fp8")
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith("error: --fp8: float8 GEMMs need an NVIDIA GPU")
    assert not (tmp_path / "refused").exists()
    res = run_train(tmp_path / "emulated", "--fp8-emulate", "--tiled-mlp", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "fp8: 28 decoder linears in float8 (rowwise, emulated)" in res.stdout
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "emulated")
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert all(torch.isfinite(p).all() for p in model.parameters())
    reference = copy.deepcopy(model)
    assert fp8.enable_fp8_linears(model, emulate=True) == 28
    assert list(model.state_dict()) == list(reference.state_dict())
