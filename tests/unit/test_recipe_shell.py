"""docs/recipes.md's `recipe.py --shell [--micro] RECIPE.yaml` runs as written (both forms), as a file path (no
easy_context import), and prints the recipe's pipeline values: the micro: section's with --micro."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _documented() -> str:
    line = next(t for t in (ROOT / "docs/recipes.md").read_text().splitlines() if "recipe.py --shell" in t)
    return re.search(r"`(python [^`]*recipe\.py --shell[^`]*)`", line).group(1)


@pytest.mark.parametrize("micro", [False, True])
def test_the_documented_shell_command_runs(micro):
    recipe = "train_scripts/smollm2_64k.yaml"
    words = _documented().replace("[--micro]", "--micro" if micro else "").replace("RECIPE.yaml", recipe).split()
    assert words[:2] == ["python", "easy_context/training/recipe.py"]
    out = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    pipeline = yaml.safe_load((ROOT / recipe).read_text())["pipeline"]
    want = (pipeline["micro"] if micro else {}).get("base_length", pipeline["base_length"])
    assert f"BASE_LENGTH={want}\n" in out.stdout
    flags_last = [sys.executable, "easy_context/training/recipe.py", "--shell", recipe, *(["--micro"] if micro else [])]
    assert subprocess.run(flags_last, cwd=ROOT, capture_output=True, text=True).stdout == out.stdout
