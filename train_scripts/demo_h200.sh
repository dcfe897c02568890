#!/usr/bin/env bash
# The extension demo at research scale on ONE H200, with the real scripts, in one or two device commands (<= 9.5
# minutes each):
#   0. data: a byte-level BPE (vocab 1000, one token per digit) trained on the Paul Graham essays, then three
#      training sets in parallel: SHORT, BASE and TARGET tokens per row, 90 % of the rows needle documents trained on
#      their answers only (docs/benchmarks_history.md: what makes the lookup form);
#   1. base model, a curriculum: (a) a ~100M Llama (preset llama-100m) from scratch at SHORT=256 tokens, where the
#      needle lookup forms: the A_RUNS (seed:lr pairs) side by side on the one GPU (each run is host-bound), each
#      until second A_UNTIL of the script (train.py --time-limit); a needle check of each at SHORT tokens keeps the
#      one that retrieves best (the lookup's onset is a seed-dependent phase transition); then (b) continued at
#      BASE=2048 tokens: the base length is 2048 (RoPE base 10K);
#   2. before: needle heatmap (haystacks NEEDLE_MIN..NEEDLE_MAX) and perplexity PPL_MIN..TARGET of the base model,
#      run in the background while 3. trains;
#   3. extend: train.py at TARGET=32768 tokens on the one GPU (data_parallel, 1 process) with the memory stack
#      (--checkpointing attn: checkpoint after attention; chunked loss; --chunked-rmsnorm), RoPE base 10K -> THETA;
#   4. after: the same evaluations; 5. the figure, summary.json (needle, perplexity, tokens/s of each training run),
#      written also from partial results (--partial: a stage that did not finish shows as "no results").
# Every stage runs under `timeout`, clipped to the whole run's deadline (TOTAL_S); its log, rc and seconds go to
# WORK/logs and RESULTS/stages.tsv. Heavy files (data, models) stay in WORK; RESULTS gets <= 6 small files:
# extension.png, summary.json, stages.tsv, phase_a.tsv (each phase (a) run's steps and check), demo_h200.log,
# results.tgz (stage logs, eval CSVs, metrics.jsonl).
# Resumable: a stage whose output is already in WORK (tokenizer, data sets, the phase (a) model, the base) is not
# run again, so a second invocation with the same WORK continues where the first stopped. STOP_AFTER=short ends
# the script after phase (a) and its check: in two back-to-back device commands phase (a) gets most of the first.
#
# On the H200 (docs/demo_h200.md; the image lacks `datasets`: its wheel is carried in .whl/, and the essays, which
# are git-ignored, in PaulGrahamEssays/):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
#   PYTHONPATH=/tmp/site:$PWD WORK=/tmp/demo RESULTS=$OUT bash train_scripts/demo_h200.sh
# Micro scale on a CPU machine (checks every stage and the figure in ~5 minutes of 2 cores; numbers meaningless):
#   DEVICE=cpu MODEL=tiny-llama-tied SHORT=128 BASE=256 TARGET=1024 A_RUNS="0:1e-3 1:2e-3" A_UNTIL=150 \
#   A_BATCH=8 A_REPEAT=2 A_LOG_EVERY=10 B_STEPS=10 B_BATCH=4 B_REPEAT=2 EXT_STEPS=4 EXT_ROWS=1 C_REPEAT=4 \
#   NEEDLE_MIN=96 NEEDLE_STEP=256 NEEDLE_MAX=864 DEPTH=0.5 SAMPLES=1 PPL_MIN=128 PPL_SAMPLES=2 TOTAL_S=900 \
#   bash train_scripts/demo_h200.sh
set -uo pipefail # no -e: a failed stage is recorded and the stages that do not need it still run
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
WORK=${WORK:-out/demo_h200}      # data, models, evaluations (GBs: stays on the machine)
RESULTS=${RESULTS:-$WORK/results} # the few small files to bring back (on the device: RESULTS=$OUT)
DEVICE=${DEVICE:-cuda}           # cpu: the micro-scale check (fp32, ACCELERATE_USE_CPU=1)
MODEL=${MODEL:-llama-100m}       # random-init preset of the base model
SEED=${SEED:-0}
SHORT=${SHORT:-256}              # curriculum phase (a): tokens per row
BASE=${BASE:-2048}               # curriculum phase (b) = the base length
TARGET=${TARGET:-32768}          # extension length
TOTAL_S=${TOTAL_S:-530}          # deadline of the whole script (the device allows 600 s per command)
RESERVE_S=${RESERVE_S:-25}       # kept back from every stage's limit for the summary at the end
A_UNTIL=${A_UNTIL:-250}          # phase (a) ends by this second of the run (train.py --time-limit)
A_STEPS=${A_STEPS:-}             # fixed phase (a) steps instead of the time limit
A_BATCH=${A_BATCH:-32}           # rows per step in phase (a)
A_LR=${A_LR:-1e-3}
A_RUNS=${A_RUNS:-$SEED:$A_LR}    # phase (a) runs side by side, "SEED:LR ..."; the best at SHORT tokens is kept
A_ACCEPT=${A_ACCEPT:-0.8}        # with STOP_AFTER=short: phase (a) ends once a run's check reaches this accuracy
A_REPEAT=${A_REPEAT:-100}        # copies of the essays packed into phase (a)'s rows (92K rows of 257 tokens)
A_LOG_EVERY=${A_LOG_EVERY:-50}
STOP_AFTER=${STOP_AFTER:-}       # "short": stop after phase (a) and its check (a second invocation continues)
B_STEPS=${B_STEPS:-650}          # phase (b): steps of B_BATCH rows of BASE tokens
B_BATCH=${B_BATCH:-8}
B_LR=${B_LR:-5e-4}
B_REPEAT=${B_REPEAT:-24}
EXT_STEPS=${EXT_STEPS:-100}      # extension: steps of EXT_ROWS rows of TARGET tokens
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
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
if [ "$DEVICE" = cpu ]; then
    export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    MIXED=no
