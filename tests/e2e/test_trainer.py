"""easy_context SP inside transformers.Trainer / TRL's SFTTrainer: 2 gloo processes reproduce one process, under
DDP, FSDP2 and DeepSpeed ZeRO-3 with CPU offload.

The runs are tests/support/trainer_job.py's: one job of 1-process references (plain Trainer / SFTTrainer), one
``accelerate launch`` of 2 processes with SequenceParallelTrainer under DDP and FSDP2 that ends with the bad setups,
one launch with accelerate_configs/cpu_zero3.yaml for ZeRO-3 and its bad setups (each bounded by run_job: a hang
fails the test, and every process of the job is killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import easy_context as ec
from easy_context.sp_config import sp_config_for
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
REL = 1e-5  # fp32: ring / all-to-all attention, sharded loss sums and ZeRO-3 / FSDP2 reductions reorder additions
WEIGHTS_ATOL = 1e-4  # see assert_same_weights


def job_env(cpu: bool = True) -> dict[str, str]:
    """``cpu``: ACCELERATE_USE_CPU=1 (DDP / FSDP2 jobs); False for DeepSpeed, which it would switch off. DeepSpeed's
    CPU ops (cpu_adam, the shm collective) are built on first use into the cache tests/e2e/test_train.py uses too."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "TORCH_EXTENSIONS_DIR": str(ROOT / ".venv" / "torch_extensions")}  # fmt: skip
    if cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    else:
        env.pop("ACCELERATE_USE_CPU", None)
    return env


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer_runs")


