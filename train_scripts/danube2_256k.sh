#!/usr/bin/env bash
# H2O-Danube2-1.8B to 256K on 8 GPUs: the recipe danube2_256k.yaml, launched with DeepSpeed ZeRO-3 offload.
# MODEL / DATA / OUT override the recipe's model, dataset and output dir; extra flags go to train (they win).
set -euo pipefail
cd "$(dirname "$0")/.."
accelerate launch --config_file accelerate_configs/single_node.yaml --mixed_precision bf16 \
    -m easy_context.train --config train_scripts/danube2_256k.yaml \
    ${MODEL:+--model "$MODEL"} ${DATA:+--dataset "$DATA"} ${OUT:+--output-dir "$OUT"} "$@"
