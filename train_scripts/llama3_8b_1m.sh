#!/usr/bin/env bash
# Llama-3-8B to 1M tokens on 8 GPUs, 64K -> 256K -> 1M with growing RoPE base (shared settings: llama3_8b_1m.yaml).
# Extra flags after the script's name go to every stage.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-meta-llama/Meta-Llama-3-8B}
OUT=${OUT:-output/llama3-8b}
stage() {  # stage <from> <name> <seq> <rope_theta> <steps> [flags]
    accelerate launch --config_file accelerate_configs/single_node.yaml --mixed_precision bf16 \
        -m easy_context.train --config train_scripts/llama3_8b_1m.yaml ${DATA:+--dataset "$DATA"} \
        --model "$1" --output-dir "$OUT/$2" --seq-length "$3" --rope-theta "$4" --max-train-steps "$5" "${@:6}"
}
stage "$BASE"       64k  65536   8000000    300 "$@"
stage "$OUT/64k"    256k 262144  64000000   200 "$@"
stage "$OUT/256k"   1m   1048576 500000000  100 "$@"
