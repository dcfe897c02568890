"""This project's own module paths of before the core/ and training/ split (easy_context.groups, ...) are gone (no
shim); EasyContext's public names stay (tests/distributed/test_easycontext_names.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from easy_context.legacy.paths import MOVED
from tests.support import zygote


def test_old_internal_paths_are_gone_and_the_new_ones_import():
    code = ("import importlib\n"
            "for old in ('easy_context.groups', 'easy_context.process_exit', 'easy_context.train_state',\n"
            "            'easy_context.watchdog', 'easy_context.recipe', 'easy_context.document_order'):\n"
            "    try:\n"
            "        importlib.import_module(old)\n"
            "    except ModuleNotFoundError:\n"
            "        continue\n"
            "    raise SystemExit(f'{old} still imports')\n"
            "import easy_context.core.groups, easy_context.training.process_exit\n"
            "import easy_context.training.recipe\n")  # fmt: skip
    res = subprocess.run([zygote.python(), "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_moved_user_facing_paths_still_import_and_run():
    """The fetch programs and the Trainer integration moved (models/, training/); their documented paths of before
    still import the same objects and ``python -m`` still runs them (easy_context/legacy/paths.py)."""
    code = ("from easy_context.fetch import SOURCES, main\n"
            "from easy_context.models.fetch import SOURCES as NEW, main as new_main\n"
            "from easy_context.hf.trainer import SequenceParallelTrainer\n"
            "from easy_context.training.trainer import SequenceParallelTrainer as New\n"
            "import easy_context.fetch_smollm2\n"
            "assert SOURCES is NEW and main is new_main and SequenceParallelTrainer is New\n")  # fmt: skip
    res = subprocess.run([zygote.python(), "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([zygote.python(), "-m", "easy_context.fetch", "--list"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0 and "gemma3-270m" in res.stdout, res.stderr[-2000:]


ROOT = Path(__file__).resolve().parents[2]
# ``python -m MODULE`` (python, python3, .../bin/python) and any ``-m easy_context...`` (accelerate launch ... -m)
PYTHON_M = re.compile(r"(?:\bpython3?\s+-m\s+([A-Za-z_][\w.]*))|(?:\s-m\s+(easy_context(?:\.\w+)*))")


def documented_modules() -> list[str]:
    """Every module that README.md or docs/*.md runs with ``-m``, read from the text (a new one is covered as it
    is written)."""
    found = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in PYTHON_M.finditer(path.read_text(encoding="utf-8")):
            found.add(m.group(1) or m.group(2))
    return sorted(found)


def run_help(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([zygote.python(), "-m", module, "--help"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip


def test_the_docs_name_their_modules():
    found = documented_modules()
    assert {"easy_context.train", "easy_context.plan", "easy_context.models.fetch_smollm2"} <= set(found), found


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_path_runs_help_as_its_new_module(old):
    """``python -m OLD --help`` exits 0 and prints what ``python -m NEW --help`` prints, but for the program name
    (runpy takes ``sys.argv[0]`` from the old path's spec: without an origin argparse crashed on None)."""
    res, new = run_help(old), run_help(MOVED[old])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert new.returncode == 0, new.stderr[-2000:]
    assert res.stdout == new.stdout and res.stderr == new.stderr


@pytest.mark.parametrize("module", documented_modules())
def test_every_documented_module_runs_help(module):
    res = run_help(module)
    assert res.returncode == 0 and "Traceback" not in res.stderr, f"python -m {module} --help: {res.stderr[-2000:]}"
    assert "usage:" in res.stdout.lower(), f"python -m {module} --help printed no usage: {res.stdout[:500]}"
