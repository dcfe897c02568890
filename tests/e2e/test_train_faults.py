"""train.py under faults: a run with nothing to train, a resume after a kill or on another layout, a full
disk, damaged states, a stuck rank, a killed launcher (non-finite steps: tests/e2e/test_faults_nonfinite.py). Real runs
on CPU through tests.e2e.test_train's launcher, each under its timeout."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.e2e import test_train
from tests.e2e.test_train import losses, run_injected, run_train
from tests.support.jobs import run_job

data_dir = test_train.data_dir  # its packed dataset and tokenizer (a fixture: built once for this module too)

FAST = ("--parallel_mode", "data_parallel", "--checkpointing", "none")


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flag", ["--log-every", "--gradient-accumulate-every"])
def test_zero_intervals_are_rejected(data_dir, tmp_path, flag):
    res = run_train(data_dir, tmp_path / "bad", *FAST, flag, "0", check=False)
    message = f"argument {flag}: must be an integer >= 1, got 0"
    assert res.returncode == 2 and message in res.stderr, res.stderr[-2000:]


def test_nothing_to_train_exits_zero_and_writes_nothing(data_dir, tmp_path):
    """A re-queued job resuming a finished run, a --stop-at-step at the resumed step (--max-train-steps 0 is a usage
    error: tests/e2e/test_first_hour_flags.py)."""
    out = tmp_path / "run"
    run_train(data_dir, out, *FAST, "--save-every", "3", steps=3)
    before = snapshot(out)
    resume = ("--resume-from", str(out / "state-step3"))
    for steps, extra, message in [
        (3, resume, "resumed at step 3 of 3"),
        (5, (*resume, "--stop-at-step", "2"), "resumed at step 3 of 5, --stop-at-step 2"),
    ]:
        res = run_train(data_dir, out, *FAST, *extra, steps=steps)
        assert res.stdout.strip().splitlines() == [f"nothing to train: {message}"], res.stdout
    assert snapshot(out) == before  # no checkpoint, metrics row or engine.txt rewritten


def test_metrics_trimmed_on_resume(data_dir, tmp_path):
    """A run killed after step 3 (its last row torn mid-write) resumes from its step-2 state: the rows of steps 3
    and later are logged again, once."""
    out = tmp_path / "run"
    run_train(data_dir, out, *FAST, "--save-every", "2", "--stop-at-step", "3", steps=4)
    first = (out / "metrics.jsonl").read_text().splitlines()
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')
    run_train(data_dir, out, *FAST, "--resume-from", str(out / "state-step2"), steps=4)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[:2] == first[:2]
    assert json.loads(rows[2])["loss"] == pytest.approx(json.loads(first[2])["loss"], rel=1e-5)


def test_unjoined_cpu_launch_is_refused(data_dir, tmp_path):
    """accelerate launch of 2 CPU processes without ACCELERATE_USE_CPU=1 ran two unsynchronised jobs, exit 0."""
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "train.py", "--model", "tiny-llama", "--tokenizer", str(data_dir / "tokenizer"), "--dataset", str(data_dir),
           "--output-dir", str(tmp_path / "out"), "--seq-length", "256", "--dtype", "float32"]  # fmt: skip
    res = run_job(cmd, cwd=test_train.ROOT, env=env, timeout=300)
    assert res.returncode != 0 and "set ACCELERATE_USE_CPU=1" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_saved_random_init_model_uses_its_tokenizers_special_ids(data_dir, tmp_path):
    """A preset trained with a tokenizer made here (<s>=0, </s>=1, <pad>=2) saved Llama's bos 1 / eos 2."""
    from transformers import AutoTokenizer

    out = tmp_path / "ids"
    test_train.run_train(data_dir, out, *FAST)
    tok = AutoTokenizer.from_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((out / name).read_text())
        assert (saved["bos_token_id"], saved["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id), name
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == tok.pad_token_id


def test_tokens_per_second_counts_every_step_since_the_last_row(tmp_path, monkeypatch):
    """With --log-every N a metrics row covers N steps: tokens/s is N * tokens_per_step over their time."""
    import types

    from transformers import LlamaConfig

    from easy_context.training import metrics

    clock = iter([0.0, 10.0, 15.0])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), num_processes=1, is_main_process=True,
                                        log=lambda *a, **k: None)  # fmt: skip
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=100)  # fmt: skip
    logger = metrics.MetricsLogger(accelerator, str(tmp_path), config, 32, tokens_per_step=1000, start_step=0)
    assert logger.log(50, 1.0, 1e-3, 0)["tokens_per_s"] == pytest.approx(50 * 1000 / 10.0)
    assert logger.log(60, 1.0, 1e-3, 0)["tokens_per_s"] == pytest.approx(10 * 1000 / 5.0)


