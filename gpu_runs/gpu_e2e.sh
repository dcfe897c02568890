#!/usr/bin/env bash
# End-to-end on a GPU machine (2+ GPUs): train.py with DDP, FSDP2-offload and DeepSpeed ZeRO-3-offload on
# a tiny model over synthetic text, plus the loss kernels. Wheels for packages the image lacks go in .whl/.
#   bash gpu_runs/gpu_e2e.sh <out_dir> [num_gpus]
set -uo pipefail
OUT=${1:-out/gpu_e2e}; N=${2:-2}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
python3 bench/loss_kernels.py --json "$OUT/loss_kernels.json" 2>&1 | grep -E "lce/|not installed|Error"
python3 - <<'PY'
import random, os
random.seed(0)
words = "the model reads a long context and learns where each word comes from in the text".split()
os.makedirs("/tmp/e2e_text", exist_ok=True)
for i in range(40):
    open(f"/tmp/e2e_text/d{i}.txt", "w").write(" ".join(random.choice(words) for _ in range(6000)))
PY
python3 -m easy_context.data --dataset /tmp/e2e_text --output /tmp/e2e_data --seq-length 8192 --train-tokenizer 1000 --no-progress 2>&1 | tail -2
COMMON="train.py --model tiny-llama --tokenizer /tmp/e2e_data/tokenizer --dataset /tmp/e2e_data --seq-length 8192
  --batch-size 1 --gradient-accumulate-every 2 --max-train-steps 6 --learning-rate 1e-3 --warmup-steps 1 --dtype float32
  --parallel_mode zigzag_ring_attn --seed 1"
run() {  # run <name> <accelerate args...>
  local name=$1; shift
  echo "== $name"; local t0=$(date +%s)
  timeout 420 accelerate launch "$@" $COMMON --output-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^error|Error" "$OUT/$name.log" | tail -3
  [ -f "$OUT/$name/metrics.jsonl" ] && python3 -c "import json,sys; r=[json.loads(l) for l in open('$OUT/$name/metrics.jsonl')]; print([round(x['loss'],4) for x in r])"
}
[ -n "${ONLY_ZERO3:-}" ] || run ddp --multi_gpu --num_processes "$N" --mixed_precision no
[ -n "${ONLY_ZERO3:-}" ] || run fsdp2 --config_file accelerate_configs/fsdp2_offload.yaml --num_processes "$N" --mixed_precision no
run zero3 --config_file accelerate_configs/single_node.yaml --num_processes "$N"
