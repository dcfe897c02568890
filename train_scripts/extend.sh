#!/usr/bin/env bash
# Extend a real pretrained model's context on one GPU (or N), shown against the training-free baselines on the same
# prompts: one recipe for any model. Everything model-specific comes from the recipe, a YAML file: train.py's flags
# of the main stage at the top (seq-length: the target length, rope-theta: the RoPE base trained with), and under
# `pipeline:` the rest (the model to fetch, the base length, baselines, stages before the main one, evaluation
# lengths; `micro:` inside it: the CPU check's values). An environment variable of the same name, upper case, wins
# over the recipe (TARGET, THETA, BASE_LENGTH, BASELINES, NEEDLE_STEP, ...). Recipes: train_scripts/smollm2_64k.yaml,
# gemma3_256k.yaml, gemma3_1m.yaml.
#   bash train_scripts/extend.sh RECIPE.yaml [train.py flags for every training run]
# The pipeline is easy_context/extend/pipeline.py (its stages, their settings and defaults: easy_context/extend/):
# model (MODEL, FETCH, WHEELS), data, the evaluations before (BASELINES) beside the training, the recipe's stages and
# the main one (TRAIN, STEPS, TRAIN_CHUNK_S: resumable device calls), the control (CONTROL), TARGET2, the evaluations
# after (LONG*, RULER*, EVAL_PARTIAL; RULER_TASKS: default RULER's tasks that separate training from free scaling, for
# every model), STAGE_YARN (the last stage + YaRN to the target: the cheap trained route, on the same prompts), summary
# (the gain over the best training-free baseline, and over STAGE_YARN's route). Each stage is skipped when its output is in
# WORK, so the same command again continues. N GPUs: NPROC=N (PARALLEL_MODE); OPTIM: ddp, host_adamw or a ZeRO-3 placement (zero3,
# zero3_offload_optimizer, zero3_offload). ONLY=before stops after the before-evaluations, ONLY=train after the
# training stages. PY: the interpreter (default .venv/bin/python, else python3). A failed stage stops the run (no
# stage starts after it) and exits 1 with one line naming it, its log and its error; KEEP_GOING=1 runs the stages
# that do not need it and still exits 1. A kernel this machine cannot run (KERNEL, KERNEL_FALLBACK, EVAL_KERNEL; a
# CUDA one without a GPU: DEVICE=cpu) is refused before any stage.
# CPU check of every stage on a tiny random model of the recipe's architecture (numbers meaningless):
#   DEVICE=cpu MICRO=1 bash train_scripts/extend.sh train_scripts/gemma3_256k.yaml
set -uo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:-${RECIPE:-}}
if [ -z "$RECIPE" ] || [ ! -f "$RECIPE" ]; then
    echo "usage: bash train_scripts/extend.sh RECIPE.yaml [train.py flags] (no recipe file '$RECIPE')" >&2
    exit 2
fi
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
export PY
[ $# -gt 0 ] && shift
exec "$PY" -m easy_context.extend.pipeline "$RECIPE" "$@"
