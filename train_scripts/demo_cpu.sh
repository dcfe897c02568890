#!/usr/bin/env bash
# The README demo: a miniature of EasyContext's experiment on 2 CPU processes, with the real scripts.
#   0. base model: a tiny Llama (hidden 128, 4 layers) trained from scratch at BASE tokens on the Paul Graham essays,
#      90 % of its rows needle documents trained on their answers only, so that it learns to find a needle within
#      BASE tokens. Default: the shipped one, assets/demo_base (this script's BASE_MODEL=train recipe, 8,000 steps
#      of 16 x 256 tokens, trained on one H200 in 7 minutes: on 2 CPU cores it takes ~45 minutes and the lookup
#      forms abruptly after 2,000-8,000 steps depending on the seed; docs/benchmarks_history.md). BASE_MODEL=train trains
#      it here; BASE_MODEL=<dir> takes any model trained at BASE tokens whose tokenizer is in <dir>;
#   1. before: needle heatmap and perplexity vs length up to TARGET tokens;
#   2. extend: train.py under 2-process zigzag ring attention at TARGET tokens, raised RoPE base, from the base model;
#   3. after: the same evaluations; 4. one figure, out/demo/summary.json and a one-line summary.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-out/demo}
BASE_MODEL=${BASE_MODEL:-assets/demo_base} # a model trained at BASE tokens, or "train"
BASE=${BASE:-256}              # base training length (tokens)
TARGET=${TARGET:-2048}         # extension length (tokens)
BASE_STEPS=${BASE_STEPS:-8000} # BASE_MODEL=train: optimizer steps of the base model (16 rows of BASE tokens each)
EXT_STEPS=${EXT_STEPS:-150}    # optimizer steps of the extension (2 rows of TARGET tokens each)
THETA=${THETA:-200000}         # RoPE base of the extended model (the base model trains with 10000)
SAMPLES=${SAMPLES:-2}          # needles per heatmap cell
SEED=${SEED:-0}
export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
# easy_context.launch: accelerate launch, a refusal shown once without the launcher's traceback
LAUNCH="$PY -m easy_context.launch --config_file accelerate_configs/cpu_2proc.yaml"
START=$(date +%s)

evaluate() {  # $1 model dir, $2 output dir
    $LAUNCH eval_needle.py --model "$1" --min_context_length 64 --max_context_length $((TARGET - 128)) \
        --context_interval 128 --depth_interval 0.2 --num_samples "$SAMPLES" --rnd_number_digits 3 \
        --seed "$SEED" --output-dir "$2/needle"
    $LAUNCH eval_ppl.py -m "$1" --min-tokens 128 --max-tokens "$TARGET" --truncate --samples 8 --output "$2/ppl.csv"
}

$PY PaulGrahamEssays/fetch.py
if [ "$BASE_MODEL" = train ]; then
    # 0. base model at BASE tokens; numbers are one token per digit, needles have 3 digits
    $PY -m easy_context.data --dataset PaulGrahamEssays --output "$OUT/base_data" --seq-length "$BASE" \
        --train-tokenizer 1000 --digit-groups 1 --needle-fraction 0.9 --needle-digits 3 --repeat 100 \
        --seed "$SEED" --no-progress
    $LAUNCH train.py --model tiny-llama-tied --tokenizer "$OUT/base_data/tokenizer" \
        --dataset "$OUT/base_data" --output-dir "$OUT/base" --seq-length "$BASE" --batch-size 8 \
        --gradient-accumulate-every 1 --max-train-steps "$BASE_STEPS" --learning-rate 3e-3 --warmup-steps 50 \
        --adam-betas 0.9 0.95 \
        --lr-schedule constant_with_warmup --dtype float32 --checkpointing none --parallel_mode data_parallel \
        --rope-theta 10000 --seed "$SEED" --log-every 50
    BASE_MODEL="$OUT/base"
fi
# 1. before
evaluate "$BASE_MODEL" "$OUT/before"
# 2. extend to TARGET tokens with 2-process zigzag ring attention (each sequence split over both processes)
$PY -m easy_context.data --dataset PaulGrahamEssays --tokenizer "$BASE_MODEL" \
    --output "$OUT/long_data" --seq-length "$TARGET" --needle-fraction 0.9 --needle-digits 3 --repeat 4 \
    --seed "$SEED" --no-progress
$LAUNCH train.py --model "$BASE_MODEL" --dataset "$OUT/long_data" --output-dir "$OUT/extended" \
    --seq-length "$TARGET" --batch-size 1 --gradient-accumulate-every 2 --max-train-steps "$EXT_STEPS" \
    --learning-rate 1e-3 --warmup-steps 5 --lr-schedule constant_with_warmup --adam-betas 0.9 0.95 --dtype float32 \
    --checkpointing none --parallel_mode zigzag_ring_attn --rope-theta "$THETA" --seed "$SEED" --log-every 10
# 3. after
evaluate "$OUT/extended" "$OUT/after"
# 4. the figure, summary.json and one line
$PY -m easy_context.eval.extension --before "$OUT/before" --after "$OUT/after" --base-length "$BASE" \
    --target-length "$TARGET" --seconds $(($(date +%s) - START)) --output "$OUT"
