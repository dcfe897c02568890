"""The extension pipeline's decisions (easy_context.extend.pipeline), each on a fake interpreter that records the
commands it is given with their start and end times instead of running them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from easy_context.extend import pipeline as pl
from easy_context.extend.settings import SettingsError, resolve
from easy_context.extend.stages import newest_state, training_finished
from easy_context.training.train_state import STATE_JSON

FAKE = """#!{python}
import json, os, sys, time
argv = sys.argv[1:]
if argv[:1] == ["-c"]:  # the flash-attn probe: not here
    sys.exit(1)
t0 = time.time()
def opt(flag):
    return argv[argv.index(flag) + 1] if flag in argv else None
if "train.py" in argv:
    time.sleep(float(os.environ.get("FAKE_TRAIN_S", "0")))
    out = opt("--output-dir")
    os.makedirs(out, exist_ok=True)
    reach = int(os.environ.get("FAKE_REACH", "1000"))
    start = int((opt("--resume-from") or "state-step0").rsplit("step", 1)[1])
    step = min(int(opt("--max-train-steps") or 3), reach)
    os.makedirs(f"{{out}}/state-step{{step}}", exist_ok=True)
    with open(f"{{out}}/state-step{{step}}/{state_json}", "w") as f:
        json.dump({{"step": step, "micro_batches": step, "files": {{}}}}, f)
    open(f"{{out}}/config.json", "w").write("{{}}")
    with open(f"{{out}}/metrics.jsonl", "a") as f:
        f.write(json.dumps({{"step": step, "from": start}}) + "\\n")
elif argv[:1] in (["eval_needle.py"], ["eval_ppl.py"]):
    time.sleep(float(os.environ.get("FAKE_EVAL_S", "0")))
elif argv[:2] == ["-m", "easy_context.data"]:
    os.makedirs(opt("--output"), exist_ok=True)
    open(opt("--output") + "/dataset_info.json", "w").write("{{}}")
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"argv": argv, "t0": t0, "t1": time.time()}}) + "\\n")
fail = os.environ.get("FAKE_FAIL")
if fail and fail in " ".join(argv) + " ":
    print("Traceback (most recent call last):\\nRuntimeError: attention kernel 'cudnn' cannot run here: it needs "
          "CUDA tensors\\n[rank0] exiting")
    sys.exit(1)
