#!/usr/bin/env bash
# H2O-Danube2-1.8B (Mistral architecture) to 256K on 8 GPUs. Full attention is required for SP: if the
# checkpoint sets a sliding window shorter than the sequence, save its config with sliding_window=null first
# (easy_context raises a clear error if a window shorter than the sequence reaches the attention).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-h2oai/h2o-danube2-1.8b-base}
DATA=${DATA:-data/slimpajama-256k}
OUT=${OUT:-output/danube2-256k}
accelerate launch --config_file accelerate_configs/single_node.yaml --mixed_precision bf16 train.py \
    --model "$MODEL" --dataset "$DATA" --output-dir "$OUT" --seq-length 262144 --rope-theta 100000000 \
    --parallel_mode zigzag_ring_attn --batch-size 1 --gradient-accumulate-every 2 --max-train-steps 300 \
    --learning-rate 2e-5 --warmup-steps 20 --checkpointing full --loss chunked --seed 2024
