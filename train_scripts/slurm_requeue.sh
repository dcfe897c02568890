#!/usr/bin/env bash
# train.py on SLURM through preemption and time limits: each job runs until the scheduler stops it, saves a
# resumable state and requeues itself; the requeued job (the same script and arguments) continues from that state.
#   sbatch train_scripts/slurm_requeue.sh --config train_scripts/smollm2_64k.yaml --model models/SmolLM2-135M-Instruct \
#       --dataset data/stdlib-64k --output-dir out/smollm2-64k
# The arguments are train.py's flags (--output-dir required: the states live there); the script adds
# --resume-from auto. 120 s before the time limit (--signal=USR1@120) SLURM sends SIGUSR1 to the job step:
# easy-context-launch passes it to the ranks, which stop together after the step they are in, save
# OUTPUT_DIR/state-stepN and exit 75 (docs/failure.md, "Preemption"); on 75 this script requeues the job. A
# preemption's or scancel's SIGTERM does the same. Choose the lead time above one step plus one state save.
# Several nodes: sbatch --nodes=N (one launcher per node, GPUS_PER_NODE ranks each, rank 0's node is the rendezvous).
#SBATCH --job-name=easy-context
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.log
set -u
cd "${SLURM_SUBMIT_DIR:-.}"
PREEMPTED=75  # train.py's exit code after a stop signal with the state saved (easy_context.training.preemption)
PY=${PY:-python}
LAUNCH_CONFIG=${LAUNCH_CONFIG:-accelerate_configs/single_node.yaml}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NODES=${SLURM_NNODES:-1}
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)}
MASTER_PORT=${MASTER_PORT:-29500}
# the launcher gives the ranks this long to save after it passed the signal on (torch's default: 30 s), then kills
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-100}
export PY LAUNCH_CONFIG GPUS_PER_NODE NODES MASTER_ADDR MASTER_PORT
# a SIGTERM to this shell (preemption) must not end it before the job step has saved: noted, acted on after srun
trap 'echo "slurm_requeue.sh: SIGTERM; waiting for the job step to save its state"' TERM

srun bash -c 'exec "$PY" -m easy_context.launch --config_file "$LAUNCH_CONFIG" --num_machines "$NODES" \
    --machine_rank "${SLURM_NODEID:-0}" --num_processes "$((NODES * GPUS_PER_NODE))" --main_process_ip "$MASTER_ADDR" \
    --main_process_port "$MASTER_PORT" train.py "$@" --resume-from auto' slurm_requeue "$@"
rc=$?
if [ "$rc" -eq "$PREEMPTED" ]; then
    echo "slurm_requeue.sh: stopped with its state saved (exit $rc); requeueing job ${SLURM_JOB_ID}"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
