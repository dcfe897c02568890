#!/usr/bin/env bash
# One H200: the 7B end-to-end step (ours vs configurations) and the LM-head loss kernels.
# Usage (device tool, carry .whl): bash gpu_runs/h200_train_step.sh   -> results under $OUT
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
R="$OUT/train_step.jsonl"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
timeout 60 python bench/loss_kernels.py --tokens 16384 --vocab 32000 --hidden 4096 --json "$OUT/loss.json" > "$OUT/loss.txt" 2>&1
B="python bench/train_step.py --model shape:llama-2-7b --kernel cudnn --out $R"
$B --seq 65536 --checkpointing attn --profile "$OUT" --label attn --timeout 150
$B --seq 65536 --checkpointing attn --compile --profile "$OUT" --label attn_compile --timeout 170
$B --seq 16384 32768 --checkpointing attn --compile --label attn_compile --timeout 120
$B --seq 131072 --checkpointing attn-offload --compile --label attn_offload_compile --timeout 200
