"""The modules that moved into easy_context.core / easy_context.training import under their old names too."""

from __future__ import annotations

import importlib
import subprocess
import sys

from easy_context._moved import MOVED


def test_every_old_path_is_the_moved_module():
    for old, new in MOVED.items():
        if new.endswith("lse_merge_triton"):  # needs triton (CUDA machines)
            continue
        assert importlib.import_module(old) is importlib.import_module(new), old


def test_old_paths_work_in_a_fresh_process_and_from_imports():
    old = ("from easy_context.process_exit import exit_process\nfrom easy_context.groups import init_sp_groups\n"
           "import easy_context.train_state as ts\n"
           "assert ts.__name__ == 'easy_context.training.train_state'\n")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", old], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    wrong = subprocess.run([sys.executable, "-c", "import easy_context.core.train_state"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert "No module named 'easy_context.core.train_state'" in wrong.stderr  # only real old names are mapped