# run first in every process (run_injected): the disk fills up while optimizer.bin of state-step4 is written
# (part of the file is on disk, then ENOSPC, as torch.save on a full disk)
DISK_FULL_AT_STEP_4 = """
import errno
import os

import torch

_save = torch.save


def save(obj, f, *args, **kwargs):
    if str(f).endswith("optimizer.bin") and "state-step4" in str(f):
        with open(f, "wb") as out:
            out.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _save(obj, f, *args, **kwargs)


torch.save = save
"""


def leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if re.search(r"\.(tmp|old)$", p.name))


def test_disk_full_while_saving_two_processes(data_dir, tmp_path, monkeypatch):
    """A full disk while state-step4 is written: both ranks stop with one line naming the file and the last good
    state (no hang, no traceback, no half-written state-step4 or temp files); that state resumes."""
    from easy_context.training.train_state import check_training_state

    out = tmp_path / "run"
    res = run_injected(DISK_FULL_AT_STEP_4, data_dir, out, monkeypatch, *FAST, "--save-every", "2", procs=2, steps=6,
                       check=False)  # fmt: skip
    assert res.returncode != 0
    errors = re.findall(r"error: .*", res.stderr)  # (a progress bar may precede one on its line)
    assert len(errors) == 2 and errors[0] == errors[1], res.stderr[-3000:]
    message = errors[0]
    assert f"{out}/.state-step4.tmp/optimizer.bin" in message and "No space left on device" in message, message
    assert f"last good checkpoint: {out}/state-step2 (resume with --resume-from {out}/state-step2)" in message
    assert "Traceback" not in res.stderr.split("error:")[0], res.stderr[-3000:]  # the ranks print no traceback
    assert leftovers(out) == [] and not (out / "state-step4").exists() and not (out / "model.safetensors").exists()
    assert check_training_state(out / "state-step2")["step"] == 2
    run_train(data_dir, out, *FAST, "--resume-from", str(out / "state-step2"), procs=2, steps=3)
    assert losses(out, "step") == [1, 2, 3]


