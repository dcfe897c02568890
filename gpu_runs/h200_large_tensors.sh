#!/usr/bin/env bash
# One H200: the >2^31-element check (library path + raw kernels), then a Llama-2-7B max-context probe.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
timeout 280 python tests/gpu/check_large_tensors.py --raw-kernels --json "$OUT/large_tensors.json" > "$OUT/large_tensors.txt" 2>&1
echo "large tensors rc=$?" >> "$OUT/large_tensors.txt"
cat "$OUT/large_tensors.txt"
python bench/max_context.py --model shape:llama-2-7b --kernel cudnn --timeout 300 --out "$OUT/max_context.jsonl" --seq "$@"
