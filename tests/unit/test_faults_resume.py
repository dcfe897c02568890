"""Resume that cannot lie: a state records how the run read its data and where it stood in global
samples; a resume on another number of processes or batch size continues at the same global sample (never training
one twice), a changed seq length, seed, dataset or model is refused naming the flag.

Before, a state held only a per-process micro-batch count: a data_parallel 2 -> 1 resume re-trained rows already
used. The data streams here are accelerate's own sharded loaders over the sampler train.py uses."""

from __future__ import annotations

import itertools
import json
import re
import types
from pathlib import Path

import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from easy_context.training.train_state import (
    CheckpointError,
    DataLayout,
    EpochShuffleSampler,
    ResumePlan,
    check_unchanged,
    model_fingerprint,
    read_training_position,
    resume_plan,
    save_training_state,
)

SEED = 3


def loaders(rows: int, batch_size: int, shards: int) -> list[tuple[object, EpochShuffleSampler]]:
    """(prepared loader, sampler) of each shard (rank of a data-parallel group), as train.py builds them."""
    out = []
    for p in range(shards):
        sampler = EpochShuffleSampler(rows, SEED)
        loader = DataLoader(list(range(rows)), batch_size, sampler=sampler)
        out.append((prepare_data_loader(loader, torch.device("cpu"), num_processes=shards, process_index=p,
                                        put_on_device=True), sampler))  # fmt: skip
    return out


def layout_of(rows: int, batch_size: int, shards: int, **kw) -> DataLayout:
    (loader, _), *_ = loaders(rows, batch_size, shards)
    return DataLayout(data_shards=shards, batch_size=batch_size, batches_per_epoch=len(loader), dataset_rows=rows,
                      seq_length=256, seed=SEED, **kw)  # fmt: skip


def trained(rows: int, batch_size: int, shards: int, start: int, count: int) -> list[int]:
    """The rows every shard trains on, micro-batches ``start`` .. ``start + count`` of each (train.py's endless
    stream over epochs, skipping what a resume already consumed), in global order: round by round, shard by shard."""

    def stream(loader, sampler):
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    streams = [[b.tolist() for b in itertools.islice(stream(*shard), start, start + count)]
               for shard in loaders(rows, batch_size, shards)]  # fmt: skip
    return [row for i in range(count) for s in streams for row in s[i]]


def epoch_rows(epoch: int, rows: int) -> list[int]:
    g = torch.Generator().manual_seed(SEED + epoch)
    return torch.randperm(rows, generator=g).tolist()


@pytest.mark.parametrize(
    "rows,before,after,consumed",
    [
        ((29, (2, 2), (2, 1), 4)),  # data_parallel 2 -> 1 processes (the case)
        ((29, (2, 2), (2, 4), 4)),  # 2 -> 4
        ((29, (2, 4), (2, 2), 3)),  # 4 -> 2
        ((29, (2, 2), (4, 1), 5)),  # 2 -> 1 process, batch 2 -> 4: sample 20 is a round boundary of both
        ((29, (2, 1), (2, 2), 3)),  # 1 -> 2: 6 samples done, rounds of 4 here: 2 samples skipped
        ((29, (3, 2), (2, 2), 7)),  # into the second epoch (5 micro-batches per epoch there)
    ],
)
def test_resume_on_another_layout_continues_at_the_same_global_sample(rows, before, after, consumed):
    (bs0, n0), (bs1, n1) = before, after
    old, new = layout_of(rows, bs0, n0), layout_of(rows, bs1, n1)
    done = trained(rows, bs0, n0, 0, consumed)
    at = old.position(consumed)
    epoch, sample = at["epoch"], at["sample"]
    assert done[len(done) - sample :] == epoch_rows(epoch, rows)[:sample]  # the rows of this epoch done
    plan = resume_plan({"micro_batches": consumed, "layout": json.loads(json.dumps(old.__dict__))}, new)
    skipped = -sample % (n1 * bs1)
    rest = trained(rows, bs1, n1, plan.micro_batches, 3)
    left = min(len(rest), rows - sample - skipped)  # (past the epoch's end: accelerate's padding, then the next)
    assert left > 0 and rest[:left] == epoch_rows(epoch, rows)[sample + skipped :][:left]  # right where it stopped
    assert ("samples of epoch" in " ".join(plan.notes)) == bool(skipped), plan.notes
    assert plan.notes[0].startswith("resuming on another layout (data_shards") or n0 == n1, plan.notes
    # the old resume (the saved micro-batch count taken as is) replays rows this epoch already trained
    naive = trained(rows, bs1, n1, consumed, 1)
    if (n0 * bs0, n1 * bs1) in [(4, 2), (8, 4)]:
        assert set(naive) <= set(epoch_rows(epoch, rows)[:sample])


