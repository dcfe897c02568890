"""`make demo` installs what the demo runs and nothing of the test toolchain; `make test` installs that on top and
runs as CI expects; the package metadata states the tested transformers / accelerate range; a checkpoint save does
not print torch's deprecation warning."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = {"deepspeed", "trl", "pytest", "pytest-xdist", "ruff", "tensorboard", "torchao"}


def makefile_rules() -> dict[str, tuple[list[str], str]]:
    """target -> (prerequisites, recipe text) of the Makefile (variables expanded: $(VENV) -> .venv)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ").replace("$(VENV)", ".venv").replace("$(PY)", "PY")
    rules, target = {}, None
    for line in text.splitlines():
        match = re.match(r"^([\w./-]+):(?!=)\s*(.*)$", line)
        if match and not line.startswith("\t"):
            target = match.group(1)
            rules[target] = (match.group(2).split(), "")
        elif line.startswith("\t") and target:
            rules[target] = (rules[target][0], rules[target][1] + line.strip() + "\n")
    return rules


def chain(rules, target: str) -> list[str]:
    """``target`` and every Makefile target it depends on, first to last."""
    seen: list[str] = []
    for pre in rules.get(target, ([], ""))[0]:
        seen += [t for t in chain(rules, pre) if t not in seen]
    return [*seen, target]


def requirement_names(path: Path) -> dict[str, str]:
    """name -> pinned version of a requirements file, following its ``-r`` includes."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins.update(requirement_names(path.parent / line[3:].strip()))
        elif line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def installs(rules, target: str) -> tuple[set[str], str]:
    """(package names, recipe text) that ``make target`` installs on a fresh clone."""
    names, recipes = set(), ""
    for t in chain(rules, target):
        recipe = rules.get(t, ([], ""))[1]  # a file prerequisite (requirements.txt) has no rule
        recipes += recipe
        for req in re.findall(r"-r (\S+)", recipe):
            names |= set(requirement_names(ROOT / req))
        names |= {m.split("==")[0].lower() for m in re.findall(r"pip install.*? ([\w-]+==[\w.]+)", recipe)}
    return names, recipes


def test_demo_installs_only_its_runtime():
    rules = makefile_rules()
    names, recipes = installs(rules, "demo")
    assert {"torch", "transformers", "accelerate", "datasets", "matplotlib"} <= names, names
    assert "gguf" in names  # easy-context-fetch's names are easy-context-extend's --model names too
    assert not names & TOOLCHAIN, names & TOOLCHAIN
    assert "deepspeed" not in recipes.lower() and "torch_extensions" not in recipes, recipes
    assert ".venv/.installed" not in chain(rules, "demo") and ".venv/.runtime" in chain(rules, "demo")


def test_make_test_installs_the_toolchain_and_runs_as_ci_expects():
    rules = makefile_rules()
    names, recipes = installs(rules, "test")
    assert TOOLCHAIN <= names, TOOLCHAIN - names
    assert "create_op_builder" in recipes and "CPUAdamBuilder" in recipes  # DeepSpeed's CPU ops, built once
    assert "pytest tests -n 2 --dist loadfile" in " ".join(rules["test"][1].split())
    assert "ruff check" in rules["test"][1] and ".venv/.installed" in chain(rules, "test")
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    runtime = requirement_names(ROOT / "requirements.txt")
    assert runtime.items() <= requirement_names(ROOT / "requirements-dev.txt").items()  # the same pins, plus more


def test_package_metadata_states_the_tested_range():
    import tomllib

    from packaging.requirements import Requirement

    deps = {Requirement(d).name: Requirement(d).specifier for d in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}  # fmt: skip
    pins = requirement_names(ROOT / "requirements.txt")
    for name, floor in (("transformers", "5.17.0"), ("accelerate", "1.15.0")):
        spec = deps[name]
        assert pins[name] in spec and floor in spec, (name, spec)  # CI's pin and the measured floor
        assert any(s.operator in ("<", "<=") for s in spec), (name, spec)  # capped: newer is untested
        upper = next(s.version for s in spec if s.operator in ("<", "<="))
        assert upper.split(".")[:2] != pins[name].split(".")[:2] or "<=" in str(spec), (name, spec)
    text = " ".join((ROOT / "docs" / "install.md").read_text().split())
    assert "CI (`.ci/run`, `make test`) runs the upper end only" in text


def test_demo_install_time_is_recorded():
    text = (ROOT / "docs" / "install.md").read_text()
    assert "measured 2026-12-04" in text and "pip install -q -r requirements.txt" in text
    assert re.search(r"\d+ min \d+ s \(\d+ s\)", text)


def agree_worker(rank: int, world: int) -> list[str]:
    """The train state's cross-rank agreement (run at every save), with every warning recorded."""
    from easy_context.training.train_state import _agree

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = _agree("disk full" if rank == 1 else None)
    assert answer == "disk full", answer
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("world", [2])
def test_save_agreement_gives_no_deprecation_warning(dist_pool, world):
    for messages in dist_pool(world).run(agree_worker):
        assert not [m for m in messages if "deprecated" in m], messages