else
    MIXED=${MIXED:-bf16} # bf16 autocast over fp32 weights (the needle lookup formed with it: docs/benchmarks_history.md)
fi
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
LOGS=$WORK/logs
mkdir -p "$WORK" "$LOGS" "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd) # absolute: bundle() archives from inside WORK
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
check_short() { # $1 model dir, $2 output dir: needle retrieval at haystacks SHORT/4..3 SHORT/4 (did the lookup form?)
    "$PY" eval_needle.py --model "$1" --min_context_length $((SHORT / 4)) --max_context_length $((SHORT * 3 / 4)) \
        --context_interval $((SHORT / 4)) --depth_interval 0.5 --num_samples 4 --rnd_number_digits 3 --seed "$SEED" \
        --output-dir "$2"
}
export -f check_short
export SHORT

done_already() { # NAME FILE: true (and recorded) when FILE exists: the stage ran in an earlier invocation on WORK
    [ -e "$2" ] || return 1
    echo "[$(now) s] $1: done already ($2)"
    printf '%s\tdone\t0\t0\t%s\n' "$1" "$(now)" >>"$RESULTS/stages.tsv"
}

bundle() { # one log of every stage and an archive of the results into RESULTS
    for f in "$LOGS"/*.log; do
        echo "===== $(basename "$f")"
        tr '\r' '\n' <"$f" | grep -v '^\s*$'
    done >"$RESULTS/demo_h200.log"
    (cd "$WORK" && tar czf "$RESULTS/results.tgz" logs $(ls -d short/check runs/*/check before after 2>/dev/null) \
        $(ls {short,runs/*,base,extended}/{metrics.jsonl,run_config.json} 2>/dev/null))
    column -t -s $'\t' "$RESULTS/stages.tsv" 2>/dev/null || cat "$RESULTS/stages.tsv"
}

echo "demo_h200: $MODEL, $SHORT -> $BASE (base) -> $TARGET tokens on $DEVICE; work $WORK, results $RESULTS"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$PY" -c 'import torch, transformers, accelerate, datasets, pyarrow
print("torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__,
      "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)' || echo "warning: a package is missing"
"$PY" PaulGrahamEssays/fetch.py # nothing to do when the essays are there (carried: the device has no network)

# 0. the tokenizer, then the three training sets (SHORT in the foreground: phase (a) waits for it)
done_already tokenizer "$WORK/tok/tokenizer" ||
    stage tokenizer 90 "$PY" -m easy_context.data --dataset PaulGrahamEssays --output "$WORK/tok" \
        --seq-length "$SHORT" --train-tokenizer 1000 --digit-groups 1 --no-progress
done_already data_base "$WORK/data_base/dataset_info.json" || stage data_base 240 data "$BASE" "$B_REPEAT" "$WORK/data_base" &
done_already data_target "$WORK/data_target/dataset_info.json" ||
    stage data_target 240 data "$TARGET" "$C_REPEAT" "$WORK/data_target" &
done_already data_short "$WORK/data_short/dataset_info.json" ||
    stage data_short 240 data "$SHORT" "$A_REPEAT" "$WORK/data_short"

# 1a. from scratch at SHORT tokens: the A_RUNS side by side, each until second A_UNTIL (or A_STEPS steps), each
# resumed from its last state when an earlier invocation left one; a needle check of each at SHORT tokens (each run
# and check: phase_a.tsv). The best becomes WORK/short once it retrieves at >= A_ACCEPT, or at once when no further
# invocation follows (STOP_AFTER unset); otherwise the runs keep their states for the next invocation
if done_already base_short "$WORK/short/config.json"; then
    :
elif [ -f "$WORK/data_short/dataset_info.json" ]; then
    RUNS=()
    for run in $A_RUNS; do
        seed=${run%%:*} lr=${run#*:}
        name=s${seed}_lr${lr}
        RUNS+=("$name")
        if [ -n "$A_STEPS" ]; then LIMIT=(--max-train-steps "$A_STEPS"); else
            LIMIT=(--max-train-steps 1000000 --time-limit $((A_UNTIL - $(now))))
        fi
        state=$(ls -d "$WORK/runs/$name"/state-step* 2>/dev/null | sort -V | tail -n 1)
        [ -n "$state" ] && LIMIT+=(--resume-from "$state") && echo "phase (a): $name resumes from $state"
        stage "short_$name" $((A_UNTIL - $(now) + 90)) train --model "$MODEL" --tokenizer "$WORK/tok/tokenizer" \
            --dataset "$WORK/data_short" --output-dir "$WORK/runs/$name" --seq-length "$SHORT" \
            --batch-size "$A_BATCH" --gradient-accumulate-every 1 --learning-rate "$lr" --seed "$seed" \
            --warmup-steps 100 --checkpointing none --rope-theta 10000 --log-every "$A_LOG_EVERY" "${LIMIT[@]}" &
    done
    wait
    for name in "${RUNS[@]}"; do # keep each run's last state (optimizer: GBs), for a next invocation
        ls -d "$WORK/runs/$name"/state-step* 2>/dev/null | sort -V | head -n -1 | xargs -r rm -rf
        [ -f "$WORK/runs/$name/config.json" ] &&
            stage "check_$name" 120 check_short "$WORK/runs/$name" "$WORK/runs/$name/check" &
    done
    wait
    read -r BEST BEST_ACC < <("$PY" - "$WORK/runs" "$RESULTS/phase_a.tsv" "${RUNS[@]}" <<'PY'
import json, os, sys
runs, table, names = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for name in names:
    metrics, check = os.path.join(runs, name, "metrics.jsonl"), os.path.join(runs, name, "check", "results.json")
    last = [json.loads(l) for l in open(metrics) if l.strip()][-1] if os.path.exists(metrics) else {}
    res = json.load(open(check)) if os.path.exists(check) else None
    lps = [r["answer_logprob"] for r in res["rows"] if "answer_logprob" in r] if res else []
    rows.append((name, last.get("step"), last.get("loss"), res and res["accuracy"], sum(lps) / len(lps) if lps else None))
with open(table, "w") as f:
    f.write("run\tsteps\tloss\tneedle_accuracy\tanswer_logprob\n")
    for r in rows:
        f.write("\t".join("" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x) for x in r) + "\n")
checked = [r for r in rows if r[3] is not None]
if checked:
    best = max(checked, key=lambda r: (r[3], r[4] if r[4] is not None else -1e9))
    print(best[0], best[3])
PY
)
    column -t -s $'\t' "$RESULTS/phase_a.tsv" 2>/dev/null
    if [ -n "${BEST:-}" ]; then
        if [ "$STOP_AFTER" != short ] || "$PY" -c "import sys; sys.exit(float('$BEST_ACC') < float('$A_ACCEPT'))"; then
            mv "$WORK/runs/$BEST" "$WORK/short" && rm -rf "$WORK"/short/state-step* "$WORK"/runs/*/state-step* &&
                echo "phase (a): kept $BEST (needle $BEST_ACC at $SHORT tokens) as the base's start ($WORK/short)"
        else
            echo "phase (a): the lookup has not formed yet (best: $BEST, needle $BEST_ACC < A_ACCEPT=$A_ACCEPT);" \
                "the same command again continues every run from its state"
        fi
    fi
fi
wait # the BASE and TARGET data
if [ "$STOP_AFTER" = short ]; then
    bundle
    echo "demo_h200: stopped after phase (a) at $(now) s (STOP_AFTER=short); the same command without it continues"
    exit 0
fi

# 1b. continued at BASE tokens (optimizer restarted): the base model, trained at BASE
if done_already base "$WORK/base/config.json"; then
    :
elif [ -f "$WORK/short/config.json" ] && [ -f "$WORK/data_base/dataset_info.json" ]; then
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
bundle
echo "demo_h200: $(now) s in all; results in $RESULTS"
