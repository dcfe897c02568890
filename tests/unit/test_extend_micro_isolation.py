"""A CPU miniature (MICRO=1, ``--micro``) never reads or writes the real run's folders, in either order, and a stage's
done marker belongs to the model it ran on: the pipeline on the fake interpreter of test_extend_pipeline (it records
the commands it is given instead of running them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from easy_context.extend import pipeline as pl
from easy_context.extend.micro import CAVEAT
from easy_context.extend.settings import resolve
from easy_context.training.train_state import STATE_JSON
from tests.unit.test_extend_pipeline import FAKE

RECIPE = """seq-length: 64
rope-theta: 100000
max-train-steps: 3
pipeline:
  run_name: r
  model: models/tiny
  fetch: tiny
  base_length: 32
  baselines: [base, yarn]
  control: 0
  ruler: 0
  long: null
  micro:
    device: cpu
    baselines: [base]
"""
REAL = ("out/extend_r", "models/tiny")


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A checkout with the recipe, the real run's fetched model and the fake interpreter; returns a runner of the
    pipeline (MICRO=1 or not) that gives the commands it ran, with the checkout's path taken out."""
    monkeypatch.chdir(tmp_path)
    python = tmp_path / "fakepy"
    python.write_text(FAKE.format(python=sys.executable, state_json=STATE_JSON))
    python.chmod(0o755)
    (tmp_path / "r.yaml").write_text(RECIPE)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "config.json").write_text('{"num_hidden_layers": 30}')
    (tmp_path / "models" / "tiny" / "model.safetensors").write_bytes(b"weights")

    def go(micro: bool = False, **env: str) -> tuple[list[list[str]], pl.Pipeline]:
        record = tmp_path / "record.jsonl"
        record.unlink(missing_ok=True)
        full = {"PATH": "/usr/bin:/bin", "RECORD": str(record), **({"MICRO": "1"} if micro else {}), **env}
        pipeline = pl.Pipeline(resolve("r.yaml", full), str(python), env=full)
        pipeline.poll_s = 0.05
        assert pipeline.run() == 0
        calls = [json.loads(line)["argv"] for line in record.read_text().splitlines()]
        return [[a.replace(str(tmp_path) + os.sep, "") for a in argv] for argv in calls], pipeline

    return go


