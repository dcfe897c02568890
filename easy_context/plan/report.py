"""The planner's answers as text: the byte breakdown, the summary table, a row as train.py flags."""

from __future__ import annotations

import math

from easy_context.models.shapes import GB, ModelShape
from easy_context.plan.budget import Budget
from easy_context.plan.options import parse_config
from easy_context.plan.setup import Setup
from easy_context.plan.solve import Prediction

OPTIM_CONFIGS = {  # how each --optim is launched, for {gpus} processes
    "zero3_offload": "accelerate launch --config_file accelerate_configs/single_node.yaml --num_processes {gpus}",
    "zero3_offload_optimizer": "accelerate launch --config_file CONFIG (easy_context.launch_configs.zero3_config("
    "'zero3_offload_optimizer', {gpus}, FOLDER) writes it)",
    "zero3": "accelerate launch --config_file CONFIG (easy_context.launch_configs.zero3_config('zero3', {gpus}, "
    "FOLDER) writes it)",
    "ddp": "accelerate launch --multi_gpu --num_processes {gpus}",
    "host_adamw": "accelerate launch --multi_gpu --num_processes {gpus}",
}


def _gb(x: float) -> str:
    """Bytes as GB (1e9), two decimals."""
    return f"{x / GB:,.2f}"


def _tok(n: int) -> str:
    """A token count with thousands separators, "-" for none."""
    return f"{n:,}" if n else "-"


def format_header(shape: ModelShape, setup: Setup) -> str:
    """One line: the model's shape and parameters, the hardware and the setup."""
    return (
        f"{shape.name}: {shape.params / 1e9:.2f}B params (h={shape.hidden}, L={shape.layers}, heads={shape.heads}/"
        f"{shape.kv_heads} kv, head_dim={shape.head_dim}, i={shape.intermediate}, V={shape.vocab}); {setup.gpus} GPU "
        f"x {_gb(setup.gpu_mem)} GB, host {_gb(setup.host_mem)} GB/node ({setup.procs_per_node} GPUs/node), "
        f"SP size {setup.sp_size}, {setup.optim}, {setup.norm} RMSNorm"
    )


def format_run(setup: Setup, flags: str) -> str:
    """The breakdown's row as a run: how ``--optim`` is launched, and the train.py flags (:func:`train_flags`)."""
    launch = OPTIM_CONFIGS[setup.optim].format(gpus=setup.gpus)
    return f"  as a run ({setup.optim}; {launch}): train.py {flags}"


def format_breakdown(shape: ModelShape, setup: Setup, budget: Budget, seq: int) -> str:
    """The byte budget of ``budget`` at ``seq`` tokens: GPU components of the peak phase, host per node."""
    r = budget.at(seq)
    lay = budget.layout
    split = ""
    if budget.option.checkpointing == "offload-split":
        split = f"; {budget.offload_layers} of {budget.layers} stored layer inputs offloaded"
    lines = [
        f"Byte budget per GPU at S = {seq:,} tokens ({lay.seq_algo}, {budget.option.name}, {setup.optim}, "
        f"{setup.norm} RMSNorm; "
        f"{r['local_tokens']:,.0f} tokens per rank{split})",
        f"  GPU, peak phase = {r['peak_phase']!r} (GB):",
    ]
    width = max(len(n) for n, _ in r["gpu"] + r["host"]) + 2
    lines += [f"    {n:<{width}}{_gb(b):>10}" for n, b in r["gpu"]]
    lines.append(f"    {'TOTAL (peak)':<{width}}{_gb(r['gpu_total']):>10}   of {_gb(setup.gpu_mem)}")
    others = ", ".join(f"{p} {_gb(t)}" for p, t in r["phase_totals"].items())
    lines.append(f"    phase totals: {others}")
    lines.append(f"  host per node ({setup.procs_per_node} processes), peak phase = {r['host_peak_phase']!r} (GB):")
    lines += [f"    {n:<{width}}{_gb(b):>10}" for n, b in r["host"]]
    lines.append(f"    {'TOTAL':<{width}}{_gb(r['host_total']):>10}   of {_gb(setup.host_mem)}")
    others = ", ".join(f"{p} {_gb(t)}" for p, t in r["host_phase_totals"].items())
    lines.append(f"    phase totals: {others}")
    return "\n".join(lines)


