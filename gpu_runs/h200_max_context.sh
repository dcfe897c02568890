#!/usr/bin/env bash
# One H200: the >2^31-element check, then max-context probes (Llama-3-8B shape, full memory stack).
# Usage (device tool): bash gpu_runs/h200_max_context.sh [SEQ ...]   -> results under $OUT
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
if [ "${SKIP_LARGE:-0}" = 0 ]; then
  timeout 200 python tests/gpu/check_large_tensors.py --json "$OUT/large_tensors.json" > "$OUT/large_tensors.txt" 2>&1
  echo "large tensors rc=$?" >> "$OUT/large_tensors.txt"
fi
free -g > "$OUT/host_mem.txt"
python bench/max_context.py --model shape:llama-3-8b --kernel cudnn --timeout 420 --out "$OUT/max_context.jsonl" --seq "$@"
