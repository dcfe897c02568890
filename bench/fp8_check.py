"""FP8 linears (``--fp8``, easy_context.training.fp8) on one GPU: shape rules, GEMM speed, and a loss curve against
bf16 on real text. The 7B step is bench/train_step.py's (gpu_runs/fp8_check.sh runs both).

    python bench/fp8_check.py --out $OUT/fp8_check.jsonl --curves $OUT/fp8_curves.jsonl     # ~2-3 min on one H200
    python bench/fp8_check.py --sections numerics --steps 300
    python bench/fp8_check.py --tiny --emulate        # CPU smoke test of the script (emulated float8, tiny sizes)

Sections (each on its own: a failure records its traceback and the next one runs; one JSON row each to --out):

* ``env``: device, compute capability, torch / torchao versions, whether torchao's C++ extensions loaded (float8
  training does not need them: its GEMM is ``torch._scaled_mm``).
* ``shapes``: a ``Float8Linear`` forward + backward with 4096 tokens, and with 4104 (not a multiple of 16: the inner
  dimension of the weight-gradient GEMM), which ``fp8_shape_error`` refuses up front; records what
  ``torch._scaled_mm`` does with it. Also the forward's error against bf16.
* ``gemm``: a Llama-2-7B MLP (4096 -> 2 x 11008 -> 4096, SiLU gate) on 16384 tokens, forward + backward, compiled,
  bf16 against float8 rowwise: milliseconds and TFLOP/s (6 x tokens x 3 x 4096 x 11008 FLOPs).
* ``numerics``: a Llama-shaped model (hidden 768, 8 layers, 12 heads / 4 KV heads, MLP 2048, byte-level BPE 8192 over
  the text below) trained from scratch, seq 1024 x batch 8, AdamW 1e-3 (20 warm-up steps), fp32 weights under bf16
  autocast, compiled like the 7B bench (norms, MLP, RoPE, float8 attention projections). Runs: bf16 and fp8 for
  seeds 0 and 1 (the seed sets the init and the data order). Every step's loss goes to --curves; held-out loss (the
  text's last 5%) every 50 steps. Verdict: the fp8-bf16 gap of each seed (held-out at the end, and the train loss
  averaged over windows of 25 steps) against the bf16 seed-to-seed spread: "within noise" when the gap is smaller.

Text: PaulGrahamEssays/*.txt when present (the demo's corpus; carry it, it is not tracked), else this repository's
own tracked Markdown and Python files (~1.5 MB).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SECTIONS = ("env", "shapes", "gemm", "numerics")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--steps", type=int, default=250, help="numerics: optimizer steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--emulate", action="store_true", help="torchao's emulated float8 (CPU)")
    p.add_argument("--no-compile", action="store_true", help="numerics: eager")
    p.add_argument("--out", default=None, help="append one JSON row per section here")
    p.add_argument("--curves", default=None, help="numerics: one JSON row per step and run here")
    return p.parse_args(argv)


def emit(path: str | None, row: dict) -> None:
    print(json.dumps(row), flush=True)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ sections
def section_env(args) -> dict:
    import logging

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # torchao's "Failed to load <.so>: ..." lines
    logging.getLogger("torchao").addHandler(handler)
    import torchao

    logging.getLogger("torchao").removeHandler(handler)
    dev = device()
    row = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "torchao": torchao.__version__, "cuda": torch.version.cuda}  # fmt: skip
    if dev.type == "cuda":
        row["capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
    row["torchao_import_warnings"] = [r[:300] for r in records]  # C++ extensions not loaded: float8 needs none
    from easy_context.training.fp8 import fp8_device_error

    row["fp8_device_error"] = fp8_device_error(dev, args.emulate)
    return row


def fp8_linear(in_features: int, out_features: int, emulate: bool) -> torch.nn.Module:
    """One nn.Linear (bf16) and its Float8Linear (the same weight), as a 2-element ModuleList."""
    from torchao.float8 import convert_to_float8_training

    from easy_context.training.fp8 import fp8_config

    plain = torch.nn.Linear(in_features, out_features, bias=False, device=device(), dtype=torch.bfloat16)
    wrapped = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False))
    wrapped[0].weight = plain.weight
    convert_to_float8_training(wrapped, config=fp8_config("rowwise", emulate))
    return torch.nn.ModuleList([plain, wrapped[0]])


def section_shapes(args) -> dict:
    plain, f8 = fp8_linear(1024, 2048, args.emulate)
    row = {}
    for tokens in (4096, 4104):
        x = torch.randn(tokens, 1024, device=device(), dtype=torch.bfloat16, requires_grad=True)
        try:
            y = f8(x)
            y.float().square().mean().backward()
            sync()
            ref = plain(x.detach())
            err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
            row[f"tokens_{tokens}"] = {"ok": True, "fwd_rel_err_vs_bf16": round(err, 5)}
        except Exception as exc:  # what torch._scaled_mm says about a token count not a multiple of 16
            row[f"tokens_{tokens}"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    from easy_context.training.fp8 import fp8_shape_error

    row["fp8_shape_error_4104"] = fp8_shape_error(1, 4104)
    return row


def section_gemm(args) -> dict:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    from easy_context.training.fp8 import enable_fp8_linears

    hidden, inter, tokens = (128, 352, 256) if args.tiny else (4096, 11008, 16384)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=1)
    flops = 6 * tokens * 3 * hidden * inter
    x = torch.randn(1, tokens, hidden, device=device(), dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    row = {"tokens": tokens, "hidden": hidden, "intermediate": inter}
    for name in ("bf16", "fp8"):
        holder = torch.nn.Module()  # enable_fp8_linears converts the linears of .layers (decoder layers)
        holder.layers = torch.nn.ModuleList([torch.nn.Module()])
        holder.layers[0].mlp = LlamaMLP(config).to(device(), torch.bfloat16)
        if name == "fp8":
            enable_fp8_linears(holder, emulate=args.emulate, device=device())
        mlp = holder.layers[0].mlp
        mlp.compile()
        xi = x.clone().requires_grad_()

        def step(mlp=mlp, xi=xi):
            mlp(xi).backward(dy)

        t0 = time.perf_counter()
        step()
        sync()
        first = time.perf_counter() - t0
        reps = 3 if args.tiny else 10
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        sync()
        seconds = (time.perf_counter() - t0) / reps
        row[name] = {"ms": round(seconds * 1e3, 2), "tflops": round(flops / seconds / 1e12, 1),
                     "first_call_s": round(first, 1)}  # fmt: skip
    row["speedup"] = round(row["bf16"]["ms"] / row["fp8"]["ms"], 3)
    return row


# ------------------------------------------------------------------------------------------------ numerics
def corpus() -> tuple[str, str]:
    """(text, where from): the essays when present, else this repository's tracked text files."""
    essays = sorted((ROOT / "PaulGrahamEssays").glob("*.txt"))
    if essays:
        return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in essays), "PaulGrahamEssays"

    files = []
    for folder, dirs, names in os.walk(ROOT):  # not into .venv, .git, out/, build/
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("out", "build"))
        files += [Path(folder) / n for n in sorted(names) if n.endswith((".md", ".py"))]
    return "\n\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in files
    ), f"repository text ({len(files)} files)"


