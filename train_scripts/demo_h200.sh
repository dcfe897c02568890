#!/usr/bin/env bash
# The extension demo at research scale on ONE H200, in one device command (<= 9 minutes), with the real scripts:
#   0. data: a byte-level BPE (vocab 1000, one token per digit) trained on the Paul Graham essays, then three
#      training sets in parallel: SHORT, BASE and TARGET tokens per row, 90 % of the rows needle documents trained on
#      their answers only (docs/benchmarks.md, issue 13: what makes the lookup form);
#   1. base model, a curriculum: (a) a ~100M Llama (preset llama-100m) from scratch at SHORT=256 tokens, where the
#      needle lookup forms (a first chunk measures the step rate, a resumed second chunk fills the time budget up to
#      A_UNTIL seconds of the run), then (b) continued at BASE=2048 tokens: the base length is 2048 (RoPE base 10K);
#   2. before: needle heatmap (haystacks NEEDLE_MIN..NEEDLE_MAX) and perplexity PPL_MIN..TARGET of the base model,
#      run in the background while 3. trains;
#   3. extend: train.py at TARGET=32768 tokens on the one GPU (data_parallel, 1 process) with the memory stack
#      (--checkpointing attn: checkpoint after attention; chunked loss; --chunked-rmsnorm), RoPE base 10K -> THETA;
#   4. after: the same evaluations; 5. the figure, summary.json (needle, perplexity, tokens/s of each training run),
#      written also from partial results (--partial: a stage that did not finish shows as "no results").
# Every stage runs under `timeout`, clipped to the whole run's deadline (TOTAL_S); its log, rc and seconds go to
# WORK/logs and RESULTS/stages.tsv. Heavy files (data, models) stay in WORK; RESULTS gets <= 5 small files:
# extension.png, summary.json, stages.tsv, demo_h200.log, results.tgz (stage logs, eval CSVs, metrics.jsonl).
#
# On the H200 (docs/demo_h200.md; the image lacks `datasets`: its wheel is carried in .whl/, and the essays, which
# are git-ignored, in PaulGrahamEssays/):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
#   PYTHONPATH=/tmp/site:$PWD WORK=/tmp/demo RESULTS=$OUT bash train_scripts/demo_h200.sh
# Micro scale on a CPU machine (checks every stage and the figure in ~5 minutes of 2 cores; numbers meaningless):
#   DEVICE=cpu MODEL=tiny-llama-tied SHORT=128 BASE=256 TARGET=1024 A_CAL_STEPS=20 A_LOG_EVERY=10 A_UNTIL=200 \
#   A_BATCH=8 A_REPEAT=2 B_STEPS=10 B_BATCH=4 B_REPEAT=2 EXT_STEPS=4 EXT_ROWS=1 C_REPEAT=4 NEEDLE_MIN=96 \
#   NEEDLE_STEP=256 NEEDLE_MAX=864 DEPTH=0.5 SAMPLES=1 PPL_MIN=128 PPL_SAMPLES=2 TOTAL_S=900 \
#   bash train_scripts/demo_h200.sh
set -uo pipefail # no -e: a failed stage is recorded and the stages that do not need it still run
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
WORK=${WORK:-out/demo_h200}      # data, models, evaluations (GBs: stays on the machine)
RESULTS=${RESULTS:-$WORK/results} # the few small files to bring back (on the device: RESULTS=$OUT)
DEVICE=${DEVICE:-cuda}           # cpu: the micro-scale check (fp32, ACCELERATE_USE_CPU=1)
MODEL=${MODEL:-llama-100m}       # random-init preset of the base model
SHORT=${SHORT:-256}              # curriculum phase (a): tokens per row
BASE=${BASE:-2048}               # curriculum phase (b) = the base length
TARGET=${TARGET:-32768}          # extension length
TOTAL_S=${TOTAL_S:-530}          # deadline of the whole script (the device allows 600 s per command)
RESERVE_S=${RESERVE_S:-25}       # kept back from every stage's limit for the summary at the end
A_UNTIL=${A_UNTIL:-250}          # phase (a) ends by this second of the run (its steps follow the measured rate)
A_STEPS=${A_STEPS:-}             # fixed phase (a) steps instead (one run, no rate measurement)
A_CAL_STEPS=${A_CAL_STEPS:-300}  # phase (a) first chunk: measures the step rate
A_BATCH=${A_BATCH:-32}           # rows per step in phase (a)
A_LR=${A_LR:-1e-3}
A_REPEAT=${A_REPEAT:-100}        # copies of the essays packed into phase (a)'s rows (92K rows of 257 tokens)
A_LOG_EVERY=${A_LOG_EVERY:-50}   # the step rate is that of the first chunk's last A_LOG_EVERY steps
B_STEPS=${B_STEPS:-300}          # phase (b): steps of B_BATCH rows of BASE tokens
B_BATCH=${B_BATCH:-8}
B_LR=${B_LR:-5e-4}
B_REPEAT=${B_REPEAT:-24}
EXT_STEPS=${EXT_STEPS:-120}      # extension: steps of EXT_ROWS rows of TARGET tokens
EXT_ROWS=${EXT_ROWS:-2}
EXT_LR=${EXT_LR:-5e-4}
C_REPEAT=${C_REPEAT:-40}
THETA=${THETA:-1000000}          # RoPE base of the extended model (the base trains with 10000)
NEEDLE_MIN=${NEEDLE_MIN:-896}    # haystack lengths NEEDLE_MIN, +NEEDLE_STEP, ... <= NEEDLE_MAX
NEEDLE_STEP=${NEEDLE_STEP:-1024}
NEEDLE_MAX=${NEEDLE_MAX:-$((TARGET - 1024))}
DEPTH=${DEPTH:-0.25}             # needle depths 0, 25, ..., 100 %
SAMPLES=${SAMPLES:-2}            # needles per heatmap cell
PPL_MIN=${PPL_MIN:-512}          # perplexity at PPL_MIN, 2 x PPL_MIN, ..., TARGET
PPL_SAMPLES=${PPL_SAMPLES:-8}    # windows of the concatenated essays (237K tokens: 7 of 32K)
SEED=${SEED:-0}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
if [ "$DEVICE" = cpu ]; then
    export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    MIXED=no
