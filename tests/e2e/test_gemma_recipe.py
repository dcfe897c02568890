"""The one recipe for any model (train_scripts/extend.sh + a YAML per model) and a CPU miniature of its Gemma 3 recipe.

* What extend.sh runs for each shipped recipe, with ``python`` recording its arguments instead of running: the model
  fetched by name, each baseline's RoPE flags, the progressive stages (each from the previous one's model), the launch
  on N processes with the chosen backend; every training command parses with train.py's flags.
* The miniature (tests/SLOW_TESTS.md: its time): every stage of the program on the recipe's ``micro:`` values, a tiny
  Gemma 3 of the real model's layer pattern (5 sliding-window layers + 1 global, two RoPE bases, 4 query / 1 KV heads)
  on 2 CPU processes under Ulysses: data, evaluations before and after, both stages, the needle beyond, the summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from easy_context.extend.micro import CAVEAT
from easy_context.train import build_parser
from easy_context.training import recipe
from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"smollm2_64k.yaml": (8192, 65536), "gemma3_256k.yaml": (32768, 262144), "gemma3_1m.yaml": (32768, 1048576)}

RECORDER = """#!{python}
import json, os, sys
if sys.argv[1:3] == ["-m", "easy_context.extend.pipeline"]:  # extend.sh's launch of the pipeline: the real one,
    os.execv({pipeline!r}, [{pipeline!r}, *sys.argv[1:]])  # forked from the zygote (its imports take ~9 s)
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:2] == ["-c"]:  # the probe for flash-attn-4: not here
    sys.exit(1)
if "train.py" in sys.argv:  # a training run: its model folder, every step logged
    out = sys.argv[sys.argv.index("--output-dir") + 1]
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "config.json"), "w").write("{{}}")
    open(os.path.join(out, "metrics.jsonl"), "w").write(json.dumps({{"step": 10**9}}) + "\\n")
"""


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_yaml_parses_with_train_flags_and_its_stages_too(name):
    """train.py reads the recipe (its pipeline: section ignored); each stage's flags parse over it; the pipeline's
    settings name the base and target lengths."""
    path = str(ROOT / "train_scripts" / name)
    base, target = RECIPES[name]
    fixed = ["--model", "m", "--dataset", "d", "--output-dir", "o"]
    args = recipe.parse_args_with_recipe(build_parser(), ["--config", path, *fixed])
    assert args.seq_length == target and args.rope_theta and args.dtype == "float32"
    data = recipe.load_recipe(path)
    for micro in (False, True):
        settings = recipe.pipeline_settings(data, micro=micro)
        assert settings["fetch"] in ("smollm2-135m", "gemma3-270m") and settings["base_length"] < settings["target"]
        for stage in settings.get("stages") or []:
            stage_argv = recipe.recipe_argv(build_parser(), stage, path)
            stage_args = recipe.parse_args_with_recipe(build_parser(), ["--config", path, *fixed, *stage_argv])
            assert stage_args.seq_length < settings["target"] and stage_args.max_train_steps >= 1
    settings = recipe.pipeline_settings(data)
    assert (settings["base_length"], settings["target"]) == (base, target)


def test_pipeline_key_is_not_a_flag_but_must_be_a_mapping(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("seq-length: 64\npipeline:\n  base_length: 32\n  stages:\n"
                    "    - {seq-length: 32, max-train-steps: 2}\n")  # fmt: skip
    args = recipe.parse_args_with_recipe(build_parser(), ["--config", str(path), "--model", "m", "--dataset", "d",
                                                          "--output-dir", "o"])  # fmt: skip
    assert args.seq_length == 64
    shell = recipe.pipeline_shell(recipe.load_recipe(str(path)))
    assert '[ -n "${TARGET+set}" ] || TARGET=64' in shell and "BASE_LENGTH=32" in shell
    assert "STAGE_SEQ+=(32) STAGE_STEPS+=(2) STAGE_FLAGS+=('--seq-length=32 --max-train-steps=2')" in shell
    path.write_text("seq-length: 64\npipeline: 3\n")
    with pytest.raises(SystemExit):
        recipe.parse_args_with_recipe(build_parser(), ["--config", str(path), "--model", "m", "--dataset", "d",
                                                       "--output-dir", "o"])  # fmt: skip
    assert "pipeline: expected a mapping of settings, got 3" in capsys.readouterr().err


def clean_env() -> dict[str, str]:
    """None of this shell's settings of extend.sh (NPROC, KERNEL, ...): PATH, HOME, LANG, TMPDIR, and what the zygote
    needs to fork the pipeline rather than start a fresh interpreter."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return zygote.forkable_env(keep)


