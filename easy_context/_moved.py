"""Old module paths: the modules that moved into ``easy_context.core`` and ``easy_context.training`` (2026-12) still
import under their old names (``import easy_context.groups``, ``from easy_context.process_exit import
exit_process``), as the same module objects, so code and docs written against them keep working."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

CORE = ("attn_checkpoint", "blockwise", "distributed_attn", "document_order", "documents", "groups", "inputs",
        "layout", "local_attn", "lse_merge", "lse_merge_triton", "padding", "registry", "seq_algo", "shape_check",
        "windows")  # fmt: skip
TRAINING = ("dataloader", "deepspeed_precision", "flops", "host_adamw", "metrics", "optim", "process_exit", "recipe",
            "train_state", "watchdog")  # fmt: skip
MOVED = {f"easy_context.{m}": f"easy_context.core.{m}" for m in CORE} | {
    f"easy_context.{m}": f"easy_context.training.{m}" for m in TRAINING
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands back the module at its new one."""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:  # already executed under its new name
        pass


def install() -> None:
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
