"""Packaging: pyproject declares every third-party module the package imports, and the console scripts resolve."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# imported only where the feature is asked for, each with a clear error when missing
OPTIONAL = {"flash_attn": "flash-attn", "deepspeed": "deepspeed", "triton": None}  # triton ships with CUDA torch


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def imported_modules() -> dict[str, set[str]]:
    """{top-level third-party module: files of easy_context/ importing it}."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "easy_context").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "easy_context":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    dists = packages_distributions()
    missing = {}
    for module, files in imported_modules().items():
        if module in OPTIONAL:
            assert OPTIONAL[module] is None or OPTIONAL[module] in extras, module
            continue
        names = {_name(d) for d in dists.get(module, [module])}
        if not names & required:
            missing[module] = sorted(files)
    assert not missing, f"imported by easy_context but not in pyproject dependencies: {missing}"
    assert project["requires-python"] == ">=3.11"


def test_console_scripts_point_at_callables():
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"easy-context-plan", "easy-context-data"} <= set(scripts)
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target
