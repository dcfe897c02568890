"""Packaging: pyproject declares every third-party module the package imports, and the wheel built from this checkout
installs into a fresh venv whose console scripts, launch configs and sub-packages work outside the checkout.

The fresh venv gets the wheel with ``--no-deps`` and sees the dependencies through a ``.pth`` line naming this
venv's site-packages (nothing is downloaded); that the wheel's metadata requires each of them is checked separately.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# imported only where the feature is asked for, each with a clear error when missing: module -> its extra's package
# triton ships with CUDA torch
OPTIONAL = {"flash_attn": "flash-attn-4", "deepspeed": "deepspeed", "torchao": "torchao", "gguf": "gguf",
            "triton": None}  # fmt: skip
SCRIPTS = {"easy-context-train", "easy-context-plan", "easy-context-data", "easy-context-eval-needle",
           "easy-context-eval-ppl", "easy-context-plot", "easy-context-launch"}  # fmt: skip


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def imported_modules(sources: dict[str, str]) -> dict[str, set[str]]:
    """{top-level third-party module: files importing it} of {file name: Python source}."""
    found: dict[str, set[str]] = {}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for module in names:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != "easy_context":
                    found.setdefault(top, set()).add(name)
    return found


def undeclared(sources: dict[str, str], required: set[str], extras: set[str]) -> dict[str, list[str]]:
    """Imported third-party modules whose distribution is neither required nor (for optional ones) an extra."""
    dists = packages_distributions()
    missing = {}
    for module, files in imported_modules(sources).items():
        if module in OPTIONAL:
            assert OPTIONAL[module] is None or OPTIONAL[module] in extras, module
            continue
        if not {_name(d) for d in dists.get(module, [module])} & required:
            missing[module] = sorted(files)
    return missing


def test_every_runtime_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "easy_context").rglob("*.py")}
    missing = undeclared(sources, required, extras)
    assert not missing, f"imported by easy_context but not in pyproject dependencies: {missing}"
    assert project["requires-python"] == ">=3.11"
    assert {"gpu", "deepspeed", "dev"} <= set(project["optional-dependencies"])


def test_console_scripts_point_at_callables():
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert SCRIPTS <= set(scripts)
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of this checkout (the tree as it is, built offline without build isolation)."""
    import shutil

    tmp = tmp_path_factory.mktemp("wheel")
    ignore = shutil.ignore_patterns(".git", ".venv", "out", "build", "__pycache__", "*.egg-info", "assets", "tests",
                                    "bench", "docs", "results", "gpu_runs", "PaulGrahamEssays", ".pytest_cache",
                                    ".ruff_cache")  # fmt: skip
    shutil.copytree(ROOT, tmp / "src", symlinks=True, ignore=ignore)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
           "-w", str(tmp / "dist"), str(tmp / "src")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (found,) = (tmp / "dist").glob("easy_context-*.whl")
    return found


def test_wheel_holds_the_scripts_configs_and_requirements(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(z.read(meta).decode())
        (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(entry).decode()
        sources = {n: z.read(n).decode() for n in names if n.endswith(".py")}
    for path in ["easy_context/train.py", "easy_context/training/recipe.py", "easy_context/launch_configs.py",
                 "easy_context/eval/run_needle.py", "easy_context/eval/run_ppl.py", "easy_context/eval/run_plot.py",
                 "easy_context/accelerate_configs/single_node.yaml", "easy_context/accelerate_configs/cpu_2proc.yaml",
                 "easy_context/accelerate_configs/zero3_offload.json"]:  # fmt: skip
        assert path in names, path
    assert {f"{s} =" for s in SCRIPTS} <= {line.split("=")[0] + "=" for line in entry_points.splitlines()}
    requires = metadata.get_all("Requires-Dist")
    required = {_name(r) for r in requires if "extra ==" not in r}
    extras = {_name(r) for r in requires if "extra ==" in r}
    missing = undeclared(sources, required, extras)
    assert not missing, f"the wheel imports modules its metadata does not require: {missing}"
    assert metadata["Requires-Python"] == ">=3.11"
    assert {"torch", "transformers", "accelerate", "pyyaml", "datasets"} <= required


CHECK_INSTALLED = f"""
import contextlib, importlib, io, pkgutil, sys
from importlib.metadata import distribution
OPTIONAL = {sorted(OPTIONAL)}
import easy_context
assert easy_context.__file__.startswith(sys.prefix), easy_context.__file__  # the wheel's, not the checkout's
failed, names = [], [m.name for m in pkgutil.walk_packages(easy_context.__path__, "easy_context.")]
for name in names:
    if name.rsplit(".", 1)[-1] == "__main__":
        continue
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name not in OPTIONAL:  # a CUDA-only module (lse_merge_triton) is imported only on CUDA
            failed.append(f"{{name}}: {{exc}}")
    except Exception as exc:
        failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
assert not failed and len(names) > 50, (len(names), failed)
for ep in distribution("easy_context").entry_points:  # each console script's function: --help
    sys.argv, text = [ep.name, "--help"], io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        ep.load()()
    assert text.getvalue().startswith("usage: "), (ep.name, text.getvalue()[:300])
    print(ep.name, "--help ok")
from easy_context.launch_configs import path
print(path("cpu_zero3"))
"""


def test_installed_wheel_works_outside_the_checkout(wheel, tmp_path):
    """A fresh venv with the wheel, from a directory outside the repo: every module imports, each console script's
    --help works, the installed easy-context-train trains a step and easy-context-plan plans, and a DeepSpeed launch
    config resolves to a copy naming the installed json."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    bin_dir, python = venv / "bin", venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    res = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "deps_from_dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "c"))
    train = ["--model", "tiny-llama", "--dataset", "random:4", "--vocab-size", "128", "--output-dir", str(work / "o"),
             "--seq-length", "32", "--batch-size", "1", "--gradient-accumulate-every", "1", "--max-train-steps", "1",
             "--dtype", "float32", "--checkpointing", "none", "--parallel_mode", "data_parallel",
             "--no-save"]  # fmt: skip
    commands = {
        "check": [python, "-c", CHECK_INSTALLED],
        "train": [bin_dir / "easy-context-train", *train],
        "plan": [bin_dir / "easy-context-plan", "--model", "llama-2-7b", "--gpus", "8", "--gpu-mem", "80GB"],
    }
    procs = {k: subprocess.Popen(c, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, c in commands.items()}  # fmt: skip
    out = {k: p.communicate(timeout=300) + (p.returncode,) for k, p in procs.items()}
    for key, (_, stderr, rc) in out.items():
        assert rc == 0, (key, stderr[-3000:])
    check = out["check"][0].splitlines()
    assert {f"{s} --help ok" for s in SCRIPTS} <= set(check), check
    assert "final loss" in out["train"][0]
    assert '"git": null' in (work / "o" / "run_config.json").read_text()  # an installed wheel is no git checkout
    assert "zigzag_ring_attn" in out["plan"][0]
    config = Path(check[-1])
    assert config.is_file() and str(config).startswith(str(tmp_path / "c"))  # a copy naming the json absolutely
    (json_path,) = re.findall(r"deepspeed_config_file:\s*(\S+)", config.read_text())
    assert Path(json_path).is_file() and json_path.startswith(site), json_path
