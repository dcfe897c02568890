#!/usr/bin/env bash
# EasyContext's staged Llama-2-7B recipe (32K -> 64K -> 256K x3 -> 512K x2, RoPE base 1M -> 250M, then 1B for
# inference), with EasyContext's stages, steps, data and seeds. Shared settings: EasyContext-1M-Llama-2-7B.yaml.
# Corrected:
#  * --learning-rate and --warmup-steps are honoured: EasyContext's DeepSpeed json fixed the LR at 2e-5 with no
#    warm-up (WarmupLR, min = max = 2e-5), so its last stage's --learning-rate 1e-5 and the 20 warm-up steps of
#    each stage never applied; here the optimizer and schedule come from the flags;
#  * the loss is the exact token mean over all ranks and micro-batches (EasyContext averaged per-rank means);
#  * no stray model.safetensors to delete after each stage (EasyContext's `rm`): the checkpoint is written once;
#  * the final RoPE base of 1B is written into the last stage's config.json here (EasyContext: by hand).
# 8 GPUs, DeepSpeed ZeRO-3 with CPU offload. Data: EasyContext's pre-tokenized Llama-2 rows, fetched once into
# save_to_disk folders (rows are cut to seq-length + 1 tokens, as EasyContext's train.py did).
# Extra flags after the script's name go to every stage (e.g. --save-every 50).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
CFG=${CFG:-accelerate_configs/single_node.yaml}
BASE=${BASE:-meta-llama/Llama-2-7b-hf}
OUT=${OUT:-output}
D64K=${D64K:-data/slimpajama-per-source-length-upsample}        # yaofu/slimpajama-per-source-length-upsample
D256K=${D256K:-data/slimpajama_llama_tokenized_upsample_4096_chunk_256K}
D1M=${D1M:-data/slimpajama_llama_tokenized_upsample_4096_chunk_1M}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-max_split_size_mb:1024}  # EasyContext's

fetch() {  # fetch <hub dataset> <folder>
    [ -d "$2" ] || $PY -c "import sys, datasets; datasets.load_dataset(sys.argv[1], split='train').save_to_disk(sys.argv[2])" "$1" "$2"
}
stage() {  # stage <from> <name> <data> <seq> <rope_theta> <mode> <steps> <grad_accum> <seed> [flags]
    accelerate launch --config_file "$CFG" --mixed_precision bf16 -m easy_context.train \
        --config train_scripts/EasyContext-1M-Llama-2-7B.yaml --model "$1" --output-dir "$OUT/$2" --dataset "$3" \
        --seq-length "$4" --rope-theta "$5" --parallel_mode "$6" --max-train-steps "$7" \
        --gradient-accumulate-every "$8" --seed "$9" "${@:10}"
}

fetch yaofu/slimpajama-per-source-length-upsample "$D64K"
fetch PY007/slimpajama_llama_tokenized_upsample_4096_chunk_256K "$D256K"
fetch PY007/slimpajama_llama_tokenized_upsample_4096_chunk_1M "$D1M"
stage "$BASE"                                 7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5 "$D64K" 32768 1000000 data_parallel 1000 4 42 "$@"
stage "$OUT/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5"   7B_64K_bs_1M_rope_5M_step_1000_lr_2e-5 "$D64K" 65536 5000000 data_parallel 1000 2 2022 "$@"
stage "$OUT/7B_64K_bs_1M_rope_5M_step_1000_lr_2e-5"   7B_0.256M_bs_1M_rope_10M_step_500_lr_2e-5 "$D256K" 256000 10000000 zigzag_ring_attn 500 4 2023 "$@"
stage "$OUT/7B_0.256M_bs_1M_rope_10M_step_500_lr_2e-5" 7B_0.256M_bs_1M_rope_25M_step_500_lr_2e-5 "$D256K" 256000 25000000 zigzag_ring_attn 500 4 2024 "$@"
stage "$OUT/7B_0.256M_bs_1M_rope_25M_step_500_lr_2e-5" 7B_0.256M_bs_1M_rope_50M_step_150_lr_2e-5 "$D256K" 256000 50000000 zigzag_ring_attn 150 4 2025 "$@"
stage "$OUT/7B_0.256M_bs_1M_rope_50M_step_150_lr_2e-5" 7B_0.5M_bs_1M_rope_100M_step_300_lr_2e-5 "$D1M" 512000 100000000 zigzag_ring_attn 300 2 2026 "$@"
stage "$OUT/7B_0.5M_bs_1M_rope_100M_step_300_lr_2e-5"  7B_0.5M_bs_1M_rope_250M_step_90_lr_2e-5 "$D1M" 512000 250000000 zigzag_ring_attn 90 2 2027 \
    --learning-rate 1e-5 "$@"
# EasyContext then set rope_theta to 1,000,000,000 in the final config.json for inference
$PY -c "import sys; from transformers import AutoConfig; from easy_context.models import set_rope_theta
from easy_context.models.config_compat import save_model
c = AutoConfig.from_pretrained(sys.argv[1]); set_rope_theta(c, 1e9); save_model(c, sys.argv[1])" \
    "$OUT/7B_0.5M_bs_1M_rope_250M_step_90_lr_2e-5"
