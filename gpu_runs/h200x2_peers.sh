#!/usr/bin/env bash
# Two H200s (device kind nvidia-h200-x2, carry .whl): peers side by side at 64K and 128K, GQA and MHA.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export NCCL_NVLS_ENABLE=0
for seq in 65536 131072; do
  for kv in 8 32; do
    torchrun --standalone --nproc_per_node 2 bench/peers.py --seq $seq --heads 32 --heads-kv $kv \
      --json "$OUT/peers_${seq}_kv${kv}.json" 2>> "$OUT/peers.err"
  done
done
