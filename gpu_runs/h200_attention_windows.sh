#!/usr/bin/env bash
# One H200, after `source gpu_runs/fa4_install.sh install`: flash-attn-4 in the kernel table and the SP schedules
# (64K / 128K, W = 8 virtual ranks), and sliding-window attention (skipping vs full vs a dense mask).
# Then the 7B step at 128K on fa4. Results: $OUT/attention_fa4.json, $OUT/windows_fa4.json, $OUT/train_step_128k.jsonl.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
run() { local t=$1; shift; echo "== $* (timeout $t s)"; timeout "$t" "$@"; echo "rc $?"; }
run 200 python bench/attention.py --seqs 65536 131072 --heads 32 --heads-kv 8 --world 8 --kernels fa4 cudnn \
    --json "$OUT/attention_fa4.json"
run 200 python bench/attention.py --windows 128 1024 4096 --seqs 65536 131072 --heads 32 --heads-kv 8 --world 8 \
    --json "$OUT/windows_fa4.json"
# the 7B step at 128K with fa4 (against cuDNN with attn-offload: docs/benchmarks.md)
for w in .whl_liger; do
    ls $w/*.whl > /dev/null 2>&1 && pip install -q --no-index --no-deps --target /tmp/site $w/*.whl > "$OUT/pip.txt" 2>&1
done
run 250 python bench/train_step.py --model shape:llama-2-7b --seq 131072 --steps 1 --checkpointing attn-offload \
    --compile --kernel fa4 --loss auto --label fa4_128k --timeout 240 --out "$OUT/train_step_128k.jsonl"
