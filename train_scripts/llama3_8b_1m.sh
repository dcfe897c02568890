#!/usr/bin/env bash
# Llama-3-8B to 1M tokens on 8 GPUs: USP (Ulysses over 8/ring_degree GPUs with 32 query / 8 KV heads) with
# CPU-offloaded checkpoints and tiled MLP; 64K -> 256K -> 1M with growing RoPE base.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-meta-llama/Meta-Llama-3-8B}
DATA=${DATA:-data/slimpajama-1m}
OUT=${OUT:-output/llama3-8b}
stage() {  # stage <from> <name> <seq> <rope_theta> <steps>
    accelerate launch --config_file accelerate_configs/single_node.yaml --mixed_precision bf16 train.py --model "$1" --dataset "$DATA" \
        --output-dir "$OUT/$2" --seq-length "$3" --rope-theta "$4" --parallel_mode usp_attn --ring_degree 2 \
        --max-train-steps "$5" --batch-size 1 --gradient-accumulate-every 1 --learning-rate 1e-5 \
        --warmup-steps 10 --checkpointing offload --tiled-mlp 8 --loss chunked --seed 2024
}
stage "$BASE"       64k  65536   8000000    300
stage "$OUT/64k"    256k 262144  64000000   200
stage "$OUT/256k"   1m   1048576 500000000  100
