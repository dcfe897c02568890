"""Recipes (``--config recipe.yaml``), the run record (``run_config.json``), the resume check, ``--tracker``, and the
shipped recipes in train_scripts/ (their launch lines parse and their layouts fit the GPUs they name)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from easy_context.sp_config import sp_config_for
from easy_context.train import TRACKERS, backend_options, build_parser, check_layout, check_tracker, parse_args
from easy_context.training import recipe
from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

TINY = """\
model: tiny-llama
dataset: random:16
vocab-size: 256
output_dir: {out}
seq-length: 64
batch_size: 1
gradient-accumulate-every: 1
max-train-steps: 2
learning-rate: 1e-3
adam-betas: [0.9, 0.95]
dtype: float32
checkpointing: none
parallel_mode: zigzag_ring_attn
save-every: 2
no-save: true
"""


def write_recipe(tmp_path: Path, text: str, name: str = "recipe.yaml") -> str:
    path = tmp_path / name
    path.write_text(text.format(out=tmp_path / "out"))
    return str(path)


def usage_error(capsys, argv: list[str]) -> str:
    """The one-line usage error ``parse_args(argv)`` exits with."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_yaml_recipe_trains_on_two_processes_records_its_run_and_refuses_a_changed_resume(tmp_path):
    """``accelerate launch -m easy_context.train --config recipe.yaml``: 2 steps of 2-process zigzag on random tokens;
    the output dir holds run_config.json (every flag, versions, git revision) and a state a resumed run with another
    --seq-length may not continue."""
    config = write_recipe(tmp_path, TINY)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
              "-m", "easy_context.train", "--config", config]  # fmt: skip
    res = run_job(launch, cwd=ROOT, env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "out"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    record = json.loads((out / "run_config.json").read_text())
    args = record["args"]
    assert (args["seq_length"], args["parallel_mode"], args["adam_betas"], args["config"]) == (
        64, "zigzag_ring_attn", [0.9, 0.95], config)  # fmt: skip
    assert args["learning_rate"] == 1e-3 and args["kernel"] == "auto"  # a default, resolved
    assert record["launch"]["processes"] == 2 and record["launch"]["sp_size"] == 2
    assert {"torch", "transformers", "accelerate", "easy_context"} <= {k for k, v in record["versions"].items() if v}
    assert record["git"] is None or re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"])
    assert record["command"][:3] == ["train.py", "--config", config]

    state = out / "state-step2"
    assert json.loads((state / "easy_context_state.json").read_text())["config"] == record  # each state holds it
    resume = [zygote.python(), "-m", "easy_context.train", "--config", config, "--resume-from", str(state)]
    res = subprocess.run([*resume, "--seq-length", "128", "--max-train-steps", "3"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 1
    assert "--seq-length 64 -> 128" in res.stderr, res.stderr[-2000:]
    assert str(state / "easy_context_state.json") in res.stderr  # the record the state holds
    # the same recipe with more steps may resume it; the record is also a recipe that repeats the run's flags
    assert recipe.resume_mismatch(parse_args([*resume[3:], "--max-train-steps", "3"]), state) is None
    again = parse_args(["--config", str(out / "run_config.json")])
    assert {k: v for k, v in vars(again).items() if k != "config"} == {k: v for k, v in args.items() if k != "config"}


def test_command_line_overrides_the_recipe(tmp_path):
    config = write_recipe(tmp_path, TINY)
    args = parse_args(["--config", config])
    assert (args.seq_length, args.adam_betas, args.parallel_mode, args.no_save) == (64, [0.9, 0.95], "zigzag_ring_attn",
                                                                                    True)  # fmt: skip
    assert (args.learning_rate, args.vocab_size, args.output_dir) == (1e-3, 256, str(tmp_path / "out"))
    args = parse_args(["--seq_length", "128", "--config", config, "--adam-betas", "0.8", "0.9", "--parallel-mode",
                       "ulysses_attn", "--output-dir", "elsewhere"])  # fmt: skip
    got = (args.seq_length, args.adam_betas, args.parallel_mode, args.output_dir)
    assert got == (128, [0.8, 0.9], "ulysses_attn", "elsewhere")
    assert args.max_train_steps == 2 and args.warmup_steps == 20  # from the file; the default where neither says


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("seq-len: 64", "unknown key 'seq-len' (did you mean 'seq-length'?)"),
        ("learning_rat: 0.1", "unknown key 'learning_rat' (did you mean 'learning-rate'?)"),
        ("zzz: 1", "unknown key 'zzz' (see "),
        ("config: other.yaml", "'config' is a command-line flag, not a recipe key"),
        ("dtype: float16", "dtype: 'float16' is not one of bfloat16, float32"),
        ("max-train-steps: many", "max-train-steps: invalid value 'many'"),
        ("gradient-accumulate-every: 0", "gradient-accumulate-every: invalid value 0: must be an integer >= 1, got 0"),
        ("no-save: 3", "no-save: expected true or false, got 3"),
        ("adam-betas: 0.9", "adam-betas: expected a list, got 0.9"),
        ("adam-betas: [0.9]", "adam-betas: expected 2 values, got [0.9]"),
        ("seq-length: [1, 2]", "seq-length: expected one value, got [1, 2]"),
    ],
)
def test_a_bad_recipe_key_or_value_is_one_line_naming_it(tmp_path, capsys, line, message):
    config = write_recipe(tmp_path, TINY + line + "\n")
    error = usage_error(capsys, ["--config", config])
    assert f"--config {config}: {message}" in error, error


def test_unreadable_recipes(tmp_path, capsys):
    assert "no-such.yaml" in usage_error(capsys, ["--config", str(tmp_path / "no-such.yaml")])
    assert "not valid YAML" in usage_error(capsys, ["--config", write_recipe(tmp_path, "a: [1,\n")])
    assert "expected a mapping" in usage_error(capsys, ["--config", write_recipe(tmp_path, "- a\n- b\n")])
    assert parse_args(["--conf", write_recipe(tmp_path, TINY)]).seq_length == 64  # an abbreviation reads it too


def test_resume_refuses_another_model_or_length(tmp_path):
    out = tmp_path / "out"
    state = out / "state-step4"
    state.mkdir(parents=True)
    config = write_recipe(tmp_path, TINY)
    assert recipe.resume_mismatch(parse_args(["--config", config]), state) is None  # nothing recorded: no check
    recipe.write_run_config(out, recipe.run_record(parse_args(["--config", config])))
    assert recipe.resume_mismatch(parse_args(["--config", config, "--learning-rate", "1"]), state) is None
    changed = parse_args(["--config", config, "--model", "tiny-mistral", "--parallel_mode", "ulysses_attn"])
    message = recipe.resume_mismatch(changed, state)
    assert "--model tiny-llama -> tiny-mistral" in message and "parallel_mode" not in message  # a backend may change
    assert "--seq-length" not in message and str(out / "run_config.json") in message


def test_tracker_takes_every_accelerate_tracker_and_names_them(capsys):
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    assert set(LOGGER_TYPE_TO_CLASS) <= set(TRACKERS) and {"none", "all"} <= set(TRACKERS)
    error = usage_error(capsys, ["--model", "tiny-llama", "--dataset", "random", "--vocab-size", "8",
                                 "--output-dir", "o", "--tracker", "wandbb"])  # fmt: skip
    assert "invalid choice: 'wandbb'" in error
    assert all(f"'{name}'" in error for name in LOGGER_TYPE_TO_CLASS), error
    available = {t.value for t in get_available_trackers()}
    missing = sorted(set(LOGGER_TYPE_TO_CLASS) - available)
    if missing:
        assert check_tracker(missing[0]) == f"--tracker {missing[0]} needs the {missing[0]} package: " + (
            f"pip install {missing[0]}"
        )
    for name in sorted(available - {"wandb"}):  # installed: accepted
        assert check_tracker(name) is None


RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
# the attention heads (query, KV) of each recipe's model, for its layout check on the GPUs it launches on
HEADS = {"EasyContext-1M-Llama-2-7B.sh": (32, 32), "danube2_256k.sh": (32, 8), "llama3_8b_1m.sh": (32, 8)}


def recorded_runs(tmp_path: Path, script: str) -> list[list[str]]:
    """The commands ``bash train_scripts/<script>`` runs, with ``accelerate`` and ``python`` recording their
    arguments instead of running."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("accelerate", "python"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    record = tmp_path / f"{script}.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DATA", "OUT", "BASE", "CFG", "PY")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD=str(record))
    res = subprocess.run(["bash", str(ROOT / "train_scripts" / script), "--save-every", "50"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("script", sorted(HEADS))
def test_shipped_recipes_parse_and_fit_their_gpus(tmp_path, monkeypatch, script):
    """Each train_scripts/ recipe (a YAML file plus its launch lines): every launch parses, extra flags after the
    script's name reach every stage, and each stage's length and layout pass the backend's check on 8 GPUs."""
    assert {p.name for p in (ROOT / "train_scripts").glob("*.sh")} == {*HEADS, "demo_cpu.sh", "demo_h200.sh",
                                                                         "extend.sh", "extend_smollm2.sh",
                                                                         "slurm_requeue.sh"}  # fmt: skip
    # (the demos and the extension recipe: tests/e2e/test_gemma_recipe.py runs the latter; the SLURM example:
    # tests/e2e/test_preemption.py)
    monkeypatch.chdir(ROOT)  # the scripts run from the checkout's root
    calls = recorded_runs(tmp_path, script)
    stages = []
    for call in calls:
        if call[0] != "accelerate":
            continue
        assert call[1:5] == ["launch", "--config_file", "accelerate_configs/single_node.yaml", "--mixed_precision"]
        train_argv = call[call.index("easy_context.train") + 1 :]
        args = recipe.parse_args_with_recipe(build_parser(), train_argv)  # no tracker check: wandb needs no install
        assert args.config.startswith("train_scripts/") and args.config.endswith(".yaml") and args.save_every == 50
        heads, kv_heads = HEADS[script]
        sp = sp_config_for(args.parallel_mode, 8, kernel=args.kernel, **backend_options(args))  # 8 GPUs
        check_layout(args, sp, SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads))
        stages.append(args)
    if script == "EasyContext-1M-Llama-2-7B.sh":  # EasyContext's 7 stages, each from the previous one's model
        assert [a.seq_length for a in stages] == [32768, 65536, 256000, 256000, 256000, 512000, 512000]
        assert [a.rope_theta for a in stages] == [1e6, 5e6, 1e7, 2.5e7, 5e7, 1e8, 2.5e8]
        assert [a.parallel_mode for a in stages] == ["data_parallel"] * 2 + ["zigzag_ring_attn"] * 5
        assert [a.seed for a in stages] == [42, 2022, 2023, 2024, 2025, 2026, 2027]
        assert [a.learning_rate for a in stages] == [2e-5] * 6 + [1e-5]
        assert all(b.model == a.output_dir for a, b in zip(stages, stages[1:]))
        assert (stages[0].adam_betas, stages[0].weight_decay, stages[0].wandb) == ([0.9, 0.95], 0.1, "EasyContext")
        final = calls[-1]  # the RoPE base of 1B written into the last stage's config
        assert final[0] == "python" and "set_rope_theta(c, 1e9)" in final[2] and final[3] == stages[-1].output_dir
    if script == "llama3_8b_1m.sh":
        assert [a.seq_length for a in stages] == [65536, 262144, 1048576] and stages[0].ring_degree == 2
    if script == "danube2_256k.sh":
        assert len(stages) == 1 and stages[0].seq_length == 262144 and stages[0].model == "h2oai/h2o-danube2-1.8b-base"


def test_extend_smollm2_recipe_parses():
    """The SmolLM2 extension's YAML (train_scripts/smollm2_64k.yaml, its pipeline: section ignored) parses with
    train.py's flags as extend.sh passes them, and holds the recipe docs/extension_smollm2.md reports (64K, RoPE base
    1e7, lr 1e-4 cosine, 350 steps)."""
    args = parse_args(["--config", str(ROOT / "train_scripts" / "smollm2_64k.yaml"), "--model", "m", "--dataset",
                       "d", "--output-dir", "o", "--kernel", "fa4", "--time-limit", "540", "--compile"])  # fmt: skip
    assert (args.seq_length, args.rope_theta, args.learning_rate, args.lr_schedule) == (65536, 1e7, 1e-4, "cosine")
    assert (args.parallel_mode, args.checkpointing, args.dtype, args.max_train_steps) == (
        "data_parallel",
        "none",
        "float32",
        350,
    )
