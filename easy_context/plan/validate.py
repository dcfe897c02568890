"""The planner held against measurements: the published anchors, and the probes of ``bench/max_context.py``
(``--validate``; docs/planner.md, "Validation")."""

from __future__ import annotations

import json
import re

from easy_context.models.resolve import load_model_shape
from easy_context.models.shapes import GIB, parse_size
from easy_context.plan.options import OPTION_BY_NAME, parse_config
from easy_context.plan.setup import NORMS, Setup
from easy_context.plan.solve import best_prediction
from easy_context.plan.terms import build_budget

ANCHORS = (
    # (label, model, gpus, gpu_mem, host_mem, mode, option, published S)
    ("ALST Llama-3-8B 1x H100-80GB", "llama-3-8b", 1, "80GiB", "1TB", "data_parallel", "offload+tiled+chunked",
     500_000),
    ("ALST Llama-3-8B 1x H200", "llama-3-8b", 1, "141GB", "2TB", "data_parallel", "offload+tiled+chunked",
     1_200_000),
    ("ALST Llama-3-8B 8x H100-80GB", "llama-3-8b", 8, "80GiB", "2TB", "ulysses_attn", "offload+tiled+chunked",
     3_700_000),
    ("EasyContext Llama-2-7B 8x A100-80GB", "llama-2-7b", 8, "80GiB", "1TB", "zigzag_ring_attn", "offload", 700_000),
)  # fmt: skip


def anchors() -> list[dict]:
    """The published settings next to this model's prediction with each RMSNorm model: ``predicted`` /
    ``limited_by`` / ``config`` with transformers' eager norm (what the anchors table of docs/planner.md shows),
    ``predicted_chunked`` / ... with ``enable_chunked_rmsnorm``."""
    out = []
    for label, model, gpus, gmem, hmem, mode, opt, published in ANCHORS:
        row = dict(label=label, mode=mode, option=opt, gpu_mem=gmem, host_mem=hmem, published=published)
        for norm in NORMS:
            setup = Setup(gpus=gpus, gpu_mem=parse_size(gmem), host_mem=parse_size(hmem), norm=norm)
            p = best_prediction(load_model_shape(model), setup, mode, OPTION_BY_NAME[opt])
            suffix = "" if norm == "eager" else f"_{norm}"
            row |= {f"predicted{suffix}": p.max_seq, f"limited_by{suffix}": p.limited_by, f"config{suffix}": p.config}
        out.append(row)
    return out


