"""The command line of the export: ``easy-context-export MODEL_DIR --gguf OUT.gguf [--type ...]``."""

from __future__ import annotations

import argparse
import os
import time

from easy_context.export.gguf import TYPES, export_gguf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="easy-context-export",
        description="Export an HF model folder (e.g. an extended model) as a GGUF file for llama.cpp / ollama.",
    )
    p.add_argument("model", metavar="MODEL_DIR", help="the HF folder (config.json + safetensors)")
    p.add_argument("--gguf", required=True, metavar="OUT.gguf", help="the GGUF file to write")
    p.add_argument("--type", default="f16", choices=TYPES, help="the matrices' type (default f16; norms stay f32)")
    p.add_argument(
        "--vocab-from", default="auto", metavar="auto|hf|FILE.gguf",
        help="the tokenizer: copied from the GGUF the model came from (auto finds it through run_config.json), "
        "or built from MODEL_DIR's tokenizer.json (hf)",
    )  # fmt: skip
    p.add_argument("--name", default=None, help="general.name (default: the folder's name)")
    args = p.parse_args(argv)
    start = time.time()
    try:
        info = export_gguf(args.model, args.gguf, args.type, args.vocab_from, args.name)
    except (RuntimeError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    meta = info["metadata"]
    rope = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in meta.items() if "rope." in k)
    size = os.path.getsize(args.gguf) / 2**20
    print(f"wrote {args.gguf} ({info['arch']}, {info['type']}, {info['tensors']} tensors, {size:.1f} MiB) in "
          f"{time.time() - start:.1f} s; context_length={meta['context_length']}, {rope}; "
          f"tokenizer: {info['vocab']}")  # fmt: skip
    return 0
