#!/usr/bin/env bash
# The SmolLM2-135M 8K -> 64K extension on the H200 device: gpu_runs/h200_extend.sh with train_scripts/smollm2_64k.yaml
# (its header has the calls: stash N, start, wait SECONDS, collect, speed). The payload: bash gpu_runs/make_payload.sh
# smollm2-135m (4 parts).
# SEED=1: the baselines' evaluations of an earlier run of the same model and prompts (their done markers skip them),
# and the base's RULER of run 2 (the threshold of the extended models'); the extended models and the rest run.
# ATTN_BENCH (default here): the attention kernels alone on this model's shape (9 query / 3 KV heads, head_dim 64)
# at 64K and 128K while the GPU idles (conversion, packing): what bounds the step's MFU (docs/extension_smollm2.md).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = start ]; then
    export TRAIN_CHUNK_S=${TRAIN_CHUNK_S:-780}
    export ATTN_BENCH=${ATTN_BENCH-"--seqs 65536 131072 --heads 9 --heads-kv 3 --head-dim 64 --kernels fa4 cudnn"}
    if [ "${SEED:-0}" = 1 ]; then
        export SEED_EVALS=results/extension_smollm2/evals.tgz
        export SEED_MEMBERS="eval/base eval/rope_theta eval/dynamic_ntk eval/yarn"
        export SEED_RULER=results/extension_smollm2/run2/ruler_base.json
    fi
fi
exec bash gpu_runs/h200_extend.sh train_scripts/smollm2_64k.yaml "$@"
