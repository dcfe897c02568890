"""End-to-end training step of a full-size model on one GPU: tokens/s, MFU, peak GPU and host memory.

Random weights (speed and memory do not depend on them), random tokens, micro-batch 1, AdamW on every
parameter. Each (length, configuration) runs in a fresh subprocess, so an out-of-memory run is recorded and the
next one starts clean::

    python bench/train_step.py --model shape:llama-2-7b --seq 16384 32768 65536 --checkpointing attn \\
        --kernel cudnn --compile --out results.jsonl
    python bench/train_step.py --model shape:llama-2-7b --seq 65536 --baseline   # stock HF sdpa + checkpointing
    python bench/train_step.py --model shape:llama-2-7b --seq 65536 --baseline liger   # + Liger, as users apply it

``--baseline`` (= ``--baseline stock``) is the reference the issue measured: transformers' own attention
(``sdpa``), its own loss (full fp32 logits), plain per-layer checkpointing and torch AdamW. ``--baseline liger``
is what a user assembles from transformers and Liger-Kernel: the stock model with ``sdpa``, Liger's patch for the
model type with its defaults (``apply_liger_kernel_to_llama(model=model)``: RoPE, RMSNorm, SwiGLU and the fused
linear cross-entropy on the hidden states and the LM-head weight) and ``model.gradient_checkpointing_enable()``.
Otherwise the step is easy_context's: the attention through our kernel interface (``data_parallel`` backend, one
GPU), the LM-head loss (``--loss auto``: Liger's fused kernel when liger-kernel is installed on a GPU, else the
chunked loss; rows record the resolved name), the chosen checkpointing mode (``attn`` =
checkpoint-after-attention) and optionally compiled norms/MLP/RoPE.

MFU = (6 N + attention FLOPs) x tokens / step time / 989 TFLOP/s (``easy_context.training.flops``: each layer's
attention as it is masked, full causal or sliding window; recompute is not counted). ``--profile DIR`` writes a
torch-profiler table (CUDA time per op) of one extra step.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from isolated_run import ROOT, emit, python_command, run_isolated  # noqa: E402

BASELINES = ("stock", "liger")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="shape:llama-2-7b",
                   help="any name the other commands take (easy_context.models.resolve): shape:<name> or a published "
                        "name, a preset, a config folder, a fetch name, a checkpoint")  # fmt: skip
    p.add_argument("--vocab-size", type=int, default=None, help="override the vocab (presets: 256)")
    p.add_argument("--seq", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    p.add_argument("--checkpointing", default="attn", help="easy_context.memory.CHECKPOINT_MODES")
    p.add_argument("--kernel", default="auto", help="local attention kernel (cudnn, flash, efficient, auto, cpu)")
    p.add_argument(
        "--loss",
        default="auto",
        help="LM-head loss: auto (liger on CUDA with liger-kernel, else "
        "chunked; resolved before the run), chunked, plain, liger, cce",
    )
    p.add_argument("--tiled-mlp", type=int, default=0, metavar="TILES")
    p.add_argument("--chunked-rmsnorm", action="store_true", help="easy_context.memory.enable_chunked_rmsnorm")
    p.add_argument("--compile", action="store_true", help="torch.compile the norms, MLP and RoPE of every layer")
    p.add_argument("--compile-mlp", default="auto", choices=["auto", "split", "whole"],
                   help="--compile: the MLP's gated product only, the down projection eager (its recompute is then "
                        "skipped under checkpointing), or the whole MLP; auto: whole with --fp8 (its casts fuse: "
                        "+7.4 %% at 64K on the H200), else split (+1.6 %%)")  # fmt: skip
    p.add_argument(
        "--baseline",
        nargs="?",
        const="stock",
        default=None,
        choices=BASELINES,
        help="a peer instead of ours: stock (the bare flag: transformers sdpa + HF loss + checkpointing) "
        "or liger (stock + Liger-Kernel's patch with its defaults + HF gradient checkpointing)",
    )
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--fp8", action="store_true", help="float8 decoder linears (easy_context.training.fp8, rowwise)")
    p.add_argument("--steps", type=int, default=2, help="timed steps (after one warm-up step)")
    p.add_argument("--profile", default=None, metavar="DIR", help="write a profiler table of one more step here")
    p.add_argument("--label", default="", help="free text stored with each result")
    p.add_argument("--out", default=None, help="append one JSON object per run to this file")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ worker
def compile_layers(model, split_mlp: bool = True) -> dict:
    """Regional torch.compile (easy_context.training.compile.compile_regions): norms, the MLP's gated product (the
    whole MLP with --compile-mlp whole) and RoPE; attention and the checkpointing wrappers stay eager."""
    from easy_context.training.compile import compile_regions

    return compile_regions(model, split_mlp=split_mlp)


def apply_liger_peer(model) -> None:
    """Liger-Kernel as its README has users apply it to a built model: ``apply_liger_kernel_to_<model_type>`` with
    its defaults (for Llama: rope, rms_norm, swiglu and fused_linear_cross_entropy on; the model's ``forward``
    then computes the loss from the hidden states and ``lm_head.weight`` without logits)."""
    try:
        import liger_kernel.transformers as liger
    except ImportError as exc:
        raise ImportError(f"--baseline liger needs liger-kernel: pip install liger-kernel ({exc})") from exc
    patch = getattr(liger, f"apply_liger_kernel_to_{model.config.model_type}", None)
    if patch is None:
        raise ValueError(f"liger-kernel has no apply_liger_kernel_to_{model.config.model_type}")
    patch(model=model)


def build(args, seq: int):
    import torch

    from easy_context.loss import CausalLMWithLoss
    from easy_context.memory import apply_checkpointing, enable_chunked_rmsnorm, enable_tiled_mlp
    from easy_context.models import PRESETS, load_model
    from easy_context.sp_config import SPConfig

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with device:
        vocab = args.vocab_size or (256 if args.model in PRESETS else None)
        model = load_model(args.model, vocab_size=vocab, dtype=dtype, max_position_embeddings=seq)
    model.train()
    if args.fp8:  # before torch.compile
        from easy_context.training.fp8 import enable_fp8_linears

        enable_fp8_linears(model)
    if args.baseline:
        model.set_attn_implementation("sdpa")
        if args.baseline == "liger":
            apply_liger_peer(model)
            model.gradient_checkpointing_enable()
        else:
            apply_checkpointing(model, "full")
        return model, None, device
    SPConfig("data_parallel", kernel=args.kernel).attach(model, through_easy_context=True)  # our kernel interface
    apply_checkpointing(model, args.checkpointing)
    if args.tiled_mlp:
        enable_tiled_mlp(model, num_tiles=args.tiled_mlp)
    if args.chunked_rmsnorm:
        enable_chunked_rmsnorm(model)
    if args.compile:
        compile_layers(model, split_mlp=args.compile_mlp == "split" or (args.compile_mlp == "auto" and not args.fp8))
    return model, CausalLMWithLoss(model, impl=args.loss), device


def run_worker(args) -> dict:
    import torch

    from easy_context.training.flops import peak_flops, train_flops_per_token

    seq = args.seq[0]
    model, with_loss, device = build(args, seq)
    cuda = device.type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=cuda)  # states in the parameter dtype (bf16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, seq + 1), generator=g).to(device)
    inputs, targets, positions = ids[:, :-1], ids[:, 1:], torch.arange(seq, device=device)[None]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        if with_loss is None:
            loss = model(input_ids=inputs, position_ids=positions, labels=ids[:, :-1], use_cache=False).loss
        else:
            loss_sum, n = with_loss(inputs, positions, targets)
            loss = loss_sum / n
        loss.backward()
        sync()
        t1 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return t1 - t0, time.perf_counter() - t1, loss.item()

    step()  # warm-up: kernel probes, compilation, optimizer states
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = [step() for _ in range(args.steps)]
    fwd_bwd = min(t[0] for t in times)
    opt = min(t[1] for t in times)
    step_s = min(t[0] + t[1] for t in times)
    flops = train_flops_per_token(model.config, seq) * seq
    peak = peak_flops(torch.cuda.get_device_name(device)) if cuda else None
    result = {
        "seq": seq,
        "step_s": round(step_s, 4),
        "fwd_bwd_s": round(fwd_bwd, 4),
        "optimizer_s": round(opt, 4),
        "tokens_per_s": round(seq / step_s, 1),
        "tflops": round(flops / step_s / 1e12, 1),
        "mfu": round(flops / step_s / peak, 4) if peak else None,
        "final_loss": round(times[-1][2], 4),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
        "peak_gpu_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2) if cuda else None,
        "peak_host_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
    }
    if "liger_kernel" in sys.modules:
        result["liger_kernel"] = _version("liger-kernel")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            step()
        sort = "cuda_time_total" if cuda else "cpu_time_total"
        os.makedirs(args.profile, exist_ok=True)
        name = os.path.join(args.profile, f"profile_{args.label or 'run'}_{seq}.txt")
        with open(name, "w") as f:
            f.write(prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=70))
        result["profile"] = name
    return result


# ------------------------------------------------------------------------------------------------ parent
def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def config_of(args) -> dict:
    if args.baseline == "liger":
        return {"peer": "liger", "attention": "hf sdpa",
                "loss": "liger fused linear CE (apply_liger_kernel_to_<model> defaults: rope, rms_norm, swiglu, flce)",
                "checkpointing": "hf gradient_checkpointing_enable()", "compile": False}  # fmt: skip
    if args.baseline:
        return {"attention": "hf sdpa", "loss": "hf (fp32 logits)", "checkpointing": "full", "compile": False,
                "fp8": args.fp8}  # fmt: skip
    return {
        "attention": f"easy_context data_parallel, kernel {args.kernel}",
        "loss": args.loss,
        "checkpointing": args.checkpointing,
        "tiled_mlp": args.tiled_mlp,
        "compile": args.compile
        and (args.compile_mlp if args.compile_mlp != "auto" else "whole" if args.fp8 else "split"),
        "fp8": args.fp8,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        emit(run_worker(args))
        return
    argv = list(sys.argv[1:] if argv is None else argv)
    check_model(args.model)
    requested = args.loss
    if not args.baseline:  # once, here: every run and its row get the concrete loss
        argv = resolve_loss_flag(args, argv)
    for seq in args.seq:
        child = [a for i, a in enumerate(argv) if a != "--seq" and not _is_seq_value(argv, i)]
        row = {"name": "train_step", "model": args.model, "label": args.label, **config_of(args), "seq": seq,
               "command": "python bench/train_step.py " + " ".join(child) + f" --seq {seq}"}  # fmt: skip
        if requested != args.loss:
            row["loss_requested"] = requested
        cmd = python_command(os.path.abspath(__file__), [*child, "--seq", str(seq), "--worker"])
        run_isolated(cmd, row, args.timeout, args.out)


def check_model(name: str) -> None:
    """Stop with the one line every command gives for a model name it cannot load (a fetch name not fetched, ...)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from easy_context.models.source import model_source_error

    error = model_source_error(name)
    if error:
        sys.exit(f"error: {error}")


def resolve_loss_flag(args, argv: list[str]) -> list[str]:
    """``argv`` with ``--loss`` replaced by the concrete loss for this machine (``auto`` resolved), which is also
    set on ``args``; a CUDA-only loss that cannot run here stops with one line."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from easy_context.loss import resolve_loss_impl

    try:
        args.loss, why = resolve_loss_impl(args.loss)
    except (ImportError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    print(f"loss: {why}", flush=True)
    kept = [a for i, a in enumerate(argv) if not a.startswith("--loss=") and a != "--loss"
            and not (i > 0 and argv[i - 1] == "--loss")]  # fmt: skip
    return [*kept, "--loss", args.loss]


def _is_seq_value(argv: list[str], i: int) -> bool:
    """Whether argv[i] is one of the values following ``--seq``."""
    j = i
    while j > 0 and not argv[j - 1].startswith("--"):
        j -= 1
    return j > 0 and argv[j - 1] == "--seq" and not argv[i].startswith("--")


if __name__ == "__main__":
    main()