def test_bad_state_is_refused_naming_the_file_and_the_last_good_one(data_dir, tmp_path):
    """A truncated or missing random_states file, a corrupt or missing state JSON: one line with the file and the
    last good state; a save interrupted by a kill leaves a temp dir that the next start removes."""
    out = tmp_path / "run"
    run_train(data_dir, out, *FAST, "--save-every", "2", steps=4)
    state = out / "state-step4"
    saved = snapshot(state)
    first = losses(out, "loss")

    def truncate(name):
        (state / name).write_bytes(saved[name][: len(saved[name]) // 2])

    def legacy_truncated(name):  # a state written before file sizes were recorded: the load itself is checked
        position = json.loads(saved["easy_context_state.json"])
        del position["files"]
        (state / "easy_context_state.json").write_text(json.dumps(position))
        truncate(name)

    rng, js = "random_states_0.pkl", "easy_context_state.json"
    cases = [
        (truncate, rng, f"{state}/{rng} is truncated or changed"),
        (lambda name: (state / name).unlink(), rng, f"{state}/{rng} is missing"),
        (lambda name: (state / name).write_text('{"step": 4, "micro'), js, f"{state}/{js} is corrupt (JSONDecodeError"),
        (lambda name: (state / name).unlink(), js, f"{state}/{js} is missing (a half-written"),
        (legacy_truncated, rng, f"{state}/{rng} is unreadable"),
    ]
    for damage, name, expected in cases:
        damage(name)
        res = run_train(data_dir, out, *FAST, "--resume-from", str(state), steps=6, check=False)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: --resume-from {state}: {expected}"), res.stderr[-3000:]
        assert line.endswith(f"; last good checkpoint: {out}/state-step2 (resume with --resume-from {out}/state-step2)")
        for rel, data in saved.items():
            (state / rel).write_bytes(data)
    # a kill mid-save left a temp dir, and one mid-rename the replaced state under .NAME.old: cleared on start
    (out / ".state-step6.tmp").mkdir()
    (out / ".state-step6.tmp" / "optimizer.bin").write_bytes(b"x" * 4096)
    res = run_train(data_dir, out, *FAST, "--save-every", "2", "--resume-from", str(out / "state-step2"), steps=4)
    assert f"removed {out}/.state-step6.tmp (left by an interrupted save)" in res.stdout
    assert leftovers(out) == []
    assert losses(out, "loss")[2:] == pytest.approx(first[2:], rel=1e-5)
    assert sorted(snapshot(state)) == sorted(saved)  # state-step4 rewritten in place, complete


def test_eval_ppl_keeps_the_rows_of_models_scored_before_a_missing_one(data_dir, tmp_path):
    """-m GOOD -m BROKEN (a folder whose config cannot load) scored GOOD, then died without any CSV: the rows it has
    are written, one error line. A hub id missing offline is refused before anything is scored."""
    import sys

    output, broken = tmp_path / "ppl.csv", tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    common = ["--tokenizer", str(data_dir / "tokenizer"), "--dataset", str(data_dir.parent), "--min-tokens", "64",
              "--max-tokens", "128", "--truncate", "--samples", "1", "--output", str(output)]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = run_job([sys.executable, "eval_ppl.py", "-m", "tiny-llama", "-m", "nobody/missing-model", *common],
                  cwd=test_train.ROOT, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr and not output.exists(), res.stderr[-3000:]
    assert "nobody/missing-model" in res.stderr.strip().splitlines()[-1]
    res = run_job([sys.executable, "eval_ppl.py", "-m", "tiny-llama", "-m", str(broken), *common],
                  cwd=test_train.ROOT, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --model {broken}: ") and line.endswith(
        f"; the 2 rows scored before it are in {output}"
    ), res.stderr[-3000:]
    rows = output.read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]] == [["tiny-llama", "64"], ["tiny-llama", "128"]]


# run first in every process (run_injected): every micro-batch's input rows, appended to $EC_TEST_ROWS<rank>
LOG_ROWS = """
import json
import os

import easy_context.loss as loss


_forward = loss.CausalLMWithLoss.forward


def forward(self, input_ids, *args):
    with open(os.environ["EC_TEST_ROWS"] + os.environ.get("RANK", "0"), "a") as f:
        f.write(json.dumps(input_ids.tolist()) + "\\n")
    return _forward(self, input_ids, *args)


loss.CausalLMWithLoss.forward = forward
"""


def logged_rows(prefix: Path, rank: int) -> list[list[int]]:
    return [row for line in Path(f"{prefix}{rank}").read_text().splitlines() for row in json.loads(line)]


def test_resume_on_fewer_processes_continues_from_the_same_sample(data_dir, tmp_path, monkeypatch):
    """A data_parallel run on 2 processes resumed on 1 (it re-trained rows of steps 1-4): the state
    records the layout, the position in global samples, the tokens and the run's config; the resumed run trains the
    next global samples (16 read = 8 micro-batches of 2 rows on one process, not the 4 per process that were saved)
    and the tokens metric continues from the 4,096 tokens the state recorded."""
    import datasets

    out = tmp_path / "run"
    monkeypatch.setenv("EC_TEST_ROWS", str(tmp_path / "first-rank"))
    run_injected(LOG_ROWS, data_dir, out, monkeypatch, *FAST, "--save-every", "2", procs=2, steps=4)
    state = json.loads((out / "state-step2" / "easy_context_state.json").read_text())
    assert state["tokens"] == 2 * (2 * 256 * 2 * 2)  # steps x (batch x seq x accumulation x 2 data shards)
    layout = state["layout"]
    assert (layout["world_size"], layout["data_shards"], layout["parallel_mode"], layout["seq_length"],
            layout["batch_size"], layout["seed"]) == (2, 2, "data_parallel", 256, 2, 3), layout  # fmt: skip
    assert state["data"] == {"epoch": 0, "sample": 16} and state["micro_batches"] == 4
    assert state["config"]["args"]["seq_length"] == 256 and state["config"]["launch"]["processes"] == 2
    monkeypatch.setenv("EC_TEST_ROWS", str(tmp_path / "resumed-rank"))
    res = run_injected(LOG_ROWS, data_dir, out, monkeypatch, *FAST, "--resume-from", str(out / "state-step2"),
                       procs=1, steps=4)  # fmt: skip
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["tokens"] for r in rows] == [2048, 4096, 4096 + 1024, 4096 + 2048], res.stdout
    # the rows trained: epoch 0's permutation (EpochShuffleSampler, seed 3), read in rounds of 2 shards x 2 rows
    dataset = datasets.load_from_disk(str(data_dir))["input_ids"]
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(3)).tolist()
    sample = [dataset[i][:256] for i in order]
    first = logged_rows(tmp_path / "first-rank", 0)[:8] + logged_rows(tmp_path / "first-rank", 1)[:8]  # steps 1-2
    assert sorted(first) == sorted(sample[:16])
    resumed = logged_rows(tmp_path / "resumed-rank", 0)  # steps 3-4: 2 steps x 2 micro-batches x 2 rows
    where = [sample.index(r) if r in sample else None for r in resumed]  # (the first sample with that row)
    assert resumed == sample[16:24], where  # the old resume (4 micro-batches of 2 rows) trained samples 8-15 again