@pytest.fixture(scope="module")
def jobs(out_dir) -> tuple[dict[str, dict], subprocess.CompletedProcess]:
    """The runs' results by name, and the 2-process job (its bad setups end it with an error)."""
    pytest.importorskip("trl")
    out = out_dir
    ref = run_job(
        [sys.executable, "tests/support/trainer_job.py", "ref", str(out)], cwd=ROOT, env=job_env(), timeout=300
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    cmd = [*LAUNCH, "accelerate_configs/cpu_2proc.yaml", "tests/support/trainer_job.py", "sp", str(out)]
    sp = run_job(cmd, cwd=ROOT, env=job_env(), timeout=300)
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {"lm_zigzag", "sft_zigzag", "sft_ulysses_logits", "sft_dp2_zigzag"} <= set(results), sp.stderr[-3000:]
    return results, sp


@pytest.fixture(scope="module")
def runs(jobs) -> dict[str, dict]:
    return jobs[0]


@pytest.fixture(scope="module")
def zero3_job(jobs, out_dir) -> tuple[dict[str, dict], subprocess.CompletedProcess]:
    """The ZeRO-3 runs' results by name (after ``jobs``: they start from its reference's saved initial weights) and
    the job: ``accelerate launch`` with accelerate_configs/cpu_zero3.yaml (zero3_offload.json: parameters and
    optimizer state offloaded, DeepSpeedCPUAdam), as on GPUs. A cold DeepSpeed op cache adds ~2 min of builds."""
    pytest.importorskip("deepspeed")
    cmd = [*LAUNCH, "accelerate_configs/cpu_zero3.yaml", "tests/support/trainer_job.py", "zero3", str(out_dir)]
    res = run_job(cmd, cwd=ROOT, env=job_env(cpu=False), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = ("lm_zigzag_zero3", "lm_ulysses_logits_zero3")
    return {name: json.loads((out_dir / f"{name}.json").read_text()) for name in names}, res


def assert_same_run(got: dict, ref: dict, name: str) -> None:
    assert len(ref["loss"]) == 4, ref
    for key in ("loss", "grad_norm"):  # every logged step: the global-mean loss and the gradient's norm
        assert got[key] == pytest.approx(ref[key], rel=REL), (name, key, got[key], ref[key])
    assert got["train_loss"] == pytest.approx(ref["train_loss"], rel=REL), name
    if ref["eval_loss"] is not None:
        assert got["eval_loss"] == pytest.approx(ref["eval_loss"], rel=REL), name


def assert_same_weights(out_dir: Path, name: str, ref: str = "lm") -> None:
    """The run's saved checkpoint (a plain transformers one: the loss head keeps the model's parameter names) holds
    the reference's trained weights. Adam's m / sqrt(v) turns float noise in near-zero gradients into steps of up to
    ~lr: WEIGHTS_ATOL is 1/80 of the 4 steps' largest total update (4 x lr); measured differences are <= 6e-5."""
    from safetensors.torch import load_file

    got, want = (load_file(out_dir / run / "final" / "model.safetensors") for run in (name, ref))
    assert got.keys() == want.keys() and "lm_head.weight" in want, name
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=WEIGHTS_ATOL, msg=f"{name}: {key}")


def test_trainer_zigzag_reproduces_one_process(runs, out_dir):
    """Trainer, 4 steps of 2 accumulated micro-batches, length 30 padded to zigzag's multiple 32: the 2-rank SP
    group logs the losses and grad norms of the 1-process Trainer (and its evaluate loss), and saves the same
    weights."""
    assert_same_run(runs["lm_zigzag"], runs["lm"], "lm_zigzag")
    assert_same_weights(out_dir, "lm_zigzag")


def test_trainer_under_fsdp2_reproduces_one_process(jobs, out_dir):
    """The zigzag run under FSDP2 (accelerate's fsdp2_prepare_model: each decoder layer, the embedding and [final
    norm, LM head] sharded over the 2 ranks, weights loaded from rank 0 (cpu_ram_efficient_loading); the grad norm of
    the DTensor gradients; a full state dict on save): the 1-process Trainer's losses, grad norms, evaluate loss and
    weights."""
    results, job = jobs
    assert "lm_zigzag_fsdp2" in results, job.stderr[-3000:]
    got = results["lm_zigzag_fsdp2"]
    assert got["engine"] == "FSDP" and got["head"] == "DTensor"
    assert_same_run(got, results["lm"], "lm_zigzag_fsdp2")
    assert_same_weights(out_dir, "lm_zigzag_fsdp2")


@pytest.mark.parametrize("name", ["lm_zigzag_zero3", "lm_ulysses_logits_zero3"])
def test_trainer_under_zero3_offload_reproduces_one_process(zero3_job, runs, out_dir, name):
    """ZeRO-3 with CPU offload, the model loaded after the arguments (partitioned as it loads, the LM head too):
    zigzag with the chunked loss inside the LM head (whose weight ZeRO-3 gathers around the head's forward) and
    Ulysses with the model's own logits log the 1-process Trainer's losses, DeepSpeed's grad norms, the evaluate loss,
    and save its weights (gathered on save)."""
    got = zero3_job[0][name]
    assert got["engine"] == "DEEPSPEED" and got["partitioned_at_load"]
    assert_same_run(got, runs["lm"], name)
    assert_same_weights(out_dir, name)


@pytest.mark.parametrize("name, ref", [("sft_zigzag", "sft"), ("sft_ulysses_logits", "sft"),
                                       ("sft_dp2_zigzag", "sft_accum4")])  # fmt: skip
def test_sft_prompt_masked_reproduces_one_process(runs, name, ref):
    """TRL SFTTrainer on prompt/completion pairs (prompt tokens -100, 2..8 targets per row, right padding with an
    attention_mask): zigzag and Ulysses (the model's logits) SP groups of 2, and 2 DP replicas of SP size 1 (each
    step's targets split unevenly over the replicas), log the 1-process losses: the step's exact token mean."""
    rows = runs[ref]["rows"]
    assert all(targets < length - 1 for length, targets in rows)  # every prompt is masked
    assert len({targets for _, targets in rows}) > 3  # the number of targets varies: the normalisation matters
    assert runs[name]["rows"] == rows  # the same tokenized data
    assert_same_run(runs[name], runs[ref], name)


def test_bad_setups_fail_clearly_on_every_rank(jobs):
    """A model the backend cannot split, a length that does not shard without padding, SP ranks fed different
    batches: ValueError / RuntimeError on every rank; a left-padded batch on ONE rank ends the job (that rank names
    the mask, the other says another rank refused) instead of leaving the other waiting in a collective (run_job's
    timeout would fail the fixture)."""
    res = jobs[1]
    text = res.stdout + res.stderr
    for rank in (0, 1):
        assert f"rank {rank} ERROR heads: ulysses_attn: 3 query heads are not divisible" in text, text[-3000:]
        assert f"rank {rank} ERROR length: zigzag_ring_attn: the batch's sequence length 30 is not divisible by 4" in (
            text
        )
        assert f"rank {rank} ERROR batches: ranks of one sequence-parallel group received different batches" in text
        assert f"rank {rank} starting the left-padded run" in text
        assert f"rank {rank} the left-padded run trained" not in text
    assert res.returncode != 0
    assert "an attention_mask that is not right padding" in text
    assert "another rank refused its batch" in text


def test_sharding_engine_misconfigurations_fail_clearly(jobs, zero3_job):
    """An FSDP or DeepSpeed setup that accelerate would not run as asked (on CPU it drops FSDP, and DeepSpeed under
    ACCELERATE_USE_CPU, training with DDP; TrainingArguments without a gloo backend leaves DeepSpeed's accelerate
    state at 1 process), or DeepSpeed's own sequence parallelism on top: one ValueError line on every rank, at
    construction, naming the fix."""
    text = jobs[1].stdout + jobs[1].stderr + zero3_job[1].stdout + zero3_job[1].stderr
    head = "SequenceParallelTrainer: not supported with easy_context sequence parallelism: "
    expected = {
        "fsdp on cpu": "FSDP was asked for but accelerate runs MULTI_CPU (accelerate",
        "no gloo": "the launcher started 2 processes but the accelerator runs 1 (DeepSpeed on CPU: give the "
        "DeepSpeed config to accelerate launch",
        "ACCELERATE_USE_CPU": "DeepSpeed was asked for but accelerate runs MULTI_CPU: ACCELERATE_USE_CPU=1",
        "two sp schemes": "DeepSpeed's own sequence parallelism (sequence_parallel_size=2",
    }
    for rank in (0, 1):
        for name, message in expected.items():
            assert f"rank {rank} ERROR {name}: {head}{message}" in text, (name, text[-3000:])
            assert f"rank {rank} {name}: constructed" not in text
    assert "ddp_backend='gloo'" in text and "drop fsdp / fsdp_config on CPU" in text


# ---------------------------------------------------------------------------------------------------------------
# the batch conversion, in this process (no process group: sp_config_for places a rank by hand)


def test_local_batches_reassemble_to_the_padded_shifted_batch():
    from easy_context.training.trainer import LocalBatch, sp_local_batch

    ids = torch.arange(1, 15).reshape(2, 7)
    labels = ids.clone()
    labels[:, :2] = -100  # a prompt
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # row 1 right padded
    batch = {"input_ids": ids, "labels": labels, "attention_mask": mask}
    shards = [sp_local_batch(batch, sp_config_for("zigzag_ring_attn", 2, sp_rank=r), pad_token_id=0) for r in (0, 1)]
    assert all(isinstance(s, LocalBatch) and s["input_ids"].shape == (2, 4) for s in shards)  # 7 -> 8 = 2 ranks x 4
    full_ids = torch.cat([ids, torch.zeros(2, 1, dtype=ids.dtype)], 1)
    targets = torch.full((2, 8), -100)
    targets[:, 1:6] = labels[:, 2:7]  # target i = label i + 1; the last token and the pad have none
    targets[1, 4:] = -100  # row 1: token 4 is its last real one, the pads have no target
    for r, shard in enumerate(shards):
        assert torch.equal(shard["input_ids"], ec.extract_local("zigzag_ring_attn", full_ids, r, 2))
        assert torch.equal(shard["shift_labels"], ec.extract_local("zigzag_ring_attn", targets, r, 2))
        positions = torch.arange(8).expand(2, 8)
        assert torch.equal(shard["position_ids"], ec.extract_local("zigzag_ring_attn", positions, r, 2))
    dp = sp_local_batch(batch, sp_config_for("data_parallel", 2))  # data parallel: whole rows, no padding
    assert torch.equal(dp["shift_labels"], targets[:, :7])


@pytest.mark.parametrize("change, match", [
    (lambda b: b.update(attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])), "not right padding"),
    (lambda b: b.update(pixel_values=torch.zeros(2, 3)), "got also \\['pixel_values'\\]"),
    (lambda b: b.pop("labels"), "needs labels"),
    (lambda b: b.update(labels=torch.zeros(2, 3, dtype=torch.long)), "differ in shape"),
])  # fmt: skip
def test_local_batch_refuses_what_it_cannot_shard(change, match):
    from easy_context.training.trainer import sp_local_batch

    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)}
    change(batch)
    with pytest.raises(ValueError, match=match):
        sp_local_batch(batch, sp_config_for("zigzag_ring_attn", 2))


def test_unpadded_length_names_the_fix():
    from easy_context.training.trainer import sp_local_batch

    batch = {"input_ids": torch.ones(1, 6, dtype=torch.long), "labels": torch.ones(1, 6, dtype=torch.long)}
    with pytest.raises(ValueError, match="not divisible by 4.*pad_seq_parallel_inputs.*sp_pad=True"):
        sp_local_batch(batch, sp_config_for("zigzag_ring_attn", 2), pad=False)
    assert sp_local_batch(batch, sp_config_for("ulysses_attn", 2), pad=False)["input_ids"].shape == (1, 3)


def test_sequence_parallel_trainer_class():
    from transformers import Trainer

    from easy_context.training.trainer import SequenceParallelMixin, SequenceParallelTrainer, sequence_parallel_trainer

    class MyTrainer(Trainer):
        pass

    cls = sequence_parallel_trainer(MyTrainer)
    assert cls.__mro__[1:3] == (SequenceParallelMixin, MyTrainer) and cls.loss_is_scaled_for_ga is True
    assert sequence_parallel_trainer(SequenceParallelTrainer) is SequenceParallelTrainer
    with pytest.raises(TypeError, match="Trainer subclass"):
        sequence_parallel_trainer(dict)