"""

RECIPE = """seq-length: 64
rope-theta: 100000
max-train-steps: 3
pipeline:
  base_length: 32
  fetch: tiny
  baselines: [base, yarn]
  ruler: 0
  long: null
  stages:
    - {seq-length: 48, max-train-steps: 2, warmup-steps: 1}
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A run folder with the recipe, a base model and the fake interpreter; returns a runner of the pipeline."""
    monkeypatch.chdir(tmp_path)
    python = tmp_path / "fakepy"
    python.write_text(FAKE.format(python=sys.executable, state_json=STATE_JSON))
    python.chmod(0o755)
    (tmp_path / "r.yaml").write_text(RECIPE)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    record = tmp_path / "record.jsonl"
    base_env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), "MODEL": str(tmp_path / "base"), "WORK": "w",
                "CONTROL": "0"}  # fmt: skip

    def run(want_rc: int = 0, **env: str) -> list[dict]:
        full = {**base_env, **env}
        pipeline = pl.Pipeline(resolve("r.yaml", full), str(python), env=full)
        pipeline.poll_s = 0.05
        assert pipeline.run() == want_rc
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    return run


def stages_tsv(tmp_path: Path) -> dict[str, str]:
    rows = (tmp_path / "w" / "results" / "stages.tsv").read_text().splitlines()
    return {name: rc for name, rc, _ in (row.split("\t") for row in rows)}


def trains(calls: list[dict]) -> list[list[str]]:
    return [c["argv"] for c in calls if "train.py" in c["argv"]]


def test_every_stage_runs_once_then_the_same_command_skips_what_is_done(fake, tmp_path):
    calls = fake()
    train = trains(calls)
    assert [t[t.index("--seq-length") + 1] for t in train] == ["48", "64"]
    assert train[1][train[1].index("--model") + 1] == "w/stage1_48"  # the main stage from the stage's model
    assert "--warmup-steps=1" in train[0]
    yarn = next(c["argv"] for c in calls if "w/eval/yarn/needle" in c["argv"])
    assert yarn[yarn.index("--rope_scaling") + 1] == "yarn:2:32"
    tsv = stages_tsv(tmp_path)
    assert {"stage1_48", "extended", "needle_base", "needle_yarn", "needle_extended", "summary"} <= set(tsv)
    assert all((tmp_path / "w" / "eval" / m / "done").is_file() for m in ("base", "yarn", "extended"))
    assert (tmp_path / "w" / "results" / "logs.tgz").is_file()
    again = fake()[len(calls) :]
    ran = [c["argv"] for c in again if c["argv"][:1] != ["PaulGrahamEssays/fetch.py"]]
    summary_and_card = [c for c in ran if "easy_context.eval.compare" in c or "easy_context.extend.model_card" in c]
    assert ran == summary_and_card and len(ran) == 2  # the second run: the summary and the model card only


def test_training_resumes_from_the_newest_state_in_chunks(fake, tmp_path):
    out = tmp_path / "w" / "extended"
    for step in (2, 10, 9, 11):
        (out / f"state-step{step}").mkdir(parents=True)
        if step != 11:  # state-step11: cut off before its files were written
            (out / f"state-step{step}" / STATE_JSON).write_text(
                json.dumps({"step": step, "micro_batches": step, "files": {}})
            )
    assert newest_state(out) == str(out / "state-step10")  # by step number, not by text; complete states only
    assert newest_state(tmp_path / "none") is None
    calls = fake(TRAIN_CHUNK_S="17", STEPS="30")
    main = next(t for t in trains(calls) if "w/extended" in t)
    assert main[main.index("--resume-from") + 1] == "w/extended/state-step10"
    assert main[main.index("--time-limit") + 1] == "17" and main[main.index("--max-train-steps") + 1] == "30"


def test_finished_check_reads_the_last_metrics_row(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 4}\n\n')
    for steps, finished in ((4, True), (5, False)):
        assert training_finished(tmp_path, steps) is finished
    assert not training_finished(tmp_path / "missing", 1)


def test_a_stage_stopped_at_its_time_limit_hands_on_its_model_and_the_main_stage_continues_later(fake, tmp_path):
    calls = fake(FAKE_REACH="1")  # every run stops at step 1: the stage hands on, the main stage is not done
    train = trains(calls)
    assert train[1][train[1].index("--model") + 1] == "w/stage1_48"
    assert (tmp_path / "w" / "stage1_48" / "train_done").is_file()
    assert not (tmp_path / "w" / "extended" / "train_done").exists()
    assert not (tmp_path / "w" / "eval" / "extended").exists()  # not evaluated before it is done
    calls = fake(FAKE_REACH="1000")[len(calls) :]
    (main,) = trains(calls)  # the next call resumes the main stage only
    assert main[main.index("--resume-from") + 1] == "w/extended/state-step1"
    assert (tmp_path / "w" / "eval" / "extended" / "done").is_file()


def test_before_evaluations_run_beside_the_training(fake):
    calls = fake(FAKE_TRAIN_S="1.0", FAKE_EVAL_S="0.5")
    training = [c for c in calls if "train.py" in c["argv"]]
    before = [c for c in calls if c["argv"][:1] in (["eval_needle.py"], ["eval_ppl.py"]) and
              any(a.startswith("w/eval/base/") for a in c["argv"])]  # fmt: skip
    assert before and any(e["t0"] < t["t1"] and t["t0"] < e["t1"] for e in before for t in training)


def test_every_model_runs_the_separating_tasks_and_the_base_the_needle_beyond_at_the_full_factor(fake):
    """The same prompt sets for every model: RULER's separating subset and the needle with distractors for the base,
    each baseline (with its scaling), the control and the extended model; beyond the trained length the base with
    YaRN at LONG / BASE_LENGTH next to the extended model's scalings."""
    calls = [c["argv"] for c in fake(RULER="1", LONG="128", CONTROL="1")]

    def out(argv: list[str]) -> str:
        return argv[argv.index("--output-dir") + 1]

    def scaling(argv: list[str]) -> str | None:
        return argv[argv.index("--rope_scaling") + 1] if "--rope_scaling" in argv else None

    rulers = {out(a): a for a in calls if a[:1] == ["eval_ruler.py"]}
    assert set(rulers) == {f"w/eval/{m}/ruler" for m in ("base", "yarn", "control", "extended")}
    for argv in rulers.values():
        assert argv[argv.index("--tasks") + 1] == "niah_multikey_1,niah_multivalue,vt,fwe"
        assert argv[argv.index("--lengths") + 1] == "16,32,64"
    assert scaling(rulers["w/eval/yarn/ruler"]) == "yarn:2:32" and scaling(rulers["w/eval/base/ruler"]) is None
    needles = {out(a): scaling(a) for a in calls if a[:1] == ["eval_needle.py"]}
    assert {f"w/eval/{m}/needle3" for m in ("base", "yarn", "control", "extended")} <= set(needles)
    assert needles["w/eval/yarn/needle3"] == "yarn:2:32"
    beyond = {k: v for k, v in needles.items() if "/long_" in k}
    assert beyond == {"w/eval/base/long_yarn_4_32": "yarn:4:32", "w/eval/extended/long_none": None,
                      "w/eval/extended/long_yarn_2_64": "yarn:2:64"}  # fmt: skip
    assert resolve("r.yaml", {"RULER_TASKS": "all"}).ruler_tasks == "all"
    with pytest.raises(SettingsError, match=r"RULER_TASKS.*unknown task\(s\) \['vtt'\]"):
        resolve("r.yaml", {"RULER_TASKS": "vt,vtt"})


