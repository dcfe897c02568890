#!/usr/bin/env bash
# The Gemma-3-270M 32K -> 256K extension on the H200 device: gpu_runs/h200_extend.sh with train_scripts/gemma3_256k.yaml
# (RECIPE=train_scripts/gemma3_1m.yaml: the 1M chain), calls as in its header: stash N, start, wait SECONDS,
# collect, speed. The payload: bash gpu_runs/make_payload.sh gemma3-270m (~315 MB, 7 parts of 43 MiB). The time plan
# of one 28-minute hold and the commands of each hold: docs/extension_gemma3.md.
set -uo pipefail
cd "$(dirname "$0")/.."
exec bash gpu_runs/h200_extend.sh "${RECIPE:-train_scripts/gemma3_256k.yaml}" "$@"
