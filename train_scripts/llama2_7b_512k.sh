#!/usr/bin/env bash
# EasyContext's staged Llama-2-7B recipe, 32K -> 512K, corrected:
#  * each stage starts from the previous stage's checkpoint (EasyContext's script restarted from the base model);
#  * the learning rate and warm-up flags are honoured (the DeepSpeed json says "auto"; EasyContext's fixed 2e-5);
#  * the loss is the exact token mean over all ranks (EasyContext averaged per-rank means).
# RoPE base: 1M for 32K-128K, 250M for 256K-512K, then 1B for the last stage. 8 GPUs, ZeRO-3 offload.
# Data: a packed dataset per length, e.g.
#   python -m easy_context.data --dataset <long-doc corpus> --tokenizer meta-llama/Llama-2-7b-hf \
#       --seq-length 524288 --long-doc-tokens 32768 --upsample-factor 4 --output data/slimpajama-512k
set -euo pipefail
cd "$(dirname "$0")/.."
CFG=accelerate_configs/single_node.yaml
BASE=${BASE:-meta-llama/Llama-2-7b-hf}
DATA=${DATA:-data/slimpajama-512k}   # rows of >= 512K+1 tokens; shorter stages truncate them
OUT=${OUT:-output/llama2-7b}
WANDB=${WANDB:-easy_context}

stage() {  # stage <from> <name> <seq> <rope_theta> <mode> <steps> <grad_accum>
    accelerate launch --config_file "$CFG" --mixed_precision bf16 train.py --model "$1" --dataset "$DATA" --output-dir "$OUT/$2" \
        --seq-length "$3" --rope-theta "$4" --parallel_mode "$5" --max-train-steps "$6" \
        --gradient-accumulate-every "$7" --batch-size 1 --learning-rate 2e-5 --warmup-steps 20 \
        --checkpointing full --loss chunked --seed 2024 --wandb "$WANDB"
}

stage "$BASE"          32k  32768  1000000    data_parallel    1000 4
stage "$OUT/32k"       128k 131072 1000000    zigzag_ring_attn 500  2
stage "$OUT/128k"      256k 262144 250000000  zigzag_ring_attn 300  1
stage "$OUT/256k"      512k 524288 250000000  zigzag_ring_attn 200  1
stage "$OUT/512k"      512k-theta1b 524288 1000000000 zigzag_ring_attn 100 1
