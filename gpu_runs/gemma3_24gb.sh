#!/usr/bin/env bash
# Gemma-3-270M (random weights) training steps on one GPU, as a 24 GB card (--gpu-mem-cap) or uncapped, with the
# long-context memory stack (offloaded layer inputs, tiled MLP, chunked loss, HostAdamW, chunked RMSNorm).
# Usage (device tool): bash gpu_runs/gemma3_24gb.sh SEQ[,CAP[,HEADS[,eager]]] ...   -> results under $OUT
#   e.g. 1048576 811008,24GB,1 1048576,24GB,1      (CAP "-": uncapped; HEADS: --attn-heads-per-call)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
{ nvidia-smi --query-gpu=name,memory.total --format=csv; free -g
  python -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >> "$OUT/gpu.txt" 2>&1
for spec in "$@"; do
  IFS=, read -r seq cap heads norm <<< "$spec"
  flags=(--model shape:gemma-3-270m --timeout "${PROBE_TIMEOUT:-280}" --out "$OUT/gemma_24gb.jsonl" --seq "$seq")
  [ "${norm:-}" = eager ] || flags+=(--chunked-rmsnorm)
  [ -n "${cap:-}" ] && [ "$cap" != - ] && flags+=(--gpu-mem-cap "$cap")
  [ -n "${heads:-}" ] && [ "$heads" != - ] && flags+=(--attn-heads-per-call "$heads")
  echo "== $spec: ${flags[*]}" >> "$OUT/log.txt"
  python bench/max_context.py "${flags[@]}" >> "$OUT/log.txt" 2>&1
done
