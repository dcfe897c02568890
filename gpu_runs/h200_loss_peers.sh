#!/usr/bin/env bash
# One H200, one run (<= 7 minutes): the LM-head loss kernels (chunked vs Liger) and the 7B 64K step of ours with
# --loss auto (-> liger) and --loss chunked next to the peers stock transformers and transformers + Liger.
# Usage (device tool, carry .whl_liger and, for KERNEL=fa4, .whl): KERNEL=cudnn bash gpu_runs/h200_loss_peers.sh
# Results: $OUT/loss_peers.jsonl (one row per run: loss kernels, then train steps), $OUT/*.txt (logs).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KERNEL=${KERNEL:-cudnn}
BUDGET_S=${BUDGET_S:-395}  # every stage below starts only with enough of it left, and is cut at its end
T0=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
pip install -q --no-index --no-deps --target /tmp/site .whl_liger/*.whl > "$OUT/pip.txt" 2>&1
ls .whl/*.whl > /dev/null 2>&1 && pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> "$OUT/pip.txt" 2>&1
export PYTHONPATH=/tmp/site:$PWD
R="$OUT/loss_peers.jsonl"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
python -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" \
    > "$OUT/liger_version.txt" 2>&1

# (a) loss kernels, 16K tokens x 32K vocab x 4096: plain, chunked, liger (fp32 d_weight sums), liger_bf16_accum
timeout 90 python bench/loss_kernels.py --tokens 16384 --vocab 32000 --hidden 4096 --json "$OUT/loss_kernels.json" \
    > "$OUT/loss_kernels.txt" 2>&1
python -c "import json, sys; [print(json.dumps({'name': 'loss_kernels', **r})) for r in json.load(open(sys.argv[1]))]" \
    "$OUT/loss_kernels.json" >> "$R" 2>> "$OUT/loss_kernels.txt"

# (b) the 7B step at 64K, one warm-up + 1 timed step each; ours first, the peers after
step() {  # step LABEL ARGS...: one bench/train_step.py run, cut at the budget's end
    local label=$1; shift
    local t; t=$(left)
    if [ "$t" -lt 60 ]; then echo "skipped $label: ${t}s left" >> "$OUT/skipped.txt"; return; fi
    [ "$t" -gt 150 ] && t=150
    timeout $((t + 10)) python bench/train_step.py --model shape:llama-2-7b --seq 65536 --steps 1 --label "$label" \
        --timeout "$t" --out "$R" "$@" > "$OUT/step_$label.txt" 2>&1
}
step ours_auto --checkpointing attn --compile --kernel "$KERNEL" --loss auto
step peer_liger --baseline liger
step ours_chunked --checkpointing attn --compile --kernel "$KERNEL" --loss chunked
step peer_stock --baseline stock
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/skipped.txt"
