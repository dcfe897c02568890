"""Longest sequence for which one full-parameter training step fits on one GPU (binary search, one probe per process).

A probe is one complete step at length S of a full-size model with random weights (micro-batch 1): forward,
backward and the AdamW step on every parameter, with the whole memory stack:

- attention through our kernel interface (``data_parallel`` backend: the whole sequence on this GPU);
- activation checkpointing of every decoder layer with the layer inputs offloaded to host memory -- as many
  layers as the host can hold next to the optimizer states (``--offload-layers auto``), the others on the GPU;
  pageable host blocks (the pinned allocator rounds each block up to a power of two);
- tiled MLP (``--mlp-tile-tokens`` tokens per tile) and the chunked LM-head loss (no (S, vocab) logits);
- optimizer states offloaded: :class:`easy_context.training.host_adamw.HostAdamW` (fp32 master + moments on the host,
  12 B/param; DeepSpeed ZeRO-3 offload needs 18 B/param on the host, more than a 128 GB host has for 8B);
- ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

::

    python bench/max_context.py --model shape:llama-3-8b --seq 65536 131072         # probe these lengths
    python bench/max_context.py --model shape:llama-3-8b --search 262144 524288 --max-probes 4

Each probe appends one JSON object (status ok / oom / error / timeout, peak GPU and host memory, step time) to
``--out``. A search keeps the longest successful length (multiple of ``--granularity``).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from isolated_run import emit, python_command, record, run_isolated  # noqa: E402
from length_search import longest_ok  # noqa: E402

GB = 1e9


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="shape:llama-3-8b")
    p.add_argument("--vocab-size", type=int, default=None, help="override the vocab (presets: 256)")
    p.add_argument("--seq", type=int, nargs="*", default=[], help="probe exactly these lengths")
    p.add_argument("--search", type=int, nargs=2, metavar=("LO", "HI"), help="binary search in [LO, HI]")
    p.add_argument("--max-probes", type=int, default=5)
    p.add_argument("--granularity", type=int, default=8192)
    p.add_argument("--kernel", default="auto")
    p.add_argument("--offload-layers", default="auto", help="'auto' (what the host holds), 'all', or a number")
    p.add_argument("--host-reserve-gb", type=float, default=8.0, help="host memory kept free for the runtime")
    p.add_argument("--chunked-rmsnorm", action="store_true", help="easy_context.memory.enable_chunked_rmsnorm")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="K",
                   help="store one layer input per K layers, regenerate the others (strided_checkpoint)")  # fmt: skip
    p.add_argument("--mlp-tile-tokens", type=int, default=8192)
    p.add_argument("--attn-heads-per-call", type=int, default=None, metavar="N",
                   help="at most N query heads per attention kernel call (train.py's flag)")  # fmt: skip
    p.add_argument("--optimizer", default="host_adamw", choices=["host_adamw", "adamw"])
    p.add_argument(
        "--gpu-mem-cap",
        default=None,
        metavar="SIZE",
        help="act as a card of this size (24GB, 24GiB): the caching allocator may hold SIZE minus what "
        "is outside it at start (the CUDA context), torch.cuda.set_per_process_memory_fraction",
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds per probe")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.checkpoint_every < 1:
        p.error(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    return args


def host_available_bytes() -> float:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def offloadable_layers(args, seq: int, n_params: int, hidden: int, layers: int) -> int:
    """How many stored layer inputs (seq x hidden bf16 each) the host holds next to the optimizer's 12 B/param
    (``layers``: the stored ones, one per ``--checkpoint-every`` layers)."""
    if args.offload_layers == "all":
        return layers
    if args.offload_layers != "auto":
        return int(args.offload_layers)
    optimizer = 12 * n_params if args.optimizer == "host_adamw" else 0
    free = host_available_bytes() - optimizer - args.host_reserve_gb * GB
    return max(0, min(layers, int(free // (seq * hidden * 2))))


# ------------------------------------------------------------------------------------------------ worker
_START = time.perf_counter()


def progress(msg: str) -> None:
    """One progress line on stderr (the parent keeps the last ones when a probe times out or fails)."""
    import torch

    mem = ""
    if torch.cuda.is_available():
        now, peak = torch.cuda.memory_allocated() / 2**30, torch.cuda.max_memory_allocated() / 2**30
        mem = f", GPU {now:.1f} GiB (peak {peak:.1f})"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"[{time.perf_counter() - _START:7.1f} s] {msg}{mem}, host peak {rss:.1f} GiB", file=sys.stderr, flush=True)


def run_probe(args, seq: int) -> dict:
    import torch

    from easy_context.loss import CausalLMWithLoss
    from easy_context.memory import enable_chunked_rmsnorm, enable_offloaded_checkpointing, enable_tiled_mlp
    from easy_context.models import PRESETS, load_model
    from easy_context.sp_config import SPConfig
    from easy_context.training.host_adamw import HostAdamW

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cap = cap_gpu_memory(args.gpu_mem_cap, device) if args.gpu_mem_cap else {}
    with device:
        vocab = args.vocab_size or (256 if args.model in PRESETS else None)
        model = load_model(args.model, vocab_size=vocab, dtype=dtype, max_position_embeddings=seq)
    model.train()
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    stored = -(-cfg.num_hidden_layers // args.checkpoint_every)
    k = offloadable_layers(args, seq, n_params, cfg.hidden_size, stored)
    sp = SPConfig("data_parallel", kernel=args.kernel, heads_per_call=args.attn_heads_per_call)
    sp.attach(model, through_easy_context=True)  # our kernel interface
    enable_offloaded_checkpointing(model, offload=k > 0, offload_layers=k, pin_memory=False,
                                   checkpoint_every=args.checkpoint_every)  # fmt: skip
    enable_tiled_mlp(model, tile_tokens=args.mlp_tile_tokens)
    if args.chunked_rmsnorm:
        enable_chunked_rmsnorm(model)
    with_loss = CausalLMWithLoss(model, impl="chunked")
    params = [p for p in model.parameters() if p.requires_grad]
    if args.optimizer == "host_adamw":
        optimizer = HostAdamW(params, lr=1e-5, weight_decay=0.0)
        optimizer.init_state()  # steady state: the host holds the optimizer AND the offloaded checkpoints
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, seq + 1), generator=g).to(device)
    positions = torch.arange(seq, device=device)[None]
    states_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None

    progress(f"model, optimizer state and {k} host-offloaded layers ready")

    t0 = time.perf_counter()
    loss_sum, n = with_loss(ids[:, :-1], positions, ids[:, 1:])
    progress("forward done")
    (loss_sum / n).backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    progress("backward done")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    loss = (loss_sum / n).item()
    if not math.isfinite(loss):
        raise RuntimeError(f"non-finite loss {loss}")
    cuda = device.type == "cuda"
    return {
        "seq": seq,
        "params": n_params,
        "offload_layers": k,
        "checkpoint_every": args.checkpoint_every,
        "loss": round(loss, 4),
        "fwd_bwd_s": round(t1 - t0, 2),
        "optimizer_s": round(t2 - t1, 2),
        "gpu_states_gib": round(states_gib, 2) if cuda else None,
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
        "peak_gpu_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2) if cuda else None,
        "gpu_total_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 2) if cuda else None,
        "peak_host_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
    } | cap


def cap_gpu_memory(size: str, device) -> dict:
    """Limit this process to a card of ``size`` bytes: the caching allocator gets ``size`` minus the GPU memory
    already used outside it (the CUDA context); returns what the row records."""
    import torch

    from easy_context.models.shapes import parse_size

    if device.type != "cuda":
        raise SystemExit("error: --gpu-mem-cap needs a CUDA GPU")
    cap = parse_size(size)
    device = torch.device("cuda", torch.cuda.current_device())  # the fraction API wants an index
    free, total = torch.cuda.mem_get_info(device)  # creates the context
    outside = total - free - torch.cuda.memory_reserved(device)
    if cap <= outside or cap > total:
        raise SystemExit(f"error: --gpu-mem-cap {size}: must lie between the {outside / 2**30:.2f} GiB the CUDA "
                         f"context takes and the card's {total / 2**30:.2f} GiB")  # fmt: skip
    torch.cuda.set_per_process_memory_fraction((cap - outside) / total, device)
    return {"gpu_mem_cap_gib": round(cap / 2**30, 3), "outside_allocator_gib": round(outside / 2**30, 3)}


# ------------------------------------------------------------------------------------------------ parent
def probe(args, seq: int, base_argv: list[str]) -> dict:
    row = {"name": "max_context_probe", "model": args.model, "seq": seq, "optimizer": args.optimizer,
           "command": "python bench/max_context.py " + " ".join(base_argv) + f" --seq {seq}"}  # fmt: skip
    cmd = python_command(os.path.abspath(__file__), [*base_argv, "--worker", str(seq)])
    return run_isolated(cmd, row, args.timeout, args.out)


def strip_lengths(argv: list[str]) -> list[str]:
    """argv without --seq/--search and their values (each probe gets its own length)."""
    out, skip = [], False
    for a in argv:
        if a in ("--seq", "--search"):
            skip = True
            continue
        if skip and not a.startswith("--"):
            continue
        skip = False
        out.append(a)
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        emit(run_probe(args, args.worker))
        return
    base = strip_lengths(list(sys.argv[1:] if argv is None else argv))
    for seq in args.seq:
        probe(args, seq, base)
    if args.search:
        found = longest_ok(lambda seq: probe(args, seq, base)["status"], *args.search, args.granularity,
                           args.max_probes)  # fmt: skip
        record({"name": "max_context", "model": args.model} | found, args.out)


if __name__ == "__main__":
    main()