def test_resume_under_another_backend_continues_from_the_same_sample(data_dir, tmp_path):
    """data_parallel on 2 processes (2 data shards) resumed under 2-rank zigzag (1 shard: both ranks share each
    sample): the position maps onto the new layout and the tokens metric continues from the state's count."""
    out = tmp_path / "run"
    run_train(data_dir, out, *FAST, "--parallel_mode", "data_parallel", "--save-every", "2", procs=2, steps=4)
    res = run_train(data_dir, out, *FAST, "--parallel_mode", "zigzag_ring_attn", "--resume-from",
                    str(out / "state-step2"), procs=2, steps=4)  # fmt: skip
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["tokens"] for r in rows] == [2048, 4096, 4096 + 1024, 4096 + 2048], res.stdout
    assert all(math.isfinite(r["loss"]) for r in rows)


def test_interrupted_saves_are_cleared_on_start(tmp_path):
    """What a kill mid-save leaves: a temp dir is removed; a state moved aside to ``.NAME.old``
    while its successor was renamed in is restored when NAME is missing, removed when NAME is there."""
    from easy_context.training.train_state import remove_stale_temp

    for name in (".state-step6.tmp", ".final-model.tmp", ".state-step2.old", ".state-step4.old", "state-step4"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_text(name)
    (tmp_path / "metrics.jsonl").write_text("")  # not a leftover
    done = remove_stale_temp(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "state-step2", "state-step4"]
    assert (tmp_path / "state-step2" / "model.safetensors").read_text() == ".state-step2.old"
    assert (tmp_path / "state-step4" / "model.safetensors").read_text() == "state-step4"
    assert sorted(done) == sorted([
        f"removed {tmp_path}/.final-model.tmp (left by an interrupted save)",
        f"restored {tmp_path}/state-step2 (an interrupted save had moved it to .state-step2.old)",
        f"removed {tmp_path}/.state-step4.old (left by an interrupted save)",
        f"removed {tmp_path}/.state-step6.tmp (left by an interrupted save)",
    ])  # fmt: skip
    assert remove_stale_temp(tmp_path) == [] and remove_stale_temp(tmp_path / "missing") == []


def bf16_autocast_config(tmp_path: Path) -> str:
    """The 2-process CPU launch config with accelerate's AMP: bf16 autocast over the fp32 weights of --dtype float32."""
    config = tmp_path / "cpu_2proc_bf16.yaml"
    text = (test_train.ROOT / "accelerate_configs" / "cpu_2proc.yaml").read_text()
    config.write_text(text.replace("mixed_precision: 'no'", "mixed_precision: 'bf16'"))
    assert "mixed_precision: 'bf16'" in config.read_text()
    return str(config)


# run first in every process (run_injected): rank 1 hangs once its step 3 is done, before it tells its watchdog
# (as a rank stuck in a driver, a host sync or a file system); the time it stopped goes to $EC_TEST_STALLED
STALL_RANK_1_AFTER_STEP_3 = """
import os
import time

if os.environ.get("RANK") == "1":
    from easy_context.training import watchdog

    _beat = watchdog.Watchdog.beat

    def beat(self, step, *args, **kwargs):
        if step == 3:
            with open(os.environ["EC_TEST_STALLED"], "w") as f:
                f.write(repr(time.time()))
            time.sleep(3600)
        return _beat(self, step, *args, **kwargs)

    watchdog.Watchdog.beat = beat
"""


def test_stuck_rank_ends_the_training_job_within_the_bound(data_dir, tmp_path, monkeypatch):
    """train.py on 2 processes under ``accelerate launch`` (a SIGSTOPped rank held the job with no
    bound): rank 1 stops making progress after step 3; its watchdog (--step-timeout 8) ends it with one line naming
    the rank and the step, the launcher stops rank 0, and the job exits within the bound. Left on disk: the state of
    step 2, complete, no temp dir, no final model. The run is 2-rank zigzag under bf16 autocast with fp32 weights
    (it crashed at the first attention call): steps 1-3 train (1-2 logged), finite, the weights stay fp32."""
    from easy_context.training.train_state import check_training_state

    out = tmp_path / "run"
    stalled = tmp_path / "stalled"
    monkeypatch.setenv("EC_TEST_STALLED", str(stalled))
    res = run_injected(STALL_RANK_1_AFTER_STEP_3, data_dir, out, monkeypatch, "--parallel_mode", "zigzag_ring_attn",
                       "--checkpointing", "none", "--step-timeout", "8", "--save-every", "2", procs=2, steps=6,
                       config=bf16_autocast_config(tmp_path), check=False)  # fmt: skip
    elapsed = time.time() - float(stalled.read_text())  # from the stall to the job's exit (run_job polls 0.5 s)
    assert res.returncode != 0 and elapsed < 8 + 30, (res.returncode, elapsed, res.stderr[-3000:])
    found = re.findall(r"error: watchdog: [^\n]*", res.stderr)
    stall = re.compile(r"error: watchdog: rank 1 stalled in step 3: no progress for 8\.\d s since step 2 ended "
                       r"\(watchdog timeout 8 s\); every rank is alive; behind the others \(done step 3\): this rank "
                       r"\(done step 2\), look there first; ending this rank \(exit 124\) so the launcher stops the "
                       r"job")  # fmt: skip  # (rank 0, blocked in step 4, may be ended by its own watchdog too)
    assert any(stall.fullmatch(e) for e in found), found
    assert check_training_state(out / "state-step2")["step"] == 2
    assert leftovers(out) == [] and not (out / "model.safetensors").exists()
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    # rank 0 logs a step once every rank has ended it (the step boundary's agreement on a stop): step 3 is not
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows), rows
    assert json.loads((out / "run_config.json").read_text())["launch"]["mixed_precision"] == "bf16"
    weights = load_file(out / "state-step2" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}