def section_numerics(args) -> dict:
    import tempfile

    import numpy as np
    import transformers.models.llama.modeling_llama as modeling
    from train_step import compile_layers  # bench/train_step.py: what the 7B step compiles
    from transformers import AutoModelForCausalLM, LlamaConfig

    from easy_context.data import train_byte_level_bpe
    from easy_context.training.fp8 import enable_fp8_linears

    text, source = corpus()
    vocab = 512 if args.tiny else 8192
    tokenizer = train_byte_level_bpe([text], vocab, tempfile.mkdtemp(prefix="fp8_tok_"))
    stream = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    split = int(len(stream) * 0.95)
    train_ids, held_ids = torch.from_numpy(stream[:split]), torch.from_numpy(stream[split:])
    seq, rows = (64, 4) if args.tiny else (1024, 8)
    dims = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2) if args.tiny else dict(hidden_size=768, intermediate_size=2048,
                num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4)  # fmt: skip
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=seq, **dims)
    dev = device()
    held = [held_ids[i * (seq + 1) : (i + 1) * (seq + 1)] for i in range(min(16, len(held_ids) // (seq + 1)))]
    held = torch.stack(held).to(dev)

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16)

    @torch.no_grad()
    def held_out_loss(model) -> float:
        model.eval()
        with autocast(), torch.compiler.set_stance("force_eager"):  # no second compile for eval mode
            losses = [model(input_ids=held[i : i + 4, :-1], labels=held[i : i + 4, :-1], use_cache=False).loss
                      for i in range(0, len(held), 4)]  # fmt: skip
        model.train()
        return torch.stack(losses).mean().item()

    def run(mode: str, seed: int) -> dict:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").to(dev)
        model.train()
        if mode == "fp8":
            enable_fp8_linears(model, emulate=args.emulate, device=dev)
        if not args.no_compile:
            compile_layers(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0,
                                fused=dev.type == "cuda")  # fmt: skip
        g = torch.Generator().manual_seed(1000 + seed)
        losses, held_losses, t0 = [], {}, time.perf_counter()
        for step in range(1, args.steps + 1):
            for group in opt.param_groups:
                group["lr"] = 1e-3 * min(1.0, step / 20)
            starts = torch.randint(0, len(train_ids) - seq - 1, (rows,), generator=g)
            ids = torch.stack([train_ids[s : s + seq + 1] for s in starts.tolist()]).to(dev, non_blocking=True)
            with autocast():
                loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1], use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if step % 50 == 0 or step == args.steps:
                held_losses[step] = round(held_out_loss(model), 4)
            if args.curves:
                emit_curve = {"run": f"{mode}_seed{seed}", "step": step, "loss": round(losses[-1], 4)}
                if step in held_losses:
                    emit_curve["held_out"] = held_losses[step]
                with open(args.curves, "a") as f:
                    f.write(json.dumps(emit_curve) + "\n")
        return {"losses": losses, "held_out": held_losses, "seconds": round(time.perf_counter() - t0, 1)}

    rope = modeling.apply_rotary_pos_emb  # compile_layers replaces it with a compiled one: restored after each run
    runs = {}
    for seed in args.seeds:
        for mode in ("bf16", "fp8"):
            try:
                runs[(mode, seed)] = run(mode, seed)
            finally:
                modeling.apply_rotary_pos_emb = rope
            r = runs[(mode, seed)]
            print(f"numerics {mode} seed {seed}: final held-out {r['held_out'][args.steps]}, {r['seconds']} s",
                  flush=True)  # fmt: skip

    window = max(1, min(25, args.steps // 4))

    def windows(losses: list[float]) -> list[float]:
        return [sum(losses[i : i + window]) / window for i in range(0, len(losses) - window + 1, window)]

    seeds = args.seeds
    row = {"text": source, "train_tokens": len(train_ids), "steps": args.steps, "tokens_per_step": seq * rows,
           "params_M": round(sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) / 1e6, 1),
           "window": window}  # fmt: skip
    for (mode, seed), r in runs.items():
        row[f"{mode}_seed{seed}"] = {"held_out": r["held_out"], "train_last_window": round(windows(r["losses"])[-1], 4),
                                     "seconds": r["seconds"]}  # fmt: skip
    gap_held = [
        abs(runs[("fp8", s)]["held_out"][args.steps] - runs[("bf16", s)]["held_out"][args.steps]) for s in seeds
    ]
    gap_windows = [max(abs(a - b) for a, b in zip(windows(runs[("fp8", s)]["losses"]),
                                                  windows(runs[("bf16", s)]["losses"]))) for s in seeds]  # fmt: skip
    row["fp8_vs_bf16_held_out_gap"] = [round(x, 4) for x in gap_held]
    row["fp8_vs_bf16_max_window_gap"] = [round(x, 4) for x in gap_windows]
    if len(seeds) >= 2:
        a, b = seeds[:2]
        spread_held = abs(runs[("bf16", a)]["held_out"][args.steps] - runs[("bf16", b)]["held_out"][args.steps])
        spread_windows = max(abs(x - y) for x, y in zip(windows(runs[("bf16", a)]["losses"]),
                                                         windows(runs[("bf16", b)]["losses"])))  # fmt: skip
        row["bf16_seed_spread_held_out"] = round(spread_held, 4)
        row["bf16_seed_spread_max_window"] = round(spread_windows, 4)
        row["within_noise"] = max(gap_held) <= spread_held and max(gap_windows) <= spread_windows
    row["finite"] = all(math.isfinite(x) for r in runs.values() for x in r["losses"])
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    if device().type == "cpu" and not args.emulate:
        sys.exit("error: no GPU: pass --emulate (and --tiny) for a CPU smoke test")
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            row = {"section": name, **globals()[f"section_{name}"](args)}
        except Exception as exc:
            row = {
                "section": name,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        row["seconds"] = round(time.perf_counter() - t0, 1)
        emit(args.out, row)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
