#!/usr/bin/env bash
# One H200, after `source bench/fa4_install.sh install`: flash-attn-4 in the kernel table and the SP schedules
# (64K / 128K, W = 8 virtual ranks), and sliding-window attention (issue 15: skipping vs full vs a dense mask).
# Results: $OUT/attention_fa4.json, $OUT/windows_fa4.json and a log.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
run() { local t=$1; shift; echo "== $* (timeout $t s)"; timeout "$t" "$@"; echo "rc $?"; }
run 200 python bench/attention.py --seqs 65536 131072 --heads 32 --heads-kv 8 --world 8 --kernels fa4 cudnn \
    --json "$OUT/attention_fa4.json"
run 200 python bench/attention.py --windows 128 1024 4096 --seqs 65536 131072 --heads 32 --heads-kv 8 --world 8 \
    --json "$OUT/windows_fa4.json"