def format_anchors(rows: list[dict]) -> str:
    """The anchors of :func:`anchors` as a table."""
    head = (f"  {'setting':<37}{'mode':<18}{'option':<23}{'published':>10}  {'eager norm (bound)':<29}"
            f"chunked norm (bound)")  # fmt: skip
    lines = ["Published anchors vs this model (not fitted):",
             head, "  " + "-" * (len(head) - 2)]  # fmt: skip
    for a in rows:
        eager = f"{a['predicted']:>10,} ({a['limited_by']})"
        chunked = f"{a['predicted_chunked']:>10,} ({a['limited_by_chunked']})"
        lines.append(f"  {a['label']:<37}{a['mode']:<18}{a['option']:<23}{a['published']:>10,}  {eager:<29}{chunked}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- the probes
PROBE_OPTIMIZERS = {"host_adamw": "host_adamw", "adamw": "ddp"}  # bench/max_context.py --optimizer -> --optim


def read_probes(path: str) -> list[dict]:
    """The successful ``max_context_probe`` rows of a ``bench/max_context.py --out`` JSONL file."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if row.get("name") == "max_context_probe" and row.get("status") == "ok":
                    rows.append(row)
    return rows


def _flag(command: str, name: str) -> int | None:
    """The integer value of ``name`` in a probe's command line, None when absent."""
    m = re.search(rf"{name}[ =](\d+)", command or "")
    return int(m.group(1)) if m else None


def validate_probe(row: dict, **setup_kw) -> dict:
    """The planner at one measured probe of ``bench/max_context.py`` (one GPU, ``data_parallel``, micro-batch 1,
    ``offload-split+tiled+chunked`` with the probe's own number of offloaded layers ``offload_layers``, its MLP
    tile, chunk-1024 loss), next to what was measured. ``setup_kw`` overrides :class:`Setup` fields (frag,
    cuda_reserve, host_reserve, ...); ``norm`` defaults to the probe's own (``chunked`` when its command has
    ``--chunked-rmsnorm``, else ``eager``). Sizes in GiB; ``err_*`` = predicted / measured - 1.

    GPU: ``pred_gpu_allocated`` (the tensors of the peak phase) is compared with the measured peak allocated,
    ``pred_gpu_reserved`` (allocated x (1 + frag): what the caching allocator holds) with the measured peak
    reserved; ``pred_gpu_total`` adds the CUDA context reserve (outside the allocator, not in the measurement).
    Host: the steady-state host peak (``pred_host``; its phase ``host_phase``), and ``pred_host_lazy``: the peak
    of a first step whose optimizer state is allocated lazily at the step (after the backward), i.e. the larger of
    the forward/backward without the optimizer's host bytes and the optimizer step."""
    command = row.get("command", "")
    vocab = row.get("vocab_size") or _flag(command, "--vocab-size")
    shape = load_model_shape(row["model"].removeprefix("shape:"), vocab)
    card_gib = row.get("gpu_mem_cap_gib") or row.get("gpu_total_gib", 80)  # bench/max_context.py --gpu-mem-cap
    kw = dict(gpus=1, gpu_mem=card_gib * GIB, host_mem=parse_size("1TB"),
              optim=PROBE_OPTIMIZERS[row.get("optimizer", "host_adamw")],
              mlp_tile_tokens=_flag(command, "--mlp-tile-tokens") or 8192,
              norm="chunked" if re.search(r"--chunked-rmsnorm\b", command) else "eager",
              checkpoint_every=int(row.get("checkpoint_every", 1)),
              attn_heads_per_call=_flag(command, "--attn-heads-per-call"))  # fmt: skip
    setup = Setup(**(kw | {k: v for k, v in setup_kw.items() if v is not None}))
    option = parse_config("offload-split+tiled+chunked")
    k = int(row["offload_layers"])
    r = build_budget(shape, setup, "data_parallel", option, offload_layers=k).at(int(row["seq"]))
    # a first step whose optimizer state is allocated at the step: no master/moments/staging in the backward
    states = sum(b for n, b in r["host"] if n.startswith("HostAdamW fp32 master") or n.startswith("HostAdamW pinned"))
    lazy_bwd = r["host_phase_totals"]["forward/backward"] - states
    out = dict(
        model=shape.name,
        seq=int(row["seq"]),
        offload_layers=k,
        norm=setup.norm,
        params=shape.params,
        params_measured=row.get("params"),
        gpu_phase=r["peak_phase"],
        pred_gpu_allocated=r["gpu_allocated"] / GIB,
        pred_gpu_reserved=(1 + setup.frag) * r["gpu_allocated"] / GIB,
        pred_gpu_total=r["gpu_total"] / GIB,
        gpu_allocated=row["peak_gpu_gib"],
        gpu_reserved=row["peak_gpu_reserved_gib"],
        host_phase=r["host_peak_phase"],
        pred_host=r["host_total"] / GIB,
        pred_host_lazy=max(lazy_bwd, r["host_phase_totals"]["optimizer step"]) / GIB,
        host=row["peak_host_rss_gib"],
    )
    out["err_gpu_allocated"] = out["pred_gpu_allocated"] / out["gpu_allocated"] - 1
    out["err_gpu_reserved"] = out["pred_gpu_reserved"] / out["gpu_reserved"] - 1
    out["err_host"] = out["pred_host"] / out["host"] - 1
    out["err_host_lazy"] = out["pred_host_lazy"] / out["host"] - 1
    return out


def format_validation(checks: list[dict]) -> str:
    """The checks of :func:`validate_probe` as a table (GiB, measured then predicted)."""
    head = (
        f"{'model':<11}{'S':>9}{'k':>4} {'norm':<8}| {'GPU allocated':>13}{'pred':>7}{'err':>7} | {'reserved':>8}"
        f"{'pred':>7}{'err':>7} | {'GPU peak phase':<19}| {'host RSS':>8}{'steady':>8}{'err':>7}{'lazy':>8}{'err':>7}"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        lines.append(
            f"{c['model']:<11}{c['seq']:>9,}{c['offload_layers']:>4} {c['norm']:<8}| {c['gpu_allocated']:>13.2f}"
            f"{c['pred_gpu_allocated']:>7.2f}{c['err_gpu_allocated']:>+7.1%} | {c['gpu_reserved']:>8.2f}"
            f"{c['pred_gpu_reserved']:>7.2f}{c['err_gpu_reserved']:>+7.1%} | {c['gpu_phase']:<19}| {c['host']:>8.2f}"
            f"{c['pred_host']:>8.2f}{c['err_host']:>+7.1%}{c['pred_host_lazy']:>8.2f}{c['err_host_lazy']:>+7.1%}"
        )
    lines += [
        "GiB (measured, then predicted); k = layer inputs offloaded (the probe's own); norm = RMSNorm model (the",
        "probe's own unless --norm); reserved: predicted = allocated x (1 + frag); host: peak RSS vs the steady state",
        "(optimizer state allocated before the step) and vs a run whose optimizer state is allocated lazily at its",
        "first step (after the backward)",
    ]
    return "\n".join(lines)