else
    MIXED=${MIXED:-bf16} # bf16 autocast over fp32 weights (the needle lookup formed with it: docs/benchmarks.md)
fi
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
LOGS=$WORK/logs
mkdir -p "$WORK" "$LOGS" "$RESULTS"
rm -f "$RESULTS/stages.tsv"
printf 'stage\trc\tseconds\tlimit_s\tended_at_s\n' >"$RESULTS/stages.tsv"

now() { echo $(($(date +%s) - START)); }

stage() { # NAME CAP_S COMMAND...: run COMMAND under timeout (CAP_S, clipped to the deadline); log, rc and seconds
    local name=$1 cap=$2 left limit t0 rc
    shift 2
    left=$((DEADLINE - $(date +%s) - RESERVE_S))
    limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 5 ]; then
        echo "[$(now) s] $name: skipped (deadline)"
        printf '%s\tskipped\t0\t0\t%s\n' "$name" "$(now)" >>"$RESULTS/stages.tsv"
        return 1
    fi
    echo "[$(now) s] $name: start (limit $limit s)"
    t0=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then set -- bash -c '"$@"' "$name" "$@"; fi # train, data: exported below
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$limit" "$(now)" >>"$RESULTS/stages.tsv"
    echo "[$(now) s] $name: rc $rc after $(($(date +%s) - t0)) s$([ "$rc" = 124 ] && echo ' (timed out)')"
    tr '\r' '\n' <"$LOGS/$name.log" | grep -v '^\s*$' | tail -n 4 | sed "s/^/    $name| /"
    return $rc
}

train() { # train.py on one process (data parallel with one rank); bf16 autocast on the GPU
    ACCELERATE_MIXED_PRECISION=$MIXED "$PY" train.py --parallel_mode data_parallel --dtype float32 \
        --adam-betas 0.9 0.95 --lr-schedule constant_with_warmup --seed "$SEED" "$@"
}

