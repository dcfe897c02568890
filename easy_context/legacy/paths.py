"""EasyContext's module paths (and this project's user-facing ones that moved), served from the new tree.

EasyContext's scripts import ``easy_context.zigzag_ring_attn.prepare_inputs``, ``easy_context.usp.monkey_patch``, ...
The backends now live in :mod:`easy_context.backends`; an import finder answers the old paths (and the backend
package paths this project used before the move) with a module that holds the backend module's names plus
EasyContext's wrappers for that path (:mod:`easy_context.legacy.names`). Nothing but ``import easy_context`` installs
it, and nothing outside this package knows the old paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# old package name -> the backend package under easy_context.backends
PACKAGES = {
    "zigzag_ring_attn": "zigzag_ring_attn",
    "dist_flash_attn": "dist_flash_attn",
    "ulysses_attn": "ulysses_attn",
    "usp_attn": "usp_attn",
    "usp": "usp_attn",  # EasyContext's USP package name
    "data_parallel": "data_parallel",
}
# old module -> its module in the new tree (None: the old path only ever held EasyContext's names)
MODULES = {"prepare_inputs": "prepare_inputs", "prepare_input": "prepare_inputs", "monkey_patch": None}
# user-facing modules of this project that moved: old path -> new path (imports, and ``python -m OLD``)
MOVED = {
    "easy_context.hf.trainer": "easy_context.training.trainer",
    "easy_context.fetch": "easy_context.models.fetch",
    "easy_context.fetch_smollm2": "easy_context.models.fetch_smollm2",
}
# (backend, old module) -> EasyContext's names that the old module holds
NAMES = {
    ("zigzag_ring_attn", "prepare_inputs"): ("prepare_zigzag_ring_attn_inputs",),
    ("zigzag_ring_attn", "monkey_patch"): (
        "apply_zigzag_ring_attn_monkey_patch_llama",
        "apply_zigzag_ring_attn_monkey_patch_mistral",
    ),
    ("dist_flash_attn", "prepare_inputs"): ("prepare_dist_flash_attn_inputs",),
    ("dist_flash_attn", "prepare_input"): ("prepare_dist_flash_attn_inputs",),
    ("dist_flash_attn", "monkey_patch"): ("apply_dist_flash_attn_monkey_patch_llama",),
    ("ulysses_attn", "prepare_inputs"): ("prepare_ulysses_attn_inputs",),
    ("ulysses_attn", "monkey_patch"): ("apply_ulysses_attn_monkey_patch_llama",),
    ("usp_attn", "prepare_inputs"): ("prepare_usp_attn_inputs",),
    ("usp_attn", "monkey_patch"): ("apply_usp_attn_monkey_patch_llama",),
}


def resolve(fullname: str) -> tuple[str | None, tuple[str, ...], bool] | None:
    """(the new module whose names an old path holds, EasyContext's names it adds, whether it is a package), or None
    when ``fullname`` is no old path."""
    if fullname in MOVED:
        return MOVED[fullname], (), False
    parts = fullname.split(".")
    if parts[0] != "easy_context" or len(parts) not in (2, 3) or parts[1] not in PACKAGES:
        return None
    backend = PACKAGES[parts[1]]
    if len(parts) == 2:
        return f"easy_context.backends.{backend}", (), True
    new = MODULES.get(parts[2], parts[2])  # other modules (attention, schedule, ...) kept their names
    target = None if new is None else f"easy_context.backends.{backend}.{new}"
    if target is not None and importlib.util.find_spec(target) is None:
        return None
    return target, NAMES.get((backend, parts[2]), ()), False


class _OldPathLoader(importlib.abc.Loader):
    def __init__(self, target: str | None, names: tuple[str, ...], package: bool):
        self.target, self.names, self.package = target, names, package

    def exec_module(self, module: types.ModuleType) -> None:
        from easy_context.legacy import names as legacy_names

        if self.target is not None:
            new = importlib.import_module(self.target)
            module.__dict__.update({k: v for k, v in vars(new).items() if not k.startswith("__")})
            module.__doc__ = new.__doc__
        module.__dict__.update({name: getattr(legacy_names, name) for name in self.names})
        module.__all__ = sorted(k for k in vars(module) if not k.startswith("_"))

    def get_code(self, fullname: str):
        """``python -m OLD.PATH`` runs the new module's code (runpy asks the loader for it)."""
        if self.target is None:
            return None
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds EasyContext's old module paths (:func:`resolve`); every other name is left to Python's finders."""

    def find_spec(self, fullname, path=None, target=None):
        found = resolve(fullname)
        if found is None:
            return None
        new, names, package = found
        # The new module's file as the origin: runpy sets ``sys.argv[0]`` and ``__file__`` from it for ``python -m
        # OLD.PATH`` (argparse names the program after ``sys.argv[0]``, and None crashes it).
        origin = None if new is None or package else importlib.util.find_spec(new).origin
        spec = importlib.machinery.ModuleSpec(
            fullname, _OldPathLoader(new, names, package), origin=origin, is_package=package
        )
        spec.has_location = origin is not None
        if package:
            spec.submodule_search_locations = []
        return spec


def install() -> None:
    """Put the finder in front of Python's own (once)."""
    if not any(isinstance(f, OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())
