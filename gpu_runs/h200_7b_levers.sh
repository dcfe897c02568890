#!/usr/bin/env bash
# One H200, one call (<= 9.5 min), after `source gpu_runs/fa4_install.sh install` in an earlier call of the same warm
# machine (flash-attn-4 in /tmp/site, PYTHONPATH=/tmp/sc:$PWD): the 7B 64K step with each speed lever, side by side.
#   split_auto    ours: fa4, --compile (MLP split: down projection eager), --loss auto (Liger when installed)
#   split_chunked the same with our chunked loss          -> Liger's share
#   whole_chunked the compiled whole MLP, chunked loss     -> the fifth session's best (5351 tok/s): the split's share
#   peer_liger    transformers sdpa + Liger (rope, rms_norm, swiglu, fused linear CE) + HF gradient checkpointing
#   fp8           split_auto + --fp8 (torchao float8 rowwise linears), when torchao is carried (.whl_fp8)
# Results: $OUT/levers.jsonl (one row per run), $OUT/step_*.txt logs.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-560}
T0=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
export PYTHONPATH=/tmp/sc:$PWD
for w in .whl_liger .whl_fp8; do
    ls $w/*.whl > /dev/null 2>&1 && pip install -q --no-index --no-deps --target /tmp/site $w/*.whl >> "$OUT/pip.txt" 2>&1
done
python -c "import flash_attn.cute, liger_kernel; print('fa4 + liger ok')" >> "$OUT/pip.txt" 2>&1
R="$OUT/levers.jsonl"
step() {  # step LABEL ARGS...: one bench/train_step.py run, cut at the budget's end
    local label=$1; shift
    local t; t=$(left)
    if [ "$t" -lt 70 ]; then echo "skipped $label: ${t}s left" >> "$OUT/skipped.txt"; return; fi
    [ "$t" -gt 140 ] && t=140
    timeout $((t + 10)) python bench/train_step.py --model shape:llama-2-7b --seq "${SEQ:-65536}" --steps 1 \
        --label "$label" --timeout "$t" --out "$R" "$@" > "$OUT/step_$label.txt" 2>&1
    echo "$label done at $(( $(date +%s) - T0 ))s" >> "$OUT/skipped.txt"
}
OURS="--checkpointing attn --compile --kernel fa4"
step split_auto $OURS --compile-mlp split --loss auto
step whole_chunked $OURS --compile-mlp whole --loss chunked
step split_chunked $OURS --compile-mlp split --loss chunked
python -c "import torchao" 2> /dev/null && step fp8 $OURS --compile-mlp split --loss auto --fp8
step peer_liger --baseline liger
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/skipped.txt"
