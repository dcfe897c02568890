"""train.py under sequence parallelism on N processes: tokens/s, MFU and peak memory per SP mode and length, or
the longest length that trains.

Each (mode, length) is one fresh ``accelerate launch ... train.py --dataset random --no-save`` (random tokens,
random-init model: speed and memory do not depend on either), so an out-of-memory run is recorded and the next
starts clean. Every argument this script does not know goes to train.py unchanged (``--checkpointing``,
``--chunked-rmsnorm``, ``--tiled-mlp``, ``--kernel``, ``--loss``, ``--sp-size``, ``--ring-degree`` ...). The row
reports train.py's own ``metrics.jsonl``: the last step's tokens/s (all ranks together) and MFU, and rank 0's
peak GPU memory (peak host RSS on CPU)::

    # throughput, 8 GPUs, DeepSpeed ZeRO-3 with optimizer/parameter offload (EasyContext's setting)
    python bench/sp_train.py --nproc 8 --model shape:llama-2-7b \\
        --accelerate-config accelerate_configs/single_node.yaml \\
        --modes zigzag_ring_attn ulysses_attn usp_attn dist_flash_attn --seq 65536 131072 524288 716800 \\
        --checkpointing full --kernel cudnn --out results/h200/sp_train.jsonl
    # longest context, 8 GPUs
    python bench/sp_train.py --nproc 8 --model shape:llama-3-8b \\
        --accelerate-config accelerate_configs/single_node.yaml \\
        --modes ulysses_attn --search 2097152 8388608 --max-probes 4 --steps 1 \\
        --checkpointing offload --chunked-rmsnorm --tiled-mlp 64 --kernel cudnn
    # CPU, 2 gloo ranks (what the tests run)
    python bench/sp_train.py --nproc 2 --model tiny-llama --vocab-size 256 --seq 512 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isolated_run import ROOT, record, run_isolated  # noqa: E402
from length_search import longest_ok  # noqa: E402

CPU_CONFIG = os.path.join(ROOT, "accelerate_configs", "cpu_2proc.yaml")
GB = 2**30
SET_HERE = {"--parallel_mode", "--parallel-mode", "--seq-length", "--dataset", "--output-dir", "--model",
            "--max-train-steps", "--gradient-accumulate-every", "--warmup-steps", "--no-save"}  # fmt: skip


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes (GPUs) of this host (default: the accelerate config's, else 1)",
    )
    p.add_argument("--model", default="shape:llama-2-7b")
    p.add_argument("--modes", nargs="+", default=["zigzag_ring_attn"], help="train.py --parallel_mode values")
    p.add_argument("--seq", type=int, nargs="*", default=[], help="measure these lengths")
    p.add_argument("--search", type=int, nargs=2, metavar=("LO", "HI"), help="longest length that trains")
    p.add_argument("--max-probes", type=int, default=4)
    p.add_argument("--granularity", type=int, default=65536)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the last one is reported)")
    p.add_argument(
        "--accelerate-config",
        default=None,
        help="accelerate config file (default: plain multi-GPU launch; on CPU the 2-process gloo config)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--out", default=None, help="append one JSON row per run")
    args, train_args = p.parse_known_args(argv)
    if not args.seq and not args.search:
        p.error("give --seq lengths to measure and/or --search LO HI")
    given = {a.split("=", 1)[0] for a in train_args if a.startswith("--")}
    for flag in sorted(given & SET_HERE):
        p.error(f"{flag} is set by this script (use --modes / --seq / --search / --model / --steps)")
    return args, train_args


def train_dtype(train_args: list[str]) -> str:
    """train.py's --dtype among the passed-through arguments (its default: bfloat16)."""
    for i, a in enumerate(train_args):
        if a.startswith("--dtype="):
            return a.split("=", 1)[1]
        if a == "--dtype" and i + 1 < len(train_args):
            return train_args[i + 1]
    return "bfloat16"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher(args, train_args: list[str]) -> tuple[list[str], dict]:
    """The ``accelerate launch`` prefix and the environment it needs."""
    import torch

    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        str(free_port()),
    ]  # a fresh port: the last run's may still be in TIME_WAIT
    if args.nproc or not args.accelerate_config:
        cmd += ["--num_processes", str(args.nproc or 1)]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if not torch.cuda.is_available():  # gloo ranks: accelerate synchronises CPU processes only when told so
        env |= {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
        cmd += ["--config_file", args.accelerate_config or CPU_CONFIG]
        return cmd, env
    # GPUs: the launch's mixed precision follows train.py's --dtype (under DeepSpeed ZeRO-3 it decides the dtype
    # the parameters are created in; train.py refuses a mismatch)
    cmd += ["--mixed_precision", "bf16" if train_dtype(train_args) == "bfloat16" else "no"]
    if args.accelerate_config:
        cmd += ["--config_file", args.accelerate_config]
    else:
        cmd += ["--multi_gpu"] if (args.nproc or 1) > 1 else []
        cmd += ["--num_machines", "1", "--dynamo_backend", "no"]
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return cmd, env


def read_metrics(output_dir: str) -> dict:
    """The last optimizer step of train.py's metrics.jsonl (rank 0), and the engine it reported."""
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    engine_path = os.path.join(output_dir, "engine.txt")
    engine = open(engine_path).read().strip() if os.path.exists(engine_path) else None
    row = {"steps": last["step"], "loss": round(last["loss"], 4), "tokens_per_s": round(last["tokens_per_s"], 1),
           "peak_mem_gib": round(last["peak_mem_bytes"] / GB, 2), "engine": engine}  # fmt: skip
    if "mfu" in last:
        row["mfu"] = round(last["mfu"], 4)
    if "peak_host_bytes" in last:
        row["peak_host_gib"] = round(last["peak_host_bytes"] / GB, 2)
    return row


def run(args, train_args: list[str], mode: str, seq: int, workdir: str) -> dict:
    out_dir = os.path.join(workdir, f"{mode}_{seq}")
    train = [os.path.join(ROOT, "train.py"), "--model", args.model, "--dataset", "random:64", "--output-dir",
             out_dir, "--seq-length", str(seq), "--parallel_mode", mode, "--max-train-steps", str(args.steps),
             "--gradient-accumulate-every", "1", "--warmup-steps", "0", "--no-save", *train_args]  # fmt: skip
    prefix, env = launcher(args, train_args)
    shown = ["python bench/sp_train.py", *(["--nproc", str(args.nproc)] if args.nproc else []),
             *(["--accelerate-config", args.accelerate_config] if args.accelerate_config else []),
             "--model", args.model, "--modes", mode, "--seq", str(seq), "--steps", str(args.steps),
             *train_args]  # fmt: skip
    row = {"name": "sp_train", "model": args.model, "mode": mode, "seq": seq, "nproc": args.nproc,
           "command": " ".join(shown)}  # fmt: skip
    return run_isolated(prefix + train, row, args.timeout, args.out, collect=lambda: read_metrics(out_dir), env=env,
                        cwd=ROOT)  # fmt: skip


def main(argv=None) -> None:
    args, train_args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sp_train_") as workdir:
        for mode in args.modes:
            for seq in args.seq:
                run(args, train_args, mode, seq, workdir)
            if args.search:
                found = longest_ok(lambda s, m=mode: run(args, train_args, m, s, workdir)["status"], *args.search,
                                   args.granularity, args.max_probes)  # fmt: skip
                summary = {"name": "sp_train_longest", "model": args.model, "mode": mode, "nproc": args.nproc}
                record(summary | found, args.out)


if __name__ == "__main__":
    main()
