#!/usr/bin/env bash
# The README demo: a tiny Llama trained for a few dozen steps with 2-process zigzag ring attention on CPU,
# over the Paul Graham essays, with a byte-level BPE tokenizer trained on them. A few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-out/demo}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-100}
export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline

$PY PaulGrahamEssays/fetch.py
$PY -m easy_context.data --dataset PaulGrahamEssays --output "$OUT/data" --seq-length "$SEQ" --train-tokenizer 4000
$PY -m accelerate.commands.launch --config_file accelerate_configs/cpu_2proc.yaml train.py \
    --model tiny-llama --tokenizer "$OUT/data/tokenizer" --dataset "$OUT/data" --output-dir "$OUT/model" \
    --seq-length "$SEQ" --batch-size 1 --gradient-accumulate-every 2 --max-train-steps "$STEPS" \
    --learning-rate 3e-3 --warmup-steps 5 --lr-schedule cosine --dtype float32 --checkpointing none \
    --parallel_mode zigzag_ring_attn --rope-theta 10000 --seed 0
echo "demo model: $OUT/model (metrics: $OUT/model/metrics.jsonl)"

# evaluate it: needle-in-a-haystack heatmap and perplexity vs length (2-process zigzag SP inference)
$PY -m accelerate.commands.launch --config_file accelerate_configs/cpu_2proc.yaml eval_needle.py \
    --model "$OUT/model" --min_context_length 256 --max_context_length "$SEQ" --context_interval 256 \
    --depth_interval 0.1 --num_samples 3 --output-dir "$OUT/needle"
$PY -m accelerate.commands.launch --config_file accelerate_configs/cpu_2proc.yaml eval_ppl.py \
    -m tiny-llama -m "$OUT/model" --tokenizer "$OUT/model" --min-tokens 256 --max-tokens "$SEQ" \
    --truncate --samples 8 --output "$OUT/ppl.csv"
$PY plot.py "$OUT/ppl.csv" --labels "untrained (random init)" "demo model" --output "$OUT/ppl.png"
echo "needle heatmap: $OUT/needle/heatmap.png   perplexity plot: $OUT/ppl.png"