def launch_command(data_dir, out, monkeypatch, *args, **kwargs) -> dict:
    """{"cmd", "env", "cwd"} of the launch ``run_train`` would run (nothing runs)."""
    seen = {}

    def capture(cmd, *, cwd, env, timeout):
        seen.update(cmd=cmd, env=env, cwd=cwd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with monkeypatch.context() as patch:
        patch.setattr(test_train, "run_job", capture)
        run_train(data_dir, out, *args, **kwargs)
    return seen


def test_killed_launcher_leaves_no_training_orphans(data_dir, tmp_path, monkeypatch):
    """kill -9 of ``accelerate launch`` while train.py trains on 2 processes (both ranks trained on
    as orphans): each rank's watchdog sees its launcher gone and ends the rank within seconds, one line each; no
    temp dir or final model is left."""
    out = tmp_path / "run"
    job = launch_command(data_dir, out, monkeypatch, *FAST, procs=2, steps=500)
    log = tmp_path / "job.log"
    with log.open("w") as f:  # a file, not a pipe: orphans would hold a pipe open
        launcher = subprocess.Popen(job["cmd"], stdout=f, stderr=subprocess.STDOUT, env=job["env"], cwd=job["cwd"],
                                    start_new_session=True)  # fmt: skip
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True) if "train.py" in p.cmdline()]
        assert len(ranks) == 2, [p.cmdline() for p in ranks]
        launcher.kill()
        launcher.wait(timeout=30)
        start = time.monotonic()
        gone, alive = psutil.wait_procs(ranks, timeout=20)
        elapsed = time.monotonic() - start
        assert not alive and elapsed < 15, (elapsed, log.read_text()[-3000:])
    finally:  # whatever happened: nothing of the job outlives the test
        if launcher.poll() is None:
            launcher.kill()
        for proc in ranks:
            try:
                proc.kill()
            except psutil.Error:
                pass
    found = sorted(re.findall(r"error: watchdog: rank (\d): its launcher \(pid (\d+)\) is gone \(killed\?\); ending "
                              r"this rank \(exit 124\)", log.read_text()))  # fmt: skip
    assert found == [("0", str(launcher.pid)), ("1", str(launcher.pid))], log.read_text()[-3000:]
    assert leftovers(out) == [] and not (out / "model.safetensors").exists()


def test_save_error_hint_follows_the_cause(tmp_path):
    """A failed save names what to do about its own cause: disk space only when the disk is full."""
    import errno

    from easy_context.training.train_state import _save_error

    def hint(exc):
        return _save_error("the final model", exc, tmp_path / ".tmp", 0, tmp_path, None)

    full = hint(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert "No space left on device" in full and "free disk space" in full
    denied = hint(PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
    assert "writable" in denied and "disk space" not in denied
    gguf = hint(ValueError("The model is quantized with gguf and is not serializable"))
    assert "cannot be written as it is" in gguf and "dequantiz" in gguf and "disk space" not in gguf
    other = hint(RuntimeError("boom"))
    assert "RuntimeError: boom" in other and "fix the cause above" in other and "disk space" not in other
