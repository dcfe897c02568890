"""Long natural documents from the source code already on a machine: one document per package, its files
concatenated in path order behind a header line each (repository-level documents, as in long-context recipes
that train on code repositories), cut at file boundaries into documents of at most ``--doc-chars`` characters.

    python -m easy_context.data.code_corpus --output out/code.jsonl                  # stdlib + site-packages
    python -m easy_context.data.code_corpus --root /path/to/src --max-chars 2e8 --output out/code.jsonl

The output is a ``.jsonl`` file (one ``{"text": ...}`` per line) that ``python -m easy_context.data --dataset``
packs. Packages are taken in a seeded random order until ``--max-chars``; tests folders, files over
``--max-file-chars`` (generated tables) and files that are not UTF-8 are skipped.
"""

from __future__ import annotations

import json
import os
import random
import sys
import sysconfig
from collections.abc import Iterator

from easy_context import cli

SUFFIXES = (".py",)
SKIP_DIRS = {"__pycache__", "test", "tests", "testing", "idlelib", "tkinter", "lib2to3", "site-packages",
             "dist-packages", "node_modules"}  # fmt: skip
HEADER = "# ===== file: {path} =====\n"


def default_roots() -> list[str]:
    """The interpreter's standard library and its site-packages folder."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths["stdlib"], paths["purelib"], paths["platlib"]) if os.path.isdir(p)))


def packages(root: str) -> list[str]:
    """The top-level entries of ``root`` that hold source: package folders and single-file modules."""
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith((".", "_")) and name != "__init__.py" or name in SKIP_DIRS:
            continue
        if os.path.isdir(path) or name.endswith(SUFFIXES):
            found.append(path)
    return found


def source_files(package: str, max_file_chars: int) -> Iterator[tuple[str, str]]:
    """``(relative path, text)`` of every source file of ``package`` (a folder, recursively, in path order, or one
    file)."""
    base = os.path.dirname(package)
    paths = [package] if os.path.isfile(package) else []
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(SUFFIXES)]
    for path in paths:
        try:
            if os.path.getsize(path) > max_file_chars * 4:
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip() and len(text) <= max_file_chars:
            yield os.path.relpath(path, base), text


def package_documents(package: str, doc_chars: int, max_file_chars: int) -> Iterator[str]:
    """The documents of one package: its files behind their headers, cut at file boundaries every ``doc_chars``."""
    parts: list[str] = []
    size = 0
    for rel, text in source_files(package, max_file_chars):
        piece = HEADER.format(path=rel) + text.rstrip("\n") + "\n\n"
        if parts and size + len(piece) > doc_chars:
            yield "".join(parts)
            parts, size = [], 0
        parts.append(piece)
        size += len(piece)
    if parts:
        yield "".join(parts)


def build_corpus(roots: list[str], max_chars: int, doc_chars: int, max_file_chars: int, seed: int = 0
                 ) -> Iterator[str]:  # fmt: skip
    """Documents from the packages under ``roots`` in a seeded random order, until ``max_chars`` characters."""
    if not roots:
        raise ValueError("no source folders: pass --root DIR")
    found = [p for root in roots for p in packages(root)]
    if not found:
        raise ValueError(f"no packages or .py files under {roots}")
    random.Random(seed).shuffle(found)
    total = 0
    for package in found:
        for doc in package_documents(package, doc_chars, max_file_chars):
            yield doc
            total += len(doc)
            if total >= max_chars:
                return


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="python -m easy_context.data.code_corpus", description=__doc__.splitlines()[0])
    p.add_argument("--root", action="append", default=None, help="a folder of packages (repeat; default: the "
                   "standard library and site-packages of this interpreter)")  # fmt: skip
    p.add_argument("--output", required=True, help="the .jsonl file to write")
    p.add_argument("--max-chars", type=float, default=2e8, help="stop after this many characters")
    p.add_argument("--doc-chars", type=int, default=1_000_000, help="cut a package's text every N characters")
    p.add_argument("--max-file-chars", type=int, default=400_000, help="skip larger files (generated data)")
    p.add_argument("--seed", type=int, default=0, help="package order")
    args = p.parse_args(argv)
    roots = args.root or default_roots()
    missing = [r for r in roots if not os.path.isdir(r)]
    if missing:
        p.error(f"--root {missing[0]}: no such folder")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    docs = chars = 0
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            for doc in build_corpus(roots, int(args.max_chars), args.doc_chars, args.max_file_chars, args.seed):
                out.write(json.dumps({"text": doc}) + "\n")
                docs, chars = docs + 1, chars + len(doc)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{docs:,} documents, {chars:,} characters from {', '.join(roots)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
