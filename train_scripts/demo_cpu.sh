#!/usr/bin/env bash
# The README demo: a miniature of EasyContext's experiment on 2 CPU processes, with the real scripts.
#   1. base model: a tiny Llama trained from scratch at BASE tokens on the Paul Graham essays, with needle-retrieval
#      rows mixed in (trained on their answers only) so that it learns to find a needle within BASE tokens;
#   2. before: needle heatmap and perplexity vs length up to TARGET tokens;
#   3. extend: train.py under 2-process zigzag ring attention at TARGET tokens, raised RoPE base, from the base model;
#   4. after: the same evaluations; 5. one figure, out/demo/summary.json and a one-line summary.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-out/demo}
BASE=${BASE:-256}              # base training length (tokens)
TARGET=${TARGET:-2048}         # extension length (tokens)
BASE_STEPS=${BASE_STEPS:-5000} # optimizer steps of the base model (16 rows of BASE tokens each)
EXT_STEPS=${EXT_STEPS:-300}    # optimizer steps of the extension (2 rows of TARGET tokens each)
THETA=${THETA:-200000}         # RoPE base of the extended model (the base model trains with 10000)
SAMPLES=${SAMPLES:-2}          # needles per heatmap cell
SEED=${SEED:-0}
export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
LAUNCH="$PY -m accelerate.commands.launch --config_file accelerate_configs/cpu_2proc.yaml"
START=$(date +%s)

evaluate() {  # $1 model dir, $2 output dir
    $LAUNCH eval_needle.py --model "$1" --min_context_length 64 --max_context_length $((TARGET - 128)) \
        --context_interval 128 --depth_interval 0.2 --num_samples "$SAMPLES" --rnd_number_digits 3 \
        --seed "$SEED" --output-dir "$2/needle"
    $LAUNCH eval_ppl.py -m "$1" --min-tokens 128 --max-tokens "$TARGET" --truncate --samples 8 --output "$2/ppl.csv"
}

$PY PaulGrahamEssays/fetch.py
# 1. base model at BASE tokens: half the rows are needle documents with 3-digit numbers (one token each)
$PY -m easy_context.data --dataset PaulGrahamEssays --output "$OUT/base_data" --seq-length "$BASE" \
    --train-tokenizer 4000 --digit-groups 3 --needle-fraction 0.5 --needle-digits 3 --repeat 60 --seed "$SEED" \
    --no-progress
$LAUNCH train.py --model tiny-llama-tied --tokenizer "$OUT/base_data/tokenizer" \
    --dataset "$OUT/base_data" --output-dir "$OUT/base" --seq-length "$BASE" --batch-size 8 \
    --gradient-accumulate-every 1 --max-train-steps "$BASE_STEPS" --learning-rate 3e-3 --warmup-steps 50 \
    --lr-schedule constant_with_warmup --dtype float32 --checkpointing none --parallel_mode data_parallel \
    --rope-theta 10000 --seed "$SEED" --log-every 50
# 2. before
evaluate "$OUT/base" "$OUT/before"
# 3. extend to TARGET tokens with 2-process zigzag ring attention (each sequence split over both processes)
$PY -m easy_context.data --dataset PaulGrahamEssays --tokenizer "$OUT/base_data/tokenizer" \
    --output "$OUT/long_data" --seq-length "$TARGET" --needle-fraction 0.5 --needle-digits 3 --repeat 8 --seed "$SEED" \
    --no-progress
$LAUNCH train.py --model "$OUT/base" --dataset "$OUT/long_data" --output-dir "$OUT/extended" \
    --seq-length "$TARGET" --batch-size 1 --gradient-accumulate-every 2 --max-train-steps "$EXT_STEPS" \
    --learning-rate 1e-3 --warmup-steps 5 --lr-schedule constant_with_warmup --dtype float32 --checkpointing none \
    --parallel_mode zigzag_ring_attn --rope-theta "$THETA" --seed "$SEED" --log-every 10
# 4. after
evaluate "$OUT/extended" "$OUT/after"
# 5. the figure, summary.json and one line
$PY -m easy_context.eval.extension --before "$OUT/before" --after "$OUT/after" --base-length "$BASE" \
    --target-length "$TARGET" --seconds $(($(date +%s) - START)) --output "$OUT"