data() { # $1 seq length, $2 repeat, $3 output
    "$PY" -m easy_context.data --dataset PaulGrahamEssays --tokenizer "$WORK/tok/tokenizer" --seq-length "$1" \
        --needle-fraction 0.9 --needle-digits 3 --repeat "$2" --seed "$SEED" --output "$3" --no-progress
}

evaluate() { # $1 model dir, $2 output dir, $3 name suffix: needle heatmap and perplexity, side by side
    stage "needle_$3" 200 "$PY" eval_needle.py --model "$1" --min_context_length "$NEEDLE_MIN" \
        --max_context_length "$NEEDLE_MAX" --context_interval "$NEEDLE_STEP" --depth_interval "$DEPTH" \
        --num_samples "$SAMPLES" --rnd_number_digits 3 --seed "$SEED" --output-dir "$2/needle" &
    stage "ppl_$3" 200 "$PY" eval_ppl.py -m "$1" --min-tokens "$PPL_MIN" --max-tokens "$TARGET" --truncate \
        --samples "$PPL_SAMPLES" --output "$2/ppl.csv" &
    wait
}

export -f train data
export PY MIXED SEED WORK
last_rate() { # steps/s of the last logged interval of a metrics.jsonl ($1), for $2 tokens per step
    "$PY" -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(rows[-1]["tokens_per_s"] / int(sys.argv[2]))' "$1" "$2"
}

