"""This project's own module paths of before the core/ and training/ split (easy_context.groups, ...) are gone (no
shim); EasyContext's public names stay (tests/distributed/test_easycontext_names.py)."""

from __future__ import annotations

import subprocess

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
