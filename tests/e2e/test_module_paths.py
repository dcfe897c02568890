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