echo "demo_h200: $MODEL, $SHORT -> $BASE (base) -> $TARGET tokens on $DEVICE; work $WORK, results $RESULTS"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$PY" -c 'import torch, transformers, accelerate, datasets, pyarrow
print("torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__,
      "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)' || echo "warning: a package is missing"
"$PY" PaulGrahamEssays/fetch.py # nothing to do when the essays are there (carried: the device has no network)

# 0. the tokenizer, then the three training sets (SHORT in the foreground: phase (a) waits for it)
stage tokenizer 90 "$PY" -m easy_context.data --dataset PaulGrahamEssays --output "$WORK/tok" --seq-length "$SHORT" \
    --train-tokenizer 1000 --digit-groups 1 --no-progress
stage data_base 240 data "$BASE" "$B_REPEAT" "$WORK/data_base" &
stage data_target 240 data "$TARGET" "$C_REPEAT" "$WORK/data_target" &
stage data_short 240 data "$SHORT" "$A_REPEAT" "$WORK/data_short"

# 1a. from scratch at SHORT tokens: a first chunk measures the step rate, the resumed run fills the budget
A=(--dataset "$WORK/data_short" --output-dir "$WORK/short" --seq-length "$SHORT" --batch-size "$A_BATCH"
    --gradient-accumulate-every 1 --learning-rate "$A_LR" --warmup-steps 100 --checkpointing none --rope-theta 10000
    --log-every "$A_LOG_EVERY")
if [ -f "$WORK/data_short/dataset_info.json" ]; then
    if [ -n "$A_STEPS" ]; then
        stage base_short $((A_UNTIL - $(now))) train --model "$MODEL" --tokenizer "$WORK/tok/tokenizer" "${A[@]}" \
            --max-train-steps "$A_STEPS"
    else
        stage base_short_cal $((A_UNTIL - $(now))) train --model "$MODEL" --tokenizer "$WORK/tok/tokenizer" \
            "${A[@]}" --max-train-steps 1000000 --stop-at-step "$A_CAL_STEPS"
        if [ -d "$WORK/short/state-step$A_CAL_STEPS" ]; then
            RATE=$(last_rate "$WORK/short/metrics.jsonl" $((A_BATCH * SHORT)))
            # 25 s assumed for the resumed run's start-up and saves (imports, loading the state; not yet measured)
            A_TOTAL=$("$PY" -c "print($A_CAL_STEPS + max(0, int($RATE * ($A_UNTIL - $(now) - 25))))")
            echo "phase (a): $(printf %.2f "$RATE") steps/s measured; training to step $A_TOTAL"
            if [ "$A_TOTAL" -gt "$A_CAL_STEPS" ]; then
                # the resumed run shares the output dir: model, metrics.jsonl (appended) and run_config.json
                stage base_short $((A_UNTIL - $(now) + 30)) train --model "$MODEL" --tokenizer "$WORK/tok/tokenizer" \
                    "${A[@]}" --max-train-steps 1000000 --resume-from "$WORK/short/state-step$A_CAL_STEPS" \
                    --stop-at-step "$A_TOTAL"
            fi
        fi
    fi
    rm -rf "$WORK"/short/state-step* # optimizer states (GBs); the model is saved next to them
fi
wait # the BASE and TARGET data

# 1b. continued at BASE tokens (optimizer restarted): the base model, trained at BASE. Beside it, a quick check of
# phase (a): did the lookup form within SHORT tokens (if not, nothing after it can retrieve)?
if [ -f "$WORK/short/config.json" ]; then
    stage needle_short 120 "$PY" eval_needle.py --model "$WORK/short" --min_context_length $((SHORT / 4)) \
        --max_context_length $((SHORT * 3 / 4)) --context_interval $((SHORT / 4)) --depth_interval 0.5 \
        --num_samples 4 --rnd_number_digits 3 --seed "$SEED" --output-dir "$WORK/short_eval/needle" &
fi
if [ -f "$WORK/short/config.json" ] && [ -f "$WORK/data_base/dataset_info.json" ]; then
    stage base 240 train --model "$WORK/short" --dataset "$WORK/data_base" --output-dir "$WORK/base" \
        --seq-length "$BASE" --batch-size "$B_BATCH" --gradient-accumulate-every 1 --max-train-steps "$B_STEPS" \
        --learning-rate "$B_LR" --warmup-steps 20 --checkpointing none --rope-theta 10000 --log-every 25
fi

# 2. before (in the background, beside 3.)   3. extend to TARGET tokens with the memory stack on the one GPU
if [ -f "$WORK/base/config.json" ]; then
    evaluate "$WORK/base" "$WORK/before" before &
    if [ -f "$WORK/data_target/dataset_info.json" ]; then
        stage extend 300 train --model "$WORK/base" --dataset "$WORK/data_target" --output-dir "$WORK/extended" \
            --seq-length "$TARGET" --batch-size 1 --gradient-accumulate-every "$EXT_ROWS" \
            --max-train-steps "$EXT_STEPS" --learning-rate "$EXT_LR" --warmup-steps 10 --checkpointing attn \
            --chunked-rmsnorm --loss chunked --rope-theta "$THETA" --log-every 5
    fi
    wait
fi

# 4. after
[ -f "$WORK/extended/config.json" ] && evaluate "$WORK/extended" "$WORK/after" after

# 5. the figure and summary.json from whatever finished, the stage table, one log and an archive of the results
wait
METRICS=()
for run in short base extended; do
    [ -s "$WORK/$run/metrics.jsonl" ] && METRICS+=(--train-metrics "$run=$WORK/$run")
done
RESERVE_S=0 stage summary 60 "$PY" -m easy_context.eval.extension --partial --before "$WORK/before" \
    --after "$WORK/after" --base-length "$BASE" --target-length "$TARGET" --seconds "$(now)" --output "$RESULTS" \
    "${METRICS[@]}"
cat "$LOGS/summary.log"
for f in "$LOGS"/*.log; do
    echo "===== $(basename "$f")"
    tr '\r' '\n' <"$f" | grep -v '^\s*$'
done >"$RESULTS/demo_h200.log"
(cd "$WORK" && tar czf "$RESULTS/results.tgz" logs $(ls -d short_eval before after 2>/dev/null) \
    $(ls short/metrics.jsonl short/run_config.json base/metrics.jsonl base/run_config.json extended/metrics.jsonl \
        extended/run_config.json 2>/dev/null))
column -t -s $'\t' "$RESULTS/stages.tsv" 2>/dev/null || cat "$RESULTS/stages.tsv"
echo "demo_h200: $(now) s in all; results in $RESULTS"