def test_distractor_samples_set_the_distractor_needle_of_every_model_and_zero_drops_it(fake, tmp_path):
    """DISTRACTOR_SAMPLES: the distractor needle's samples, the same for every model; 0 runs none; a word is refused
    in one line naming the setting."""

    def distractors(calls) -> dict[str, str]:
        return {a[a.index("--output-dir") + 1]: a[a.index("--num_samples") + 1] for a in calls
                if a[:1] == ["eval_needle.py"] and "--num_distractor" in a}  # fmt: skip

    three = distractors(c["argv"] for c in fake(DISTRACTOR_SAMPLES="3", BASELINES="base yarn"))
    assert three == {"w/eval/base/needle3": "3", "w/eval/yarn/needle3": "3", "w/eval/extended/needle3": "3"}
    shutil.rmtree(tmp_path / "w")  # a fresh run: its own work folder and record
    (tmp_path / "record.jsonl").unlink()
    assert distractors(c["argv"] for c in fake(DISTRACTOR_SAMPLES="0", BASELINES="base yarn")) == {}
    with pytest.raises(SettingsError, match="DISTRACTOR_SAMPLES='two' is not a whole number"):
        resolve("r.yaml", {"DISTRACTOR_SAMPLES": "two"})


def test_keep_going_runs_the_stages_a_failure_does_not_stop_and_still_exits_1(fake, tmp_path, capsys):
    calls = fake(want_rc=1, FAKE_FAIL="w/eval/yarn/needle", KEEP_GOING="1")
    tsv = stages_tsv(tmp_path)
    assert tsv["needle_yarn"] == "1" and "ppl_yarn" not in tsv  # its evaluation stops at the failure
    assert tsv["extended"] == "0" and tsv["needle_extended"] == "0" and tsv["summary"] == "0"
    assert not (tmp_path / "w" / "eval" / "yarn" / "done").exists()
    assert any("easy_context.eval.compare" in c["argv"] for c in calls)
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "error: extend r: stage needle_yarn failed (rc 1, log w/logs/needle_yarn.log): RuntimeError: attention "
        "kernel 'cudnn' cannot run here: it needs CUDA tensors"
    ]
    assert "done; results in" in captured.out and "but 1 stage failed (below)" in captured.out