def extend_commands(tmp_path: Path, recipe_name: str, script: str = "extend.sh", **env) -> list[list[str]]:
    """The commands ``bash train_scripts/<script> <recipe>`` runs (python recording its arguments), with every
    stage's data already in place (packed with MODEL's tokenizer, WORK/base) so each training command is issued; each
    stage's "done" check passes."""
    from easy_context.extend.fingerprint import mark_done

    work = tmp_path / "work"
    data = recipe.pipeline_settings(recipe.load_recipe(str(ROOT / "train_scripts" / recipe_name)))
    lengths = [s["seq-length"] for s in data.get("stages") or []] + [data["target"], data["base_length"]]
    lengths += [int(env["TARGET2"])] if "TARGET2" in env else []
    for n in lengths:
        (work / f"data_{n}").mkdir(parents=True, exist_ok=True)
        (work / f"data_{n}" / "dataset_info.json").write_text("{}")
        mark_done(str(work / f"data_{n}.done"), str(work / "base"), tokenizer=True)
    (work / "code.jsonl").write_text("")
    python = tmp_path / "python"
    python.write_text(RECORDER.format(python=sys.executable, pipeline=zygote.python()))
    python.chmod(0o755)
    record = tmp_path / "record.jsonl"
    env = {**clean_env(), "PY": str(python), "RECORD": str(record), "ROOT": str(ROOT), "WORK": str(work), **env}
    args = [] if script != "extend.sh" else [f"train_scripts/{recipe_name}"]
    res = subprocess.run(["bash", f"train_scripts/{script}", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def train_calls(calls: list[list[str]]) -> list[tuple[list[str], object]]:
    """(launcher prefix, parsed train.py args) of each training command."""
    out = []
    for call in calls:
        if "train.py" in call:
            at = call.index("train.py")
            out.append((call[:at], recipe.parse_args_with_recipe(build_parser(), call[at + 1 :])))
    return out


def test_extend_runs_the_gemma_recipe_on_one_gpu(tmp_path):
    calls = extend_commands(tmp_path, "gemma3_256k.yaml")
    work = tmp_path / "work"
    assert ["-m", "easy_context.models.fetch", "gemma3-270m", "--dest", str(work / "base")] in calls
    needles = {c[c.index("--output-dir") + 1].split("/eval/")[1]: " ".join(c)
               for c in calls if c[:1] == ["eval_needle.py"]}  # fmt: skip
    assert "--rope_theta 20000000" in needles["rope_theta/needle"]
    assert "--rope_scaling linear:8 " in needles["linear/needle"]
    assert "--rope_scaling dynamic:8:32768" in needles["dynamic_ntk/needle"]
    assert "--rope_scaling yarn:8:32768" in needles["yarn/needle"]
    assert "--min_context_length 32768 --max_context_length 262144 --context_interval 32768" in needles["base/needle"]
    assert "--num_samples 5" in needles["base/needle"]
    long = needles["extended/long_yarn_4_262144"]
    assert "--rope_scaling yarn:4:262144" in long and "--min_context_length 524288 --max_context_length 1048576" in long
    assert "--context_interval 524288 --num_samples 2" in long and "extended/long_none" in needles
    stages = train_calls(calls)
    assert [a.seq_length for _, a in stages] == [131072, 262144]  # 128K, then 256K from its model; no control
    (p1, s1), (p2, s2) = stages
    assert p1 == [] and p2 == []  # one process: train.py itself
    assert (s1.model, s2.model) == (str(work / "base"), str(work / "stage1_131072"))
    assert (s1.checkpointing, s1.max_train_steps, s1.time_limit, s1.warmup_steps) == ("attn", 60, 270, 8)
    assert (s2.checkpointing, s2.max_train_steps, s2.time_limit, s2.warmup_steps) == ("attn-global", 40, 600, 4)
    assert s1.rope_theta == s2.rope_theta == 2e7 and s2.parallel_mode == "data_parallel" and s2.compile
    assert s2.kernel == "auto"  # no fa4 here: the recipe's fallback (cuDNN cannot compute window blocks)
    summary = next(c for c in calls if c[:2] == ["-m", "easy_context.eval.compare"])
    assert "--base-length" in summary and summary[summary.index("--target-length") + 1] == "262144"


def evaluations(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[:1] in (["eval_needle.py"], ["eval_ppl.py"], ["eval_ruler.py"])]


def test_evaluations_attend_through_the_training_kernel(tmp_path):
    """Every evaluation names the kernel the training used: a named kernel routes even one process through
    easy_context's attention, so the model's own (length x length) masks, which for Gemma's sliding-window layers do
    not fit past ~100K tokens (an H200 run ran out of memory so), are never built."""
    for kernel in ("fa4", "cudnn"):
        calls = extend_commands(tmp_path / kernel, "gemma3_256k.yaml", KERNEL=kernel, RULER="1")
        evals = evaluations(calls)
        assert {c[0] for c in evals} == {"eval_needle.py", "eval_ppl.py", "eval_ruler.py"}
        assert all(c[c.index("--kernel") + 1] == kernel for c in evals), [c for c in evals if "--kernel" not in c]
        assert {a.kernel for _, a in train_calls(calls)} == {kernel}
    calls = extend_commands(tmp_path / "own", "gemma3_256k.yaml", KERNEL="fa4", EVAL_KERNEL="auto")
    assert all(c[c.index("--kernel") + 1] == "auto" for c in evaluations(calls))  # on request: the model's own


def test_extend_launches_n_processes_with_the_chosen_backend_and_the_control(tmp_path):
    calls = extend_commands(tmp_path, "gemma3_256k.yaml", NPROC="4", PARALLEL_MODE="ulysses_attn", CONTROL="1",
                            BASELINES="base")  # fmt: skip
    stages = train_calls(calls)
    assert [a.seq_length for _, a in stages] == [131072, 262144, 32768]
    for prefix, args in stages:
        assert prefix[:2] == ["-m", "easy_context.launch"] and prefix[prefix.index("--num_processes") + 1] == "4"
        assert args.parallel_mode == "ulysses_attn"
    control = stages[-1][1]  # the 256K stage's recipe at 32K from the base model, 8 rows a step, both stages' tokens
    assert control.model.endswith("/base") and control.gradient_accumulate_every == 8
    assert control.max_train_steps == (60 * 131072 + 40 * 262144) // 262144
    # Gemma's 4 query heads do not split 8 ways: refused before any stage, in one line naming the fix
    res = subprocess.run(["bash", "train_scripts/extend.sh", "train_scripts/gemma3_256k.yaml"], cwd=ROOT,
                         env={**clean_env(), "PY": zygote.python(), "NPROC": "8", "PARALLEL_MODE": "ulysses_attn",
                              "WORK": str(tmp_path / "r")},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "4 query heads are not divisible by the Ulysses degree 8" in res.stderr
    assert res.stderr.count("\n") == 1 and not (tmp_path / "r" / "results").exists()
    # NPROC alone keeps the recipe's backend (its top-level parallel_mode, one place); PARALLEL_MODE changes it
    same = train_calls(extend_commands(tmp_path / "d", "gemma3_256k.yaml", NPROC="2", TRAIN="0", CONTROL="1"))
    assert [(a.seq_length, a.parallel_mode) for _, a in same] == [(32768, "data_parallel")]  # TRAIN=0: control
    zigzag = train_calls(extend_commands(tmp_path / "z", "gemma3_256k.yaml", NPROC="2", TRAIN="0", CONTROL="1",
                                         PARALLEL_MODE="zigzag_ring_attn"))  # fmt: skip
    assert [(a.seq_length, a.parallel_mode) for _, a in zigzag] == [(32768, "zigzag_ring_attn")]


def test_extend_smollm2_is_the_recipe_of_one_model(tmp_path):
    calls = extend_commands(tmp_path, "smollm2_64k.yaml", script="extend_smollm2.sh", TARGET2="131072")
    assert ["-m", "easy_context.models.fetch", "smollm2-135m", "--dest", str(tmp_path / "work" / "base")] in calls
    stages = train_calls(calls)
    assert [a.seq_length for _, a in stages] == [65536, 8192, 131072]  # extended, control, the second stage
    ext, control, second = (a for _, a in stages)
    assert (ext.rope_theta, ext.learning_rate, ext.max_train_steps, ext.kernel) == (1e7, 1e-4, 350, "cudnn")
    assert control.gradient_accumulate_every == 8 and control.max_train_steps == 350
    assert second.model.endswith("/extended") and second.learning_rate == 3e-5 and second.max_train_steps == 60


def test_gemma_1m_recipe_chains_its_stages_to_1m(tmp_path):
    stages = train_calls(extend_commands(tmp_path, "gemma3_1m.yaml"))
    assert [a.seq_length for _, a in stages] == [131072, 262144, 1048576]
    assert all(b.model.endswith(f"stage{i + 1}_{a.seq_length}") for i, ((_, a), (_, b)) in
               enumerate(zip(stages, stages[1:])))  # fmt: skip
    assert {a.rope_theta for _, a in stages} == {2.5e8}


def test_micro_pipeline_end_to_end(tmp_path):
    """Every stage of the program on the Gemma recipe's miniature (its ``micro:`` values: a tiny Gemma 3 of the real
    layer pattern, 5 sliding-window layers + 1 global, two RoPE bases, 4 query / 1 KV heads), 2 processes under
    Ulysses: model, data, the before-evaluations (base, YaRN) beside the training, the 512-token stage (the recipe's
    attn checkpointing), the 1024-token stage from its model (attn-global), the after-evaluations, RULER's separating
    tasks for every model, the needle beyond (the base with YaRN at the full factor beside the extended model), the
    summary with the baselines and the gain over the best of them. The extended model's global layers carry the
    recipe's base, its sliding ones keep theirs."""
    env = {**os.environ, "DEVICE": "cpu", "MICRO": "1", "NPROC": "2", "PARALLEL_MODE": "ulysses_attn",
           "BASELINES": "base yarn", "WORK": str(tmp_path / "w"), "PY": zygote.python(),
           "NEEDLE_STEP": "768", "PPL_SAMPLES": "2",  # needles at 256 and 1024: every stage, fewer prompts
           "CORPUS_CHARS": "3e5", "NUM_PROC": "1",  # ~175K tokens, packed in-process: rows for 4 one-row steps
           "OMP_NUM_THREADS": "1"}  # fmt: skip  # training beside the evaluations: 2 threads each thrash 2 cores
    res = run_job(["bash", "train_scripts/extend.sh", "train_scripts/gemma3_256k.yaml"], cwd=ROOT, env=env,
                  timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    work, results = tmp_path / "w", tmp_path / "w" / "results"
    stages = dict(line.split("\t")[:2] for line in (results / "stages.tsv").read_text().splitlines())
    assert all(rc == "0" for rc in stages.values()), stages
    assert {"model", "data_512", "data_1024", "needle_base", "ppl_base", "needle3_base", "prompts_base", "needle_yarn",
            "stage1_512", "extended", "needle_extended", "ppl_extended", "needle3_extended", "prompts_extended",
            "needle_long_extended_none", "needle_long_extended_yarn_2_1024", "summary", "card", "needle3_yarn",
            "needle_long_base_yarn_8_256", "ruler_base", "ruler_yarn", "ruler_extended"} <= set(stages)  # fmt: skip
    for name, seq, checkpointing in (("stage1_512", 512, "attn"), ("extended", 1024, "attn-global")):
        record = json.loads((work / name / "run_config.json").read_text())
        assert record["launch"]["processes"] == 2 and record["args"]["parallel_mode"] == "ulysses_attn"
        assert record["args"]["seq_length"] == seq and record["args"]["checkpointing"] == checkpointing
    config = json.loads((work / "extended" / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["layer_types"][5] == "full_attention"
    thetas = {k: v["rope_theta"] for k, v in config["rope_parameters"].items()}
    assert thetas == {"full_attention": 4e6, "sliding_attention": 1e4}  # the global layers' base raised only
    summary = json.loads((results / "summary.json").read_text())
    assert {"base", "yarn", "extended"} <= set(summary["models"])
    assert list(summary["training_stages"]) == ["stage1_512", "extended"]
    assert summary["training_stages"]["stage1_512"]["tokens"] == 3 * 512 and summary["training"]["steps"] == 4
    assert summary["training_free_baselines"] == ["base", "yarn"]
    separating = ("niah_multikey_1", "niah_multivalue", "vt", "fwe")
    cells = {(r["task"], r["length"]): r for r in summary["gain_over_best_baseline"] if r["model"] == "extended"}
    expected = {*((t, n) for t in separating for n in (512, 1024)), ("needle", 256), ("needle", 1024),
                ("needle, 3 distractors", 1024), ("needle beyond (yarn:2:1024)", 2048)}  # fmt: skip
    assert expected <= set(cells)
    for task, length in expected:  # the gain against the baselines' own scores in the same summary
        row, models = cells[(task, length)], summary["models"]
        if task in separating:
            free = {m: models[m]["ruler"]["scores"][task][str(length)] for m in ("base", "yarn")}
            score = models["extended"]["ruler"]["scores"][task][str(length)]
        elif task.startswith("needle beyond"):
            free = {"base (yarn:8:256)": models["base"]["needle_long"]["yarn:8:256"]["by_length"][str(length)]}
            score = models["extended"]["needle_long"]["yarn:2:1024"]["by_length"][str(length)]
        else:
            key = "needle" if task == "needle" else "needle_3_distractors"
            free = {m: models[m][key]["by_length"][str(length)] for m in ("base", "yarn")}
            score = models["extended"][key]["by_length"][str(length)]
        assert row["best_baseline_score"] == pytest.approx(max(free.values())) and row["best_baseline"] in free
        assert row["gain"] == pytest.approx(score - max(free.values()), abs=1e-4)
    md = (results / "summary.md").read_text()
    lines = md.splitlines()
    assert lines[0] == f"# {CAVEAT}" and summary["caveat"] == CAVEAT  # a miniature says so first
    assert lines[2] == "# Gain of training over the best of 2 training-free baselines on the same prompts (base, yarn)"
    assert "| task | length | model | score | best training-free baseline | its score | gain |" in lines
    assert any(line.startswith("| base | ") for line in lines) and any(line.startswith("| yarn | ") for line in lines)
    for task in separating:
        assert any(line.startswith(f"| {task} | 1K | extended | ") and line.endswith(" |") for line in lines)
        assert all(any(line.startswith(f"| {task} | {m} | ") for line in lines) for m in ("base", "yarn", "extended"))
    assert any(line.startswith("| needle beyond (yarn:2:1024) | 2K | extended |") and "| base (yarn:8:256)" in line
               for line in lines)  # fmt: skip
    card = (work / "extended" / "README.md").read_text().splitlines()  # the model card (tests/unit/test_model_card.py)
    assert card[0] == "---" and "context_length: 1024" in card and "| stage1_512 | 512 | 3 | 1,536 |" in "\n".join(card)
    assert [line for line in card if line.startswith("| vt | 1K | extended | ")] == [
        line for line in lines if line.startswith("| vt | 1K | extended | ")
    ]
    assert (results / "comparison.png").stat().st_size > 10_000 and (results / "logs.tgz").is_file()
    assert "extend gemma3_256k-micro: done" in res.stdout
