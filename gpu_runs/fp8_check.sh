#!/usr/bin/env bash
# One H200: FP8 linears (--fp8). Stages (arguments; default: gemm numerics fp8):
#   gemm      bench/fp8_check.py env/shapes/gemm: versions, the 16-token rule, the 7B MLP's GEMMs bf16 vs fp8 (~1 min)
#   numerics  bench/fp8_check.py numerics: a 63M Llama trained 200 steps on real text, bf16 vs fp8, seeds 0 and 1:
#             the loss curves and whether fp8 stays within the bf16 seed-to-seed noise (~2-3 min)
#   fp8, bf16 the Llama-2-7B 64K step (bench/train_step.py, checkpoint-after-attention, compiled) with / without
#             --fp8 (~2.5-3.5 min each)
# Every stage under `timeout` (the default stages at most 570 s, `bf16` alone at most 240 s); rows appended to
# $OUT/fp8_check.jsonl (sections), $OUT/fp8_curves.jsonl (every step's loss), $OUT/fp8_train_step.jsonl (7B).
#
#   pip install --no-deps --target /tmp/site .whl_fp8/*.whl      # torchao 0.18.0 (+ flash-attn-4 for KERNEL=fa4)
#   PYTHONPATH=/tmp/site:$PWD bash gpu_runs/fp8_check.sh             # then, for the same-session baseline: ... bf16
#   KERNEL=cudnn ...                                              # when flash-attn-4 is not installed
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KERNEL=${KERNEL:-fa4}
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD} TOKENIZERS_PARALLELISM=false
STAGES=${*:-gemm numerics fp8}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
start=$(date +%s)
stage() { echo "[$(( $(date +%s) - start )) s] $*"; }
B="python bench/train_step.py --model shape:llama-2-7b --seq 65536 --checkpointing attn --kernel $KERNEL --compile"
for s in $STAGES; do
    stage "$s"
    case $s in
        gemm) timeout 100 python bench/fp8_check.py --sections env shapes gemm --out "$OUT/fp8_check.jsonl" \
                  > "$OUT/fp8_gemm.log" 2>&1 ;;
        numerics) timeout 230 python bench/fp8_check.py --sections numerics --steps 200 --out "$OUT/fp8_check.jsonl" \
                      --curves "$OUT/fp8_curves.jsonl" > "$OUT/fp8_numerics.log" 2>&1 ;;
        fp8) timeout 240 $B --fp8 --label fp8 --timeout 225 --out "$OUT/fp8_train_step.jsonl" > "$OUT/fp8_7b.log" 2>&1 ;;
        bf16) timeout 240 $B --label bf16 --timeout 225 --out "$OUT/fp8_train_step.jsonl" > "$OUT/bf16_7b.log" 2>&1 ;;
        *) echo "unknown stage $s (gemm, numerics, fp8, bf16)"; exit 2 ;;
    esac
    rc=$?; [ $rc -eq 0 ] || stage "$s exit $rc (log in $OUT)"
done
stage "done"
cat "$OUT/fp8_check.jsonl" "$OUT/fp8_train_step.jsonl" 2>/dev/null | cut -c1-2000