def test_a_failed_stage_stops_the_run_with_one_line_naming_it_its_log_and_its_error(fake, tmp_path, capsys):
    """Without KEEP_GOING the first failure starts no further stage (those already running end) and the run exits
    1 with one line: the stage, its log, the last error line of its log."""
    calls = fake(want_rc=1, FAKE_FAIL="w/eval/base/needle ", FAKE_TRAIN_S="0.3")
    tsv = stages_tsv(tmp_path)
    assert tsv["needle_base"] == "1" and "needle3_base" not in tsv and "summary" not in tsv
    failed = next(c for c in calls if c["argv"][-1] == "w/eval/base/needle")
    late = [c["argv"][:2] for c in calls if c["t0"] > failed["t1"] + 0.5]
    assert not late, late  # nothing started after the failure
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "error: extend r: stage needle_base failed (rc 1, log w/logs/needle_base.log): RuntimeError: attention "
        "kernel 'cudnn' cannot run here: it needs CUDA tensors"
    ]
    assert "done" not in captured.out.splitlines()[-1]
    calls = fake(want_rc=0)[len(calls) :]  # the same command, the cause gone: continues (the base's needle again)
    assert any(c["argv"][-1] == "w/eval/base/needle" for c in calls) and stages_tsv(tmp_path)["summary"] == "0"


