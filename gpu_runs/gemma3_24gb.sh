#!/usr/bin/env bash
# 1M-token steps of Gemma-3-270M (random weights) on one GPU, capped like a 24 GB card and uncapped.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"; free -g >> "$OUT/gpu.txt"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt"
B=(python bench/max_context.py --model shape:gemma-3-270m --chunked-rmsnorm --timeout 280 --out "$OUT/gemma_24gb.jsonl")
for spec in "$@"; do  # SEQ[:CAP]
  seq=${spec%%:*}; cap=${spec#*:}; [ "$cap" = "$spec" ] && cap=""
  "${B[@]}" --seq "$seq" ${cap:+--gpu-mem-cap $cap} 2>&1 | tail -30 >> "$OUT/log.txt"
done