def test_same_layout_resumes_at_the_saved_count_and_legacy_states_with_a_note():
    layout = layout_of(29, 2, 2)
    record = json.loads(json.dumps(layout.__dict__))
    assert resume_plan({"micro_batches": 9, "layout": record, "tokens": 4608}, layout) == ResumePlan(9, (), 4608)
    legacy = resume_plan({"micro_batches": 9}, layout, "out/state-step4")
    assert legacy.micro_batches == 9 and legacy.notes[0].startswith("out/state-step4: the state records no data layout")


def fake_accelerator():
    def save_state(directory):
        Path(directory, "model.safetensors").write_bytes(b"weights")
        torch.save({"random_state": 1, "numpy_random_seed": 2, "torch_manual_seed": 3},
                   Path(directory, "random_states_0.pkl"))  # fmt: skip

    return types.SimpleNamespace(process_index=0, is_main_process=True, save_state=save_state)


def test_state_records_layout_position_tokens_and_config(tmp_path):
    layout = layout_of(29, 2, 2, world_size=2, sp_size=1, parallel_mode="data_parallel", model="llama L2")
    state = tmp_path / "state-step3"
    save_training_state(fake_accelerator(), state, 3, 6, 0, layout=layout, tokens=3072,
                        config={"seq_length": 256, "output_dir": tmp_path})  # fmt: skip
    position = read_training_position(state, 0)
    assert position["layout"] == json.loads(json.dumps(layout.__dict__))
    assert position["data"] == {"epoch": 0, "sample": 24} and position["tokens"] == 3072
    assert position["config"] == {"seq_length": 256, "output_dir": str(tmp_path)}
    assert resume_plan(position, layout).micro_batches == 6
    # a damaged layout record is refused like any corrupt state
    (state / "easy_context_state.json").write_text(json.dumps({**position, "layout": {"data_shards": 0}}))
    with pytest.raises(CheckpointError, match=r"easy_context_state.json is corrupt .*lacks positive integer"):
        read_training_position(state, 0)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"seq_length": 512}, "trained with --seq-length 256, this run has 512 (the dataset's rows are other rows"),
        ({"seed": 4}, "trained with --seed 3, this run has 4 (the data order follows it"),
        ({"dataset_rows": 30}, "trained with --dataset (rows) 29, this run has 30"),
        ({"model": "llama L4"}, "trained with --model / --rope-theta llama L2, this run has llama L4"),
    ],
)
def test_a_resume_that_changes_what_the_position_means_is_refused(change, message):
    saved = layout_of(29, 2, 2, model="llama L2")
    position = {"micro_batches": 4, "layout": json.loads(json.dumps(saved.__dict__))}
    expected = f"--resume-from out/state-step2: the state was {message}"
    with pytest.raises(CheckpointError) as err:
        check_unchanged(position, "out/state-step2", **change)  # before anything is built
    assert str(err.value).startswith(expected) and str(err.value).endswith("or start a new run in another --output-dir")
    current = DataLayout(**{**saved.__dict__, **change})
    with pytest.raises(CheckpointError, match=re.escape(message)):
        resume_plan(position, current, "out/state-step2")


def test_model_fingerprint_names_architecture_and_rope_base():
    from transformers import LlamaConfig

    from easy_context.models import set_rope_theta

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300)  # fmt: skip
    before = model_fingerprint(config)
    assert before.startswith("model_type=llama num_hidden_layers=2 hidden_size=64 num_attention_heads=4 ")
    set_rope_theta(config, 1e6)
    assert model_fingerprint(config) != before and model_fingerprint(config).endswith("rope_theta=1000000.0")


def test_a_state_is_fsynced_before_it_gets_its_name(tmp_path, monkeypatch):
    """Atomic saves: every file of the state and its temp dir are fsynced before the temp dir is
    renamed to ``state-stepK``, the output dir after (a crash leaves either no state-stepK or a complete one)."""
    import os

    from easy_context.training import train_state

    events = []
    fsync, replace = os.fsync, os.replace

    def logged_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def logged_replace(src, dst):
        events.append(("rename", str(src), str(dst)))
        return replace(src, dst)

    monkeypatch.setattr(train_state.os, "fsync", logged_fsync)
    monkeypatch.setattr(train_state.os, "replace", logged_replace)
    final = tmp_path / "state-step3"
    save_training_state(fake_accelerator(), final, 3, 6, 0)
    temp = str(tmp_path / ".state-step3.tmp")
    assert events[-2:] == [("rename", temp, str(final)), ("fsync", str(tmp_path))], events
    synced = {e[1] for e in events[:-2] if e[0] == "fsync"}
    files = {"model.safetensors", "random_states_0.pkl", "easy_context_state.json"}
    assert synced == {temp} | {f"{temp}/{name}" for name in files}, events
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-step3"] and read_training_position(final)["step"] == 3