def train_flags(shape: ModelShape, setup: Setup, mode: str, config: str, seq: int, budget: Budget) -> str:
    """The train.py flags that select ``mode`` and the memory configuration ``config`` (a :func:`parse_config`
    name) at ``seq`` tokens: what a planner row means on the command line."""
    option, r = parse_config(config), budget.at(seq)
    flags = [f"--parallel_mode {mode}", f"--seq-length {seq}"]
    if setup.sp_size != setup.gpus:
        flags.append(f"--sp-size {setup.sp_size}")
    flags += [f"--{name.replace('_', '-')} {value}" for name, value in budget.layout.options.items()]
    flags.append("--checkpointing " + ("full" if option.checkpointing == "full" else "offload"))
    if option.checkpointing == "offload-split":
        flags.append(f"--offload-layers {r['offload_layers']}")
    if setup.checkpoint_every > 1:
        flags.append(f"--checkpoint-every {setup.checkpoint_every}")
    if option.tiled_mlp:
        tile = setup.mlp_tile_tokens or shape.hidden
        flags.append(f"--tiled-mlp {setup.mlp_tiles or max(1, math.ceil(r['local_tokens'] / tile))}")
    flags.append("--loss " + ("chunked" if option.chunked_loss else "plain"))
    if setup.norm == "chunked":
        flags.append("--chunked-rmsnorm")
    if setup.attn_heads_per_call:
        flags.append(f"--attn-heads-per-call {setup.attn_heads_per_call}")
    if setup.optim == "host_adamw":
        flags.append("--optimizer host_adamw")
    return " ".join(flags)


def format_summary(preds: list[Prediction], setup: Setup) -> str:
    """The longest S per mode (rows) x memory option (columns), what bounds each, and the notes."""
    modes = list(dict.fromkeys(p.mode for p in preds))
    opts = list(dict.fromkeys(p.option for p in preds))
    by = {(p.mode, p.option): p for p in preds}
    w0 = max(len(m) for m in modes) + 8
    cols = [max(len(o), 16) for o in opts]
    head = f"{'max S (tokens)':<{w0}}" + "".join(f"{o:>{c + 2}}" for o, c in zip(opts, cols))
    lines = [head, "-" * len(head)]
    notes = []
    for m in modes:
        label = m
        rd = by[(m, opts[0])].ring_degree
        if rd is not None and by[(m, opts[0])].limited_by != "infeasible":
            label = f"{m} (R={rd})"
        cells = []
        for o, c in zip(opts, cols):
            p = by[(m, o)]
            if p.limited_by == "infeasible":
                cells.append(f"{'infeasible':>{c + 2}}")
                if p.reason not in notes:
                    notes.append(p.reason)
            else:
                tag = ("h" if p.limited_by == "host" else "g") + ("*" if p.config != p.option else " ")
                cells.append(f"{_tok(p.max_seq) + ' ' + tag:>{c + 2}}")
        lines.append(f"{label:<{w0}}" + "".join(cells))
    for o in opts:
        split = [f"{m} {by[(m, o)].offload_layers}" for m in modes if by[(m, o)].offload_layers is not None]
        if split and o.startswith("offload-split"):
            lines.append(f"{o}: layer inputs offloaded at max S (the host full, the rest on GPU): {', '.join(split)}")
    lines.append("g = bounded by GPU memory, h = by host memory; S rounded down to lcm(seq_multiple, 1024)")
    lines.append("* = reached with a subset of the option's features (the others cost more than they save here)")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