def tree(*folders: str) -> dict[str, tuple[int, int]]:
    """Every file under ``folders``: its size and modification time."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for f in folders for p in sorted(Path(f).rglob("*"))
            if p.is_file()}  # fmt: skip


def test_settings_give_a_miniature_folders_of_its_own(tmp_path):
    """The recipe's work, results, model and fetch are the real run's: MICRO=1 takes none of them, only what its own
    micro: section gives (an explicit environment value still wins)."""
    path = tmp_path / "r.yaml"
    recipe = RECIPE.replace("  fetch: tiny\n", "  fetch: tiny\n  work: out/real\n  results: out/real/res\n")
    path.write_text(recipe)
    real, micro = resolve(str(path), {}), resolve(str(path), {"MICRO": "1"})
    assert (real.name, real.work, real.results, real.model, real.fetch) == (
        "r", "out/real", "out/real/res", "models/tiny", "tiny")  # fmt: skip
    assert (micro.name, micro.work, micro.results, micro.model, micro.fetch) == (
        "r-micro", "out/extend_r-micro", "out/extend_r-micro/results", "out/extend_r-micro/base", "")  # fmt: skip
    path.write_text(recipe + "    model: models/my-tiny\n")
    assert resolve(str(path), {"MICRO": "1"}).model == "models/my-tiny"  # its own section's
    assert resolve(str(path), {"MICRO": "1", "WORK": "w"}).work == "w"


def test_miniature_first_then_the_real_run(run, tmp_path):
    """A miniature before the real run: the real model's folder is untouched, the real work folder never made, and
    the real run then runs the very commands it runs on a checkout where no miniature ran."""
    models = tree("models")
    micro_calls, micro = run(micro=True)
    assert micro.work == "out/extend_r-micro" and not Path("out/extend_r").exists() and tree("models") == models
    assert not any(re.search(rf"{real}(/|$)", arg) for argv in micro_calls for arg in argv for real in REAL)
    summary = next(argv for argv in micro_calls if "easy_context.eval.compare" in argv)
    assert summary[summary.index("--caveat") + 1] == CAVEAT
    after, _ = run()
    shutil.rmtree("out")
    clean, _ = run()
    assert sorted(after) == sorted(clean) and any("models/tiny" in argv for argv in after)  # stages run side by side
    assert "--caveat" not in next(argv for argv in after if "easy_context.eval.compare" in argv)


def test_real_run_first_then_a_miniature(run):
    """A miniature after the real run changes none of the real run's files, and the real run again finds every stage
    done, as it does without the miniature between."""
    run()
    again_alone, _ = run()
    real = tree(*REAL)
    run(micro=True)
    assert tree(*REAL) == real
    again, _ = run()
    assert sorted(again) == sorted(again_alone)
    assert not {"train.py", "eval_needle.py", "eval_ppl.py"} & {argv[0] for argv in again}  # all done already


def test_an_evaluation_of_another_model_runs_again(run, capsys):
    """Done markers hold the model's fingerprint: replacing the model (here: another config, what an older miniature
    left in the real folder) or a marker with none (an older version's) makes the evaluations run again, each said in
    one log line; the unchanged model's are skipped."""
    run()
    done = Path("out/extend_r/eval/base/done")
    assert done.read_text().strip() and Path("out/extend_r/eval/yarn/done").read_text() == done.read_text()
    capsys.readouterr()
    Path("models/tiny/config.json").write_text('{"num_hidden_layers": 2}')
    calls, _ = run(ONLY="before")
    log = capsys.readouterr().out
    assert sum("its results are of another model" in line for line in log.splitlines()) == 2, log
    assert {"eval_needle.py"} <= {argv[0] for argv in calls} and "eval base: done already" not in log
    Path("out/extend_r/eval/yarn/done").write_text("")  # a marker without a fingerprint
    calls, _ = run(ONLY="before")
    log = capsys.readouterr().out
    assert "eval base: done already" in log and "eval yarn: its results are of another model (no model recorded" in log
    assert [argv[argv.index("--output-dir") + 1] for argv in calls if argv[0] == "eval_needle.py"] == [
        "out/extend_r/eval/yarn/needle", "out/extend_r/eval/yarn/needle3"]  # fmt: skip


def test_micro_writes_its_recipe_in_its_own_folder(tmp_path, monkeypatch, capsys):
    """``--micro`` writes the recipe into the miniature's work folder (out/extend_NAME-micro), never the real one's,
    and its dry run names its own folders."""
    from easy_context.extend import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)))  # fmt: skip
    ran = []
    monkeypatch.setattr(cli, "run_recipe", lambda path, micro=False: ran.append((path, micro)) or 0)
    assert cli.main(["--model", str(tmp_path / "m"), "--to", "1K", "--micro"]) == 0
    assert ran == [("out/extend_m_1K-micro/recipe.yaml", True)] and not (tmp_path / "out" / "extend_m_1K").exists()
    assert cli.main(["--recipe", ran[0][0], "--micro", "--dry-run"]) == 0
    assert "its own folders: work out/extend_m_1K-micro, model out/extend_m_1K-micro/base" in capsys.readouterr().out


def test_data_and_training_of_another_model_are_done_again(run, capsys):
    """Packed data belongs to MODEL's tokenizer, a training run to the model it started from: after the model is
    replaced (another tokenizer, another shape: what an older miniature left in the real folder) the data is packed
    again and the training folder is set aside and trained afresh, each said in one log line. A training folder from
    before the markers is kept (resumed) when its model has the source's shape, set aside otherwise."""
    run(ONLY="train")
    assert Path("out/extend_r/data_64.done").read_text().strip() and Path("out/extend_r/extended/source").is_file()
    capsys.readouterr()
    Path("models/tiny/tokenizer.json").write_text('{"model": "a 1000-token BPE"}')
    Path("models/tiny/config.json").write_text('{"num_hidden_layers": 2}')
    calls, _ = run(ONLY="train")
    log = capsys.readouterr().out
    assert "data_64: its results are of another model" in log
    assert ("extended: out/extend_r/extended was trained from another model than models/tiny; moved to "
            "out/extend_r/extended.other-model, training afresh") in log  # fmt: skip
    assert [argv[argv.index("--seq-length") + 1] for argv in calls if "easy_context.data" in argv] == ["64"]
    assert any(argv[0] == "train.py" and "--resume-from" not in argv for argv in calls)

    extended = Path("out/extend_r/extended")
    for name in ("source", "train_done"):  # a folder trained before the markers, its model of the source's shape
        (extended / name).unlink()
    (extended / "config.json").write_text('{"num_hidden_layers": 2}')
    run(ONLY="train")
    assert "extended: resumes from" in capsys.readouterr().out
    (extended / "source").unlink()
    (extended / "train_done").unlink()
    (extended / "config.json").write_text('{"num_hidden_layers": 30}')  # another shape than the source's
    run(ONLY="train")
    assert "extended: out/extend_r/extended was trained from another model" in capsys.readouterr().out
