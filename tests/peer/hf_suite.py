"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``), taken from the source distribution of
the installed transformers at set-up: nothing of transformers' test code is kept in this repository.

``load()`` downloads ``transformers==<installed version>`` as an sdist once (``pip download --no-binary :all:``),
extracts its top-level ``tests/*.py`` into a cache outside the repository (``$EC_PEER_CACHE``, else
``<venv>/easy_context_peer``) and imports them as the package ``hf_peer_tests``. The sdist lacks ``tests/utils``,
``tests/generation`` and ``tests/exporters``, which ``test_modeling_common.py`` imports from: the package's path
lists ``hf_shim/`` (ours) after the extracted files, so those relative imports find our stand-ins.

A download that fails raises with pip's reason (the peer tests then error at collection, never pass by absence);
``EC_PEER_TESTS=skip`` opts out explicitly and skips them with that reason.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import pytest
import transformers

VERSION = transformers.__version__
PACKAGE = "hf_peer_tests"
SHIM = Path(__file__).resolve().parent / "hf_shim"
# what test_modeling_common.py imports from the sdist's tests/ (the rest of its relative imports are in hf_shim/)
NEEDED = ("test_modeling_common.py", "test_configuration_common.py", "__init__.py")
OPT_OUT = "EC_PEER_TESTS"


def cache_root() -> Path:
    return Path(os.environ.get("EC_PEER_CACHE") or Path(sys.prefix) / "easy_context_peer")


def _download(version: str, dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
               f"transformers=={version}", "-d", str(dest)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    archives = sorted(dest.glob("transformers-*.tar.gz"))
    if done.returncode != 0 or not archives:
        reason = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(
            f"transformers' peer tests need the transformers=={version} source distribution and could not download "
            f"it ({' '.join(command)} exited {done.returncode}): {' | '.join(reason)}. Set {OPT_OUT}=skip to run the "
            "suite without them, or EC_PEER_CACHE to a folder that holds transformers-<version>/tests"
        )
    return archives[0]


def _extract_tests(archive: Path, dest: Path) -> None:
    """The sdist's top-level ``tests/*.py`` into ``dest`` (its other files are not needed)."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.isfile() and len(parts) == 3 and parts[1] == "tests" and parts[2].endswith(".py"):
                source = tar.extractfile(member)
                assert source is not None
                (dest / parts[2]).write_bytes(source.read())
    # test_configuration_common executes tests/__init__.py at import (direct_transformers_import); the sdist has none,
    # transformers' repository an empty one
    (dest / "__init__.py").touch()


def sdist_tests(version: str = VERSION) -> Path:
    """The folder of the sdist's ``tests/*.py`` for ``version``, downloaded and extracted on first use (a lock keeps
    two pytest workers from doing it at once; the folder appears whole, by rename)."""
    root = cache_root() / f"transformers-{version}"
    tests = root / "tests"
    if all((tests / name).is_file() for name in NEEDED):
        return tests
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((tests / name).is_file() for name in NEEDED):
            return tests
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            archive = _download(version, Path(tmp) / "sdist")
            staged = Path(tmp) / "tests"
            staged.mkdir()
            _extract_tests(archive, staged)
            missing = [name for name in NEEDED if not (staged / name).is_file()]
            if missing:
                raise RuntimeError(f"{archive.name} has no tests/{', tests/'.join(missing)}: the peer tests need them")
            shutil.rmtree(tests, ignore_errors=True)
            os.replace(staged, tests)
    return tests


def load() -> types.SimpleNamespace:
    """transformers' ``test_modeling_common`` and ``test_configuration_common`` modules (skips the calling test module
    when ``EC_PEER_TESTS=skip``)."""
    if os.environ.get(OPT_OUT) == "skip":
        pytest.skip(f"{OPT_OUT}=skip: transformers' peer tests opted out", allow_module_level=True)
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(sdist_tests()), str(SHIM)]
        sys.modules[PACKAGE] = package
    return types.SimpleNamespace(
        modeling=importlib.import_module(f"{PACKAGE}.test_modeling_common"),
        configuration=importlib.import_module(f"{PACKAGE}.test_configuration_common"),
        generation=importlib.import_module(f"{PACKAGE}.generation.test_utils"),
        tests_dir=Path(sys.modules[PACKAGE].__path__[0]),
    )