def test_the_control_trains_as_many_tokens_as_all_stages(fake, tmp_path):
    calls = fake(CONTROL="1", TRAIN="0")
    (control,) = trains(calls)
    assert control[control.index("--seq-length") + 1] == "32" and control[control.index("--model") + 1].endswith("base")
    assert control[control.index("--gradient-accumulate-every") + 1] == "2"  # TARGET / BASE_LENGTH rows a step
    assert control[control.index("--max-train-steps") + 1] == str(-(-(64 * 3 + 48 * 2) // 64))
    settings = resolve("r.yaml", {"STEPS": "10"})
    assert settings.control_step_count() == str(-(-(64 * 10 + 48 * 2) // 64))
    assert resolve("r.yaml", {"CONTROL_STEPS": "7"}).control_step_count() == "7"


def test_the_environment_beats_the_recipe(fake, tmp_path):
    s = resolve("r.yaml", {})
    assert (s.target, s.base_length, s.baselines, s.ruler, s.long, s.samples) == (64, 32, ["base", "yarn"], False,
                                                                                   "", "5")  # fmt: skip
    assert (s.factor, s.needle_max, s.parallel_mode, s.launch("py")) == ("2", "64", "", ["py"])
    s = resolve("r.yaml", {"TARGET": "128", "BASELINES": "", "RULER": "1", "LONG": "512", "SAMPLES": "2",
                           "NPROC": "2"})  # fmt: skip
    assert (s.target, s.baselines, s.ruler, s.long, s.long_samples, s.factor) == (128, [], True, "512", "2", "4")
    assert s.parallel_mode == "zigzag_ring_attn" and s.launch("py")[:3] == ["py", "-m", "easy_context.launch"]
    assert s.long_scaling_list() == ["none", "yarn:4:128"] and s.ruler_lengths_to(128) == "16,32,64,128"


def test_a_bad_recipe_or_baseline_is_one_line_naming_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE)
    with pytest.raises(SettingsError, match="unknown baseline 'yarm'.*BASELINES or the recipe's pipeline.baselines"):
        resolve("r.yaml", {"BASELINES": "base yarm"})
    (tmp_path / "bad.yaml").write_text("rope-theta: 1\npipeline: {base_length: 32}\n")
    with pytest.raises(SettingsError, match="sets no seq-length"):
        resolve("bad.yaml", {})
    (tmp_path / "bad.yaml").write_text("seq-length: 64\nrope-theta: 1\npipeline:\n  stages: [{seq-length: 32}]\n")
    with pytest.raises(SettingsError, match=r"stages\[0\].*max-train-steps"):
        resolve("bad.yaml", {"BASE_LENGTH": "32"})
    monkeypatch.setenv("BASELINES", "nope")
    assert pl.main([str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "unknown baseline 'nope'" in err
    assert pl.main([str(tmp_path / "missing.yaml")]) == 2
    assert "usage: bash train_scripts/extend.sh RECIPE.yaml" in capsys.readouterr().err


def test_the_optimizer_placement_decides_the_launch(fake, tmp_path):
    """OPTIM (the derived recipe's pipeline.optim): host_adamw a train.py flag; a ZeRO-3 placement a DeepSpeed launch
    config written into WORK (zero3_offload.json less the offloads it does not make), on any number of processes."""
    first = fake(OPTIM="host_adamw")
    (host,) = [t for t in trains(first) if "w/extended" in t]
    assert host[host.index("--optimizer") + 1] == "host_adamw" and host[0] == "train.py"  # one process: no launcher
    calls = fake(OPTIM="zero3_offload_optimizer", WORK="w2", DEVICE="cpu")[len(first) :]
    assert len(trains(calls)) == 2
    for train in trains(calls):
        config_file = str(tmp_path / "w2" / "launch" / "zero3_offload_optimizer.yaml")
        assert train[:4] == ["-m", "easy_context.launch", "--config_file", config_file]
        assert train[train.index("--num_processes") + 1] == "1" and train[train.index("--dtype") + 1] == "float32"
    config = json.loads((tmp_path / "w2" / "launch" / "zero3_offload_optimizer.json").read_text())["zero_optimization"]
    assert config["stage"] == 3 and "offload_optimizer" in config and "offload_param" not in config
    yaml_text = (tmp_path / "w2" / "launch" / "zero3_offload_optimizer.yaml").read_text()
    assert "distributed_type: DEEPSPEED" in yaml_text and "use_cpu: true" in yaml_text
    s = resolve("r.yaml", {"OPTIM": "zero3", "DEVICE": "cpu", "ACCELERATE_USE_CPU": "1"})
    with pytest.raises(SettingsError, match="OPTIM=zero3 launches through a DeepSpeed config; none was written"):
        s.launch("py")
    assert "ACCELERATE_USE_CPU" not in pl.child_env(s, {"ACCELERATE_USE_CPU": "1"})  # it would drop DeepSpeed
    with pytest.raises(SettingsError, match="OPTIM='zero4'.*one of ddp, host_adamw, zero3"):
        resolve("r.yaml", {"OPTIM": "zero4"})
    from easy_context.launch_configs import zero3_config

    with pytest.raises(ValueError, match="'ddp' is not a ZeRO-3 placement; one of zero3, zero3_offload_optimizer"):
        zero3_config("ddp", 1, tmp_path)


def test_only_train_runs_the_model_data_and_training_stages(fake, tmp_path):
    calls = fake(ONLY="train", CONTROL="1")
    assert [t[t.index("--seq-length") + 1] for t in trains(calls)] == ["48", "64"]  # no control with ONLY=train
    assert not any(c["argv"][:1] in (["eval_needle.py"], ["eval_ppl.py"], ["eval_ruler.py"]) for c in calls)
    assert set(stages_tsv(tmp_path)) == {"corpus", "data_48", "data_64", "stage1_48", "extended"}
    with pytest.raises(SettingsError, match="ONLY='evals'.*before.*train"):
        resolve("r.yaml", {"ONLY": "evals"})


def test_the_command_runs_a_recipe_or_derives_one(tmp_path, monkeypatch, capsys):
    from easy_context.extend import cli

    (tmp_path / "r.yaml").write_text(RECIPE)
    assert cli.main(["--recipe", str(tmp_path / "r.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage 1: 48 x 2 steps" in out and "main: 64 x 3 steps" in out and "optimizer ddp" in out
    ran = []
    monkeypatch.setattr(cli, "run_recipe", lambda path, micro=False: ran.append(path) or 0)
    assert cli.main(["--recipe", str(tmp_path / "r.yaml")]) == 0 and ran == [str(tmp_path / "r.yaml")]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--model", str(tmp_path / "m"), "--to", "1K"]) == 0  # derive, write, run what it wrote
    assert ran[1] == "out/extend_m_1K/recipe.yaml" and (tmp_path / ran[1]).is_file()
    from easy_context.extend.recipe import Recipe

    assert Recipe.load(ran[1]).model == str(tmp_path / "m")  # absolute: the pipeline runs from the checkout's root
    for argv in (["--recipe", "r.yaml", "--model", "m"], ["--model", "m"], []):
        with pytest.raises(SystemExit):
            cli.main(argv)
    assert "--recipe R.yaml" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("seq-length: 64\nrope-theta: 100000.0\npipeline: {base_length: 128}\n")
    with pytest.raises(SystemExit):
        cli.main(["--recipe", "bad.yaml"])  # a target at or below the base length
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "bad.yaml: recipe seq-length: 64 does not extend pipeline.base_length 128" in err and len(ran) == 2


def test_the_docs_commands_parse():
    """Every easy_context.extend command of docs/extension.md and the README parses with the command's flags."""
    import shlex

    from easy_context.extend import cli

    root = Path(__file__).resolve().parents[2]
    parsed = 0
    for doc in ("docs/extension.md", "README.md"):
        for line in (root / doc).read_text().replace("\\\n", " ").splitlines():
            if "python -m easy_context.extend " in line:
                words = shlex.split(line.split("#")[0].strip().strip("`"))
                args = cli.build_parser().parse_args(words[words.index("easy_context.extend") + 1 :])
                assert bool(args.recipe) != bool(args.model and args.to), line
                parsed += 1
    assert parsed >= 5


def test_stage_yarn_evaluates_the_last_stage_with_yarn_to_the_target_after_the_training(fake, tmp_path):
    """STAGE_YARN=1: the last stage's model (48 tokens) is evaluated with YaRN x1 (64 // 48) over its own length on
    the extended model's prompts, after every training run, and the summary is given it; a recipe without a stage
    shorter than its target is refused in one line."""
    calls = fake(STAGE_YARN="1")
    route = [c for c in calls if "w/eval/stage_yarn/needle" in c["argv"]]
    assert route and route[0]["argv"][route[0]["argv"].index("--model") + 1] == "w/stage1_48"
    assert route[0]["argv"][route[0]["argv"].index("--rope_scaling") + 1] == "yarn:1:48"
    last_train = max(c["t1"] for c in calls if "train.py" in c["argv"])
    early = [c["argv"][:2] for c in calls if "eval/stage_yarn" in " ".join(c["argv"]) and c["t0"] < last_train]
    assert not early, early
    summary = next(c["argv"] for c in calls if "easy_context.eval.compare" in c["argv"])
    assert any(a.startswith("stage_yarn=") and a.endswith("eval/stage_yarn") for a in summary)
    (tmp_path / "flat.yaml").write_text(RECIPE.split("  stages:")[0])
    with pytest.raises(SettingsError, match="STAGE_YARN"):
        resolve("flat.yaml", {"STAGE_YARN": "1", "MODEL": "base"})
