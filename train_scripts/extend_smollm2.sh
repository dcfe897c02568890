#!/usr/bin/env bash
# Extend a real pretrained model, SmolLM2-135M-Instruct (8K, RoPE base 1e5), to 64K on ONE GPU, shown against the
# training-free baselines on the same prompts: train_scripts/extend.sh with the recipe train_scripts/smollm2_64k.yaml
# (its header lists the stages and every setting; an environment variable overrides the recipe's value: STEPS,
# TARGET2, CONTROL, LONG, RULER_SAMPLES, ...). WORK defaults to out/extend_smollm2.
# On the H200 (no network there: the wheels are carried, docs/extension_smollm2.md):
#   WORK=/root/ext RESULTS=$OUT WHEELS=/root/wheels bash train_scripts/extend_smollm2.sh
# CPU micro check of every stage (numbers meaningless): DEVICE=cpu MICRO=1 bash train_scripts/extend_smollm2.sh
set -uo pipefail
exec bash "$(dirname "$0")/extend.sh" "$(dirname "$0")/smollm2_64k.yaml" "$@"
